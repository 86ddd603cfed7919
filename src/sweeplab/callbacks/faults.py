"""Fault injection for reliability tests: kill or fail a run at a given step, from the environment.

SWEEPLAB_FAULT_KILL_AT_STEP=N  sends SIGKILL to the process after optimizer step N (a power cut, kill -9).
SWEEPLAB_FAULT_RAISE_AT_STEP=N raises RuntimeError after optimizer step N (a crashing job).
SWEEPLAB_FAULT_OOM_AT_STEP=N   raises torch.OutOfMemoryError after optimizer step N (a batch too large).
SWEEPLAB_FAULT_NAN_GRAD_AT_STEP=N poisons the gradients of step N with NaN (a diverging step).
SWEEPLAB_FAULT_PAUSE_AT_STEP=N    after optimizer step N, creates the file SWEEPLAB_FAULT_PAUSED_FILE names and waits
                                  there (up to 10 minutes, until a stop is requested or the file is removed): a
                                  test knows the run is training and sends its signal, or lets it go on.
SWEEPLAB_FAULT_PAUSE_AT_FINAL_VALIDATION=1  the same at the start of the validation after fit.
SWEEPLAB_FAULT_KILL_IN_VALIDATION_AT_STEP=N sends SIGKILL during the validation at step N (before its scores
                               reach any checkpoint; at the last step: the run's final validation).
SWEEPLAB_FAULT_KILL_AFTER_FIT=1 sends SIGKILL once fit is done (every checkpoint written; summary, tags and export
                               not yet).
SWEEPLAB_FAULT_PAUSE_IN=<stage> pauses once inside a named stage, so that a test's signal lands there: it creates
                               the paused file and sleeps SWEEPLAB_FAULT_PAUSE_S seconds (default 5) or until the file
                               is removed, then the stage goes on. The pause does not look at a stop request: the
                               stage's own safe points must act on it. Stages (`pause_in` is called there):
                               setup (job.start_fit, the MLflow run open, before the data is set up), validation
                               (after a validation batch during fit, not the final validation), checkpointing
                               (inside the checkpoint IO's save, before the file is written), export (inside the
                               export, before the conversion), report (the sweep's end-of-sweep report),
                               checkpoint-written (a checkpoint's bytes are in its temporary file, not yet renamed;
                               with checkpoint.background, on the writer thread). <stage>@N pauses the Nth time the
                               stage runs instead of the first.
Unset in normal use; the callback is added only when one is set. The names are defined in sweeplab.core.channels.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import lightning as L
import torch

from sweeplab.core import interrupts
from sweeplab.core.channels import (
    FAULT_KILL_AFTER_FIT_ENV,
    FAULT_KILL_ENV,
    FAULT_KILL_IN_VALIDATION_ENV,
    FAULT_NAN_ENV,
    FAULT_OOM_ENV,
    FAULT_PAUSE_ENV,
    FAULT_PAUSE_FINAL_VALIDATION_ENV,
    FAULT_PAUSE_IN_ENV,
    FAULT_PAUSE_S_ENV,
    FAULT_PAUSED_FILE_ENV,
    FAULT_RAISE_ENV,
)

PAUSE_S = 600.0
_paused_in: set[str] = set()  # a stage pauses once per process
_stage_runs: dict[str, int] = {}  # how many times each paused stage ran (<stage>@N)


def pause_in(stage: str) -> None:
    """SWEEPLAB_FAULT_PAUSE_IN=<stage>: the first time this runs in that stage, create the paused file and sleep
    SWEEPLAB_FAULT_PAUSE_S seconds or until the file is removed; a no-op (one dict look-up) otherwise. The sleep
    ignores stop requests: it stands for work that cannot look at the flag, and the stage's own safe points act."""
    wanted = os.environ.get(FAULT_PAUSE_IN_ENV)
    if wanted is None or stage in _paused_in:
        return
    name, _, nth = wanted.partition("@")
    if name != stage:
        return
    _stage_runs[stage] = _stage_runs.get(stage, 0) + 1
    if _stage_runs[stage] < int(nth or 1):
        return
    _paused_in.add(stage)
    paused_file = os.environ.get(FAULT_PAUSED_FILE_ENV)
    deadline = time.monotonic() + float(os.environ.get(FAULT_PAUSE_S_ENV) or 5.0)
    if paused_file:
        Path(paused_file).write_text(stage)
    while time.monotonic() < deadline:
        if paused_file and not Path(paused_file).exists():
            return
        time.sleep(0.05)


class FaultInjection(L.Callback):
    def __init__(
        self,
        kill_at_step: int | None = None,
        raise_at_step: int | None = None,
        oom_at_step: int | None = None,
        nan_grad_at_step: int | None = None,
        pause_at_step: int | None = None,
        kill_in_validation_at_step: int | None = None,
        kill_after_fit: int | None = None,
        pause_at_final_validation: bool = False,
        paused_file: str | None = None,
    ):
        self.kill_at_step = kill_at_step
        self.raise_at_step = raise_at_step
        self.oom_at_step = oom_at_step
        self.nan_grad_at_step = nan_grad_at_step
        self.pause_at_step = pause_at_step
        self.kill_in_validation_at_step = kill_in_validation_at_step
        self.kill_after_fit = kill_after_fit
        self.pause_at_final_validation = pause_at_final_validation
        self.paused_file = paused_file

    @classmethod
    def from_env(cls) -> FaultInjection | None:
        names = (
            FAULT_KILL_ENV, FAULT_RAISE_ENV, FAULT_OOM_ENV, FAULT_NAN_ENV, FAULT_PAUSE_ENV, FAULT_KILL_IN_VALIDATION_ENV,
            FAULT_KILL_AFTER_FIT_ENV,
        )
        values = [os.environ.get(name) for name in names]
        pause_final = os.environ.get(FAULT_PAUSE_FINAL_VALIDATION_ENV) == "1"
        if not any(values) and not pause_final and os.environ.get(FAULT_PAUSE_IN_ENV) != "validation":
            return None
        return cls(*(int(v) if v else None for v in values), pause_final, os.environ.get(FAULT_PAUSED_FILE_ENV))

    def _pause(self, where: str) -> None:
        if self.paused_file:
            Path(self.paused_file).write_text(where)
        deadline = time.monotonic() + PAUSE_S
        # until a stop is requested (the next safe point acts on it), the file is removed, or 10 minutes passed
        while time.monotonic() < deadline and interrupts.requested() is None:
            if self.paused_file and not Path(self.paused_file).exists():
                return
            time.sleep(0.05)

    def on_validation_start(self, trainer, pl_module) -> None:
        # the final validation runs inside fit at the last step (callbacks/checkpoints.ValidateAtLastStep)
        if self.pause_at_final_validation and (trainer.state.fn == "validate" or trainer.global_step >= trainer.max_steps):
            self._pause("final validation")

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
            raise RuntimeError(f"injected failure at step {step} ({FAULT_RAISE_ENV})")
        if self.oom_at_step is not None and step == self.oom_at_step:
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected at step {step} by {FAULT_OOM_ENV})")
        if self.pause_at_step is not None and step == self.pause_at_step:
            self._pause(f"step {step}")

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if batch_idx == 0 and not trainer.sanity_checking and trainer.global_step < trainer.max_steps:
            pause_in("validation")  # between a validation's batches during fit, not the final validation
        if self.kill_in_validation_at_step is not None and trainer.global_step == self.kill_in_validation_at_step:
            os.kill(os.getpid(), signal.SIGKILL)

    def on_fit_end(self, trainer, pl_module) -> None:
        if self.kill_after_fit:
            os.kill(os.getpid(), signal.SIGKILL)
