"""The Neural-Engine layout's building blocks (apple/ml-ane-transformers): tensors as (B, C, 1, S), every Linear a 1x1
convolution with the Linear's own weights, LayerNorm over the channel axis. Plain torch: each family's wrapper
(families/<name>/ane.py) is built from these, and sweeplab.export.ane picks the family's wrapper.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def to_channels_first(x: torch.Tensor) -> torch.Tensor:
    """(B, S, C) -> (B, C, 1, S)."""
    return x.transpose(1, 2).unsqueeze(2)


def conv1x1(x: torch.Tensor, linear: nn.Linear) -> torch.Tensor:
    """A Linear layer applied to (B, C_in, 1, S) as a 1x1 convolution with the Linear's own weights."""
    return F.conv2d(x, linear.weight[:, :, None, None], linear.bias)


class ChannelLayerNorm(nn.Module):
    """A trained nn.LayerNorm over the channel axis of (B, C, 1, S)."""

    def __init__(self, norm: nn.LayerNorm):
        super().__init__()
        if len(norm.normalized_shape) != 1:
            raise ValueError(f"only LayerNorm over one dimension maps to the channel axis, got {norm.normalized_shape}")
        self.norm = norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(dim=1, keepdim=True)
        centered = x - mean
        variance = (centered * centered).mean(dim=1, keepdim=True)
        out = centered * torch.rsqrt(variance + self.norm.eps)
        if self.norm.weight is not None:
            out = out * self.norm.weight[None, :, None, None]
        if self.norm.bias is not None:
            out = out + self.norm.bias[None, :, None, None]
        return out


def channel_norm(module: nn.Module) -> nn.Module:
    """A LayerNorm over the last axis becomes one over the channel axis; Identity stays Identity."""
    if isinstance(module, nn.LayerNorm):
        return ChannelLayerNorm(module)
    if isinstance(module, nn.Identity):
        return module
    raise ValueError(f"no Neural-Engine layout for a {type(module).__name__} normalisation")


__all__ = ["ChannelLayerNorm", "channel_norm", "conv1x1", "to_channels_first"]
