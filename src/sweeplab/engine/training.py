"""One training job from a composed config: plan it, find what it resumes, open its MLflow run, hand it to a fit
loop, record the result.

`sweeplab.train` is the Hydra entry point around `train(cfg)`; tests call `train` with a composed config. The plan
and its checks are sweeplab.engine.plan; the loops are sweeplab.engine.lightning_fit and sweeplab.engine.mlx_fit; what both loops share
(the data and task, the closing record of a fit) is sweeplab.engine.job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import platform
from pathlib import Path

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from sweeplab.callbacks.checkpoints import best_files
from sweeplab.core import files, host_arch, interrupts, wall
from sweeplab.core.channels import COMPILE_CACHE_DIR_ENV, COMPILE_CACHE_FOLDER
from sweeplab.core.errors import ConfigError, UserError
from sweeplab.core.files import check_writable_dir
from sweeplab.core.outcome import JobOutcome
from sweeplab.core.place import NOWHERE, JobPlace
from sweeplab.core.records import JOB, JobRun, merged
from sweeplab.engine import lightning_fit
from sweeplab.engine.job import FitResult, Job, finish, hold_run_lock, resolve_model
from sweeplab.engine.outcome import recorded_outcome
from sweeplab.engine.plan import JobPlan, job_params, plan
from sweeplab.runtime import backends, devices, distributed
from sweeplab.tasks.checkpoint import read_checkpoint
from sweeplab.tracking import mlflow_store, naming, resume
from sweeplab.tracking.run_logger import ResumingMLFlowLogger, logged_steps

LAST_CHECKPOINT = "last.ckpt"  # callbacks/checkpoints.LastCheckpoint's file, what a resume continues from

log = logging.getLogger(__name__)


def _hydra_runtime() -> tuple[Path, str | None]:
    """(this job's output dir, the sweep dir when in a multirun)."""
    try:
        hc = HydraConfig.get()
        sweep_dir = hc.sweep.dir if hc.mode == RunMode.MULTIRUN else None
        return Path(hc.runtime.output_dir), sweep_dir
    except ValueError:  # not under Hydra (tests, notebooks)
        return Path.cwd() / "outputs", None


def run_record(p: JobPlan, sweep_dir: str | None, place: JobPlace = NOWHERE) -> JobRun:
    """What a new job run says about itself (its tags), as it is opened."""
    return merged(
        JobRun(
            backend=p.backend,
            device=devices.device_name(p.backend),
            family=p.family.name,
            monitor=p.family.monitor,
            monitor_mode=p.family.monitor_mode,
            precision=p.trainer.precision,
            compile=p.compile_mode,
            cuda_graph=p.cuda_graph,
            torch_version=torch.__version__,
            lightning_version=L.__version__,
            git_commit=mlflow_store.git_commit(),
            sweep_id=naming.sweep_id(sweep_dir),
        ),
        backends.mps_fallback_record(p.backend),
        host_arch.host_record(),
        _preset_record(),
        _replicate_record(p, sweep_dir, place),
        scheduler_record(),
    )


def scheduler_record() -> JobRun:
    """The SLURM job this job runs as (none outside SLURM): its id as sacct and scancel name it, its array index, and
    how many times SLURM ran it again (a requeued job continues its own run: sweeplab/sweep/slurm.py)."""
    array_job, index = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    job = f"{array_job}_{index}" if array_job and index else os.environ.get("SLURM_JOB_ID")
    if not job:
        return JobRun()
    return JobRun(slurm_job_id=job, slurm_restarts=int(os.environ.get("SLURM_RESTART_COUNT") or 0),
                  slurm_array_index=index or None)


def _replicate_record(p: JobPlan, sweep_dir: str | None, place: JobPlace = NOWHERE) -> JobRun:
    """What the verdict groups and pairs a sweep job by (sweeplab.study.replicates): its configuration (the swept values,
    the same in every replicate), seed, host, and its place (core/place.py: the replicate, round, configuration index
    and concurrency the sweeplab sweeper composed into this job's config). None outside a sweep."""
    if sweep_dir is None:
        return JobRun()
    gpus = distributed.job_gpus(p.backend)  # the GPU(s) it ran on (joblib_gpus: rotated per round)
    return JobRun(config=naming.config_key(), seed=p.container.get(JOB.seed, 0),  # the config key the tag records
                  host=platform.node(),
                  replicate=place.replicate, round=place.round, config_index=place.config_index,
                  concurrent_jobs=place.concurrent_jobs, gpu=",".join(gpus) if gpus else None,
                  lanes_per_gpu=place.lanes_per_gpu, solo_step_time_s=place.solo_step_time_s, lane=place.lane)


def _preset_record() -> JobRun:
    """The presets a run was composed with (debug=smoke, sweep=..., experiment=...): smoke runs are findable."""
    try:
        choices = HydraConfig.get().runtime.choices
    except ValueError:  # not under Hydra
        return JobRun()
    groups = ("debug", "sweep", "experiment", "hparams_search")
    return JobRun(presets={g: str(choices[g]) for g in groups if choices.get(g) not in (None, "null")} or None)


def share_compile_cache(sweep_dir: str | None, scope: str = "study") -> None:
    """The jobs of one study share one compiler cache, `<sweep dir>/compile_cache` (docs/study-cost.md): inductor's FX
    graph cache and AOTAutograd cache (both on by default in torch) and the Triton kernels live there, so the
    first job of a shape compiles and every later job of that graph, in this process or another of the study
    (joblib workers, SLURM tasks on a shared file system), loads the compiled code. Left alone outside a sweep, with
    `compile_cache=shared` (torch's own folder, so a later study loads what an earlier one compiled) and where
    TORCHINDUCTOR_CACHE_DIR names a folder of the user's: torch's import sets it to its default
    (/tmp/torchinductor_$USER), which counts as unset."""
    if sweep_dir is None or scope == "shared":
        return
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    if os.environ.get(COMPILE_CACHE_DIR_ENV) in (None, default_cache_dir()):
        os.environ[COMPILE_CACHE_DIR_ENV] = str(Path(sweep_dir).resolve() / COMPILE_CACHE_FOLDER)


def train(cfg: DictConfig, output_dir: Path | None = None, place: JobPlace = NOWHERE) -> float | None:
    """Run one job; returns the monitored validation metric (what a sweeper optimises). `output_dir` (checkpoints,
    export) defaults to Hydra's job dir; callers outside Hydra (profile, bench) pass their own. `place`: the job's
    place in its study (core/place.py), none for a job that is not a sweep's.

    A stop request (sweeplab.core.interrupts) that came before the fit loop is checked between these stages."""
    return _train(cfg, output_dir, place)[0]


def run_job(cfg: DictConfig, place: JobPlace = NOWHERE) -> JobOutcome:
    """sweeplab.train's task function: run one job and return what it did (sweeplab.core.outcome), which Hydra hands
    the sweeper. A tracked job of a sweep reads its own ended run back once (the run and its monitored metric's
    history) so that its sweeper decides from what the report will read, without reading the store itself. `place`: the
    job's place in its study, as sweeplab.train read it from the job's config (core/place.py)."""
    monitored, job, uri = _train(cfg, None, place)
    objective = JobOutcome.finite(monitored)
    if uri is None or job.run_id is None or job.sweep_dir is None:
        return JobOutcome("FINISHED", objective, place.config_index, place.replicate, place.round)
    return recorded_outcome(uri, job.run_id, objective)


def _train(cfg: DictConfig, output_dir: Path | None, place: JobPlace = NOWHERE) -> tuple[float | None, Job, str | None]:
    """train(cfg)'s work: (the monitored metric, the job, the store's URI where the job was tracked, else None)."""
    wall.start_job()  # the job's wall breakdown (summary/wall_breakdown/*): the first job of a process from its start
    interrupts.check()
    p = plan(cfg)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    backends.apply_backend_settings(p.backend_config, p.backend)
    hydra_dir, sweep_dir = _hydra_runtime()
    output_dir = output_dir or hydra_dir
    share_compile_cache(sweep_dir, p.compile_cache)
    uri = mlflow_store.resolve_uri(p.logger.tracking_uri)
    tracked = p.logger.enabled and distributed.is_global_zero()  # one MLflow run per job: rank 0's
    wall.mark("plan")
    target = _resume_target(p, cfg, uri, output_dir, tracked)  # every check done; nothing touched yet
    wall.mark("resume_check")
    job = Job(p, target.output_dir if target is not None else output_dir,
              resume_ckpt=target.checkpoint if target is not None else None,
              sweep_dir=Path(sweep_dir) if sweep_dir is not None else None, place=place)
    check_writable_dir(job.output_dir / "checkpoints")  # before the run exists, not at the first checkpoint
    interrupts.check()
    with _one_process(job, target, uri):  # one process per run, before the run is opened or continued
        monitored = finish(job, _fit(job)) if not tracked else _train_tracked(job, target, cfg, uri, sweep_dir)
        if distributed.is_global_zero():  # the run is FINISHED: its folder keeps what is read again
            drop_training_state(job)
    interrupts.check()  # a stop recorded while the run was closed (mlflow_store.JobRun): the job exits with it
    return monitored, job, uri if tracked else None


def measure(cfg: DictConfig, output_dir: Path) -> dict[str, float]:
    """A short fit of `cfg` that nothing records (the lanes launcher's probe, sweeplab.sweep.probe): its summary
    metrics (step time, peak memory), as a tracked job would log them."""
    p = plan(cfg)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    backends.apply_backend_settings(p.backend_config, p.backend)
    return _fit(Job(p, output_dir)).summary


def drop_training_state(job: Job) -> None:
    """A finished job's `last.ckpt` (weights and optimizer state, ~3x the best checkpoint: 133 of a default job's 177
    MB) goes unless checkpoint.keep_last: the report reads MLflow, the export and a resume's bookkeeping the best
    checkpoint; only extending the finished run reads it (resume=PATH says so when it is gone). Called once the run
    ended FINISHED, so a kill before leaves it whole and resumable."""
    last = job.output_dir / "checkpoints" / LAST_CHECKPOINT
    if job.plan.checkpoint.keep_last or not last.is_file():
        return
    size = last.stat().st_size
    last.unlink()
    # debug: every job of a study would print it; docs/usage.md and the retention setting's comment say it happens
    log.debug("removed %s (%.0f MB of optimizer state a finished run no longer needs; checkpoint.keep_last=true "
              "keeps it)", last, size / 1e6)


def _one_process(job: Job, target: resume.ResumePoint | None, uri: str):
    """The run's locks (job.hold_run_lock), held by rank 0 (DDP's other ranks share its folder): this job's output
    folder, and when it continues a run, the folder where that run's trainer holds its lock (the run's recorded
    `output_dir`): two `resume=PATH` of one checkpoint, or one while the run still trains, take the same lock.
    Once locked the run is looked at again: another process may have finished it (or moved it to its own folder)
    a moment ago, and a finished run is never trained again."""
    if not distributed.is_global_zero():
        return contextlib.nullcontext()
    continued = target is not None and target.run_id is not None
    locks = [(job.output_dir, f"run {target.run_id} ({job.output_dir})" if continued else str(job.output_dir))]
    if continued and target.run_folder is not None and target.run_folder.resolve() != job.output_dir.resolve():
        locks.append((target.run_folder, f"run {target.run_id} ({target.run_folder})"))

    @contextlib.contextmanager
    def locked():
        with contextlib.ExitStack() as held:
            for folder, what in locks:
                held.enter_context(hold_run_lock(folder, what))
            if continued:
                _check_still_unfinished(job, target, uri)
            yield

    return locked()


def _check_still_unfinished(job: Job, target: resume.ResumePoint, uri: str) -> None:
    p = job.plan
    if p.container.get("resume") is True:
        now = _interrupted_run(p, uri)
        unchanged = now == (target.run_id, target.checkpoint)
    else:
        run = resume.find_run(uri, target.run_id)
        recorded = str(target.run_folder) if target.run_folder is not None else None
        unchanged = run is not None and run.status != "FINISHED" and JobRun.from_run(run).output_dir == recorded
    if not unchanged:
        raise UserError(f"resume: run {target.run_id} was finished or taken over by another process meanwhile; "
                        "nothing to resume (run the command again: a finished run is extended into a new run)")


def _train_tracked(job: Job, target: resume.ResumePoint | None, cfg: DictConfig, uri: str, sweep_dir: str | None):
    p = job.plan
    record = run_record(p, sweep_dir, job.place)  # the device's name (on CUDA: its initialisation) and the git commit, before
    wall.mark("run_tags")  # MLflow's
    record = merged(record, JobRun(name=naming.run_name(p, cfg, job.place.replicate),
                                   parent_run_id=mlflow_store.read_parent_run_id(sweep_dir),
                                   config_params=job_params(p)))
    with wall.clock().within("mlflow"):
        job.run = mlflow_store.JobRun(uri, p.logger.experiment_name, record,
                                      run_id=target.run_id if target is not None else None)
    with job.run:
        continued = target is not None and target.run_id is not None
        _tag_new_run(job, target, continued)
        if p.logger.system_metrics_after_s is not None and p.logger.system_metrics_after_s >= 0:
            job.run.monitor_system(p.logger.system_metrics_after_s)
        with wall.clock().within("mlflow"):
            job.logger = ResumingMLFlowLogger(
                experiment_name=p.logger.experiment_name,
                tracking_uri=uri,
                run_id=job.run.run_id,
                already_logged=logged_steps(uri, job.run.run_id) if continued else None,
                synchronous=not p.logger.async_logging,
            )
        try:
            interrupts.check()
            monitored = finish(job, _fit(job))
        finally:  # points still held (the logger holds them out of the timed steps) go before the run ends
            with interrupts.deferred():  # every write after the fit: a signal is acted on between writes, not in one
                job.logger.send_held()
        with interrupts.deferred():
            _record_wall_breakdown(job)
        interrupts.check()  # a stop that came after the job's last line: the run ends KILLED, the study says how to go on
        return monitored


def _record_wall_breakdown(job: Job) -> None:
    """The job's wall time so far in parts (sweeplab.core.wall), and its set-up in segments, on its run: the last thing
    it writes before the run ends (what comes after, ending the run and the process, is not in it)."""
    with contextlib.suppress(Exception):  # a breakdown is worth a warning at most, never a job that trained
        job.logger.wait_for_writes()
    clock = wall.clock()
    split = clock.setup_split()
    totals = clock.totals()
    job.run.write(JobRun(wall_breakdown=totals or None, setup_split=split or None), step=0)


def _fit(job: Job) -> FitResult:
    if job.plan.backend == "mlx":  # Lightning does not run MLX: sweeplab's own loop, same data, metrics, runs and files
        from sweeplab.engine import (
            mlx_fit as loop,  # deferred: imports MLX, which only backend=mlx needs (and may be absent)
        )

        return loop.fit(job)
    return lightning_fit.fit(job)


def _tag_new_run(job: Job, target: resume.ResumePoint | None, continued: bool) -> None:
    """The config hash, description and config.yaml of a new (or changed) run; where a resumed run came from."""
    p, run = job.plan, job.run
    if not continued or target.changes:
        run.write(JobRun(config_hash=resume.config_hash(p.container),
                         resumable_hash=resume.resumable_hash(p.container, p.may_change_on_resume),
                         description=naming.run_description()))
        run.log_text(OmegaConf.to_yaml(p.container), "config.yaml")
    record = JobRun(output_dir=str(job.output_dir))
    if continued:  # a job SLURM ran again into its own run: where it runs now
        record = merged(record, scheduler_record())
    if target is not None:
        record = merged(record, JobRun(
            resumed_from=str(target.checkpoint), extends=target.extends or None,
            changed_on_resume={key: f"{old} -> {new} (from step {target.step})"
                               for key, (old, new) in target.changes.items()} or None))
    run.write(record)


def _resume_target(p: JobPlan, cfg: DictConfig, uri: str, own_output_dir: Path, tracked: bool) -> resume.ResumePoint | None:
    """What `resume` continues from, checked against this config and the run it continues (tracking/resume.py says
    what may differ); None for a fresh run. Reads only: a refused resume leaves the store and the files as they were.

    `resume=true` continues the interrupted run in its own output directory; `resume=PATH` (a checkpoint, or a
    job's output directory) writes its checkpoints to this job's output directory, wherever the file came from."""
    setting = p.container.get("resume", False)
    if setting is False or setting is None:
        return None
    if setting is True:
        run_id, ckpt = _interrupted_run(p, uri)
        output_dir = ckpt.parent.parent
    else:
        ckpt = Path(str(setting))
        if ckpt.is_dir():
            folder = ckpt
            ckpt = ckpt / "checkpoints" / LAST_CHECKPOINT if (ckpt / "checkpoints").is_dir() else ckpt / LAST_CHECKPOINT
            if not ckpt.is_file() and (best := files.best_checkpoint_in(folder)) is not None:
                raise UserError(f"resume={folder}: holds no {LAST_CHECKPOINT}: its run finished and "
                                "checkpoint.keep_last=false dropped the optimizer state an extension continues from; "
                                f"its best checkpoint {best} still exports; train with checkpoint.keep_last=true to "
                                "extend a run later")
        run_id, output_dir = None, own_output_dir
    checkpoint = read_checkpoint(ckpt)  # a missing, truncated, damaged or foreign file; non-finite weights
    resume.check_backend(checkpoint, ckpt, p.backend)
    resume.check_training_state(checkpoint, ckpt)
    for best in best_files(checkpoint):  # the best checkpoint it brings along is checked the same way
        if best.resolve() != ckpt.resolve():
            read_checkpoint(best)
    step = int(checkpoint.get("global_step", 0))
    may_differ = set(p.may_change_on_resume)
    # the model as this job would build it: the data's values (vocabulary, teacher width) filled in, not the defaults
    resume.check_model(checkpoint, ckpt, p.family.name, resolve_model(p), may_differ)
    if step > p.trainer.max_steps:
        raise ConfigError(JOB.max_steps, f"{p.trainer.max_steps} is below the step of checkpoint {ckpt} ({step})")
    point = resume.ResumePoint(ckpt, step, run_id, output_dir, {}, run_folder=output_dir if setting is True else None)
    if setting is not True and tracked:
        point = _run_of_checkpoint(point, checkpoint, p, uri, may_differ)
    elif tracked and (run := resume.find_run(uri, run_id)) is not None:  # found with a changed trainer.max_steps
        point.changes = _param_changes(run, p, may_differ, ckpt)
    what = f"run {point.run_id}" if point.run_id else ("as a new run" if tracked else "training")
    log.info("resume: continuing %s from %s (step %d); checkpoints go to %s", what, ckpt, step, output_dir / "checkpoints")
    return point


def _interrupted_run(p: JobPlan, uri: str) -> tuple[str, Path]:
    """`resume=true`: the interrupted run of this configuration, or of it with the keys a resume may change."""
    return resume.find_interrupted_run(uri, p.logger.experiment_name, resume.config_hash(p.container),
                                       resume.resumable_hash(p.container, p.may_change_on_resume))


def _param_changes(run: mlflow_store.RunRecord, p: JobPlan, may_differ: set[str], ckpt: Path) -> dict[str, tuple[str, str]]:
    """resume.param_changes of this job's params against the run it continues."""
    params = job_params(p)
    # the model keys the group left null were logged as built once the data was set up; they are built again now
    null = {k for k, v in mlflow_store.flatten(p.container).items() if k.startswith("model.") and v == "None"}
    params |= {k: v for k, v in run.params.items() if k in null}
    return resume.param_changes(run, params, may_differ, ckpt)


def _run_of_checkpoint(point: resume.ResumePoint, checkpoint: dict, p: JobPlan, uri: str,
                       may_differ: set[str]) -> resume.ResumePoint:
    """`resume=PATH`: the run the checkpoint belongs to, if this store has it. An unfinished run is continued; a
    FINISHED one is extended into a new run (tracking/resume.py: a finished run is never written to again)."""
    ckpt = point.checkpoint
    run_id = (checkpoint.get("sweeplab") or {}).get("mlflow_run_id")
    run = resume.find_run(uri, run_id) if run_id else None
    if run is None:
        log.warning("resume: the run of checkpoint %s (%s) is not in %s; its training continues as a new run",
                    ckpt, run_id or "none recorded", uri)
        return point
    changes = _param_changes(run, p, may_differ, ckpt)
    record = JobRun.from_run(run)
    recorded = record.output_dir
    if run.status != "FINISHED":
        return dataclasses.replace(point, run_id=run_id, changes=changes, run_folder=Path(recorded) if recorded else None)
    finished_at = record.max_steps or 0
    if not p.trainer.max_steps > finished_at:
        raise UserError(
            f"resume: run {run_id} of checkpoint {ckpt} is FINISHED; resuming it only trains it longer "
            f"(trainer.max_steps above its {finished_at})"
        )
    if recorded and Path(recorded).resolve() == point.output_dir.resolve():
        raise UserError(f"resume: run {run_id} of checkpoint {ckpt} is FINISHED and its extension is a new run, "
                        f"which needs a folder of its own; {point.output_dir} is the finished run's (set another "
                        "hydra.run.dir)")
    log.info("resume: run %s is FINISHED and stays as it is; training it to step %d goes into a new run (tag %s=%s)",
             run_id, p.trainer.max_steps, JOB.extends, run_id)
    return dataclasses.replace(point, extends=run_id)


def record_failed_job(cfg: DictConfig, exc: BaseException, place: JobPlace = NOWHERE) -> None:
    """Make sure a failed sweep job has a FAILED MLflow run, also when it failed before its run existed."""
    if getattr(exc, "sweeplab_run_id", None):  # JobRun already marked its run FAILED
        return
    logger = cfg.get("logger") or {}
    if not logger.get("enabled", True):
        return
    try:
        uri = mlflow_store.resolve_uri(logger.get("tracking_uri"))
        _, sweep_dir = _hydra_runtime()
        family = str(OmegaConf.select(cfg, "model." + JOB.family, default="?"))
        record = JobRun(name=naming.failed_job_name(family), family=family, sweep_id=naming.sweep_id(sweep_dir),
                        parent_run_id=mlflow_store.read_parent_run_id(sweep_dir),
                        # which job it was: a continued study that runs that job again supersedes this run
                        replicate=place.replicate, config_index=place.config_index)
        mlflow_store.JobRun(uri, logger.get("experiment_name", "sweeplab"), record).fail(exc)
    except Exception as again:
        log.warning("could not record the failed job in MLflow: %s", again)
