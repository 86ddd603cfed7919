"""Ctrl-C and SIGTERM, for real: `python -m sweeplab.train` in a subprocess gets the signal while it indexes its
data, trains, or validates after fit; its MLflow run must end KILLED and the process exit 130 / 143. A sweep stopped
in its first job closes its parent run KILLED with the job counts."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

TIMEOUT_S = 240


def _start(tmp_path: Path, *args: str, env: dict[str, str] | None = None, new_session: bool = False) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "sweeplab.train", *args], cwd=tmp_path, env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=new_session,
    )


def _kill(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # its own session's group, when it has one
        os.killpg(process.pid, signal.SIGKILL)
    process.kill()


def _wait_for(condition, process: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"exited with {process.returncode} before {what}:\n{process.stdout.read()[-3000:]}")
        if time.monotonic() > deadline:
            _kill(process)
            raise AssertionError(f"not {what} after {TIMEOUT_S} s:\n{process.communicate()[0][-3000:]}")
        time.sleep(0.1)


def _finish(process: subprocess.Popen) -> tuple[int, str]:
    try:
        output, _ = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _kill(process)
        raise AssertionError(f"still running {TIMEOUT_S} s after the signal:\n{process.communicate()[0][-3000:]}") from None
    return process.returncode, output


def _runs(uri: str):
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("sweeplab")
    return client, client.search_runs([experiment.experiment_id]) if experiment is not None else []


def _paused(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"SWEEPLAB_FAULT_PAUSED_FILE": str(tmp_path / "paused"), **extra}


def _smoke(demo_dir: Path, *overrides: str) -> list[str]:
    return ["debug=smoke", f"data.path={demo_dir}", "model.out_dim=64", "data.batch_size=16", *overrides]


@pytest.mark.parametrize(
    ("signum", "where"),
    [(signal.SIGINT, "training"), pytest.param(signal.SIGTERM, "training", marks=pytest.mark.slow),
     (signal.SIGTERM, "final validation")],
)
def test_a_signalled_run_ends_killed_with_the_signals_exit_status(demo_dir, mlflow_uri, tmp_path, signum, where):
    pause = {"SWEEPLAB_FAULT_PAUSE_AT_STEP": "3"} if where == "training" else {
        "SWEEPLAB_FAULT_PAUSE_AT_FINAL_VALIDATION": "1"}
    # 7 steps, validation every 5: the run validates once more after fit
    process = _start(tmp_path, *_smoke(demo_dir, "trainer.max_steps=7", "trainer.val_check_interval=5"),
                     env=_paused(tmp_path, **pause))
    _wait_for((tmp_path / "paused").exists, process, f"paused in {where}")
    process.send_signal(signum)
    code, output = _finish(process)

    assert code == 128 + signum, output[-3000:]
    assert f"error: interrupted by {signal.Signals(signum).name}" in output
    assert "Traceback" not in output
    client, (run,) = _runs(mlflow_uri)
    assert run.info.status == "KILLED"
    assert run.data.tags["error"] == f"Interrupted: interrupted by {signal.Signals(signum).name}"
    if where == "final validation":
        assert "val/cos" in run.data.metrics  # the validations during fit were stored before the signal


@pytest.mark.slow  # ~9 s: a real job signalled while it reads its data
def test_sigterm_while_the_data_is_read_ends_the_run_killed(demo_dir, mlflow_uri, tmp_path):
    # The data file is a FIFO that the test opens for writing and never writes to: the run blocks in reading its
    # first bytes, before Lightning (and its SIGTERM handler) has started.
    fifo = tmp_path / "data.jsonl"
    os.mkfifo(fifo)
    process = _start(tmp_path, "debug=smoke", f"data.path={fifo}", f"data.tokenizer_path={demo_dir / 'tokenizer.json'}")
    writer: list[int] = []

    def reader_is_waiting() -> bool:
        try:  # succeeds once the run has the FIFO open for reading
            writer.append(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            return True
        except OSError:
            return False

    try:
        _wait_for(reader_is_waiting, process, "reading its data")
        time.sleep(0.5)
        process.send_signal(signal.SIGTERM)
        code, output = _finish(process)
    finally:
        for fd in writer:
            os.close(fd)

    assert code == 143, output[-3000:]
    client, (run,) = _runs(mlflow_uri)
    assert run.info.status == "KILLED"
    traceback_text = client.download_artifacts(run.info.run_id, "error.txt", str(tmp_path))
    assert "open_dataset" in Path(traceback_text).read_text()  # it was stopped while opening the data


@pytest.mark.parametrize("launcher", ["basic", pytest.param("joblib", marks=pytest.mark.slow)])
def test_ctrl_c_in_a_sweep_stops_it_and_closes_its_parent_with_the_counts(demo_dir, mlflow_uri, tmp_path, launcher):
    parallel = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"] if launcher == "joblib" else []
    process = _start(tmp_path, "-m", *parallel, *_smoke(demo_dir, "data.batch_size=8,16", "trainer.max_steps=10"),
                     env=_paused(tmp_path, SWEEPLAB_FAULT_PAUSE_AT_STEP="3"), new_session=True)
    _wait_for((tmp_path / "paused").exists, process, "paused in a job")
    os.killpg(process.pid, signal.SIGINT)  # a terminal's Ctrl-C: every process of the group, joblib's workers too
    code, output = _finish(process)

    assert code == 130, output[-3000:]
    _, runs = _runs(mlflow_uri)
    (parent,) = [r for r in runs if r.data.tags.get("sweeplab.role") == "sweep"]
    jobs = [r for r in runs if r is not parent]
    assert parent.info.status == "KILLED"
    assert {r.info.status for r in jobs} == {"KILLED"}
    counts = {k: v for k, v in parent.data.metrics.items() if k.startswith("jobs_")}
    if launcher == "basic":  # one job at a time: the second never started
        assert [r.data.params["data.batch_size"] for r in jobs] == ["8"]
        assert counts == {"jobs_planned": 2, "jobs_done": 0, "jobs_failed": 0, "jobs_killed": 1, "jobs_not_run": 1}
    else:
        assert counts["jobs_killed"] == len(jobs) and counts["jobs_killed"] + counts["jobs_not_run"] == 2
