"""What every task shares: the training step (eager, compiled or replayed as a CUDA graph), the optimizer and
schedule, the hyperparameters a checkpoint carries, and the questions the timing callback asks of a batch (how many
samples, tokens and FLOPs).

A task only says how to compute its training loss (`training_loss`: model forward + loss, plus metrics to log);
`configure_training` decides how that runs:
- compile, compile_scope=whole: the whole `training_loss` goes through torch.compile, not the model alone, so the
  loss fuses with the model's last layers (paGating: the fp32 softmax over 16k x 50k logits would otherwise run
  eagerly on materialised fp32 logits, a quarter of the step on an H100);
- compile, compile_scope=regions: only the regions the model declares (`compile_regions()`: its repeated block, and
  paGating's LM head with its loss, for the reason above) are compiled, in place; the rest runs eagerly. The
  blocks share their code and guards, so one compilation serves every layer: the cold compile no longer grows
  with the depth (PyTorch's recipe "Reducing torch.compile cold start compilation time with regional
  compilation");
- compile_validation=false (the default): validation runs eagerly, compiling nothing of its own: a study validates
  a few batches, and compiling the evaluation graph cost a whole extra compilation per shape (12-22 s on an H100
  for paGating-small, docs/study-cost.md), more than the eager batches it would speed up;
- cuda_graph: manual optimization; forward, backward and clipping replay as one CUDA graph (tasks/step_graph.py),
  then the optimizer and LR schedule step as usual;
- steps_per_batch=k > 1: each training batch holds k steps' batches and the task runs k whole optimizer steps on it
  (forward, backward, clipping, update), so Lightning's per-batch Python is paid once per k steps; under cuda_graph
  the k steps are one graph replay (update and learning rate inside the graph). The task then counts k optimizer
  steps, so global_step, the logging step and every interval stay in real optimizer steps.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import asdict, is_dataclass
from typing import Any

import lightning as L
import torch
from torch import nn

from sweeplab.callbacks.profiler import GRAPH_ACTION, STEPS_ACTION
from sweeplab.core.errors import ConfigError
from sweeplab.core.records import JobRun
from sweeplab.runtime.lightning_private import count_optimizer_steps
from sweeplab.tasks.optim import OptimConfig, build_optimizer, build_scheduler
from sweeplab.tasks.step_graph import (
    MultiStepGraph,
    StepGraph,
    autocast_dtype,
    capturable_update,
    scheduled_lrs,
    total_grad_norm,
)


def _own_hparams(model: nn.Module, loss: Any, optim: OptimConfig) -> dict[str, Any]:
    """{"model": ..., "loss": ..., "optim": ...} of the configs that are dataclasses, as plain dicts."""
    configs = {"model": getattr(model, "config", None), "loss": loss, "optim": optim}
    return {name: asdict(config) for name, config in configs.items() if is_dataclass(config) and not isinstance(config, type)}


COMPILE_SCOPES = ("whole", "regions")  # compile_scope: what torch.compile compiles (configure_training)


def check_compile_regions(model: Any, family: str) -> None:
    """compile_scope=regions needs a model (class or instance) that declares its regions: one line naming the
    family and the fix otherwise."""
    if not callable(getattr(model, "compile_regions", None)):
        name = model.__name__ if isinstance(model, type) else type(model).__name__
        raise ConfigError("compile_scope", f"regions: family {family}'s model {name} declares no compile_regions() "
                                           "(the (module, method) pairs to compile); use compile_scope=whole")


def compile_regions(model: nn.Module, mode: str | None, dynamic: bool | None = None) -> int:
    """Compile, in place, every region `model.compile_regions()` declares: a module's forward with
    `Module.compile` (its state_dict keys stay as they are), another method with torch.compile of the class's
    method, bound to the module and set on the instance. Returns the number of regions. Calling it again
    compiles afresh, never a compiled method twice. `dynamic`: torch.compile's (`SweepTask.compile_dynamic`)."""
    regions = model.compile_regions()
    for module, method in regions:
        if method == "forward":
            module.compile(mode=mode, dynamic=dynamic)
        else:
            setattr(module, method, torch.compile(getattr(type(module), method).__get__(module), mode=mode,
                                                  dynamic=dynamic))
    return len(regions)


def run_eagerly(fn: Callable) -> Callable:
    """`fn` with every compiled function or module it reaches run as plain eager code (torch.compiler's
    `force_eager` stance): nothing compiles, and nothing compiled runs, inside it."""

    @functools.wraps(fn)
    def eager(*args, **kwargs):
        with torch.compiler.set_stance("force_eager"):
            return fn(*args, **kwargs)

    return eager


def train_metric_names(metrics: dict) -> dict:
    """`training_loss`'s extra metrics under the step's prefix: `acc` is logged as `train/acc` (beside `train/loss`);
    a name with its own prefix (`train/cos`) is kept."""
    return {name if "/" in name else f"train/{name}": value for name, value in metrics.items()}

class SweepTask(L.LightningModule):
    """The base of every family's task, built by its record as `Task(model_config, loss, optim)`. A task defines
    `training_loss`; validation is its own (`validation_step` logging `val/*`, among them the record's `monitor`).
    The timer counts a batch's samples from the leading dimension of its tensors; a task with tokens or a FLOP count
    overrides `tokens_in` / `flops_in`. The other hooks the engine reads are listed in `families/contract.py`.

    The hyperparameters a checkpoint keeps are the family's name, the model config (`hparams["model"]`: resume and
    `families.loading.load_model` rebuild the model from it), the loss config and the optimizer's: taken from
    `model.config` and `loss` when they are dataclasses, so a task passes `hparams` only to keep something else."""

    family: str = ""  # the record's name, kept in checkpoints; the record's builder sets it when a task leaves it empty
    # True where every training batch has one shape (a job's batch size, fixed lengths): torch.compile then
    # specialises to it (dynamic=False), and a process keeps the compiled graphs from job to job
    # (engine/lightning_fit.py: keep_compiled_graphs); False: torch's automatic dynamic shapes, each job afresh
    fixed_shapes: bool = False

    def __init__(self, model: nn.Module, optim: OptimConfig, hparams: dict | None = None, loss: Any = None):
        super().__init__()
        self.model = model
        self.optim_config = optim
        self.loss_config = loss  # the loss settings (None: the loss has none); the MLX port trains with them
        # plain dicts only: checkpoints stay loadable with torch.load(weights_only=True)
        hparams = {**_own_hparams(model, loss, optim), **(hparams or {})}
        self.save_hyperparameters({"family": self.family, **hparams}, logger=False)  # the run logs the full config
        self.last_loss: torch.Tensor | None = None  # read by the non-finite guard before the optimizer step
        self.mlflow_run_id: str | None = None  # kept in checkpoints, so a resumed run continues the same MLflow run
        self.loss_fn = self.training_loss  # what training_step calls: compiled by configure_training(compile=...)
        self.forward_fn = self.model.forward  # what validation calls, likewise
        self.cuda_graph = False
        self.steps_per_batch = 1  # optimizer steps per training batch
        self.step_graph: StepGraph | MultiStepGraph | None = None  # built at the first step (the device is known then)
        self.last_grad_norm: torch.Tensor | None = None  # this step's: see step_grad_norm
        self._params: list[nn.Parameter] | None = None  # see trained_params
        self._first_step = 0  # global_step at the first training batch of this fit (see should_log_step)

    # --- the training step -----------------------------------------------------------------------------
    def training_loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(loss, {metric name: value}) of a training batch: the model's forward pass and the loss, nothing else
        (no logging, no Lightning calls), so it can be compiled and captured."""
        raise NotImplementedError

    def configure_training(self, compile_mode: str = "off", cuda_graph: bool = False, steps_per_batch: int = 1,
                           compile_scope: str = "whole", compile_validation: bool = False) -> None:
        """How training runs (the module docstring): compile_mode off | default | reduce-overhead | max-autotune;
        compile_scope whole | regions; compile_validation: validation compiled too (whole: the model's forward as
        one graph; regions: the regions' evaluation variants), else run eagerly."""
        if compile_scope not in COMPILE_SCOPES:
            raise ConfigError("compile_scope", f"{compile_scope!r} is not one of {', '.join(COMPILE_SCOPES)}")
        if compile_mode != "off":
            mode = None if compile_mode == "default" else compile_mode
            if compile_scope == "regions":
                check_compile_regions(self.model, self.family)
                compile_regions(self.model, mode, self.compile_dynamic)
            else:
                self.loss_fn = torch.compile(self.training_loss, mode=mode, dynamic=self.compile_dynamic)
                if compile_validation:
                    self.forward_fn = torch.compile(self.model.forward, mode=mode, dynamic=self.compile_dynamic)
            if not compile_validation:  # the whole step: a task's validation may call the model directly too
                self.validation_step = run_eagerly(type(self).validation_step.__get__(self))
        self.cuda_graph = cuda_graph
        self.steps_per_batch = steps_per_batch
        self.automatic_optimization = not cuda_graph and steps_per_batch == 1

    @property
    def compile_dynamic(self) -> bool | None:
        """torch.compile's `dynamic` for this task: False (specialise to the shapes; a new shape compiles its own
        static graph) where its batches have one shape, else None (torch's automatic dynamic shapes)."""
        return False if self.fixed_shapes else None

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        if self.steps_per_batch > 1:
            return self._multi_step(batch)
        # asked before the step: a graph step's optimizer step moves global_step and the schedule on, and the
        # values logged must be this step's (with cuda_graph=true the loss of the step before was logged)
        log_step = self.should_log_step()
        lr = self.scheduled_lr() if log_step else None
        if self.cuda_graph:
            loss, metrics = self._graph_step(batch)
        else:
            self.last_grad_norm = None  # a new step: its norm is computed after backward, once (step_grad_norm)
            loss, metrics = self.loss_fn(batch)
        self.last_loss = loss.detach()
        if log_step:
            if self.cuda_graph:  # the graph's output tensors: the next replay overwrites them
                loss, metrics = loss.clone(), {k: v.clone() for k, v in metrics.items()}
            # Not prog_bar=True: Lightning converts progress-bar metrics to floats after *every* batch until they
            # are logged again, a host sync per step (on an H100 the GPU idled ~1 ms per TextBridge step). The
            # progress bar shows the last logged loss instead (training.LoggedLossProgressBar).
            self.log("train/loss", loss, on_step=True, on_epoch=False)
            if metrics:
                self.log_dict(train_metric_names(metrics), on_step=True, on_epoch=False)
            self.log_lr(lr)
        return loss

    def _graph_step(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if self.step_graph is None:
            self.step_graph = StepGraph(
                self.loss_fn,
                list(self.model.parameters()),
                self.optim_config.grad_clip,
                autocast_dtype(self.trainer.precision),
                self.device,
            )
        result = {}

        def closure() -> torch.Tensor:  # the optimizer calls it, then Lightning's on_before_optimizer_step hooks
            with self.trainer.profiler.profile(GRAPH_ACTION):  # `make profile`: its own phase, not "optimizer"
                result["loss"], result["metrics"], self.last_grad_norm = self.step_graph(batch)
            self.last_loss = result["loss"]  # read by the non-finite guard before the optimizer step
            return result["loss"]

        self.optimizers().step(closure=closure)  # Lightning's wrapper: counts the step, runs the hooks
        scheduler = self.lr_schedulers()
        if scheduler is not None:
            scheduler.step()
        return result["loss"], result["metrics"]

    def _multi_step(self, batch: dict) -> torch.Tensor:
        """k optimizer steps (steps_per_batch) on one batch, one graph replay under cuda_graph; `last_loss` and
        `last_grad_norm` are then the k steps' vectors, which the non-finite guard reads at the end of the batch."""
        k = self.steps_per_batch
        optimizer = self.optimizers().optimizer  # the torch optimizer, stepped by the k steps (inside the graph)
        scheduler = self.lr_schedulers()
        if self.step_graph is None:
            self.step_graph = MultiStepGraph(
                self.loss_fn, optimizer, k, self.optim_config.grad_clip, autocast_dtype(self.trainer.precision),
                self.device, capture=self.cuda_graph,
            )
        log_step = self.should_log_step()  # asked before the k steps are counted
        lrs = scheduled_lrs(optimizer, scheduler, k)
        with self.trainer.profiler.profile(GRAPH_ACTION if self.cuda_graph else STEPS_ACTION):
            losses, metrics, self.last_grad_norm = self.step_graph(batch, lrs)
        if scheduler is not None:
            for _ in range(k):
                scheduler.step()
        count_optimizer_steps(self.trainer, k)
        self.last_loss = losses
        if log_step:  # a logging step is the last of its k (k divides log_every_n_steps): log that step's values
            loss = losses[-1].clone()
            self.log("train/loss", loss, on_step=True, on_epoch=False)
            if metrics:
                self.log_dict(train_metric_names({name: value[-1].clone() for name, value in metrics.items()}),
                              on_step=True, on_epoch=False)
            self.log_lr(lrs[-1][0])
        return losses[-1]

    # --- before the timed steps ------------------------------------------------------------------------
    def warm_up_shapes(self, batches: list[dict], passes: int = 1) -> None:
        """Forward and backward of each batch (on the device) `passes` times, so every one-off cost of a new batch
        shape (cuDNN autotuning, oneDNN primitives, a Metal graph, a torch.compile recompilation) is paid before the
        timed steps, through the very function training runs (`loss_fn`, compiled or not, under the trainer's
        precision). Training is unchanged: no optimizer step, gradients put back as they were (None when a fit
        starts), random number generators restored; the models keep no running statistics."""
        if not batches or passes < 1:
            return
        params = list(self.parameters())
        grads = [p.grad for p in params]
        plugin = self.trainer.precision_plugin
        devices = [] if self.device.type == "cpu" else [self.device]
        with torch.random.fork_rng(devices=devices, device_type=self.device.type), torch.enable_grad():
            for batch in batches:
                batch = plugin.convert_input(batch)
                for _ in range(passes):
                    with plugin.train_step_context():
                        loss, _ = self.loss_fn(batch)
                    loss.backward()
                    for p in params:
                        p.grad = None
        for p, grad in zip(params, grads):
            p.grad = grad

    # --- the gradient norm: computed once per step ---------------------------------------------------
    def step_grad_norm(self) -> torch.Tensor:
        """This step's total gradient norm (2-norm over all gradients, on the device: no host sync).

        The non-finite guard and the norm clipping both need it; computed by whichever asks first, reused by the
        other (a full pass over the gradients each: 0.5 ms of a 100 ms step for the CPU bench's paGating model).
        Under cuda_graph=true the graph's clipping computed it."""
        if self.last_grad_norm is None:
            self.last_grad_norm = total_grad_norm(self.trained_params(), self.device)
        return self.last_grad_norm

    def trained_params(self) -> list[nn.Parameter]:
        """The module's parameters, listed once per fit: `parameters()` walks the module tree, ~50 µs a call on an
        H100's host, paid twice a step (norm and clipping) by a loop whose hand-written twin lists them once."""
        if self._params is None:
            self._params = list(self.parameters())
        return self._params

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Lightning's norm clipping, with the norm the guard already computed this step (same arithmetic as
        clip_grad_norm_). Gradient scaling (16-mixed) keeps Lightning's own path: its precision plugin unscales."""
        scaled = getattr(self.trainer.precision_plugin, "scaler", None) is not None
        if gradient_clip_val and gradient_clip_algorithm in (None, "norm") and self.last_grad_norm is not None and not scaled:
            torch.nn.utils.clip_grads_with_norm_(self.trained_params(), gradient_clip_val, self.last_grad_norm)
            return
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def on_fit_start(self) -> None:
        self._params = None  # listed again for this fit (a module may be changed between fits)

    def on_train_end(self) -> None:
        """Drop the optimizers' state and the gradients once training is over. Lightning calls this after the
        callbacks' `on_train_end` (the last checkpoint's save, the copy a resume reads, included) and before its
        teardown, which moves the model and whatever the optimizers hold to the CPU, where nothing reads them: for
        paGating small, AdamW's two copies of every weight and the gradients, 1 GB more copied into fresh host memory
        at the end of every job (docs/study-cost.md)."""
        for optimizer in self.trainer.optimizers:
            optimizer.state.clear()
        self.zero_grad(set_to_none=True)

    def on_fit_end(self) -> None:
        self.step_graph = None  # the graph holds this fit's gradients and inputs

    def configure_optimizers(self):
        capturable = capturable_update(self.cuda_graph, self.steps_per_batch, self.device)
        optimizer = build_optimizer(self.model, self.optim_config, capturable=capturable)
        max_steps = self.trainer.max_steps if self.trainer is not None and self.trainer.max_steps > 0 else 1000
        scheduler = build_scheduler(optimizer, self.optim_config, max_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def should_log_step(self) -> bool:
        """Whether this step's training metrics are logged: at the steps Lightning writes to the loggers (every
        log_every_n_steps), and at the first batch of a fit. Each self.log costs ~0.2 ms of host time (Lightning
        moves its result record with apply_to_collection), so the steps in between skip it.

        The first batch (warm-up, never timed unless timing.warmup_steps=0) logs values no logger receives (the next
        logging step's replace them) so that Lightning's one-off set-up of its logging is paid there: the first
        self.log of a process costs ~10 ms more than later ones (torch._dynamo's first pass through the functions
        Lightning marks as not compilable), and fell inside the first job's timed steps only, not later jobs'."""
        trainer = self._trainer
        if trainer is None or self.global_step == self._first_step:
            return True
        return (self.global_step + self.steps_per_batch) % max(1, trainer.log_every_n_steps) == 0

    def on_train_start(self) -> None:
        self._first_step = self.global_step  # 0, or the step a resumed fit starts from

    def scheduled_lr(self) -> float | None:
        """The learning rate the schedule gives the step about to run (its first param group's)."""
        scheduler = self.lr_schedulers()
        return scheduler.get_last_lr()[0] if scheduler is not None else None

    def log_lr(self, lr: float | None = None) -> None:
        """`lr`: the logged step's learning rate; None: the schedule's current one."""
        lr = self.scheduled_lr() if lr is None else lr
        if lr is not None:
            self.log("lr", lr, on_step=True, on_epoch=False)

    # --- for the timing callback: host-side answers, no device sync --------------------------------
    def samples_in(self, batch) -> int:
        """The batch's leading dimension (of its first tensor: a dict's, a tuple's or the tensor itself)."""
        first = next(iter(batch.values())) if isinstance(batch, dict) else batch[0] if isinstance(batch, (list, tuple)) else batch
        if isinstance(first, (dict, list, tuple)):
            return self.samples_in(first)
        if not torch.is_tensor(first) or first.dim() == 0:
            raise TypeError(
                f"{type(self).__name__}: cannot count the samples of a batch whose first item is "
                f"{type(first).__name__}; a batch's tensors need the batch size as their leading dimension, or the "
                "task overrides samples_in"
            )
        return int(first.shape[0])

    def tokens_in(self, batch) -> int | torch.Tensor:
        """Real (non-padding) tokens; may be a device tensor, summed by the caller without a sync. 0: the family
        has no tokens (no tokens/s is reported)."""
        return 0

    def flops_in(self, batch: dict) -> float | None:
        return None

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["sweeplab"] = {"mlflow_run_id": self.mlflow_run_id}

    # --- what the training app asks of every task ----------------------------------------------------
    def set_training_step(self, step: int) -> None:
        """Put whatever in the model follows the optimizer step count (a scheduled α) at `step`. Loops outside
        Lightning (the bench's hand-written one) call it before each step; under Lightning the task's
        `extra_callbacks` do the same."""

    def extra_callbacks(self) -> list[L.Callback]:
        """Family-specific callbacks (e.g. stepping a scheduled alpha)."""
        return []

    def summary_metrics(self, trainer: L.Trainer) -> dict[str, float]:
        total = sum(p.numel() for p in self.model.parameters())
        trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        return JobRun(num_parameters=total, trainable_parameters=trainable).to_mlflow().metrics
