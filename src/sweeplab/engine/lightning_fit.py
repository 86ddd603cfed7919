"""The fit loop of every torch backend (cpu, cuda, mps): Lightning's Trainer with sweeplab's callbacks.

Everything around the step (data, task, recording the run) is sweeplab.engine.job's, shared with the MLX loop.
"""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar
from lightning.pytorch.utilities.exceptions import SIGTERMException

from sweeplab.callbacks.checkpoints import BestCheckpoint, LastCheckpoint, ValidateAtLastStep
from sweeplab.callbacks.faults import FaultInjection
from sweeplab.callbacks.guard import NonFiniteGuard
from sweeplab.callbacks.stop import StopAtSafePoint
from sweeplab.callbacks.stop_rules import StopWhatIsDecided
from sweeplab.callbacks.timing import ThroughputTimer
from sweeplab.callbacks.wall import WallBreakdown
from sweeplab.core import interrupts, wall
from sweeplab.core.console import progress_bar_shown, quiet_libraries
from sweeplab.core.records import JobRun
from sweeplab.data.sampling import ResumableDataCheck
from sweeplab.engine import tuning
from sweeplab.engine.job import FitResult, Job, checkpoint_policy, clear_unfinished_writes, record_batch_size, start_fit
from sweeplab.engine.plan import JobPlan
from sweeplab.policies import stopping
from sweeplab.runtime import backends, distributed
from sweeplab.tasks.checkpoint import AtomicCheckpointIO
from sweeplab.tracking.run_logger import MetricsStoredAtCheckpoint


class LoggedLossProgressBar(TQDMProgressBar):
    """Lightning's bar, showing the training loss as last logged (a float, converted once per logging step).
    Tasks do not mark the loss prog_bar=True: Lightning would read such a metric back from the device after every
    batch, a host sync per step."""

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict:
        metrics = super().get_metrics(trainer, pl_module)
        if "train/loss" in trainer.logged_metrics:
            metrics["train/loss"] = f"{float(trainer.logged_metrics['train/loss']):.4g}"
        return metrics


def fresh_compiler() -> None:
    """Forget what torch.compile learnt from this process's earlier jobs. Dynamo remembers the sizes a function was
    compiled for, and the second time a size changes it compiles dynamic-shape kernels (automatic dynamic): in a sweep
    over batch size the first job got kernels specialised to its shapes and every later one dynamic kernels, and in
    the bench the hand-written loop of the paGating row, compiled after four TextBridge rows, ran 12 % slower than
    the sweeplab job beside it (overhead 1.13 on an H100). Each compiled job now starts as a process's first."""
    torch._dynamo.reset()  # what it forgets is Dynamo's; inductor's FX graph and AOTAutograd caches (in memory and
    # under TORCHINDUCTOR_CACHE_DIR) still hand the same graph its compiled code back: the reset costs a re-trace only
    _kept_graphs.clear()


_kept_graphs: list[str] = []  # the configurations whose compiled graphs Dynamo holds since the last reset
NO_KEEP_MODES = ("reduce-overhead", "max-autotune")  # they record CUDA graphs, whose inputs sit at fixed addresses


def keep_compiled_graphs(key: str, keep: bool) -> bool:
    """Before a compiled job: keep what torch.compile holds from this process's earlier jobs, or start afresh
    (`fresh_compiler`). True when kept.

    Kept where `keep` (the task has one shape per job, `SweepTask.fixed_shapes`, so it compiles with dynamic=False and
    never makes dynamic kernels of a second shape; and the mode records no CUDA graphs, whose trees hold their static
    inputs at fixed addresses that a new model's parameters move): a replicate of an earlier job's configuration
    (`key`) then finds its graph in Dynamo's memory and traces nothing (the second and later jobs of paGating's
    study spent ~2.5 s each tracing again on an H100), and another batch size compiles its own static graph beside
    it. At most half Dynamo's recompile limit of configurations are kept (past the limit Dynamo runs the function
    eagerly, silently slower); then, or for a job that does not keep, the process starts afresh."""
    if keep and key in _kept_graphs:
        return True
    limit = getattr(torch._dynamo.config, "recompile_limit", None) or torch._dynamo.config.cache_size_limit  # torch < 2.6
    if not keep or not _kept_graphs or len(_kept_graphs) >= max(1, limit // 2):
        fresh_compiler()  # also whatever a job that kept nothing left behind
    if keep:
        _kept_graphs.append(key)
    return False


COMPILE_CACHE_COUNTERS = {  # torch._dynamo.utils.counters: (group, name)
    "fxgraph_cache_hit": ("inductor", "fxgraph_cache_hit"), "fxgraph_cache_miss": ("inductor", "fxgraph_cache_miss"),
    "autograd_cache_hit": ("aot_autograd", "autograd_cache_hit"),
    "autograd_cache_miss": ("aot_autograd", "autograd_cache_miss"),
}


def _compile_cache_counts() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {name: counters[group][key] for name, (group, key) in COMPILE_CACHE_COUNTERS.items()}


def _compile_key(p: JobPlan) -> str:
    """What makes a job's compiled graphs its own, as far as keeping them goes: its config but its seeds (replicates
    differ in those alone) and where it writes. Wider than the graph (a learning rate counts too): a key too many
    only starts the process afresh sooner."""

    def without_seeds(value):
        if isinstance(value, dict):
            return {k: without_seeds(v) for k, v in sorted(value.items()) if k != "seed"}
        return value

    return repr(without_seeds({k: v for k, v in p.container.items() if k not in ("paths", "logger")}))


def fit(job: Job) -> FitResult:
    quiet_libraries()  # Lightning is imported now: its own console handler goes (sweeplab.core.console)
    p = job.plan
    show_bar = progress_bar_shown(p.trainer.enable_progress_bar)
    datamodule, _, task = start_fit(job)
    if p.compile_mode != "off":
        keep_compiled_graphs(_compile_key(p), task.fixed_shapes and p.compile_mode not in NO_KEEP_MODES)
        compile_counts = _compile_cache_counts()  # the process's counters: this job's are the difference
    task.configure_training(p.compile_mode, p.cuda_graph, p.steps_per_batch, p.compile_scope, p.compile_validation)

    checkpoints = job.output_dir / "checkpoints"
    clear_unfinished_writes(checkpoints)
    policy = checkpoint_policy(p)  # when last.ckpt is written and which validation is a new best
    best = BestCheckpoint(checkpoints, monitor=p.family.monitor, policy=policy,
                          optimizer_state=p.checkpoint.best == "full")
    timer = ThroughputTimer(**p.timing)
    guard = NonFiniteGuard(**p.guard)
    callbacks = [timer, guard, ValidateAtLastStep(), best,
                 LastCheckpoint(checkpoints, policy),
                 *task.extra_callbacks(),
                 ResumableDataCheck(resuming=job.resume_ckpt is not None), _RecordBatchSize(job),
                 WallBreakdown(p.timing.get("warmup_steps", 0))]
    if job.run is not None:
        callbacks.append(MetricsStoredAtCheckpoint())
    if (fault := FaultInjection.from_env()) is not None:
        callbacks.append(fault)
    if show_bar:
        callbacks.append(LoggedLossProgressBar(refresh_rate=p.trainer.log_every_n_steps))
    stop = _stop_callback(job, timer) if p.stop.enabled else None
    if stop is not None:
        callbacks.append(stop)
    callbacks.append(StopAtSafePoint())  # last: a hook that waits (a fault's pause) returns before the stop is acted on
    checkpoint_io = AtomicCheckpointIO(background=p.checkpoint.background)
    trainer = _trainer(p, callbacks, job, checkpoint_io, clips=task.automatic_optimization, progress_bar=show_bar)
    tuned = tuning.tune_batch_size(trainer, task, datamodule, p.tune)  # None unless tune.batch_size is set
    if tuned is not None and job.run is not None:
        job.run.write(JobRun(tuned_batch_size=tuned))
    wall.mark("trainer")
    with interrupts.at_safe_points():  # a signal is recorded; StopAtSafePoint acts on it
        try:
            trainer.fit(task, datamodule=datamodule, ckpt_path=str(job.resume_ckpt) if job.resume_ckpt else None)
        except SIGTERMException:  # Lightning's own check saw the SIGTERM first (an epoch's end): sweeplab's stop
            interrupts.check()
            raise
    summary = distributed.job_summary({**timer.summary, **task.summary_metrics(trainer)}, trainer.world_size)
    if p.compile_mode != "off":  # what this job's compilation found in inductor's caches (docs/study-cost.md)
        summary |= JobRun(compile_cache={name: count - compile_counts[name]
                                         for name, count in _compile_cache_counts().items()}).to_mlflow().metrics
    return FitResult(
        summary=summary,
        step=trainer.global_step,
        best_path=best.best_model_path or None,
        monitored=_monitored(trainer, best, p.family.monitor),
        timing=timer.run_record(),
        diverged=guard.diverged,
        stop_reason=stop.reason if stop is not None else None,
    )


class _RecordBatchSize(L.Callback):
    """job.record_batch_size on the loader the fit really uses."""

    def __init__(self, job: Job):
        self.job = job

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        record_batch_size(self.job, trainer.train_dataloader)


def _trainer(p: JobPlan, callbacks: list, job: Job, checkpoint_io: AtomicCheckpointIO, clips: bool = True,
             progress_bar: bool = False) -> L.Trainer:
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
        plugins=[checkpoint_io, *precision_plugins],
        deterministic=t.deterministic,
        enable_progress_bar=progress_bar,
        enable_model_summary=False,
        callbacks=callbacks,
        logger=job.logger if job.logger is not None else False,
        default_root_dir=str(job.output_dir),
        **distributed.trainer_options(t.devices),  # DDP: ranks > 0 re-create this one job; the sampler shards itself
    )


def _monitored(trainer: L.Trainer, checkpoint: ModelCheckpoint, monitor: str) -> float | None:
    if checkpoint.best_model_score is not None:
        return float(checkpoint.best_model_score)
    value = trainer.callback_metrics.get(monitor)
    return float(value) if value is not None else None


__all__ = ["LoggedLossProgressBar", "fit", "fresh_compiler"]


def _stop_callback(job: Job, timer: ThroughputTimer) -> StopWhatIsDecided:
    """stop.at_target / stop.behind (policies/stopping.py), with this job's round board and its place in the grid."""
    p = job.plan
    rule = stopping.StopRule.for_this_job(p.stop, p.stop_target, p.family.monitor_mode, job.sweep_dir, job.place)

    def record(stopped: JobRun) -> None:
        if job.run is not None:
            job.run.write(stopped)

    batch = getattr(p.datamodule, "batch_size", None) or int(p.container["data"].get("batch_size", 1))
    per_step = int(batch) * p.trainer.accumulate_grad_batches * p.trainer.devices
    return StopWhatIsDecided(rule, p.family.monitor, timer, record, per_step)
