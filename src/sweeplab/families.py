"""The model families sweeplab trains, and how each one's config groups become objects.

`model.family` picks an entry; everything family-specific that the training app needs is here, once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Callable

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
    run_name: Callable[[Any], str]  # what differs between jobs, readable in the MLflow compare view
    build_task_config: Callable[[Mapping[str, Any]], Any] | None = None  # the `loss` group, checked up front


# --- TextBridge ------------------------------------------------------------------------------------
def _textbridge_model(values: Mapping[str, Any]):
    from sweeplab.models.textbridge import SIZES, TextBridgeConfig

    return build_sized(TextBridgeConfig, SIZES, values, "model")


def _textbridge_data(values: Mapping[str, Any], model_config) -> L.LightningDataModule:
    from sweeplab.data.textbridge import TextBridgeDataModule

    return build(TextBridgeDataModule, {**values, "max_len": model_config.max_len}, "data")


def _textbridge_fit(model_config, dm, model_values: Mapping[str, Any]) -> Any:
    vocab = dm.vocab_size
    if model_values.get("vocab_size") is not None:  # the user chose a vocabulary: every id must fit in it
        vocab = model_config.vocab_size
        dm.check_vocab(vocab)
    if dm.target_dim != model_config.out_dim:
        raise ConfigError(
            "model.out_dim",
            f"is {model_config.out_dim} but the targets in {dm.source_path} have {dm.target_dim} dimensions; "
            f"set model.out_dim={dm.target_dim}",
        )
    return replace(model_config, vocab_size=vocab)


def _textbridge_loss(values: Mapping[str, Any]):
    from sweeplab.tasks.textbridge import LossConfig

    return build(LossConfig, values, "loss")


def _textbridge_task(model_config, loss_values: Mapping[str, Any], optim: OptimConfig) -> SweepTask:
    from sweeplab.tasks.textbridge import TextBridgeTask

    return TextBridgeTask(model_config, _textbridge_loss(loss_values), optim)


def _textbridge_name(cfg) -> str:
    return f"textbridge bs={cfg.data.batch_size} a={cfg.loss.alpha:g} b={cfg.loss.beta:g}"


FAMILIES: dict[str, Family] = {
    "textbridge": Family(
        "textbridge",
        _textbridge_model,
        _textbridge_data,
        _textbridge_fit,
        _textbridge_task,
        _textbridge_name,
        build_task_config=_textbridge_loss,
    ),
}


def get_family(name: str) -> Family:
    if name not in FAMILIES:
        raise ConfigError("model.family", f"unknown family {name!r}; accepted: {', '.join(FAMILIES)}")
    return FAMILIES[name]
