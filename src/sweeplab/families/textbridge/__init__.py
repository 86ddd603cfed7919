"""TextBridge: a TCN text encoder distilled onto a teacher's sentence embeddings (loss α·(1−cos) + β·MSE).

The package: `task.py` (loss, metrics, the frozen-trunk cache), `data.py` (the data module), `device_batches.py`
(training batches kept on the device), `formats.py` (EFB1 and JSONL), `teacher.py` and `prepare.py` (the offline
demo set, `python -m sweeplab.families.textbridge.prepare`), `ane.py` (the Neural-Engine layout), `bench.py` (the
demo set tiled for the bench), `mlx_model.py` (the MLX port). The model itself is `sweeplab.models.textbridge`
(plain torch, also used by the export).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from sweeplab.core.errors import ConfigError
from sweeplab.core.records import JOB  # the param key: the config key data.batch_size
from sweeplab.families import ExportSpec, Family


def _fit_model_to_data(model_config, dm, model_values: Mapping[str, Any]):
    # the user's vocabulary, else the tokenizer's, else the one the ids imply (bounded); every id must fit in it
    vocab = model_config.vocab_size if model_values.get("vocab_size") is not None else dm.vocab_size
    dm.check_vocab(vocab)
    if model_values.get("out_dim") is None:  # unset: the teacher's embedding size (768 random, 384 MiniLM)
        return replace(model_config, vocab_size=vocab, out_dim=dm.target_dim)
    if dm.target_dim != model_config.out_dim:
        raise ConfigError(
            "model.out_dim",
            f"is {model_config.out_dim} but the targets in {dm.source_path} have {dm.target_dim} dimensions; "
            f"set model.out_dim={dm.target_dim}",
        )
    return replace(model_config, vocab_size=vocab)


FAMILY = Family(
    "textbridge",
    monitor="val/cos",
    monitor_mode="max",
    quality_tolerance=0.01,
    monitor_range=(-1.0, 1.0),  # a cosine  # val/cos: a hundredth of cosine to the teacher (what conf/sweep/default.yaml asked)
    model_config="sweeplab.models.textbridge:TextBridgeConfig",
    model="sweeplab.models.textbridge:TextBridgeEncoder",
    datamodule="sweeplab.families.textbridge.data:TextBridgeDataModule",
    task="sweeplab.families.textbridge.task:TextBridgeTask",
    loss="sweeplab.families.textbridge.task:LossConfig",
    model_keys_for_data=("max_len",),
    resolve_data="sweeplab.families.textbridge.device_batches:resolve_data",
    fit_model_to_data=_fit_model_to_data,
    labels={"loss.alpha": "α", "loss.beta": "β"},
    name_keys=(JOB.batch_size, "loss.alpha", "loss.beta"),
    report_keys=("loss.alpha", "loss.beta"),
    mlx_model="sweeplab.families.textbridge.mlx_model:build_mlx_model",
    bench_data="sweeplab.families.textbridge.bench:bench_data",
    export=ExportSpec(
        "embedding", "max_len", "sentence embedding (B, out_dim)",
        real_rows="sweeplab.families.textbridge.formats:export_rows",
        ane_layout="sweeplab.families.textbridge.ane:ANETextBridge",
    ),
)
