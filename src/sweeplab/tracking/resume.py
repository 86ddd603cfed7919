"""Resuming a run: find the interrupted run of the same configuration and the checkpoint it left."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sweeplab.errors import UserError
from sweeplab.tracking import mlflow_store

CONFIG_HASH_TAG = "sweeplab.config_hash"
IGNORED_KEYS = ("resume",)


def config_hash(container: Mapping[str, Any]) -> str:
    """A stable hash of what the job trains (the resume setting itself excluded)."""
    relevant = {k: v for k, v in container.items() if k not in IGNORED_KEYS}
    return hashlib.sha256(json.dumps(relevant, sort_keys=True, default=str).encode()).hexdigest()[:16]


def find_interrupted_run(uri: str, experiment_name: str, cfg_hash: str) -> tuple[str, Path]:
    """(run id, last checkpoint) of the newest unfinished run with this configuration."""
    client = mlflow_store._client(uri)
    experiment = client.get_experiment_by_name(experiment_name)
    runs = []
    if experiment is not None:
        runs = client.search_runs(
            [experiment.experiment_id],
            filter_string=f"tags.`{CONFIG_HASH_TAG}` = '{cfg_hash}' and attributes.status != 'FINISHED'",
            order_by=["attributes.start_time DESC"],
            max_results=20,
        )
    for run in runs:
        ckpt = Path(run.data.tags.get("output_dir", "")) / "checkpoints" / "last.ckpt"
        if ckpt.is_file():
            return run.info.run_id, ckpt
    raise UserError(
        f"resume=true: no interrupted run with this configuration and a last checkpoint in {uri} "
        f"(experiment {experiment_name!r}); pass resume=PATH/TO/last.ckpt, or drop resume to start afresh"
    )


def checkpoint_run_id(ckpt: Path) -> str | None:
    from sweeplab.tasks.checkpoint import read_checkpoint

    return (read_checkpoint(ckpt).get("sweeplab") or {}).get("mlflow_run_id")
