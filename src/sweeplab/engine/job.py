"""One job, as both fit loops see it: everything but the training step itself.

sweeplab.engine.training opens a `Job` (its plan, output folder, MLflow run and logger, the checkpoint it resumes from) and
hands it to a fit loop: Lightning's (sweeplab.engine.lightning_fit) or sweeplab's own MLX loop (sweeplab.engine.mlx_fit). Each
loop calls `start_fit` for the data and the task, trains, and returns a `FitResult`; `finish` then records the fit
the same way for both: summary metrics, the `checkpoint` tag, the checkpoint artifact, the export, the closing line
and the job log.

`hold_run_lock` keeps one process per run: the job's output folder is locked (flock) for the job's whole life. A stop
request (sweeplab.core.interrupts) is checked between the stages here: after the data is set up, before the export, before
the uploads.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig

from sweeplab.callbacks.faults import pause_in
from sweeplab.core import files, interrupts, wall
from sweeplab.core.files import hold_run_lock, run_lock_is_free
from sweeplab.core.place import NOWHERE, JobPlace
from sweeplab.core.records import JOB, JobRun
from sweeplab.engine.plan import JobPlan, model_params
from sweeplab.export import export_after_training
from sweeplab.families import check_task
from sweeplab.families.contract import training_data_path
from sweeplab.policies.checkpoints import CheckpointPolicy
from sweeplab.runtime.devices import release_earlier_jobs
from sweeplab.tracking import mlflow_store
from sweeplab.tracking.resume import close_abandoned_runs  # here too: where the sweep callback and tests look

log = logging.getLogger(__name__)

@dataclass
class Job:
    """A planned job about to train. `run` and `logger` are None for an untracked job (logger.enabled=false, or a
    DDP rank other than 0)."""

    plan: JobPlan
    output_dir: Path
    run: mlflow_store.JobRun | None = None
    logger: Any = None  # tracking.run_logger.ResumingMLFlowLogger
    resume_ckpt: Path | None = None
    sweep_dir: Path | None = None  # the sweep's directory, for a job of a sweep
    place: JobPlace = NOWHERE  # its place in the study (core/place.py), as sweeplab.train read it from its config

    @property
    def run_id(self) -> str | None:
        return self.run.run_id if self.run is not None else None


@dataclass
class FitResult:
    """What a fit loop hands back: the run's summary metrics, the best checkpoint and its score, the last step."""

    summary: dict[str, float]
    step: int
    best_path: str | None = None
    monitored: float | None = None  # the best checkpoint's score, else the metric's last value
    timing: JobRun = field(default_factory=JobRun)  # the timer's tags (StepTimer.run_record: timing.clock, ...)
    diverged: str | None = None  # guard.mode=off: what was not finite when training ended (guard.nonfinite_at_end)
    stop_reason: str | None = None  # a stop rule ended the fit early (policies/stopping.py): "target" | "behind"


def start_fit(job: Job):
    """Whatever earlier jobs of the process left is released; the data is set up, the model config fitted to it, the
    training data recorded, and the family's task built. Returns (datamodule, model config, task)."""
    release_earlier_jobs()  # whatever ran before this job in the process leaves no garbage or cached memory behind
    wall.mark("run_open")
    p = job.plan
    model_config = resolve_model(p)
    datamodule = p.datamodule
    if job.run is not None and (built := model_params(p, model_config)):
        job.run.log_params(built)  # what `size` and the data made of the group's null keys (engine.plan.job_params)
    if job.run is not None and job.resume_ckpt is None and p.logger.log_dataset:
        data_path = training_data_path(datamodule)
        if data_path is not None:
            job.run.log_training_data(data_path, name=data_path.name)
    task = p.family.make_task(model_config, p.loss_config, p.optim)
    check_task(p.family, task)
    task.mlflow_run_id = job.run_id
    wall.mark("task")
    return datamodule, model_config, task


def resolve_model(p: JobPlan):
    """The model config as the job trains it: the data set up (once per plan) and what it decides filled in (the
    vocabulary, TextBridge's out_dim from the teacher, the decoder's special ids). `resume` checks a checkpoint
    against this, not against the config's unfilled defaults."""
    if p.fitted_model_config is None:
        pause_in("setup")  # reliability tests: a signal lands here (a no-op unless SWEEPLAB_FAULT_PAUSE_IN=setup)
        p.datamodule.prepare_data()
        p.datamodule.setup("fit")
        interrupts.check()  # a stop requested while the data was indexed (and swallowed where it landed)
        p.fitted_model_config = p.family.fitted_model_config(p.model_config, p.datamodule, p.model_values)
        wall.mark("data")
    return p.fitted_model_config


def finish(job: Job, result: FitResult) -> float | None:
    """Record a fit that ended: summary metrics (written before anything else is), the best checkpoint as a tag and an
    artifact, the export, the closing line, the job log. Returns the monitored metric (what a sweeper optimises).
    A stop request is acted on between these stages (the run ends KILLED; what is left is not done)."""
    with interrupts.at_safe_points():
        return _finish(job, result)


def _finish(job: Job, result: FitResult) -> float | None:
    p, run = job.plan, job.run
    if result.diverged:
        log.warning("the run diverged (guard.mode=off let it train on): %s", result.diverged)
    if run is not None:
        run.write(dataclasses.replace(result.timing, diverged=result.diverged or None))
        logged = getattr(job.logger, "already_logged", None) or {}  # a resumed run: what it logged before its stop
        run.log_metrics({k: v for k, v in result.summary.items() if result.step not in logged.get(k, ())},
                        step=result.step)  # every metric's step once, also when a resume finds the fit over
        if job.logger is not None:
            job.logger.wait_for_writes()
        if result.best_path:
            run.write(JobRun(checkpoint=result.best_path))
            interrupts.check()
            if p.logger.log_checkpoint:
                run.log_artifact_capped(result.best_path, "checkpoints", p.logger.max_artifact_mb)
    interrupts.check()
    if result.best_path:  # export=coreml: a Core ML package of the best checkpoint; export=none: nothing
        export_after_training(
            p.container.get("export"), result.best_path, job.output_dir / "export", job.run_id,
            run.uri if run is not None else None,
        )
    interrupts.check()
    stopped = (result.step, p.trainer.max_steps) if result.stop_reason is not None else None
    log.info("%s", final_line(run, p.family.monitor, result.monitored, result.summary, result.diverged,
                              result.best_path, stopped))
    if run is not None and p.logger.log_job_log and (job_log := job_log_file()) is not None:
        run.log_artifact_capped(job_log, None, p.logger.max_artifact_mb)
    return result.monitored


def final_line(run, monitor: str, monitored: float | None, summary: dict, diverged: str | None = None,
               checkpoint: str | None = None, stopped: tuple[int, int] | None = None) -> str:
    """The run's one closing line: its name, the metric a sweep compares, where a stop rule ended it (step, of the
    steps asked: the run's name says the latter), the throughput, its best checkpoint, where to see it (its address
    where the UI's is known: mlflow_store.ui_base); a run that diverged says so first."""
    parts = [f"best {monitor} {monitored:.4g}" if monitored is not None else f"{monitor} n/a"]
    if stopped is not None:
        parts.append(f"stopped at step {stopped[0]} of {stopped[1]}")
    if diverged:
        parts.insert(0, f"DIVERGED ({diverged})")
    if (rate := summary.get(JOB.samples_per_sec)) is not None:
        parts.append(f"{rate:,.0f} samples/s")
    if (step := summary.get(JOB.step_time_median)) is not None:
        parts.append(f"{step * 1000:.0f} ms/step" if step >= 0.1 else f"{step * 1000:.3g} ms/step")
    saved = f"; best checkpoint {checkpoint}" if checkpoint else ""
    if run is None:
        return "done (not tracked): " + ", ".join(parts) + saved
    base = mlflow_store.ui_base(run.uri)
    where = mlflow_store.run_url(base, run.experiment_id, run.run_id) if base else f"run {run.run_id} (`make ui` shows it)"
    return f"done: {run.run_name}: {', '.join(parts)}{saved}; {where}"


def checkpoint_policy(p: JobPlan) -> CheckpointPolicy:
    """The job's checkpoint policy, from `checkpoint.*` and the monitored metric's direction: one object that each
    fit loop asks when to write last.ckpt and which validation makes a new best."""
    return CheckpointPolicy(p.checkpoint.every_n_steps, p.checkpoint.every_n_seconds, p.family.monitor_mode)


def clear_unfinished_writes(folder: Path) -> None:
    """The temp files of checkpoint writes a killed job left unfinished (never read, never renamed into place) go
    before this job writes any: a resumed job's folder holds only whole checkpoints."""
    removed = files.remove_unfinished_writes(folder)
    if removed:
        log.info("removed %d unfinished checkpoint write(s) a stopped job left in %s", len(removed), folder)


def record_batch_size(job: Job, loader) -> None:
    """Record the batch size the job trains with where it is not `data.batch_size`: a training split smaller than
    the batch is trained on whole, so every batch holds the whole split (tag `data.batch_size_used`, which the
    report reads; the param keeps what was given). `loader`: the training loader the fit uses."""
    sampler = getattr(loader, "batch_sampler", None)
    used = getattr(sampler, "samples_per_batch", None)
    if used is None or used >= sampler.batch_size:
        return
    log.warning("data.batch_size=%d is larger than the training split (%d samples): each batch is the whole split, "
                "%d samples; the run records %s=%d", sampler.batch_size, sampler.num_samples, used,
                JOB.batch_size_used, used)
    if job.run is not None:
        job.run.write(JobRun(batch_size_used=used))


def job_log_file() -> Path | None:
    """The log file Hydra's job logging writes (<job dir>/<job name>.log); None outside Hydra."""
    try:
        hc = HydraConfig.get()
    except ValueError:
        return None
    path = Path(hc.runtime.output_dir) / f"{hc.job.name}.log"
    return path if path.exists() else None


__all__ = ["FitResult", "Job", "close_abandoned_runs", "final_line", "finish", "hold_run_lock", "record_batch_size", "resolve_model", "run_lock_is_free", "start_fit"]
