"""A trained model back from its checkpoint, built by the family that trained it (export, report, tests)."""

from __future__ import annotations

from pathlib import Path

import torch

from sweeplab.core.errors import ConfigError, UserError
from sweeplab.families import get_family
from sweeplab.tasks.checkpoint import LoadedModel, read_checkpoint


def load_model(path: str | Path, expect_family: str | None = None) -> LoadedModel:
    checkpoint = read_checkpoint(path)
    hparams = checkpoint.get("hyper_parameters")
    if not isinstance(hparams, dict) or not hparams.get("family") or not isinstance(hparams.get("model"), dict):
        raise UserError(f"checkpoint {path}: holds no model hyperparameters (hyper_parameters.family and .model); "
                        "pass a checkpoint written by sweeplab's training")
    family_name = hparams["family"]
    if expect_family and family_name != expect_family:
        raise UserError(f"checkpoint {path}: holds a {family_name} model, expected {expect_family}")
    try:
        family = get_family(family_name)
    except ConfigError as exc:
        raise UserError(f"checkpoint {path}: {exc.problem}") from None
    if family.model_config is None or family.model is None:
        raise UserError(f"checkpoint {path}: the {family_name} family cannot rebuild its model from a checkpoint "
                        "(its record sets no model_config/model)")
    try:
        model_config = family.rebuild_model_config(hparams["model"])
    except (ConfigError, TypeError, ValueError) as exc:
        raise UserError(f"checkpoint {path}: its model hyperparameters are not a {family_name} model: {exc}") from None
    prefix = "model."
    state = {k[len(prefix) :]: v for k, v in checkpoint["state_dict"].items() if k.startswith(prefix)}
    state = {k.replace("_orig_mod.", ""): v for k, v in state.items()}  # saved from a torch.compile'd module
    _check_shapes(path, family, model_config, state)  # before any memory is taken for the real model
    model = family.make_model(model_config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise UserError(
            f"checkpoint {path}: weights do not match the {family_name} model it describes "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    model.eval()
    return LoadedModel(family_name, model, model_config, hparams, Path(path), int(checkpoint.get("global_step", 0)),
                       callback_states=checkpoint.get("callbacks") or {})


def _check_shapes(path, family, model_config, state) -> None:
    """The model the hyperparameters describe, built on the meta device (no memory: a huge or damaged dimension
    costs nothing here), has a tensor of each saved tensor's shape: one line naming the first that differs."""
    try:
        with torch.device("meta"):
            expected = family.make_model(model_config).state_dict()
    except (TypeError, ValueError, RuntimeError) as exc:
        raise UserError(f"checkpoint {path}: its model hyperparameters build no {family.name} model: {exc}") from None
    for name, tensor in state.items():
        want = expected.get(name)
        if want is not None and tuple(getattr(tensor, "shape", ())) != tuple(want.shape):
            raise UserError(f"checkpoint {path}: tensor model.{name} has shape {tuple(tensor.shape)}, the model its "
                            f"hyperparameters describe needs {tuple(want.shape)} (a damaged or edited checkpoint)")


__all__ = ["load_model"]
