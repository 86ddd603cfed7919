"""backend=mlx: kill -9 in the middle of a run, `resume=true`, and the run ends exactly as if nothing had happened;
an interrupted MLX study continues with the command it printed. The patterns of tests/test_resume.py and
tests/test_replicates.py, run on the MLX loop (Linux CPU wheel here)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from conftest import smoke_config
from sweeplab.core.errors import UserError
from sweeplab.engine.training import train

pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'sweeplab[mlx]')")

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _train(args, env=None, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "sweeplab.train", *args], capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": SRC, **(env or {})}, cwd=cwd,
    )


def _runs(uri, experiment):
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return client, client.search_runs([exp.experiment_id])


def _history(client, run_id, key):
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]


def _assert_same_weights_and_optimizer(final: Path, expected: Path) -> None:
    got, want = torch.load(final, weights_only=True), torch.load(expected, weights_only=True)
    assert got["global_step"] == want["global_step"]
    for name, tensor in want["state_dict"].items():
        assert torch.equal(got["state_dict"][name], tensor), name  # bit for bit
    moments = want["mlx"]["optimizer"]["arrays"]
    for name, tensor in moments.items():
        assert torch.equal(got["mlx"]["optimizer"]["arrays"][name], tensor), name


# 30 steps of 16 from 270 training sentences: the run crosses an epoch boundary (16 batches an epoch) after the
# checkpoint it resumes from (step 15), so the data position and the next epoch's shuffle are both covered
COMMON = ["debug=smoke", "backend=mlx", "model.out_dim=64", "data.batch_size=16", "trainer.max_steps=30",
          "trainer.val_check_interval=10", "trainer.log_every_n_steps=1", "checkpoint.every_n_steps=5",
          "logger.system_metrics_after_s=null"]


@pytest.mark.slow  # three processes of ~10 s each (mx.compile's first traces run g++)
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_a_killed_mlx_run_resumes_bit_identical_in_the_same_mlflow_run(precision, demo_dir, mlflow_uri, tmp_path):
    common = [*COMMON, f"data.path={demo_dir}", f"trainer.precision={precision}"]
    reference = _train([*common, "logger.experiment_name=reference", f"hydra.run.dir={tmp_path / 'a'}"], cwd=tmp_path)
    assert reference.returncode == 0, reference.stderr[-2000:]

    killed = _train([*common, "logger.experiment_name=resumed", f"hydra.run.dir={tmp_path / 'b'}"],
                    env={"SWEEPLAB_FAULT_KILL_AT_STEP": "17"}, cwd=tmp_path)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    client, (run,) = _runs(mlflow_uri, "resumed")
    assert run.info.status == "RUNNING"
    assert torch.load(tmp_path / "b" / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 15

    resumed = _train([*common, "logger.experiment_name=resumed", "resume=true", f"hydra.run.dir={tmp_path / 'c'}"],
                     cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resume: continuing run" in resumed.stdout + resumed.stderr
    client, runs = _runs(mlflow_uri, "resumed")
    assert len(runs) == 1 and runs[0].info.run_id == run.info.run_id and runs[0].info.status == "FINISHED"

    _, (ref_run,) = _runs(mlflow_uri, "reference")
    for key in ("train/loss", "lr", "val/cos"):
        assert _history(client, run.info.run_id, key) == _history(client, ref_run.info.run_id, key), key
    _assert_same_weights_and_optimizer(tmp_path / "b" / "checkpoints" / "last.ckpt",
                                       tmp_path / "a" / "checkpoints" / "last.ckpt")
    best = Path(runs[0].data.tags["checkpoint"])
    assert best.parent == tmp_path / "b" / "checkpoints" and best.name == Path(ref_run.data.tags["checkpoint"]).name


@pytest.mark.slow  # a process killed, then a resume: ~20 s each on a busy 2-core host
@pytest.mark.parametrize("fault", [
    {"SWEEPLAB_FAULT_KILL_IN_VALIDATION_AT_STEP": "11"},  # the last step's validation, after last.ckpt at step 10
    {"SWEEPLAB_FAULT_KILL_AFTER_FIT": "1"},  # every checkpoint written; the summary, tags and export not yet
], ids=["in-last-validation", "after-fit"])
def test_an_mlx_run_killed_after_its_last_periodic_checkpoint_resumes_to_the_end(fault, demo_dir, mlflow_uri, tmp_path):
    common = ["debug=smoke", "backend=mlx", f"data.path={demo_dir}", "model.out_dim=64", "data.batch_size=16",
              "trainer.max_steps=11", "trainer.val_check_interval=2", "checkpoint.every_n_steps=2",
              "logger.system_metrics_after_s=null"]
    killed = _train([*common, f"hydra.run.dir={tmp_path / 'run'}"], env=fault, cwd=tmp_path)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    objective = train(smoke_config(demo_dir, *common, "resume=true"), tmp_path / "elsewhere")
    client, (run,) = _runs(mlflow_uri, "sweeplab")
    assert run.info.status == "FINISHED"
    history = _history(client, run.info.run_id, "val/cos")
    assert [s for s, _ in history] == [1, 3, 5, 7, 9, 10]  # every validation once, the last step's included
    best_step, best = max(history, key=lambda sv: sv[1])
    assert objective == pytest.approx(best, rel=1e-6)
    checkpoints = tmp_path / "run" / "checkpoints"  # resume=true continues in the run's own folder
    assert sorted(p.name for p in checkpoints.glob("best-*.ckpt")) == [Path(run.data.tags["checkpoint"]).name]
    assert torch.load(checkpoints / "last.ckpt", weights_only=True)["global_step"] == 11
    assert "summary/num_parameters" in run.data.metrics


def test_a_failed_mlx_run_resumes_to_the_uninterrupted_weights_with_accumulation(demo_dir, mlflow_uri, tmp_path,
                                                                                  monkeypatch):
    """In one process (fast): a run that failed at step 7 resumes from its last.ckpt (step 4) to the same bits,
    with two batches per optimizer step (the data position counts batches, the checkpoint optimizer steps)."""
    common = ["trainer.max_steps=10", "trainer.val_check_interval=4", "checkpoint.every_n_steps=4",
              "trainer.accumulate_grad_batches=2", "trainer.log_every_n_steps=1", "timing.warmup_steps=0",
              "logger.system_metrics_after_s=null"]
    train(smoke_config(demo_dir, "backend=mlx", *common, "logger.experiment_name=reference"), tmp_path / "a")
    monkeypatch.setenv("SWEEPLAB_FAULT_RAISE_AT_STEP", "7")
    with pytest.raises(RuntimeError, match="injected failure at step 7"):
        train(smoke_config(demo_dir, "backend=mlx", *common), tmp_path / "b")
    monkeypatch.delenv("SWEEPLAB_FAULT_RAISE_AT_STEP")
    client, (run,) = _runs(mlflow_uri, "sweeplab")
    assert run.info.status == "FAILED"
    train(smoke_config(demo_dir, "backend=mlx", *common, "resume=true"), tmp_path / "c")
    client, (again,) = _runs(mlflow_uri, "sweeplab")
    assert again.info.run_id == run.info.run_id and again.info.status == "FINISHED"
    _, (reference,) = _runs(mlflow_uri, "reference")
    assert _history(client, run.info.run_id, "train/loss") == _history(client, reference.info.run_id, "train/loss")
    _assert_same_weights_and_optimizer(tmp_path / "b" / "checkpoints" / "last.ckpt",
                                       tmp_path / "a" / "checkpoints" / "last.ckpt")


def test_a_checkpoint_is_resumed_only_by_the_kind_of_loop_that_wrote_it(demo_dir, mlflow_uri, tmp_path):
    short = ["trainer.max_steps=5", "checkpoint.every_n_steps=5", "logger=none"]
    train(smoke_config(demo_dir, *short), tmp_path / "cpu")
    train(smoke_config(demo_dir, "backend=mlx", *short), tmp_path / "mlx")
    for backend, other in (("mlx", "cpu"), ("cpu", "mlx")):
        with pytest.raises(UserError) as refused:
            train(smoke_config(demo_dir, f"backend={backend}", "logger=none", "trainer.max_steps=8",
                               f"resume={tmp_path / other}"), tmp_path / "again")
        message = str(refused.value)
        assert message.startswith(f"resume: checkpoint {tmp_path / other / 'checkpoints' / 'last.ckpt'} was written by")
        assert f"this job trains with backend={backend}" in message and "\n" not in message
    assert not (tmp_path / "again").exists()  # refused before anything was written


@pytest.mark.slow  # a two-job study, interrupted and continued: ~1 minute
def test_an_interrupted_mlx_study_continues_with_the_printed_command(demo_dir, mlflow_uri, tmp_path):
    """A real SIGINT while the study's second job trains (paused at step 12, last.ckpt at 10); then the command the
    study printed, run as printed: the first job is kept, the second continues its own run from its checkpoint."""
    paused = tmp_path / "paused"
    env = {**os.environ, "PYTHONPATH": SRC, "SWEEPLAB_FAULT_PAUSE_AT_STEP": "12",
           "SWEEPLAB_FAULT_PAUSED_FILE": str(paused)}
    command = [sys.executable, "-m", "sweeplab.train", "-m", "debug=smoke", "backend=mlx", f"data.path={demo_dir}",
               "model.out_dim=64", "data.batch_size=16", "trainer.max_steps=20", "checkpoint.every_n_steps=5",
               "trainer.log_every_n_steps=1", "optim.lr=1e-3,3e-3", "logger.system_metrics_after_s=null",
               f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    first = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def wait_for_pause():
        deadline = time.monotonic() + 300
        while not paused.exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert paused.exists(), "the job never reached its pause"

    wait_for_pause()
    paused.unlink()  # the first job goes on to its end
    wait_for_pause()  # the second job, at step 12
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 130, err[-3000:]
    client = MlflowClient(mlflow_uri)
    jobs = [r for r in client.search_runs(["1"]) if r.data.tags.get("sweeplab.role") != "sweep"]
    (stopped,) = [r for r in jobs if r.info.status != "FINISHED"]
    (kept,) = [r for r in jobs if r.info.status == "FINISHED"]

    (line,) = [li for li in err.splitlines() if "Continue it with: " in li]
    again = shlex.split(line.partition("Continue it with: ")[2])
    env.pop("SWEEPLAB_FAULT_PAUSE_AT_STEP")
    second = subprocess.run([sys.executable, *again[1:]], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resume: continuing run " + stopped.info.run_id in second.stdout + second.stderr
    runs = client.search_runs(["1"])
    (parent,) = [r for r in runs if r.data.tags.get("sweeplab.role") == "sweep"]
    done = {r.info.run_id: r for r in runs if r.data.tags.get("sweeplab.role") != "sweep"}
    assert parent.info.status == "FINISHED" and set(done) == {kept.info.run_id, stopped.info.run_id}
    assert all(r.info.status == "FINISHED" for r in done.values())
    steps = [s for s, _ in _history(client, stopped.info.run_id, "train/loss")]
    assert steps == list(range(20))  # every step once: the first attempt's and the resumed ones
