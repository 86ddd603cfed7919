"""The TextBridge decoder (cube -> text): a small causal transformer that writes a sentence from its embedding.

The sentence embedding (the teacher's, or the TextBridge encoder's: the "cube") is normalised, projected into
`n_prefix` prefix vectors, and put in front of the token embeddings; GPT-2 blocks (`sweeplab.models.gpt`: pre-LN,
causal attention, learned positions, tied input/output embeddings) read [prefix, BOS, t1 .. tn] and predict
[t1 .. tn, EOS] at the token positions. Every position sees the prefix, so the embedding conditions every step
through attention, and no position sees a later one.
Specification: docs/models.md#textbridge-decoder. Plain PyTorch; no Lightning, MLflow or Hydra here.

`generate` decodes greedily (no KV cache: each step runs the whole prefix again, so a sentence of n tokens costs
n forward passes over at most n_prefix + max_len + 1 positions); `DecoderStep` is one such step, the module the
Core ML export holds: (padded prefix, its mask, embedding) -> next-token logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from sweeplab.models.gpt import GPT, GPTConfig, padding_mask

IGNORE_INDEX = -100  # label of a position that is not scored (padding after EOS)

# Shapes only: vocab_size, embed_dim and the special ids come from the data. "tiny" runs a smoke test in seconds on a
# CPU; "small" (the default) overfits 100 sentences in a few hundred steps; "base" is for real corpora.
SIZES: dict[str, dict] = {
    "tiny": dict(n_layer=2, n_head=2, d_model=64, d_ff=256),
    "small": dict(n_layer=2, n_head=4, d_model=128, d_ff=512),
    "base": dict(n_layer=4, n_head=8, d_model=256, d_ff=1024),
}


@dataclass
class DecoderConfig:
    vocab_size: int = 30522
    embed_dim: int = 384  # the cube: the size of the sentence embeddings it decodes (the teacher's)
    max_len: int = 64  # tokens of a sentence, BOS and EOS not counted (data.max_len); longer ones are cut
    n_prefix: int = 1  # prefix vectors the embedding is projected into
    n_layer: int = 2
    n_head: int = 4
    d_model: int = 128
    d_ff: int = 512
    dropout: float = 0.0
    # the token that starts a sentence and the one that ends it; null: the tokenizer's [CLS] and [SEP]
    bos_id: int | None = None
    eos_id: int | None = None
    pad_id: int = 0  # what fills a decoded row after its EOS

    def __post_init__(self) -> None:
        for name in ("vocab_size", "embed_dim", "max_len", "n_prefix", "n_layer", "n_head", "d_model", "d_ff"):
            if getattr(self, name) <= 0:
                raise ValueError(f"model.{name} must be > 0, got {getattr(self, name)}")
        for name in ("bos_id", "eos_id", "pad_id"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < self.vocab_size:
                raise ValueError(f"model.{name}={value} is outside the vocabulary [0, {self.vocab_size})")

    @property
    def context(self) -> int:
        """Tokens one step reads: BOS and up to max_len generated tokens (what the Core ML step is padded to)."""
        return self.max_len + 1

    def gpt_config(self) -> GPTConfig:
        """The GPT-2 blocks' settings: GELU MLP, positions for the prefix and the longest token sequence."""
        return GPTConfig(
            vocab_size=self.vocab_size, block_size=self.n_prefix + self.context, n_layer=self.n_layer,
            n_head=self.n_head, d_model=self.d_model, d_ff=self.d_ff, ffn="mlp", dropout=self.dropout,
        )


def teacher_forcing(input_ids: torch.Tensor, attention_mask: torch.Tensor, bos_id: int, eos_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded sentences (B, L) -> decoder inputs [BOS, t1 .. tn, pad ..] (B, L + 1) and labels
    [t1 .. tn, EOS, -100 ..] (B, L + 1). A row's length is its mask's sum (the mask is a prefix of ones)."""
    batch = input_ids.shape[0]
    lengths = attention_mask.sum(1, keepdim=True)  # (B, 1)
    inputs = torch.cat([input_ids.new_full((batch, 1), bos_id), input_ids], dim=1)
    positions = torch.arange(inputs.shape[1], device=input_ids.device)[None]
    shifted = torch.cat([input_ids, input_ids.new_zeros((batch, 1))], dim=1)
    labels = torch.where(positions < lengths, shifted, torch.where(positions == lengths, eos_id, IGNORE_INDEX))
    return inputs, labels


class TextBridgeDecoder(nn.Module):
    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.config = config
        # the blocks, embeddings, final norm and tied head of a GPT-2 (with its init); its own forward is not used
        self.gpt = GPT(config.gpt_config())
        self.condition = nn.Sequential(
            nn.LayerNorm(config.embed_dim), nn.Linear(config.embed_dim, config.n_prefix * config.d_model)
        )
        nn.init.normal_(self.condition[1].weight, mean=0.0, std=0.02)
        nn.init.zeros_(self.condition[1].bias)

    def hidden(self, embedding: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, E) embeddings, (B, T) decoder inputs -> (B, T, d) final-norm states at the token positions.

        Without `attention_mask` attention is causal only, which is exact for right-padded rows (no real position
        sees a later one, padding included); a mask with holes or left padding is applied as given."""
        gpt, n_prefix = self.gpt, self.config.n_prefix
        batch, length = input_ids.shape
        if n_prefix + length > gpt.config.block_size:
            raise ValueError(f"{length} decoder inputs exceed model.max_len + 1 = {self.config.context}")
        tokens = gpt.wte(input_ids)
        prefix = self.condition(embedding.to(tokens.dtype)).view(batch, n_prefix, -1)
        positions = torch.arange(n_prefix + length, device=input_ids.device)
        x = gpt.drop(torch.cat([prefix, tokens], dim=1) + gpt.wpe(positions))
        mask = None
        if attention_mask is not None:
            full = torch.cat([attention_mask.new_ones((batch, n_prefix)), attention_mask], dim=1)
            mask = padding_mask(full, x.dtype)
        for block in gpt.blocks:
            x = block(x, mask)
        return gpt.ln_f(x[:, n_prefix:])

    def head(self, states: torch.Tensor) -> torch.Tensor:
        """(..., d) final-norm states -> (..., V) next-token logits (the tied token embedding)."""
        return self.gpt.lm_head(states)

    def forward(self, embedding: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, E) embeddings, (B, T) decoder inputs ([BOS, t1 ..]) -> (B, T, V) next-token logits."""
        return self.head(self.hidden(embedding, input_ids, attention_mask))

    def compile_regions(self) -> list[tuple[nn.Module, str]]:
        """What `compile_scope=regions` compiles, as (module, method) pairs: the GPT-2 blocks' forward (one compiled
        block serves them all: same code, same guards). The head and its loss stay eager: the family's task scores
        only the labelled positions on a CPU, a batch-dependent shape that would recompile."""
        return [(block, "forward") for block in self.gpt.blocks]

    @torch.no_grad()
    def generate(self, embedding: torch.Tensor, max_tokens: int | None = None) -> list[list[int]]:
        """Greedy decoding: each embedding's token ids, up to (not including) EOS, at most `max_tokens` (max_len)."""
        config = self.config
        if config.bos_id is None or config.eos_id is None:
            raise ValueError("model.bos_id and model.eos_id must be set to generate")
        limit = config.max_len if max_tokens is None else min(max_tokens, config.max_len)
        batch = embedding.shape[0]
        ids = torch.full((batch, 1), config.bos_id, dtype=torch.long, device=embedding.device)
        done = torch.zeros(batch, dtype=torch.bool, device=embedding.device)
        for _ in range(limit):  # a sentence of `limit` tokens needs no EOS: it is cut there, as in training
            following = self.head(self.hidden(embedding, ids)[:, -1]).argmax(-1)  # the last position only
            following = torch.where(done, config.pad_id, following)
            ids = torch.cat([ids, following[:, None]], dim=1)
            done |= following == config.eos_id
            if bool(done.all()):
                break
        return [_until(row, config.eos_id) for row in ids[:, 1:].tolist()]

    # --- bookkeeping ---------------------------------------------------------------------------
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token, 6·N + 12·L·d·T (as the GPT's), T the positions attended (prefix included)."""
        c = self.config
        positions = c.n_prefix + (c.context if seq_len is None else seq_len)
        return 6.0 * self.num_parameters() + 12.0 * c.n_layer * c.d_model * positions


def _until(row: list[int], eos_id: int) -> list[int]:
    return row[: row.index(eos_id)] if eos_id in row else row


class DecoderStep(nn.Module):
    """One decoding step, what the Core ML package holds: [BOS, generated ..] right-padded to a fixed length (B, S),
    its 0/1 mask and the embedding (B, E) -> logits of the token after the last real one (B, V). No KV cache: an app
    appends the argmax at the mask's end and calls it again, until EOS or S tokens."""

    def __init__(self, decoder: TextBridgeDecoder):
        super().__init__()
        self.decoder = decoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        states = self.decoder.hidden(embedding, input_ids)  # causal: right padding never reaches a real position
        last = attention_mask.sum(1, keepdim=True) - 1  # (B, 1)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        pick = (positions == last).to(states.dtype)  # (B, S) one-hot: a reduction, not a gather
        return self.decoder.head((states * pick[..., None]).sum(1))


def token_loss(logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Token cross entropy in fp32 over the scored positions (labels != -100); logits (..., V), labels (...)."""
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction=reduction
    )


__all__ = [
    "DecoderConfig", "DecoderStep", "IGNORE_INDEX", "SIZES", "TextBridgeDecoder", "teacher_forcing", "token_loss",
]
