"""The hooks sweeplab reads from a family's objects besides Lightning's own API, in one place with their meaning.

A family's data module derives from `FamilyDataModule` (a LightningDataModule) and overrides the hooks it has; its
task derives from `sweeplab.tasks.base.SweepTask`, whose hooks are listed in `TASK_HOOKS` (each defined there with
its default). The engine reads the hooks through this module's functions, never by a name of its own.

Data module (every one optional):
- `path`: the file or directory the user pointed `data.path` at; None when the module makes or finds its own;
- `data_path()`: the file or directory the module trains on, prepared on first use (a demo set is written there the
  first time); what the run records as its MLflow dataset. None: the data lives in memory (synthetic data);
- `steps_per_batch`: set it (to 1, in `__init__`) when the module can serve the rows of k optimizer steps as one
  batch (`steps_per_batch=k`, with batches on the device); the plan then sets it to k. Absent: refused;
- `shape_warmup_batches(num_batches)`: one batch of every shape the first `num_batches` training batches will have,
  which the timer runs once before timing (a new shape costs a one-off compile or autotune); None: one shape only;
- `device`: the torch device the training batches live on, set before `setup` when batches are kept on the device.

Task (`SweepTask`): `training_loss(batch)` (required), `loss_config` (the loss settings: what the MLX port trains
with), `tokens_in` / `flops_in` (a batch's tokens and FLOPs for tokens/s and MFU), `extra_callbacks()`,
`warm_up_shapes(batches, passes)`, `summary_metrics(trainer)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import lightning as L

TASK_HOOKS = ("training_loss", "tokens_in", "flops_in", "extra_callbacks", "warm_up_shapes", "summary_metrics")


class FamilyDataModule(L.LightningDataModule):
    """A family's data module: Lightning's, plus the optional hooks the engine reads (see the module's docstring)."""

    path: str | None = None
    # one batch of every training shape, or None: the batches have one shape (a method in a module that has more)
    shape_warmup_batches: ClassVar[Any] = None
    steps_per_batch: int  # declared, not set: only a module that sets it serves several steps per batch

    def data_path(self) -> Path | None:
        """The file or directory the module trains on, prepared on first use; None: the data lives in memory."""
        return Path(self.path) if self.path is not None else None


def training_data_path(datamodule: Any) -> Path | None:
    """The existing file or directory a data module trains on (what the run records as its dataset); None: none."""
    if hasattr(datamodule, "data_path"):
        path = datamodule.data_path()
    else:  # a data module that does not derive from FamilyDataModule: its `path`, when it has one
        path = getattr(datamodule, "path", None)
    return Path(path) if path is not None and Path(path).exists() else None


def serves_steps_per_batch(datamodule: Any) -> bool:
    """Whether the module can serve the rows of several optimizer steps as one batch (`steps_per_batch` hook)."""
    return hasattr(datamodule, "steps_per_batch")


__all__ = ["TASK_HOOKS", "FamilyDataModule", "serves_steps_per_batch", "training_data_path"]
