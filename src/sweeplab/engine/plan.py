"""A job's plan: the whole config checked and turned into typed settings before anything is built or written.

`plan(cfg)` reads every group once, raises ConfigError naming the key for a bad value or a combination that cannot
run (the rules: sweeplab.engine.rules), and returns a JobPlan; sweeplab.engine.training runs it.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import lightning as L
from annotated_types import Ge, Interval
from omegaconf import DictConfig, OmegaConf

from sweeplab.callbacks.guard import NonFiniteGuard
from sweeplab.callbacks.timing import StepTimer
from sweeplab.core import host_arch
from sweeplab.core.config import bind, build
from sweeplab.core.console import once
from sweeplab.core.errors import ConfigError
from sweeplab.engine import rules, settings, tuning
from sweeplab.export.options import options_from_config
from sweeplab.families import check_contract, get_family
from sweeplab.policies import stopping
from sweeplab.runtime import backends
from sweeplab.tasks.optim import OptimConfig
from sweeplab.tracking import mlflow_store, resume

log = logging.getLogger(__name__)


@dataclass
class TrainerConfig:
    max_steps: Annotated[int, Ge(1)] = 200
    val_check_interval: Annotated[int, Ge(1)] = 50  # optimizer steps between validations
    limit_val_batches: Annotated[int, Ge(0)] | Annotated[float, Interval(ge=0, le=1)] = 1.0  # batches | share
    log_every_n_steps: Annotated[int, Ge(1)] = 10
    precision: Literal["32-true", "bf16-mixed", "16-mixed", "bf16-true"] = "32-true"  # backends.PRECISIONS
    accumulate_grad_batches: Annotated[int, Ge(1)] = 1
    devices: Annotated[int, Ge(1)] = 1
    num_sanity_val_steps: Annotated[int, Ge(-1)] = 0  # -1: the whole validation set
    enable_progress_bar: bool | Literal["auto"] = "auto"  # auto: a job run alone at a terminal (console.progress_bar_shown)
    deterministic: bool = False


@dataclass
class LoggerConfig:
    tracking_uri: str | None = None  # null: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db
    experiment_name: str = "sweeplab"
    enabled: bool = True
    # false: the job writes its held metric points itself, at its pauses (validation, checkpoints, the end), with the
    # clock stopped; true: MLflow's background thread writes them (synchronous=False). Off by default: the thread
    # saved no step time (the points are held out of the timed steps either way), and ending a run joins it, which
    # waits out the thread's 1 s queue poll: a 6-job smoke sweep took 16.9-18.9 s with it and 11.9 s without
    # (docs/study-cost.md)
    async_logging: bool = False
    system_metrics_after_s: float | None = 60.0  # MLflow's system/* sampler for jobs running longer; null: off
    log_checkpoint: bool = True  # the best checkpoint as a run artifact (checkpoints/)
    log_job_log: bool = True  # the job's log file as a run artifact
    max_artifact_mb: float = 200.0  # larger files stay on disk only (the `checkpoint` tag still names them)
    log_dataset: bool = True  # the training data as the run's MLflow dataset input, with a digest


@dataclass
class CheckpointConfig:
    """What a job writes, when and on which thread (docs/study-cost.md says why these defaults)."""

    every_n_steps: Annotated[int, Ge(1)] | None = None  # last.ckpt (what `resume=true` continues from) every N optimizer steps
    every_n_seconds: Annotated[float, Ge(0)] | None = 60.0  # ... and/or when this long has passed since the last one; both null: at the end
    background: bool = True  # write, hash and rename on a writer thread; the training thread only copies the state
    best: Literal["weights", "full"] = "weights"  # best-step{N}.ckpt: weights (no optimizer state) | full (what last.ckpt holds)
    # a FINISHED job's last.ckpt (weights + optimizer state, ~3x its best checkpoint) is what only extending it reads:
    # dropped when the run ends FINISHED unless kept (the report reads MLflow, the export the best checkpoint)
    keep_last: bool = False


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
    loss_config: Any = None  # the `loss` group as the family's make_loss_config built it (handed to its task as is)
    stop: stopping.StopConfig = stopping.StopConfig()  # stop what is decided (policies/stopping.py)
    stop_target: float | None = None  # report.target, where stop.* needs it
    fitted_model_config: Any = None  # model_config with what the data decides filled in (engine.job.resolve_model)
    compile_scope: str = "whole"  # whole | regions (tasks/base.py: configure_training)
    compile_validation: bool = False  # validation compiled too, else eager
    compile_cache: str = "study"  # study | shared: where inductor's caches live (engine/training.share_compile_cache)
    may_change_on_resume: frozenset[str] = frozenset()  # flattened keys a resume may change (tracking/resume.may_change)


def _family_name(model: dict) -> str:
    """The model group's `family:`; one line saying what to add when the group has none (a family's own
    model/<name>.yaml must name its family: the record is found by that name, not by the file's)."""
    name = model.get("family")
    if not name:
        choice = _model_choice()
        where = f"conf/model/{choice}.yaml (or its package's conf/model/{choice}.yaml)" if choice else "the model group"
        raise ConfigError("model.family", f"the model group has no `family:` key; add `family: <the name in your "
                                          f"Family record>` at the top of {where}")
    return str(name)


def _model_choice() -> str | None:
    try:
        from hydra.core.hydra_config import HydraConfig

        return str(HydraConfig.get().runtime.choices.get("model"))
    except Exception:  # not under Hydra (bench, profile, tests composing by hand)
        return None


def plan(cfg: DictConfig) -> JobPlan:
    """Check every group before any work happens; a mistake raises ConfigError naming the key."""
    host_arch.check_native()  # `python -m` refused already; a notebook or another program calling train() here
    try:
        container = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except Exception as exc:  # an interpolation or a ??? value
        raise ConfigError(getattr(exc, "full_key", "config") or "config", str(exc).splitlines()[0]) from None
    container.pop("hydra", None)
    family = get_family(_family_name(container["model"]))
    settings.check_values(container)  # every value against the annotations, before anything heavy is built
    check_contract(family, container)  # a record missing a piece is named now, before anything is built
    model_config = family.make_model_config(container["model"])
    optim = build(OptimConfig, container["optim"], "optim")
    trainer = build(TrainerConfig, container["trainer"], "trainer")
    if optim.warmup_steps > trainer.max_steps:
        # A warning, not an error: short throughput runs (the bench's rows, a smoke check) stop inside the warm-up on
        # purpose and the schedule does not matter there; elsewhere the run never trains at the lr it records.
        peak = max(optim.min_lr, optim.lr * trainer.max_steps / optim.warmup_steps)
        once(
            log, logging.WARNING, "optim.warmup_steps=%d is longer than the run (trainer.max_steps=%d): the learning rate peaks at %.3g, "
            "never reaching optim.lr=%.3g; lower optim.warmup_steps for a run that trains at optim.lr",
            optim.warmup_steps, trainer.max_steps, peak, optim.lr,
        )
    backend_config = build(backends.BackendConfig, container["backend"], "backend")
    timing = bind(StepTimer, container.get("timing", {}), "timing", ignore=frozenset({"sync", "clock"}))
    logger = build(LoggerConfig, container["logger"], "logger")
    options_from_config(container.get("export"))
    guard = bind(NonFiniteGuard, container.get("guard", {}), "guard")
    build(NonFiniteGuard, guard, "guard")  # its own range checks
    checkpoint = build(CheckpointConfig, container.get("checkpoint", {}), "checkpoint")
    tune = build(tuning.TuneConfig, container.get("tune") or {}, "tune")
    compile_mode, compile_scope, compile_validation, compile_cache = settings.check_top_level(container)
    if compile_scope == "regions" and compile_mode != "off" and family.model is not None:
        from sweeplab.tasks.base import check_compile_regions

        check_compile_regions(family.target("model"), family.name)
    cuda_graph = container.get("cuda_graph", False)
    steps_per_batch = container.get("steps_per_batch", 1)
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
    rules.check_speed_switches(model_config, backend, compile_mode)
    container["data"] = family.data_group(container)  # what the family decides from the whole config is recorded
    datamodule = family.make_datamodule(container["data"], model_config)
    settings.check_data_path(getattr(datamodule, "path", None))
    if steps_per_batch > 1:
        rules.check_steps_per_batch(steps_per_batch, cuda_graph, container, trainer, checkpoint, guard, timing, tune,
                                    datamodule)
        datamodule.steps_per_batch = steps_per_batch
    loss_config = family.make_loss_config(container.get("loss") or {})
    stop = build(stopping.StopConfig, container.get("stop") or {}, "stop")
    stop_target = stopping.check(stop, (container.get("report") or {}).get("target"), backend)
    p = JobPlan(
        family, container["model"], model_config, optim, trainer, backend_config, backend, compile_mode, cuda_graph,
        timing, logger, container, datamodule, guard, checkpoint, tune, steps_per_batch, loss_config, stop, stop_target,
        compile_scope=compile_scope, compile_validation=compile_validation, compile_cache=compile_cache,
        may_change_on_resume=frozenset(resume.may_change(OmegaConf.to_container(cfg, resolve=False))),
    )
    if backend == "mlx":
        rules.check_mlx(p)
    return p


def job_params(p: JobPlan) -> dict[str, str]:
    """A job's first MLflow params: the flattened resolved config, less the model keys the group leaves null (what
    `size` and the data decide): those are logged once the data is set up, as built (model_params), so a run says
    `model.d_model: 256`, never the group's `None`."""
    return {k: v for k, v in mlflow_store.flatten(p.container).items()
            if not (k.startswith("model.") and v == "None")}


def model_params(p: JobPlan, model_config: Any) -> dict[str, str]:
    """The model keys job_params left out, with the values the job's model was built with (its size's, the
    data's vocabulary); after fit_model_to_data."""
    if not dataclasses.is_dataclass(model_config):
        return {}
    first = job_params(p)
    built = mlflow_store.flatten({"model": dataclasses.asdict(model_config)})
    return {k: v for k, v in built.items() if k not in first and v != "None"}
