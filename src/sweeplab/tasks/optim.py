"""Optimizers and learning-rate schedules shared by every task."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Annotated

import torch
from annotated_types import Ge, Gt, Interval, Len
from torch import nn

OPTIMIZERS = ("adamw", "adam_l2")


@dataclass
class OptimConfig:
    name: str = "adamw"  # adamw: decoupled decay; adam_l2: the original's decay added to the gradient
    lr: float = 3e-4
    weight_decay: float = 0.01
    betas: Annotated[list[Annotated[float, Interval(ge=0, lt=1)]], Len(2, 2)] = field(
        default_factory=lambda: [0.9, 0.999]
    )
    eps: Annotated[float, Gt(0)] = 1e-8  # 0 divides 0 by 0 for a parameter whose gradient is always 0 (unused ids)
    warmup_steps: int = 50
    # cosine length after warm-up; null: the rest of trainer.max_steps
    decay_steps: Annotated[int, Ge(1)] | None = None
    min_lr: float = 1e-5
    grad_clip: Annotated[float, Ge(0)] | None = 1.0  # global L2 norm; null or 0 disables
    implementation: str = "auto"  # auto | fused | foreach | for_loop (torch's optimizer kernels)

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise ValueError(f"name={self.name!r} is not one of {OPTIMIZERS}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"min_lr must be in [0, lr], got {self.min_lr}")
        if self.implementation not in ("auto", "fused", "foreach", "for_loop"):
            raise ValueError(f"implementation={self.implementation!r} is not one of auto, fused, foreach, for_loop")


def decays(ndim: int) -> bool:
    """Whether weight decay applies to a parameter of `ndim` dimensions (every backend's optimizer asks here)."""
    return ndim >= 2


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices and embeddings; never biases, norm gains or scalars (a learnable alpha or beta)."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if decays(p.ndim) else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def build_optimizer(model: nn.Module, cfg: OptimConfig, capturable: bool = False) -> torch.optim.Optimizer:
    """`capturable`: step counters on the device, so the update can be captured in a CUDA graph (cuda_graph with steps_per_batch > 1)."""
    groups = param_groups(model, cfg.weight_decay)
    if not groups:
        raise ValueError("the model has no trainable parameters (check model.freeze)")
    kwargs = {"lr": cfg.lr, "betas": tuple(cfg.betas), "eps": cfg.eps}
    if capturable:
        kwargs["capturable"] = True
    if cfg.implementation == "fused":
        kwargs["fused"] = True
    elif cfg.implementation == "foreach":
        kwargs["foreach"] = True
    elif cfg.implementation == "for_loop":
        kwargs["foreach"] = False
    optimizer_cls = torch.optim.AdamW if cfg.name == "adamw" else torch.optim.Adam  # Adam adds decay to the grad
    return optimizer_cls(groups, **kwargs)


def lr_at(step: int, cfg: OptimConfig, total_steps: int) -> float:
    """Linear warm-up (max(min_lr, lr·(s+1)/warmup)), then cosine to min_lr, then min_lr."""
    if step < cfg.warmup_steps:
        return max(cfg.min_lr, cfg.lr * (step + 1) / cfg.warmup_steps)
    decay_steps = cfg.decay_steps if cfg.decay_steps is not None else max(1, total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, decay_steps))
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_at(step, cfg, total_steps) / cfg.lr)
