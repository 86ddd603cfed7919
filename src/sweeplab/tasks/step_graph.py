"""`cuda_graph=true`: a training step's forward, loss, backward and gradient clipping captured once as a CUDA graph
and replayed every step after, so the host launches one graph instead of hundreds of kernels.

Small batches are bound by the host: TextBridge at batch 32 spends ~5 ms per step launching kernels that run for
~1 ms (BENCHMARKS.md). A replay costs a few microseconds of host time whatever the graph holds.

What is captured: zeroed gradients, autocast forward + loss, backward, global-norm clipping (foreach, no host
sync). What is not: the optimizer step, which the caller runs eagerly right after (Lightning's `optimizer.step()`,
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
            for key, static in self.static_inputs.items():
                static.copy_(batch[key], non_blocking=True)
            self.graph.replay()
            for p, grad in zip(self.params, self.static_grads):
                p.grad = grad
            self.replays += 1
            return self.static_outputs
        self.eager_steps += 1
        if self.graph is not None:
            self._warn_shape(batch)
        if self.capture:  # warm-up: on a side stream, as the capture recipe asks
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                out = self._forward_backward(batch)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            return out
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
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip, foreach=self.device.type != "cpu")
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
        for key, static in self.static_inputs.items():
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


def total_grad_norm(params, device: torch.device) -> torch.Tensor:
    """The 2-norm over all gradients of `params`, on the device (no host sync); 0 when none has a gradient."""
    grads = [p.grad for p in params if p.grad is not None]
    return torch.nn.utils.get_total_norm(grads) if grads else torch.zeros((), device=device)


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype a Lightning precision setting trains under; None for full/true precisions."""
    return {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)


__all__ = ["StepGraph", "autocast_dtype", "total_grad_norm"]
