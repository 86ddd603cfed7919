"""A job's numbers do not depend on its place in a sweep, training is the same with or without the shape warm-up, and
each throughput window is stored once in MLflow.

The first-shape cost stands in for cuDNN autotuning, a Metal graph or oneDNN primitives: a process-wide cache (one
`FirstShapeCost` shared by the jobs of a "process") that charges the first forward at each input shape. Time is the
timer's injectable clock, advanced only by the model's forward passes, so the numbers are exact, not flaky.
"""

from __future__ import annotations

import time

import lightning as L
import pytest
import torch
from mlflow.tracking import MlflowClient

from conftest import smoke_config
from sweeplab.callbacks.timing import ThroughputTimer
from sweeplab.engine.plan import plan
from sweeplab.engine.training import train

FIRST_SHAPE_SECONDS = 0.5  # ~40 steps of work: a new shape in a timed step shows
SECONDS_PER_TOKEN = 1e-4  # a 4 x 32 batch: 13 ms


class FirstShapeCost:
    """A fake clock and a forward pre-hook: each forward costs its tokens; the first one at a new shape costs more."""

    def __init__(self, first_shape_seconds: float = FIRST_SHAPE_SECONDS):
        self.first_shape_seconds = first_shape_seconds
        self.seen: set[tuple] = set()
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def hook(self, module, args) -> None:
        input_ids = args[0]
        self.now += SECONDS_PER_TOKEN * input_ids.numel()
        if tuple(input_ids.shape) not in self.seen:
            self.seen.add(tuple(input_ids.shape))
            self.now += self.first_shape_seconds


def _job(demo_dir, cost: FirstShapeCost, *overrides: str, max_steps: int = 40) -> tuple[dict, L.LightningModule]:
    """A TextBridge job as `lightning_fit.fit` assembles it (the config's data, task and timer), on the fake clock."""
    # batch 4: the demo's batches have 27 different longest samples an epoch (batch 16: 3)
    p = plan(smoke_config(demo_dir, "data.batch_size=4", f"trainer.max_steps={max_steps}", *overrides))
    dm = p.datamodule
    dm.prepare_data()
    dm.setup("fit")
    model_config = p.family.fitted_model_config(p.model_config, dm, p.model_values)
    L.seed_everything(0, verbose=False)
    task = p.family.make_task(model_config, p.loss_config, p.optim)
    task.model.register_forward_pre_hook(cost.hook)
    timer = ThroughputTimer(**p.timing, sync=lambda device: None, clock=cost.clock)
    trainer = L.Trainer(
        accelerator="cpu", max_steps=max_steps, limit_val_batches=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[timer],
    )
    trainer.fit(task, datamodule=dm)
    return timer.summary, task


@pytest.mark.slow  # ~30 s-2 min: two jobs timed in one process (fast sibling: the shape warm-up tests)
def test_the_first_job_in_a_process_is_as_fast_as_a_job_that_pays_no_first_shape_cost(demo_dir):
    cold, _ = _job(demo_dir, FirstShapeCost())  # the first job of a sweep: every shape is new to the process
    free, _ = _job(demo_dir, FirstShapeCost(first_shape_seconds=0.0))
    process = FirstShapeCost()
    _job(demo_dir, process)
    later, _ = _job(demo_dir, process, "loss.beta=0.5")  # a later job of the same process: every shape seen before
    for key in ("summary/samples_per_sec", "summary/samples_per_sec_overall", "summary/step_time_s_median"):
        assert cold[key] == pytest.approx(free[key], rel=0.01), key
        assert later[key] == pytest.approx(free[key], rel=0.01), key
    assert cold["summary/new_shapes_in_timed_steps"] == 0
    assert 1 < cold["summary/batch_shapes"] <= 64 // 8  # buckets: a few multiples of data.pad_multiple


@pytest.mark.slow  # ~15-50 s: the control of the test above
def test_per_batch_widths_would_make_the_first_job_pay_in_its_timed_steps(demo_dir):
    """The same check with data.pad_to=batch (the old default): too many widths to warm up, so the first job meets
    new ones inside its timed steps and the run says so."""
    cold, _ = _job(demo_dir, FirstShapeCost(), "data.pad_to=batch")
    free, _ = _job(demo_dir, FirstShapeCost(first_shape_seconds=0.0), "data.pad_to=batch")
    assert cold["summary/new_shapes_in_timed_steps"] >= 10
    assert cold["summary/batch_shapes"] > 64 // 8
    assert cold["summary/samples_per_sec_overall"] < 0.5 * free["summary/samples_per_sec_overall"]


def test_the_shape_warmup_changes_no_weight(demo_dir):
    """Forward and backward of every bucket before the first step, no optimizer step, RNG restored: bit-identical
    weights after training (CPU)."""
    _, warmed = _job(demo_dir, FirstShapeCost(), "timing.warmup_per_shape=2", max_steps=12)
    _, plain = _job(demo_dir, FirstShapeCost(), "timing.warmup_per_shape=0", max_steps=12)
    for (name, a), (_, b) in zip(warmed.model.named_parameters(), plain.model.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    assert all(p.grad is None or not p.grad.isnan().any() for p in warmed.model.parameters())


def test_each_window_metric_is_stored_once_at_its_step(demo_dir, mlflow_uri):
    """Windows of 5 steps after 2 warm-up steps end at steps 6, 11, 16; Lightning logs every 5 steps (4, 9, 14, 19):
    a window value logged through Lightning was written again at the next logging step."""
    train(smoke_config(demo_dir))
    client = MlflowClient(mlflow_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("sweeplab").experiment_id])
    for key in ("train/step_time_s", "train/samples_per_sec", "train/tokens_per_sec"):
        steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
        assert sorted(steps) == [6, 11, 16], key
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "train/loss")) == [4, 9, 14, 19]
    metrics = run.data.metrics
    for key in ("summary/step_time_spread", "summary/batch_shapes", "summary/new_shapes_in_timed_steps",
                "summary/load_avg_start", "summary/load_avg_end", "summary/cpu_threads", "summary/host_cpus",
                "summary/host_speed_spread"):
        assert key in metrics, key
    assert 0 <= metrics["summary/host_speed_spread"] < 10
    assert metrics["summary/cpu_threads"] == torch.get_num_threads()
    assert metrics["summary/samples_per_sec"] == pytest.approx(16 / metrics["summary/step_time_s_median"])
    assert run.data.params["data.pad_to"] == "bucket"


def test_a_compiled_job_compiles_as_a_process_first_job_whatever_ran_before(demo_dir, tmp_path, monkeypatch):
    """torch.compile remembers the sizes a function met; the second time a size changes it compiles dynamic-shape
    kernels. The same compiled job twice in one process: the second makes the same static/dynamic decisions as the
    first (a job meets more than one shape of its own: its validation batches), none inherited from the job before
    it (on an H100 the bench's paGating loop, compiled after the TextBridge rows, ran 12 % slower for it)."""
    import logging

    from sweeplab.runtime import backends

    if not backends._has_cxx_compiler():
        pytest.skip("torch.compile on the CPU needs a C++ compiler")
    messages: list[str] = []
    per_job: list[list[str]] = []
    compiled = False

    class Collect(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    handler = Collect(level=logging.INFO)
    loggers = [logging.getLogger(name) for name in ("torch._dynamo.pgo", "torch.fx.experimental.symbolic_shapes")]
    torch._logging.set_logs(dynamic=logging.INFO)  # both say what dynamo decides about shapes, at each compile
    for logger in loggers:
        logger.addHandler(handler)
    try:
        for job in ("first", "second"):
            job_dir = tmp_path / job
            job_dir.mkdir()
            monkeypatch.chdir(job_dir)
            train(smoke_config(demo_dir, "compile=default", "data.batch_size=8", "data.pad_to=max",
                               "trainer.max_steps=4", "trainer.val_check_interval=4", "timing.warmup_steps=2",
                               "timing.window=2", "logger=none"))
            per_job.append([m for m in messages if "as dynamic" in m])
            compiled = compiled or any("create_env" in m for m in messages)
            messages.clear()
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
        torch._logging.set_logs()
    assert compiled, "no compile was logged: the test would pass whatever ran"
    assert per_job[1] == per_job[0]


def test_a_job_starts_without_the_garbage_an_earlier_job_left(demo_dir, tmp_path, monkeypatch):
    """A Lightning trainer leaves reference cycles; left alone they are collected whenever the collector next runs,
    which can be inside the next job's timed steps. With automatic collection off, only the job's own start can have
    collected the cycle an "earlier job" left here; what survives is frozen, out of the job's own collections."""
    import gc
    import weakref

    class Node:
        pass

    left = Node()
    left.self = left  # a cycle: reference counting alone never frees it
    collected = weakref.ref(left)
    del left
    monkeypatch.chdir(tmp_path)
    gc.disable()
    try:
        assert collected() is not None
        train(smoke_config(demo_dir, "trainer.max_steps=2", "trainer.val_check_interval=2", "timing.warmup_steps=1",
                           "timing.window=1", "logger=none"))
        frozen = gc.get_freeze_count()
    finally:
        gc.enable()
    assert collected() is None
    assert frozen > 100_000  # torch's, Lightning's and MLflow's objects: the job's own collections pass them over


def test_the_host_probe_at_the_end_of_training_is_teardown_not_training_steps(demo_dir, mlflow_uri):
    """The probe of the host's steadiness is sweeplab's own measurement: a 2 s probe at the end of training lands in
    the wall breakdown's teardown; before, it ran inside Lightning's on_train_end while the part was still `steps`
    (on the H100, 0.25 s a job: ~5 s of a 20-job TextBridge study's "training steps")."""
    probe = 2.0
    train(smoke_config(demo_dir, f"timing.host_probe_s={probe}"))
    client = MlflowClient(mlflow_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("sweeplab").experiment_id])
    metrics = run.data.metrics
    # teardown is a fraction of a second without the probe (0.27 s a job in `make sweep` at the lowest priority beside
    # CI): the probe's 2 s are in it, so not in `steps` (whose own time grows with the machine's load: 8-16 s for
    # these 20 smoke steps at load 10, so no bound on it holds on a busy machine)
    assert metrics["summary/wall_breakdown/teardown_s"] >= probe
    assert 0 <= metrics["summary/host_speed_spread"] < 10


def test_a_start_probe_reuses_the_probe_a_job_of_this_process_just_ended_with(monkeypatch):
    from sweeplab.callbacks import timing

    seconds = 0.5
    ended = timing.probe_host(seconds)  # a job's end probe
    t0 = time.perf_counter()
    assert timing.probe_host(seconds, reuse=True) == ended  # the next job's start: the same host, moments later
    assert time.perf_counter() - t0 < seconds  # not run: a probe runs for its `seconds`, by construction
    t0 = time.perf_counter()
    timing.probe_host(seconds)  # an end probe always runs
    assert time.perf_counter() - t0 >= seconds
    monkeypatch.setattr(timing, "HOST_PROBE_REUSE_S", 0.0)  # too long ago: the start probe runs too
    t0 = time.perf_counter()
    timing.probe_host(seconds, reuse=True)
    assert time.perf_counter() - t0 >= seconds
