"""Stop (or skip) a training step whose loss or gradient norm is not finite, naming the step.

Checked after backward and before the optimizer step, so a bad step never reaches the weights. Each check reads one
boolean back from the device (a host sync); `check_every_n_steps > 1` trades that cost for a later stop in
"stop" mode (the first bad step is still named exactly: it is recorded on the device). "skip" checks every step.

With cuda_graph_steps=k > 1 one training batch runs k optimizer steps in a graph replay, Lightning's optimizer hooks
do not run, and the task leaves the k steps' losses and gradient norms as vectors: the guard reads them at the end
of the batch and records the first bad one of the k. Their updates already happened, as any step's between two
checks does with check_every_n_steps > 1; "skip" cannot drop a step inside the graph and is refused at plan time.
"""

from __future__ import annotations

import logging
from typing import Annotated

import lightning as L
import torch
from annotated_types import Ge

from sweeplab.errors import UserError

log = logging.getLogger(__name__)
MODES = ("stop", "skip", "off")


class NonFiniteError(UserError):
    pass


class NonFiniteGuard(L.Callback):
    def __init__(
        self, mode: str = "stop", check_every_n_steps: int = 1, max_consecutive_skips: Annotated[int, Ge(0)] = 10
    ):
        if mode not in MODES:
            raise ValueError(f"guard.mode={mode!r} is not one of {MODES}")
        if check_every_n_steps < 1:
            raise ValueError(f"guard.check_every_n_steps must be >= 1, got {check_every_n_steps}")
        self.mode = mode
        self.check_every_n_steps = 1 if mode == "skip" else check_every_n_steps
        self.max_consecutive_skips = max_consecutive_skips
        self.skipped_steps: list[int] = []
        self._consecutive = 0
        self._first_bad: torch.Tensor | None = None  # on the device: -1, or the first bad step

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        if self.mode == "off":
            return
        loss = getattr(pl_module, "last_loss", None)
        grad_norm = pl_module.step_grad_norm()  # computed once per step: the clipping reuses it
        self._check(trainer, loss, grad_norm, trainer.global_step, optimizer)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        steps = getattr(pl_module, "graph_steps", 1)
        if self.mode == "off" or steps == 1:
            return
        # the k steps of this batch (global_step already counts them): vectors, one entry per step
        self._check(trainer, pl_module.last_loss, pl_module.last_grad_norm, trainer.global_step - steps, None)

    def _check(self, trainer: L.Trainer, loss, grad_norm: torch.Tensor, step: int, optimizer) -> None:
        finite = torch.isfinite(grad_norm)
        if loss is not None:
            finite = finite & torch.isfinite(loss)
        if finite.ndim:  # several steps, from `step` on: the first bad one, else -1
            steps = torch.arange(step, step + finite.numel(), device=finite.device)
            bad = torch.where(finite, torch.iinfo(torch.long).max, steps).min()
            step += finite.numel() - 1  # the last of them: where the check interval is counted
            finite, first_in_group = finite.all(), bad
            loss, grad_norm = (loss[-1] if loss is not None else None), grad_norm[-1]
        else:
            first_in_group = step
        if self.mode == "skip":
            if bool(finite):
                self._consecutive = 0
                return
            optimizer.zero_grad(set_to_none=True)  # the optimizer skips parameters without gradients
            self.skipped_steps.append(step)
            self._consecutive += 1
            log.warning("non-finite loss or gradient at step %d: step skipped", step)
            if self._consecutive > self.max_consecutive_skips:
                raise NonFiniteError(
                    f"{self._consecutive} non-finite steps in a row up to step {step}: the run diverged; "
                    "lower optim.lr or check the data"
                )
            return
        if self._first_bad is None:
            self._first_bad = torch.full((), -1, dtype=torch.long, device=grad_norm.device)
        self._first_bad = torch.where((self._first_bad < 0) & ~finite, first_in_group, self._first_bad)
        if (step + 1) % self.check_every_n_steps == 0:
            first_bad = int(self._first_bad)
            if first_bad >= 0:
                loss_text = f"{float(loss):.4g}" if loss is not None else "?"
                raise NonFiniteError(
                    f"non-finite loss or gradient norm at step {first_bad} (loss={loss_text}, "
                    f"grad_norm={float(grad_norm):.4g}): lower optim.lr, check the data, or set guard.mode=skip"
                )
