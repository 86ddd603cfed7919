"""paGating language model: a GPT-2-style decoder whose MLP is a gated-activation unit with a fixed, learnable or
scheduled α, trained on next-token cross-entropy.

The package: `task.py` (loss, validation perplexity), `data.py` (raw text -> BPE -> cached token memmap -> packed
blocks), `alpha.py` (the callback stepping a scheduled α). The model is `sweeplab.models.gpt` with the units of
`sweeplab.models.pagating` (plain torch, also used by the export).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from sweeplab.config import build, build_sized
from sweeplab.errors import ConfigError
from sweeplab.families import ExportSpec, Family, name_value


def _model_config(values: Mapping[str, Any]):
    from sweeplab.models.gpt import SIZES, GPTConfig

    return build_sized(GPTConfig, {**SIZES, "default": SIZES["small"]}, values, "model")


def _datamodule(values: Mapping[str, Any], model_config):
    from sweeplab.families.pagating_lm.data import LMDataModule

    return build(LMDataModule, {**values, "block_size": model_config.block_size}, "data")


def _fit_model_to_data(model_config, dm, model_values: Mapping[str, Any]):
    if model_values.get("vocab_size") is not None and model_values["vocab_size"] < dm.vocab_size:
        raise ConfigError(
            "model.vocab_size", f"{model_values['vocab_size']} is smaller than the tokenizer's {dm.vocab_size}"
        )
    return replace(model_config, vocab_size=model_values.get("vocab_size") or dm.vocab_size)


def _task(model_config, loss_values: Mapping[str, Any], optim):
    from sweeplab.families.pagating_lm.task import LMTask

    return LMTask(model_config, optim)


def _model_config_from_dict(values: Mapping[str, Any]):
    from sweeplab.models.gpt import GPTConfig

    return GPTConfig(**values)


def _model(config):
    from sweeplab.models.gpt import GPT

    return GPT(config)


def _name_parts(cfg) -> dict[str, str]:
    m = cfg.model
    ffn = {"model.unit": f"unit={m.unit}", "model.alpha": f"a={name_value(m.alpha)}"} if m.ffn == "pagating" else {}
    return {
        "model.ffn": f"ffn={m.ffn}" if m.ffn != "pagating" else "",
        **ffn,
        "optim.lr": f"lr={name_value(cfg.optim.lr)}",
        "data.batch_size": f"bs={cfg.data.batch_size}",
    }


def _export_rows(path, vocab_size: int, seq_len: int, max_rows: int):
    from sweeplab.families.pagating_lm.data import token_file_rows

    return token_file_rows(path, vocab_size, seq_len, max_rows)


def _mlx_model(config):
    from sweeplab.families.pagating_lm.mlx_model import build_mlx_model

    return build_mlx_model(config)


FAMILY = Family(
    "pagating_lm",
    monitor="val/ppl",
    monitor_mode="min",
    build_model_config=_model_config,
    build_datamodule=_datamodule,
    build_task=_task,
    fit_model_to_data=_fit_model_to_data,
    name_parts=_name_parts,
    model_config_from_dict=_model_config_from_dict,
    build_model=_model,
    report_params=("model.unit", "model.alpha", "optim.lr"),
    report_metric=("val/ppl", "val ppl"),
    build_mlx_model=_mlx_model,
    export=ExportSpec("logits", "block_size", "next-token logits (B, S, vocab)", real_rows=_export_rows),
)
