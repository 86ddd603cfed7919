"""kill -9 of a job's main process leaves no process of the job behind (core.orphans): its DataLoader workers, a
joblib sweep's loky workers and their helpers, an order check's sweep. Real processes, real SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

GONE_WITHIN_S = 3.0  # the parent-death signal is at once; torch's own worker watchdog looks every 5 s


def _start(tmp_path, *args):
    return subprocess.Popen([sys.executable, "-m", "sweeplab.train", *args], cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "SWEEPLAB_DATA_DIR": str(tmp_path / "data")})


def _descendants_once(process: subprocess.Popen, count: int, timeout_s: float = 240.0) -> list[psutil.Process]:
    """The process's descendants once there are at least `count` (it trains by then)."""
    parent, deadline = psutil.Process(process.pid), time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        found = parent.children(recursive=True)
        if len(found) >= count:
            time.sleep(1.0)  # let the others start too
            return parent.children(recursive=True)
        time.sleep(0.2)
    raise AssertionError(f"the job never had {count} child processes (exit status {process.poll()})")


def _kill_and_find_survivors(process: subprocess.Popen, descendants: list[psutil.Process]) -> list[str]:
    process.send_signal(signal.SIGKILL)
    process.wait()
    _, alive = psutil.wait_procs(descendants, timeout=GONE_WITHIN_S)
    survivors = []
    for child in alive:
        try:
            survivors.append(f"{child.pid} {' '.join(child.cmdline())[:120]}")
            child.kill()  # the test leaves nothing behind either
        except psutil.NoSuchProcess:
            pass
    return survivors


@pytest.mark.slow  # ~11 s: a real job with workers, kill -9
def test_kill_9_of_a_job_leaves_no_dataloader_worker(demo_dir, mlflow_uri, tmp_path):
    job = _start(tmp_path, "debug=smoke", f"data.path={demo_dir}", "model.out_dim=64", "data.batch_size=16",
                 "data.num_workers=2", "trainer.max_steps=100000", "trainer.val_check_interval=100000",
                 "logger.system_metrics_after_s=null", f"hydra.run.dir={tmp_path / 'run'}")
    workers = _descendants_once(job, 2)
    assert _kill_and_find_survivors(job, workers) == []


@pytest.mark.slow  # a joblib pool starting on a 2-core machine: ~30 s and more
def test_kill_9_of_a_joblib_sweep_leaves_no_loky_worker_or_helper(demo_dir, mlflow_uri, tmp_path):
    from mlflow.tracking import MlflowClient

    sweep = _start(tmp_path, "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "debug=smoke",
                   f"data.path={demo_dir}", "model.out_dim=64", "data.batch_size=8,16", "trainer.max_steps=100000",
                   "trainer.val_check_interval=100000", "logger.system_metrics_after_s=null",
                   f"hydra.sweep.dir={tmp_path / 'sweep'}")
    client, deadline = MlflowClient(mlflow_uri), time.monotonic() + 240
    while time.monotonic() < deadline and sweep.poll() is None:  # both jobs train (their runs exist)
        running = client.search_runs(["1"], "attributes.status = 'RUNNING'")
        if len([r for r in running if r.data.tags.get("sweeplab.role") != "sweep"]) == 2:
            break
        time.sleep(0.5)
    processes = _descendants_once(sweep, 4)  # two loky workers, loky's and multiprocessing's resource trackers
    assert _kill_and_find_survivors(sweep, processes) == []
