"""The Neural-Engine layout: the trained model rewritten as apple/ml-ane-transformers recommends, same weights.

Tensors flow as (B, C, 1, S): channels on axis 1, the sequence on the last axis, so every Linear becomes a 1x1
Conv2d, LayerNorm normalises axis 1, and attention runs one head at a time with einsums whose layouts the Neural
Engine handles well. Each wrapper holds the trained module and reads its parameters at call time (reshaped to conv
kernels), so nothing is copied, retrained or re-initialised, and the export holds exactly the checkpoint's weights.
The inputs and the output keep the standard model's names, shapes and meaning: an app can swap the two packages.

Reads top to bottom: layout helpers -> LayerNorm -> TextBridge (TCN blocks, encoder) -> GPT (attention, MLP, block,
LM) -> `to_ane_layout`, which picks the wrapper for a model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sweeplab.models.gpt import GPT, MLP, Block, CausalSelfAttention, padding_mask
from sweeplab.models.pagating import PaGatingUnit
from sweeplab.models.textbridge import TCNBlock, TextBridgeEncoder, masked_mean


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


# --- TextBridge ----------------------------------------------------------------------------------
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


# --- GPT -----------------------------------------------------------------------------------------
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


def to_ane_layout(model: nn.Module) -> nn.Module:
    """The Neural-Engine wrapper of a trained TextBridgeEncoder or GPT (eval mode, sharing its parameters)."""
    if isinstance(model, TextBridgeEncoder):
        return ANETextBridge(model).eval()
    if isinstance(model, GPT):
        return ANEGPT(model).eval()
    raise ValueError(f"no Neural-Engine layout for a {type(model).__name__}")


__all__ = ["ANEGPT", "ANETextBridge", "ChannelLayerNorm", "conv1x1", "to_ane_layout", "to_channels_first"]
