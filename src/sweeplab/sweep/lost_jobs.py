"""A sweep job the scheduler ended before it could close its own MLflow run (`scancel`, a time limit, a node failure,
out of memory): recorded as a local job that was stopped or failed would be, so the study's counts, report and
continue command see it.

The sweeplab sweeper calls `record` as soon as its watch sees the job end (sweep/slurm.py). The job's run is found by its scheduler id (tag `slurm_job_id`, written by the job at its start)
and ended KILLED (cancelled, timed out, preempted) or FAILED (any other end) with the scheduler's state in its
`slurm_end` tag (and `error`, where the job could not close its run itself); a job that never started gets a run of that status, nested under the sweep, with its place in the study.
The study (sweep.study.Study.record_lost) counts it: its sweep run ends FAILED, its `lost_jobs` tag names them, and
the continue command is printed.
"""

from __future__ import annotations

import logging
import shlex

from sweeplab.core.records import JobRun, SweepRun
from sweeplab.tracking import mlflow_store, naming, runs

log = logging.getLogger(__name__)

STOPPED_STATES = ("CANCELLED", "TIMEOUT", "PREEMPTED", "DEADLINE", "INTERRUPTED")  # KILLED, as a stopped local job


ENDED_AS = {"CANCELLED": "cancelled", "TIMEOUT": "timed out", "PREEMPTED": "preempted", "DEADLINE": "past their deadline",
            "OUT_OF_MEMORY": "out of memory", "NODE_FAIL": "ended by a node failure"}


def described(states) -> str:
    """What the scheduler did to a study's lost jobs, counted by how each ended: "2 job(s) cancelled", "1 job(s)
    cancelled, 1 job(s) timed out", "1 job(s) ended by the scheduler (FAILED)"."""
    counts: dict[str, int] = {}
    for state in states:
        what = ENDED_AS.get(state, f"ended by the scheduler ({state})")
        counts[what] = counts.get(what, 0) + 1
    return ", ".join(f"{n} job(s) {what}" for what, n in counts.items())


def record(uri: str | None, parent_run_id: str | None, lost, planned=None) -> str | None:
    """Record `lost` (slurm.LostJob) under the sweep run `parent_run_id` of the store `uri`; `planned`
    (replicates.PlannedJob): its place in the study. Returns the run id (None without a store or sweep run). Never
    raises: the other jobs go on. The study that calls this (sweep.study.Study.record_lost) counts it."""
    status = "KILLED" if lost.state in STOPPED_STATES else "FAILED"
    what = f"job {lost.number} (scheduler job {lost.scheduler_id})"
    error = f"{lost.state}: ended by the scheduler (job {lost.scheduler_id})" + (f": {lost.reason}" if lost.reason else "")
    run_id = None
    if uri and parent_run_id:
        try:
            run_id = _record_run(uri, parent_run_id, lost, planned, status, error)
        except Exception as exc:  # bookkeeping: the sweep and its other jobs go on
            log.warning("could not record the lost %s in MLflow: %s", what, exc)
    log.warning("sweep: %s ended %s%s; recorded as %s, the other jobs go on", what, lost.state,
                f" ({lost.reason})" if lost.reason else "", status)
    return run_id


def _record_run(uri: str, parent: str, lost, planned, status: str, error: str) -> str:
    parent_run = runs.fetch(uri, parent)
    own = [r for r in runs.job_runs(uri, parent, parent_run.experiment_id)
           if JobRun.from_run(r).slurm_job_id == lost.scheduler_id]
    for run in own:  # the job's own run: the scheduler's word on why it ended; closed if the job could not
        # (a job given SIGTERM may still close its run itself, with its own `error`, until SLURM's KillWait is over)
        if run.status == "RUNNING":
            mlflow_store.write(uri, run.run_id, JobRun(slurm_end=error, error=error))
            runs.end(uri, run.run_id, status)
        else:
            mlflow_store.write(uri, run.run_id, JobRun(slurm_end=error))
    if own:
        return own[0].run_id
    record = JobRun(
        name=f"job {lost.number} ({lost.state.lower()} before it started)",
        parent_run_id=parent,
        slurm_job_id=lost.scheduler_id,
        slurm_array_index=lost.scheduler_id.partition("_")[2] or None,
        hydra_job=str(lost.number),
        sweep_id=SweepRun.from_run(parent_run).sweep_id or "",
        error=error,
        slurm_end=error,
        description=shlex.join([*naming.TRAIN_COMMAND.split(), *(o for o in lost.overrides if not o.startswith("hydra."))]),
        config_index=planned.config_index if planned is not None else None,
        replicate=planned.replicate if planned is not None else None,
        round=planned.round if planned is not None else None,
    )
    run_id = runs.create(uri, parent_run.experiment_id, record)
    runs.end(uri, run_id, status)
    return run_id
