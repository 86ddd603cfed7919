"""The paGating GPT in MLX: the same function as models/gpt.py + models/pagating.py, with the same parameter names.

Every parameter and buffer of the PyTorch state dict has an array here under the same key and shape (no
convolutions, so `sweeplab.mlx.convert` copies them as they are). Buffers (a fixed or scheduled α, a fixed Swish β)
are frozen arrays: saved and converted like parameters, never trained. The tied output matrix is `wte.weight` read
as a linear layer; `TIED_WEIGHTS` names the PyTorch state dict's second key for it. Initial weights come from the
PyTorch model (converted), so both backends start from the same numbers. Plain MLX: no Lightning, MLflow, Hydra or
PyTorch here.
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn

from sweeplab.models.gpt import MASK_VALUE, GPTConfig
from sweeplab.models.pagating import alpha_logit, check_alpha, check_schedule, check_unit, scheduled_alpha

# PyTorch state dict key -> the key it is tied to (the same tensor there, one array here)
TIED_WEIGHTS = {"lm_head.weight": "wte.weight"}


class AlphaGate(nn.Module):
    """α·gate + (1 − α) with α fixed, learnable (sigmoid(θ)) or scheduled, as models/pagating.AlphaGate."""

    def __init__(
        self,
        alpha: float | int | str = 0.5,
        *,
        alpha_init: float = 0.5,
        schedule_steps: int = 1000,
        schedule_reverse: bool = False,
        alpha_min: float = 0.0,
        alpha_max: float = 1.0,
    ):
        super().__init__()
        alpha = check_alpha(alpha)
        self.mode = "fixed" if isinstance(alpha, float) else alpha
        self.schedule_steps = schedule_steps
        self.schedule_reverse = schedule_reverse
        self.alpha_min = alpha_min
        self.alpha_max = alpha_max
        if self.mode == "fixed":
            self.value = mx.array(alpha, dtype=mx.float32)
        elif self.mode == "learnable":
            self.theta = mx.array(alpha_logit(alpha_init), dtype=mx.float32)
        else:
            check_schedule(schedule_steps, alpha_min, alpha_max)
            self.value = mx.array(self.alpha_at(0), dtype=mx.float32)
        self.freeze(keys=["value"], strict=False)  # a buffer in PyTorch

    @property
    def scheduled(self) -> bool:
        return self.mode in ("cosine", "linear")

    def alpha_at(self, step: int) -> float:
        """The scheduled α after `step` optimizer steps (a Python float)."""
        return scheduled_alpha(
            self.mode, step, self.schedule_steps, self.schedule_reverse, self.alpha_min, self.alpha_max
        )

    def set_step(self, step: int) -> None:
        if self.scheduled:
            self.value = mx.array(self.alpha_at(int(step)), dtype=mx.float32)  # stays frozen: freeze is by key

    @property
    def alpha(self) -> mx.array:
        return mx.sigmoid(self.theta) if self.mode == "learnable" else self.value

    def __call__(self, gate: mx.array) -> mx.array:
        alpha = self.alpha.astype(gate.dtype)
        return alpha * gate + (1.0 - alpha)


class Swish(nn.Module):
    """x·σ(βx); β fixed (a frozen array, a buffer in PyTorch) or learnable."""

    def __init__(self, beta: float = 1.0, learnable: bool = False):
        super().__init__()
        self.beta = mx.array(float(beta), dtype=mx.float32)
        if not learnable:
            self.freeze(keys=["beta"])

    def __call__(self, x: mx.array) -> mx.array:
        return x * mx.sigmoid(self.beta * x)


def _gate_activation(name: str, approximate: str, activation) -> nn.Module | callable:
    if name == "paGELU":
        return nn.gelu_approx if approximate == "tanh" else nn.gelu
    if name == "paUnit":
        if callable(activation):
            return activation
        fn = getattr(nn, activation, None) if isinstance(activation, str) else None
        fn = fn or (getattr(mx, activation, None) if isinstance(activation, str) else None)
        if not callable(fn):
            raise ValueError(f"activation={activation!r} is not a function in mlx.nn or mlx.core")
        return fn
    return {"paGLU": mx.sigmoid, "paGTU": mx.sigmoid, "paReGLU": nn.relu, "paSiLU": nn.silu, "paMishU": nn.mish}[name]


class PaGatingUnit(nn.Module):
    """out = v(A(x)) ⊙ AlphaGate(GateNorm(g(B(x)))); v is the identity, or tanh for paGTU."""

    def __init__(
        self,
        name: str,
        d_in: int,
        d_out: int,
        alpha: float | int | str = 0.5,
        *,
        bias: bool = True,
        gate_norm: bool = False,
        approximate: str = "none",
        beta: float = 1.0,
        learnable_beta: bool = False,
        activation=None,
        alpha_init: float = 0.5,
        schedule_steps: int = 1000,
        schedule_reverse: bool = False,
        alpha_min: float = 0.0,
        alpha_max: float = 1.0,
    ):
        super().__init__()
        check_unit(name, approximate, activation)
        self.name = name
        self.value_tanh = name == "paGTU"
        self.value_proj = nn.Linear(d_in, d_out, bias=bias)
        self.gate_proj = nn.Linear(d_in, d_out, bias=bias)
        if name == "paSwishU":
            self.activation = Swish(beta, learnable=learnable_beta)  # has state: a module, like PyTorch's
        else:
            self._activation = _gate_activation(name, approximate, activation)
        if gate_norm:
            self.gate_norm = nn.LayerNorm(d_out)
        self.alpha_gate = AlphaGate(
            alpha,
            alpha_init=alpha_init,
            schedule_steps=schedule_steps,
            schedule_reverse=schedule_reverse,
            alpha_min=alpha_min,
            alpha_max=alpha_max,
        )

    def __call__(self, x: mx.array) -> mx.array:
        value = self.value_proj(x)
        if self.value_tanh:
            value = mx.tanh(value)
        gate_in = self.gate_proj(x)
        gate = self.activation(gate_in) if "activation" in self else self._activation(gate_in)
        if "gate_norm" in self:
            gate = self.gate_norm(gate)
        return value * self.alpha_gate(gate)

    @property
    def scheduled(self) -> bool:
        return self.alpha_gate.scheduled

    def set_step(self, step: int) -> None:
        self.alpha_gate.set_step(step)


def padding_mask(attention_mask: mx.array, dtype) -> mx.array:
    """(B, T) 0/1 mask -> (B, 1, T, T) additive mask, as models/gpt.padding_mask (a padded query sees itself)."""
    T = attention_mask.shape[1]
    causal = mx.tril(mx.ones((T, T), dtype=mx.bool_))
    itself = mx.eye(T, dtype=mx.bool_)
    keep = causal[None, None] & (attention_mask[:, None, None, :].astype(mx.bool_) | itself)
    return (1.0 - keep.astype(dtype)) * MASK_VALUE


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=config.bias)
        self.proj = nn.Linear(config.d_model, config.d_model, bias=config.bias)
        self.proj_dropout = nn.Dropout(config.dropout)

    def __call__(self, x: mx.array, mask: mx.array | None) -> mx.array:
        B, T, C = x.shape
        q, k, v = mx.split(self.qkv(x), 3, axis=2)
        q, k, v = (t.reshape(B, T, self.n_head, C // self.n_head).transpose(0, 2, 1, 3) for t in (q, k, v))
        scale = 1.0 / math.sqrt(C // self.n_head)
        y = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal" if mask is None else mask)
        y = y.transpose(0, 2, 1, 3).reshape(B, T, C)
        return self.proj_dropout(self.proj(y))


class MLP(nn.Module):
    """proj(unit(x)) with a paGating unit d -> hidden, or proj(GELU(fc(x))) for ffn="mlp"."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        d, hidden = config.d_model, config.ffn_hidden
        if config.ffn == "pagating":
            self.unit = PaGatingUnit(config.unit, d, hidden, config.alpha, bias=config.bias, **config.unit_options)
        else:
            self.unit = [nn.Linear(d, hidden, bias=config.bias)]  # PyTorch's nn.Sequential: key unit.0.*
        self.proj = nn.Linear(hidden, d, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def __call__(self, x: mx.array) -> mx.array:
        h = self.unit(x) if isinstance(self.unit, PaGatingUnit) else nn.gelu(self.unit[0](x))  # nn.GELU(): erf
        return self.dropout(self.proj(h))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.d_model, bias=config.bias)
        self.mlp = MLP(config)

    def __call__(self, x: mx.array, mask: mx.array | None) -> mx.array:
        x = x + self.attn(self.ln_1(x), mask)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    tied_weights = TIED_WEIGHTS  # read by sweeplab.mlx.convert

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.d_model)
        self.wpe = nn.Embedding(config.block_size, config.d_model)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = [Block(config) for _ in range(config.n_layer)]
        self.ln_f = nn.LayerNorm(config.d_model, bias=config.bias)

    def __call__(self, input_ids: mx.array, attention_mask: mx.array | None = None) -> mx.array:
        """(B, T) token ids, optional (B, T) 0/1 mask -> (B, T, V) logits."""
        B, T = input_ids.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds model.block_size={self.config.block_size}")
        x = self.drop(self.wte(input_ids) + self.wpe(mx.arange(T)))
        mask = None if attention_mask is None else padding_mask(attention_mask, x.dtype)
        for block in self.blocks:
            x = block(x, mask)
        return self.wte.as_linear(self.ln_f(x))  # tied: one matrix reads tokens in and scores them out

    def training_loss(self, batch: dict, loss_config=None) -> tuple[mx.array, dict[str, mx.array]]:
        """(loss, metrics) of a training batch, as LMTask.training_loss (the MLX loop's step calls it)."""
        return lm_loss(self(batch["input_ids"]), batch["labels"]), {}

    def before_step(self, step: int) -> None:
        """The MLX loop calls this before each optimizer step (`step` taken so far), as AlphaScheduleCallback."""
        self.set_alpha_step(step)

    def logged_values(self) -> dict[str, float]:
        """What the MLX loop logs every log_every_n_steps besides the loss, as AlphaScheduleCallback logs it."""
        return {f"alpha/{layer}": value for layer, value in self.alpha_values().items()}

    def units(self) -> list[tuple[int, PaGatingUnit]]:
        return [(i, b.mlp.unit) for i, b in enumerate(self.blocks) if isinstance(b.mlp.unit, PaGatingUnit)]

    def set_alpha_step(self, step: int) -> None:
        """Advance every scheduled unit to `step` (the number of optimizer steps taken)."""
        for _, unit in self.units():
            unit.set_step(step)

    def alpha_values(self) -> dict[str, float]:
        """{"layer_<i>": α} for every block's unit (empty for ffn="mlp"), as GPT.alpha_values."""
        units = self.units()
        if not units:
            return {}
        values = mx.stack([unit.alpha_gate.alpha.astype(mx.float32) for _, unit in units]).tolist()
        return {f"layer_{i}": value for (i, _), value in zip(units, values)}


def lm_loss(logits: mx.array, labels: mx.array) -> mx.array:
    """Mean next-token cross-entropy in fp32 over labels that are not -100, as families/pagating_lm/task.lm_loss."""
    logits = logits.astype(mx.float32).reshape(-1, logits.shape[-1])
    labels = labels.reshape(-1)
    counted = labels != -100
    per_token = nn.losses.cross_entropy(logits, mx.where(counted, labels, 0), reduction="none")
    return (per_token * counted).sum() / counted.sum()


def build_mlx_model(config: GPTConfig) -> GPT:
    return GPT(config)


__all__ = ["GPT", "TIED_WEIGHTS", "AlphaGate", "PaGatingUnit", "build_mlx_model", "lm_loss", "padding_mask"]
