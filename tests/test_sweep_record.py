"""The record of a sweep (sweeplab.study.sweep): read once, one formula per fact, one meaning per flag.

Each case here failed at 8e8b2cd, where the readers re-derived what the jobs measured and disagreed: validation.png
placed a validation one step earlier than the verdict, `--baseline 1` named one baseline for the table and another
for the verdict, and the decoder's report judged val/loss while it tabulated val/token_acc.
"""

from __future__ import annotations

import ast
import csv
import re

import pytest
from mlflow.tracking import MlflowClient

from sweeplab.core import records
from sweeplab.core.errors import UserError
from sweeplab.core.records import JOB, SWEEP_ROLE
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
    parent = client.create_run(experiment_id, tags={records.SWEEP.role: SWEEP_ROLE}).info.run_id
    for replicate in range(2):
        for index, (config, batch, name) in enumerate(CONFIGS):
            tags = {JOB.parent_run_id: parent, JOB.name: f"{name} rep={replicate}",
                    JOB.family: family, JOB.backend: "cpu", JOB.config: config,
                    JOB.config_index: str(index), JOB.replicate: str(replicate),
                    JOB.round: str(replicate), JOB.monitor: monitor, JOB.monitor_mode: mode}
            run_id = client.create_run(experiment_id, tags=tags).info.run_id
            client.log_param(run_id, JOB.batch_size, str(batch))
            client.log_param(run_id, "loss.alpha", config.rsplit("=", 1)[1])
            client.log_metric(run_id, JOB.samples_per_sec, 100.0 + 10 * index + replicate)
            client.log_metric(run_id, JOB.samples_per_step, float(batch))
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


# --- the run record's keys live in one module ---------------------------------------------------------------------

SRC = __import__("pathlib").Path(__file__).resolve().parents[1] / "src" / "sweeplab"
RECORDS_MODULE = "core/records.py"
LITERAL = re.compile(r"""(?<![\w{])["']([\w./]+)["']""")
RUN_MAPPINGS = {"tags", "params", "metrics"}  # a RunRecord's (and a JobRecord's) dicts
RUN_WRITES = {"set_tag", "log_metric", "log_param", "delete_tag", "get_metric_history"}

def _record_names() -> set[str]:
    """Every key the run records declare (sweeplab.core.records: the job, sweep and configuration runs)."""
    return records.all_keys()


def _record_positions(tree: ast.AST) -> set[int]:
    """Line numbers where a string is used as a run's key: a subscript, `.get(...)` or `in` on a run's tags, params or
    metrics, or an argument of MLflow's per-key writes."""
    def run_mapping(node: ast.AST) -> bool:
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
        return name in RUN_MAPPINGS

    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and run_mapping(node.value):
            lines.add(node.slice.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "get" and run_mapping(node.func.value) and node.args:
                lines.add(node.args[0].lineno)
            elif node.func.attr in RUN_WRITES:
                lines.update(arg.lineno for arg in node.args)
        elif isinstance(node, ast.Compare) and any(run_mapping(c) for c in node.comparators):
            lines.add(node.left.lineno)
    return lines


def _spelled_keys(path) -> list[tuple[int, str]]:
    """(line, key) of every literal equal to a run-record key: any literal of a key no other vocabulary spells, and a
    literal of a shared word (records.SHARED_SPELLINGS: `seed`, `mlx`, ...) where it is used as a run's key."""
    names = _record_names()
    text = path.read_text(encoding="utf-8")
    positions = _record_positions(ast.parse(text))
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for literal in LITERAL.findall(line):
            if literal in names and (literal not in records.SHARED_SPELLINGS or number in positions):
                found.append((number, literal))
    return found


def test_no_module_but_the_records_spells_a_run_record_key():
    names = _record_names()
    assert {"summary/samples_per_sec", "config_index", "jobs_done", "best_run_id", "resumed", "checkpoint",
            "tuned.batch_size", "objective", "sweeplab.role", "data.batch_size", "mlflow.runName"} <= names
    found = [f"{path.relative_to(SRC)}:{line}: {literal!r}" for path in sorted(SRC.rglob("*.py"))
             if path.relative_to(SRC).as_posix() != RECORDS_MODULE
             for line, literal in _spelled_keys(path)]
    assert found == []


def test_a_shared_word_is_caught_where_it_is_a_runs_key():
    code = 'x = run.tags.get("seed")\ny = {"seed": 1}\nz = "summary/peak_mem_mb"\n'
    assert _record_positions(ast.parse(code)) == {1}


def test_every_key_of_the_records_is_documented():
    documented = (SRC.parents[1] / "docs" / "metrics.md").read_text(encoding="utf-8")
    keys = {key for keys in (records.JOB, records.SWEEP, records.CONFIGURATION) for key in keys}
    # a templated key (`summary/wall_breakdown/{part}_s`) is documented with its part spelled `<part>`; the
    # configuration run's figures (`{figure}`) and its params (`{key}`: its swept keys) are documented in words
    missing = sorted(k for k in keys - {"{figure}", "{key}"}
                     if f"`{k}`" not in documented and f"`{k.replace('{', '<').replace('}', '>')}`" not in documented)
    assert missing == []


def test_only_tracking_imports_mlflow():
    """MLflow is imported (at a module's top or inside a function) by sweeplab.tracking only: every other module
    reads and writes runs through it (sweeplab.tracking.runs, mlflow_store.write)."""
    importers = []
    for path in sorted(SRC.rglob("*.py")):
        module = path.relative_to(SRC).as_posix()
        if module.startswith("tracking/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(n == "mlflow" or n.startswith("mlflow.") for n in names):
                importers.append(module)
    assert importers == []



def test_one_module_reads_mlflows_run_objects():
    """MLflow's run objects are read in tracking/mlflow_store.py (RunRecord, record_of) only: every other module reads
    the records (the study's: sweeplab.study.sweep)."""
    readers = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                     if re.search(r"\.data\.(tags|params|metrics)\b", p.read_text(encoding="utf-8")))
    assert readers == ["tracking/mlflow_store.py"]


# --- runs are read as records: by field, not by key -----------------------------------------------------------------

SWEEP_READ = "study/sweep.py"  # the one read of a sweep into its records (Sweep.run, JobRecord.run)
SCRIPTS = SRC.parents[1] / "scripts"


def _reads_by_key(text: str) -> list[int]:
    """Lines that call `.get(...)` on something's `tags`, `params` or `metrics` (`sweep.parent.tags.get(SWEEP.x)`,
    `run.data.metrics.get("objective")`): a run read by key instead of as its record."""
    return sorted({node.lineno for node in ast.walk(ast.parse(text))
                   if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                   and isinstance(node.func.value, ast.Attribute) and node.func.value.attr in RUN_MAPPINGS})


def _runs_read_by_key(src, scripts) -> list[str]:
    """`module:line` of each read by key in sweeplab (but tracking/ and the one sweep read) and in scripts/."""
    found = []
    for root, paths in ((src, sorted(src.rglob("*.py"))), (scripts, sorted(scripts.rglob("*.py")))):
        for path in paths:
            module = path.relative_to(root).as_posix()
            if root == src and (module.startswith("tracking/") or module == SWEEP_READ):
                continue
            found += [f"{module}:{line}" for line in _reads_by_key(path.read_text(encoding="utf-8"))]
    return found


def test_runs_are_read_as_records_outside_tracking_and_the_one_sweep_read():
    """The report, the verdict, the UI, the sweepers and the scripts read a run's fields from its record
    (`sweep.run.sweep_dir`, `job.run.backend`, `JobRun.from_run(run).checkpoint`) and a job's config values by key
    (`job.config_value("loss.alpha")`): a key's kind and type are declared once, in sweeplab.core.records."""
    assert _runs_read_by_key(SRC, SCRIPTS) == []


def test_a_run_read_by_key_is_refused(tmp_path):
    """One read by key injected into a copy of report/tables.py, one into a script: both named; a dict's own `.get`
    and a record's field are not."""
    assert _reads_by_key('a = sweep.parent.tags.get("sweep_dir")\nb = r.data.metrics.get("objective", 0)\n'
                         'c = options.get("x")\nd = sweep.run.sweep_dir\ne = (job.run.presets or {}).get("debug")\n') == [1, 2]
    src, scripts = tmp_path / "sweeplab", tmp_path / "scripts"
    (src / "report").mkdir(parents=True)
    scripts.mkdir()
    text = (SRC / "report" / "tables.py").read_text(encoding="utf-8")
    (src / "report" / "tables.py").write_text(text, encoding="utf-8")
    (scripts / "study_cost.py").write_text((SCRIPTS / "study_cost.py").read_text(encoding="utf-8"), encoding="utf-8")
    (src / SWEEP_READ).parent.mkdir()
    (src / SWEEP_READ).write_text("x = run.tags.get('family')\n", encoding="utf-8")  # the one read may
    assert _runs_read_by_key(src, scripts) == []
    lines = len(text.splitlines())
    (src / "report" / "tables.py").write_text(text + "\ntitle = sweep.parent.tags.get(SWEEP.sweep_id)\n", encoding="utf-8")
    with open(scripts / "study_cost.py", "a", encoding="utf-8") as script:
        script.write("\nwall = sweep.parent.metrics.get('sweep/process_wall_s')\n")
    found = _runs_read_by_key(src, scripts)
    assert found[0] == f"report/tables.py:{lines + 2}" and found[1].startswith("study_cost.py:") and len(found) == 2


def test_jobs_stopped_early_with_no_last_step_recorded_get_a_note_not_a_division_by_zero(mlflow_uri, tmp_path):
    """stop.* stopped a job of a sweep whose jobs recorded no trainer.max_steps: the verdict says what it cannot
    count instead of failing the report."""
    from sweeplab.study.record import sweep_verdict
    from sweeplab.tracking import runs

    parent = _replicated_sweep(mlflow_uri, tmp_path)
    client = MlflowClient(mlflow_uri)
    stopped = next(r for r in runs.children(mlflow_uri, parent) if r.tags.get(JOB.replicate) == "1")
    client.set_tag(stopped.run_id, JOB.stop_reason, "behind")
    client.set_tag(stopped.run_id, JOB.stop_step, "10")
    lines = sweep_verdict(read_sweep(mlflow_uri, parent)).lines
    assert any("what it saved is not known" in line for line in lines), lines
