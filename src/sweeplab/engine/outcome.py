"""A job's outcome as it returns it to its sweeper (sweeplab.core.outcome.JobOutcome): plain, no training framework,
so a test reads a run back as a job does without importing one."""

from __future__ import annotations

from sweeplab.core.outcome import JobOutcome, Validation
from sweeplab.core.place import JobPlace
from sweeplab.core.records import JobRun
from sweeplab.tracking import runs


def recorded_outcome(uri: str, run_id: str, objective: float | None) -> JobOutcome:
    """The outcome of the ended run `run_id`: its record and its monitored metric's history, as the report reads them
    (two reads, in the job's process)."""
    run = runs.fetch(uri, run_id)
    record = JobRun.from_run(run)
    history = tuple(Validation(m.step, m.value, m.timestamp_ms)
                    for m in runs.metric_history(uri, run_id, record.monitor)) if record.monitor else ()
    return JobOutcome(run.status, objective, record.config_index, record.replicate, record.round, record.stop_reason,
                      run_id, run.experiment_id, run.start_ms, run.end_ms, dict(run.params), dict(run.tags),
                      dict(run.metrics), record.monitor, history)


def failed_outcome(exc: BaseException, place: JobPlace) -> JobOutcome:
    """What a sweep job that failed returns (sweeplab.engine.training.record_failed_job recorded its FAILED run)."""
    return JobOutcome("FAILED", None, place.config_index, place.replicate, place.round,
                      run_id=getattr(exc, "sweeplab_run_id", None))

