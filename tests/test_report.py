"""The report reads a sweep from MLflow and writes the table (Markdown + CSV) and the two plots."""

from __future__ import annotations

import csv

from mlflow.tracking import MlflowClient

from sweeplab.core import channels
from sweeplab.report import __main__ as report_cli
from sweeplab.report import tables as report
from sweeplab.study.sweep import read_sweep
from sweeplab.tracking import mlflow_store

JOBS = [  # backend, batch size, precision, compile, samples/s, MFU, val/cos history
    ("cpu", 16, "32-true", "off", 100.0, None, [(10, 0.2), (20, 0.4)]),
    ("cpu", 32, "32-true", "off", 150.0, None, [(10, 0.25), (20, 0.45)]),
    ("cuda", 64, "bf16-mixed", "default", 2000.0, 0.31, [(10, 0.3), (20, 0.5)]),
    ("cuda", 256, "bf16-mixed", "default", 6000.0, 0.42, [(10, 0.35), (20, 0.55)]),
]


def make_sweep(uri: str, tmp_path, failed: bool = False) -> str:
    experiment_id = mlflow_store.init_store(uri, "sweeplab")
    client = MlflowClient(uri)
    sweep_dir = tmp_path / "multirun" / "sweep"
    sweep_dir.mkdir(parents=True)
    parent = client.create_run(experiment_id, tags={"sweeplab.role": "sweep", "sweep_dir": str(sweep_dir)}).info.run_id
    (sweep_dir / channels.PARENT_RUN_FILE).write_text(parent)
    for i, (backend, batch, precision, compile_mode, rate, mfu, history) in enumerate(JOBS):
        tags = {
            "mlflow.parentRunId": parent, "mlflow.runName": f"job{i} bs={batch} {backend}", "family": "textbridge",
            "backend": backend, "device": "NVIDIA H100 80GB HBM3" if backend == "cuda" else "AMD EPYC",
            "precision": precision, "compile": compile_mode,
        }
        run_id = client.create_run(experiment_id, tags=tags).info.run_id
        client.log_param(run_id, "data.batch_size", str(batch))
        client.log_param(run_id, "loss.alpha", "0.7")
        metrics = {"summary/samples_per_sec": rate, "summary/step_time_s_median": batch / rate,
                   "summary/tokens_per_sec": rate * 40}
        if mfu is not None:
            metrics["summary/mfu"] = mfu
        for key, value in metrics.items():
            client.log_metric(run_id, key, value)
        for step, value in history:
            client.log_metric(run_id, "val/cos", value, step=step)
        client.set_terminated(run_id, "FAILED" if failed and i == 3 else "FINISHED")
    return parent


def test_sweep_report_table_speedup_and_plots(mlflow_uri, tmp_path):
    parent = make_sweep(mlflow_uri, tmp_path)
    out = tmp_path / "out"
    result = report.sweep_report(mlflow_uri, parent, out)

    names = {p.name for p in result.files}
    assert names == {"report.md", "report.csv", "report.html", "throughput.png", "validation.png"}
    for png in ("throughput.png", "validation.png"):
        assert (out / png).stat().st_size > 10_000  # a real picture, not an empty canvas
    for column in ("backend", "device", "bs", "precision", "compile", "median step (s)", "samples/s", "tokens/s",
                   "MFU", "speedup", "final metric"):
        assert column in result.columns
    rows = {r["run"]: r for r in result.rows}
    assert rows["job0 bs=16 cpu"]["speedup"] == "1.00× (baseline)"  # the first CPU run by default
    assert rows["job3 bs=256 cuda"]["speedup"] == "60.00×"
    assert rows["job3 bs=256 cuda"]["MFU"] == "42.0%" and rows["job0 bs=16 cpu"]["MFU"] == ""
    assert rows["job2 bs=64 cuda"]["final metric"] == "val/cos 0.5"  # the metric's one name, as the console's
    assert "plots beside this file: `throughput.png`, `validation.png`" in result.markdown
    assert "![" not in result.markdown  # MLflow's Markdown viewer shows an image as its raw link text
    assert "every run: status FINISHED, α 0.7\n" in result.markdown  # constants above, not in every row
    assert result.markdown.count("| FINISHED |") == 0 and "| run | backend | device | bs |" in result.markdown
    with open(out / "report.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == 4


def test_baseline_by_name_or_row(mlflow_uri, tmp_path):
    parent = make_sweep(mlflow_uri, tmp_path)
    by_name = report.sweep_report(mlflow_uri, parent, None, baseline="bs=64")
    assert {r["run"]: r["speedup"] for r in by_name.rows}["job3 bs=256 cuda"] == "3.00×"
    by_row = report.sweep_report(mlflow_uri, parent, None, baseline="1")
    assert by_row.rows[1]["speedup"] == "1.00× (baseline)"


def test_throughput_series_are_per_backend_precision_compile(mlflow_uri, tmp_path):
    parent = make_sweep(mlflow_uri, tmp_path)
    series = report.throughput_points(read_sweep(mlflow_uri, parent))
    assert sorted(series) == ["cpu 32-true (AMD EPYC)", "cuda bf16-mixed compile=default (NVIDIA H100 80GB HBM3)"]
    assert series["cpu 32-true (AMD EPYC)"] == [(16, 100.0), (32, 150.0)]


def test_cli_from_a_multirun_dir_logs_artifacts_and_flags_failures(mlflow_uri, tmp_path, capsys):
    parent = make_sweep(mlflow_uri, tmp_path, failed=True)
    sweep_dir = tmp_path / "multirun" / "sweep"
    code = report_cli.main(["--multirun-dir", str(sweep_dir), "--tracking-uri", mlflow_uri])
    assert code == 1  # one job failed
    assert (sweep_dir / "report.md").exists() and (sweep_dir / "throughput.png").exists()
    out = capsys.readouterr().out
    assert "1 of 4 jobs FAILED" in out
    artifacts = {a.path for a in MlflowClient(mlflow_uri).list_artifacts(parent, "report")}
    assert {"report/report.md", "report/report.html", "report/throughput.png", "report/validation.png"} <= artifacts
    # the page beside report.md, its path the last line printed; no replicates: its table has one row per job
    assert out.splitlines()[-1] == f"report: {(sweep_dir / 'report.html').resolve()}"
    page = (sweep_dir / "report.html").read_text()
    assert page.count('<tr data-config="job') == 4 and 'id="throughput"' in page and "no verdict" in page


STABLE = {"summary/batch_shapes": 3.0, "summary/host_cpus": 2.0, "summary/load_avg_start": 0.5, "summary/load_avg_end": 1.2}
NOISY_JOBS = [  # name, samples/s, spread of the window step times, other summary metrics
    ("base", 100.0, 0.02, {}),
    ("same work", 103.0, 0.02, {}),  # 3 %: inside the 5 % floor
    ("noisy same work", 112.0, 0.25, {}),  # 12 % apart, but its own step times spread over 25 %
    ("noisy faster", 140.0, 0.25, {}),  # 40 %: outside even that
    ("just noisy", 100.0, 0.103, {}),  # over the 10 % threshold by less than whole percents show
    ("faster", 120.0, 0.03, {}),
    ("loaded", 100.0, 0.02, {"summary/load_avg_end": 5.0}),
    ("unsteady host", 100.0, 0.07, {"summary/host_speed_spread": 0.8}),  # steps spread 7 %: the host may be their pace
    ("steady on an unsteady host", 100.0, 0.02, {"summary/host_speed_spread": 0.8}),  # the device sets its pace
    ("first-shape costs", 100.0, 0.02, {"summary/new_shapes_in_timed_steps": 7.0, "summary/compiles_in_timed_steps": 1.0}),
]


def test_the_report_marks_unreliable_rows_and_claims_no_speedup_inside_the_noise(mlflow_uri, tmp_path):
    experiment_id = mlflow_store.init_store(mlflow_uri, "sweeplab")
    client = MlflowClient(mlflow_uri)
    parent = client.create_run(experiment_id, tags={"sweeplab.role": "sweep"}).info.run_id
    for name, rate, spread, extra in NOISY_JOBS:
        tags = {"mlflow.parentRunId": parent, "mlflow.runName": name, "family": "textbridge", "backend": "cpu"}
        run_id = client.create_run(experiment_id, tags=tags).info.run_id
        metrics = {**STABLE, "summary/samples_per_sec": rate, "summary/step_time_s_median": 32 / rate,
                   "summary/step_time_spread": spread, **extra}
        for key, value in metrics.items():
            client.log_metric(run_id, key, value)
        client.set_terminated(run_id, "FINISHED")

    result = report.sweep_report(mlflow_uri, parent, None)
    rows = {r["run"]: r for r in result.rows}
    assert {"spread", "stability"} <= set(result.columns)
    assert rows["base"]["speedup"] == "1.00× (baseline)" and rows["base"]["stability"] == "ok"
    assert rows["base"]["spread"] == "2.0%"
    assert rows["same work"]["speedup"] == "within noise (1.03×)"
    assert rows["noisy same work"]["speedup"] == "within noise (1.12×)"
    assert rows["noisy same work"]["stability"] == "noisy (spread 25% > 10%)"
    assert rows["just noisy"]["stability"] == "noisy (spread 10.3% > 10%)"
    assert rows["noisy faster"]["speedup"] == "1.40×"
    assert rows["faster"]["speedup"] == "1.20×" and rows["faster"]["stability"] == "ok"
    assert rows["loaded"]["stability"] == "loaded host (load 5.0 on 2 CPUs)"
    assert rows["unsteady host"]["stability"] == "unsteady host (Python speed spread 80% > 50%)"
    assert rows["steady on an unsteady host"]["stability"] == "ok"
    assert rows["first-shape costs"]["stability"] == (
        "1 compilation(s) in timed steps; 7 new batch shape(s) in timed steps"
    )
    assert "within noise: the two rows differ by less than" in result.markdown


def test_the_csv_holds_numbers_that_pandas_reads_as_floats(mlflow_uri, tmp_path):
    import pandas as pd

    parent = make_sweep(mlflow_uri, tmp_path)
    report.sweep_report(mlflow_uri, parent, tmp_path / "out")
    table = pd.read_csv(tmp_path / "out" / "report.csv")
    for column in ("bs", "median step (s)", "samples/s", "tokens/s", "MFU", "speedup", "final val/cos"):
        assert pd.api.types.is_float_dtype(table[column]) or pd.api.types.is_integer_dtype(table[column]), column
    by_run = table.set_index("run")
    assert by_run.loc["job3 bs=256 cuda", "samples/s"] == 6000.0  # the Markdown shows "6,000"
    assert by_run.loc["job3 bs=256 cuda", "median step (s)"] == 256 / 6000  # unrounded (the Markdown: 0.04267)
    assert by_run.loc["job3 bs=256 cuda", "speedup"] == 60.0 and by_run.loc["job0 bs=16 cpu", "speedup"] == 1.0
    assert by_run.loc["job3 bs=256 cuda", "MFU"] == 0.42 and pd.isna(by_run.loc["job0 bs=16 cpu", "MFU"])
    assert by_run.loc["job2 bs=64 cuda", "final val/cos"] == 0.5


def test_integers_stay_integers_and_a_mixed_backend_sweep_has_one_backend_column(mlflow_uri, tmp_path):
    """bs is written 16, not 16.0; backend.name (and MLX's backend.device, absent elsewhere) follow the backend
    column, so they are not columns of their own; a backend setting that differs within one backend still is."""
    parent = make_sweep(mlflow_uri, tmp_path)
    client = MlflowClient(mlflow_uri)
    for i, run in enumerate(mlflow_store.sweep_jobs(mlflow_uri, parent)):
        backend = run.data.tags["backend"]
        client.log_param(run.info.run_id, "backend.name", backend)
        if backend == "cuda":
            client.log_param(run.info.run_id, "backend.device", "auto")
        client.log_param(run.info.run_id, "backend.matmul_precision", "high" if i % 2 else "medium")
    result = report.sweep_report(mlflow_uri, parent, tmp_path / "out")
    assert "backend" in result.columns and "backend.name" not in result.columns and "backend.device" not in result.columns
    assert "backend.matmul_precision" in result.columns
    with open(tmp_path / "out" / "report.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["row"] == "job"]
    assert sorted(r["bs"] for r in rows) == ["16", "256", "32", "64"]
