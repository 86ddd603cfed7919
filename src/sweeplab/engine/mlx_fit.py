"""backend=mlx: sweeplab's own small training loop (Lightning does not run MLX), sharing everything but the step.

Shared with the Lightning path, not copied:
- config, data: the family's datamodule and its loaders (torch batches, converted to MLX arrays per step);
- initial weights: the family's PyTorch task builds the model from the seed and its weights are converted, so a
  cpu job and an mlx job of one sweep start from the same numbers;
- validation metrics: the task's own `validation_step` / `on_validation_epoch_*` run on the MLX model's outputs
  (converted to torch tensors), their `self.log` calls reduced as Lightning reduces them (batch-size weighted mean);
- timing: the `StepTimer` itself (the Lightning path's timer), driven through its loop interface, with `mx.synchronize`
  as its device sync (warm-up excluded, sync at window edges, validation and checkpoint writing excluded, `summary/*`);
- MLflow: the same logger class, metric names, tags (plus `mlx`, its version) and run layout;
- checkpoints: Lightning-format files with the PyTorch state dict (`families/loading.load_model` reads them), so
  report and export work on an MLX-trained model; `best-step{N}.ckpt` and `last.ckpt` when the job's
  CheckpointPolicy says (policies/checkpoints.py, the Lightning callbacks' policy: last.ckpt every
  `checkpoint.every_n_steps` and/or `every_n_seconds` and at the last step, after that step's validation), through
  the same atomic writer, with the metrics they cover in the store first.

Resume (`resume=true` / `resume=PATH`, found and checked by sweeplab.engine.training as for Lightning): last.ckpt also holds
what only this loop reads, under `mlx`: the optimizer's state (moments, step count; float32 bit for bit, under
`optimizer_states` too, where the checkpoint checks look for non-finite values), the training loader's position
(`StatefulDataLoader.state_dict`: the sampler's epoch and batches, so the resumed run sees the same batches). A killed
run resumed from it continues to the bit-identical weights of an uninterrupted run on the same device
(tests/test_mlx_resume.py). Not MLX's random key: mlx 0.32 has no way to set it from Python, so with dropout > 0
(off in every preset) a resumed run draws other dropout masks than an uninterrupted one, and says so.

trainer.precision: 32-true, or bf16-mixed (float32 weights and optimizer, bfloat16 forward and backward:
sweeplab.mlx.step). trainer.accumulate_grad_batches=k: one optimizer step per k batches; every step count
(max_steps, validation, logging, checkpoints, the timer's windows) counts optimizer steps.
Not done here (refused up front by sweeplab.engine.rules.check_mlx): several devices, 16-mixed and bf16-true.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import mlx.core as mx
import torch

from sweeplab.callbacks.faults import FaultInjection
from sweeplab.callbacks.guard import NonFiniteError, NonFiniteGuard, nonfinite_at_end
from sweeplab.callbacks.timing import StepTimer, TimedFit
from sweeplab.core import interrupts, wall
from sweeplab.core.records import JobRun
from sweeplab.data.sampling import check_resumable
from sweeplab.engine.job import FitResult, Job, checkpoint_policy, clear_unfinished_writes, record_batch_size, start_fit
from sweeplab.mlx import convert
from sweeplab.mlx.optim import build_optimizer
from sweeplab.mlx.step import CompiledStep
from sweeplab.policies.checkpoints import CheckpointPolicy, bring_best_files
from sweeplab.runtime import devices, distributed
from sweeplab.tasks.checkpoint import AtomicCheckpointIO, read_checkpoint
from sweeplab.tasks.optim import lr_at

log = logging.getLogger(__name__)

COMPUTE_DTYPES = {"32-true": None, "bf16-mixed": mx.bfloat16}  # trainer.precision -> the step's compute dtype


def to_mx(batch: dict) -> dict:
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


def fit(job: Job) -> FitResult:
    p = job.plan
    datamodule, model_config, task = start_fit(job)
    if job.run is not None:
        job.run.write(JobRun(mlx_version=mx.__version__))
    model = p.family.make_mlx_model(model_config)
    resumed = read_checkpoint(job.resume_ckpt) if job.resume_ckpt is not None else None
    if resumed is not None:
        convert.load_state_dict(model, {k[len("model."):]: v for k, v in resumed["state_dict"].items()})
    else:
        convert.load_state_dict(model, task.model.state_dict())
    optimizer = build_optimizer(p.optim, p.trainer.max_steps)
    if resumed is not None:
        optimizer.state = convert.arrays_from_torch(resumed["mlx"]["optimizer"])
        if getattr(model_config, "dropout", 0.0):
            log.warning("resume: MLX's random key cannot be restored, so with model.dropout=%s the resumed run draws "
                        "other dropout masks than an uninterrupted run would", model_config.dropout)
    guard = NonFiniteGuard(**p.guard)  # its config checks; the checks themselves run on the step's flag below
    step_fn = CompiledStep(
        model,
        lambda batch: model.training_loss(batch, task.loss_config),
        optimizer,
        p.optim.grad_clip,
        skip_nonfinite=guard.mode == "skip",
        compute_dtype=COMPUTE_DTYPES[p.trainer.precision],
        accumulate=p.trainer.accumulate_grad_batches,
    )
    loggers = [job.logger] if job.logger is not None else []

    def log_metrics(metrics: dict[str, float], step: int) -> None:
        for each in loggers:
            each.log_metrics(metrics, step=step)

    timer = StepTimer(**p.timing, sync=lambda device: mx.synchronize())
    gpu = devices.mlx_gpu_name()  # None on the CPU
    timer.start(TimedFit(
        device=torch.device("cpu"),  # the timer's torch-side calls see the host; MLX's peak and memory come below
        precision=p.trainer.precision,
        peak_flops=devices.apple_gpu_peak(gpu) if gpu is not None else None,
        memory=devices.MlxMemory(on_gpu=gpu is not None),
        log_metrics=log_metrics,
        samples_in=task.samples_in,
        tokens_in=task.tokens_in,
        flops_in=task.flops_in,
        out_dir=job.output_dir / "profile",
        warm_up_shapes=_shape_warm_up(datamodule, step_fn, p.trainer.max_steps),
        accumulate=p.trainer.accumulate_grad_batches,
        total_steps=p.trainer.max_steps,
    ))
    clear_unfinished_writes(job.output_dir / "checkpoints")
    best = _Best(job.output_dir / "checkpoints", p.family.monitor, checkpoint_policy(p))
    loop = _Loop(p, task, model, datamodule, step_fn, guard, timer, best, log_metrics)
    loop.before_save = [each.wait_for_writes for each in loggers if hasattr(each, "wait_for_writes")]
    loader = datamodule.train_dataloader()  # one loader for the whole fit: its sampler moves on per epoch
    record_batch_size(job, loader)
    start = 0
    if resumed is not None:
        check_resumable(loader, "resume")
        loader.load_state_dict(resumed["mlx"]["data"])
        best.load_state_dict(resumed.get("callbacks", {}).get(best.state_key) or {})
        start = int(resumed["global_step"])
    wall.mark("trainer")  # the MLX model, its optimizer, compiled step, timer and loader: the loop's own set-up
    wall.clock().end_setup("steps")  # the MLX loop's breakdown: its warm-up and validations count as steps
    with interrupts.at_safe_points():  # a signal is recorded; the loop checks it every step and validation
        step = loop.run(loader, start)
    wall.clock().switch("teardown")
    timer.end(step)
    timer.end_host_probe()
    task.model.load_state_dict(convert.state_dict(model))  # the trained weights, for the task's summary figures
    summary = distributed.job_summary({**timer.summary, **task.summary_metrics(None)}, 1)
    diverged = nonfinite_at_end(task.model, loop.last_values, step) if guard.mode == "off" else None
    if loop.faults is not None and loop.faults.kill_after_fit:
        os.kill(os.getpid(), signal.SIGKILL)
    return FitResult(summary, step, str(best.path) if best.path else None, best.score, timing=timer.run_record(),
                     diverged=diverged)


def _shape_warm_up(datamodule, step_fn, max_steps: int):
    source = getattr(datamodule, "shape_warmup_batches", None)
    if source is None:
        return None

    def warm_up(passes: int) -> list:
        batches = source(max_steps)
        step_fn.warm_up([to_mx(b) for b in batches], passes)
        return batches

    return warm_up


class _Loop:
    """The MLX training loop: steps, the non-finite guard, logging, validation, the best checkpoint and last.ckpt, in
    Lightning's numbering (a batch's metrics are logged at its index; the step count is optimizer steps)."""

    def __init__(self, p, task, model, datamodule, step_fn, guard, timer, best, log_metrics):
        self.p, self.task, self.model, self.datamodule = p, task, model, datamodule
        self.step_fn, self.guard, self.timer, self.best, self.log_metrics = step_fn, guard, timer, best, log_metrics
        self.policy = best.policy  # when last.ckpt is written and which validation is a new best
        self.consecutive_skips = 0
        self.first_bad = None  # the first non-finite step, kept on the device until a check reads it
        self.last_values: dict[str, float] = {}  # the last logged value of each metric
        self.loader = None
        self.before_save: list = []  # called before last.ckpt is written (the loggers' writes waited for)
        self.faults = FaultInjection.from_env()  # reliability tests (callbacks/faults.py): kills, raise, pause

    def run(self, loader, step: int = 0) -> int:
        """Train from optimizer step `step` (0, or a resumed checkpoint's) to trainer.max_steps."""
        max_steps = self.p.trainer.max_steps
        self.loader = loader
        self.policy.start()
        self.log_model_values(step)
        batches = []  # the batches of one optimizer step (trainer.accumulate_grad_batches)
        while step < max_steps:
            for batch in loader:
                interrupts.check()  # a stop request, acted on between steps
                self.timer.batch_start()
                batches.append(batch)
                if len(batches) < self.step_fn.accumulate:
                    continue
                if hasattr(self.model, "before_step"):
                    self.model.before_step(step)
                loss, metrics, norm, finite = self.step_fn(*(to_mx(b) for b in batches))
                mx.async_eval(loss, metrics, norm, finite, self.step_fn.state)  # one evaluation per step, not waited for
                self.check_finite(step, loss, norm, finite)
                batch_index, step = step, step + 1
                for each in batches:
                    self.timer.batch_end(each, batch_index, result=loss)
                batches = []
                if step % self.p.trainer.log_every_n_steps == 0:
                    lr = lr_at(batch_index, self.p.optim, max_steps)
                    logged = {"train/loss": loss.item(), **{k: v.item() for k, v in metrics.items()}, "lr": lr}
                    self.log_metrics(logged, batch_index)
                    self.last_values.update(logged)
                    self.log_model_values(step)
                self.inject_faults(step)
                if step % self.p.trainer.val_check_interval == 0 or step >= max_steps:
                    self.validate(step, batch_index)
                if self.last_checkpoint_due(step):
                    self.save_last(step)
                if step >= max_steps:
                    break
        if self.first_bad is not None and self.first_bad.item() >= 0:  # a bad step after the last full check interval
            raise NonFiniteError(f"non-finite loss or gradient norm at step {self.first_bad.item()}: lower optim.lr, "
                                 "check the data, or set guard.mode=skip")
        return step

    def check_finite(self, step: int, loss, norm, finite) -> None:
        """guard.mode=skip: count skipped steps; stop: record the first bad step lazily, read every check interval."""
        guard = self.guard
        if guard.mode == "skip":
            if finite.item():
                self.consecutive_skips = 0
                return
            self.consecutive_skips += 1
            log.warning("non-finite loss or gradient at step %d: step skipped", step)
            if self.consecutive_skips > guard.max_consecutive_skips:
                raise NonFiniteError(f"{self.consecutive_skips} non-finite steps in a row up to step {step}: the "
                                     "run diverged; lower optim.lr or check the data")
        elif guard.mode == "stop":
            bad_here = mx.where(finite, -1, step)
            self.first_bad = bad_here if self.first_bad is None else mx.where(self.first_bad >= 0, self.first_bad, bad_here)
            if (step + 1) % guard.check_every_n_steps == 0 and self.first_bad.item() >= 0:
                raise NonFiniteError(
                    f"non-finite loss or gradient norm at step {self.first_bad.item()} (loss={loss.item():.4g}, "
                    f"grad_norm={norm.item():.4g}): lower optim.lr, check the data, or set guard.mode=skip"
                )

    def inject_faults(self, step: int) -> None:
        faults = self.faults
        if faults is None:
            return
        if faults.kill_at_step == step:
            os.kill(os.getpid(), signal.SIGKILL)
        if faults.raise_at_step == step:
            raise RuntimeError(f"injected failure at step {step}")
        if faults.pause_at_step == step:
            faults._pause(f"step {step}")  # until a stop is requested or the paused file is removed

    def log_model_values(self, step: int) -> None:
        """The model's own figures (the LM's α per layer) at `step` optimizer steps, as AlphaScheduleCallback."""
        if hasattr(self.model, "before_step"):
            self.model.before_step(step)
        if hasattr(self.model, "logged_values"):
            self.log_metrics(self.model.logged_values(), step)

    def validate(self, step: int, batch_index: int) -> None:
        interrupts.check()
        self.timer.pause()
        values = _validate(self.task, self.model, self.datamodule, self.p.trainer.limit_val_batches)
        if self.faults is not None and self.faults.kill_in_validation_at_step == step:
            os.kill(os.getpid(), signal.SIGKILL)
        self.log_metrics(values, batch_index)
        self.last_values.update(values)
        if self.p.family.monitor in values:
            self.best.update(values[self.p.family.monitor], step, lambda: self.checkpoint(step))
        self.timer.resume_profiling()

    def checkpoint(self, step: int) -> dict:
        return {
            "state_dict": {f"model.{k}": v for k, v in convert.state_dict(self.model).items()},
            "hyper_parameters": dict(self.task.hparams),
            "global_step": step,
            "epoch": 0,
            "sweeplab": {"mlflow_run_id": self.task.mlflow_run_id, "backend": "mlx"},
        }

    def last_checkpoint_due(self, step: int) -> bool:
        """CheckpointPolicy.last_due, as the Lightning loop's LastCheckpoint asks it (one process: no ranks)."""
        return self.policy.last_due(step, self.p.trainer.max_steps)

    def save_last(self, step: int) -> None:
        """last.ckpt: what a killed run resumes from (the module docstring says what it holds); untimed."""
        self.timer.pause()  # the windows closed so far are read first: the checkpoint covers their numbers
        mx.eval(self.step_fn.state)
        optimizer = convert.arrays_to_torch(self.step_fn.optimizer.state)
        checkpoint = {
            **self.checkpoint(step),
            "optimizer_states": [optimizer["arrays"]],  # the checkpoint checks look here for non-finite values
            "callbacks": {self.best.state_key: self.best.state_dict()},
            "mlx": {
                "optimizer": optimizer,
                "data": self.loader.state_dict(),
                "version": mx.__version__,
            },
        }
        for wait in self.before_save:  # the metrics this checkpoint covers are in the store before it exists
            wait()
        self.best.directory.mkdir(parents=True, exist_ok=True)
        AtomicCheckpointIO().save_checkpoint(checkpoint, self.best.directory / "last.ckpt")
        self.timer.resume_profiling()


def _validate(task, model, datamodule, limit_val_batches) -> dict[str, float]:
    """The task's validation hooks on the MLX model's outputs; {metric: value} as Lightning would log them."""
    def forward(*args):
        out = model(*(mx.array(a.numpy()) for a in args))
        return convert.to_torch(out)

    logged = _LoggedValues()
    task.model.load_state_dict(convert.state_dict(model))  # hooks that run the model itself (the decoder's decodes)
    task.datamodule = datamodule  # hooks that read the data (the decoder's tokenizer, for val/chrf); no trainer here
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
    """The best checkpoint so far (`best-step{N}.ckpt`, one file), as the Lightning path's BestCheckpoint: which
    validation makes a new best is the policy's decision."""

    def __init__(self, directory: Path, monitor: str, policy: CheckpointPolicy):
        self.directory, self.monitor, self.policy, self.mode = directory, monitor, policy, policy.mode
        self.path: Path | None = None
        self.score: float | None = None

    @property
    def state_key(self) -> str:
        return f"ModelCheckpoint{{'monitor': {self.monitor!r}, 'mode': {self.mode!r}}}"

    def state_dict(self) -> dict:
        """As Lightning's ModelCheckpoint state (callbacks.checkpoints.best_files reads `best_k_models`)."""
        best = {str(self.path): self.score} if self.path is not None else {}
        return {"monitor": self.monitor, "best_model_path": str(self.path or ""), "best_model_score": self.score,
                "best_k_models": best, "dirpath": str(self.directory)}

    def load_state_dict(self, state: dict) -> None:
        """A resumed run's best checkpoint, brought into this job's directory by the policy's resume rule
        (bring_best_files, as BestCheckpoint.load_state_dict)."""
        kept = {path: float(score) for path, score in bring_best_files(state.get("best_k_models"), self.directory).items()}
        if kept:
            self.path = self.policy.best_of(kept)
            self.score = kept[self.path]

    def update(self, value: float, step: int, make_checkpoint) -> None:
        if not self.policy.is_new_best(value, self.score):
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"best-step{step}.ckpt"
        AtomicCheckpointIO().save_checkpoint(make_checkpoint(), path)
        if self.path is not None and self.path != path:
            self.path.unlink(missing_ok=True)
        self.path, self.score = path, self.policy.score(value)


__all__ = ["fit", "to_mx"]
