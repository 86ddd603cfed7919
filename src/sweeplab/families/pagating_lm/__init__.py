"""paGating language model: a GPT-2-style decoder whose MLP is a gated-activation unit with a fixed, learnable or
scheduled α, trained on next-token cross-entropy.

The package: `task.py` (loss, validation perplexity), `data.py` (raw text -> BPE -> cached token memmap -> packed
blocks), `alpha.py` (the callback stepping a scheduled α), `ane.py` (the Neural-Engine layout), `mlx_model.py` (the
MLX port). The model is `sweeplab.models.gpt` with the units of `sweeplab.models.pagating` (plain torch, also used
by the export).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from sweeplab.core.errors import ConfigError
from sweeplab.core.records import JOB  # the param key: the config key data.batch_size
from sweeplab.families import ExportSpec, Family


def _fit_model_to_data(model_config, dm, model_values: Mapping[str, Any]):
    if model_values.get("vocab_size") is not None and model_values["vocab_size"] < dm.vocab_size:
        raise ConfigError(
            "model.vocab_size", f"{model_values['vocab_size']} is smaller than the tokenizer's {dm.vocab_size}"
        )
    return replace(model_config, vocab_size=model_values.get("vocab_size") or dm.vocab_size)


def _name_keys(cfg) -> tuple[str, ...]:
    # the unit and its α mean something only for a paGating FFN; the FFN is named only when it is not one
    ffn = ("model.unit", "model.alpha") if cfg.model.ffn == "pagating" else ("model.ffn",)
    return (*ffn, "optim.lr", JOB.batch_size)


FAMILY = Family(
    "pagating_lm",
    monitor="val/ppl",
    monitor_mode="min",
    monitor_range=(1.0, float("inf")),  # a perplexity
    model_config="sweeplab.models.gpt:GPTConfig",
    model="sweeplab.models.gpt:GPT",
    datamodule="sweeplab.families.pagating_lm.data:LMDataModule",
    task="sweeplab.families.pagating_lm.task:LMTask",
    model_keys_for_data=("block_size",),
    default_size="small",
    fit_model_to_data=_fit_model_to_data,
    labels={"model.alpha": "α", "model.unit": "unit", "model.ffn": "ffn"},
    name_keys=_name_keys,
    report_keys=("model.unit", "model.alpha", "optim.lr"),
    mlx_model="sweeplab.families.pagating_lm.mlx_model:build_mlx_model",
    export=ExportSpec(
        "logits", "block_size", "next-token logits (B, S, vocab)",
        real_rows="sweeplab.families.pagating_lm.data:token_file_rows",
        ane_layout="sweeplab.families.pagating_lm.ane:ANEGPT",
    ),
)
