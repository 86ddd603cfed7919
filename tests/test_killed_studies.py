"""A study killed with kill -9 and continued with its continue command, on the default demo data (MiniLM teacher):
every job ends FINISHED and no run is left RUNNING (a run killed with -9 cannot close itself; the continuation does)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from sweeplab.engine.job import close_abandoned_runs, hold_run_lock, run_lock_is_free
from sweeplab.tracking import mlflow_store, naming


def _sweep(args, tmp_path, env=None):
    return subprocess.run([sys.executable, "-m", "sweeplab.train", "-m", *args], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path, env={**os.environ, **(env or {})})


@pytest.mark.slow  # two sweeps of four jobs: about a minute on a quiet 2-core machine (the fast kill -9 test on the
# default data is test_resume's bit-identity test; close_abandoned_runs is tested below)
@pytest.mark.parametrize("kill_at", [
    2,  # before the job's first checkpoint: it starts afresh; its old run must be closed
    4,  # after it: it resumes into its run, whose model the data completes
])
def test_a_study_killed_mid_round_continues_to_every_job_finished_and_no_run_running(
    kill_at, minilm_demo_dir, mlflow_uri, tmp_path
):
    study = ["debug=smoke", f"data.path={minilm_demo_dir}", "data.batch_size=8,16", "replicates=2",
             "trainer.max_steps=6", "trainer.val_check_interval=3", "checkpoint.every_n_steps=3",
             "logger.system_metrics_after_s=null"]
    sweep_dir = tmp_path / "sweep"
    killed = _sweep([*study, f"hydra.sweep.dir={sweep_dir}"], tmp_path, {"SWEEPLAB_FAULT_KILL_AT_STEP": str(kill_at)})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    client = MlflowClient(mlflow_uri)
    (abandoned,) = [r for r in client.search_runs(["1"], "attributes.status = 'RUNNING'")
                    if r.data.tags.get("sweeplab.role") != "sweep"]

    command = naming.continue_command(study, sweep_dir).split()  # no quoting needed here: plain overrides
    assert command[:4] == ["python", "-m", "sweeplab.train", "-m"]
    continued = _sweep(command[4:], tmp_path)
    assert continued.returncode == 0, continued.stderr[-3000:]
    runs = client.search_runs(["1"])
    assert not [r.info.run_id for r in runs if r.info.status == "RUNNING"]
    jobs = [r for r in runs if mlflow_store.is_job_run(r) and r.info.status == "FINISHED"]
    done = sorted((r.data.tags["config_index"], r.data.tags["replicate"]) for r in jobs)
    assert done == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")], done  # each job once
    closed = client.get_run(abandoned.info.run_id).info.status
    assert closed == ("KILLED" if kill_at < 3 else "FINISHED")  # resumed into its own run once it had a checkpoint


def test_only_runs_whose_process_is_gone_are_closed(mlflow_uri, tmp_path):
    client = MlflowClient(mlflow_uri)
    experiment = mlflow_store.init_store(mlflow_uri, "abandoned")
    folders = {name: tmp_path / name for name in ("gone", "alive", "elsewhere")}
    runs = {}
    for name, folder in folders.items():
        if name != "elsewhere":
            folder.mkdir()
        runs[name] = client.create_run(experiment, tags={"output_dir": str(folder)}).info.run_id
    (folders["gone"] / ".sweeplab.lock").write_text("pid 1 on nowhere\n")
    holder = subprocess.Popen(  # another process holds the lock of "alive" while its job trains
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from sweeplab.engine.job import hold_run_lock\n"
         f"with hold_run_lock(Path({str(folders['alive'])!r}), 'run'):\n print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert (run_lock_is_free(folders["gone"]), run_lock_is_free(folders["alive"]),
                run_lock_is_free(folders["elsewhere"])) == (True, False, None)
        closed = close_abandoned_runs(client, [client.get_run(r) for r in runs.values()])
    finally:
        holder.kill()
        holder.wait()
    assert closed == [runs["gone"]]
    assert [client.get_run(runs[n]).info.status for n in ("gone", "alive", "elsewhere")] == ["KILLED", "RUNNING", "RUNNING"]
    with hold_run_lock(folders["alive"], "run"):  # the holder's lock went with its process
        pass
