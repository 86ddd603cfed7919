"""On a CUDA device: the speed switches capture, compile and keep the loss curve of the plain eager run.

Run on a GPU machine with `pytest -m gpu tests/test_gpu.py` (the default suite deselects them; CI has no GPU).
"""

from __future__ import annotations

import pytest
import torch

from test_speed_equivalence import STEPS, _assert_same_curve, _curve

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CUDA = ("backend=cuda", "backend.cudnn_benchmark=false", "trainer.deterministic=false")


@pytest.fixture(scope="module")
def eager_cuda_curve(demo_dir, tmp_path_factory):
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.chdir(tmp_path_factory.mktemp("eager_cuda"))
    try:
        return _curve(demo_dir, monkeypatch, *CUDA, "data.pad_to=max")
    finally:
        monkeypatch.undo()


@pytest.fixture
def kept_step_graphs(monkeypatch) -> list:
    """The step graph of each fit, kept as the fit ends (on_fit_end drops it)."""
    from sweeplab.tasks import base

    graphs = []
    original = base.SweepTask.on_fit_end

    def keep_graph(self):
        graphs.append(self.step_graph)
        original(self)

    monkeypatch.setattr(base.SweepTask, "on_fit_end", keep_graph)
    return graphs


def test_cuda_graph_captures_and_keeps_the_loss_curve(eager_cuda_curve, kept_step_graphs, demo_dir, tmp_path, monkeypatch):
    graphs = kept_step_graphs
    monkeypatch.chdir(tmp_path)
    curve = _curve(demo_dir, monkeypatch, *CUDA, "data.pad_to=max", "cuda_graph=true")
    (graph,) = graphs
    assert graph.graph is not None and graph.replays == STEPS - graph.eager_steps
    assert graph.eager_steps == graph.warmup_steps  # fixed shapes: only the warm-up ran eagerly
    _assert_same_curve(curve, eager_cuda_curve, rtol=1e-4, atol=1e-5)


def test_graph_of_several_steps_captures_and_keeps_the_loss_curve(eager_cuda_curve, kept_step_graphs, demo_dir, tmp_path, monkeypatch):
    """cuda_graph with steps_per_batch=4: 4 whole optimizer steps (update and learning rate inside) per replay, captured for real;
    the per-step losses stay on the eager curve across the epochs' ends (33 batches an epoch)."""
    graphs = kept_step_graphs
    monkeypatch.chdir(tmp_path)
    curve = _curve(
        demo_dir, monkeypatch, *CUDA, "data.pad_to=max", "data.on_device=true", "cuda_graph=true", "steps_per_batch=4",
        "trainer.log_every_n_steps=8", "timing.warmup_steps=8", "timing.window=8", "checkpoint.every_n_steps=100",
    )
    (graph,) = graphs
    assert graph.graph is not None and graph.eager_calls == graph.warmup_calls == 1
    assert graph.replays == STEPS // 4 - 1
    assert len(curve.losses) == STEPS
    torch.testing.assert_close(torch.tensor(curve.losses), torch.tensor(eager_cuda_curve.losses), rtol=1e-4, atol=1e-5)


def test_several_steps_per_batch_without_a_graph_keep_the_loss_curve(eager_cuda_curve, kept_step_graphs, demo_dir, tmp_path, monkeypatch):
    """steps_per_batch=4 without cuda_graph: the same 4 steps per batch run eagerly on the GPU (no capture)."""
    graphs = kept_step_graphs
    monkeypatch.chdir(tmp_path)
    curve = _curve(
        demo_dir, monkeypatch, *CUDA, "data.pad_to=max", "data.on_device=true", "steps_per_batch=4",
        "trainer.log_every_n_steps=8", "timing.warmup_steps=8", "timing.window=8", "checkpoint.every_n_steps=100",
    )
    (graph,) = graphs
    assert graph.graph is None and graph.replays == 0 and graph.eager_calls == STEPS // 4
    assert len(curve.losses) == STEPS
    torch.testing.assert_close(torch.tensor(curve.losses), torch.tensor(eager_cuda_curve.losses), rtol=1e-4, atol=1e-5)


def test_compiled_cuda_graph_step_keeps_the_loss_curve(eager_cuda_curve, demo_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    curve = _curve(demo_dir, monkeypatch, *CUDA, "data.pad_to=max", "cuda_graph=true", "compile=default")
    _assert_same_curve(curve, eager_cuda_curve, rtol=1e-3, atol=1e-4)


def test_device_resident_batches_keep_the_loss_curve(eager_cuda_curve, demo_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    curve = _curve(demo_dir, monkeypatch, *CUDA, "data.pad_to=max", "data.on_device=true")
    _assert_same_curve(curve, eager_cuda_curve, rtol=1e-4, atol=1e-5)


def test_bf16_compiled_lm_stays_within_bf16_tolerance(tmp_path, monkeypatch):
    from conftest import compose_train
    from sweeplab.engine.training import train
    from sweeplab.families.pagating_lm.task import LMTask
    from test_speed_equivalence import LossRecorder

    curves = {}
    for compile_mode in ("off", "default"):
        recorder = LossRecorder()
        monkeypatch.setattr(LMTask, "extra_callbacks", lambda self, r=recorder: [r])
        monkeypatch.chdir(tmp_path)
        cfg = compose_train([
            "model=pagating_lm", "debug=smoke", *CUDA, "trainer.precision=bf16-mixed", f"compile={compile_mode}",
            "trainer.max_steps=100", "trainer.val_check_interval=100", "logger=none", f"data.cache_dir={tmp_path / 'lm'}",
            "trainer.enable_progress_bar=false",
        ])
        train(cfg)
        curves[compile_mode] = torch.tensor(recorder.losses)
    assert len(curves["default"]) == 100
    torch.testing.assert_close(curves["default"], curves["off"], rtol=2e-2, atol=2e-2)


def test_the_device_timeline_times_queued_work_without_waiting_for_it():
    """A mark is an event in the queue: taking one returns at once with work still queued, and the time between two
    marks is the device's time for the work between them (a stopwatch with syncs around the same work agrees)."""
    import time

    from sweeplab.runtime import devices

    timeline = devices.timeline(torch.device("cuda"))
    assert isinstance(timeline, devices.DeviceTimeline)
    cycles = 200_000_000  # ~0.1 s of device time at H100 clocks
    torch.cuda._sleep(cycles)  # untimed: the first work of a process ran ~14 % slower (clocks coming up from idle)
    torch.cuda.synchronize()
    start = timeline.mark()
    torch.cuda._sleep(cycles)
    host = time.perf_counter()
    end = timeline.mark()
    assert time.perf_counter() - host < 0.01 and not end.query()  # no wait: the sleep is still running
    measured = timeline.seconds(start, end)
    torch.cuda.synchronize()
    host = time.perf_counter()
    torch.cuda._sleep(cycles)
    torch.cuda.synchronize()
    assert measured == pytest.approx(time.perf_counter() - host, rel=0.1)
