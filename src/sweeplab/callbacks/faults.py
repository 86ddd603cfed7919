"""Fault injection for reliability tests: kill or fail a run at a given step, from the environment.

SWEEPLAB_FAULT_KILL_AT_STEP=N  sends SIGKILL to the process after optimizer step N (a power cut, kill -9).
SWEEPLAB_FAULT_RAISE_AT_STEP=N raises RuntimeError after optimizer step N (a crashing job).
SWEEPLAB_FAULT_OOM_AT_STEP=N   raises torch.OutOfMemoryError after optimizer step N (a batch too large).
SWEEPLAB_FAULT_NAN_GRAD_AT_STEP=N poisons the gradients of step N with NaN (a diverging step).
SWEEPLAB_FAULT_KILL_IN_VALIDATION_AT_STEP=N sends SIGKILL during the validation at step N (before its scores
                               reach any checkpoint; at the last step: the run's final validation).
SWEEPLAB_FAULT_KILL_AFTER_FIT=1 sends SIGKILL once fit is done (every checkpoint written; summary, tags and export
                               not yet).
Unset in normal use; the callback is added only when one is set.
"""

from __future__ import annotations

import os
import signal

import lightning as L
import torch

KILL_ENV = "SWEEPLAB_FAULT_KILL_AT_STEP"
RAISE_ENV = "SWEEPLAB_FAULT_RAISE_AT_STEP"
OOM_ENV = "SWEEPLAB_FAULT_OOM_AT_STEP"
NAN_ENV = "SWEEPLAB_FAULT_NAN_GRAD_AT_STEP"
KILL_IN_VALIDATION_ENV = "SWEEPLAB_FAULT_KILL_IN_VALIDATION_AT_STEP"
KILL_AFTER_FIT_ENV = "SWEEPLAB_FAULT_KILL_AFTER_FIT"


class FaultInjection(L.Callback):
    def __init__(
        self,
        kill_at_step: int | None = None,
        raise_at_step: int | None = None,
        oom_at_step: int | None = None,
        nan_grad_at_step: int | None = None,
        kill_in_validation_at_step: int | None = None,
        kill_after_fit: int | None = None,
    ):
        self.kill_at_step = kill_at_step
        self.raise_at_step = raise_at_step
        self.oom_at_step = oom_at_step
        self.nan_grad_at_step = nan_grad_at_step
        self.kill_in_validation_at_step = kill_in_validation_at_step
        self.kill_after_fit = kill_after_fit

    @classmethod
    def from_env(cls) -> FaultInjection | None:
        values = [os.environ.get(name) for name in (KILL_ENV, RAISE_ENV, OOM_ENV, NAN_ENV, KILL_IN_VALIDATION_ENV, KILL_AFTER_FIT_ENV)]
        if not any(values):
            return None
        return cls(*(int(v) if v else None for v in values))

    def on_after_backward(self, trainer, pl_module) -> None:
        if self.nan_grad_at_step is not None and trainer.global_step == self.nan_grad_at_step:
            for p in pl_module.parameters():
                if p.grad is not None:
                    p.grad.fill_(float("nan"))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if self.kill_at_step is not None and step == self.kill_at_step:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.raise_at_step is not None and step == self.raise_at_step:
            raise RuntimeError(f"injected failure at step {step} ({RAISE_ENV})")
        if self.oom_at_step is not None and step == self.oom_at_step:
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected at step {step} by {OOM_ENV})")

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if self.kill_in_validation_at_step is not None and trainer.global_step == self.kill_in_validation_at_step:
            os.kill(os.getpid(), signal.SIGKILL)

    def on_fit_end(self, trainer, pl_module) -> None:
        if self.kill_after_fit:
            os.kill(os.getpid(), signal.SIGKILL)
