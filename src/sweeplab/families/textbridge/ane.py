"""TextBridge's Neural-Engine layout (export.layout=ane): the trained encoder on (B, D, 1, S), same weights.

The layout's rules and the helpers shared by every family are in `sweeplab.models.ane_layout`; the export spec in this
package's record names `ANETextBridge`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sweeplab.models.ane_layout import ChannelLayerNorm, conv1x1, to_channels_first
from sweeplab.models.textbridge import TCNBlock, TextBridgeEncoder, masked_mean


class ANETCNBlock(nn.Module):
    """TCNBlock on (B, D, 1, S): the causal Conv1d becomes a (1, k) Conv2d with the same left padding."""

    def __init__(self, block: TCNBlock):
        super().__init__()
        self.block = block
        self.norm = ChannelLayerNorm(block.norm)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # x: (B, D, 1, S); mask: (B, 1, 1, S), same dtype as x
        conv, proj = self.block.conv, self.block.proj
        h = F.pad(self.norm(x), (self.block.left_pad, 0))  # pads the sequence axis on the left only
        h = F.conv2d(h, conv.weight.unsqueeze(2), conv.bias, dilation=(1, conv.dilation[0]))
        h = F.conv2d(F.gelu(h, approximate="tanh"), proj.weight.unsqueeze(2), proj.bias)
        return (x + h) * mask


class ANETextBridge(nn.Module):
    def __init__(self, encoder: TextBridgeEncoder):
        super().__init__()
        self.encoder = encoder
        self.blocks = nn.ModuleList(ANETCNBlock(block) for block in encoder.blocks)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, S) ids and 0/1 mask -> (B, out_dim), as TextBridgeEncoder.forward."""
        x = to_channels_first(self.encoder.embedding(input_ids))  # the gather runs on the CPU whatever the layout
        mask = attention_mask.to(x.dtype)[:, None, None, :]
        for block in self.blocks:
            x = block(x, mask)
        pooled = masked_mean(x, mask, dim=3, keepdim=True)  # (B, D, 1, 1)
        return self.encoder.activation(conv1x1(pooled, self.encoder.head).flatten(1))  # the head as a 1x1 conv


__all__ = ["ANETCNBlock", "ANETextBridge"]
