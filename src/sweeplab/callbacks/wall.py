"""The job's wall clock (sweeplab.core.wall) switched at Lightning's hooks: warm-up and timed training batches,
validation, the end of training. Checkpoints and MLflow writes charge their own time where they happen."""

from __future__ import annotations

import lightning as L

from sweeplab.core import wall


class WallBreakdown(L.Callback):
    def __init__(self, warmup_steps: int):
        self.warmup_steps = warmup_steps

    def _training_part(self, trainer: L.Trainer) -> str:
        return "warmup" if trainer.global_step < self.warmup_steps else "steps"

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        clock = wall.clock()
        if clock.part == "setup":  # the first batch: the set-up ends here, its split goes to the job's log
            clock.end_setup(self._training_part(trainer))
        else:
            clock.switch(self._training_part(trainer))

    def on_validation_start(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:  # the sanity check belongs to the set-up
            wall.clock().switch("validation")

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            wall.clock().switch(self._training_part(trainer))

    def on_train_end(self, trainer, pl_module) -> None:
        wall.clock().switch("teardown")
