"""TextBridge: a causal dilated-TCN text encoder distilled onto teacher sentence embeddings.

Reads top to bottom in the order data flows: embedding -> TCN blocks -> masked mean -> projection. With a frozen
trunk (`freeze`), `frozen_features` is what the frozen part computes and `forward_from_features` the rest; every
path (the plain forward, the frozen-trunk cache, the export's Neural-Engine layout) pools with `masked_mean` and
ends in `project`.
Specification: docs/models.md#textbridge. Plain PyTorch; no Lightning, MLflow or Hydra here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

import torch
import torch.nn.functional as F
from annotated_types import Ge
from torch import nn

FREEZE_MODES = ("none", "trunk", "trunk_except_last")
INIT_MODES = ("torch", "original")

# Named sizes (`model.size=...`); explicit keys override them. "default" is the spec's, "late" the original's later
# runs, "tiny" runs a smoke test in seconds on a CPU.
SIZES: dict[str, dict] = {
    "default": {},
    "late": {"d_model": 768, "n_blocks": 2, "kernel_size": 3, "dilations": [1, 2]},
    "small": {"d_model": 128, "d_hidden": 256, "n_blocks": 2, "kernel_size": 3, "dilations": [1, 2]},
    "tiny": {"d_model": 32, "d_hidden": 64, "n_blocks": 2, "kernel_size": 3, "dilations": [1, 2]},
}


@dataclass
class TextBridgeConfig:
    vocab_size: int = 30000
    d_model: int = 256
    d_hidden: int = 512
    n_blocks: int = 4
    kernel_size: int = 5
    dilations: list[Annotated[int, Ge(1)]] = field(default_factory=lambda: [1, 2, 4, 8])
    out_dim: int = 768
    max_len: int = 128
    use_tanh: bool = False
    init: str = "torch"  # "original": the EnergyFlowSwift init (decides what a frozen random trunk is)
    freeze: str = "none"  # none | trunk | trunk_except_last
    # Training only: with a frozen trunk, compute its output once per sample and reuse it every step (the frozen
    # layers are a fixed function of the input). Ignored by forward(); up to cache_max_mb of memory on the device.
    cache_frozen: bool = True
    cache_max_mb: Annotated[int, Ge(0)] = 4096

    def __post_init__(self) -> None:
        if self.init not in INIT_MODES:
            raise ValueError(f"model.init={self.init!r} is not one of {INIT_MODES}")
        if self.freeze not in FREEZE_MODES:
            raise ValueError(f"model.freeze={self.freeze!r} is not one of {FREEZE_MODES}")
        for name in ("vocab_size", "d_model", "d_hidden", "n_blocks", "kernel_size", "out_dim", "max_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"model.{name} must be > 0, got {getattr(self, name)}")

    def dilation(self, block_index: int) -> int:
        return self.dilations[block_index] if block_index < len(self.dilations) else 1


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    """The mean of x over `dim` at the positions where `mask` (0/1, x's dtype, broadcastable to x) is 1; 0 for a
    sample with no such position."""
    return (x * mask).sum(dim, keepdim=keepdim) / mask.sum(dim, keepdim=keepdim).clamp_min(1e-9)


class TCNBlock(nn.Module):
    """y = (x + Conv1x1(GELU_tanh(CausalConv(LayerNorm(x))))) * mask."""

    def __init__(self, d_model: int, d_hidden: int, kernel_size: int, dilation: int):
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=1e-5)
        self.left_pad = (kernel_size - 1) * dilation
        self.conv = nn.Conv1d(d_model, d_hidden, kernel_size, dilation=dilation)
        self.proj = nn.Conv1d(d_hidden, d_model, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # x: (B, L, D); mask: (B, L) in {0, 1}, same dtype as x
        h = self.norm(x).transpose(1, 2)  # (B, D, L) for Conv1d
        h = F.pad(h, (self.left_pad, 0))  # left only: position t sees t, t-d, ..., never the future
        h = self.proj(F.gelu(self.conv(h), approximate="tanh"))
        return (x + h.transpose(1, 2)) * mask.unsqueeze(-1)

    def forward_fixed_input_tokens(self, x: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """forward() at real tokens only, for an input that is a constant (a frozen trunk's cached output).

        x: (T, D) the real tokens of several samples back to back, each sample's tokens in order; position: (T,)
        each token's index in its sample. Returns (T, D), the same numbers as forward() gives at those tokens.
        x's LayerNorm normalisation x̂ is then a constant too and only γ, β train, so the causal convolution of
        γ⊙x̂ + β is (W⊙γ)·x̂ + W·β summed over the taps that read a real position (left of a sample's start the
        padding is zero, after LayerNorm). One matrix product of gathered x̂ windows with a γ-scaled weight: the
        (T, k·D) windows need no gradient and padded positions are never computed.
        """
        T, D = x.shape
        k, dilation = self.conv.kernel_size[0], self.conv.dilation[0]
        offsets = (k - 1 - torch.arange(k, device=x.device)) * dilation  # tap j reads position t - offsets[j]
        reads_real = position.unsqueeze(1) >= offsets  # (T, k)
        rows = torch.where(reads_real, torch.arange(T, device=x.device).unsqueeze(1) - offsets, T)
        x_hat = F.layer_norm(x, (D,), eps=self.norm.eps)
        windows = torch.cat([x_hat, x_hat.new_zeros(1, D)])[rows].reshape(T, k * D)  # row T: the zero padding
        weight = self.conv.weight  # (H, D, k)
        scaled = (weight * self.norm.weight[None, :, None]).permute(0, 2, 1).reshape(weight.shape[0], k * D)
        beta_per_tap = torch.einsum("hdk,d->kh", weight, self.norm.bias)  # (k, H)
        h = F.linear(windows, scaled, self.conv.bias) + reads_real.to(x.dtype) @ beta_per_tap
        h = F.gelu(h, approximate="tanh")
        return x + F.linear(h, self.proj.weight.squeeze(-1), self.proj.bias)


class TextBridgeEncoder(nn.Module):
    def __init__(self, config: TextBridgeConfig):
        super().__init__()
        self.config = config
        self.embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(
            TCNBlock(config.d_model, config.d_hidden, config.kernel_size, config.dilation(i))
            for i in range(config.n_blocks)
        )
        self.head = nn.Linear(config.d_model, config.out_dim)
        if config.init == "original":
            self._original_init()
        self.apply_freeze(config.freeze)

    def trunk(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, upto: int | None = None) -> torch.Tensor:
        """Token features after the embedding and the first `upto` blocks (all blocks by default): (B, L, D)."""
        mask = attention_mask.to(self.embedding.weight.dtype)
        x = self.embedding(input_ids)
        for block in self.blocks[:upto]:
            x = block(x, mask)
        return x

    def pool(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, L, D) token features -> (B, D), their mean over each sample's real tokens."""
        return masked_mean(x, attention_mask.to(x.dtype).unsqueeze(-1), dim=1)

    def activation(self, z: torch.Tensor) -> torch.Tensor:
        """The output's nonlinearity: tanh with `use_tanh`, else none."""
        return torch.tanh(z) if self.config.use_tanh else z

    def project(self, pooled: torch.Tensor) -> torch.Tensor:
        """(B, D) pooled features -> (B, out_dim) sentence embedding: the head."""
        return self.activation(self.head(pooled))

    def pool_and_project(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.project(self.pool(x, attention_mask))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, L) token ids and 0/1 mask -> (B, out_dim) sentence embedding."""
        return self.pool_and_project(self.trunk(input_ids, attention_mask), attention_mask)

    # --- a frozen trunk: its output is a fixed function of the input -------------------------
    def frozen_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, start_block: int) -> torch.Tensor:
        """What the embedding and the blocks before `start_block` compute: the token features entering block
        `start_block` (B, L, D); with every block frozen (start_block = n_blocks) their
        masked mean (B, D), all the head reads. `forward_from_features` finishes the forward pass from it."""
        x = self.trunk(input_ids, attention_mask, upto=start_block)
        return self.pool(x, attention_mask) if start_block >= len(self.blocks) else x

    def forward_from_features(self, features: torch.Tensor, attention_mask: torch.Tensor, start_block: int) -> torch.Tensor:
        """Finish a forward pass from `frozen_features(..., start_block)` (for start_block < n_blocks, the first
        attention_mask.shape[1] positions of it)."""
        if start_block >= len(self.blocks):
            return self.project(features)
        mask = attention_mask.to(features.dtype)
        x = features
        for block in self.blocks[start_block:]:
            x = block(x, mask)
        return self.pool_and_project(x, attention_mask)

    def forward_last_block_at_tokens(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """`forward_from_features(..., start_block=n_blocks - 1)` computed at real tokens only (right padding).

        tokens: (T, D) the frozen features of the samples' real tokens, sample after sample; lengths: (B,) each
        sample's number of them. No padded position is computed (TCNBlock.forward_fixed_input_tokens), and the
        masked mean is a sum per sample over its own tokens."""
        segment = torch.repeat_interleave(torch.arange(len(lengths), device=tokens.device), lengths)
        position = torch.arange(len(tokens), device=tokens.device) - (torch.cumsum(lengths, 0) - lengths)[segment]
        x = self.blocks[-1].forward_fixed_input_tokens(tokens, position)
        pooled = x.new_zeros(len(lengths), x.shape[1]).index_add_(0, segment, x)
        return self.project(pooled / lengths.unsqueeze(1).clamp_min(1).to(x.dtype))  # empty samples: 0

    def compile_regions(self) -> list[tuple[nn.Module, str]]:
        """What `compile_scope=regions` compiles, as (module, method) pairs: the forward of every block that trains.
        Blocks of one dilation share their code and guards (one compiled block serves them all; each dilation is
        its own compilation). Frozen blocks run eagerly: they need no backward and run once per sample (the task's
        frozen-trunk cache) or without gradients. The embedding, pooling and head are a few small kernels."""
        return [(block, "forward") for block in self.blocks[self.first_trainable_block:]]

    # --- what trains -------------------------------------------------------------------------
    def apply_freeze(self, mode: str) -> None:
        frozen = frozen_parts(self, mode)
        for p in self.parameters():
            p.requires_grad_(True)
        for module in frozen:
            for p in module.parameters():
                p.requires_grad_(False)

    @property
    def first_trainable_block(self) -> int:
        """Index of the first block with trainable weights (n_blocks when the whole trunk is frozen).

        Everything before it is a fixed function of the input, so its output can be computed once and reused.
        """
        if self.embedding.weight.requires_grad:
            return 0
        for i, block in enumerate(self.blocks):
            if any(p.requires_grad for p in block.parameters()):
                return i
        return len(self.blocks)

    # --- bookkeeping ---------------------------------------------------------------------------
    def num_parameters(self, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    def flops_per_sample(self, seq_len: int, training: bool = True) -> float:
        """Matmul FLOPs of one sample (2 per multiply-add); training adds the backward passes that run."""
        c = self.config
        per_block = 2 * seq_len * (c.d_model * c.d_hidden * c.kernel_size + c.d_hidden * c.d_model)
        head = 2 * c.d_model * c.out_dim
        forward = c.n_blocks * per_block + head
        if not training:
            return float(forward)
        # Backward costs 2x forward for layers that train (weight + input grads), input grads only up to the first
        # trainable layer; frozen layers before it need no backward at all.
        first = self.first_trainable_block
        trained_blocks = c.n_blocks - first
        backward = 2 * (trained_blocks * per_block + head)
        return float(forward + backward)

    @torch.no_grad()
    def _original_init(self) -> None:
        nn.init.uniform_(self.embedding.weight, -0.02, 0.02)
        for module in self.modules():
            if isinstance(module, nn.Conv1d):
                bound = 1.0 / (module.in_channels * module.kernel_size[0])
                nn.init.uniform_(module.weight, -bound, bound)
                nn.init.uniform_(module.bias, -0.001, 0.001)
            elif isinstance(module, nn.Linear):
                nn.init.uniform_(module.weight, -1.0 / module.in_features, 1.0 / module.in_features)
                nn.init.uniform_(module.bias, -0.001, 0.001)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)


def frozen_parts(model, mode: str) -> list:
    """The parts of an encoder (this one, or a port with the same `embedding` and `blocks`) that `model.freeze=mode`
    keeps fixed: none, the trunk (embedding and every block), or the trunk but its last block."""
    if mode not in FREEZE_MODES:
        raise ValueError(f"model.freeze={mode!r} is not one of {FREEZE_MODES}")
    if mode == "none":
        return []
    trunk = [model.embedding, *model.blocks]
    return trunk[:-1] if mode == "trunk_except_last" else trunk


def receptive_field(config: TextBridgeConfig) -> int:
    return 1 + sum((config.kernel_size - 1) * config.dilation(i) for i in range(config.n_blocks))


__all__ = [
    "SIZES", "TextBridgeConfig", "TextBridgeEncoder", "TCNBlock", "masked_mean", "receptive_field", "frozen_parts",
    "FREEZE_MODES", "INIT_MODES",
]
