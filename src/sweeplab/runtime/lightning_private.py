"""Every read or write of Lightning's private state, in one place (Lightning 2.6; tests/test_lightning_private.py
fails when an upgrade renames or re-means any of it).

Lightning has no public call for three things sweeplab needs:
- the step a training batch's metrics are logged at (`self.log` and the loggers count in it; `global_step` counts
  optimizer steps, which differ under gradient accumulation and several steps per batch);
- telling the loop that a batch ran several optimizer steps (steps_per_batch: the task stepped the torch optimizer
  itself, or a CUDA graph replay did);
- whether a validation runs right after the current training batch (the periodic checkpoint defers to it, as
  Lightning's own ModelCheckpoint does).

Loops outside Lightning (the MLX loop) never touch these: they hand the timer their step themselves.
"""

from __future__ import annotations

import lightning as L


def logging_step(trainer: L.Trainer) -> int:
    """The step Lightning logs the current training batch's metrics at (one per batch that stepped the optimizer)."""
    return trainer.fit_loop.epoch_loop._batches_that_stepped


def count_optimizer_steps(trainer: L.Trainer, steps: int) -> None:
    """Tell Lightning that `steps` optimizer steps ran in this training batch. global_step is the manual-optimization
    step counter, which LightningOptimizer.step() advances by one per call; the logging step advances by one per
    batch after the batch ends, so it gets the other `steps - 1` here."""
    loop = trainer.fit_loop.epoch_loop
    progress = loop.manual_optimization.optim_step_progress
    for _ in range(steps):
        progress.increment_ready()
        progress.increment_completed()
    loop._batches_that_stepped += steps - 1


def validates_after_this_batch(trainer: L.Trainer) -> bool:
    """Lightning's own decision, asked the moment it is final: the training loop calls the same function right after
    the on_train_batch_end hooks."""
    fit_loop = trainer.fit_loop
    return bool(fit_loop.epoch_loop._should_check_val_fx(fit_loop._data_fetcher))


__all__ = ["count_optimizer_steps", "logging_step", "validates_after_this_batch"]
