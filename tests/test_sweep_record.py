"""The record of a sweep (sweeplab.study.sweep): read once, one formula per fact, one meaning per flag.

Each case here failed at 8e8b2cd, where the readers re-derived what the jobs measured and disagreed: validation.png
placed a validation one step earlier than the verdict, `--baseline 1` named one baseline for the table and another
for the verdict, and the decoder's report judged val/loss while it tabulated val/token_acc.
"""

from __future__ import annotations

import csv
import re

import pytest
from mlflow.tracking import MlflowClient

from sweeplab.core import schema
from sweeplab.core.errors import UserError
from sweeplab.report import tables as report
from sweeplab.study.record import VerdictOptions
from sweeplab.study.sweep import read_sweep
from sweeplab.tracking import mlflow_store

# two configurations x two replicates; α=1.0 first in the grid, so a name containing "1" is not row 1
CONFIGS = [("data.batch_size=8 loss.alpha=1.0", 8, "bs=8 α=1.0"), ("data.batch_size=8 loss.alpha=0.7", 8, "bs=8 α=0.7")]


def _replicated_sweep(uri: str, tmp_path, family: str = "textbridge", monitor: str = "val/cos", mode: str = "max",
                      extra_metric: str | None = None) -> str:
    """A replicated sweep as the sweeplab sweeper records it: validations logged by Lightning at step 9 and 19
    (after 10 and 20 optimizer steps), samples per step 8."""
    experiment_id = mlflow_store.init_store(uri, "sweeplab")
    client = MlflowClient(uri)
    parent = client.create_run(experiment_id, tags={mlflow_store.ROLE_TAG: mlflow_store.SWEEP_ROLE}).info.run_id
    for replicate in range(2):
        for index, (config, batch, name) in enumerate(CONFIGS):
            tags = {"mlflow.parentRunId": parent, schema.RUN_NAME_TAG: f"{name} rep={replicate}",
                    schema.FAMILY_TAG: family, schema.BACKEND_TAG: "cpu", schema.CONFIG_TAG: config,
                    schema.CONFIG_INDEX_TAG: str(index), schema.REPLICATE_TAG: str(replicate),
                    schema.ROUND_TAG: str(replicate), schema.MONITOR_TAG: monitor, schema.MONITOR_MODE_TAG: mode}
            run_id = client.create_run(experiment_id, tags=tags).info.run_id
            client.log_param(run_id, schema.BATCH_SIZE_PARAM, str(batch))
            client.log_param(run_id, "loss.alpha", config.rsplit("=", 1)[1])
            client.log_metric(run_id, schema.SAMPLES_PER_SEC, 100.0 + 10 * index + replicate)
            client.log_metric(run_id, schema.SAMPLES_PER_STEP, float(batch))
            for step, value in ((9, 0.3 + 0.01 * index), (19, 0.5 + 0.01 * index)):
                client.log_metric(run_id, monitor, value if mode == "max" else 1 - value, step=step)
                if extra_metric:
                    client.log_metric(run_id, extra_metric, 0.9, step=step)
            client.set_terminated(run_id, "FINISHED")
    return parent


def test_validation_png_and_the_verdict_place_a_validation_at_the_same_samples_seen(mlflow_uri, tmp_path):
    """Lightning logs the validation after 10 steps at step 9: (step + 1) x samples per step = 80 samples, in the
    report's curves and in the verdict's alike."""
    sweep = read_sweep(mlflow_uri, _replicated_sweep(mlflow_uri, tmp_path))
    curves = report.validation_curves(sweep)
    assert {points["samples"][0][0] for points in curves.values()} == {80}
    assert {job.curve[0].samples_seen for job in sweep.verdict_jobs()} == {80}
    assert {points["samples"][1][0] for points in curves.values()} == {160}


def test_baseline_means_one_job_row_in_the_table_and_its_configuration_in_the_verdict(mlflow_uri, tmp_path):
    parent = _replicated_sweep(mlflow_uri, tmp_path)
    found = report.sweep_report(mlflow_uri, parent, None, baseline="1",
                                options=VerdictOptions(target=0.45, baseline_run="1"))
    row_one = found.sweep.jobs[1]
    assert row_one.config == CONFIGS[1][0]  # row 1 is bs=8 α=0.7, whose name contains no "1"
    assert found.verdict.summary.baseline == row_one.config
    assert found.rows[1]["run"] == row_one.name


def test_an_ambiguous_or_unknown_baseline_is_refused_in_one_line(mlflow_uri, tmp_path):
    sweep = read_sweep(mlflow_uri, _replicated_sweep(mlflow_uri, tmp_path))
    with pytest.raises(UserError, match=r"ambiguous: it matches runs of 2 configurations"):
        sweep.baseline_job("rep=0")  # a part of a name every configuration's first replicate has
    with pytest.raises(UserError, match=r"matches no finished run"):
        sweep.baseline_job("no such run")
    with pytest.raises(UserError, match=r"row 9 of the per-job table"):
        sweep.baseline_job("9")
    assert sweep.baseline_job("α=0.7 rep=1").config == CONFIGS[1][0]


def test_the_report_judges_plots_and_tabulates_the_metric_the_jobs_monitor(mlflow_uri, tmp_path):
    """The decoder monitors val/loss (min) and logs val/token_acc beside it: one metric, val/loss, everywhere."""
    parent = _replicated_sweep(mlflow_uri, tmp_path, family="textbridge_decoder", monitor="val/loss", mode="min",
                               extra_metric="val/token_acc")
    found = report.sweep_report(mlflow_uri, parent, tmp_path / "out", options=VerdictOptions(target=0.6))
    assert (found.sweep.metric, found.sweep.mode) == ("val/loss", "min")
    assert found.verdict.summary.metric_name == "val/loss"
    assert {row["final metric"].split()[0] for row in found.rows} == {"val/loss"}
    text = (tmp_path / "out" / "report.md").read_text()
    assert "token_acc" not in text and "token acc" not in text
    header = next(csv.reader((tmp_path / "out" / "report.csv").open()))
    assert "final val/loss" in header


def test_at_the_end_of_a_sweep_the_run_list_is_read_once_and_each_history_once(mlflow_uri, tmp_path, monkeypatch):
    parent = _replicated_sweep(mlflow_uri, tmp_path)
    searches, histories = [], []
    search, history = MlflowClient.search_runs, MlflowClient.get_metric_history

    def counted_search(self, experiment_ids, filter_string="", *args, **kwargs):
        searches.append(filter_string)
        return search(self, experiment_ids, filter_string, *args, **kwargs)

    def counted_history(self, run_id, key):
        histories.append((run_id, key))
        return history(self, run_id, key)

    monkeypatch.setattr(MlflowClient, "search_runs", counted_search)
    monkeypatch.setattr(MlflowClient, "get_metric_history", counted_history)
    found = report.sweep_report(mlflow_uri, parent, tmp_path / "out", options=VerdictOptions(target=0.45))
    job_searches = [f for f in searches if f == f"tags.mlflow.parentRunId = '{parent}'"]
    assert len(job_searches) == 1
    assert sorted(histories) == sorted((job.run_id, "val/cos") for job in found.sweep.jobs)


# --- the run record's names live in one module -------------------------------------------------------------------

SRC = __import__("pathlib").Path(__file__).resolve().parents[1] / "src" / "sweeplab"


def _record_names() -> set[str]:
    """The study's run-record keys: the summary metrics and the study's tags and parent-run figures schema names
    (the generic words such as `config` or `backend` are also config keys elsewhere, so they are left to review)."""
    names = {value for name, value in vars(schema).items() if name.isupper() and isinstance(value, str)}
    params = {schema.BATCH_SIZE_PARAM, schema.ACCUMULATE_PARAM, schema.DEVICES_PARAM, schema.SEED_PARAM,
              schema.MAX_STEPS_PARAM}  # params are the config's own keys: the config code names them too
    return {n for n in names if "/" in n or "_" in n or "." in n} - params - {schema.RUN_NAME_TAG}


def test_no_module_but_the_schema_spells_a_run_record_key():
    names = _record_names()
    assert "summary/samples_per_sec" in names and "config_index" in names
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path.relative_to(SRC).as_posix() == "core/records.py":
            continue
        for literal in re.findall(r"""(?<![\w{])["']([\w./]+)["']""", path.read_text(encoding="utf-8")):
            if literal in names:
                found.append(f"{path.relative_to(SRC)}: {literal!r}")
    assert found == []


def test_every_name_of_the_schema_is_documented():
    documented = (SRC.parents[1] / "docs" / "metrics.md").read_text(encoding="utf-8")
    # a name template (`summary/wall_breakdown/{part}_s`) is documented with its parts spelled `<part>`
    missing = sorted(n for n in _record_names()
                     if f"`{n}`" not in documented and f"`{n.replace('{', '<').replace('}', '>')}`" not in documented)
    assert missing == []


def test_one_module_reads_mlflows_run_objects():
    """MLflow's run objects are read in tracking/mlflow_store.py (RunRecord, record_of) only: every other module reads
    the records (the study's: sweeplab.study.sweep)."""
    readers = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                     if re.search(r"\.data\.(tags|params|metrics)\b", p.read_text(encoding="utf-8")))
    assert readers == ["tracking/mlflow_store.py"]
