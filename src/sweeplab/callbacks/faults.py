"""Fault injection for reliability tests: kill or fail a run at a given step, from the environment.

SWEEPLAB_FAULT_KILL_AT_STEP=N  sends SIGKILL to the process after optimizer step N (a power cut, kill -9).
SWEEPLAB_FAULT_RAISE_AT_STEP=N raises RuntimeError after optimizer step N (a crashing job).
Unset in normal use; the callback is added only when one is set.
"""

from __future__ import annotations

import os
import signal

import lightning as L

KILL_ENV = "SWEEPLAB_FAULT_KILL_AT_STEP"
RAISE_ENV = "SWEEPLAB_FAULT_RAISE_AT_STEP"


class FaultInjection(L.Callback):
    def __init__(self, kill_at_step: int | None = None, raise_at_step: int | None = None):
        self.kill_at_step = kill_at_step
        self.raise_at_step = raise_at_step

    @classmethod
    def from_env(cls) -> FaultInjection | None:
        kill, fail = os.environ.get(KILL_ENV), os.environ.get(RAISE_ENV)
        if not kill and not fail:
            return None
        return cls(int(kill) if kill else None, int(fail) if fail else None)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if self.kill_at_step is not None and step == self.kill_at_step:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.raise_at_step is not None and step == self.raise_at_step:
            raise RuntimeError(f"injected failure at step {step} ({RAISE_ENV})")
