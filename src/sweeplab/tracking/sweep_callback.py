"""Sweep-level MLflow bookkeeping as a Hydra callback: one parent run per multirun, the report at the end.

Runs in the process that launches the sweep, before any job starts: the store is initialised once here, so parallel
jobs never race to create a fresh sqlite schema.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from sweeplab.tracking import mlflow_store

log = logging.getLogger(__name__)
FAILED_JOBS = 0  # failed jobs of the last sweep in this process: `sweeplab.train` exits non-zero when > 0


class MLflowSweepCallback(Callback):
    def __init__(self, print_report: bool = True) -> None:
        self.print_report = print_report
        self.parent_run_id: str | None = None

    def _settings(self, config: DictConfig) -> tuple[str, str, bool]:
        logger = config.get("logger") or {}
        return (
            mlflow_store.resolve_uri(logger.get("tracking_uri")),
            logger.get("experiment_name", "sweeplab"),
            bool(logger.get("enabled", True)),
        )

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        uri, experiment, enabled = self._settings(config)
        if not enabled:
            return
        experiment_id = mlflow_store.init_store(uri, experiment)
        sweep_dir = Path(config.hydra.sweep.dir)
        client = mlflow_store._client(uri)
        run = client.create_run(
            experiment_id,
            run_name=f"sweep {sweep_dir.parent.name}/{sweep_dir.name}",
            tags={"sweeplab.role": "sweep", "sweep_id": sweep_dir.name, "sweep_dir": str(sweep_dir)},
        )
        self.parent_run_id = run.info.run_id
        os.environ[mlflow_store.PARENT_RUN_ENV] = self.parent_run_id
        mlflow_store.write_text_atomic(sweep_dir / "mlflow_parent_run_id", self.parent_run_id)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.parent_run_id is None:
            return
        from sweeplab.report import sweep_report

        uri, _, _ = self._settings(config)
        client = mlflow_store._client(uri)
        status = "FINISHED"
        try:
            report = sweep_report(uri, self.parent_run_id, Path(config.hydra.sweep.dir))
            if self.print_report:
                print(report.markdown, flush=True)
            for path in report.files:
                client.log_artifact(self.parent_run_id, str(path), "report")
            if report.failed:
                global FAILED_JOBS
                FAILED_JOBS = report.failed
                status = "FAILED"
                client.set_tag(self.parent_run_id, "failed_jobs", str(report.failed))
        finally:
            client.set_terminated(self.parent_run_id, status)
            os.environ.pop(mlflow_store.PARENT_RUN_ENV, None)
