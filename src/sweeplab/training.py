"""One training job: validate the whole config, build data/task/callbacks/trainer, fit, record it in MLflow.

`sweeplab.train` is the Hydra entry point around `train(cfg)`; tests call `train` with a composed config.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import DictConfig, OmegaConf

from sweeplab import backends
from sweeplab.callbacks.timing import ThroughputTimer
from sweeplab.config import bind, build
from sweeplab.errors import ConfigError
from sweeplab.families import get_family
from sweeplab.tasks.optim import OptimConfig
from sweeplab.tracking import mlflow_store

log = logging.getLogger(__name__)


@dataclass
class TrainerConfig:
    max_steps: int = 200
    val_check_interval: int = 50  # optimizer steps between validations
    limit_val_batches: int | float = 1.0
    log_every_n_steps: int = 10
    precision: str = "32-true"
    accumulate_grad_batches: int = 1
    devices: int = 1
    num_sanity_val_steps: int = 0
    enable_progress_bar: bool = True
    deterministic: bool = False

    def __post_init__(self) -> None:
        for key in ("max_steps", "val_check_interval", "log_every_n_steps", "accumulate_grad_batches", "devices"):
            if getattr(self, key) <= 0:
                raise ValueError(f"{key} must be > 0, got {getattr(self, key)}")


@dataclass
class LoggerConfig:
    tracking_uri: str | None = None  # null: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db
    experiment_name: str = "sweeplab"
    enabled: bool = True


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
    timing: dict
    logger: LoggerConfig
    container: dict
    datamodule: L.LightningDataModule  # constructed (arguments checked), no data read yet


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
    backend_config = build(backends.BackendConfig, container["backend"], "backend")
    timing = bind(ThroughputTimer, container.get("timing", {}), "timing", ignore=frozenset({"sync", "clock"}))
    logger = build(LoggerConfig, container["logger"], "logger")
    compile_mode = str(container.get("compile", "off"))
    backend = backends.resolve_backend(backend_config.name)
    backends.check_combination(backend, trainer.precision, compile_mode)
    if family.build_task_config is not None:
        family.build_task_config(container.get("loss") or {})
    datamodule = family.build_datamodule(container["data"], model_config)
    return JobPlan(
        family, container["model"], model_config, optim, trainer, backend_config, backend, compile_mode, timing,
        logger, container, datamodule,
    )


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
        "device": backends.device_name(p.backend),
        "family": p.family.name,
        "precision": p.trainer.precision,
        "compile": p.compile_mode,
        "torch": torch.__version__,
        "lightning": L.__version__,
        "git_commit": mlflow_store.git_commit(),
        "sweep_id": Path(sweep_dir).name if sweep_dir else "",
    }


def run_name(p: JobPlan, cfg: DictConfig) -> str:
    parts = [p.family.run_name(cfg), p.backend]
    if p.trainer.precision != "32-true":
        parts.append(p.trainer.precision)
    if p.compile_mode != "off":
        parts.append(f"compile={p.compile_mode}")
    return " ".join(parts)


def train(cfg: DictConfig) -> float | None:
    """Run one job; returns the monitored validation metric (what a sweeper optimises)."""
    p = plan(cfg)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    backends.apply_backend_settings(p.backend_config, p.backend)

    datamodule = p.datamodule
    datamodule.prepare_data()
    datamodule.setup("fit")
    model_config = p.family.fit_model_to_data(p.model_config, datamodule, p.model_values)
    task = p.family.build_task(model_config, p.container.get("loss") or {}, p.optim)
    if p.compile_mode != "off":
        task.model.compile(mode=None if p.compile_mode == "default" else p.compile_mode)

    output_dir, sweep_dir = _hydra_runtime()
    checkpoint = ModelCheckpoint(
        dirpath=output_dir / "checkpoints",
        filename="best-step{step}",
        monitor=task.monitor,
        mode=task.monitor_mode,
        save_last=True,
        auto_insert_metric_name=False,
    )
    timer = ThroughputTimer(**p.timing)
    callbacks = [timer, checkpoint, *task.extra_callbacks()]

    if not p.logger.enabled:
        trainer = _trainer(p, callbacks, logger=False, output_dir=output_dir)
        trainer.fit(task, datamodule=datamodule)
        _final_validation(trainer, task, datamodule, p)
        return _monitored(trainer, checkpoint, task)

    uri = mlflow_store.resolve_uri(p.logger.tracking_uri)
    job = mlflow_store.JobRun(
        uri,
        p.logger.experiment_name,
        run_name(p, cfg),
        tags=run_tags(p, sweep_dir),
        params=mlflow_store.flatten(p.container),
        parent_run_id=mlflow_store.read_parent_run_id(sweep_dir),
    )
    with job:
        from lightning.pytorch.loggers import MLFlowLogger

        job.log_text(OmegaConf.to_yaml(p.container), "config.yaml")
        logger = MLFlowLogger(experiment_name=p.logger.experiment_name, tracking_uri=uri, run_id=job.run_id)
        trainer = _trainer(p, callbacks, logger=logger, output_dir=output_dir)
        trainer.fit(task, datamodule=datamodule)
        if trainer.interrupted:
            raise KeyboardInterrupt("training interrupted")
        _final_validation(trainer, task, datamodule, p)
        summary = {**timer.summary, **task.summary_metrics(trainer)}
        job.log_metrics(summary, step=trainer.global_step)
        job.set_tag("output_dir", str(output_dir))
        if checkpoint.best_model_path:
            job.set_tag("checkpoint", checkpoint.best_model_path)
        log.info("run %s: %s", job.run_id, ", ".join(f"{k}={v:.4g}" for k, v in sorted(summary.items())))
        return _monitored(trainer, checkpoint, task)


def _trainer(p: JobPlan, callbacks: list, logger, output_dir: Path) -> L.Trainer:
    t = p.trainer
    return L.Trainer(
        accelerator=p.backend,
        devices=t.devices,
        precision=t.precision,
        max_steps=t.max_steps,
        max_epochs=-1,
        val_check_interval=t.val_check_interval,
        check_val_every_n_epoch=None,  # count validation intervals in steps, across epochs
        limit_val_batches=t.limit_val_batches,
        num_sanity_val_steps=t.num_sanity_val_steps,
        log_every_n_steps=t.log_every_n_steps,
        accumulate_grad_batches=t.accumulate_grad_batches,
        gradient_clip_val=p.optim.grad_clip or None,
        gradient_clip_algorithm="norm",
        deterministic=t.deterministic,
        enable_progress_bar=t.enable_progress_bar,
        enable_model_summary=False,
        callbacks=callbacks,
        logger=logger,
        default_root_dir=str(output_dir),
    )


def _final_validation(trainer: L.Trainer, task, datamodule, p: JobPlan) -> None:
    """Validate at the last step too, so every run ends with validation metrics of its final weights."""
    if trainer.global_step % p.trainer.val_check_interval != 0:
        trainer.validate(task, datamodule=datamodule, verbose=False)


def _monitored(trainer: L.Trainer, checkpoint: ModelCheckpoint, task) -> float | None:
    if checkpoint.best_model_score is not None:
        return float(checkpoint.best_model_score)
    value = trainer.callback_metrics.get(task.monitor)
    return float(value) if value is not None else None
