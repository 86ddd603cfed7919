"""The fit loop's safe points for a stop request (sweeplab.core.interrupts): the signal handler only records a SIGINT,
SIGTERM or SIGHUP while Lightning trains, and this callback raises `Interrupted` at the next training batch's end,
validation's start, batch or end, or checkpoint save; Lightning's own exception path then runs.

Added last among sweeplab's callbacks (before Lightning moves the checkpoint callbacks to the end), so a callback
that waits in a hook (callbacks/faults.py's pause) returns first and the stop is acted on in the same hook.
"""

from __future__ import annotations

import lightning as L

from sweeplab.core import interrupts


class StopAtSafePoint(L.Callback):
    def on_train_start(self, trainer, pl_module) -> None:
        interrupts.check()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        interrupts.check()

    def on_validation_start(self, trainer, pl_module) -> None:
        interrupts.check()

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        interrupts.check()

    def on_validation_end(self, trainer, pl_module) -> None:
        interrupts.check()

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        interrupts.check()  # before the file is written (AtomicCheckpointIO): the last complete one stays


__all__ = ["StopAtSafePoint"]
