"""`steps_per_batch=k`: one training batch runs k whole optimizer steps (issue 12, framework overhead at small
batches), eagerly or compiled on every backend and as one CUDA-graph replay under cuda_graph. On the CPU these tests
run the k-step code as jobs do there (eagerly) and hold it to k single steps of the plain Lightning path: the same
weights, the same loss curve, and every count (global_step, logging steps, validation, checkpoints, the timer's
windows, the non-finite guard's step) in real optimizer steps. tests/test_gpu.py captures the graph."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from mlflow.tracking import MlflowClient

from conftest import smoke_config
from sweeplab.core.errors import ConfigError
from sweeplab.engine.plan import plan
from sweeplab.engine.training import train
from sweeplab.tasks.optim import OptimConfig, lr_at


def test_k_steps_in_one_call_equal_k_single_steps():
    """MultiStepGraph (eager) against StepGraph + optimizer step + scheduler step, 2 x 4 steps: the same weights,
    losses and gradient norms, with clipping active and a learning rate that changes every step."""
    from sweeplab.tasks.optim import build_optimizer, build_scheduler
    from sweeplab.tasks.step_graph import MultiStepGraph, StepGraph, scheduled_lrs

    k, rows = 4, 8
    cfg = OptimConfig(lr=1e-2, warmup_steps=3, min_lr=1e-4, grad_clip=0.05, implementation="for_loop")
    torch.manual_seed(0)
    batches = [{"x": torch.randn(rows, 6), "y": torch.randn(rows, 3)} for _ in range(2 * k)]

    def setup():
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 3))
        optimizer = build_optimizer(model, cfg)
        scheduler = build_scheduler(optimizer, cfg, total_steps=2 * k)

        def loss_fn(b):
            loss = torch.nn.functional.mse_loss(model(b["x"]), b["y"])
            return loss, {"double": 2 * loss}

        return model, optimizer, scheduler, loss_fn

    model, optimizer, scheduler, loss_fn = setup()
    single = StepGraph(loss_fn, list(model.parameters()), cfg.grad_clip, None, torch.device("cpu"))
    single_losses, single_norms, single_lrs = [], [], []
    for batch in batches:
        loss, _, norm = single(batch)
        single_lrs.append([g["lr"] for g in optimizer.param_groups])
        optimizer.step()
        scheduler.step()
        single_losses.append(loss)
        single_norms.append(norm)
    reference = [p.detach().clone() for p in model.parameters()]

    model, optimizer, scheduler, loss_fn = setup()
    multi = MultiStepGraph(loss_fn, optimizer, k, cfg.grad_clip, None, torch.device("cpu"))
    losses, norms, lrs = [], [], []
    for start in (0, k):
        group = {key: torch.cat([b[key] for b in batches[start : start + k]]) for key in batches[0]}
        step_lrs = scheduled_lrs(optimizer, scheduler, k)
        loss, metrics, norm = multi(group, step_lrs)
        for _ in range(k):
            scheduler.step()
        torch.testing.assert_close(metrics["double"], 2 * loss)
        losses += list(loss)
        norms += list(norm)
        lrs += step_lrs
    assert multi.graph is None and multi.eager_calls == 2
    assert lrs == single_lrs and len(set(map(tuple, lrs))) > 4  # the schedule moved within each call
    assert max(float(n) for n in norms) > cfg.grad_clip  # clipping did something
    torch.testing.assert_close(torch.stack(losses), torch.stack(single_losses), rtol=0, atol=0)
    torch.testing.assert_close(torch.stack(norms), torch.stack(single_norms), rtol=0, atol=0)
    for ours, theirs in zip(model.parameters(), reference):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    assert scheduler.last_epoch == 2 * k


class StepRecorder(L.Callback):
    """Every optimizer step's loss (a batch of k steps leaves k of them) and the global step after each batch."""

    def __init__(self):
        self.losses: list[float] = []
        self.global_steps: list[int] = []
        self.val_steps: list[int] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses += [float(x) for x in pl_module.last_loss.reshape(-1)]
        self.global_steps.append(trainer.global_step)

    def on_validation_end(self, trainer, pl_module):
        self.val_steps.append(trainer.global_step)


STEPS = ("data.on_device=true", "data.pad_to=max")
# batch 8 of 270 training samples: 33 batches an epoch, so a batch of 4 steps spans an epoch's end
COUNTS = ("trainer.max_steps=40", "trainer.val_check_interval=12", "trainer.log_every_n_steps=8",
          "checkpoint.every_n_steps=16", "timing.warmup_steps=8", "timing.window=8", "data.batch_size=8",
          "optim.lr=3e-3", "optim.grad_clip=0.5", "optim.warmup_steps=10")


def _run(demo_dir, monkeypatch, *overrides):
    from sweeplab.families.textbridge.task import TextBridgeTask

    recorder = StepRecorder()
    monkeypatch.setattr(TextBridgeTask, "extra_callbacks", lambda self: [recorder])
    train(smoke_config(demo_dir, *STEPS, *COUNTS, *overrides))
    return recorder


def _history(uri: str, steps_per_batch: str) -> dict[str, list[int]]:
    client = MlflowClient(uri)
    (run,) = [r for r in client.search_runs([e.experiment_id for e in client.search_experiments()])
              if r.data.params.get("steps_per_batch") == steps_per_batch]
    steps = {}
    for key in ("train/loss", "lr", "val/cos", "train/step_time_s"):
        steps[key] = sorted(m.step for m in client.get_metric_history(run.info.run_id, key))
    steps["summary/timed_steps"] = run.data.metrics["summary/timed_steps"]
    for key in ("train/loss", "lr"):
        history = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
        steps[key.split("/")[-1] + "_values"] = [m.value for m in history]
    return steps


def test_steps_per_batch_keep_the_loss_curve_and_count_real_steps(demo_dir, mlflow_uri, monkeypatch, tmp_path):
    """k=4 against k=1 (Lightning's automatic optimization) through train(): the same per-step losses across an
    epoch boundary, and the same steps for validation, logged metrics, the timer's windows and checkpoints; each
    logging step logs its own loss and the learning rate it trained at."""
    for name in ("one", "four"):
        (tmp_path / name).mkdir()
    monkeypatch.chdir(tmp_path / "one")
    single = _run(demo_dir, monkeypatch, "steps_per_batch=1")
    monkeypatch.chdir(tmp_path / "four")
    grouped = _run(demo_dir, monkeypatch, "steps_per_batch=4")
    assert len(single.losses) == len(grouped.losses) == 40
    assert single.losses[0] > single.losses[-1]
    torch.testing.assert_close(torch.tensor(grouped.losses), torch.tensor(single.losses), rtol=1e-5, atol=1e-6)
    assert grouped.global_steps == list(range(4, 41, 4)) and single.global_steps == list(range(1, 41))
    assert grouped.val_steps == single.val_steps == [12, 24, 36, 40]
    one, four = _history(mlflow_uri, "1"), _history(mlflow_uri, "4")
    assert four["train/loss"] == one["train/loss"] == [7, 15, 23, 31, 39]
    assert four["val/cos"] == one["val/cos"]
    assert four["train/step_time_s"] == one["train/step_time_s"] == [15, 23, 31, 39]
    assert four["summary/timed_steps"] == one["summary/timed_steps"] == 32
    # the values logged at a step are that step's: its loss and the learning rate it trained at
    logged_loss = torch.tensor([single.losses[s] for s in one["train/loss"]])
    expected_lr = torch.tensor([lr_at(s, OptimConfig(lr=3e-3, warmup_steps=10), 40) for s in one["lr"]])
    for history in (one, four):
        torch.testing.assert_close(torch.tensor(history["loss_values"]), logged_loss, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(torch.tensor(history["lr_values"]), expected_lr, rtol=1e-6, atol=0)
    checkpoint = torch.load(next((tmp_path / "four").rglob("last.ckpt")), map_location="cpu", weights_only=True)
    assert checkpoint["global_step"] == 40
    assert checkpoint["lr_schedulers"][0]["last_epoch"] == 40


def test_steps_per_batch_name_the_first_non_finite_step_inside_a_batch(demo_dir, monkeypatch, tmp_path):
    """A loss that turns NaN at step 13 (the 2nd of the 4 steps 12-15): the guard, checking every 8 steps, names
    step 13, as with one step per batch."""
    from sweeplab.callbacks.guard import NonFiniteError
    from sweeplab.families.textbridge.task import TextBridgeTask

    original = TextBridgeTask.training_loss
    calls = {"armed": False, "n": 0}

    class Arm(L.Callback):
        def on_train_start(self, trainer, pl_module):  # after the shape warm-up's forward passes
            calls["armed"], calls["n"], calls["steps"] = True, 0, []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            calls["steps"].append(trainer.global_step)

    def poisoned(self, batch):
        loss, metrics = original(self, batch)
        if calls["armed"]:
            calls["n"] += 1
            if calls["n"] == 14:  # the 14th training step: step 13
                loss = loss * float("nan")
        return loss, metrics

    monkeypatch.setattr(TextBridgeTask, "training_loss", poisoned)
    monkeypatch.setattr(TextBridgeTask, "extra_callbacks", lambda self: [Arm()])
    monkeypatch.chdir(tmp_path)
    for k in (1, 4):
        with pytest.raises(NonFiniteError, match=r"at step 13 "):
            train(smoke_config(demo_dir, *STEPS, *COUNTS, f"steps_per_batch={k}", "logger=none"))
        assert calls["steps"] == list(range(k, 16, k))  # stopped in the batch whose last step ends the interval


@pytest.mark.slow  # ~30 s here: a kill and a resume (fast sibling: the raw loop's same k steps)
def test_a_run_of_several_steps_per_batch_resumes_to_the_same_steps(demo_dir, monkeypatch, tmp_path):
    """Stopped by a failure at step 20 (last.ckpt of step 16), resumed from that checkpoint: steps 16-39, an epoch's
    end among them, train on the same batches with the same losses as the uninterrupted run (the sampler's state is
    saved between batches of 4 steps, and the groups are drawn across epochs as single steps are)."""
    whole_dir, first_dir, resumed_dir = (tmp_path / n for n in ("whole", "first", "resumed"))
    for d in (whole_dir, first_dir, resumed_dir):
        d.mkdir()
    common = ("steps_per_batch=4", "logger=none", "checkpoint.every_n_steps=8")
    monkeypatch.chdir(whole_dir)
    whole = _run(demo_dir, monkeypatch, *common)
    monkeypatch.chdir(first_dir)
    monkeypatch.setenv("SWEEPLAB_FAULT_RAISE_AT_STEP", "20")
    with pytest.raises(RuntimeError, match="injected failure at step 20"):
        _run(demo_dir, monkeypatch, *common)
    monkeypatch.delenv("SWEEPLAB_FAULT_RAISE_AT_STEP")
    checkpoint = first_dir / "outputs" / "checkpoints" / "last.ckpt"
    assert torch.load(checkpoint, map_location="cpu", weights_only=True)["global_step"] == 16
    monkeypatch.chdir(resumed_dir)
    resumed = _run(demo_dir, monkeypatch, *common, f"resume={checkpoint}")
    assert resumed.global_steps == list(range(20, 41, 4))
    torch.testing.assert_close(torch.tensor(resumed.losses), torch.tensor(whole.losses[16:]), rtol=0, atol=0)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["data.on_device=false"], "steps_per_batch: .*data.on_device=true"),
        (["data.pad_to=bucket"], "steps_per_batch: .*data.pad_to=max"),
        (["trainer.max_steps=42"], "trainer.max_steps: 42 is not a multiple of steps_per_batch=4"),
        (["trainer.val_check_interval=10"], "trainer.val_check_interval: 10 is not a multiple"),
        (["trainer.log_every_n_steps=10"], "trainer.log_every_n_steps: 10 is not a multiple"),
        (["trainer.log_every_n_steps=8", "guard.check_every_n_steps=6"], "guard.check_every_n_steps: 6 is not a multiple"),
        (["checkpoint.every_n_steps=18"], "checkpoint.every_n_steps: 18 is not a multiple"),
        (["timing.window=10"], "timing.window: 10 is not a multiple"),
        (["timing.warmup_steps=6"], "timing.warmup_steps: 6 is not a multiple"),
        (["guard.mode=skip"], "guard.mode: skip cannot drop one step"),
        (["tune.batch_size=power"], "tune.batch_size: .*one batch at a time"),
        (["steps_per_batch=0"], "steps_per_batch: expected an integer >= 1"),
        (["trainer.devices=2"], "steps_per_batch: a batch of 4 optimizer steps has no DDP gradient all-reduce"),
        (["trainer.accumulate_grad_batches=2"], "steps_per_batch: .*one batch per optimizer step"),
    ],
)
def test_steps_per_batch_are_refused_at_plan_time_where_steps_would_not_count(overrides, message, demo_dir):
    cfg = smoke_config(demo_dir, *STEPS, *COUNTS, "steps_per_batch=4", *overrides)
    with pytest.raises(ConfigError, match=message):
        plan(cfg)


def test_a_graph_of_several_steps_keeps_its_eager_and_capture_batches_out_of_the_timed_steps(demo_dir, graph_path_on_cpu):
    """Under cuda_graph the first batch runs eagerly and the second captures: the timer's warm-up must cover both."""
    with pytest.raises(ConfigError, match="timing.warmup_steps: 4 < 8"):
        plan(smoke_config(demo_dir, *STEPS, *COUNTS, "cuda_graph=true", "steps_per_batch=4", "timing.warmup_steps=4"))
    assert plan(smoke_config(demo_dir, *STEPS, *COUNTS, "steps_per_batch=4", "timing.warmup_steps=4")).steps_per_batch == 4


def test_steps_per_batch_allow_intervals_longer_than_the_run(demo_dir):
    """An interval past max_steps never fires (the bench's 'no periodic checkpoint' is max_steps + 1)."""
    p = plan(smoke_config(demo_dir, *STEPS, *COUNTS, "steps_per_batch=4", "checkpoint.every_n_steps=41",
                          "trainer.val_check_interval=41"))
    assert p.steps_per_batch == 4 and p.datamodule.steps_per_batch == 4


def test_steps_per_batch_are_refused_for_a_family_without_device_batches(tmp_path):
    from conftest import compose_train

    cfg = compose_train(["model=pagating_lm", "debug=smoke", "steps_per_batch=4", f"data.cache_dir={tmp_path}", *COUNTS])
    with pytest.raises(ConfigError, match="steps_per_batch: .*data.on_device=true.*'pagating_lm'"):
        plan(cfg)


def test_a_graph_of_several_steps_needs_a_cuda_backend(demo_dir):
    with pytest.raises(ConfigError, match="cuda_graph.*backend=cuda"):
        plan(smoke_config(demo_dir, *STEPS, *COUNTS, "cuda_graph=true", "steps_per_batch=4"))


def test_the_bench_raw_loop_runs_the_same_k_steps(demo_dir, mlflow_uri):
    """The hand-written loop the bench compares with runs the same k-step function: after 8 steps (2 batches of 4)
    its weights are the sweeplab job's, on every run (each starts from the initial state)."""
    from pathlib import Path

    from sweeplab import bench

    cfg = smoke_config(demo_dir, *STEPS, "steps_per_batch=4", "trainer.max_steps=8", "trainer.val_check_interval=8",
                       "trainer.log_every_n_steps=4", "checkpoint.every_n_steps=8", "timing.warmup_steps=8",
                       "timing.window=4", "optim.grad_clip=0.05")
    train(cfg)
    (ckpt,) = (Path.cwd() / "outputs" / "checkpoints").glob("best-step*.ckpt")
    trained = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    raw = bench.RawLoop(cfg)
    for _ in range(2):
        result = raw.run(warmup_steps=0, steps=8)
        assert raw.step_count == 8 and raw.scheduler.last_epoch == 8 and raw.multi_step_graph.eager_calls == 2
        assert result["samples"] == 8 * 16
        for name, value in raw.model.state_dict().items():
            torch.testing.assert_close(value, trained[f"model.{name}"], rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.slow  # the default suite's time budget; the bench presets' other plan checks are slow too
def test_the_speed_preset_rows_with_several_steps_per_batch_plan(tmp_path, graph_path_on_cpu):
    """bench_h100_speed's TextBridge rows (4 steps per batch, 3 of them as a graph) pass plan()'s checks under the
    bench's own step counts, and so do they with 8 steps per batch as the preset's comment gives them."""
    from sweeplab import bench

    for extra, k in (([], 4), (["steps_per_batch=8", "bench.warmup_steps=16", "timing.window=16",
                                "trainer.log_every_n_steps=96"], 8)):
        settings, experiment, rest = bench.load_settings(["experiment=bench_h100_speed", *extra])
        rows = [row for row in settings.rows if "steps_per_batch=4" in row.overrides]
        assert len(rows) == 6 and sum("cuda_graph=true" in row.overrides for row in rows) == 3
        for row in rows:
            cfg = bench.row_config(row, settings, experiment, [f"paths.data_dir={tmp_path}", "backend=cpu", "compile=off",
                                                               "optim.implementation=auto", *rest], None)
            assert plan(cfg).steps_per_batch == k, row.name
