"""Resuming a run: find the interrupted run of the same configuration, and log without duplicating steps."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback
from lightning.pytorch.loggers import MLFlowLogger

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


class ResumingMLFlowLogger(MLFlowLogger):
    """MLFlowLogger that drops metric points at steps a previous attempt of this run already logged.

    A resumed run repeats the steps between its last checkpoint and the kill; their values are the same (the run
    is deterministic) and already in MLflow, so logging them again would duplicate steps. The check is per step,
    not "after the last logged step": with asynchronous logging MLflow writes batches from several threads, so a
    killed attempt may have stored step 16 but not step 15.
    """

    def __init__(self, *args, already_logged: Mapping[str, set[int]] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.already_logged = dict(already_logged or {})

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if self.already_logged and step is not None:
            metrics = {k: v for k, v in metrics.items() if step not in self.already_logged.get(k, ())}
            if not metrics:
                return
        super().log_metrics(metrics, step)


class MetricsStoredAtCheckpoint(Callback):
    """Make every metric logged so far durable before a checkpoint is written.

    With `logger.async_logging` metrics sit in MLflow's queue until its threads write them. A run killed with
    points still queued, and resumed from a checkpoint saved after those steps, would never log them again: a
    hole in the run's curves. Waiting for the queue while the checkpoint is assembled (before its file exists)
    closes that: whatever a checkpoint covers is already in the store.
    """

    def __init__(self, job: mlflow_store.JobRun):
        self.job = job

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self.job.flush()


def logged_steps(uri: str, run_id: str) -> dict[str, set[int]]:
    """Metric key -> the steps logged in the run so far."""
    client = mlflow_store._client(uri)
    run = client.get_run(run_id)
    return {key: {m.step for m in client.get_metric_history(run_id, key)} for key in run.data.metrics}
