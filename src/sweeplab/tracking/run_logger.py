"""The Lightning logger of a job's MLflow run: asynchronous writes that a checkpoint waits for, and a resumed run
that logs each step once.

Imported when a tracked job starts (it imports MLflow, which costs seconds; a config error should not wait for it).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from lightning.pytorch import Callback
from lightning.pytorch.loggers import MLFlowLogger

from sweeplab.tracking import mlflow_store

log = logging.getLogger(__name__)


class _PendingWritesClient:
    """The store's MlflowClient (mlflow_store.client), keeping the handles of its asynchronous metric writes so they
    can be waited for; everything else goes to the client as it is.

    MLflow's own flush (the store's `flush_async_logging`) restarts its writer thread and waits up to a second for
    it to notice; waiting for the writes themselves takes as long as they do."""

    def __init__(self, tracking_uri: str):
        self._client = mlflow_store.client(tracking_uri)
        self.pending = []

    def __getattr__(self, name: str):
        if name == "_client":  # not set yet (a copy being built): no endless lookup
            raise AttributeError(name)
        return getattr(self._client, name)

    def log_batch(self, *args, **kwargs):
        operation = self._client.log_batch(*args, **kwargs)
        if operation is not None:  # synchronous=False: a RunOperations handle
            self.pending.append(operation)
        return operation

    def wait_for_writes(self) -> None:
        """Return once every write so far is done. A write that failed (MLflow already logged its error) is named
        in one warning; training goes on: a lost metric point is not worth a lost run."""
        pending, self.pending = self.pending, []
        failed = []
        for operation in pending:
            try:
                operation.wait()
            except Exception as exc:  # MlflowException, or the store's own (a locked sqlite file, a dropped server)
                failed.append(exc)
        if failed:
            log.warning(
                "MLflow could not store %d metric write(s) of this run; their points are missing from its curves "
                "(first error: %s)", len(failed), str(failed[0]).splitlines()[0] if str(failed[0]) else type(failed[0]).__name__,
            )


class ResumingMLFlowLogger(MLFlowLogger):
    """MLFlowLogger that drops metric points at steps a previous attempt of this run already logged, and can wait
    until its asynchronous writes are in the store.

    A resumed run repeats the steps between its last checkpoint and the kill; their values are the same (the run
    is deterministic) and already in MLflow, so logging them again would duplicate steps. The check is per step,
    not "after the last logged step": with asynchronous logging MLflow writes batches from several threads, so a
    killed attempt may have stored step 16 but not step 15.
    """

    def __init__(self, *args, already_logged: Mapping[str, set[int]] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.already_logged = dict(already_logged or {})
        self._mlflow_client = _PendingWritesClient(self._tracking_uri)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if self.already_logged and step is not None:
            metrics = {k: v for k, v in metrics.items() if step not in self.already_logged.get(k, ())}
            if not metrics:
                return
        super().log_metrics(metrics, step)

    def wait_for_writes(self) -> None:
        self._mlflow_client.wait_for_writes()

    def finalize(self, status: str = "success") -> None:
        """Lightning calls this when fit ends and MLFlowLogger would end the run there (FINISHED or FAILED). The
        job goes on (final validation, summary, export), and its JobRun ends the run with the status of the whole
        job; here only the writes are waited for."""
        self.wait_for_writes()


class MetricsStoredAtCheckpoint(Callback):
    """Make every metric logged so far durable before a checkpoint is written.

    With `logger.async_logging` metrics sit in MLflow's queue until its threads write them. A run killed with
    points still queued, and resumed from a checkpoint saved after those steps, would never log them again: a
    hole in the run's curves. Waiting for those writes while the checkpoint is assembled (before its file exists)
    closes that: whatever a checkpoint covers is already in the store.
    """

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        for logger in trainer.loggers:
            if isinstance(logger, ResumingMLFlowLogger):
                logger.wait_for_writes()


def logged_steps(uri: str, run_id: str) -> dict[str, set[int]]:
    """Metric key -> the steps logged in the run so far."""
    client = mlflow_store.client(uri)
    run = client.get_run(run_id)
    return {key: {m.step for m in client.get_metric_history(run_id, key)} for key in run.data.metrics}
