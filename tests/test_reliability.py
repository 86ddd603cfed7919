"""Guards against lost work: non-finite steps, crashing and out-of-memory jobs, atomic and safe checkpoints."""

from __future__ import annotations

import pickle

import pytest
import torch
from mlflow.tracking import MlflowClient

from conftest import smoke_config
from sweeplab.core.errors import UserError
from sweeplab.engine.training import train
from sweeplab.tasks.checkpoint import AtomicCheckpointIO, read_checkpoint


def _only_run(uri):
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("sweeplab").experiment_id])
    return client, run


def test_skip_mode_drops_a_non_finite_step_and_finishes(demo_dir, mlflow_uri, monkeypatch):
    monkeypatch.setenv("SWEEPLAB_FAULT_NAN_GRAD_AT_STEP", "7")
    cfg = smoke_config(demo_dir, "guard.mode=skip", "trainer.max_steps=12")
    train(cfg)
    client, run = _only_run(mlflow_uri)
    assert run.info.status == "FINISHED"
    assert all(torch.isfinite(torch.tensor(m.value)) for m in client.get_metric_history(run.info.run_id, "train/loss"))


def test_stop_mode_names_the_first_bad_step_and_marks_the_run_failed(demo_dir, mlflow_uri, monkeypatch):
    monkeypatch.setenv("SWEEPLAB_FAULT_NAN_GRAD_AT_STEP", "7")
    with pytest.raises(UserError, match="non-finite loss or gradient norm at step 7"):
        train(smoke_config(demo_dir, "trainer.max_steps=12", "guard.check_every_n_steps=4"))
    client, run = _only_run(mlflow_uri)
    assert run.info.status == "FAILED" and "at step 7" in run.data.tags["error"]


def test_a_bad_step_after_the_last_check_interval_stops_the_run_at_its_end(demo_dir, mlflow_uri, monkeypatch):
    monkeypatch.setenv("SWEEPLAB_FAULT_NAN_GRAD_AT_STEP", "10")  # checks at steps 7 and 15: 10 is after the last
    with pytest.raises(UserError, match="non-finite loss or gradient norm at step 10"):
        train(smoke_config(demo_dir, "trainer.max_steps=12", "guard.check_every_n_steps=8"))
    _, run = _only_run(mlflow_uri)
    assert run.info.status == "FAILED"


def test_guard_off_lets_a_diverged_run_finish_but_marks_it(demo_dir, mlflow_uri, monkeypatch, caplog):
    monkeypatch.setenv("SWEEPLAB_FAULT_NAN_GRAD_AT_STEP", "7")
    with caplog.at_level("INFO", logger="sweeplab.engine.job"):
        train(smoke_config(demo_dir, "guard.mode=off", "trainer.max_steps=12", "trainer.val_check_interval=6"))
    _, run = _only_run(mlflow_uri)
    assert run.info.status == "FINISHED"  # off: not stopped, as asked
    assert "train/loss" in run.data.tags["diverged"] and "weight tensor(s) with NaN/inf" in run.data.tags["diverged"]
    (closing,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("done: ")]
    assert closing.split(": ", 2)[2].startswith("DIVERGED (non-finite "), closing


def test_between_checks_the_guard_costs_one_device_op_per_step():
    """On a small batch every launch is host time the step pays: between two checks the guard only keeps a copy of
    the step's loss and gradient norm (one op), whether a batch holds one step or k."""
    from types import SimpleNamespace

    from torch.utils._python_dispatch import TorchDispatchMode

    from sweeplab.callbacks.guard import NonFiniteGuard

    class CountOps(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            CountOps.ops += 1
            return func(*args, **(kwargs or {}))

    guard = NonFiniteGuard(mode="stop", check_every_n_steps=1000)
    trainer = SimpleNamespace(global_step=0)
    for step, loss, norm in ((0, torch.tensor(0.5), torch.tensor(2.0)), (1, torch.rand(4), torch.rand(4))):
        with CountOps():
            guard._check(trainer, loss, norm, step, None)
        assert CountOps.ops <= 2, CountOps.ops  # stack (and a view of its result)
        CountOps.ops = 0
    guard._unchecked[-1][1][1, 2] = float("nan")  # a kept copy: the check reads what the step produced
    assert guard._first_bad()[0] == 3  # the second record's steps are 1..4 (one step, then a batch of four)


def test_an_out_of_memory_job_is_recorded_failed_with_the_reason(demo_dir, mlflow_uri, monkeypatch):
    monkeypatch.setenv("SWEEPLAB_FAULT_OOM_AT_STEP", "3")
    with pytest.raises(torch.OutOfMemoryError):
        train(smoke_config(demo_dir))
    client, run = _only_run(mlflow_uri)
    assert run.info.status == "FAILED" and run.data.tags["error"].startswith("OutOfMemoryError: CUDA out of memory")
    assert "error.txt" in {a.path for a in client.list_artifacts(run.info.run_id)}


def test_a_checkpoint_save_that_dies_midway_leaves_no_file(tmp_path, monkeypatch):
    target = tmp_path / "last.ckpt"

    def dying_save(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(OSError, match="disk full"):
        AtomicCheckpointIO().save_checkpoint({"state_dict": {}}, target)
    assert list(tmp_path.iterdir()) == []


def test_an_existing_checkpoint_survives_a_failed_overwrite(tmp_path, monkeypatch):
    target = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.ones(2)}, "hyper_parameters": {"family": "x"}}, target)
    before = target.read_bytes()
    monkeypatch.setattr(torch, "save", lambda *a, **k: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError):
        AtomicCheckpointIO().save_checkpoint({"state_dict": {}}, target)
    assert target.read_bytes() == before


class _Payload:
    def __reduce__(self):
        return (print, ("code ran while loading a checkpoint",))


def test_checkpoints_load_with_weights_only(tmp_path):
    evil = tmp_path / "evil.ckpt"
    with open(evil, "wb") as f:
        torch.save({"state_dict": {}, "payload": _Payload(), "hyper_parameters": {"family": "textbridge"}}, f,
                   pickle_protocol=pickle.HIGHEST_PROTOCOL)
    with pytest.raises(UserError) as refused:
        read_checkpoint(evil)
    assert str(refused.value) == (f"checkpoint {evil}: refused: it holds Python code (builtins.print) that loading it "
                                  "would run; sweeplab loads only tensors and plain data from a checkpoint and never "
                                  "runs code from one")  # not PyTorch's advice to load it with weights_only=False
    foreign = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": {"w": torch.ones(1)}}, foreign)
    with pytest.raises(UserError, match="not written by sweeplab"):
        read_checkpoint(foreign)
    plain = tmp_path / "plain.pt"
    torch.save({"w": torch.ones(1)}, plain)
    with pytest.raises(UserError, match="not a Lightning checkpoint"):
        read_checkpoint(plain)

