"""The record of a sweep, read from MLflow once: `read_sweep(uri, parent_run_id) -> Sweep`.

Every reader of a study (the verdict, the tables and the CSV, the figures, report.html, the per-configuration runs
and the saved view, `best`, the order check, the sweeper's next round, the scripts) takes a `Sweep` rather than
MLflow runs, and reads it as records: the sweep's run as `Sweep.run` (a `core.records.SweepRun`), each job's as
`JobRecord.run` (a `JobRun`), a job's config values by key as `JobRecord.config_value`. This module is the one
place outside tracking/ that reads a run's `tags`, `params` or `metrics` by key (tests/test_sweep_record.py). Each
fact about a job is derived here, once, with one formula:

- samples seen at a validation: Lightning logs a validation after n optimizer steps at step n - 1
  (`_batches_that_stepped`), so samples seen = (step + 1) × samples per step;
- samples per step: what the job's timer measured (`summary/samples_per_step`), else batch size used × gradient
  accumulation × data-parallel devices from its params (runs recorded before the timer wrote it);
- the batch size used: the job's `data.batch_size_used` tag (a training split smaller than the batch), else
  `data.batch_size`;
- the monitored metric and its direction: the job's own `monitor` / `monitor_mode` tags, else the sweep's `objective`
  tags, else the family's record, else val/loss (min).

The run list is fetched once and each job's history of the monitored metric once.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from sweeplab.core.errors import UserError
from sweeplab.core.records import JOB, JobRun, SweepRun
from sweeplab.families import get_family
from sweeplab.study import verdict
from sweeplab.tracking import mlflow_store, runs
from sweeplab.tracking.mlflow_store import RunRecord


@dataclass(frozen=True)
class JobRecord:
    """One job of a sweep as MLflow recorded it, with what the study derives from it."""

    run_id: str
    name: str
    status: str
    start_ms: int | None
    params: Mapping[str, str]
    tags: Mapping[str, str]
    metrics: Mapping[str, float]
    family: str
    config: str | None  # the configuration's identity (its swept overrides), None outside a replicated sweep
    config_index: int | None
    replicate: int | None
    round: int | None
    host: str | None
    concurrent_jobs: int
    batch_size: str  # the batch size it trained with ('' when unknown)
    samples_per_step: int | None
    samples_per_sec: float | None
    curve: tuple[verdict.ValidationPoint, ...] = ()  # the sweep's monitored metric at each validation
    stop_reason: str | None = None  # stopped early by stop.*: "target" | "behind" (policies/stopping.py)
    stop_step: int | None = None  # optimizer steps done when it stopped
    max_steps: int | None = None  # the steps it would have trained without stopping
    end_ms: int | None = None

    @cached_property
    def run(self) -> JobRun:
        """Its MLflow run as the typed record: every tag, param and metric by its field (`job.run.backend`)."""
        return JobRun.from_run(self)

    def config_value(self, key: str, default: str | None = None) -> str | None:
        """The value of the config key `key` (dotted: `loss.alpha`) the job ran with, as recorded (its params);
        `default` where it recorded none (a job that failed before training records no config)."""
        return self.params.get(key, default)

    @property
    def censored_samples(self) -> float | None:
        """A job stopped behind its round's leader: the samples it saw, a lower bound of its samples to target."""
        if self.stop_reason != "behind" or self.stop_step is None or not self.samples_per_step:
            return None
        return float(self.stop_step * self.samples_per_step)

    @property
    def samples_not_trained(self) -> float:
        """Training samples a stop saved this job (0 for a job that trained all its steps)."""
        if self.stop_step is None or self.max_steps is None or not self.samples_per_step:
            return 0.0
        return float(max(0, self.max_steps - self.stop_step) * self.samples_per_step)

    @property
    def finished(self) -> bool:
        return self.status == "FINISHED"

    @property
    def final_metric(self) -> float | None:
        return self.curve[-1].value if self.curve else None

    def best_metric(self, mode: verdict.Mode) -> float | None:
        """Its best validation in the monitored direction: the value of the checkpoint it keeps (best-step*.ckpt)."""
        if not self.curve:
            return None
        return (max if mode == "max" else min)(p.value for p in self.curve)


@dataclass(frozen=True)
class Sweep:
    """A sweep's jobs in the order they started, its parent run (None for an experiment's runs), and the one metric
    its report judges, plots and tabulates."""

    uri: str | None
    jobs: tuple[JobRecord, ...]
    metric: str = "val/loss"
    mode: verdict.Mode = "min"
    parent: RunRecord | None = None  # the sweep's own run
    families: tuple[str, ...] = field(default=())
    deleted: tuple[RunRecord, ...] = ()  # its job runs deleted in MLflow since (the UI's trash): not in `jobs`

    @cached_property
    def run(self) -> SweepRun:
        """The sweep's own run as the typed record (`sweep.run.sweep_dir`); all fields None where the jobs are an
        experiment's, with no sweep run."""
        return SweepRun.from_run(self.parent) if self.parent is not None else SweepRun()

    @property
    def replicated(self) -> bool:
        """The jobs carry the sweeplab sweeper's configuration and replicate tags."""
        return any(j.config is not None and j.replicate is not None for j in self.jobs)

    def run_again(self) -> frozenset[str]:
        """The runs of FAILED jobs that a continued study then ran again to their end (a full disk at the job's
        start, freed since): superseded, as a KILLED one is, and no failed job of the study. A job that failed
        again, or was never run again, is not among them."""
        finished = {(j.config_index, j.replicate) for j in self.jobs if j.finished and j.config_index is not None}
        return frozenset(j.run_id for j in self.jobs
                         if j.status == "FAILED" and j.config_index is not None and (j.config_index, j.replicate) in finished)

    def config_indices(self) -> dict[str, int]:
        """configuration -> its index in the sweep's grid."""
        return {j.config: j.config_index for j in self.jobs if j.config is not None and j.config_index is not None}

    def verdict_jobs(self) -> list[verdict.Job]:
        """The finished jobs with a throughput, a batch size and replicate tags, as the verdict's records."""
        return [verdict.Job(config=j.config, replicate=j.replicate, round=j.round, samples_per_sec=j.samples_per_sec,
                            final_metric=j.final_metric, curve=list(j.curve), host=j.host,
                            concurrent_jobs=j.concurrent_jobs, censored_samples=j.censored_samples,
                            best_metric=j.best_metric(self.mode), stopped_at_target=j.stop_reason == "target",
                            measured={k: j.metrics[k] for k in verdict.measured_per_job() if k in j.metrics})
                for j in self.jobs
                if j.finished and j.samples_per_sec and j.samples_per_step and j.config is not None
                and j.replicate is not None]

    def stopping_saved(self) -> tuple[float, float, float] | None:
        """(training samples not trained, samples all the finished jobs would have trained to their last step, seconds
        of training not spent) where stop.* stopped jobs; None when no job stopped."""
        stopped = [j for j in self.jobs if j.finished and j.stop_reason]
        if not stopped:
            return None
        trained = [j for j in self.jobs if j.finished and j.max_steps and j.samples_per_step]
        total = float(sum(j.max_steps * j.samples_per_step for j in trained))
        saved = sum(j.samples_not_trained for j in stopped)
        seconds = sum(j.samples_not_trained / j.samples_per_sec for j in stopped if j.samples_per_sec)
        return saved, total, seconds

    def baseline_job(self, baseline: str | None) -> JobRecord | None:
        """The job `--baseline` names, one meaning for the whole report: a row number of the per-job table (digits,
        0-based) or a run-name substring / run-id prefix that picks jobs of a single configuration (the first of
        them). None for None. A name matching jobs of several configurations is refused, as is one matching none.
        The per-job table's speedups are against this job; the verdict's baseline is its configuration."""
        if baseline is None:
            return None
        usable = [j for j in self.jobs if j.samples_per_sec]
        if baseline.isdigit():
            index = int(baseline)
            if index < len(self.jobs) and self.jobs[index].samples_per_sec:
                return self.jobs[index]
            raise UserError(f"--baseline {baseline}: row {index} of the per-job table is not a finished job with a "
                            f"speed; {_rows(usable, self.jobs)}")
        matches = [j for j in usable if baseline in j.name or j.run_id.startswith(baseline)]
        if not matches:
            raise UserError(f"--baseline {baseline!r} matches no finished run with a speed; {_rows(usable, self.jobs)}")
        configs = {j.config for j in matches}
        if self.replicated and len(configs) > 1:
            shown = ", ".join(sorted(str(c) for c in configs))
            raise UserError(f"--baseline {baseline!r} is ambiguous: it matches runs of {len(configs)} configurations "
                            f"({shown}); give a row number or a longer part of one run's name")
        return matches[0]


def _rows(usable: list[JobRecord], jobs: tuple[JobRecord, ...]) -> str:
    names = [f"{jobs.index(j)}: {j.name}" for j in usable]
    return "runs: " + ("; ".join(names[:12]) + ("; ..." if len(names) > 12 else "") if names else "none")


def read_sweep(uri: str, parent_run_id: str) -> Sweep:
    """A sweep's record: its parent run, then its job runs (one search; those deleted in MLflow since set apart in
    `deleted`), then each job's monitored metric (one history each)."""
    parent = runs.fetch(uri, parent_run_id)
    return sweep_from_runs(uri, runs.job_runs(uri, parent_run_id, parent.experiment_id, with_deleted=True),
                           parent=parent)


def read_experiment(uri: str, experiment_name: str) -> Sweep:
    """Every job run of an experiment, as one record (the report's `--experiment`)."""
    found = runs.experiment_runs(uri, experiment_name)
    if found is None:
        raise UserError(f"no MLflow experiment named {experiment_name!r} in {uri}")
    return sweep_from_runs(uri, found)


def sweep_from_runs(uri: str | None, found: Iterable, parent=None,
                    histories: Mapping[tuple[str, str], Sequence] | None = None) -> Sweep:
    """The record of job runs already fetched (a sweep's, an experiment's: RunRecords, or MLflow's runs, which are
    read into them); with `uri` each job's history of the monitored metric is read (once), without it the jobs have
    no curves but those in `histories` ((run id, metric) -> its points, as the jobs returned them to their
    sweeper). Runs that are no job's (a sweep's or a configuration's) are left out; those deleted in MLflow are set
    apart (`Sweep.deleted`)."""
    records = [r if isinstance(r, RunRecord) else mlflow_store.record_of(r) for r in found]
    deleted = tuple(r for r in records if mlflow_store.is_job_run(r) and r.lifecycle_stage == "deleted")
    records = [r for r in records if mlflow_store.is_job_run(r) and r.lifecycle_stage != "deleted"]
    metric, mode = monitored_metric(records)
    jobs = tuple(_job(r, metric, uri, (histories or {}).get((r.run_id, metric))) for r in records)
    families = tuple(sorted({j.family for j in jobs}))
    if parent is not None and not isinstance(parent, RunRecord):
        parent = mlflow_store.record_of(parent)
    return Sweep(uri, jobs, metric, mode, parent, families, deleted)


def monitored_metric(runs: list[RunRecord]) -> tuple[str, verdict.Mode]:
    """The metric the jobs recorded as theirs (`monitor` / `monitor_mode`, else a sweep's `objective` tags), else
    the monitored metric of the family most of them trained, else val/loss (min)."""
    for name_tag, mode_tag in ((JOB.monitor, JOB.monitor_mode), (JOB.objective_metric, JOB.objective_mode)):
        recorded = Counter((r.tags.get(name_tag), r.tags.get(mode_tag)) for r in runs
                           if r.tags.get(name_tag) and r.tags.get(mode_tag) in ("max", "min"))
        if recorded:
            (name, mode), _ = recorded.most_common(1)[0]
            return name, mode
    families = Counter(r.tags.get(JOB.family, "") for r in runs)
    try:
        family = get_family(families.most_common(1)[0][0]) if families else None
    except UserError:  # the family is not installed where the report runs
        family = None
    if family is None:
        return "val/loss", "min"
    return family.monitor, "max" if family.monitor_mode == "max" else "min"


def batch_size_used(params: Mapping[str, str], tags: Mapping[str, str]) -> str:
    return tags.get(JOB.batch_size_used) or params.get(JOB.batch_size, "")


def samples_per_step(params: Mapping[str, str], tags: Mapping[str, str], metrics: Mapping[str, float]) -> int | None:
    """Training samples one optimizer step consumes: as the job's timer measured it, else batch size used ×
    gradient accumulation × data-parallel devices."""
    measured = metrics.get(JOB.samples_per_step)
    if measured:
        return int(measured)
    try:
        return (int(batch_size_used(params, tags)) * int(params.get(JOB.accumulate_grad_batches, 1))
                * int(params.get(JOB.devices, 1)))
    except (KeyError, ValueError):
        return None


def _job(run: RunRecord, metric: str, uri: str | None, history: Sequence | None = None) -> JobRecord:
    record = JobRun.from_run(run)
    per_step = samples_per_step(run.params, run.tags, run.metrics)
    curve: tuple[verdict.ValidationPoint, ...] = ()
    if (uri is not None or history is not None) and per_step:
        history = runs.metric_history(uri, run.run_id, metric) if history is None else history
        start_ms = run.start_ms or (history[0].timestamp_ms if history else 0)
        curve = tuple(verdict.ValidationPoint((m.step + 1) * per_step, m.value, (m.timestamp_ms - start_ms) / 1000)
                      for m in history if math.isfinite(m.value))
    return JobRecord(
        run_id=run.run_id,
        name=run.name,
        status=run.status,
        start_ms=run.start_ms,
        params=run.params,
        tags=run.tags,
        metrics=run.metrics,
        family=record.family or "",
        config=record.config,  # "" stays "": a job of a configuration with no swept value
        config_index=record.config_index,
        replicate=record.replicate,
        round=record.round if JOB.round in run.tags else record.replicate,
        host=record.host or None,
        concurrent_jobs=record.concurrent_jobs or 1,
        batch_size=batch_size_used(run.params, run.tags),
        samples_per_step=per_step,
        samples_per_sec=record.samples_per_sec or None,
        curve=curve,
        stop_reason=record.stop_reason or None,
        stop_step=record.stop_step,
        max_steps=record.max_steps,
        end_ms=run.end_ms,
    )
