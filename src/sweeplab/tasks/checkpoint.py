"""Loading a trained model back from a sweeplab checkpoint, safely (`weights_only=True`), with clear errors."""

from __future__ import annotations

import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins import TorchCheckpointIO
from torch import nn

from sweeplab.errors import UserError
from sweeplab.files import atomic_write


@dataclass
class LoadedModel:
    family: str
    model: nn.Module  # eval mode, on the CPU, trained weights loaded
    model_config: Any  # the family's config dataclass
    hparams: dict  # everything the task saved: model, loss/optim, ...
    path: Path
    global_step: int


def read_checkpoint(path: str | Path) -> dict:
    """The checkpoint dict; one-line UserErrors for a missing, truncated or foreign file."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint {path}: no such file")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, zipfile.BadZipFile, pickle.UnpicklingError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"checkpoint {path}: not a readable PyTorch checkpoint (truncated or corrupt?): {first}") from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise UserError(f"checkpoint {path}: not a Lightning checkpoint (no state_dict)")
    family = (checkpoint.get("hyper_parameters") or {}).get("family")
    if not family:
        raise UserError(f"checkpoint {path}: not written by sweeplab (no model family in its hyperparameters)")
    return checkpoint


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoints written to a temporary file and renamed: a kill mid-save never leaves a truncated checkpoint.

    Loading uses weights_only=True: a checkpoint can only hold tensors and plain data, never code.
    """

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        with atomic_write(path) as f:
            torch.save(checkpoint, f)

    def load_checkpoint(self, path, map_location=None, weights_only=None) -> dict:
        return read_checkpoint(path)
