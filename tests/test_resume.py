"""kill -9 in the middle of a run, `resume=true`, and the run ends exactly as if nothing had happened."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import torch
from mlflow.tracking import MlflowClient


def _train(args, env=None, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "sweeplab.train", *args], capture_output=True, text=True, timeout=300,
        env={**os.environ, **(env or {})}, cwd=cwd,
    )


def _runs(uri, experiment):
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return client, client.search_runs([exp.experiment_id])


def test_killed_run_resumes_bit_identical_in_the_same_mlflow_run(demo_dir, mlflow_uri, tmp_path):
    common = [
        "debug=smoke", f"data.path={demo_dir}", "model.out_dim=64", "data.batch_size=16", "trainer.max_steps=30",
        "trainer.val_check_interval=10", "trainer.log_every_n_steps=1", "checkpoint.every_n_steps=5",
    ]
    reference = _train([*common, "logger.experiment_name=reference", f"hydra.run.dir={tmp_path / 'a'}"])
    assert reference.returncode == 0, reference.stderr[-2000:]

    killed = _train([*common, "logger.experiment_name=resumed", f"hydra.run.dir={tmp_path / 'b'}"],
                    env={"SWEEPLAB_FAULT_KILL_AT_STEP": "17"})
    assert killed.returncode == -signal.SIGKILL
    client, (run,) = _runs(mlflow_uri, "resumed")
    assert run.info.status == "RUNNING"  # nothing can mark a run killed by SIGKILL; resuming finishes it
    assert (tmp_path / "b" / "checkpoints" / "last.ckpt").exists()

    resumed = _train([*common, "logger.experiment_name=resumed", "resume=true", f"hydra.run.dir={tmp_path / 'c'}"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    client, runs = _runs(mlflow_uri, "resumed")
    assert len(runs) == 1 and runs[0].info.run_id == run.info.run_id and runs[0].info.status == "FINISHED"

    _, (ref_run,) = _runs(mlflow_uri, "reference")
    for key in ("train/loss", "lr", "val/cos"):
        got = [(m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)]
        want = [(m.step, m.value) for m in sorted(client.get_metric_history(ref_run.info.run_id, key), key=lambda m: m.step)]
        assert got == want, key  # every step once, none missing, same values

    final = torch.load(tmp_path / "b" / "checkpoints" / "last.ckpt", weights_only=True)
    expected = torch.load(tmp_path / "a" / "checkpoints" / "last.ckpt", weights_only=True)
    assert final["global_step"] == expected["global_step"] == 30
    for name, tensor in expected["state_dict"].items():
        assert torch.equal(final["state_dict"][name], tensor), name


def test_resume_without_an_interrupted_run_or_with_a_bad_checkpoint_fails_clearly(demo_dir, mlflow_uri, tmp_path):
    common = ["debug=smoke", f"data.path={demo_dir}", "model.out_dim=64"]
    nothing = _train([*common, "resume=true"])
    assert nothing.returncode == 2 and "resume=true: no interrupted run" in nothing.stderr
    truncated = tmp_path / "last.ckpt"
    truncated.write_bytes(b"PK\x03\x04 not really a checkpoint")
    bad = _train([*common, f"resume={truncated}"])
    assert bad.returncode == 2 and f"checkpoint {truncated}: not a readable PyTorch checkpoint" in bad.stderr
    missing = _train([*common, f"resume={tmp_path / 'nope.ckpt'}"])
    assert missing.returncode == 2 and "no such file" in missing.stderr
    assert "Traceback" not in bad.stderr + missing.stderr + nothing.stderr
    client = MlflowClient(mlflow_uri)
    exp = client.get_experiment_by_name("sweeplab")
    if exp is not None:
        assert all(r.info.status != "RUNNING" for r in client.search_runs([exp.experiment_id]))
