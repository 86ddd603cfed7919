"""A copied or moved project (`cp -a project copy`) never writes into the original: its store still names the
original's artifact folders (MLflow records them as absolute paths), so every entry point that logs to it refuses
in one line naming the original tree (mlflow_store.refuse_moved_store), and the original is left byte for byte."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from sweeplab.core.errors import UserError
from sweeplab.tracking import mlflow_store


def snapshot(tree: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under `tree` with its size and modification time (ns)."""
    return {str(p.relative_to(tree)): (p.stat().st_size if p.is_file() else -1, p.stat().st_mtime_ns)
            for p in sorted(tree.rglob("*"))}


def recorded_project(root: Path, monkeypatch) -> tuple[str, str]:
    """A project folder whose store holds a run with an artifact, made from inside it as `make sweep` makes one."""
    root.mkdir()
    monkeypatch.chdir(root)  # MLflow puts an experiment's artifacts under the working directory's mlruns/
    uri = f"sqlite:///{root / 'mlflow.db'}"
    experiment = mlflow_store.init_store(uri, "study")
    client = MlflowClient(uri)
    run = client.create_run(experiment).info.run_id
    (root / "note.txt").write_text("a checkpoint's stand-in")
    client.log_artifact(run, str(root / "note.txt"))
    client.set_terminated(run)
    return uri, run


def test_a_copied_projects_store_refuses_writes_naming_the_original(tmp_path, monkeypatch):
    original, copy = tmp_path / "project", tmp_path / "copy"
    uri, run = recorded_project(original, monkeypatch)
    subprocess.run(["cp", "-a", str(original), str(copy)], check=True)
    monkeypatch.chdir(copy)
    before = snapshot(original)
    copied = f"sqlite:///{copy / 'mlflow.db'}"
    for opening in (lambda: mlflow_store.init_store(copied, "study"), lambda: mlflow_store.init_store(copied, "new"),
                    lambda: mlflow_store.open_existing_store(copied)):
        with pytest.raises(UserError) as refused:
            opening()
        message = str(refused.value)
        assert "\n" not in message and f"copied or moved from {original}:" in message
    mlflow_store.open_existing_store(copied, writes=False)  # reading it (make ui) is no write
    assert snapshot(original) == before
    # the original itself, and a project moved whole with its folder renamed back, are no copies
    assert mlflow_store.moved_from(uri) is None
    assert mlflow_store.init_store(uri, "study")


@pytest.mark.slow  # a real study, then a new one and an export in the copy (minutes on a busy 2-core machine)
def test_after_cp_a_a_new_study_and_an_export_in_the_copy_write_nothing_into_the_original(demo_dir, tmp_path):
    original, copy = tmp_path / "project", tmp_path / "copy"
    original.mkdir()
    env = {k: v for k, v in os.environ.items() if k != mlflow_store.TRACKING_URI_ENV}  # the default store: ./mlflow.db
    study = [sys.executable, "-m", "sweeplab.train", "-m", "debug=smoke", f"data.path={demo_dir}", "model.out_dim=64",
             "data.batch_size=8,16", "trainer.max_steps=2"]
    result = subprocess.run(study, cwd=original, env=env, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:]
    uri = f"sqlite:///{original / 'mlflow.db'}"
    sweep = mlflow_store.read_run(uri, mlflow_store.latest_sweep(uri))
    subprocess.run(["cp", "-a", str(original), str(copy)], check=True)
    before = snapshot(original)
    again = subprocess.run(study, cwd=copy, env=env, capture_output=True, text=True, timeout=1200)
    export = subprocess.run([sys.executable, "-m", "sweeplab.export", f"run_id={sweep.tags['best_run_id']}"],
                            cwd=copy, env=env, capture_output=True, text=True, timeout=1200)
    for result in (again, export):
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert result.returncode != 0 and errors, result.stderr[-3000:]
        assert f"copied or moved from {original}" in errors[0]
    assert snapshot(original) == before
