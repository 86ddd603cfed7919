"""TextBridge: a TCN text encoder distilled onto a teacher's sentence embeddings (loss α·(1−cos) + β·MSE).

The package: `task.py` (loss, metrics, the frozen-trunk cache), `data.py` (the data module), `formats.py` (EFB1 and
JSONL), `teacher.py` and `prepare.py` (the offline demo set, `python -m sweeplab.families.textbridge.prepare`).
The model itself is `sweeplab.models.textbridge` (plain torch, also used by the export).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from sweeplab.config import build, build_sized
from sweeplab.errors import ConfigError
from sweeplab.families import ExportSpec, Family, name_value


def _model_config(values: Mapping[str, Any]):
    from sweeplab.models.textbridge import SIZES, TextBridgeConfig

    return build_sized(TextBridgeConfig, SIZES, values, "model")


def _datamodule(values: Mapping[str, Any], model_config):
    from sweeplab.families.textbridge.data import TextBridgeDataModule

    return build(TextBridgeDataModule, {**values, "max_len": model_config.max_len}, "data")


def _fit_model_to_data(model_config, dm, model_values: Mapping[str, Any]):
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


def _loss_config(values: Mapping[str, Any]):
    from sweeplab.families.textbridge.task import LossConfig

    return build(LossConfig, values, "loss")


def _task(model_config, loss_values: Mapping[str, Any], optim):
    from sweeplab.families.textbridge.task import TextBridgeTask

    return TextBridgeTask(model_config, _loss_config(loss_values), optim)


def _model_config_from_dict(values: Mapping[str, Any]):
    from sweeplab.models.textbridge import TextBridgeConfig

    return TextBridgeConfig(**values)


def _model(config):
    from sweeplab.models.textbridge import TextBridgeEncoder

    return TextBridgeEncoder(config)


def _name_parts(cfg) -> dict[str, str]:
    return {
        "data.batch_size": f"bs={cfg.data.batch_size}",
        "loss.alpha": f"a={name_value(cfg.loss.alpha)}",
        "loss.beta": f"b={name_value(cfg.loss.beta)}",
    }


def _export_rows(path, vocab_size: int, seq_len: int, max_rows: int):
    from sweeplab.families.textbridge.formats import token_rows

    return token_rows(path, max_rows)


def _mlx_model(config):
    from sweeplab.families.textbridge.mlx_model import build_mlx_model

    return build_mlx_model(config)


FAMILY = Family(
    "textbridge",
    monitor="val/cos",
    monitor_mode="max",
    build_model_config=_model_config,
    build_datamodule=_datamodule,
    build_task=_task,
    check_loss=_loss_config,
    fit_model_to_data=_fit_model_to_data,
    name_parts=_name_parts,
    model_config_from_dict=_model_config_from_dict,
    build_model=_model,
    report_params=("loss.alpha", "loss.beta"),
    report_metric=("val/cos", "val cos"),
    build_mlx_model=_mlx_model,
    export=ExportSpec("embedding", "max_len", "sentence embedding (B, out_dim)", real_rows=_export_rows),
)
