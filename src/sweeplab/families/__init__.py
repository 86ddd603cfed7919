"""The model families sweeplab trains, and how each one's config groups become objects.

`model.family` picks an entry; everything family-specific that the training app needs is here, once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import lightning as L

from sweeplab.config import build, build_sized
from sweeplab.errors import ConfigError
from sweeplab.tasks.base import SweepTask
from sweeplab.tasks.optim import OptimConfig


@dataclass(frozen=True)
class Family:
    name: str
    build_model_config: Callable[[Mapping[str, Any]], Any]
    build_datamodule: Callable[[Mapping[str, Any], Any], L.LightningDataModule]
    # fill in what the data decides (vocabulary, target size); gets the model keys as the user wrote them
    fit_model_to_data: Callable[[Any, L.LightningDataModule, Mapping[str, Any]], Any]
    build_task: Callable[[Any, Mapping[str, Any], OptimConfig], SweepTask]
    # the config keys a run name always shows, as {dotted key: "short=value"} (training.run_name adds the rest)
    name_parts: Callable[[Any], dict[str, str]]
    model_config_from_dict: Callable[[Mapping[str, Any]], Any] | None = None  # from a checkpoint's hparams
    build_model: Callable[[Any], Any] | None = None  # config -> plain nn.Module (export, reference loops)
    build_task_config: Callable[[Mapping[str, Any]], Any] | None = None  # the `loss` group, checked up front
    # config -> the MLX port of build_model's module (backend=mlx); None: the family has no MLX port
    build_mlx_model: Callable[[Any], Any] | None = None


# --- TextBridge ------------------------------------------------------------------------------------
def _textbridge_model(values: Mapping[str, Any]):
    from sweeplab.models.textbridge import SIZES, TextBridgeConfig

    return build_sized(TextBridgeConfig, SIZES, values, "model")


def _textbridge_data(values: Mapping[str, Any], model_config) -> L.LightningDataModule:
    from sweeplab.families.textbridge.data import TextBridgeDataModule

    return build(TextBridgeDataModule, {**values, "max_len": model_config.max_len}, "data")


def _textbridge_fit(model_config, dm, model_values: Mapping[str, Any]) -> Any:
    # the user's vocabulary, else the tokenizer's, else the one the ids imply (bounded); every id must fit in it
    vocab = model_config.vocab_size if model_values.get("vocab_size") is not None else dm.vocab_size
    dm.check_vocab(vocab)
    if dm.target_dim != model_config.out_dim:
        raise ConfigError(
            "model.out_dim",
            f"is {model_config.out_dim} but the targets in {dm.source_path} have {dm.target_dim} dimensions; "
            f"set model.out_dim={dm.target_dim}",
        )
    return replace(model_config, vocab_size=vocab)


def _textbridge_loss(values: Mapping[str, Any]):
    from sweeplab.families.textbridge.task import LossConfig

    return build(LossConfig, values, "loss")


def _textbridge_task(model_config, loss_values: Mapping[str, Any], optim: OptimConfig) -> SweepTask:
    from sweeplab.families.textbridge.task import TextBridgeTask

    return TextBridgeTask(model_config, _textbridge_loss(loss_values), optim)


def _textbridge_config_from_dict(values: Mapping[str, Any]):
    from sweeplab.models.textbridge import TextBridgeConfig

    return TextBridgeConfig(**values)


def _textbridge_build_model(config):
    from sweeplab.models.textbridge import TextBridgeEncoder

    return TextBridgeEncoder(config)


def _textbridge_build_mlx_model(config):
    from sweeplab.families.textbridge.mlx_model import build_mlx_model

    return build_mlx_model(config)


def name_value(value: Any) -> str:
    """A config value as a run name shows it: floats to 4 significant digits (Optuna samples 0.43728190...)."""
    if isinstance(value, float):
        return f"{value:.4g}"
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return str(value) if str(value).lstrip("-").isdigit() else f"{number:.4g}"


def _textbridge_name(cfg) -> dict[str, str]:
    return {
        "data.batch_size": f"bs={cfg.data.batch_size}",
        "loss.alpha": f"a={name_value(cfg.loss.alpha)}",
        "loss.beta": f"b={name_value(cfg.loss.beta)}",
    }


# --- paGating language model ----------------------------------------------------------------------
def _lm_model(values: Mapping[str, Any]):
    from sweeplab.models.gpt import SIZES, GPTConfig

    return build_sized(GPTConfig, {**SIZES, "default": SIZES["small"]}, values, "model")


def _lm_data(values: Mapping[str, Any], model_config) -> L.LightningDataModule:
    from sweeplab.families.pagating_lm.data import LMDataModule

    return build(LMDataModule, {**values, "block_size": model_config.block_size}, "data")


def _lm_fit(model_config, dm, model_values: Mapping[str, Any]) -> Any:
    if model_values.get("vocab_size") is not None and model_values["vocab_size"] < dm.vocab_size:
        raise ConfigError(
            "model.vocab_size", f"{model_values['vocab_size']} is smaller than the tokenizer's {dm.vocab_size}"
        )
    return replace(model_config, vocab_size=model_values.get("vocab_size") or dm.vocab_size)


def _lm_task(model_config, loss_values: Mapping[str, Any], optim: OptimConfig) -> SweepTask:
    from sweeplab.families.pagating_lm.task import LMTask

    return LMTask(model_config, optim)


def _lm_loss(values: Mapping[str, Any]) -> None:
    if values:
        raise ConfigError(f"loss.{next(iter(values))}", "the language model's loss (cross-entropy) takes no settings")


def _lm_config_from_dict(values: Mapping[str, Any]):
    from sweeplab.models.gpt import GPTConfig

    return GPTConfig(**values)


def _lm_build_model(config):
    from sweeplab.models.gpt import GPT

    return GPT(config)


def _lm_build_mlx_model(config):
    from sweeplab.families.pagating_lm.mlx_model import build_mlx_model

    return build_mlx_model(config)


def _lm_name(cfg) -> dict[str, str]:
    m = cfg.model
    ffn = {"model.unit": f"unit={m.unit}", "model.alpha": f"a={name_value(m.alpha)}"} if m.ffn == "pagating" else {}
    return {
        "model.ffn": f"ffn={m.ffn}" if m.ffn != "pagating" else "",
        **ffn,
        "optim.lr": f"lr={name_value(cfg.optim.lr)}",
        "data.batch_size": f"bs={cfg.data.batch_size}",
    }


FAMILIES: dict[str, Family] = {
    "pagating_lm": Family(
        "pagating_lm",
        _lm_model,
        _lm_data,
        _lm_fit,
        _lm_task,
        _lm_name,
        model_config_from_dict=_lm_config_from_dict,
        build_model=_lm_build_model,
        build_task_config=_lm_loss,
        build_mlx_model=_lm_build_mlx_model,
    ),
    "textbridge": Family(
        "textbridge",
        _textbridge_model,
        _textbridge_data,
        _textbridge_fit,
        _textbridge_task,
        _textbridge_name,
        model_config_from_dict=_textbridge_config_from_dict,
        build_model=_textbridge_build_model,
        build_task_config=_textbridge_loss,
        build_mlx_model=_textbridge_build_mlx_model,
    ),
}


def get_family(name: str) -> Family:
    if name not in FAMILIES:
        raise ConfigError("model.family", f"unknown family {name!r}; accepted: {', '.join(FAMILIES)}")
    return FAMILIES[name]
