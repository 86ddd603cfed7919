"""Batch-size search before training: Lightning's batch-size finder as a switch (`tune.batch_size`).

The paGating study's "find optimal batch size" step. Lightning's `Tuner.scale_batch_size` runs a few steps per
trial batch size, doubling (`power`) until a step fails with out-of-memory, then optionally bisects (`binsearch`)
between the last size that fit and the first that did not. It finds the *largest batch that fits*, which on a GPU
is usually also the fastest per sample; on a CPU nothing runs out of memory, so the search stops at `max_val` or
the training set's size (keep `max_trials` small there). The trial steps train nothing: Lightning restores the
weights afterwards, and runs them without our callbacks or loggers. Throughput per batch size is what
`-m data.batch_size=...` sweeps and `make report`'s throughput plot show.

The training app calls `tune_batch_size(trainer, task, datamodule, tune)` right before `trainer.fit`; it returns
the batch size now set on the datamodule (None when tuning is off), which the job records in MLflow.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import lightning as L

log = logging.getLogger(__name__)

MODES = ("power", "binsearch")


@dataclass
class TuneConfig:
    batch_size: bool | str = False  # false | power | binsearch
    init_val: int = 2  # first batch size tried
    max_trials: int = 8  # doublings at most: init_val * 2**max_trials is the largest size tried
    steps_per_trial: int = 3
    max_val: int = 8192  # never try more than this

    def __post_init__(self) -> None:
        if self.batch_size is True:
            self.batch_size = "power"
        if self.batch_size is not False and self.batch_size not in MODES:
            raise ValueError(f"batch_size={self.batch_size!r} is not one of false, power, binsearch")
        for key in ("init_val", "max_trials", "steps_per_trial", "max_val"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")

    @property
    def enabled(self) -> bool:
        return self.batch_size is not False


def tune_batch_size(
    trainer: L.Trainer, task: L.LightningModule, datamodule: L.LightningDataModule, tune: TuneConfig
) -> int | None:
    """Search the batch size with Lightning's finder; sets `datamodule.batch_size` and returns it (None: off)."""
    if not tune.enabled:
        return None
    from lightning.pytorch.tuner import Tuner

    if not hasattr(datamodule, "batch_size"):
        raise ValueError(f"tune.batch_size needs a datamodule with a batch_size attribute; {type(datamodule).__name__} has none")
    before = datamodule.batch_size
    found = Tuner(trainer).scale_batch_size(
        task,
        datamodule=datamodule,
        mode=tune.batch_size,
        init_val=tune.init_val,
        max_trials=tune.max_trials,
        steps_per_trial=tune.steps_per_trial,
        max_val=tune.max_val,
        batch_arg_name="batch_size",
    )
    if found is None:
        log.warning("tune.batch_size=%s found no batch size; keeping data.batch_size=%d", tune.batch_size, before)
        return before
    datamodule.batch_size = found
    log.info("tune.batch_size=%s: data.batch_size %d -> %d", tune.batch_size, before, found)
    return found


__all__ = ["TuneConfig", "tune_batch_size", "MODES"]
