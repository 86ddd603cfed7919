"""`cuda_graph=true`: a training step's forward, loss, backward and gradient clipping captured once as a CUDA graph
and replayed every step after, so the host launches one graph instead of hundreds of kernels.

Small batches are bound by the host: TextBridge at batch 32 spends ~5 ms per step launching kernels that run for
~1 ms (BENCHMARKS.md). A replay costs a few microseconds of host time whatever the graph holds.

What is captured: zeroed gradients, autocast forward + loss, backward, global-norm clipping (foreach on CUDA, no
host sync). What is not: the optimizer step, which the caller runs eagerly right after (Lightning's `optimizer.step()`,
so its step counter, hooks, checkpointed optimizer state and LR schedule work as in any run; torch's fused AdamW is
a handful of launches). The recipe is PyTorch's "whole network capture" (torch.cuda.graphs docs):

- a few eager warm-up steps first, on a side stream (lazy cuBLAS/cuDNN set-up and autotuning happen there, never
  inside the capture); they are real training steps, not thrown away;
- gradients set to None before capture, so backward allocates them in the graph's private memory pool; every replay
  rewrites the same tensors, and `param.grad` is pointed back at them after each replay (an eager step in between,
  or anyone calling `zero_grad(set_to_none=True)`, replaces them);
- inputs copied into static tensors before each replay; a batch of another shape (a short last batch, per-batch
  padding) runs eagerly instead, counted in `eager_steps`.

With `capture=False` (CPU; tests) every step runs the eager path; the arithmetic is the same.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

import torch

from sweeplab.runtime.devices import copy_into

log = logging.getLogger(__name__)

LossFn = Callable[[dict], tuple[torch.Tensor, dict[str, torch.Tensor]]]


class StepGraph:
    def __init__(
        self,
        loss_fn: LossFn,
        params: list[torch.nn.Parameter],
        grad_clip: float | None,
        autocast_dtype: torch.dtype | None,
        device: torch.device,
        warmup_steps: int = 3,
        capture: bool = True,
    ):
        self.loss_fn = loss_fn
        self.params = [p for p in params if p.requires_grad]
        self.grad_clip = grad_clip
        self.autocast_dtype = autocast_dtype
        self.device = device
        self.warmup_steps = warmup_steps
        self.capture = capture and device.type == "cuda"
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_inputs: dict[str, torch.Tensor] = {}
        self.static_outputs: tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor] | None = None
        self.static_grads: list[torch.Tensor | None] = []
        self.calls = 0
        self.replays = 0
        self.eager_steps = 0
        self._warned_shape = False

    # --- one step ---------------------------------------------------------------------------------------
    def __call__(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
        """(loss, metrics, total gradient norm before clipping) of `batch`; gradients are left in `param.grad`
        for the optimizer step that follows. After a replay these are the graph's own output tensors, valid until
        the next call: clone what must outlive the step (logging does, on logging steps)."""
        self.calls += 1
        if self.capture and self.graph is None and self.calls > self.warmup_steps:
            self._capture(batch)
        if self.graph is not None and self._fits(batch):
            replay(self.graph, self.static_inputs, batch, self.params, self.static_grads)
            self.replays += 1
            return self.static_outputs
        self.eager_steps += 1
        if self.graph is not None:
            self._warn_shape(batch)
        if self.capture:
            return on_side_stream(self.device, lambda: self._forward_backward(batch))
        return self._forward_backward(batch)

    def _forward_backward(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
        for p in self.params:
            p.grad = None
        # cache_enabled=False: cached casts of the weights would be captured as constants of the first replay
        autocast = (
            torch.autocast(self.device.type, dtype=self.autocast_dtype, cache_enabled=False)
            if self.autocast_dtype is not None
            else contextlib.nullcontext()
        )
        with autocast:
            loss, metrics = self.loss_fn(batch)
        loss.backward()
        if self.grad_clip:
            # foreach=None: torch's multi-tensor kernels where it has them (CUDA), a loop elsewhere; torch 2.13 has
            # none for MPS and foreach=True raises there (torch/utils/_foreach_utils.py). Lightning clips so too.
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip, foreach=None)
        else:
            grad_norm = total_grad_norm(self.params, self.device)
        return loss.detach(), {k: v.detach() for k, v in metrics.items()}, grad_norm

    # --- capture ----------------------------------------------------------------------------------------
    def _capture(self, batch: dict) -> None:
        self.static_inputs = {k: v.clone() for k, v in batch.items() if isinstance(v, torch.Tensor)}
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.static_outputs = self._forward_backward({**batch, **self.static_inputs})
        self.static_grads = [p.grad for p in self.params]
        self.graph = graph
        log.info(
            "cuda_graph: captured forward, backward and clipping after %d eager steps (inputs %s)",
            self.calls - 1,
            ", ".join(f"{k} {tuple(v.shape)}" for k, v in self.static_inputs.items()),
        )

    def _fits(self, batch: dict) -> bool:
        return self._fits_static(batch, self.static_inputs)

    @staticmethod
    def _fits_static(batch: dict, static_inputs: dict[str, torch.Tensor]) -> bool:
        for key, static in static_inputs.items():
            value = batch.get(key)
            if not isinstance(value, torch.Tensor) or value.shape != static.shape or value.dtype != static.dtype:
                return False
        return True

    def _warn_shape(self, batch: dict) -> None:
        if self._warned_shape:
            return
        self._warned_shape = True
        shapes = ", ".join(
            f"{k} {tuple(batch[k].shape)} (captured {tuple(v.shape)})" for k, v in self.static_inputs.items() if k in batch
        )
        log.warning(
            "cuda_graph: a batch of another shape runs eagerly (%s); for TextBridge set data.pad_to=max so every "
            "batch has one shape",
            shapes,
        )


class MultiStepGraph:
    """`steps_per_batch=k > 1`: k whole optimizer steps on one batch of k batches' rows, so the host pays Lightning's
    per-batch Python (~0.5-0.8 ms on the H100's host) once per k steps; under cuda_graph the k steps are captured
    once as one CUDA graph and replayed once per k steps.

    Each captured step is the single-step graph's arithmetic (`StepGraph._forward_backward`: zeroed gradients,
    autocast forward + loss, backward, clipping) followed by the optimizer's own `step()` at that step's learning
    rate. The optimizer must be built with `capturable=True` (its step counters and bias corrections live on the
    device); during capture each step's `lr` is a 0-dim view into `static_lrs` (k x param groups), which the host
    fills before every replay with the schedule's values, so the LR schedule is a device tensor the graph reads.
    Outside capture the param groups keep the plain floats the scheduler writes, so checkpoints and the logged `lr`
    are unchanged.

    The input is k consecutive batches' rows in one batch (k x batch_size rows, `DeviceBatches` with
    `steps_per_batch=k`); step j trains on rows [j*B, (j+1)*B). Returns per-step vectors: losses (k,), metrics
    {name: (k,)}, gradient norms before clipping (k,). The caller steps the scheduler k times and counts k optimizer
    steps. With `capture=False` (steps_per_batch without cuda_graph; every backend) every call runs the same k steps
    eagerly (or through the compiled loss).
    """

    def __init__(
        self,
        loss_fn: LossFn,
        optimizer: torch.optim.Optimizer,
        steps: int,
        grad_clip: float | None,
        autocast_dtype: torch.dtype | None,
        device: torch.device,
        warmup_calls: int = 1,  # eager calls before capture: k >= 2 real steps each, enough for lazy set-up
        capture: bool = True,
    ):
        if steps < 2:
            raise ValueError(f"MultiStepGraph needs steps >= 2 (one step per replay is StepGraph), got {steps}")
        params = [p for group in optimizer.param_groups for p in group["params"]]
        self.step = StepGraph(loss_fn, params, grad_clip, autocast_dtype, device, capture=False)
        self.optimizer = optimizer
        self.steps = steps
        self.device = device
        self.warmup_calls = warmup_calls
        self.capture = capture and device.type == "cuda"
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_inputs: dict[str, torch.Tensor] = {}
        self.static_lrs: torch.Tensor | None = None
        self.static_outputs: tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor] | None = None
        self.static_grads: list[torch.Tensor | None] = []
        self.calls = 0
        self.replays = 0
        self.eager_calls = 0

    def __call__(
        self, batch: dict, lrs: list[list[float]]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
        """k optimizer steps on `batch` (k batches' rows), step j at learning rates `lrs[j]` (one per param group).
        After a replay the outputs are the graph's own tensors, valid until the next call."""
        if len(lrs) != self.steps:
            raise ValueError(f"{len(lrs)} learning-rate rows for {self.steps} steps")
        self.calls += 1
        if self.capture and self.graph is None and self.calls > self.warmup_calls:
            self._capture(batch)
        if self.graph is not None and self._fits(batch):
            copy_into(self.static_lrs, torch.tensor(lrs, dtype=self.static_lrs.dtype).pin_memory())
            replay(self.graph, self.static_inputs, batch, self.step.params, self.static_grads)
            self.replays += 1
            return self.static_outputs
        self.eager_calls += 1
        if self.capture:
            return on_side_stream(self.device, lambda: self._steps(batch, lrs))
        return self._steps(batch, lrs)

    def _steps(self, batch: dict, lrs) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
        """The k steps, in order; `lrs` is a host list (eager) or the device table `static_lrs` (capture)."""
        rows = self._rows_per_step(batch)
        losses, norms, metrics = [], [], {}
        groups = self.optimizer.param_groups
        for j in range(self.steps):
            part = {
                key: value[j * rows : (j + 1) * rows] if isinstance(value, torch.Tensor) else value
                for key, value in batch.items()
            }
            loss, step_metrics, norm = self.step._forward_backward(part)
            for g, group in enumerate(groups):
                group["lr"] = lrs[j][g]
            self.optimizer.step()
            losses.append(loss)
            norms.append(norm)
            for name, value in step_metrics.items():
                metrics.setdefault(name, []).append(value)
        return torch.stack(losses), {name: torch.stack(v) for name, v in metrics.items()}, torch.stack(norms)

    def _rows_per_step(self, batch: dict) -> int:
        sizes = {v.shape[0] for v in batch.values() if isinstance(v, torch.Tensor) and v.ndim}
        if len(sizes) != 1 or next(iter(sizes)) % self.steps:
            raise ValueError(f"a batch of {self.steps} steps needs one row count divisible by {self.steps}, got {sizes}")
        return next(iter(sizes)) // self.steps

    def _capture(self, batch: dict) -> None:
        self.static_inputs = {k: v.clone() for k, v in batch.items() if isinstance(v, torch.Tensor)}
        groups = self.optimizer.param_groups
        self.static_lrs = torch.zeros((self.steps, len(groups)), dtype=torch.float32, device=self.device)
        floats = [group["lr"] for group in groups]
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                self.static_outputs = self._steps({**batch, **self.static_inputs}, self.static_lrs)
        finally:  # the scheduler and checkpoints see plain floats; the graph keeps reading static_lrs
            for group, lr in zip(groups, floats):
                group["lr"] = lr
        self.static_grads = [p.grad for p in self.step.params]
        self.graph = graph
        log.info(
            "cuda_graph: captured %d optimizer steps (forward, backward, clipping, update) after %d eager calls "
            "(inputs %s)",
            self.steps, self.calls - 1, ", ".join(f"{k} {tuple(v.shape)}" for k, v in self.static_inputs.items()),
        )

    def _fits(self, batch: dict) -> bool:
        return self.step._fits_static(batch, self.static_inputs)


def replay(graph: torch.cuda.CUDAGraph, static_inputs: dict, batch: dict, params: list, static_grads: list) -> None:
    """Copy the batch into the graph's input tensors, replay it, and point each `param.grad` back at the gradient
    tensor the graph writes (an eager step or `zero_grad(set_to_none=True)` in between replaces them)."""
    for key, static in static_inputs.items():
        copy_into(static, batch[key])
    graph.replay()
    for p, grad in zip(params, static_grads):
        p.grad = grad


def on_side_stream(device: torch.device, step: Callable[[], tuple]) -> tuple:
    """An eager warm-up step before capture, on a side stream as the capture recipe asks (lazy library set-up and
    autotuning happen there); the current stream waits for it."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        out = step()
    torch.cuda.current_stream(device).wait_stream(stream)
    return out


def scheduled_lrs(optimizer: torch.optim.Optimizer, scheduler, steps: int) -> list[list[float]]:
    """The learning rate of each param group at each of the next `steps` optimizer steps, as `scheduler.step()`
    would set them one step at a time (read from its lambdas, so the scheduler itself is stepped once per real step
    afterwards, by the caller). No scheduler: the current rates throughout."""
    if scheduler is None:
        return [[group["lr"] for group in optimizer.param_groups]] * steps
    if not isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
        raise TypeError(f"steps_per_batch > 1 reads the schedule ahead from a LambdaLR, got {type(scheduler).__name__}")
    start = scheduler.last_epoch
    return [
        [base * lam(start + j) for base, lam in zip(scheduler.base_lrs, scheduler.lr_lambdas)] for j in range(steps)
    ]


def capturable_update(cuda_graph: bool, steps_per_batch: int, device: torch.device) -> bool:
    """Whether the optimizer needs `capturable=True`: a graph of several steps captures the update, whose step
    counters must then live on the device (CUDA only)."""
    return cuda_graph and steps_per_batch > 1 and device.type == "cuda"


def total_grad_norm(params, device: torch.device) -> torch.Tensor:
    """The 2-norm over all gradients of `params`, on the device (no host sync); 0 when none has a gradient."""
    grads = [p.grad for p in params if p.grad is not None]
    return torch.nn.utils.get_total_norm(grads) if grads else torch.zeros((), device=device)


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype a Lightning precision setting trains under; None for full/true precisions."""
    return {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)


__all__ = ["MultiStepGraph", "StepGraph", "autocast_dtype", "capturable_update", "scheduled_lrs", "total_grad_norm"]
