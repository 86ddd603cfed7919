"""The paGating LM's Neural-Engine layout (export.layout=ane): the trained GPT on (B, C, 1, S), same weights;
attention one head at a time (ml-ane-transformers' MultiHeadAttention), the FFN a paGating unit or GPT-2's MLP.

The layout's rules and the helpers shared by every family are in `sweeplab.models.ane_layout`; the export spec in this
package's record names `ANEGPT`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sweeplab.models.ane_layout import ChannelLayerNorm, channel_norm, conv1x1, to_channels_first
from sweeplab.models.gpt import GPT, MLP, Block, CausalSelfAttention, padding_mask
from sweeplab.models.pagating import PaGatingUnit


class ANESelfAttention(nn.Module):
    """Causal self-attention one head at a time (ml-ane-transformers' MultiHeadAttention) with the trained qkv/proj."""

    def __init__(self, attention: CausalSelfAttention):
        super().__init__()
        self.attention = attention

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # x: (B, C, 1, S); mask: additive, (B, S_key, 1, S_query)
        channels = x.shape[1]
        head_dim = channels // self.attention.n_head
        scale = head_dim**-0.5
        q, k, v = conv1x1(x, self.attention.qkv).split(channels, dim=1)
        heads_q = q.split(head_dim, dim=1)  # (B, hd, 1, S_q) per head
        heads_k = k.transpose(1, 3).split(head_dim, dim=3)  # (B, S_k, 1, hd) per head
        heads_v = v.split(head_dim, dim=1)  # (B, hd, 1, S_k) per head
        outputs = []
        for qh, kh, vh in zip(heads_q, heads_k, heads_v):
            scores = torch.einsum("bchq,bkhc->bkhq", qh, kh) * scale + mask  # (B, S_k, 1, S_q)
            weights = scores.softmax(dim=1)
            outputs.append(torch.einsum("bkhq,bchk->bchq", weights, vh))  # (B, hd, 1, S_q)
        return conv1x1(torch.cat(outputs, dim=1), self.attention.proj)


class ANEMLP(nn.Module):
    """The block's FFN on (B, C, 1, S): a paGating unit (value/gate 1x1 convs) or GPT-2's GELU MLP."""

    def __init__(self, mlp: MLP):
        super().__init__()
        self.mlp = mlp
        unit = mlp.unit
        if isinstance(unit, PaGatingUnit):
            self.gate_norm = channel_norm(unit.gate_norm)
        elif not (isinstance(unit, nn.Sequential) and isinstance(unit[0], nn.Linear) and len(unit) == 2):
            raise ValueError(f"no Neural-Engine layout for an FFN of type {type(unit).__name__}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        unit = self.mlp.unit
        if isinstance(unit, PaGatingUnit):
            value = conv1x1(x, unit.value_proj)
            if unit.value_tanh:
                value = torch.tanh(value)
            # the activation and the α mix are elementwise: the trained modules apply unchanged in any layout
            gate = self.gate_norm(unit.activation(conv1x1(x, unit.gate_proj)))
            hidden = value * unit.alpha_gate(gate)
        else:
            hidden = unit[1](conv1x1(x, unit[0]))
        return conv1x1(hidden, self.mlp.proj)


class ANEBlock(nn.Module):
    def __init__(self, block: Block):
        super().__init__()
        self.ln_1 = ChannelLayerNorm(block.ln_1)
        self.attn = ANESelfAttention(block.attn)
        self.ln_2 = ChannelLayerNorm(block.ln_2)
        self.mlp = ANEMLP(block.mlp)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), mask)
        return x + self.mlp(self.ln_2(x))


class ANEGPT(nn.Module):
    def __init__(self, gpt: GPT):
        super().__init__()
        self.gpt = gpt
        self.blocks = nn.ModuleList(ANEBlock(block) for block in gpt.blocks)
        self.ln_f = ChannelLayerNorm(gpt.ln_f)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, S) ids and 0/1 mask -> (B, S, V) logits, as GPT.forward with a mask."""
        seq_len = input_ids.shape[1]
        # The tied matrix as one (V, C, 1, 1) kernel serves both the lookup and the output conv, so the package
        # stores it once (a (V, C) lookup table next to a (V, C, 1, 1) kernel would be two copies).
        table = self.gpt.wte.weight[:, :, None, None]
        x = table[input_ids].squeeze(-1).squeeze(-1) + self.gpt.wpe.weight[:seq_len]
        x = to_channels_first(x)
        # the model's own mask (-1e4, never -inf), from (B, 1, S_q, S_k) to ml-ane-transformers' (B, S_k, 1, S_q)
        mask = padding_mask(attention_mask, x.dtype).permute(0, 3, 1, 2)
        for block in self.blocks:
            x = block(x, mask)
        tied = self.gpt.lm_head.weight is self.gpt.wte.weight
        head = table if tied else self.gpt.lm_head.weight[:, :, None, None]
        logits = F.conv2d(self.ln_f(x), head)  # (B, V, 1, S)
        return logits.squeeze(2).transpose(1, 2)


__all__ = ["ANEBlock", "ANEGPT", "ANEMLP", "ANESelfAttention"]
