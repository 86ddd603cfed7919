"""A trained model back from its checkpoint, built by the family that trained it (export, report, tests)."""

from __future__ import annotations

from pathlib import Path

from sweeplab.core.errors import ConfigError, UserError
from sweeplab.families import get_family
from sweeplab.tasks.checkpoint import LoadedModel, read_checkpoint


def load_model(path: str | Path, expect_family: str | None = None) -> LoadedModel:
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
    return LoadedModel(family_name, model, model_config, hparams, Path(path), int(checkpoint.get("global_step", 0)),
                       callback_states=checkpoint.get("callbacks") or {})


__all__ = ["load_model"]
