"""Behaviour unchanged: a recorded study reported by today's code gives the report.md and report.csv that the code
before the sweep was read into records (#58, main at b6e44d2) gave for the same store, byte for byte.

The study is recorded as its jobs and its sweeper record one (tags, params, metrics, curves; fixed start, end and
metric times, so the seconds to target are the same every time): three configurations x two replicates of the
default study on a CPU host, the baseline's second replicate stopped behind, one job FAILED before training and run
again, two planned jobs never run, the sweep's process wall time and each job's breakdown (the time-spent table).
The report runs as `python -m sweeplab.report --multirun-dir` does (`report.__main__.main`); run ids and the test's
folder are replaced by placeholders before comparing.

The golden files (tests/golden/report.md, tests/golden/report.csv) were made by the old code, from this file:

    mkdir /tmp/old && git archive b6e44d2 src conf | tar -x -C /tmp/old
    cd /tmp/old && PYTHONPATH=/tmp/old/src .venv/bin/python <this checkout>/tests/test_report_golden.py \
        --write <this checkout>/tests/golden

(PYTHONPATH puts the old sweeplab before the editable install; the script says which sweeplab it imported and
writes the normalised files). A change that alters
the report on purpose rewrites them with the new code the same way, and says why in its commit.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent / "golden"
T0 = 1_780_000_000_000  # the study's start (ms): fixed, so the seconds to target read the same every time
CONFIGS = ((16, "1.0"), (64, "1.0"), (64, "0.7"))  # data.batch_size, loss.alpha; the first is the baseline
REPLICATES = 2
STEPS = 40
RATES = {(0, 0): 410.0, (0, 1): 395.0, (1, 0): 1210.0, (1, 1): 1180.0, (2, 0): 1260.0, (2, 1): 1195.0}  # samples/s


def record_study(uri: str, root: Path) -> Path:
    """The study recorded into the store at `uri`; its sweep folder (under `root`)."""
    from mlflow.tracking import MlflowClient

    from sweeplab.core import channels
    from sweeplab.tracking import mlflow_store

    sweep_dir = root / "multirun" / "golden"
    sweep_dir.mkdir(parents=True)
    experiment = mlflow_store.init_store(uri, "golden")
    client = MlflowClient(uri)
    overrides = "sweep=default backend=cpu debug=smoke replicates=2 data.batch_size=16,64 loss.alpha=1.0,0.7"
    parent = client.create_run(experiment, start_time=T0, run_name="sweep golden", tags={
        "sweeplab.role": "sweep", "sweep_id": "golden", "sweep_dir": str(sweep_dir), "sweeper": "sweeplab",
        "launcher": "basic", "sweep_overrides": overrides, "objective": "val/cos", "objective_mode": "max",
        "report.target": "0.3"}).info.run_id
    (sweep_dir / channels.PARENT_RUN_FILE).write_text(parent)
    clock = T0
    failed_once = False
    for replicate in range(REPLICATES):
        for index, (batch, alpha) in enumerate(CONFIGS):
            config = f"data.batch_size={batch} loss.alpha={alpha}"
            tags = {"mlflow.runName": f"bs={batch} α={alpha} rep={replicate}", "mlflow.parentRunId": parent,
                    "family": "textbridge", "backend": "cpu", "device": "AMD EPYC", "precision": "32-true",
                    "compile": "off", "config": config, "config_index": str(index), "replicate": str(replicate),
                    "round": str(replicate), "host": "h", "seed": str(replicate), "objective": "val/cos",
                    "objective_mode": "max", "monitor": "val/cos", "monitor_mode": "max", "preset.debug": "smoke",
                    "hydra_job": str(replicate * len(CONFIGS) + index), "concurrent_jobs": "1",
                    "output_dir": f"{sweep_dir}/{replicate * len(CONFIGS) + index}"}
            if index == 1 and replicate == 0 and not failed_once:  # failed before training, then run again
                failed_once = True
                run = client.create_run(experiment, start_time=clock, tags={**tags, "error": "OSError: disk full"})
                client.set_terminated(run.info.run_id, "FAILED", end_time=clock + 2000)
                clock += 3000
            run_id = client.create_run(experiment, start_time=clock, tags=tags).info.run_id
            stopped = index == 0 and replicate == 1
            steps = STEPS // 2 if stopped else STEPS
            if stopped:
                client.set_tag(run_id, "stop_reason", "behind")
                client.set_tag(run_id, "stop_step", str(steps))
            params = {"data.batch_size": str(batch), "loss.alpha": alpha, "loss.beta": "0.7", "model.size": "tiny",
                      "trainer.max_steps": str(STEPS), "trainer.accumulate_grad_batches": "1",
                      "trainer.devices": "1", "backend.name": "cpu"}
            for key, value in params.items():
                client.log_param(run_id, key, value)
            rate = RATES[index, replicate]
            seconds = steps * batch / rate
            metrics = {"summary/samples_per_sec": rate, "summary/step_time_s_median": batch / rate,
                       "summary/step_time_spread": 0.04 + 0.01 * index, "summary/samples_per_step": float(batch),
                       "summary/tokens_per_sec": rate * 40, "summary/batch_shapes": 1.0, "summary/host_cpus": 2.0,
                       "summary/load_avg_start": 0.5, "summary/load_avg_end": 0.9, "summary/peak_mem_mb": 300.0 + batch,
                       "summary/timed_steps": float(steps - 5), "summary/timed_seconds": seconds * 0.9,
                       "summary/wall_breakdown/setup_s": 3.0, "summary/wall_breakdown/warmup_s": 0.5,
                       "summary/wall_breakdown/steps_s": seconds, "summary/wall_breakdown/validation_s": 0.4,
                       "summary/wall_breakdown/mlflow_s": 0.2, "summary/setup_split/imports_s": 1.5,
                       "summary/setup_split/data_s": 0.8}
            for key, value in metrics.items():
                client.log_metric(run_id, key, value, timestamp=clock, step=0)
            values = []
            for step in range(4, steps, 5):
                seen = (step + 1) * batch
                value = 0.4 - 0.3 * 2.718 ** -(seen / (300 if alpha == "1.0" else 240)) + 0.002 * replicate
                values.append(value)
                client.log_metric(run_id, "val/cos", value, timestamp=clock + int(1000 * (step + 1) * batch / rate),
                                  step=step)
            client.log_metric(run_id, "objective", max(values), timestamp=clock, step=0)
            clock += int(1000 * (seconds + 4.1))
            client.set_terminated(run_id, "FINISHED", end_time=clock)
    for key, value in {"jobs_planned": 8.0, "jobs_done": 6.0, "jobs_failed": 1.0, "jobs_not_run": 2.0,
                       "sweep/process_wall_s": (clock - T0) / 1000 + 6.0, "sweep/process_start_s": T0 / 1000}.items():
        client.log_metric(parent, key, value, timestamp=clock, step=0)
    client.set_terminated(parent, "KILLED", end_time=clock)
    return sweep_dir


def reported(uri: str, root: Path) -> dict[str, str]:
    """report.md and report.csv of the recorded study as `python -m sweeplab.report --multirun-dir` writes them,
    run ids and `root` replaced by placeholders."""
    from sweeplab.report import __main__ as report_cli

    sweep_dir = record_study(uri, root)
    report_cli.main(["--multirun-dir", str(sweep_dir), "--tracking-uri", uri])
    texts = {name: (sweep_dir / name).read_text(encoding="utf-8") for name in ("report.md", "report.csv")}
    ids: dict[str, str] = {}
    for name, text in texts.items():
        text = text.replace(str(root), "<root>")
        texts[name] = re.sub(r"\b[0-9a-f]{32}\b", lambda m: ids.setdefault(m.group(), f"<run {len(ids)}>"), text)
    return texts


PLOTS = ("throughput.png", "validation.png", "speed_quality.png", "curves.png")  # what the golden report.md names


def _plots_not_drawn(monkeypatch) -> None:
    """The plots (matplotlib: 10 of the report's 12 s here) written as empty files of the names the study's report
    draws; report.md names them. test_..._with_its_plots_drawn draws them."""
    from sweeplab.report import figures as report_figures
    from sweeplab.report import tables

    def empty(names):
        def write(*args):
            out = next(a for a in args if isinstance(a, Path))
            for name in names:
                (out / name).write_bytes(b"")
            return [out / name for name in names]
        return write

    monkeypatch.setattr(tables, "write_plots", empty(PLOTS[:2]))
    monkeypatch.setattr(report_figures, "write_figures", empty(PLOTS[2:]))


def test_the_report_of_a_recorded_study_is_what_the_old_code_wrote(mlflow_uri, tmp_path, monkeypatch):
    _plots_not_drawn(monkeypatch)
    texts = reported(mlflow_uri, tmp_path)
    for name, text in texts.items():
        assert text == (GOLDEN / name).read_text(encoding="utf-8"), f"{name} differs from tests/golden/{name}"


@pytest.mark.slow
def test_the_report_of_a_recorded_study_with_its_plots_drawn_is_what_the_old_code_wrote(mlflow_uri, tmp_path):
    texts = reported(mlflow_uri, tmp_path)
    for name, text in texts.items():
        assert text == (GOLDEN / name).read_text(encoding="utf-8"), f"{name} differs from tests/golden/{name}"


@pytest.mark.slow
def test_the_comparison_sees_a_changed_report(mlflow_uri, tmp_path, monkeypatch):
    """The golden files are not vacuous: the report of a study recorded one rate differently is not theirs."""
    _plots_not_drawn(monkeypatch)
    monkeypatch.setitem(RATES, (2, 1), 1500.0)
    texts = reported(mlflow_uri, tmp_path)
    assert texts["report.csv"] != (GOLDEN / "report.csv").read_text(encoding="utf-8")
    assert texts["report.md"] != (GOLDEN / "report.md").read_text(encoding="utf-8")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="write the golden report.md and report.csv of the recorded study")
    parser.add_argument("--write", type=Path, required=True, help="the folder to write them into")
    folder = parser.parse_args().write
    with tempfile.TemporaryDirectory() as scratch:
        import os

        from sweeplab.tracking import mlflow_store

        os.chdir(scratch)
        store = f"sqlite:///{Path(scratch) / 'mlflow.db'}"
        mlflow_store.init_store(store, "golden")
        found = reported(store, Path(scratch))
    folder.mkdir(parents=True, exist_ok=True)
    for file_name, content in found.items():
        (folder / file_name).write_text(content, encoding="utf-8")
    print(f"wrote {', '.join(found)} into {folder} with sweeplab from {sys.modules['sweeplab'].__file__}")
