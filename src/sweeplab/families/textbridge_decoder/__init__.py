"""The TextBridge decoder (cube -> text): a small causal transformer that writes a sentence from its teacher (or
TextBridge-encoder) embedding, trained on teacher-forced token cross entropy (`model=textbridge_decoder`).

It trains on TextBridge's own data (the same data module, files and demo set: a sentence's token ids and its
teacher embedding), so everything TextBridge's data does (formats, padding modes, `on_device`, the bench's tiled
data) it does too. The package: `task.py` (loss and validation metrics), `roundtrip.py` (text -> encoder -> cube ->
decoder -> text, `python -m sweeplab.families.textbridge_decoder.roundtrip`), `mlx_model.py` (the MLX port, for
backend=mlx). The model is `sweeplab.models.textbridge_decoder` (plain torch; its `DecoderStep` is what the Core ML
export holds).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from sweeplab.core.errors import ConfigError
from sweeplab.core.records import JOB  # the param key: the config key data.batch_size
from sweeplab.families import ExportSpec, Family

# the tokens that start and end a sentence, when model.bos_id / model.eos_id are unset: BERT's, which both the
# trained demo tokenizer and MiniLM's have
SPECIAL_TOKENS = {"bos_id": "[CLS]", "eos_id": "[SEP]"}


def _special_ids(dm, model_values: Mapping[str, Any]) -> dict[str, int]:
    ids = {}
    for key, token in SPECIAL_TOKENS.items():
        if model_values.get(key) is not None:
            continue
        found = dm.tokenizer.token_id(token) if dm.tokenizer is not None else None
        if found is None:
            raise ConfigError(f"model.{key}", f"is unset and the data's tokenizer has no {token} token "
                              f"({dm.source_path}); set model.bos_id and model.eos_id")
        ids[key] = found
    return ids


def _fit_model_to_data(model_config, dm, model_values: Mapping[str, Any]):
    # the user's vocabulary, else the tokenizer's; the cube's size is the data's embedding size
    vocab = model_config.vocab_size if model_values.get("vocab_size") is not None else dm.vocab_size
    dm.check_vocab(vocab)
    if model_values.get("embed_dim") is not None and model_values["embed_dim"] != dm.target_dim:
        raise ConfigError("model.embed_dim", f"is {model_values['embed_dim']} but the embeddings in {dm.source_path} "
                          f"have {dm.target_dim} dimensions; leave it unset")
    pad = {} if model_values.get("pad_id") is not None else {"pad_id": dm.pad_id}
    try:
        return replace(model_config, vocab_size=vocab, embed_dim=dm.target_dim, **pad, **_special_ids(dm, model_values))
    except ValueError as exc:  # a special id outside the vocabulary
        raise ConfigError("model", str(exc)) from None


def step_inputs(model_config, batch_size: int, rng: np.random.Generator) -> dict[str, tuple[np.ndarray, str]]:
    """`ExportSpec.extra_inputs`: the embedding the decoder step reads (random unit vectors for the checks)."""
    embedding = rng.standard_normal((batch_size, model_config.embed_dim)).astype(np.float32)
    embedding /= np.linalg.norm(embedding, axis=1, keepdims=True)
    return {"embedding": (embedding, f"sentence embedding (the cube), float32 (B, {model_config.embed_dim})")}


FAMILY = Family(
    "textbridge_decoder",
    monitor="val/loss",
    monitor_mode="min",
    monitor_range=(0.0, float("inf")),  # a cross-entropy
    model_config="sweeplab.models.textbridge_decoder:DecoderConfig",
    model="sweeplab.models.textbridge_decoder:TextBridgeDecoder",
    datamodule="sweeplab.families.textbridge.data:TextBridgeDataModule",
    task="sweeplab.families.textbridge_decoder.task:DecoderTask",
    mlx_model="sweeplab.families.textbridge_decoder.mlx_model:build_mlx_model",
    model_keys_for_data=("max_len",),
    default_size="small",
    resolve_data="sweeplab.families.textbridge.device_batches:resolve_data",
    fit_model_to_data=_fit_model_to_data,
    name_keys=(JOB.batch_size,),
    report_keys=("model.size",),
    bench_data="sweeplab.families.textbridge.bench:bench_data",
    export=ExportSpec(
        "logits", "context", "next-token logits (B, vocab) after the last real token of input_ids",
        real_rows="sweeplab.families.textbridge.formats:export_rows",
        module="sweeplab.models.textbridge_decoder:DecoderStep",
        extra_inputs=step_inputs,
    ),
)
