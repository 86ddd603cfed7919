"""The decoder's training and validation: teacher-forced token cross entropy; on validation, token accuracy, and
greedy decodes scored by exact match on token ids and by chrF on lowercased text."""

from __future__ import annotations

import logging

import torch

from sweeplab.models.textbridge_decoder import (
    IGNORE_INDEX,
    DecoderConfig,
    TextBridgeDecoder,
    teacher_forcing,
    token_loss,
)
from sweeplab.tasks.base import SweepTask
from sweeplab.tasks.optim import OptimConfig

log = logging.getLogger(__name__)


def chrf(hypotheses: list[str], references: list[str]) -> float:
    """Corpus chrF (character 6-grams, β = 2, no word n-grams: chrF, not chrF++) on lowercased text, in [0, 1]
    (sacrebleu's figure / 100). torchmetrics' implementation, which Lightning installs."""
    from torchmetrics.functional.text import chrf_score

    if not hypotheses:
        return 0.0
    score = chrf_score(hypotheses, [[reference] for reference in references], n_word_order=0, lowercase=True)
    return float(score)


def sentence_ids(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
    """Each right-padded row's real token ids (one host copy)."""
    lengths = attention_mask.sum(1).tolist()
    return [row[:n] for row, n in zip(input_ids.tolist(), lengths)]


class DecoderTask(SweepTask):
    family = "textbridge_decoder"

    def __init__(self, model: DecoderConfig, loss: None, optim: OptimConfig):
        super().__init__(TextBridgeDecoder(model), optim)  # `loss`: None, cross entropy takes no settings
        self._sums = torch.zeros(3)  # validation: summed loss, correct tokens, scored tokens
        self._exact = 0
        self._hypotheses: list[list[int]] = []
        self._references: list[list[int]] = []

    def forward(self, embedding: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(embedding, input_ids)

    def _teacher_forcing(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        config = self.model.config
        return teacher_forcing(batch["input_ids"], batch["attention_mask"], config.bos_id, config.eos_id)

    def training_loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        inputs, labels = self._teacher_forcing(batch)
        states = self.model.hidden(batch["target"], inputs)
        if states.device.type == "cpu":
            # The vocabulary projection and its softmax are most of a step, and on the demo data ~40 % of a batch's
            # positions are padding after EOS: project the scored positions only. Not on GPUs, where selecting
            # them needs a host sync (and a fixed shape for CUDA graphs) and the step is not compute-bound.
            scored = labels != IGNORE_INDEX
            states, labels = states[scored], labels[scored]
        return token_loss(self.model.head(states), labels), {}

    def on_validation_epoch_start(self) -> None:
        self._sums = torch.zeros(3, device=self.device)
        self._hypotheses.clear()
        self._references.clear()

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        inputs, labels = self._teacher_forcing(batch)
        logits = self.forward_fn(batch["target"], inputs)
        scored = labels != IGNORE_INDEX
        correct = ((logits.argmax(-1) == labels) & scored).sum()
        self._sums += torch.stack([token_loss(logits, labels, reduction="sum"), correct.float(), scored.sum().float()])
        self._hypotheses += self.model.generate(batch["target"])
        self._references += sentence_ids(batch["input_ids"], batch["attention_mask"])

    def on_validation_epoch_end(self) -> None:
        loss_sum, correct, tokens = self._sums.tolist()
        if not tokens:
            return
        exact = sum(h == r for h, r in zip(self._hypotheses, self._references)) / len(self._references)
        metrics = {"val/loss": loss_sum / tokens, "val/token_acc": correct / tokens, "val/exact_match": exact}
        tokenizer = self._tokenizer()
        if tokenizer is not None:
            metrics["val/chrf"] = chrf(tokenizer.decode(self._hypotheses), tokenizer.decode(self._references))
        self.log_dict(metrics)

    def _tokenizer(self):
        """The data's tokenizer (for chrF on text); None when the data has none (EFB1 without tokenizer.json)."""
        # Lightning's trainer holds the data; the MLX loop, which has no trainer, sets `datamodule` itself
        trainer = self._trainer
        datamodule = getattr(trainer if trainer is not None else self, "datamodule", None)
        tokenizer = getattr(datamodule, "tokenizer", None)
        if tokenizer is None and not getattr(self, "_warned_no_tokenizer", False):
            log.warning("the data has no tokenizer.json: val/chrf (decoded text) is not logged")
            self._warned_no_tokenizer = True
        return tokenizer

    def tokens_in(self, batch: dict) -> torch.Tensor:
        """Real tokens the decoder reads: each sentence's and its BOS."""
        mask = batch["attention_mask"]
        return mask.sum() + mask.shape[0]

    def flops_in(self, batch: dict) -> float:
        samples, length = batch["input_ids"].shape
        return samples * (length + 1) * self.model.flops_per_token(length + 1)
