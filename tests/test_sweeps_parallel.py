"""Parallel local sweeps through Hydra's joblib launcher: one parent run, every job's run under it, no store errors.

`sweep()` and `store_runs()` are shared by the other sweep tests (test_sweeps_*.py, test_ddp*.py, test_tracking*.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

STORE_ERRORS = ("database is locked", "OperationalError", "alembic", "Traceback")


def sweep(cwd: Path, *overrides: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """`python -m sweeplab.train <overrides>` in `cwd` (the test's own dir, so multirun/ and outputs/ land there)."""
    result = subprocess.run(
        [sys.executable, "-m", "sweeplab.train", *overrides],
        capture_output=True, text=True, timeout=timeout, cwd=cwd, env={**os.environ, **(env or {})},
    )
    return result


def store_runs(uri: str, experiment: str = "sweeplab"):
    """(parent runs, job runs) of the experiment."""
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    runs = client.search_runs([found.experiment_id], max_results=1000) if found else []
    parents = [r for r in runs if r.data.tags.get("sweeplab.role") == "sweep"]
    return parents, [r for r in runs if r.data.tags.get("sweeplab.role") != "sweep"]


def smoke(demo_dir: Path, *overrides: str) -> list[str]:
    return ["debug=smoke", f"data.path={demo_dir}", "model.out_dim=64", *overrides]


def assert_one_sweep(uri: str, n_jobs: int, experiment: str = "sweeplab"):
    parents, children = store_runs(uri, experiment)
    assert len(parents) == 1 and len(children) == n_jobs
    (parent,) = parents
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parent.info.run_id}
    assert all(r.info.status == "FINISHED" for r in [parent, *children]), [r.info.status for r in children]
    return parent, children


@pytest.mark.slow  # ~50 s here: a joblib sweep with fake GPUs (fast siblings: tests/test_gpu_lanes.py)
# in the default suite: the one real joblib sweep there (its workers unpickle main() from `python -m sweeplab.train`)
def test_joblib_gpu_sweep_on_a_fresh_store_one_parent_own_gpu_per_worker(demo_dir, mlflow_uri, tmp_path):
    """4 jobs, 2 joblib workers, fresh sqlite store; two (pretend) GPUs: each worker holds one of its own."""
    result = sweep(
        tmp_path, "-m", "hydra/launcher=joblib_gpus", *smoke(demo_dir, "data.batch_size=4,8,16,32"),
        "trainer.max_steps=6", "trainer.val_check_interval=3",
        env={"CUDA_VISIBLE_DEVICES": "0,1", "SWEEPLAB_GPU_LOCK_DIR": str(tmp_path / "gpu_locks")},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert not any(e in result.stderr for e in STORE_ERRORS), result.stderr[-3000:]
    parent, children = assert_one_sweep(mlflow_uri, 4)
    assert sorted(int(r.data.params["data.batch_size"]) for r in children) == [4, 8, 16, 32]
    assert parent.data.tags["launcher"] == "joblib_gpus"
    # two workers, each on one GPU of its own; a job sees one GPU only
    assert {r.data.tags["cuda_visible_devices"] for r in children} == {"0", "1"}
    # every job's return value is its objective; the parent names the best job and carries the report
    assert all(r.data.tags["objective"] == "val/cos" and "objective" in r.data.metrics for r in children)
    best = max(children, key=lambda r: r.data.metrics["objective"])
    client = MlflowClient(mlflow_uri)
    parent = client.get_run(parent.info.run_id)
    assert parent.data.tags["best_run_id"] == best.info.run_id
    assert parent.data.metrics["best/objective"] == best.data.metrics["objective"]
    assert parent.data.params["best.data.batch_size"] == best.data.params["data.batch_size"]
    reported = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/report.md", "report/report.csv", "report/validation.png"} <= reported
    assert "report/objective.png" not in reported  # "best so far" over a grid's job order means nothing


@pytest.mark.slow
@pytest.mark.parametrize("attempt", range(5))
def test_parallel_sweep_on_a_fresh_sqlite_store_has_no_store_errors(demo_dir, tmp_path, monkeypatch, attempt):
    """The issue's command, 5 times, each on a fresh sqlite store (the default `sqlite:///mlflow.db`)."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    result = sweep(
        tmp_path, "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", *smoke(demo_dir, "data.batch_size=4,8,16,32"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert not any(e in result.stderr for e in STORE_ERRORS), result.stderr[-3000:]
    assert_one_sweep(f"sqlite:///{tmp_path / 'mlflow.db'}", 4)
