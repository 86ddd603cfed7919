"""A full disk, a read-only file system, a read-only or locked MLflow store: one `error:` line naming the path (or the
store) with the OS's reason, exit status 2, no run left RUNNING, no FINISHED run changed, nothing half-written.

The faults are real: each case runs `python -m ...` in its own mount namespace (`unshare -m`) on a small tmpfs, full
or mounted read-only. chmod cannot stand in for a read-only mount here: the tests run as root, which ignores it.
"""

from __future__ import annotations

import os
import shlex
import sqlite3
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from test_bad_input import assert_failed_cleanly, error_lines


def _can_mount() -> bool:
    if os.geteuid() != 0:
        return False
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
        capture_output=True,
    )
    return probe.returncode == 0


needs_mounts = pytest.mark.skipif(
    not _can_mount(), reason="needs root and a private mount namespace (unshare -m) for a real full or read-only mount"
)


def run_with_mounts(mounts: list[str], module: str, args: list[str], cwd, uri: str | None = None):
    """`python -m module args` after `mounts` (shell commands) in a private mount namespace; (status, stderr)."""
    env = {**os.environ}
    env.pop("HYDRA_FULL_ERROR", None)
    if uri:
        env["MLFLOW_TRACKING_URI"] = uri
    command = shlex.join([sys.executable, "-m", module, *map(str, args)])
    script = " && ".join([*mounts, f"exec {command}"])
    result = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )
    return result.returncode, result.stderr


def tmpfs(path, size="600k", read_only=False) -> str:
    path.mkdir(parents=True, exist_ok=True)
    return f"mount -t tmpfs -o size={size}{',ro' if read_only else ''} tmpfs {path}"


def smoke_args(demo_dir) -> list[str]:
    return ["debug=smoke", f"data.path={demo_dir}", "model.out_dim=64", "data.batch_size=16"]


def finished_run(uri: str) -> tuple[str, dict]:
    """A FINISHED run already in the store, and what it holds, to check that a failing job leaves it as it was."""
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("earlier"), run_name="earlier")
    client.log_metric(run.info.run_id, "val/cos", 0.5)
    client.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id, _state(uri, run.info.run_id)


def job_runs(uri: str) -> list:
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("sweeplab")
    return client.search_runs([experiment.experiment_id]) if experiment is not None else []


def _state(uri: str, run_id: str) -> dict:
    run = MlflowClient(uri).get_run(run_id)
    return {"status": run.info.status, "end": run.info.end_time, "metrics": run.data.metrics, "tags": run.data.tags}


@pytest.mark.slow  # ~10 s: a real job onto a full tmpfs
@needs_mounts
def test_a_full_disk_under_the_checkpoints_names_the_file_and_the_os_reason(demo_dir, tmp_path, mlflow_uri):
    earlier, before = finished_run(mlflow_uri)
    out = tmp_path / "full"
    # 300k: the job log and config fit, its checkpoints (weights-only best, then last.ckpt) do not
    code, err = run_with_mounts([tmpfs(out, size="300k")], "sweeplab.train", [*smoke_args(demo_dir), f"hydra.run.dir={out}/job"], tmp_path, mlflow_uri)
    assert_failed_cleanly(code, err, mlflow_uri, f"{out}/job/checkpoints/", ": No space left on device")
    assert _state(mlflow_uri, earlier) == before
    (job,) = job_runs(mlflow_uri)  # the job's own run: FAILED, with the reason
    assert job.info.status == "FAILED" and "No space left on device" in job.data.tags["error"]


@needs_mounts
@pytest.mark.parametrize("where", ["output", "checkpoints"])
def test_a_read_only_output_or_checkpoint_dir_fails_before_any_run(where, demo_dir, tmp_path, mlflow_uri):
    earlier, before = finished_run(mlflow_uri)
    job_dir = tmp_path / "ro" / "job"
    read_only = tmp_path / "ro" if where == "output" else job_dir / "checkpoints"
    code, err = run_with_mounts(
        [tmpfs(read_only, read_only=True)], "sweeplab.train", [*smoke_args(demo_dir), f"hydra.run.dir={job_dir}"],
        tmp_path, mlflow_uri,
    )
    assert_failed_cleanly(code, err, mlflow_uri, ": Read-only file system", str(job_dir))
    assert _state(mlflow_uri, earlier) == before
    assert job_runs(mlflow_uri) == []  # refused before the job's run was created


@needs_mounts
def test_a_read_only_mlflow_store_is_one_line_and_left_as_it_was(demo_dir, tmp_path, mlflow_uri):
    earlier, before = finished_run(mlflow_uri)
    db = mlflow_uri.removeprefix("sqlite:///")
    store_dir = os.path.dirname(db)
    code, err = run_with_mounts(
        [f"mount --bind {store_dir} {store_dir}", f"mount -o remount,bind,ro {store_dir}"],
        "sweeplab.train", [*smoke_args(demo_dir), f"hydra.run.dir={tmp_path.parent / (tmp_path.name + '-out')}"],
        tmp_path.parent, mlflow_uri,
    )
    assert_failed_cleanly(code, err, mlflow_uri, f"MLflow tracking store {mlflow_uri}", "readonly database")
    assert _state(mlflow_uri, earlier) == before


@pytest.mark.slow  # waits out sqlite's busy timeout
def test_a_locked_mlflow_store_is_one_line_and_leaves_no_run(demo_dir, tmp_path, mlflow_uri):
    earlier, before = finished_run(mlflow_uri)
    holder = sqlite3.connect(mlflow_uri.removeprefix("sqlite:///"), isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another process mid-write, for longer than sqlite's busy timeout
    try:
        env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_uri}
        env.pop("HYDRA_FULL_ERROR", None)
        result = subprocess.run(
            [sys.executable, "-m", "sweeplab.train", *smoke_args(demo_dir)],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        )
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert_failed_cleanly(result.returncode, result.stderr, mlflow_uri, f"MLflow tracking store {mlflow_uri}", "locked")
    assert _state(mlflow_uri, earlier) == before


@needs_mounts
@pytest.mark.parametrize("fault", ["full", "read_only"])
def test_prepare_onto_a_full_or_read_only_disk(fault, tmp_path):
    disk = tmp_path / "disk"
    args = ["--out", disk / "demo", "--n-sentences", 300, "--vocab-size", 500, "--teacher", "random", "--teacher-layers", 1,
            "--teacher-dim", 64, "--no-progress"]
    code, err = run_with_mounts(
        [tmpfs(disk, size="200k", read_only=fault == "read_only"), f"ls -A {disk}"], "sweeplab.families.textbridge.prepare", args, tmp_path
    )
    reason = "No space left on device" if fault == "full" else "Read-only file system"
    assert code == 2 and "Traceback" not in err and len(error_lines(err)) == 1 and reason in err, err
    assert str(disk) in error_lines(err)[0]
    assert not disk.exists() or not any(disk.iterdir())  # the namespace's mount is gone; nothing leaked underneath
