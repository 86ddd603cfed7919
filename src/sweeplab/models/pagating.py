"""paGating units: out = A(x) ⊙ [α·g(B(x)) + (1 − α)], with A = value_proj and B = gate_proj.

α = 1 is a full gated linear unit (A(x)·g(B(x))), α = 0 is the plain value path A(x); in between the gate is only
partly applied. Reads top to bottom: α (validation, then the `AlphaGate` that owns it) -> gate activations -> the
unit -> `make_unit` -> helpers that find units inside a model. Specification: docs/models.md#pagating-units.
Plain PyTorch; no Lightning, MLflow or Hydra here.

α modes (the `alpha` argument):
- a number in [0, 1]: fixed, kept in a buffer (moves with the module, saved in the state dict);
- "learnable": α = sigmoid(θ), θ a scalar parameter initialised to logit(alpha_init), so the initial α is exactly
  `alpha_init` (0.5 by default, θ = 0; the original started at sigmoid(0.5) ≈ 0.62 while documenting 0.5). θ is a
  0-d parameter, so `tasks.optim.param_groups` gives it no weight decay;
- "cosine": α(s) = alpha_min + (alpha_max − alpha_min)·½(1 + cos(π·min(s/T, 1))), from alpha_max (1) down to
  alpha_min (0) over T = schedule_steps; schedule_reverse runs it upwards;
- "linear": α(s) = alpha_min + (alpha_max − alpha_min)·min(s/T, 1), a ramp up over T steps; reverse runs it down.
A scheduled α lives in a buffer and only changes when someone calls `set_step(step)` (the training loop does,
through `families.pagating_lm.alpha.AlphaScheduleCallback`); forward never builds a tensor on the host.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

UNIT_NAMES = ("paGLU", "paGTU", "paSwishU", "paReGLU", "paGELU", "paMishU", "paSiLU", "paUnit")
ALPHA_MODES = ("learnable", "cosine", "linear")
SCHEDULED_MODES = ("cosine", "linear")


def check_alpha(alpha: float | int | str) -> float | str:
    """A fixed α as a float in [0, 1], or one of ALPHA_MODES; anything else is a ValueError naming the value."""
    if isinstance(alpha, str):
        if alpha in ALPHA_MODES:
            return alpha
        raise ValueError(f"alpha={alpha!r} is neither a number in [0, 1] nor one of {ALPHA_MODES}")
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
        raise ValueError(f"alpha={alpha!r} is neither a number in [0, 1] nor one of {ALPHA_MODES}")
    if not 0.0 <= float(alpha) <= 1.0:  # also rejects NaN
        raise ValueError(f"alpha={alpha!r} is outside [0, 1]")
    return float(alpha)


def alpha_logit(alpha_init: float) -> float:
    """θ with sigmoid(θ) = alpha_init, the learnable α's starting parameter (alpha_init strictly inside (0, 1))."""
    if not 0.0 < alpha_init < 1.0:
        raise ValueError(f"alpha_init={alpha_init!r} must be strictly inside (0, 1) for alpha='learnable'")
    return math.log(alpha_init / (1.0 - alpha_init))


def check_schedule(schedule_steps: int, alpha_min: float, alpha_max: float) -> None:
    """A scheduled α's settings: a positive step count, 0 <= alpha_min <= alpha_max <= 1."""
    if not (isinstance(schedule_steps, int) and schedule_steps > 0):
        raise ValueError(f"schedule_steps={schedule_steps!r} must be a positive integer")
    if not 0.0 <= alpha_min <= alpha_max <= 1.0:
        raise ValueError(f"alpha_min={alpha_min!r}, alpha_max={alpha_max!r}: need 0 <= alpha_min <= alpha_max <= 1")


def check_unit(name: str, approximate: str, activation) -> None:
    """A unit's name and the options that must agree with it; one check for every backend's units."""
    if name not in UNIT_NAMES:
        raise ValueError(f"unknown paGating unit {name!r}; valid: {', '.join(UNIT_NAMES)}")
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate={approximate!r} is not one of ('none', 'tanh')")
    if activation is not None and name != "paUnit":
        raise ValueError(f"activation= is only for paUnit; {name} has a fixed activation")


def scheduled_alpha(
    mode: str, step: int, schedule_steps: int, reverse: bool, alpha_min: float, alpha_max: float
) -> float:
    """A cosine or linear α after `step` optimizer steps; one definition for every backend's α gate."""
    progress = min(max(step, 0) / schedule_steps, 1.0)
    if reverse:
        progress = 1.0 - progress
    span = alpha_max - alpha_min
    if mode == "cosine":
        return alpha_min + span * 0.5 * (1.0 + math.cos(math.pi * progress))
    return alpha_min + span * progress


class AlphaGate(nn.Module):
    """Owns α and applies it to a gate: α·gate + (1 − α). Every unit holds one; all α math lives here."""

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
        self.step = 0
        self.initial = alpha if self.mode == "fixed" else alpha_init  # for repr only; the state lives in tensors
        if self.mode == "fixed":
            self.register_buffer("value", torch.tensor(alpha))
        elif self.mode == "learnable":
            self.theta = nn.Parameter(torch.tensor(alpha_logit(alpha_init)))
        else:
            check_schedule(schedule_steps, alpha_min, alpha_max)
            self.register_buffer("value", torch.tensor(self.alpha_at(0)))

    @property
    def scheduled(self) -> bool:
        return self.mode in SCHEDULED_MODES

    def alpha_at(self, step: int) -> float:
        """The scheduled α after `step` optimizer steps (a Python float: no device work)."""
        return scheduled_alpha(
            self.mode, step, self.schedule_steps, self.schedule_reverse, self.alpha_min, self.alpha_max
        )

    @torch.no_grad()
    def set_step(self, step: int) -> None:
        """Advance a scheduled α to `step` (in place, on whatever device the buffer is); no-op for other modes."""
        if self.scheduled:
            self.step = int(step)
            self.value.fill_(self.alpha_at(self.step))

    @property
    def alpha(self) -> torch.Tensor:
        """The current α: a 0-d tensor on the module's device (differentiable when learnable)."""
        return torch.sigmoid(self.theta) if self.mode == "learnable" else self.value

    def forward(self, gate: torch.Tensor) -> torch.Tensor:
        alpha = self.alpha  # 0-d: keeps the gate's dtype under autocast / half precision
        return alpha * gate + (1.0 - alpha)

    def extra_repr(self) -> str:
        if self.mode == "fixed":
            return f"alpha={self.initial:g}"
        if self.mode == "learnable":
            return f"alpha=learnable, init={self.initial:g}"
        direction = ", reverse" if self.schedule_reverse else ""
        return (
            f"alpha={self.mode}, steps={self.schedule_steps}, min={self.alpha_min:g}, max={self.alpha_max:g}{direction}"
        )


# --- gate activations g ------------------------------------------------------------------------
class Swish(nn.Module):
    """x·σ(βx); β fixed (a buffer) or learnable (a scalar parameter)."""

    def __init__(self, beta: float = 1.0, learnable: bool = False):
        super().__init__()
        if learnable:
            self.beta = nn.Parameter(torch.tensor(float(beta)))
        else:
            self.register_buffer("beta", torch.tensor(float(beta)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.beta * x)


class Lambda(nn.Module):
    """Wraps a plain callable (e.g. torch.tanh) as a module for paUnit."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)

    def extra_repr(self) -> str:
        return getattr(self.fn, "__name__", repr(self.fn))


def _resolve_activation(activation) -> nn.Module:
    """paUnit's activation: an nn.Module, a callable, or the name of a torch.nn.functional / torch function."""
    if isinstance(activation, nn.Module):
        return activation
    if isinstance(activation, str):
        fn = getattr(F, activation, None) or getattr(torch, activation, None)
        if not callable(fn):
            raise ValueError(f"activation={activation!r} is not a function in torch.nn.functional or torch")
        return Lambda(fn)
    if callable(activation):
        return Lambda(activation)
    raise ValueError(f"paUnit needs activation= (an nn.Module, a callable or a function name), got {activation!r}")


# --- the unit ----------------------------------------------------------------------------------
class PaGatingUnit(nn.Module):
    """out = v(A(x)) ⊙ AlphaGate(GateNorm(g(B(x)))); v is the identity, or tanh for paGTU."""

    def __init__(
        self,
        name: str,
        d_in: int,
        d_out: int,
        activation: nn.Module,
        alpha_gate: AlphaGate,
        *,
        bias: bool = True,
        gate_norm: bool = False,
        value_tanh: bool = False,
    ):
        super().__init__()
        self.name = name
        self.value_tanh = value_tanh
        self.value_proj = nn.Linear(d_in, d_out, bias=bias)
        self.gate_proj = nn.Linear(d_in, d_out, bias=bias)
        self.activation = activation
        self.gate_norm = nn.LayerNorm(d_out) if gate_norm else nn.Identity()
        self.alpha_gate = alpha_gate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        value = self.value_proj(x)
        if self.value_tanh:
            value = torch.tanh(value)
        gate = self.gate_norm(self.activation(self.gate_proj(x)))
        return value * self.alpha_gate(gate)

    @property
    def alpha(self) -> torch.Tensor:
        return self.alpha_gate.alpha

    @property
    def scheduled(self) -> bool:
        return self.alpha_gate.scheduled

    def set_step(self, step: int) -> None:
        self.alpha_gate.set_step(step)

    def extra_repr(self) -> str:
        return f"{self.name}"


def make_unit(
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
) -> PaGatingUnit:
    """Build a paGating unit by name.

    Unit-specific options are ignored by the other units (so one `unit_options` works across a sweep of unit
    names): `approximate` ("none" | "tanh") is paGELU's, `beta`/`learnable_beta` are paSwishU's. `activation` is
    paUnit's and an error anywhere else, since it would contradict the name.
    """
    check_unit(name, approximate, activation)
    if name == "paUnit":
        g = _resolve_activation(activation)
    elif name == "paSwishU":
        g = Swish(beta, learnable=learnable_beta)
    elif name == "paGELU":
        g = nn.GELU(approximate=approximate)
    else:
        g = {"paGLU": nn.Sigmoid, "paGTU": nn.Sigmoid, "paReGLU": nn.ReLU, "paSiLU": nn.SiLU, "paMishU": nn.Mish}[
            name
        ]()
    alpha_gate = AlphaGate(
        alpha,
        alpha_init=alpha_init,
        schedule_steps=schedule_steps,
        schedule_reverse=schedule_reverse,
        alpha_min=alpha_min,
        alpha_max=alpha_max,
    )
    return PaGatingUnit(name, d_in, d_out, g, alpha_gate, bias=bias, gate_norm=gate_norm, value_tanh=name == "paGTU")


# --- finding units in a model ------------------------------------------------------------------
def iter_units(module: nn.Module) -> Iterator[tuple[str, PaGatingUnit]]:
    """(qualified name, unit) for every paGating unit inside `module`, in registration order."""
    for name, child in module.named_modules():
        if isinstance(child, PaGatingUnit):
            yield name, child


def set_alpha_step(module: nn.Module, step: int) -> None:
    """Advance every scheduled unit inside `module` to `step` (fixed and learnable units are left alone)."""
    for _, unit in iter_units(module):
        if unit.scheduled:
            unit.set_step(step)


def alpha_values(module: nn.Module) -> dict[str, float]:
    """Current α of every unit, keyed by qualified module name; one host sync for all of them."""
    units = list(iter_units(module))
    if not units:
        return {}
    values = torch.stack([unit.alpha.detach().float() for _, unit in units]).tolist()
    return {name: value for (name, _), value in zip(units, values)}


__all__ = [
    "ALPHA_MODES",
    "UNIT_NAMES",
    "AlphaGate",
    "PaGatingUnit",
    "Swish",
    "alpha_values",
    "check_alpha",
    "iter_units",
    "make_unit",
    "scheduled_alpha",
    "set_alpha_step",
]
