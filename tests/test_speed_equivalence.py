"""Each speed switch changes how fast a run goes, not what it computes: over 200 steps the training loss curve stays
within fp32 tolerance of the plain eager run (issue 8). The CUDA-graph switch is tested here through its code path
with capture off (a CPU has no CUDA graphs: manual optimization, clipping inside the step, Lightning's optimizer
step and the LR schedule); tests/test_gpu.py captures for real on a GPU."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from conftest import smoke_config
from sweeplab.core.errors import ConfigError
from sweeplab.engine.plan import plan
from sweeplab.engine.training import train
from sweeplab.runtime import backends

STEPS = 200


class LossRecorder(L.Callback):
    def __init__(self):
        self.losses: list[float] = []
        self.lrs: list[float] = []
        self.graph_steps = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses += [float(x) for x in pl_module.last_loss.reshape(-1)]  # steps_per_batch: k steps' losses
        self.lrs.append(float(trainer.optimizers[0].param_groups[0]["lr"]))
        self.graph_steps += pl_module.step_graph is not None and not pl_module.automatic_optimization


def _curve(demo_dir, monkeypatch, *overrides: str) -> LossRecorder:
    from sweeplab.families.textbridge.task import TextBridgeTask

    recorder = LossRecorder()
    monkeypatch.setattr(TextBridgeTask, "extra_callbacks", lambda self: [recorder])
    cfg = smoke_config(
        demo_dir, f"trainer.max_steps={STEPS}", f"trainer.val_check_interval={STEPS}", "logger=none",
        "optim.lr=3e-3", "optim.grad_clip=0.5", "data.batch_size=8", *overrides,
    )
    train(cfg)
    return recorder


@pytest.fixture(scope="module")
def eager_curve(demo_dir, tmp_path_factory):
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.chdir(tmp_path_factory.mktemp("eager"))
    try:
        return _curve(demo_dir, monkeypatch)
    finally:
        monkeypatch.undo()


def _assert_same_curve(curve: LossRecorder, eager: LossRecorder, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    assert len(curve.losses) == len(eager.losses) == STEPS
    assert eager.losses[-1] < 0.8 * eager.losses[0]  # the reference run learns something
    torch.testing.assert_close(torch.tensor(curve.losses), torch.tensor(eager.losses), rtol=rtol, atol=atol)
    torch.testing.assert_close(torch.tensor(curve.lrs), torch.tensor(eager.lrs))


@pytest.mark.slow  # ~1-4 min with its set-up: a CUDA-graph step path run on the CPU against the plain one
def test_cuda_graph_step_path_keeps_the_loss_curve(eager_curve, demo_dir, tmp_path, monkeypatch, graph_path_on_cpu):
    monkeypatch.chdir(tmp_path)
    curve = _curve(demo_dir, monkeypatch, "cuda_graph=true")
    assert curve.graph_steps == STEPS and eager_curve.graph_steps == 0
    _assert_same_curve(curve, eager_curve)


@pytest.mark.slow  # ~30 s-2.5 min: two 40-step runs on the CPU
def test_fused_optimizer_keeps_the_loss_curve(eager_curve, demo_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _assert_same_curve(_curve(demo_dir, monkeypatch, "optim.implementation=fused"), eager_curve)


@pytest.mark.slow  # Inductor compiles C++ on the CPU: ~1 min on 2 cores
def test_compiled_loss_keeps_the_loss_curve(eager_curve, demo_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _assert_same_curve(_curve(demo_dir, monkeypatch, "compile=default"), eager_curve, rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # Inductor compiles C++ on the CPU: ~1 min on 2 cores
def test_compiled_regions_keep_the_loss_curve(eager_curve, demo_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    curve = _curve(demo_dir, monkeypatch, "compile=default", "compile_scope=regions")
    _assert_same_curve(curve, eager_curve, rtol=1e-4, atol=1e-5)


def test_the_guard_and_the_clipping_share_one_gradient_norm_per_step(demo_dir, tmp_path, monkeypatch):
    """The non-finite guard's norm is the clipping's: one pass over the gradients per step, and the curve of
    Lightning's own clip_grad_norm_ (guard off), up to the order the per-tensor norms are summed in (the model's
    parameter order vs the optimizer's groups: a last-bit difference)."""
    monkeypatch.chdir(tmp_path)
    real = torch.nn.utils.clip_grad._get_total_norm
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.utils.clip_grad, "_get_total_norm", counted)  # what clip_grad_norm_ calls
    monkeypatch.setattr(torch.nn.utils, "get_total_norm", counted)
    shared = _curve(demo_dir, monkeypatch, "trainer.max_steps=20", "guard.mode=stop")
    assert len(calls) == 20
    calls.clear()
    lightning_clipping = _curve(demo_dir, monkeypatch, "trainer.max_steps=20", "guard.mode=off")
    assert len(calls) == 20
    torch.testing.assert_close(torch.tensor(shared.losses), torch.tensor(lightning_clipping.losses), rtol=1e-6, atol=0)


def test_cuda_graph_is_refused_where_it_cannot_work(demo_dir):
    with pytest.raises(ConfigError, match="cuda_graph.*backend=cuda"):
        plan(smoke_config(demo_dir, "cuda_graph=true"))
    with pytest.raises(ConfigError, match="cuda_graph: expected true or false"):
        plan(smoke_config(demo_dir, "cuda_graph=sometimes"))
    for kwargs, message in (
        ({"precision": "16-mixed"}, "16-mixed"),
        ({"compile_mode": "reduce-overhead"}, "cannot nest"),
        ({"devices": 2}, "all-reduce"),
        ({"accumulate_grad_batches": 4}, "accumulate_grad_batches=1"),
    ):
        args = {"precision": "32-true", "compile_mode": "off", **kwargs}
        precision, compile_mode = args.pop("precision"), args.pop("compile_mode")
        with pytest.raises(ConfigError, match=message):
            backends.check_combination("cuda", precision, compile_mode, cuda_graph=True, **args)
    assert backends.check_combination("cuda", "32-true", "default", cuda_graph=True) == []


def test_step_graph_runs_eagerly_without_cuda_and_leaves_gradients_for_the_optimizer():
    from sweeplab.tasks.step_graph import StepGraph

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    batch = {"x": torch.randn(8, 4), "y": torch.randn(8, 2)}

    def loss_fn(b):
        loss = torch.nn.functional.mse_loss(model(b["x"]), b["y"])
        return loss, {"double": 2 * loss}

    graph = StepGraph(loss_fn, list(model.parameters()), grad_clip=1e-3, autocast_dtype=None, device=torch.device("cpu"))
    loss, metrics, grad_norm = graph(batch)
    assert graph.graph is None and graph.eager_steps == 1
    torch.testing.assert_close(metrics["double"], 2 * loss)
    clipped = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
    assert float(grad_norm) > 1e-3 and float(clipped) == pytest.approx(1e-3, rel=1e-3)


@pytest.mark.parametrize(
    "switches",
    [["data.on_device=false"], ["data.on_device=true", "data.pad_to=max"],
     ["data.on_device=true", "data.pad_to=max", "cuda_graph=true"]],
    ids=["dataloader", "on_device", "cuda_graph_path"],
)
def test_nothing_is_read_back_from_the_device_between_logging_steps(switches, demo_dir, tmp_path, monkeypatch, request):
    """Each read of a tensor's value (`.item()`, float(), bool()) is a host sync on a GPU: only logging steps (every
    `log_every_n_steps`) may read. Lightning re-reads metrics marked prog_bar=True after every batch, so none are."""
    from sweeplab.families.textbridge.task import TextBridgeTask

    monkeypatch.chdir(tmp_path)
    if "cuda_graph=true" in switches:
        request.getfixturevalue("graph_path_on_cpu")  # the graph step's code path, capture off
    reads: list[int] = []
    state = {"step": 0}
    epoch_ends: set[int] = set()  # an epoch's end may read (epoch metrics), once per epoch

    class Step(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            state["step"] = trainer.global_step
            state["graph_step"] = pl_module.cuda_graph

        def on_train_epoch_end(self, trainer, pl_module):
            epoch_ends.add(trainer.global_step - 1)

    for name in ("item", "__float__", "__bool__", "__int__", "__index__", "tolist", "numpy", "cpu"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, **kwargs):
            reads.append(state["step"])
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    monkeypatch.setattr(TextBridgeTask, "extra_callbacks", lambda self: [Step()])
    cfg = smoke_config(
        demo_dir, "trainer.max_steps=40", "trainer.val_check_interval=100", "trainer.log_every_n_steps=10",
        "timing.window=1000", "timing.warmup_steps=0", "optim.implementation=fused", "checkpoint.every_n_steps=100",
        *switches,
    )
    train(cfg)  # no progress bar (smoke_config): it reads the loss once per refresh, counted per epoch
    between = sorted({s for s in reads if (s + 1) % 10 != 0 and s not in epoch_ends and 0 < s < 39})
    assert between == [], f"tensors read back at non-logging steps {between}"
    assert state["graph_step"] == ("cuda_graph=true" in switches)


def test_progress_bar_shows_the_last_logged_loss(demo_dir, tmp_path, monkeypatch):
    from sweeplab.engine.lightning_fit import LoggedLossProgressBar

    monkeypatch.chdir(tmp_path)
    shown: list[dict] = []
    original = LoggedLossProgressBar.get_metrics

    def recording(self, trainer, pl_module):
        metrics = original(self, trainer, pl_module)
        shown.append(metrics)
        return metrics

    monkeypatch.setattr(LoggedLossProgressBar, "get_metrics", recording)
    cfg = smoke_config(demo_dir, "trainer.max_steps=20", "trainer.log_every_n_steps=5")
    cfg.trainer.enable_progress_bar = True
    train(cfg)
    losses = [m["train/loss"] for m in shown if "train/loss" in m]
    assert losses and all(float(v) > 0 for v in losses)
