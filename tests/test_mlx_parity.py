"""The MLX ports compute what the PyTorch models compute: forward, gradients, 50 training steps, checkpoints.

Tiny sizes on the CPU, the same weights on both sides (copied with sweeplab.mlx.convert). The PyTorch side of the
loss curves is the plain loop: torch's AdamW (tasks.optim.build_optimizer), the project's scheduler and
clip_grad_norm_; the MLX side is the compiled step of sweeplab.mlx.step.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

mx = pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'sweeplab[mlx]')")

import mlx.nn  # noqa: E402
import mlx.utils  # noqa: E402

from sweeplab.families.pagating_lm import mlx_model as mlx_gpt  # noqa: E402
from sweeplab.families.pagating_lm.task import lm_loss  # noqa: E402
from sweeplab.families.textbridge import mlx_model as mlx_textbridge  # noqa: E402
from sweeplab.families.textbridge.task import LossConfig, distill_loss  # noqa: E402
from sweeplab.mlx import convert  # noqa: E402
from sweeplab.mlx.optim import build_optimizer as build_mlx_optimizer  # noqa: E402
from sweeplab.mlx.optim import lr_schedule  # noqa: E402
from sweeplab.mlx.step import CompiledStep  # noqa: E402
from sweeplab.models.gpt import GPT, GPTConfig  # noqa: E402
from sweeplab.models.pagating import UNIT_NAMES, set_alpha_step  # noqa: E402
from sweeplab.models.textbridge import TextBridgeConfig, TextBridgeEncoder  # noqa: E402
from sweeplab.tasks.optim import OptimConfig, build_optimizer, build_scheduler, lr_at  # noqa: E402

STEPS = 50
LOSS = LossConfig(alpha=0.7, beta=0.5)
COMPILED = pytest.param(True, id="compiled", marks=pytest.mark.slow)  # g++ per new graph: ~10-40 s each, cold


@pytest.fixture(autouse=True)
def eager_unless_compiled(request):
    """mx.compile off unless a test runs the compiled step: on Linux every first compilation of a graph runs g++
    (mlx.nn's activations are compiled functions too), about 2 minutes for this file on a fresh 2-core machine.
    Off, the same operations run one by one; the slow tests run the same curves compiled."""
    compiled = getattr(request.node, "callspec", None) and request.node.callspec.params.get("compiled", False)
    if not compiled:
        mx.disable_compile()
    yield
    mx.enable_compile()


def textbridge_config(**overrides) -> TextBridgeConfig:
    return TextBridgeConfig(
        **{"vocab_size": 50, "d_model": 16, "d_hidden": 32, "n_blocks": 2, "kernel_size": 3, "dilations": [1, 2],
           "out_dim": 24, "max_len": 16, **overrides}
    )


def gpt_config(**overrides) -> GPTConfig:
    return GPTConfig(
        **{"vocab_size": 64, "block_size": 16, "n_layer": 2, "n_head": 2, "d_model": 32, "d_ff": 64, **overrides}
    )


def _pair(model_class, port_module, config):
    """The PyTorch model (seeded) and its MLX port holding the same weights."""
    torch.manual_seed(0)
    model = model_class(config)
    port = port_module.build_mlx_model(config)
    convert.load_state_dict(port, model.state_dict())
    return model, port


def textbridge_pair(**overrides) -> tuple[TextBridgeEncoder, mlx_textbridge.TextBridgeEncoder]:
    return _pair(TextBridgeEncoder, mlx_textbridge, textbridge_config(**overrides))


def gpt_pair(**overrides) -> tuple[GPT, mlx_gpt.GPT]:
    return _pair(GPT, mlx_gpt, gpt_config(**overrides))


def textbridge_batches(n: int = 3, batch_size: int = 4, length: int = 12) -> list[dict[str, torch.Tensor]]:
    """Right-padded batches of different lengths (one sample full length), random teacher targets."""
    g = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(n):
        lengths = torch.randint(2, length + 1, (batch_size,), generator=g)
        lengths[0] = length
        mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
        ids = torch.randint(1, 50, (batch_size, length), generator=g) * mask
        batches.append({"input_ids": ids, "attention_mask": mask, "target": torch.randn(batch_size, 24, generator=g)})
    return batches


def lm_batches(n: int = 3, batch_size: int = 4, length: int = 16) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(2)
    batches = []
    for _ in range(n):
        block = torch.randint(0, 64, (batch_size, length + 1), generator=g)
        batches.append({"input_ids": block[:, :-1].contiguous(), "labels": block[:, 1:].contiguous()})
    return batches


def to_mx(batch: dict[str, torch.Tensor]) -> dict[str, mx.array]:
    return {k: mx.array(v.numpy()) for k, v in batch.items()}


def assert_close(mlx_value, torch_value: torch.Tensor, tol: float = 1e-5) -> None:
    torch.testing.assert_close(torch.from_numpy(np.array(mlx_value)), torch_value.detach(), rtol=tol, atol=tol)


# --- the two sides' losses ----------------------------------------------------------------------------------
def torch_textbridge_loss(model, batch):
    return distill_loss(model(batch["input_ids"], batch["attention_mask"]), batch["target"], LOSS)[0]


def mlx_textbridge_loss(port):
    def loss_fn(batch):
        loss, cos, mse = mlx_textbridge.distill_loss(
            port(batch["input_ids"], batch["attention_mask"]), batch["target"], LOSS.alpha, LOSS.beta
        )
        return loss, {"train/cos": cos, "train/mse": mse}

    return loss_fn


def torch_lm_loss(model, batch):
    return lm_loss(model(batch["input_ids"]), batch["labels"])


def mlx_lm_loss(port):
    def loss_fn(batch):
        return mlx_gpt.lm_loss(port(batch["input_ids"]), batch["labels"]), {}

    return loss_fn


def assert_grads_match(model, port, torch_loss, mlx_loss_fn, batch) -> None:
    model.zero_grad()
    torch_loss(model, batch).backward()
    (loss, _), grads = mlx.nn.value_and_grad(port, mlx_loss_fn)(to_mx(batch))
    assert_close(loss, torch_loss(model, batch))
    flat = dict(mlx.utils.tree_flatten(grads))
    expected = {name: p.grad for name, p in model.named_parameters() if p.requires_grad}
    assert set(flat) == set(expected), "the MLX model trains other parameters than the PyTorch model"
    for name, grad in expected.items():
        actual = convert.to_torch(flat[name], channels_last=flat[name].ndim >= 3)
        torch.testing.assert_close(actual, grad, rtol=1e-5, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


# --- forward and gradients ------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides", [{}, {"use_tanh": True, "init": "original"}, {"kernel_size": 1}])
def test_textbridge_forward_matches(overrides):
    model, port = textbridge_pair(**overrides)
    for batch in textbridge_batches():
        assert_close(port(*(to_mx(batch)[k] for k in ("input_ids", "attention_mask"))),
                     model(batch["input_ids"], batch["attention_mask"]))


@pytest.mark.parametrize("freeze", ["none", "trunk", "trunk_except_last"])
def test_textbridge_gradients_match_and_the_same_parameters_train(freeze):
    model, port = textbridge_pair(freeze=freeze)
    assert_grads_match(model, port, torch_textbridge_loss, mlx_textbridge_loss(port), textbridge_batches()[0])


@pytest.mark.parametrize(
    "overrides",
    [{"unit": unit} for unit in UNIT_NAMES if unit != "paUnit"]
    + [
        {"unit": "paUnit", "unit_options": {"activation": "tanh"}},
        {"unit": "paGELU", "unit_options": {"approximate": "tanh", "gate_norm": True}},
        {"unit": "paSwishU", "unit_options": {"beta": 1.5, "learnable_beta": True}},
        {"ffn": "mlp"},
        {"bias": False, "param_matched": True},
    ],
    ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()),
)
def test_gpt_forward_matches(overrides):
    model, port = gpt_pair(**overrides)
    batch = lm_batches()[0]
    assert_close(port(mx.array(batch["input_ids"].numpy())), model(batch["input_ids"]))
    # the padding-mask path (a left part of each row real, the rest padding)
    mask = (torch.arange(16)[None, :] < torch.tensor([16, 9, 4, 1])[:, None]).long()
    assert_close(port(mx.array(batch["input_ids"].numpy()), mx.array(mask.numpy())), model(batch["input_ids"], mask))


@pytest.mark.parametrize("alpha", [0.3, "learnable", "cosine"])
def test_gpt_gradients_match(alpha):
    model, port = gpt_pair(alpha=alpha, unit_options={"schedule_steps": STEPS})
    set_alpha_step(model, 7)
    port.set_alpha_step(7)
    assert_grads_match(model, port, torch_lm_loss, mlx_lm_loss(port), lm_batches()[0])


# --- 50 training steps --------------------------------------------------------------------------------------
OPTIM = OptimConfig(lr=1e-2, weight_decay=0.1, warmup_steps=5, min_lr=1e-3, grad_clip=0.5)


def torch_curve(model, loss_fn, batches, cfg: OptimConfig, before_step=None) -> tuple[list[float], int]:
    optimizer = build_optimizer(model, cfg)
    scheduler = build_scheduler(optimizer, cfg, STEPS)
    losses, clipped = [], 0
    for step in range(STEPS):
        if before_step:
            before_step(step)
        loss = loss_fn(model, batches[step % len(batches)])
        optimizer.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        clipped += bool(norm > cfg.grad_clip)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    return losses, clipped


def mlx_curve(port, loss_fn, batches, cfg: OptimConfig, before_step=None, compiled=False,
              compute_dtype=None) -> list[float]:
    extra = {} if compute_dtype is None else {"compute_dtype": compute_dtype}
    step_fn = CompiledStep(port, loss_fn, build_mlx_optimizer(cfg, STEPS), cfg.grad_clip, compile=compiled, **extra)
    losses = []
    for step in range(STEPS):
        if before_step:
            before_step(step)
        loss, *_ = step_fn(batches[step % len(batches)])
        mx.eval(loss, port.parameters())
        losses.append(loss.item())
    return losses


def assert_curves_match(mlx_losses: list[float], torch_losses: list[float]) -> None:
    relative = [abs(a - b) / abs(b) for a, b in zip(mlx_losses, torch_losses)]
    assert max(relative) < 1e-4, f"largest relative difference {max(relative):.2e} at step {np.argmax(relative)}"
    assert torch_losses[-1] < 0.8 * torch_losses[0], "the curve must move for the comparison to mean anything"


@pytest.mark.parametrize("compiled", [False, COMPILED])
@pytest.mark.parametrize("name,freeze", [("adamw", "none"),  # the others ~10-50 s each here: slow
                                         pytest.param("adam_l2", "none", marks=pytest.mark.slow),
                                         pytest.param("adamw", "trunk_except_last", marks=pytest.mark.slow)])
def test_textbridge_loss_curve_matches(name, freeze, compiled):
    cfg = OptimConfig(**{**OPTIM.__dict__, "name": name})
    model, port = textbridge_pair(freeze=freeze)
    batches = textbridge_batches()
    torch_losses, clipped = torch_curve(model, torch_textbridge_loss, batches, cfg)
    assert clipped > 0, "clipping must be active for the comparison to cover it"
    mlx_losses = mlx_curve(port, mlx_textbridge_loss(port), [to_mx(b) for b in batches], cfg, compiled=compiled)
    assert_curves_match(mlx_losses, torch_losses)


@pytest.mark.parametrize("compiled", [False, COMPILED])
@pytest.mark.parametrize("alpha", [0.3, pytest.param("learnable", marks=pytest.mark.slow),  # ~10-50 s each here
                                   pytest.param("cosine", marks=pytest.mark.slow)])  # (their gradients: fast, above)
def test_gpt_loss_curve_matches(alpha, compiled):
    model, port = gpt_pair(alpha=alpha, unit_options={"schedule_steps": STEPS})
    batches = lm_batches()
    torch_losses, clipped = torch_curve(model, torch_lm_loss, batches, OPTIM, lambda s: set_alpha_step(model, s))
    assert clipped > 0
    mlx_losses = mlx_curve(
        port, mlx_lm_loss(port), [to_mx(b) for b in batches], OPTIM, port.set_alpha_step, compiled=compiled
    )
    assert_curves_match(mlx_losses, torch_losses)
    assert port.alpha_values() == pytest.approx(model.alpha_values(), rel=1e-4)


def test_lr_schedule_is_the_projects():
    for cfg, total in [(OPTIM, STEPS), (OptimConfig(warmup_steps=0, decay_steps=7, lr=1e-3), 20)]:
        schedule = lr_schedule(cfg, total)
        expected = [lr_at(s, cfg, total) for s in range(total + 3)]
        actual = [schedule(mx.array(s, dtype=mx.uint64)).item() for s in range(total + 3)]
        assert actual == pytest.approx(expected, rel=1e-6)


# --- the non-finite flag --------------------------------------------------------------------------------------
@pytest.mark.parametrize("compiled", [False, COMPILED])
@pytest.mark.parametrize("skip", [False, True])
def test_nonfinite_step_is_flagged_and_skip_leaves_the_state_alone(skip, compiled):
    _, port = textbridge_pair()
    optimizer = build_mlx_optimizer(OPTIM, STEPS)
    step_fn = CompiledStep(port, mlx_textbridge_loss(port), optimizer, 1.0, skip_nonfinite=skip, compile=compiled)
    good, bad = to_mx(textbridge_batches()[0]), to_mx(textbridge_batches()[1])
    bad["target"] = bad["target"] * mx.array(math.nan)
    *_, finite = step_fn(good)
    assert finite.item()
    before = [np.array(a) for _, a in mlx.utils.tree_flatten((port.parameters(), step_fn.optimizer.state))]
    *_, finite = step_fn(bad)
    assert not finite.item()
    after = [np.array(a) for _, a in mlx.utils.tree_flatten((port.parameters(), step_fn.optimizer.state))]
    unchanged = all(np.array_equal(a, b) for a, b in zip(before, after))
    assert unchanged == skip
    *_, finite = step_fn(good)  # and training goes on
    assert finite.item() == skip


# --- checkpoints --------------------------------------------------------------------------------------------
def bits(array: mx.array) -> np.ndarray:
    return np.array(array.view(mx.uint32) if array.dtype == mx.float32 else array)


@pytest.mark.parametrize("family", ["textbridge", "pagating_lm"])
def test_checkpoint_round_trip_mlx_torch_mlx_is_exact(family):
    if family == "textbridge":
        model, port = textbridge_pair(freeze="trunk_except_last")
        loss_fn, batches = mlx_textbridge_loss(port), [to_mx(b) for b in textbridge_batches()]
        fresh = mlx_textbridge.build_mlx_model(model.config)
    else:
        model, port = gpt_pair(alpha="cosine", unit_options={"schedule_steps": STEPS})
        loss_fn, batches = mlx_lm_loss(port), [to_mx(b) for b in lm_batches()]
        fresh = mlx_gpt.build_mlx_model(model.config)
    step_fn = CompiledStep(port, loss_fn, build_mlx_optimizer(OPTIM, STEPS), OPTIM.grad_clip)
    for step in range(3):  # trained weights: not the ones that came from PyTorch
        if family == "pagating_lm":
            port.set_alpha_step(step + 1)
        step_fn(batches[step])
    mx.eval(port.parameters())

    model.load_state_dict(convert.state_dict(port))  # strict: every key of the PyTorch model, tied ones too
    convert.load_state_dict(fresh, model.state_dict())

    original, restored = dict(mlx.utils.tree_flatten(port.parameters())), dict(mlx.utils.tree_flatten(fresh.parameters()))
    assert original.keys() == restored.keys()
    for key in original:
        assert original[key].dtype == restored[key].dtype and original[key].shape == restored[key].shape, key
        assert np.array_equal(bits(original[key]), bits(restored[key])), key
    trainable = [{key for key, _ in mlx.utils.tree_flatten(m.trainable_parameters())} for m in (port, fresh)]
    assert trainable[0] == trainable[1] and len(trainable[0]) < len(original), "frozen arrays stay frozen"


def test_bfloat16_and_scalars_convert_exactly():
    for tensor in [torch.randn(3, 5).to(torch.bfloat16), torch.tensor(0.1234567), torch.randn(4, 2, 3)]:
        conv = tensor.ndim == 3
        back = convert.to_torch(convert.to_mx(tensor, channels_last=conv), channels_last=conv)
        assert back.dtype == tensor.dtype and back.shape == tensor.shape
        assert torch.equal(back.view(torch.int16) if tensor.dtype == torch.bfloat16 else back, tensor.view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor)


def test_a_state_dict_that_does_not_fit_is_refused_naming_the_keys():
    model, port = textbridge_pair()
    state = model.state_dict()
    state["extra.weight"] = state.pop("head.bias")
    with pytest.raises(ValueError, match=r"missing \['head.bias'\], unexpected \['extra.weight'\]"):
        convert.load_state_dict(port, state)
    state = textbridge_pair(out_dim=8)[0].state_dict()
    with pytest.raises(ValueError, match=r"head.weight \(8, 16\) != \(24, 16\)"):
        convert.load_state_dict(port, state)


# --- the decoder family -------------------------------------------------------------------------------------
def decoder_pair():
    from sweeplab.families.textbridge_decoder import mlx_model as mlx_decoder
    from sweeplab.models.textbridge_decoder import DecoderConfig, TextBridgeDecoder

    config = DecoderConfig(vocab_size=50, embed_dim=24, max_len=16, n_prefix=2, n_layer=2, n_head=2, d_model=32,
                           d_ff=64, bos_id=1, eos_id=2)
    return _pair(TextBridgeDecoder, mlx_decoder, config)


def torch_decoder_loss(model, batch):
    from sweeplab.models.textbridge_decoder import teacher_forcing, token_loss

    inputs, labels = teacher_forcing(batch["input_ids"], batch["attention_mask"], 1, 2)
    return token_loss(model(batch["target"], inputs), labels)


def mlx_decoder_loss(port):
    return lambda batch: port.training_loss(batch)


def test_decoder_forward_gradients_and_teacher_forcing_match():
    from sweeplab.families.textbridge_decoder import mlx_model as mlx_decoder
    from sweeplab.models.textbridge_decoder import teacher_forcing

    model, port = decoder_pair()
    batch = textbridge_batches()[0]
    inputs, labels = teacher_forcing(batch["input_ids"], batch["attention_mask"], 1, 2)
    mx_inputs, mx_labels = mlx_decoder.teacher_forcing(*(to_mx(batch)[k] for k in ("input_ids", "attention_mask")), 1, 2)
    assert np.array_equal(np.array(mx_inputs), inputs.numpy()) and np.array_equal(np.array(mx_labels), labels.numpy())
    assert_close(port(to_mx(batch)["target"], mx_inputs), model(batch["target"], inputs))
    mask = (torch.arange(13)[None, :] < torch.tensor([13, 9, 4, 1])[:, None]).long()
    assert_close(port(to_mx(batch)["target"], mx_inputs, mx.array(mask.numpy())), model(batch["target"], inputs, mask))
    assert_grads_match(model, port, torch_decoder_loss, mlx_decoder_loss(port), batch)


@pytest.mark.parametrize("compiled", [False, COMPILED])
def test_decoder_loss_curve_matches(compiled):
    model, port = decoder_pair()
    batches = textbridge_batches()
    torch_losses, clipped = torch_curve(model, torch_decoder_loss, batches, OPTIM)
    assert clipped > 0
    mlx_losses = mlx_curve(port, mlx_decoder_loss(port), [to_mx(b) for b in batches], OPTIM, compiled=compiled)
    assert_curves_match(mlx_losses, torch_losses)


def test_decoder_checkpoint_round_trip_is_exact():
    from sweeplab.families.textbridge_decoder import mlx_model as mlx_decoder

    model, port = decoder_pair()
    step_fn = CompiledStep(port, mlx_decoder_loss(port), build_mlx_optimizer(OPTIM, STEPS), OPTIM.grad_clip)
    for batch in textbridge_batches():
        step_fn(to_mx(batch))
    mx.eval(port.parameters())
    model.load_state_dict(convert.state_dict(port))  # strict: the tied gpt.lm_head.weight too
    fresh = mlx_decoder.build_mlx_model(model.config)
    convert.load_state_dict(fresh, model.state_dict())
    original, restored = dict(mlx.utils.tree_flatten(port.parameters())), dict(mlx.utils.tree_flatten(fresh.parameters()))
    assert original.keys() == restored.keys()
    assert all(np.array_equal(bits(original[k]), bits(restored[k])) for k in original)


# --- bf16-mixed -------------------------------------------------------------------------------------------
# MLX's bf16-mixed (sweeplab.mlx.step: float32 weights and optimizer, the forward and backward on a bfloat16 copy)
# against torch's CPU autocast (bf16 matmuls and convolutions, float32 weights) and against float32. bfloat16 keeps
# 8 significant bits (relative rounding 2^-9 = 0.2 %); the two sides round at different places (MLX runs everything
# between the casts in bfloat16, autocast only its listed ops), so the curves agree to a tolerance, not bits:
# BF16_CURVE_TOLERANCE on every step's loss, relative, over 50 steps of training with clipping active.
BF16_CURVE_TOLERANCE = 0.03


def torch_bf16_loss(loss_fn):
    def autocast_loss(model, batch):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return loss_fn(model, batch).float()

    return autocast_loss


def mlx_bf16_curve(port, loss_fn, batches, cfg: OptimConfig, before_step=None) -> list[float]:
    losses = mlx_curve(port, loss_fn, batches, cfg, before_step, compute_dtype=mx.bfloat16)
    assert all(a.dtype == mx.float32 for _, a in mlx.utils.tree_flatten(port.parameters())), "weights stay float32"
    return losses


def bf16_cases():
    return {
        "textbridge": (textbridge_pair, torch_textbridge_loss, mlx_textbridge_loss, textbridge_batches),
        "pagating_lm": (lambda: gpt_pair(alpha="learnable"), torch_lm_loss, mlx_lm_loss, lm_batches),
        "textbridge_decoder": (decoder_pair, torch_decoder_loss, mlx_decoder_loss, textbridge_batches),
    }


@pytest.mark.parametrize("family", ["textbridge", "pagating_lm",
                                    pytest.param("textbridge_decoder", marks=pytest.mark.slow)])  # ~14 s here
def test_bf16_mixed_loss_curve_is_torch_autocasts_within_the_stated_tolerance(family):
    make_pair, torch_loss, mlx_loss, make_batches = bf16_cases()[family]
    batches = make_batches()
    model, port = make_pair()
    fp32_model, _ = make_pair()
    torch_losses, _ = torch_curve(model, torch_bf16_loss(torch_loss), batches, OPTIM)
    fp32_losses, _ = torch_curve(fp32_model, torch_loss, batches, OPTIM)
    mlx_losses = mlx_bf16_curve(port, mlx_loss(port), [to_mx(b) for b in batches], OPTIM)
    for reference in (torch_losses, fp32_losses):
        relative = [abs(a - b) / abs(b) for a, b in zip(mlx_losses, reference)]
        assert max(relative) < BF16_CURVE_TOLERANCE, f"{max(relative):.2e} at step {np.argmax(relative)}"
    # and it is bfloat16 arithmetic, not float32 under another name
    assert max(abs(a - b) / abs(b) for a, b in zip(mlx_losses, fp32_losses)) > 1e-5
    assert mlx_losses[-1] < 0.8 * mlx_losses[0]


def test_bf16_mixed_gradients_are_float32_and_close_to_torch_autocasts():
    model, port = gpt_pair()
    batch = lm_batches()[0]
    model.zero_grad()
    torch_bf16_loss(torch_lm_loss)(model, batch).backward()
    from sweeplab.mlx.step import value_and_grad

    (loss, _), grads = value_and_grad(port, mlx_lm_loss(port), mx.bfloat16)(to_mx(batch))
    flat = dict(mlx.utils.tree_flatten(grads))
    assert all(g.dtype == mx.float32 for g in flat.values())
    assert all(a.dtype == mx.float32 for _, a in mlx.utils.tree_flatten(port.parameters())), "weights put back"
    for name, p in model.named_parameters():
        expected, actual = p.grad, convert.to_torch(flat[name])
        # bf16 gradients: compared as whole tensors (relative L2 error), elementwise they round differently
        assert (actual - expected).norm() / expected.norm() < 0.05, name


# --- gradient accumulation ----------------------------------------------------------------------------------
def halves(batch: dict) -> tuple[dict, dict]:
    n = next(iter(batch.values())).shape[0] // 2
    return {k: v[:n] for k, v in batch.items()}, {k: v[n:] for k, v in batch.items()}


@pytest.mark.parametrize("family", ["textbridge", "pagating_lm"])
def test_accumulating_two_half_batches_is_one_step_on_the_whole_batch(family):
    """accumulate=2 on the two halves of each batch gives torch's curve on the whole batches: the gradient of
    the mean of two equal-sized halves' mean losses is the whole batch's (all rows full length, all tokens scored)."""
    if family == "textbridge":
        model, port = textbridge_pair()
        torch_loss, loss_fn = torch_textbridge_loss, mlx_textbridge_loss(port)
        batches = textbridge_batches(batch_size=8)
        for b in batches:  # equal-length rows: each half's mean is over as many tokens
            b["attention_mask"][:] = 1
    else:
        model, port = gpt_pair()
        torch_loss, loss_fn, batches = torch_lm_loss, mlx_lm_loss(port), lm_batches(batch_size=8)
    torch_losses, clipped = torch_curve(model, torch_loss, batches, OPTIM)
    assert clipped > 0
    step_fn = CompiledStep(port, loss_fn, build_mlx_optimizer(OPTIM, STEPS), OPTIM.grad_clip, compile=False,
                           accumulate=2)
    mlx_losses = []
    for step in range(STEPS):
        loss, _, _, finite = step_fn(*(to_mx(h) for h in halves(batches[step % len(batches)])))
        mx.eval(loss, port.parameters())
        mlx_losses.append(loss.item())
    assert_curves_match(mlx_losses, torch_losses)
    with pytest.raises(ValueError, match="1 batches for one step of accumulate=2"):
        step_fn(to_mx(batches[0]))


# --- what last.ckpt holds for a resume ----------------------------------------------------------------------
def test_a_step_after_saving_and_restoring_the_optimizer_state_is_bit_identical(tmp_path):
    """The MLX side of resume: weights (convert.state_dict) and the optimizer's state (convert.arrays_to_torch)
    through a torch.save file, into a fresh model and optimizer: the next steps are the same bits."""
    model, port = gpt_pair(alpha="learnable")
    batches = [to_mx(b) for b in lm_batches()]
    optimizer = build_mlx_optimizer(OPTIM, STEPS)
    step_fn = CompiledStep(port, mlx_lm_loss(port), optimizer, OPTIM.grad_clip, compile=False)
    for step in range(3):
        step_fn(batches[step])
    mx.eval(step_fn.state)
    torch.save({"weights": convert.state_dict(port), "optimizer": convert.arrays_to_torch(optimizer.state)},
               tmp_path / "state.pt")
    saved = torch.load(tmp_path / "state.pt", weights_only=True)

    fresh = mlx_gpt.build_mlx_model(model.config)
    convert.load_state_dict(fresh, saved["weights"])
    restored = build_mlx_optimizer(OPTIM, STEPS)
    restored.state = convert.arrays_from_torch(saved["optimizer"])
    fresh_step = CompiledStep(fresh, mlx_lm_loss(fresh), restored, OPTIM.grad_clip, compile=False)
    before = dict(mlx.utils.tree_flatten(optimizer.state))
    after = dict(mlx.utils.tree_flatten(restored.state))
    assert before.keys() == after.keys() and all(before[k].dtype == after[k].dtype for k in before)
    for step in range(3, 6):
        a, b = step_fn(batches[step % 3])[0], fresh_step(batches[step % 3])[0]
        assert a.item() == b.item()
    mx.eval(step_fn.state, fresh_step.state)
    for (key, a), (_, b) in zip(mlx.utils.tree_flatten(port.parameters()), mlx.utils.tree_flatten(fresh.parameters())):
        assert np.array_equal(bits(a), bits(b)), key
