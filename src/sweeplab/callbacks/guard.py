"""Stop (or skip) a training step whose loss or gradient norm is not finite, naming the step.

Checked after backward and before the optimizer step, so a bad step never reaches the weights. Each check reads one
boolean back from the device (a host sync); `check_every_n_steps > 1` trades that cost for a later stop in
"stop" mode (the first bad step is still named exactly: each step's loss and gradient norm are kept on the device
until the check, one small copy per step and nothing else, since every launch is host time that a small batch on a
fast GPU pays in full). "skip" checks every step. Steps after the last full interval are checked when training ends.

With steps_per_batch=k > 1 one training batch runs k optimizer steps (one graph replay under cuda_graph), Lightning's
optimizer hooks do not run, and the task leaves the k steps' losses and gradient norms as vectors: the guard reads
them at the end of the batch and records the first bad one of the k. Their updates already happened, as any step's
between two checks does with check_every_n_steps > 1; "skip" cannot drop a step inside the batch and is refused at
plan time.

"off" checks nothing during training; when training ends it looks once at the last logged metrics and the weights,
and a run that went non-finite is marked (`FitResult.diverged`: a `diverged` tag and the closing line) instead of
finishing as if nothing happened.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Annotated, Any

import lightning as L
import torch
from annotated_types import Ge

from sweeplab.core.errors import UserError

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
        self._unchecked: list[tuple[int, torch.Tensor]] = []  # (first step, [loss; grad norm] x its steps), on the device
        self.diverged: str | None = None  # mode "off": what was not finite when training ended

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        if self.mode == "off":
            return
        loss = getattr(pl_module, "last_loss", None)
        grad_norm = pl_module.step_grad_norm()  # computed once per step: the clipping reuses it
        self._check(trainer, loss, grad_norm, trainer.global_step, optimizer)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        steps = getattr(pl_module, "steps_per_batch", 1)
        if self.mode == "off" or steps == 1:
            return
        # the k steps of this batch (global_step already counts them): vectors, one entry per step
        self._check(trainer, pl_module.last_loss, pl_module.last_grad_norm, trainer.global_step - steps, None)

    def _check(self, trainer: L.Trainer, loss, grad_norm: torch.Tensor, step: int, optimizer) -> None:
        """Keep the values of the steps from `step` on (one, or a vector of k); read them back at the interval."""
        values = torch.stack([grad_norm, grad_norm if loss is None else loss]).reshape(2, -1)  # a copy: kept safe
        self._unchecked.append((step, values))  # from the graph's outputs, which the next replay overwrites
        step += values.shape[1] - 1  # the last of them: where the check interval is counted
        if self.mode == "skip":
            if self._first_bad() is None:
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
        if (step + 1) % self.check_every_n_steps == 0:
            self._stop_at_first_bad(has_loss=loss is not None)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.mode == "stop" and self._unchecked:  # the steps after the last full check interval
            self._stop_at_first_bad(has_loss=getattr(pl_module, "last_loss", None) is not None)
        if self.mode == "off":
            self.diverged = nonfinite_at_end(pl_module, trainer.callback_metrics, trainer.global_step)

    def _first_bad(self) -> tuple[int, float, float] | None:
        """(step, loss, grad norm) of the first non-finite step kept since the last check, else None; one host
        sync. Forgets the kept steps."""
        kept, self._unchecked = self._unchecked, []
        if not kept:
            return None
        values = torch.cat([v for _, v in kept], dim=1)
        bad = ~torch.isfinite(values).all(dim=0)
        if not bool(bad.any()):
            return None
        index = int(bad.nonzero()[0])
        steps = [first + j for first, v in kept for j in range(v.shape[1])]
        grad_norm, loss = values[:, index].tolist()
        return steps[index], loss, grad_norm

    def _stop_at_first_bad(self, has_loss: bool) -> None:
        bad = self._first_bad()
        if bad is not None:
            step, loss, grad_norm = bad
            loss_text = f"{loss:.4g}" if has_loss else "?"
            raise NonFiniteError(
                f"non-finite loss or gradient norm at step {step} (loss={loss_text}, "
                f"grad_norm={grad_norm:.4g}): lower optim.lr, check the data, or set guard.mode=skip"
            )


def nonfinite_at_end(model: torch.nn.Module, metrics: Mapping[str, Any], step: int) -> str | None:
    """What is not finite once training ended (the last logged metrics, the weights), for a run the guard did not
    stop (guard.mode=off): one host read of each, once per run. None: all finite."""
    names = sorted(k for k, v in metrics.items() if _is_number(v) and not math.isfinite(float(v)))
    weights = [name for name, p in model.named_parameters() if not bool(torch.isfinite(p.detach()).all())]
    if not names and not weights:
        return None
    found = [f"non-finite {', '.join(names[:4])}{' ...' if len(names) > 4 else ''}"] if names else []
    if weights:
        found.append(f"{len(weights)} weight tensor(s) with NaN/inf, first {weights[0]}")
    return f"{'; '.join(found)} at step {step}"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) or (torch.is_tensor(value) and value.numel() == 1)
