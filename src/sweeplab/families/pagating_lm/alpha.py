"""Steps scheduled paGating α and logs every unit's α as `alpha/<layer>`.

The original never stepped its schedules; here the schedule position is the optimizer step count
(`trainer.global_step`), so gradient accumulation, resumed runs and validation loops all see the right α.
Convention: the LightningModule keeps its nn.Module at `pl_module.model`.

Logging goes straight to `trainer.loggers` (`log_metrics(..., step=global_step)`), not through `pl_module.log`:
one host sync per `log_every_n_steps` window (all α stacked and fetched at once), independent of the Trainer's
own `log_every_n_steps`, and nothing added to `callback_metrics` or the progress bar.
"""

from __future__ import annotations

import lightning as L

from sweeplab.models.pagating import alpha_values, set_alpha_step


class AlphaScheduleCallback(L.Callback):
    def __init__(self, log_every_n_steps: int | None = None):
        """log_every_n_steps: None follows the Trainer's own `log_every_n_steps`."""
        if log_every_n_steps is not None and log_every_n_steps <= 0:
            raise ValueError(f"log_every_n_steps must be > 0, got {log_every_n_steps}")
        self.log_every_n_steps = log_every_n_steps
        self._last_step: int | None = None

    @staticmethod
    def _model(pl_module: L.LightningModule):
        return getattr(pl_module, "model", pl_module)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # after a checkpoint resume global_step is already the restored count: put the schedules there
        self._last_step = trainer.global_step
        if self.log_every_n_steps is None:
            self.log_every_n_steps = trainer.log_every_n_steps
        set_alpha_step(self._model(pl_module), trainer.global_step)
        self._log(trainer, pl_module)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step == self._last_step:  # a gradient-accumulation micro-batch: no optimizer step happened
            return
        self._last_step = step
        set_alpha_step(self._model(pl_module), step)
        if step % self.log_every_n_steps == 0:
            self._log(trainer, pl_module)

    def _log(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.loggers:
            return
        model = self._model(pl_module)
        values = model.alpha_values() if hasattr(model, "alpha_values") else alpha_values(model)
        if not values:
            return
        metrics = {f"alpha/{layer}": value for layer, value in values.items()}
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)


__all__ = ["AlphaScheduleCallback"]
