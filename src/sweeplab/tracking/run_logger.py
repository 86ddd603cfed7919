"""The Lightning logger of a job's MLflow run: metric writes held out of the timed steps, asynchronous writes that a
checkpoint waits for, and a resumed run that logs each step once.

Imported when a tracked job starts (it imports MLflow, which costs seconds; a config error should not wait for it).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

from lightning.pytorch import Callback
from lightning.pytorch.loggers import MLFlowLogger

from sweeplab.core import wall
from sweeplab.runtime.lightning_private import logging_step
from sweeplab.tracking import mlflow_store, runs

log = logging.getLogger(__name__)


HOLD_S = 30.0  # longest a metric point waits in the process before it is sent to the store


class _PendingWritesClient:
    """The store's MlflowClient (mlflow_store.client), holding metric writes until the next pause in training and
    keeping the handles of its asynchronous writes so they can be waited for; everything else goes to the client as
    it is.

    Held, because a write costs the training process host time even when MLflow's thread does it (building the
    batch, then that thread's SQLAlchemy work holding the interpreter lock): a timed window that sends its numbers
    slows the windows after it. On an H100, TextBridge's bs32 CUDA-graph job, whose host barely keeps ahead of the
    GPU, timed 16,900 samples/s sending its window numbers as they came and 20,150 with none sent during the timed
    steps (BENCHMARKS.md). Points are sent together when the job pauses (after a validation, before a checkpoint,
    at the end of fit: `send_held`, `wait_for_writes`), or once the oldest has waited `HOLD_S`; each keeps the
    timestamp of its logging.

    MLflow's own flush (the store's `flush_async_logging`) restarts its writer thread and waits up to a second for
    it to notice; waiting for the writes themselves takes as long as they do."""

    def __init__(self, tracking_uri: str, hold_s: float = HOLD_S, clock=time.monotonic):
        self._client = mlflow_store.client(tracking_uri)
        self.pending = []
        self.held: list[tuple[str, list, dict]] = []  # (run id, metrics, log_batch keywords) not sent yet
        self._hold_s = hold_s
        self._clock = clock
        self._held_since: float | None = None

    def __getattr__(self, name: str):
        if name == "_client":  # not set yet (a copy being built): no endless lookup
            raise AttributeError(name)
        return getattr(self._client, name)

    def log_batch(self, run_id: str, metrics=(), params=(), tags=(), **kwargs):
        if metrics and not params and not tags:  # what the logger sends at training steps: held
            self.held.append((run_id, list(metrics), kwargs))
            now = self._clock()
            if self._held_since is None:
                self._held_since = now
            elif now - self._held_since >= self._hold_s:
                self.send_held()
            return None
        return self._send(run_id, metrics=metrics, params=params, tags=tags, **kwargs)

    def _send(self, run_id: str, **kwargs):
        operation = self._client.log_batch(run_id, **kwargs)
        if operation is not None:  # synchronous=False: a RunOperations handle
            self.pending.append(operation)
        return operation

    def send_held(self) -> None:
        """Send the held metric points, in as few writes as MLflow takes (1,000 metrics each)."""
        held, self.held, self._held_since = self.held, [], None
        batches: dict[tuple, list] = defaultdict(list)
        for run_id, metrics, kwargs in held:
            batches[(run_id, tuple(sorted(kwargs.items())))].extend(metrics)
        for (run_id, kwargs), metrics in batches.items():
            for start in range(0, len(metrics), 1000):
                self._send(run_id, metrics=metrics[start : start + 1000], **dict(kwargs))

    def wait_for_writes(self) -> None:
        """Return once every write so far is done, held points included. A write that failed (MLflow already logged
        its error) is named in one warning; training goes on: a lost metric point is not worth a lost run."""
        self.send_held()
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
        self.checkpointed_step = -1  # the last logging step a checkpoint covers (MetricsStoredAtCheckpoint)

    @wall.charged_to("mlflow")
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if self.already_logged and step is not None:
            metrics = {k: v for k, v in metrics.items() if step not in self.already_logged.get(k, ())}
            if not metrics:
                return
        super().log_metrics(metrics, step)
        if step is not None and step <= self.checkpointed_step:
            # a step the last checkpoint covers (Lightning logs a batch's metrics after the checkpoint that batch
            # wrote): a run killed now resumes after it and would never log it again. Stored now, and waited for:
            # the checkpoint paused the timer until the next batch, so neither this process's share of the write
            # nor MLflow's thread doing the rest runs inside a timed step (sent and left to that thread, the
            # write slowed the next batch of a CPU job by a quarter)
            self.wait_for_writes()

    @wall.charged_to("mlflow")
    def wait_for_writes(self) -> None:
        self._mlflow_client.wait_for_writes()

    def log_files(self, paths: list[Path], artifact_path: str) -> None:
        """Files as the run's artifacts under `artifact_path` (the phase profiler's table and trace)."""
        runs.log_artifacts(self._tracking_uri, self.run_id, paths, artifact_path)

    @wall.charged_to("mlflow")
    def send_held(self) -> None:
        self._mlflow_client.send_held()

    def finalize(self, status: str = "success") -> None:
        """Lightning calls this when fit ends and MLFlowLogger would end the run there (FINISHED or FAILED). The
        job goes on (final validation, summary, export), and its JobRun ends the run with the status of the whole
        job; here only the writes are waited for."""
        self.wait_for_writes()


class MetricsStoredAtCheckpoint(Callback):
    """Make every metric logged so far durable before a checkpoint is written, and send the held ones after each
    validation (a pause in the timed steps: the timer's clock restarts at the next training batch).

    With `logger.async_logging` metrics sit in MLflow's queue until its threads write them. A run killed with
    points still queued, and resumed from a checkpoint saved after those steps, would never log them again: a
    hole in the run's curves. Waiting for those writes while the checkpoint is assembled (before its file exists)
    closes that: whatever a checkpoint covers is already in the store.
    """

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        for logger in trainer.loggers:
            if isinstance(logger, ResumingMLFlowLogger):
                logger.wait_for_writes()
                logger.checkpointed_step = logging_step(trainer)

    def on_validation_end(self, trainer, pl_module) -> None:
        for logger in trainer.loggers:
            if isinstance(logger, ResumingMLFlowLogger):
                logger.send_held()


def logged_steps(uri: str, run_id: str) -> dict[str, set[int]]:
    """Metric key -> the steps logged in the run so far."""
    return {key: {m.step for m in runs.metric_history(uri, run_id, key)} for key in mlflow_store.read_run(uri, run_id).metrics}
