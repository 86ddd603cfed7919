"""The optimizer and learning-rate schedule of tasks/optim.py, in MLX.

- `optim.name=adamw`: torch.optim.AdamW is MLX's AdamW with `bias_correction=True` (MLX's default is off), the same
  update order (decoupled decay, then the bias-corrected Adam step);
- `optim.name=adam_l2`: torch.optim.Adam with weight_decay adds the decay to the gradient after clipping;
- weight decay only where `tasks.optim.decays` says (matrices, embeddings), never on biases, norm gains or
  scalars: MLX's AdamW alone decays every parameter, so the two kinds get two optimizers (`MultiOptimizer`);
- the schedule is MLX operations on the optimizer's step count, so it lives inside `mx.compile`; it is evaluated
  before the count advances, at the same step LambdaLR uses (0 for the first update).
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.optimizers as optim

from sweeplab.tasks.optim import OptimConfig, decays


def lr_schedule(cfg: OptimConfig, total_steps: int):
    """tasks.optim.lr_at as MLX operations: warm-up max(min_lr, lr·(s+1)/warmup), cosine to min_lr, then min_lr."""
    warmup = cfg.warmup_steps
    decay_steps = cfg.decay_steps if cfg.decay_steps is not None else max(1, total_steps - warmup)

    def schedule(step: mx.array) -> mx.array:
        s = step.astype(mx.float32)
        progress = mx.minimum(1.0, (s - warmup) / max(1, decay_steps))
        cosine = cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1.0 + mx.cos(math.pi * progress))
        if warmup == 0:
            return cosine
        return mx.where(s < warmup, mx.maximum(cfg.min_lr, cfg.lr * (s + 1.0) / warmup), cosine)

    return schedule


class AdamL2(optim.Adam):
    """torch.optim.Adam(weight_decay=wd): the decay is added to the gradient (L2), not to the weights."""

    def __init__(self, *args, weight_decay: float = 0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.weight_decay = weight_decay

    def apply_single(self, gradient: mx.array, parameter: mx.array, state: dict) -> mx.array:
        return super().apply_single(gradient + self.weight_decay * parameter, parameter, state)


def _decayed(path: str, array: mx.array) -> bool:
    return decays(array.ndim)


def build_optimizer(cfg: OptimConfig, total_steps: int) -> optim.MultiOptimizer:
    """Two optimizers of one kind: [decayed parameters, the rest]; both on the same schedule and step count."""

    def make(weight_decay: float) -> optim.Optimizer:
        common = dict(learning_rate=lr_schedule(cfg, total_steps), betas=list(cfg.betas), eps=cfg.eps)
        if cfg.name == "adamw":
            return optim.AdamW(**common, weight_decay=weight_decay, bias_correction=True)
        return AdamL2(**common, weight_decay=weight_decay, bias_correction=True)

    return optim.MultiOptimizer([make(cfg.weight_decay), make(0.0)], [_decayed])


__all__ = ["AdamL2", "build_optimizer", "lr_schedule"]
