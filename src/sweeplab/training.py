"""One training job: validate the whole config, build data/task/callbacks/trainer, fit, record it in MLflow.

`sweeplab.train` is the Hydra entry point around `train(cfg)`; tests call `train` with a composed config.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import lightning as L
import torch
from annotated_types import Ge, Interval
from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar
from omegaconf import DictConfig, OmegaConf

from sweeplab import backends, devices, distributed, tuning
from sweeplab.callbacks.checkpoints import BestCheckpoint, LastCheckpoint, ValidateAtLastStep
from sweeplab.callbacks.faults import FaultInjection
from sweeplab.callbacks.guard import NonFiniteGuard
from sweeplab.callbacks.timing import ThroughputTimer
from sweeplab.config import bind, build
from sweeplab.data.device_batches import resolve_pad_to
from sweeplab.data.sampling import ResumableDataCheck
from sweeplab.errors import ConfigError, UserError
from sweeplab.families import get_family
from sweeplab.files import check_writable_dir
from sweeplab.tasks.checkpoint import AtomicCheckpointIO
from sweeplab.tasks.optim import OptimConfig
from sweeplab.tracking import mlflow_store, naming, resume

log = logging.getLogger(__name__)
# cuda_graph=true and steps_per_batch > 1 train with manual optimization, and Lightning then warns that checkpoints hold the weights after
# the optimizer step: true of every run here, automatic optimization included
warnings.filterwarnings("ignore", message="Using ModelCheckpoint with manual optimization")


@dataclass
class TrainerConfig:
    max_steps: int = 200
    val_check_interval: int = 50  # optimizer steps between validations
    limit_val_batches: Annotated[int, Ge(0)] | Annotated[float, Interval(ge=0, le=1)] = 1.0  # batches | share
    log_every_n_steps: int = 10
    precision: str = "32-true"
    accumulate_grad_batches: int = 1
    devices: int = 1
    num_sanity_val_steps: Annotated[int, Ge(-1)] = 0  # -1: the whole validation set
    enable_progress_bar: bool = True
    deterministic: bool = False

    def __post_init__(self) -> None:
        for key in ("max_steps", "val_check_interval", "log_every_n_steps", "accumulate_grad_batches", "devices"):
            if getattr(self, key) <= 0:
                raise ValueError(f"{key} must be > 0, got {getattr(self, key)}")


class LoggedLossProgressBar(TQDMProgressBar):
    """Lightning's bar, showing the training loss as last logged (a float, converted once per logging step).
    Tasks do not mark the loss prog_bar=True: Lightning would read such a metric back from the device after every
    batch, a host sync per step."""

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict:
        metrics = super().get_metrics(trainer, pl_module)
        if "train/loss" in trainer.logged_metrics:
            metrics["train/loss"] = f"{float(trainer.logged_metrics['train/loss']):.4g}"
        return metrics


@dataclass
class LoggerConfig:
    tracking_uri: str | None = None  # null: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db
    experiment_name: str = "sweeplab"
    enabled: bool = True
    # training metrics go to the store from MLflow's background thread (synchronous=False), so no training step waits
    # for a write (~10-50 ms each on sqlite); the run's end waits until all of them are written
    async_logging: bool = True
    system_metrics_after_s: float | None = 60.0  # MLflow's system/* sampler for jobs running longer; null: off
    log_checkpoint: bool = True  # the best checkpoint as a run artifact (checkpoints/)
    log_job_log: bool = True  # the job's log file as a run artifact
    max_artifact_mb: float = 200.0  # larger files stay on disk only (the `checkpoint` tag still names them)
    log_dataset: bool = True  # the training data as the run's MLflow dataset input, with a digest


@dataclass
class CheckpointConfig:
    every_n_steps: int = 50  # periodic last.ckpt, what `resume=true` continues from

    def __post_init__(self) -> None:
        if self.every_n_steps <= 0:
            raise ValueError(f"every_n_steps must be > 0, got {self.every_n_steps}")


@dataclass
class JobPlan:
    """Everything validated, nothing built yet."""

    family: Any
    model_values: dict
    model_config: Any
    optim: OptimConfig
    trainer: TrainerConfig
    backend_config: backends.BackendConfig
    backend: str
    compile_mode: str
    cuda_graph: bool
    timing: dict
    logger: LoggerConfig
    container: dict
    datamodule: L.LightningDataModule  # constructed (arguments checked), no data read yet
    guard: dict
    checkpoint: CheckpointConfig
    tune: tuning.TuneConfig
    steps_per_batch: int = 1  # optimizer steps per training batch (one graph replay under cuda_graph)


MAX_SEED = 2**32 - 1  # numpy's seed range, which Lightning's seed_everything enforces with a traceback


def plan(cfg: DictConfig) -> JobPlan:
    """Check every group before any work happens; a mistake raises ConfigError naming the key."""
    try:
        container = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except Exception as exc:  # an interpolation or a ??? value
        raise ConfigError(getattr(exc, "full_key", "config") or "config", str(exc).splitlines()[0]) from None
    container.pop("hydra", None)
    family = get_family(container["model"].get("family", ""))
    model_config = family.build_model_config(container["model"])
    optim = build(OptimConfig, container["optim"], "optim")
    trainer = build(TrainerConfig, container["trainer"], "trainer")
    seed = container.get("seed", 0)
    if type(seed) is not int or not 0 <= seed <= MAX_SEED:
        raise ConfigError("seed", f"expected an integer in [0, {MAX_SEED}], got {seed!r}")
    if optim.warmup_steps > trainer.max_steps:
        # A warning, not an error: short throughput runs (the bench's rows, a smoke check) stop inside the warm-up on
        # purpose and the schedule does not matter there; elsewhere the run never trains at the lr it records.
        peak = max(optim.min_lr, optim.lr * trainer.max_steps / optim.warmup_steps)
        log.warning(
            "optim.warmup_steps=%d is longer than the run (trainer.max_steps=%d): the learning rate peaks at %.3g, "
            "never reaching optim.lr=%.3g; lower optim.warmup_steps for a run that trains at optim.lr",
            optim.warmup_steps, trainer.max_steps, peak, optim.lr,
        )
    backend_config = build(backends.BackendConfig, container["backend"], "backend")
    timing = bind(ThroughputTimer, container.get("timing", {}), "timing", ignore=frozenset({"sync", "clock"}))
    logger = build(LoggerConfig, container["logger"], "logger")
    from sweeplab.export.options import options_from_config

    options_from_config(container.get("export"))  # coremltools is imported only when exporting
    guard = bind(NonFiniteGuard, container.get("guard", {}), "guard")
    build(NonFiniteGuard, guard, "guard")  # its own range checks
    checkpoint = build(CheckpointConfig, container.get("checkpoint", {}), "checkpoint")
    tune = build(tuning.TuneConfig, container.get("tune") or {}, "tune")
    if not isinstance(container.get("resume", False), (bool, str)) and container.get("resume") is not None:
        raise ConfigError("resume", f"expected true, false or a checkpoint path, got {container['resume']!r}")
    compile_mode = str(container.get("compile", "off"))
    cuda_graph = container.get("cuda_graph", False)
    if not isinstance(cuda_graph, bool):
        raise ConfigError("cuda_graph", f"expected true or false, got {cuda_graph!r}")
    steps_per_batch = container.get("steps_per_batch", 1)
    if type(steps_per_batch) is not int or steps_per_batch < 1:
        raise ConfigError("steps_per_batch", f"expected an integer >= 1, got {steps_per_batch!r}")
    backend = backends.resolve_backend(backend_config.name)
    backends.check_combination(
        backend,
        trainer.precision,
        compile_mode,
        optim_implementation=optim.implementation,
        pin_memory=bool(container["data"].get("pin_memory", False)),
        gradient_checkpointing=bool(container["model"].get("gradient_checkpointing", False)),
        grad_clip=optim.grad_clip,
        cuda_graph=cuda_graph,
        steps_per_batch=steps_per_batch,
        devices=trainer.devices,
        accumulate_grad_batches=trainer.accumulate_grad_batches,
    )
    family.check_loss(container.get("loss") or {})
    if "pad_to" in container["data"]:  # TextBridge; the resolved mode is what the run's params record
        container["data"]["pad_to"] = resolve_pad_to(container["data"]["pad_to"], cuda_graph)
    datamodule = family.build_datamodule(container["data"], model_config)
    if steps_per_batch > 1:
        check_steps_per_batch(steps_per_batch, cuda_graph, container, trainer, checkpoint, guard, timing, tune, datamodule)
        datamodule.steps_per_batch = steps_per_batch
    return JobPlan(
        family, container["model"], model_config, optim, trainer, backend_config, backend, compile_mode, cuda_graph,
        timing, logger, container, datamodule, guard, checkpoint, tune, steps_per_batch,
    )


def check_steps_per_batch(
    k: int, cuda_graph: bool, container: dict, trainer: TrainerConfig, checkpoint: CheckpointConfig, guard: dict,
    timing: dict, tune: tuning.TuneConfig, datamodule,
) -> None:
    """steps_per_batch=k > 1 runs k optimizer steps per training batch, and Lightning acts only between batches:
    every step count that decides something (stop, validate, log, checkpoint, check for non-finite values, the
    timer's warm-up and windows) must fall on a batch's edge, or the run would do it at another step than it says."""
    data = container["data"]
    if not data.get("on_device", False) or not hasattr(datamodule, "steps_per_batch"):
        raise ConfigError("steps_per_batch", f"a batch of {k} optimizer steps takes its rows from data.on_device=true "
                          f"(model.family={container['model'].get('family')!r} with data.on_device={data.get('on_device')})")
    if data.get("pad_to") != "max":
        raise ConfigError("steps_per_batch", f"a batch of {k} optimizer steps needs one batch width; set data.pad_to=max")
    if guard.get("mode") == "skip":
        raise ConfigError("guard.mode", f"skip cannot drop one step inside a batch of steps_per_batch={k}; use stop")
    if tune.batch_size:
        raise ConfigError("tune.batch_size", f"the batch-size search steps one batch at a time; unset it with steps_per_batch={k}")
    max_steps = trainer.max_steps
    intervals = {
        "trainer.max_steps": max_steps,
        "trainer.val_check_interval": trainer.val_check_interval,
        "trainer.log_every_n_steps": trainer.log_every_n_steps,
        "checkpoint.every_n_steps": checkpoint.every_n_steps,
        "timing.warmup_steps": timing.get("warmup_steps", 0),
        "timing.window": timing.get("window", 1),
        "timing.trace_steps": timing.get("trace_steps", 0),
    }
    if guard.get("mode") == "stop":
        intervals["guard.check_every_n_steps"] = guard.get("check_every_n_steps", 1)
    for key, steps in intervals.items():
        # an interval longer than the run never fires inside it (the bench's "no periodic checkpoint")
        if steps % k and not (key != "trainer.max_steps" and steps > max_steps):
            raise ConfigError(key, f"{steps} is not a multiple of steps_per_batch={k}: a batch of {k} steps cannot stop between them")
    warmup = timing.get("warmup_steps", 0)
    if cuda_graph and warmup < 2 * k:
        raise ConfigError("timing.warmup_steps", f"{warmup} < {2 * k}: with cuda_graph and steps_per_batch={k} the first "
                          f"{k} steps run eagerly and the next {k} capture the graph; neither may be timed")


def fresh_compiler() -> None:
    """Forget what torch.compile learnt from this process's earlier jobs. Dynamo remembers the sizes a function was
    compiled for, and the second time a size changes it compiles dynamic-shape kernels (automatic dynamic): in a sweep
    over batch size the first job got kernels specialised to its shapes and every later one dynamic kernels, and in
    the bench the hand-written loop of the paGating row, compiled after four TextBridge rows, ran 12 % slower than
    the sweeplab job beside it (overhead 1.13 on an H100). Each compiled job now starts as a process's first."""
    torch._dynamo.reset()


def _hydra_runtime() -> tuple[Path, str | None]:
    """(this job's output dir, the sweep dir when in a multirun)."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        sweep_dir = hc.sweep.dir if hc.mode == RunMode.MULTIRUN else None
        return Path(hc.runtime.output_dir), sweep_dir
    except ValueError:  # not under Hydra (tests, notebooks)
        return Path.cwd() / "outputs", None


def run_tags(p: JobPlan, sweep_dir: str | None) -> dict[str, str]:
    return {
        "backend": p.backend,
        "device": devices.device_name(p.backend),
        "family": p.family.name,
        "precision": p.trainer.precision,
        "compile": p.compile_mode,
        "cuda_graph": str(p.cuda_graph).lower(),
        "torch": torch.__version__,
        "lightning": L.__version__,
        "git_commit": mlflow_store.git_commit(),
        "sweep_id": Path(sweep_dir).name if sweep_dir else "",
        **_preset_tags(),
    }


def _preset_tags() -> dict[str, str]:
    """The presets a run was composed with (debug=smoke, sweep=..., experiment=...): smoke runs are findable."""
    try:
        from hydra.core.hydra_config import HydraConfig

        choices = HydraConfig.get().runtime.choices
    except ValueError:  # not under Hydra
        return {}
    groups = ("debug", "sweep", "experiment", "hparams_search")
    return {f"preset.{g}": str(choices[g]) for g in groups if choices.get(g) not in (None, "null")}


def train(cfg: DictConfig, output_dir: Path | None = None) -> float | None:
    """Run one job; returns the monitored validation metric (what a sweeper optimises). `output_dir` (checkpoints,
    export) defaults to Hydra's job dir; callers outside Hydra (profile, bench) pass their own."""
    p = plan(cfg)
    if p.backend == "mlx":
        from sweeplab.mlx.loop import check_plan

        check_plan(p)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    backends.apply_backend_settings(p.backend_config, p.backend)
    hydra_dir, sweep_dir = _hydra_runtime()
    output_dir = output_dir or hydra_dir
    uri = mlflow_store.resolve_uri(p.logger.tracking_uri)
    tracked = p.logger.enabled and distributed.is_global_zero()  # one MLflow run per job: rank 0's
    target = _resume_target(p, cfg, uri, output_dir, tracked)  # every check done; nothing touched yet
    resume_ckpt = target.checkpoint if target is not None else None
    if target is not None:
        output_dir = target.output_dir

    check_writable_dir(output_dir / "checkpoints")  # before the run exists, not at the first checkpoint
    if not tracked:
        return _fit(p, output_dir, logger=False, job=None, resume_ckpt=resume_ckpt)

    job = mlflow_store.JobRun(
        uri,
        p.logger.experiment_name,
        naming.run_name(p, cfg),
        tags=run_tags(p, sweep_dir),
        params=mlflow_store.flatten(p.container),
        parent_run_id=mlflow_store.read_parent_run_id(sweep_dir),
        run_id=target.run_id if target is not None else None,
    )
    with job:
        from sweeplab.tracking.run_logger import ResumingMLFlowLogger, logged_steps

        continued = target is not None and target.run_id is not None
        if not continued or target.changes:
            job.set_tag(resume.CONFIG_HASH_TAG, resume.config_hash(p.container))
            if (description := naming.run_description()) is not None:
                job.set_tag("mlflow.note.content", description)
            job.log_text(OmegaConf.to_yaml(p.container), "config.yaml")
        job.set_tag("output_dir", str(output_dir))
        if target is not None:
            job.set_tag("resumed_from", str(target.checkpoint))
            for key, (old, new) in target.changes.items():
                job.set_tag(f"{resume.CHANGED_TAG_PREFIX}{key}", f"{old} -> {new} (from step {target.step})")
        if p.logger.system_metrics_after_s is not None and p.logger.system_metrics_after_s >= 0:
            job.monitor_system(p.logger.system_metrics_after_s)
        logger = ResumingMLFlowLogger(
            experiment_name=p.logger.experiment_name,
            tracking_uri=uri,
            run_id=job.run_id,
            already_logged=logged_steps(uri, job.run_id) if continued else None,
            synchronous=not p.logger.async_logging,
        )
        try:
            return _fit(p, output_dir, logger=logger, job=job, resume_ckpt=resume_ckpt)
        finally:  # points still held (the logger holds them out of the timed steps) go before the run ends
            logger.send_held()


def _resume_target(p: JobPlan, cfg: DictConfig, uri: str, own_output_dir: Path, tracked: bool) -> resume.ResumePoint | None:
    """What `resume` continues from, checked against this config and the run it continues (tracking/resume.py says
    what may differ); None for a fresh run. Reads only: a refused resume leaves the store and the files as they were.

    `resume=true` continues the interrupted run in its own output directory; `resume=PATH` (a checkpoint, or a
    job's output directory) writes its checkpoints to this job's output directory, wherever the file came from."""
    from sweeplab.tasks.checkpoint import read_checkpoint

    setting = p.container.get("resume", False)
    if setting is False or setting is None:
        return None
    if setting is True:
        run_id, ckpt = resume.find_interrupted_run(uri, p.logger.experiment_name, resume.config_hash(p.container))
        output_dir = ckpt.parent.parent
    else:
        ckpt = Path(str(setting))
        if ckpt.is_dir():
            ckpt = ckpt / "checkpoints" / "last.ckpt" if (ckpt / "checkpoints").is_dir() else ckpt / "last.ckpt"
        run_id, output_dir = None, own_output_dir
    checkpoint = read_checkpoint(ckpt)  # names a missing, truncated or foreign file
    step = int(checkpoint.get("global_step", 0))
    may_differ = resume.may_change(OmegaConf.to_container(cfg, resolve=False))
    resume.check_model(checkpoint, ckpt, p.family.name, p.model_config, p.model_values, may_differ)
    if step > p.trainer.max_steps:
        raise ConfigError("trainer.max_steps", f"{p.trainer.max_steps} is below the step of checkpoint {ckpt} ({step})")
    changes: dict[str, tuple[str, str]] = {}
    if setting is not True and tracked:
        run_id = (checkpoint.get("sweeplab") or {}).get("mlflow_run_id")
        run = resume.find_run(uri, run_id) if run_id else None
        if run is None:
            log.warning("resume: the run of checkpoint %s (%s) is not in %s; its training continues as a new run",
                        ckpt, run_id or "none recorded", uri)
            run_id = None
        else:
            changes = resume.param_changes(run, mlflow_store.flatten(p.container), may_differ, ckpt)
            finished_at = run.data.params.get("trainer.max_steps", "0")
            if run.info.status == "FINISHED" and not p.trainer.max_steps > int(finished_at):
                raise UserError(
                    f"resume: run {run_id} of checkpoint {ckpt} is FINISHED; resuming it only trains it longer "
                    f"(trainer.max_steps above its {finished_at})"
                )
    what = f"run {run_id}" if run_id else ("as a new run" if tracked else "training")
    log.info("resume: continuing %s from %s (step %d); checkpoints go to %s", what, ckpt, step, output_dir / "checkpoints")
    return resume.ResumePoint(ckpt, step, run_id, output_dir, changes)


def _fit(p: JobPlan, output_dir: Path, logger, job, resume_ckpt: Path | None) -> float | None:
    devices.release_earlier_jobs()  # whatever ran before this job in the process leaves no garbage or cached memory behind
    if p.backend == "mlx":  # Lightning does not run MLX: sweeplab's own loop, same data, metrics, runs and files
        from sweeplab.mlx.loop import fit

        return fit(p, output_dir, logger, job, resume_ckpt)
    datamodule = p.datamodule
    datamodule.prepare_data()
    datamodule.setup("fit")
    model_config = p.family.fit_model_to_data(p.model_config, datamodule, p.model_values)
    if job is not None and resume_ckpt is None and p.logger.log_dataset:
        data_path = _training_data_path(datamodule)
        if data_path is not None:
            job.log_training_data(data_path, name=data_path.name)
    task = build_task(p.family, model_config, p.container.get("loss") or {}, p.optim)
    task.mlflow_run_id = job.run_id if job is not None else None
    if p.compile_mode != "off":
        fresh_compiler()
    task.configure_training(p.compile_mode, p.cuda_graph, p.steps_per_batch)

    best = BestCheckpoint(output_dir / "checkpoints", monitor=p.family.monitor, mode=p.family.monitor_mode)
    last = LastCheckpoint(output_dir / "checkpoints", every_n_steps=p.checkpoint.every_n_steps)
    timer = ThroughputTimer(**p.timing)
    callbacks = [timer, NonFiniteGuard(**p.guard), ValidateAtLastStep(), best, last, *task.extra_callbacks()]
    callbacks.append(ResumableDataCheck(resuming=resume_ckpt is not None))
    if job is not None:
        from sweeplab.tracking.run_logger import MetricsStoredAtCheckpoint

        callbacks.append(MetricsStoredAtCheckpoint())
    if (fault := FaultInjection.from_env()) is not None:
        callbacks.append(fault)

    if p.trainer.enable_progress_bar:
        callbacks.append(LoggedLossProgressBar(refresh_rate=p.trainer.log_every_n_steps))
    trainer = _trainer(p, callbacks, logger=logger, output_dir=output_dir, clips=task.automatic_optimization)
    tuned = tuning.tune_batch_size(trainer, task, datamodule, p.tune)  # None unless tune.batch_size is set
    if tuned is not None and job is not None:
        job.set_tag("tuned.batch_size", str(tuned))
    trainer.fit(task, datamodule=datamodule, ckpt_path=str(resume_ckpt) if resume_ckpt else None)
    summary = distributed.job_summary({**timer.summary, **task.summary_metrics(trainer)}, trainer.world_size)
    if job is not None:
        job.log_metrics(summary, step=trainer.global_step)
        if best.best_model_path:
            job.set_tag("checkpoint", best.best_model_path)
    if job is not None and best.best_model_path and p.logger.log_checkpoint:
        job.log_artifact_capped(best.best_model_path, "checkpoints", p.logger.max_artifact_mb)
    if best.best_model_path:  # export=coreml: a Core ML package of the best checkpoint; export=none: nothing
        from sweeplab.export import export_after_training

        export_after_training(
            p.container.get("export"), best.best_model_path, output_dir / "export",
            job.run_id if job is not None else None, job.uri if job is not None else None,
        )
    monitored = _monitored(trainer, best, p.family.monitor)
    log.info("%s", final_line(job, p.family.monitor, monitored, summary))
    if job is not None and p.logger.log_job_log and (job_log := _job_log_file()) is not None:
        job.log_artifact_capped(job_log, None, p.logger.max_artifact_mb)
    return monitored


def final_line(job, monitor: str, monitored: float | None, summary: dict) -> str:
    """The run's one closing line: its name, the metric a sweep compares, the throughput, where to see it."""
    parts = [f"best {monitor} {monitored:.4g}" if monitored is not None else f"{monitor} n/a"]
    if (rate := summary.get("summary/samples_per_sec")) is not None:
        parts.append(f"{rate:,.0f} samples/s")
    if (step := summary.get("summary/step_time_s_median")) is not None:
        parts.append(f"{step * 1000:.0f} ms/step" if step >= 0.1 else f"{step * 1000:.3g} ms/step")
    if job is None:
        return "done (not tracked): " + ", ".join(parts)
    url = mlflow_store.run_url(mlflow_store.ui_base(job.uri), job.experiment_id, job.run_id)
    return f"done: {job.run_name}: {', '.join(parts)}; {url}"


def build_task(family, model_config, loss_values: dict, optim: OptimConfig):
    """The family's task, checked against the contract the rest of the app relies on."""
    from sweeplab.tasks.base import SweepTask

    task = family.build_task(model_config, loss_values, optim)
    if not isinstance(task, SweepTask):
        raise UserError(f"family {family.name}: build_task returned a {type(task).__name__}, not a sweeplab SweepTask")
    if task.family != family.name:
        raise UserError(f"family {family.name}: its task {type(task).__name__} says family={task.family!r}; set it "
                        f"to {family.name!r} (checkpoints name their family by it)")
    return task


def _training_data_path(datamodule) -> Path | None:
    """The file or directory a datamodule trains on (the demo data's directory once prepared); None: in memory."""
    path = getattr(datamodule, "path", None)
    if path is None and hasattr(datamodule, "_data_path"):  # TextBridge's demo data, prepared on first use
        path = datamodule._data_path()
    return Path(path) if path is not None and Path(path).exists() else None


def _job_log_file() -> Path | None:
    """The log file Hydra's job logging writes (<job dir>/<job name>.log); None outside Hydra."""
    try:
        from hydra.core.hydra_config import HydraConfig

        hc = HydraConfig.get()
    except ValueError:
        return None
    path = Path(hc.runtime.output_dir) / f"{hc.job.name}.log"
    return path if path.exists() else None


def _trainer(p: JobPlan, callbacks: list, logger, output_dir: Path, clips: bool = True) -> L.Trainer:
    """`clips`: Lightning clips the gradients (automatic optimization); otherwise the task's own step does
    (cuda_graph, several steps per batch), and Lightning refuses a clip value under manual optimization."""
    t = p.trainer
    precision_plugins = backends.precision_plugins(t.precision, p.backend)
    return L.Trainer(
        accelerator=p.backend,
        devices=t.devices,
        precision=None if precision_plugins else t.precision,
        max_steps=t.max_steps,
        max_epochs=-1,
        # in training batches, which hold p.steps_per_batch optimizer steps each (plan() checked they divide it)
        val_check_interval=-(-t.val_check_interval // p.steps_per_batch),
        check_val_every_n_epoch=None,  # count validation intervals in steps, across epochs
        limit_val_batches=t.limit_val_batches,
        num_sanity_val_steps=t.num_sanity_val_steps,
        log_every_n_steps=t.log_every_n_steps,
        accumulate_grad_batches=t.accumulate_grad_batches,
        gradient_clip_val=(p.optim.grad_clip or None) if clips else None,
        gradient_clip_algorithm="norm",
        plugins=[AtomicCheckpointIO(), *precision_plugins],
        deterministic=t.deterministic,
        enable_progress_bar=t.enable_progress_bar,
        enable_model_summary=False,
        callbacks=callbacks,
        logger=logger,
        default_root_dir=str(output_dir),
        **distributed.trainer_options(t.devices),  # DDP: ranks > 0 re-create this one job; the sampler shards itself
    )


def _monitored(trainer: L.Trainer, checkpoint: ModelCheckpoint, monitor: str) -> float | None:
    if checkpoint.best_model_score is not None:
        return float(checkpoint.best_model_score)
    value = trainer.callback_metrics.get(monitor)
    return float(value) if value is not None else None


def record_failed_job(cfg: DictConfig, exc: BaseException) -> None:
    """Make sure a failed sweep job has a FAILED MLflow run, also when it failed before its run existed."""
    if getattr(exc, "sweeplab_run_id", None):  # JobRun already marked its run FAILED
        return
    logger = cfg.get("logger") or {}
    if not logger.get("enabled", True):
        return
    try:
        uri = mlflow_store.resolve_uri(logger.get("tracking_uri"))
        _, sweep_dir = _hydra_runtime()
        family = (cfg.get("model") or {}).get("family", "?")
        mlflow_store.JobRun(
            uri,
            logger.get("experiment_name", "sweeplab"),
            naming.failed_job_name(str(family)),
            tags={"family": str(family), "sweep_id": Path(sweep_dir).name if sweep_dir else ""},
            params={},
            parent_run_id=mlflow_store.read_parent_run_id(sweep_dir),
        ).fail(exc)
    except Exception as again:
        log.warning("could not record the failed job in MLflow: %s", again)
