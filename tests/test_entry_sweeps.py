"""Sweeps that fail or are stopped from outside their jobs: a sweep that fails before its first job closes its parent
run; `order_check` says so when no configuration ran, and passes SIGTERM, SIGINT and SIGHUP on to the sweep it runs,
waits for it and exits with the signal's status in one line."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from sweeplab import order_check
from test_bad_input import error_lines, run_cli
from test_interrupts import _finish, _smoke, _wait_for


def _all_runs(uri: str) -> list:
    client = MlflowClient(uri)
    return [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


def test_a_misspelt_swept_key_closes_the_sweeps_parent_run(mlflow_uri, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    code, err = run_cli(["-m", "debug=smoke", "data.batch_sise=8,16", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                        monkeypatch, capsys)
    assert code == 2 and "Traceback" not in err
    (line,) = error_lines(err)
    assert "data.batch_sise: unknown key; did you mean data.batch_size?" in line
    (parent,) = _all_runs(mlflow_uri)  # the sweep's parent, and no job
    assert parent.data.tags["sweeplab.role"] == "sweep"
    assert parent.info.status == "FAILED" and parent.info.end_time is not None
    assert "data.batch_sise: unknown key" in parent.data.tags["error"]
    counts = {k: v for k, v in parent.data.metrics.items() if k.startswith("jobs_")}
    assert counts == {"jobs_planned": 2, "jobs_not_run": 2, "jobs_done": 0, "jobs_failed": 0, "jobs_killed": 0}


def test_the_order_check_says_no_configuration_ran_and_fails(tmp_path, capsys):
    """Both orders ran no job (each sweep failed before its first): no verdict over an empty table."""
    args = argparse.Namespace(overrides=["data.batch_size=8,16"], rounds=1)
    status = order_check._write(args, ["data.batch_size"], {("forward", 1): {}, ("reversed", 1): {}}, ["forward", "reversed"],
                                tmp_path, n_jobs=2)
    markdown = (tmp_path / "order_check.md").read_text()
    assert status == 1
    assert "no configuration ran: all 2 jobs of every order failed or never started" in markdown
    assert "every configuration within" not in markdown
    assert capsys.readouterr().err.startswith("error: order check: no configuration ran")


def _processes_with(text: str) -> list[int]:
    """Pids whose command line holds `text` (the child sweep's own sweep dir)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.slow  # a real sweep in a child process: ~20 s each on a 2-core machine
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_the_order_check_passes_a_signal_on_to_its_sweep_and_exits_with_its_status(signum, demo_dir, mlflow_uri, tmp_path):
    out = tmp_path / "check"
    process = subprocess.Popen(
        [sys.executable, "-m", "sweeplab.order_check", *_smoke(demo_dir, "data.batch_size=8,16", "trainer.max_steps=10"),
         "--out", str(out)],
        cwd=tmp_path, env={**os.environ, "SWEEPLAB_FAULT_PAUSED_FILE": str(tmp_path / "paused"),
                           "SWEEPLAB_FAULT_PAUSE_AT_STEP": "3"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    _wait_for((tmp_path / "paused").exists, process, "paused in the forward sweep's first job")
    child = _processes_with(f"hydra.sweep.dir={out / 'forward'}")
    assert child, "the forward sweep's process is not running"
    sent = time.monotonic()
    os.killpg(process.pid, signum)  # a terminal's Ctrl-C or hang-up reaches the check's group: not its sweep's
    code, output = _finish(process)

    assert code == 128 + signum, output[-3000:]
    assert time.monotonic() - sent < 60, output[-3000:]
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-3000:]
    (line,) = error_lines(output)
    assert line.startswith(f"error: order check interrupted by {signal.Signals(signum).name}")
    assert not _processes_with(f"hydra.sweep.dir={out / 'forward'}"), "the sweep outlived the check"
    assert not (out / "reversed").exists()  # the second order never started
    runs = _all_runs(mlflow_uri)
    assert {r.data.tags.get("sweeplab.role", "job") for r in runs} == {"sweep", "job"}
    assert {r.info.status for r in runs} == {"KILLED"}, [(r.data.tags.get("mlflow.runName"), r.info.status) for r in runs]
    (job,) = [r for r in runs if r.data.tags.get("sweeplab.role") != "sweep"]
    assert job.data.params["data.batch_size"] == "8"  # the first job, stopped; the second never started
    for pid in child:  # nothing to clean up if the test holds; never leave a stray sweep behind if it does not
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
