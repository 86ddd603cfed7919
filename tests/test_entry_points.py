"""The read-only entry points (`python -m sweeplab.report`, `python -m sweeplab.export run_id=...`) with a wrong
store or id: one `error:` line in seconds, exit status 2, no database created; a report over a job that failed
before training keeps the table's columns."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from sweeplab.report import tables as report
from sweeplab.tracking import mlflow_store


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(tmp_path, *args: str, timeout: float = 90) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=timeout, cwd=tmp_path)
    return result, time.monotonic() - start


def _one_error_line(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr[-3000:]
    for fragment in fragments:
        assert fragment in errors[0]


@pytest.mark.parametrize("app", ["report", "export"])
def test_an_unreachable_tracking_server_fails_in_seconds(tmp_path, app):
    uri = f"http://127.0.0.1:{_closed_port()}"
    args = ["sweeplab.report", "--tracking-uri", uri] if app == "report" else [
        "sweeplab.export", "run_id=0123456789abcdef", f"tracking_uri={uri}"]
    result, seconds = _cli(tmp_path, *args)  # MLflow alone retries for minutes: the timeout fails the test
    _one_error_line(result, f"MLflow tracking server {uri} is not reachable")
    assert seconds < 60


def test_the_report_on_a_missing_sqlite_path_creates_no_database(tmp_path):
    missing = tmp_path / "typo" / "mlfow.db"
    missing.parent.mkdir()
    result, _ = _cli(tmp_path, "sweeplab.report", "--tracking-uri", f"sqlite:///{missing}")
    _one_error_line(result, "no MLflow store at", str(missing))
    assert list(missing.parent.iterdir()) == []


def test_an_unknown_sweep_id_is_one_line(mlflow_uri, tmp_path):
    mlflow_store.init_store(mlflow_uri, "sweeplab")
    result, _ = _cli(tmp_path, "sweeplab.report", "--sweep", "0123456789abcdef", "--tracking-uri", mlflow_uri)
    _one_error_line(result, "--sweep=0123456789abcdef: not found in")


def test_a_job_that_failed_before_training_keeps_the_report_columns(mlflow_uri, tmp_path):
    experiment_id = mlflow_store.init_store(mlflow_uri, "sweeplab")
    client = MlflowClient(mlflow_uri)
    parent = client.create_run(experiment_id, tags={"sweeplab.role": "sweep"}).info.run_id
    params = {f"group.key{i}": "same" for i in range(40)}  # a resolved config: many params, equal in every job
    for batch in (8, 16):
        run_id = client.create_run(
            experiment_id, tags={"mlflow.parentRunId": parent, "family": "textbridge", "backend": "cpu"}).info.run_id
        mlflow_store.log_params(client, run_id, {**params, "data.batch_size": str(batch)})
        client.set_terminated(run_id, "FINISHED")
    columns_before = report.sweep_report(mlflow_uri, parent, None).columns
    failed = client.create_run(experiment_id, tags={
        "mlflow.parentRunId": parent, "family": "textbridge", "error": "DataFormatError: x.jsonl: no such file"})
    client.set_terminated(failed.info.run_id, "FAILED")

    result = report.sweep_report(mlflow_uri, parent, None)
    assert result.columns == columns_before
    assert result.failed == 1
    (row,) = [r for r in result.rows if r["status"].startswith("FAILED")]
    assert "no such file" in row["status"] and row["bs"] == ""
