"""Several sweeplab processes started at the same instant on a fresh sqlite store: the schema is created once, every
run is recorded, and the store still opens afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

# Imports the heavy modules first, reports ready, then waits for the go file: the processes reach the store together.
AT_THE_BARRIER = """
import os, runpy, sys, time
import hydra, lightning, mlflow, sweeplab.train, sweeplab.engine.training
go = sys.argv[1]
open(f"{go}.ready.{os.getpid()}", "w").close()
while not os.path.exists(go):
    time.sleep(0.005)
sys.argv = ["sweeplab.train", *sys.argv[2:]]
runpy.run_module("sweeplab.train", run_name="__main__", alter_sys=True)
"""


OPEN_AT_THE_BARRIER = """
import os, sys, time
from sweeplab.tracking import mlflow_store
go = sys.argv[1]
open(f"{go}.ready.{os.getpid()}", "w").close()
while not os.path.exists(go):
    time.sleep(0.005)
print(mlflow_store.init_store(sys.argv[2], "sweeplab"))
"""


def _start_at_barrier(code: str, go, args: list[str], cwd, env=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, str(go), *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _release(processes: list[subprocess.Popen], go) -> list[str]:
    deadline = time.monotonic() + 240
    while len(list(go.parent.glob(f"{go.name}.ready.*"))) < len(processes):
        assert time.monotonic() < deadline and all(p.poll() is None for p in processes)
        time.sleep(0.05)
    go.touch()
    return [p.communicate(timeout=600)[0] for p in processes]


def test_four_processes_opening_a_fresh_store_together_create_it_once(tmp_path):
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    processes = [_start_at_barrier(OPEN_AT_THE_BARRIER, tmp_path / "go", [uri], tmp_path) for _ in range(4)]
    outputs = _release(processes, tmp_path / "go")
    for process, output in zip(processes, outputs):
        assert process.returncode == 0, output[-3000:]
    assert {output.strip().splitlines()[-1] for output in outputs} == {"1"}  # one experiment, the same for all
    client = MlflowClient(uri)
    run = client.create_run("1")
    client.set_terminated(run.info.run_id)
    assert client.get_run(run.info.run_id).info.status == "FINISHED"


@pytest.mark.slow
def test_four_processes_starting_together_on_a_fresh_store_all_record_their_runs(demo_dir, tmp_path):
    db = tmp_path / "fresh" / "mlflow.db"
    db.parent.mkdir()
    uri = f"sqlite:///{db}"
    go = tmp_path / "go"
    common = ["debug=smoke", f"data.path={demo_dir}", "model.out_dim=64", "trainer.max_steps=4",
              "trainer.val_check_interval=2", "timing.warmup_steps=1", "timing.window=2"]
    commands = [  # two sweeps of two jobs, two single runs
        ["-m", *common, "data.batch_size=8,16", f"hydra.sweep.dir={tmp_path / 'sweep_a'}"],
        ["-m", *common, "data.batch_size=8,16", f"hydra.sweep.dir={tmp_path / 'sweep_b'}"],
        [*common, f"hydra.run.dir={tmp_path / 'run_c'}"],
        [*common, f"hydra.run.dir={tmp_path / 'run_d'}"],
    ]
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    processes = [_start_at_barrier(AT_THE_BARRIER, go, args, tmp_path, env) for args in commands]
    outputs = _release(processes, go)

    for process, output in zip(processes, outputs):
        assert process.returncode == 0, output[-3000:]
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("sweeplab")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 2 * (1 + 2) + 2  # each sweep: a parent and two jobs
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert len([r for r in runs if r.data.tags.get("sweeplab.role") == "sweep"]) == 2
    # the store is whole: a new run can be created and read back
    run = client.create_run(experiment.experiment_id)
    client.set_terminated(run.info.run_id)
    assert client.get_run(run.info.run_id).info.status == "FINISHED"
