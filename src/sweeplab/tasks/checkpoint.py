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

from sweeplab.errors import ConfigError, UserError
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


def load_model(path: str | Path, expect_family: str | None = None) -> LoadedModel:
    from sweeplab.families import get_family

    checkpoint = read_checkpoint(path)
    hparams = checkpoint["hyper_parameters"]
    family_name = hparams["family"]
    if expect_family and family_name != expect_family:
        raise UserError(f"checkpoint {path}: holds a {family_name} model, expected {expect_family}")
    try:
        family = get_family(family_name)
    except ConfigError as exc:
        raise UserError(f"checkpoint {path}: {exc.problem}") from None
    if family.model_config_from_dict is None or family.build_model is None:
        raise UserError(f"checkpoint {path}: the {family_name} family cannot rebuild its model from a checkpoint "
                        "(its record sets no model_config_from_dict/build_model)")
    model_config = family.model_config_from_dict(hparams["model"])
    model = family.build_model(model_config)
    prefix = "model."
    state = {k[len(prefix) :]: v for k, v in checkpoint["state_dict"].items() if k.startswith(prefix)}
    state = {k.replace("_orig_mod.", ""): v for k, v in state.items()}  # saved from a torch.compile'd module
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise UserError(
            f"checkpoint {path}: weights do not match the {family_name} model it describes "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    model.eval()
    return LoadedModel(family_name, model, model_config, hparams, Path(path), int(checkpoint.get("global_step", 0)))


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoints written to a temporary file and renamed: a kill mid-save never leaves a truncated checkpoint.

    Loading uses weights_only=True: a checkpoint can only hold tensors and plain data, never code.
    """

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        with atomic_write(path) as f:
            torch.save(checkpoint, f)

    def load_checkpoint(self, path, map_location=None, weights_only=None) -> dict:
        return read_checkpoint(path)
