"""TextBridge distillation: loss α·(1 − cos) + β·MSE against teacher embeddings, retrieval metrics on validation."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Annotated

import torch
import torch.nn.functional as F
from annotated_types import Ge

from sweeplab.models.textbridge import TextBridgeConfig, TextBridgeEncoder
from sweeplab.tasks.base import SweepTask
from sweeplab.tasks.optim import OptimConfig

log = logging.getLogger(__name__)


@dataclass
class LossConfig:
    alpha: Annotated[float, Ge(0)] = 0.7  # weight of (1 - cosine)
    beta: Annotated[float, Ge(0)] = 0.7  # weight of the MSE

    def __post_init__(self) -> None:
        # the annotations are what the config's early check reads; a LossConfig built directly (plain torch use, no
        # config) is checked here as well: a negative, NaN or infinite weight would train on a meaningless loss
        if not all(math.isfinite(w) and w >= 0 for w in (self.alpha, self.beta)):
            raise ValueError(f"alpha and beta must be finite and >= 0, got alpha={self.alpha}, beta={self.beta}")
        if self.alpha == 0 and self.beta == 0:
            raise ValueError("alpha and beta are both 0: the loss would be constant; set at least one > 0")


def cosine_per_sample(z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    z = z / z.norm(dim=-1, keepdim=True).clamp_min(1e-6)
    t = t / t.norm(dim=-1, keepdim=True).clamp_min(1e-6)
    return (z * t).sum(-1)


def distill_loss(z: torch.Tensor, t: torch.Tensor, cfg: LossConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, mean cosine, MSE); computed in fp32 whatever the autocast dtype."""
    z, t = z.float(), t.float()
    cos = cosine_per_sample(z, t).mean()
    mse = F.mse_loss(z, t)
    return cfg.alpha * (1 - cos) + cfg.beta * mse, cos, mse


def retrieval_metrics(z: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """P@1 and MRR: each student embedding ranks all teacher embeddings by cosine; the right one is its own."""
    sim = F.normalize(z.float(), dim=-1, eps=1e-6) @ F.normalize(t.float(), dim=-1, eps=1e-6).T
    own = sim.diagonal().unsqueeze(1)
    rank = (sim > own).sum(1) + 1  # ties count in the model's favour
    return (rank == 1).float().mean(), (1.0 / rank.float()).mean()


class FrozenFeatureCache:
    """The frozen trunk's output for every sample, computed once, on the training device.

    With `model.freeze=trunk` that is the pooled sentence vector (N, D); with `trunk_except_last` the token features
    entering the last block (N, L_max, D), zero beyond each sample's length (blocks zero padded positions).
    """

    def __init__(self, model: TextBridgeEncoder, dataset, collate, batch_size: int, device: torch.device):
        self.start_block = model.first_trainable_block
        self.pooled = self.start_block >= model.config.n_blocks
        n = len(dataset.source)
        lengths = dataset.source.token_lengths  # from the reader's index pass; None for text-mode data
        l_max = dataset.max_len if lengths is None or not len(lengths) else max(1, min(dataset.max_len, int(lengths.max())))
        d = model.config.d_model
        self.features = torch.zeros((n, d) if self.pooled else (n, l_max, d), device=device)
        loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, collate_fn=collate)
        from tqdm.auto import tqdm

        with torch.no_grad():
            for batch in tqdm(loader, desc="caching frozen trunk", leave=False):
                ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
                features = model.frozen_features(ids, mask, self.start_block)  # (B, D) pooled or (B, L, D)
                self.features[batch["sample_id"].to(device), : features.shape[1]] = features.float()

    @staticmethod
    def size_mb(model: TextBridgeEncoder, n_samples: int, l_max: int) -> float:
        pooled = model.first_trainable_block >= model.config.n_blocks
        return n_samples * (1 if pooled else l_max) * model.config.d_model * 4 / 2**20

    def forward(self, model: TextBridgeEncoder, batch: dict) -> torch.Tensor:
        if self.pooled:
            return model.forward_from_features(self.features[batch["sample_id"]], batch["attention_mask"], self.start_block)
        mask = batch["attention_mask"]
        if self._real_tokens_only(model, mask):
            return self._forward_real_tokens(model, batch)
        x = self.features[batch["sample_id"], : mask.shape[1]]
        return model.forward_from_features(x, mask, self.start_block)

    def _real_tokens_only(self, model: TextBridgeEncoder, mask: torch.Tensor) -> bool:
        """On the CPU, with one trainable block, the step is compute-bound and most of a batch is padding (demo:
        ~60 %): compute that block on real tokens only. Needs right padding (each mask a prefix of ones). Not on
        GPUs: selecting the real tokens there needs a host sync, and the padded step is not compute-bound."""
        return (
            self.features.device.type == "cpu"
            and self.start_block == model.config.n_blocks - 1
            and not bool((mask[:, 1:] > mask[:, :-1]).any())
        )

    def _forward_real_tokens(self, model: TextBridgeEncoder, batch: dict) -> torch.Tensor:
        mask = batch["attention_mask"].bool()
        tokens = self.features[batch["sample_id"], : mask.shape[1]][mask]  # (T, D): real tokens, sample after sample
        return model.forward_last_block_at_tokens(tokens, mask.sum(1))


class TextBridgeTask(SweepTask):
    family = "textbridge"

    def __init__(self, model: TextBridgeConfig, loss: LossConfig, optim: OptimConfig):
        super().__init__(TextBridgeEncoder(model), optim, loss=loss)  # hparams: model, loss and optim configs
        self.feature_cache: FrozenFeatureCache | None = None
        self._val_z: list[torch.Tensor] = []
        self._val_t: list[torch.Tensor] = []

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, attention_mask)

    def on_fit_start(self) -> None:
        super().on_fit_start()
        model, dm = self.model, self.trainer.datamodule
        if not model.config.cache_frozen or model.first_trainable_block == 0 or dm is None:
            return
        dataset = dm.train_dataset
        size = FrozenFeatureCache.size_mb(model, len(dataset.source), dm.max_len)
        if size > model.config.cache_max_mb:
            log.warning("frozen-trunk cache would take up to %.0f MB > model.cache_max_mb: computing it every step", size)
            return
        self.feature_cache = FrozenFeatureCache(model, dataset, dm.collate, dm.batch_size, self.device)

    def on_fit_end(self) -> None:
        super().on_fit_end()
        self.feature_cache = None  # a cache of one fit; weights of a later fit could differ

    def training_loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if self.feature_cache is not None:
            z = self.feature_cache.forward(self.model, batch)
        else:
            z = self.model(batch["input_ids"], batch["attention_mask"])
        loss, cos, mse = distill_loss(z, batch["target"], self.loss_config)
        return loss, {"train/cos": cos, "train/mse": mse}

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        z = self.forward_fn(batch["input_ids"], batch["attention_mask"])
        loss, cos, mse = distill_loss(z, batch["target"], self.loss_config)
        n = self.samples_in(batch)
        self.log_dict({"val/loss": loss, "val/cos": cos, "val/mse": mse}, on_epoch=True, batch_size=n)
        # clone: with compile=reduce-overhead the model's output lives in CUDA-graph memory that the next call reuses
        self._val_z.append(z.detach().float().clone())
        self._val_t.append(batch["target"].detach().float())

    def on_validation_epoch_end(self) -> None:
        if self._val_z:
            p_at_1, mrr = retrieval_metrics(torch.cat(self._val_z), torch.cat(self._val_t))
            self.log_dict({"val/p_at_1": p_at_1, "val/mrr": mrr})
        self._val_z.clear()
        self._val_t.clear()

    def tokens_in(self, batch: dict) -> torch.Tensor:
        return batch["attention_mask"].sum()

    def flops_in(self, batch: dict) -> float:
        return self.samples_in(batch) * self.model.flops_per_sample(int(batch["input_ids"].shape[1]))
