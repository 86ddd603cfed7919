"""What every task shares: the optimizer and schedule, the hyperparameters a checkpoint carries, and the
questions the timing callback asks of a batch (how many samples, tokens and FLOPs)."""

from __future__ import annotations

import lightning as L
import torch
from torch import nn

from sweeplab.tasks.optim import OptimConfig, build_optimizer, build_scheduler


class SweepTask(L.LightningModule):
    family: str = ""
    monitor: str = "val/loss"  # what the best checkpoint and the sweeper optimise
    monitor_mode: str = "min"

    def __init__(self, model: nn.Module, optim: OptimConfig, hparams: dict):
        super().__init__()
        self.model = model
        self.optim_config = optim
        # plain dicts only: checkpoints stay loadable with torch.load(weights_only=True)
        self.save_hyperparameters({"family": self.family, **hparams}, logger=False)  # the run logs the full config
        self.last_loss: torch.Tensor | None = None  # read by the non-finite guard before the optimizer step
        self.mlflow_run_id: str | None = None  # kept in checkpoints, so a resumed run continues the same MLflow run

    def configure_optimizers(self):
        optimizer = build_optimizer(self.model, self.optim_config)
        max_steps = self.trainer.max_steps if self.trainer is not None and self.trainer.max_steps > 0 else 1000
        scheduler = build_scheduler(optimizer, self.optim_config, max_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def should_log_step(self) -> bool:
        """Whether this step's training metrics reach the loggers (Lightning writes every log_every_n_steps).
        Each self.log costs ~0.2 ms of host time (Lightning moves its result record with apply_to_collection),
        so the steps in between skip it."""
        trainer = self._trainer
        return trainer is None or (self.global_step + 1) % max(1, trainer.log_every_n_steps) == 0

    def log_lr(self) -> None:
        schedulers = self.lr_schedulers()
        if schedulers is not None:
            self.log("lr", schedulers.get_last_lr()[0], on_step=True, on_epoch=False)

    # --- for the timing callback: host-side answers, no device sync --------------------------------
    def samples_in(self, batch: dict) -> int:
        return int(batch["input_ids"].shape[0])

    def tokens_in(self, batch: dict) -> int | torch.Tensor:
        """Real (non-padding) tokens; may be a device tensor, summed by the caller without a sync."""
        return int(batch["input_ids"].numel())

    def flops_in(self, batch: dict) -> float | None:
        return None

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["sweeplab"] = {"mlflow_run_id": self.mlflow_run_id}

    # --- what the training app asks of every task ----------------------------------------------------
    def extra_callbacks(self) -> list[L.Callback]:
        """Family-specific callbacks (e.g. stepping a scheduled alpha)."""
        return []

    def summary_metrics(self, trainer: L.Trainer) -> dict[str, float]:
        total = sum(p.numel() for p in self.model.parameters())
        trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        return {"summary/num_parameters": float(total), "summary/trainable_parameters": float(trainable)}
