"""A GPT-2-style decoder LM whose MLP is a paGating unit (or GPT-2's GELU MLP as the baseline).

Reads top to bottom like nanoGPT: `GPTConfig` and `SIZES`, then `CausalSelfAttention`, `MLP`, `Block`, `GPT`.
Pre-LN blocks, causal attention, learned positions, tied input/output embeddings, GPT-2 init.
Specification: docs/models.md#pagating-gpt-lm. Plain PyTorch; no Lightning, MLflow or Hydra here.

Parameter counts: with d_ff = 4d the paGating FFN (value_proj, gate_proj: d -> d_ff, out: d_ff -> d) has 3·d·d_ff
weights, 1.5x GPT-2's MLP (2·d·d_ff). `param_matched=True` shrinks the paGating width to 2·d_ff/3 rounded to a
multiple of 64 (at least 64), which matches the GELU MLP of the configured d_ff: d 768, d_ff 3072 -> 2048.

Speed switches (training only; the weights and their names are the same whichever is on, so checkpoints export and
resume as any other): `lm_loss` chooses how the tied LM head and its cross-entropy are computed (`loss`), `attention`
pins scaled_dot_product_attention to one kernel, `float8` names the linear layers `float8_training` converts to
torchao's float8 training (the task calls it when it builds the model for training; torchao and Liger-Kernel are
imported only when asked for).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

from sweeplab.models.pagating import UNIT_NAMES, alpha_values, check_alpha, make_unit

FFN_KINDS = ("pagating", "mlp")
LM_LOSSES = ("full", "chunked", "liger")  # see GPT.loss
ATTENTION_KERNELS = ("auto", "cudnn", "flash", "efficient", "math")  # torch.nn.attention.SDPBackend names
FLOAT8_LAYERS = ("none", "blocks", "head", "all")  # see float8_training
MASK_VALUE = -1e4  # not -inf or finfo.min: an fp16 Core ML program turns those into -inf and NaN

# Shapes only: vocab_size comes from the tokenizer. "tiny" runs in seconds on a CPU, "mini" is a quick GPU run,
# "small" is GPT-2 small (the original study), "medium" is GPT-2 medium.
SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(n_layer=2, n_head=2, d_model=64, d_ff=256, block_size=128),
    "mini": dict(n_layer=6, n_head=6, d_model=384, d_ff=1536, block_size=256),
    "small": dict(n_layer=12, n_head=12, d_model=768, d_ff=3072, block_size=1024),
    "medium": dict(n_layer=24, n_head=16, d_model=1024, d_ff=4096, block_size=1024),
}


@dataclass
class GPTConfig:
    vocab_size: int = 50257
    block_size: int = 1024
    n_layer: int = 12
    n_head: int = 12
    d_model: int = 768
    d_ff: int = 3072
    ffn: str = "pagating"  # pagating | mlp (GPT-2's GELU MLP, the baseline)
    unit: str = "paGLU"
    alpha: float | str = 0.5  # a number in [0, 1], "learnable", "cosine" or "linear" (see models/pagating.py)
    unit_options: dict = field(default_factory=dict)  # extra make_unit keywords: gate_norm, approximate, beta, ...
    bias: bool = True
    dropout: float = 0.0
    param_matched: bool = False  # paGating width 2·d_ff/3 (multiple of 64): the MLP baseline's parameter count
    gradient_checkpointing: bool = False  # recompute each block in backward (training only)
    lm_loss: str = "full"  # full (logits, then cross-entropy) | chunked (no full logits; pure torch) | liger (CUDA)
    loss_chunks: int = 8  # lm_loss=chunked: the tokens of a batch in this many chunks
    attention: str = "auto"  # auto (torch picks) | cudnn | flash | efficient | math: the SDPA kernel
    float8: str = "none"  # none | blocks (every Linear of the blocks) | head (the tied LM head) | all (both)

    def __post_init__(self) -> None:
        if self.ffn not in FFN_KINDS:
            raise ValueError(f"model.ffn={self.ffn!r} is not one of {FFN_KINDS}")
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "d_model", "d_ff"):
            if getattr(self, name) <= 0:
                raise ValueError(f"model.{name} must be > 0, got {getattr(self, name)}")
        if self.d_model % self.n_head:
            raise ValueError(f"model.d_model={self.d_model} is not divisible by model.n_head={self.n_head}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.dropout must be in [0, 1), got {self.dropout}")
        if self.ffn == "pagating":
            check_alpha(self.alpha)
            if self.unit not in UNIT_NAMES:
                raise ValueError(f"model.unit={self.unit!r} is not one of {', '.join(UNIT_NAMES)}")
        for name, value, accepted in (("lm_loss", self.lm_loss, LM_LOSSES), ("attention", self.attention, ATTENTION_KERNELS),
                                      ("float8", self.float8, FLOAT8_LAYERS)):
            if value not in accepted:
                raise ValueError(f"model.{name}={value!r} is not one of {', '.join(accepted)}")
        if self.loss_chunks < 1:
            raise ValueError(f"model.loss_chunks must be >= 1, got {self.loss_chunks}")
        if self.float8 in ("head", "all") and self.lm_loss != "full":
            raise ValueError(f"model.float8={self.float8} converts the LM head, which lm_loss={self.lm_loss} bypasses (it multiplies "
                             "by the head's weight itself); use model.float8=blocks or model.lm_loss=full")
        self.unit_options = dict(self.unit_options or {})  # an OmegaConf DictConfig becomes a plain dict

    @property
    def ffn_hidden(self) -> int:
        """The FFN's hidden width: d_ff, or the parameter-matched paGating width."""
        if self.ffn == "pagating" and self.param_matched:
            return max(64, round(2 * self.d_ff / 3 / 64) * 64)
        return self.d_ff


def padding_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, T) 0/1 mask -> (B, 1, T, T) additive mask: 0 where query t may see key s, else -1e4.

    Query t sees keys s <= t that are real tokens, and always itself: a padded query then attends to itself alone
    instead of to a row of equal scores (which would spread over future keys too) or a NaN row.
    """
    T = attention_mask.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=attention_mask.device).tril()
    itself = torch.eye(T, dtype=torch.bool, device=attention_mask.device)
    keep = causal[None, None] & (attention_mask[:, None, None, :].bool() | itself)
    return (1.0 - keep.to(dtype)) * MASK_VALUE


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.kernels = None if config.attention == "auto" else [getattr(SDPBackend, f"{config.attention.upper()}_ATTENTION")
                                                                  if config.attention != "math" else SDPBackend.MATH]
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=config.bias)
        self.proj = nn.Linear(config.d_model, config.d_model, bias=config.bias)  # residual projection
        self.proj_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, H, T, hd)
        dropout_p = self.dropout if self.training else 0.0
        # model.attention pins the kernel on CUDA only: a checkpoint exported or evaluated on a CPU runs as any other
        with sdpa_kernel(self.kernels) if self.kernels and q.is_cuda else contextlib.nullcontext():
            y = self._attend(q, k, v, mask, dropout_p)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.proj_dropout(self.proj(y))

    @staticmethod
    def _attend(q, k, v, mask, dropout_p: float) -> torch.Tensor:
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype), dropout_p=dropout_p)  # autocast


class MLP(nn.Module):
    """proj(unit(x)) with a paGating unit d -> hidden, or proj(GELU(fc(x))) for ffn="mlp"."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        d, hidden = config.d_model, config.ffn_hidden
        if config.ffn == "pagating":
            self.unit = make_unit(config.unit, d, hidden, config.alpha, bias=config.bias, **config.unit_options)
        else:
            self.unit = nn.Sequential(nn.Linear(d, hidden, bias=config.bias), nn.GELU())
        self.proj = nn.Linear(hidden, d, bias=config.bias)  # residual projection
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(self.unit(x)))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.d_model, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), mask)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.d_model)
        self.wpe = nn.Embedding(config.block_size, config.d_model)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.d_model, bias=config.bias)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: one matrix reads tokens in and scores them out

        # GPT-2 init: N(0, 0.02) everywhere, residual projections scaled by 1/sqrt(2·n_layer) (two per block)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("attn.proj.weight") or name.endswith("mlp.proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    @property
    def n_layer(self) -> int:
        return self.config.n_layer

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) token ids, optional (B, T) 0/1 mask -> (B, T, V) logits."""
        return self.lm_head(self.hidden(input_ids, attention_mask))

    def loss(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy (labels of -100 ignored): the final hidden states, then `head_loss`."""
        return self.head_loss(self.hidden(input_ids), labels)

    def head_loss(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """(B, T, d) final hidden states, (B, T) labels -> the mean cross-entropy of the tied LM head's logits,
        computed as `config.lm_loss` says: full: the (B, T, V) logits, then cross-entropy in fp32; chunked:
        `chunked_cross_entropy`, the head and the loss a chunk of tokens at a time, gradients computed on the way, so
        no (B·T, V) tensor exists; liger: Liger-Kernel's fused linear cross-entropy (Triton, CUDA), the same
        algorithm in fused kernels."""
        if self.config.lm_loss == "full":
            return cross_entropy(self.lm_head(hidden), labels)
        if self.config.lm_loss == "chunked":
            return chunked_cross_entropy(hidden, self.lm_head.weight, labels, self.config.loss_chunks)
        return liger_cross_entropy(hidden, self.lm_head.weight, labels)

    def compile_regions(self) -> list[tuple[nn.Module, str]]:
        """What `compile_scope=regions` compiles, as (module, method) pairs: every block's forward (the blocks share
        their code and guards, so one compiled block serves all n_layer of them) and `head_loss`, the LM head with
        its cross-entropy (eager, lm_loss=full's fp32 softmax over B·T x V materialised logits would cost a quarter
        of a GPT-2-small step on an H100). The embeddings and the final LayerNorm run eagerly."""
        return [*((block, "forward") for block in self.blocks), (self, "head_loss")]

    def hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) token ids -> (B, T, d) final hidden states (after ln_f), what the LM head scores."""
        B, T = input_ids.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds model.block_size={self.config.block_size}")
        positions = torch.arange(T, device=input_ids.device)
        x = self.drop(self.wte(input_ids) + self.wpe(positions))
        mask = None if attention_mask is None else padding_mask(attention_mask, x.dtype)
        for block in self.blocks:
            if self.config.gradient_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(block, x, mask, use_reentrant=False)
            else:
                x = block(x, mask)
        return self.ln_f(x)

    # --- bookkeeping ---------------------------------------------------------------------------
    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """All parameters, the tied embedding counted once; exclude_embeddings drops wte and wpe (Kaplan's N)."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= self.wte.weight.numel() + self.wpe.weight.numel()
        return n

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token, 6·N + 12·L·d·T (PaLM appendix B, as nanoGPT's estimate_mfu).

        N = num_parameters(): every parameter once, the tied embedding included (it is the lm_head matmul);
        12·L·d·T is attention's QK^T and AV, forward + backward; T defaults to block_size.
        """
        T = self.config.block_size if seq_len is None else seq_len
        return 6.0 * self.num_parameters() + 12.0 * self.config.n_layer * self.config.d_model * T

    def alpha_values(self) -> dict[str, float]:
        """{"layer_<i>": α} for every block's unit (empty for ffn="mlp"); one host sync."""
        return {
            f"layer_{name.split('.')[1]}": value for name, value in alpha_values(self).items()
        }  # blocks.<i>.mlp.unit


# --- the LM head's loss -----------------------------------------------------------------------------
def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in fp32; labels of -100 (none from packed blocks) are ignored."""
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=-100)


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of `hidden @ weight.T` against `labels`, a chunk of rows at a time: each chunk's logits
    (fp32 softmax), its loss and its gradients (softmax - one-hot, times the weight and the hidden states) are
    computed in the forward pass and the chunk's logits dropped, so at most one chunk's logits exist. Backward only
    scales the stored gradients. Liger-Kernel's FusedLinearCrossEntropy algorithm, in plain torch (any device,
    traceable by torch.compile); the matmuls run in the autocast dtype, the softmax and sums in fp32."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunks: int) -> torch.Tensor:
        n = hidden.shape[0]
        size = -(-n // chunks)
        valid_count = (labels != -100).sum().clamp(min=1).float()
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros_like(weight, dtype=torch.float32)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, n, size):
            h, y = hidden[start : start + size], labels[start : start + size]
            logits = (h @ weight.t()).float()
            valid = (y != -100).unsqueeze(1)
            target = y.clamp(min=0).unsqueeze(1)
            lse = torch.logsumexp(logits, dim=1, keepdim=True)
            total = total + ((lse - logits.gather(1, target)) * valid).sum()
            grad = torch.exp(logits - lse).scatter_add_(1, target, -torch.ones_like(lse)) * valid
            grad_hidden[start : start + size] = grad @ weight
            grad_weight += (grad.t() @ h).float()
        ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype), valid_count)
        return total / valid_count

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        grad_hidden, grad_weight, valid_count = ctx.saved_tensors
        scale = grad_output / valid_count
        return grad_hidden * scale.to(grad_hidden.dtype), grad_weight * scale.to(grad_weight.dtype), None, None


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunks: int = 8) -> torch.Tensor:
    """(B, T, d) hidden states, the (V, d) head weight, (B, T) labels -> the mean cross-entropy of the logits
    `hidden @ weight.T` without ever holding all of them (see _ChunkedLinearCrossEntropy)."""
    return _ChunkedLinearCrossEntropy.apply(hidden.reshape(-1, hidden.size(-1)), weight, labels.reshape(-1), chunks)


@torch.compiler.disable  # Liger's Python loop over chunks launches its own Triton kernels: run it as it is written
def liger_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Liger-Kernel's fused linear cross-entropy (Triton; CUDA): the chunked algorithm with fused softmax and
    gradient kernels."""
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    return liger_fused_linear_cross_entropy(hidden.reshape(-1, hidden.size(-1)), weight, labels.reshape(-1),
                                            ignore_index=-100)


# --- float8 training ---------------------------------------------------------------------------------
def float8_training(model: GPT, layers: str) -> list[str]:
    """Convert the model's Linear layers to torchao's float8 training (dynamic tensorwise scaling: the matmuls run
    in float8 on Hopper's tensor cores, the weights stay in their own dtype); `layers` is `model.float8`: blocks
    (every Linear of the transformer blocks), head (the tied LM head, whose weight stays shared with the embedding)
    or all (both). Layers whose sizes are not multiples of 16 stay as they are (float8 matmuls need it). Returns the
    names of the converted layers."""
    if layers == "none":
        return []
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    converted: list[str] = []

    def wanted(module: nn.Module, name: str) -> bool:
        ok = (
            isinstance(module, nn.Linear)
            and module.in_features % 16 == 0
            and module.out_features % 16 == 0
            and ((name.startswith("blocks.") and layers in ("blocks", "all")) or (name == "lm_head" and layers in ("head", "all")))
        )
        if ok:
            converted.append(name)
        return ok

    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name("tensorwise"), module_filter_fn=wanted)
    if model.lm_head.weight is not model.wte.weight:  # the conversion must keep the tie
        raise RuntimeError("float8 conversion untied the LM head from the embedding")
    return converted


__all__ = [
    "GPT", "GPTConfig", "SIZES", "FFN_KINDS", "LM_LOSSES", "ATTENTION_KERNELS", "FLOAT8_LAYERS", "MASK_VALUE",
    "padding_mask", "cross_entropy", "chunked_cross_entropy", "liger_cross_entropy", "float8_training",
]
