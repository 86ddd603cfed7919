"""paGating language modelling: next-token cross-entropy on packed blocks (no padding, so none in the loss)."""

from __future__ import annotations

import lightning as L
import torch

from sweeplab.families.pagating_lm.alpha import AlphaScheduleCallback
from sweeplab.models.gpt import GPT, GPTConfig, cross_entropy, float8_training
from sweeplab.models.pagating import set_alpha_step
from sweeplab.tasks.base import SweepTask
from sweeplab.tasks.optim import OptimConfig

lm_loss = cross_entropy  # mean next-token cross-entropy of logits, fp32 (models/gpt.py)


class LMTask(SweepTask):
    family = "pagating_lm"
    fixed_shapes = True  # packed blocks of block_size tokens, the last short training batch dropped (data.py)

    def __init__(self, model: GPTConfig, loss: None, optim: OptimConfig, alpha_log_every_n_steps: int | None = None):
        gpt = GPT(model)
        # model.float8: the linear layers train in float8 (torchao); the raw loop of the bench builds its model here too
        self.float8_layers = float8_training(gpt, model.float8)
        super().__init__(gpt, optim)  # `loss`: None, cross-entropy takes no settings; hparams: model and optim
        self.alpha_log_every_n_steps = alpha_log_every_n_steps
        self._scheduled_alpha = model.ffn == "pagating" and str(model.alpha) in ("cosine", "linear")
        self._val_loss_sum = torch.zeros(())
        self._val_tokens = 0

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids)

    def training_loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return self.model.loss(batch["input_ids"], batch["labels"]), {}  # the head's loss as model.lm_loss says

    def on_validation_epoch_start(self) -> None:
        self._val_loss_sum = torch.zeros((), device=self.device)
        self._val_tokens = 0

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        n_tokens = batch["labels"].numel()
        self._val_loss_sum += lm_loss(self.forward_fn(batch["input_ids"]), batch["labels"]) * n_tokens
        self._val_tokens += n_tokens

    def on_validation_epoch_end(self) -> None:
        if self._val_tokens:
            loss = self._val_loss_sum / self._val_tokens  # token-weighted over the whole validation set
            self.log_dict({"val/loss": loss, "val/ppl": torch.exp(loss)})

    def set_training_step(self, step: int) -> None:
        if self._scheduled_alpha:
            set_alpha_step(self.model, step)

    def extra_callbacks(self) -> list[L.Callback]:
        return [AlphaScheduleCallback(log_every_n_steps=self.alpha_log_every_n_steps)]

    def tokens_in(self, batch: dict) -> int:
        return int(batch["input_ids"].numel())

    def flops_in(self, batch: dict) -> float:
        return self.tokens_in(batch) * self.model.flops_per_token(int(batch["input_ids"].shape[1]))

    def summary_metrics(self, trainer: L.Trainer) -> dict[str, float]:
        summary = super().summary_metrics(trainer)
        summary["summary/flops_per_token"] = self.model.flops_per_token()
        summary.update({f"summary/alpha/{k}": v for k, v in self.model.alpha_values().items()})
        return summary
