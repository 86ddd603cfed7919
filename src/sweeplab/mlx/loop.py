"""backend=mlx: sweeplab's own small training loop (Lightning does not run MLX), sharing everything but the step.

Shared with the Lightning path, not copied:
- config, data: the family's datamodule and its loaders (torch batches, converted to MLX arrays per step);
- initial weights: the family's PyTorch task builds the model from the seed and its weights are converted, so a
  cpu job and an mlx job of one sweep start from the same numbers;
- validation metrics: the task's own `validation_step` / `on_validation_epoch_*` run on the MLX model's outputs
  (converted to torch tensors), their `self.log` calls reduced as Lightning reduces them (batch-size weighted mean);
- timing: the `ThroughputTimer` callback itself, driven through the few hooks it has, with `mx.synchronize` as its
  device sync (warm-up excluded, sync at window edges, validation and checkpoint writing excluded, `summary/*`);
- MLflow: the same logger class, metric names, tags (plus `mlx`, its version) and run layout;
- checkpoints: Lightning-format files with the PyTorch state dict (`tasks/checkpoint.load_model` reads them), so
  report and export work on an MLX-trained model.

Not done here (refused up front by `check_plan`): resume, gradient accumulation, several devices, mixed precision.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import torch

from sweeplab import backends, distributed
from sweeplab.callbacks.guard import NonFiniteError, NonFiniteGuard
from sweeplab.callbacks.timing import ThroughputTimer
from sweeplab.errors import ConfigError
from sweeplab.tasks.checkpoint import AtomicCheckpointIO
from sweeplab.tasks.optim import lr_at

log = logging.getLogger(__name__)


def check_plan(p) -> None:
    """What the MLX loop cannot do yet, refused before any run exists (backends.check_combination has the rest)."""
    container = p.container
    backends.mlx_device(p.backend_config.device)  # backend.device=gpu where MLX has none
    if p.family.build_mlx_model is None:
        raise ConfigError("backend", f"the {p.family.name} family has no MLX model; use a PyTorch backend")
    if container.get("resume") not in (False, None):
        raise ConfigError("resume", "backend=mlx does not resume runs yet; start a new run (resume=false)")
    if (container.get("data") or {}).get("on_device"):
        raise ConfigError("data.on_device", "keeps batches on a torch device; backend=mlx converts each batch: use false")
    if (container.get("tune") or {}).get("batch_size"):
        raise ConfigError("tune.batch_size", "the batch-size finder is Lightning's; not with backend=mlx")
    if p.timing.get("profile") or p.timing.get("trace_steps"):
        raise ConfigError("timing.profile", "the phase profiler and trace are torch's; not with backend=mlx")


def to_mx(batch: dict) -> dict:
    import mlx.core as mx

    return {k: mx.array(v.numpy()) for k, v in batch.items() if torch.is_tensor(v)}


class _LoggedValues:
    """Stands in for LightningModule.log / log_dict during validation: epoch values as Lightning reduces them."""

    def __init__(self):
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}

    def log(self, name: str, value, *args, batch_size: int | None = None, **kwargs) -> None:
        weight = float(batch_size or 1)
        self.sums[name] = self.sums.get(name, 0.0) + float(value) * weight
        self.weights[name] = self.weights.get(name, 0.0) + weight

    def log_dict(self, values: dict, *args, batch_size: int | None = None, **kwargs) -> None:
        for name, value in values.items():
            self.log(name, value, batch_size=batch_size)

    def values(self) -> dict[str, float]:
        return {name: total / self.weights[name] for name, total in self.sums.items()}


class _TimerModule:
    """What ThroughputTimer asks of the LightningModule: the task's batch counts, and a shape warm-up through the
    compiled MLX step."""

    device = torch.device("cpu")  # the timer's device-side calls (peak memory: the process's RSS) see the host

    def __init__(self, task, step):
        self.task, self.step = task, step

    def samples_in(self, batch):
        return self.task.samples_in(batch)

    def tokens_in(self, batch):
        return self.task.tokens_in(batch)

    def flops_in(self, batch):
        return self.task.flops_in(batch)

    def transfer_batch_to_device(self, batch, device, index):
        return batch

    def warm_up_shapes(self, batches, passes: int = 1) -> None:
        self.step.warm_up([to_mx(b) for b in batches], passes)


def fit(p, output_dir: Path, logger, job, resume_ckpt) -> float | None:
    import mlx.core as mx

    from sweeplab.mlx import convert
    from sweeplab.mlx.optim import build_optimizer
    from sweeplab.mlx.step import CompiledStep
    from sweeplab.training import _training_data_path, build_task, final_line

    datamodule = p.datamodule
    datamodule.prepare_data()
    datamodule.setup("fit")
    model_config = p.family.fit_model_to_data(p.model_config, datamodule, p.model_values)
    if job is not None:
        job.set_tag("mlx", mx.__version__)
        if p.logger.log_dataset and (data_path := _training_data_path(datamodule)) is not None:
            job.log_training_data(data_path, name=data_path.name)
    task = build_task(p.family, model_config, p.container.get("loss") or {}, p.optim)
    task.mlflow_run_id = job.run_id if job is not None else None
    model = p.family.build_mlx_model(model_config)
    convert.load_state_dict(model, task.model.state_dict())
    loss_config = getattr(task, "loss_config", None)
    guard = NonFiniteGuard(**p.guard)  # its config checks; the checks themselves run on the step's flag below
    max_steps = p.trainer.max_steps
    step_fn = CompiledStep(
        model,
        lambda batch: model.training_loss(batch, loss_config),
        build_optimizer(p.optim, max_steps),
        p.optim.grad_clip,
        skip_nonfinite=guard.mode == "skip",
    )
    loggers = [logger] if logger else []
    trainer = SimpleNamespace(  # what ThroughputTimer reads of a Lightning Trainer
        accumulate_grad_batches=1, precision="32-true", sanity_checking=False, max_steps=max_steps,
        datamodule=datamodule, loggers=loggers, default_root_dir=str(output_dir), global_step=0,
        fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(_batches_that_stepped=0)),
    )
    timer = ThroughputTimer(**p.timing, sync=lambda device: mx.synchronize())
    timer_module = _TimerModule(task, step_fn)
    best = _Best(output_dir / "checkpoints", p.family.monitor, p.family.monitor_mode)

    def log_metrics(metrics: dict[str, float], step: int) -> None:
        for each in loggers:
            each.log_metrics(metrics, step=step)

    def checkpoint(step: int) -> dict:
        return {
            "state_dict": {f"model.{k}": v for k, v in convert.state_dict(model).items()},
            "hyper_parameters": dict(task.hparams),
            "global_step": step,
            "epoch": 0,
            "sweeplab": {"mlflow_run_id": task.mlflow_run_id, "backend": "mlx"},
        }

    def validate(step: int, batch_index: int) -> None:
        timer.on_validation_start(trainer, timer_module)
        values = _validate(task, model, datamodule, p.trainer.limit_val_batches)
        log_metrics(values, batch_index)
        if p.family.monitor in values:
            best.update(values[p.family.monitor], step, lambda: checkpoint(step))
        timer.on_validation_end(trainer, timer_module)

    def log_model_values(step: int) -> None:
        """The model's own figures (the LM's α per layer) at `step` optimizer steps, as AlphaScheduleCallback."""
        if hasattr(model, "before_step"):
            model.before_step(step)
        if hasattr(model, "logged_values"):
            log_metrics(model.logged_values(), step)

    step = 0
    log_model_values(0)
    consecutive_skips = 0
    first_bad = None
    timer.on_train_start(trainer, timer_module)
    loader = datamodule.train_dataloader()  # one loader for the whole fit: its sampler moves on to the next epoch
    while step < max_steps:
        for batch in loader:
            timer.on_train_batch_start(trainer, timer_module, batch, step)
            if hasattr(model, "before_step"):
                model.before_step(step)
            loss, metrics, norm, finite = step_fn(to_mx(batch))
            mx.async_eval(loss, metrics, norm, finite, step_fn.state)  # one evaluation per step, not waited for
            if guard.mode == "skip":
                if finite.item():
                    consecutive_skips = 0
                else:
                    consecutive_skips += 1
                    log.warning("non-finite loss or gradient at step %d: step skipped", step)
                    if consecutive_skips > guard.max_consecutive_skips:
                        raise NonFiniteError(f"{consecutive_skips} non-finite steps in a row up to step {step}: the "
                                             "run diverged; lower optim.lr or check the data")
            elif guard.mode == "stop":  # the first bad step recorded lazily; read back every check_every_n_steps
                bad_here = mx.where(finite, -1, step)
                first_bad = bad_here if first_bad is None else mx.where(first_bad >= 0, first_bad, bad_here)
                if (step + 1) % guard.check_every_n_steps == 0 and first_bad.item() >= 0:
                    raise NonFiniteError(
                        f"non-finite loss or gradient norm at step {first_bad.item()} (loss={loss.item():.4g}, "
                        f"grad_norm={norm.item():.4g}): lower optim.lr, check the data, or set guard.mode=skip"
                    )
            lr = lr_at(step, p.optim, max_steps)
            # Lightning's numbering: a batch's metrics are logged at its index, global_step counts optimizer steps
            batch_index = step
            step += 1
            trainer.global_step, trainer.fit_loop.epoch_loop._batches_that_stepped = step, batch_index
            timer.on_train_batch_end(trainer, timer_module, None, batch, batch_index)
            if step % p.trainer.log_every_n_steps == 0:
                log_metrics({"train/loss": loss.item(), **{k: v.item() for k, v in metrics.items()}, "lr": lr}, batch_index)
                log_model_values(step)
            if step % p.trainer.val_check_interval == 0 or step >= max_steps:
                validate(step, batch_index)
            if step >= max_steps:
                break
    if first_bad is not None and first_bad.item() >= 0:  # a bad step after the last full check interval
        raise NonFiniteError(f"non-finite loss or gradient norm at step {first_bad.item()}: lower optim.lr, check the "
                             "data, or set guard.mode=skip")
    timer.on_train_end(trainer, timer_module)

    task.model.load_state_dict(convert.state_dict(model))  # the trained weights, for the task's summary figures
    summary = distributed.job_summary({**timer.summary, **task.summary_metrics(trainer)}, 1)
    if job is not None:
        job.log_metrics(summary, step=step)
        if logger is not None:
            logger.wait_for_writes()
        if best.path:
            job.set_tag("checkpoint", str(best.path))
            if p.logger.log_checkpoint:
                job.log_artifact_capped(best.path, "checkpoints", p.logger.max_artifact_mb)
    if best.path:
        from sweeplab.export import export_after_training

        export_after_training(
            p.container.get("export"), str(best.path), output_dir / "export",
            job.run_id if job is not None else None, job.uri if job is not None else None,
        )
    log.info("%s", final_line(job, p.family.monitor, best.score, summary))
    return best.score


def _validate(task, model, datamodule, limit_val_batches) -> dict[str, float]:
    """The task's validation hooks on the MLX model's outputs; {metric: value} as Lightning would log them."""
    import mlx.core as mx

    from sweeplab.mlx import convert

    def forward(*args):
        out = model(*(mx.array(a.numpy()) for a in args))
        return convert.to_torch(out)

    logged = _LoggedValues()
    own_forward = task.forward_fn
    task.forward_fn, task.log, task.log_dict = forward, logged.log, logged.log_dict
    model.eval()
    try:
        loader = datamodule.val_dataloader()
        limit = _batch_limit(limit_val_batches, len(loader))
        task.on_validation_epoch_start()
        with torch.no_grad():
            for index, batch in enumerate(loader):
                if index >= limit:
                    break
                task.validation_step(batch, index)
        task.on_validation_epoch_end()
    finally:
        model.train()
        task.forward_fn = own_forward
        del task.log, task.log_dict  # back to LightningModule's own
    return logged.values()


def _batch_limit(limit, available: int) -> int:
    if isinstance(limit, float):
        return int(available * limit) if limit < 1.0 else available
    return min(int(limit), available)


class _Best:
    """The best checkpoint so far (`best-step{N}.ckpt`, one file), as the Lightning path's BestCheckpoint."""

    def __init__(self, directory: Path, monitor: str, mode: str):
        self.directory, self.monitor, self.mode = directory, monitor, mode
        self.path: Path | None = None
        self.score: float | None = None

    def update(self, value: float, step: int, make_checkpoint) -> None:
        better = self.score is None or (value < self.score if self.mode == "min" else value > self.score)
        if not better:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"best-step{step}.ckpt"
        AtomicCheckpointIO().save_checkpoint(make_checkpoint(), path)
        if self.path is not None and self.path != path:
            self.path.unlink(missing_ok=True)
        self.path, self.score = path, float(value)


__all__ = ["check_plan", "fit", "to_mx"]
