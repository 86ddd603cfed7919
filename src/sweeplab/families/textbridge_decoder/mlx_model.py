"""The TextBridge decoder in MLX: the same function as models/textbridge_decoder.py, with the same parameter names.

The GPT-2 blocks, embeddings and final norm are the paGating family's MLX GPT (`ffn="mlp"`, as the PyTorch decoder
builds it), under `gpt.`; the condition is `condition.0` (LayerNorm) and `condition.1` (Linear), as PyTorch's
nn.Sequential names them; the tied output matrix is `gpt.wte.weight` (`gpt.lm_head.weight` in the PyTorch state
dict). Initial weights come from the PyTorch model (converted). Training only: greedy decoding (`generate`) stays
PyTorch's, which the MLX loop's validation runs on the trained weights. Plain MLX: no Lightning, MLflow or Hydra.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from sweeplab.families.pagating_lm.mlx_model import GPT, padding_mask
from sweeplab.models.textbridge_decoder import IGNORE_INDEX, DecoderConfig


def teacher_forcing(input_ids: mx.array, attention_mask: mx.array, bos_id: int, eos_id: int) -> tuple[mx.array, ...]:
    """Right-padded sentences (B, L) -> inputs [BOS, t1 .. tn, pad ..] and labels [t1 .. tn, EOS, -100 ..] (B, L + 1),
    as models/textbridge_decoder.teacher_forcing."""
    batch = input_ids.shape[0]
    lengths = attention_mask.sum(1, keepdims=True)
    inputs = mx.concatenate([mx.full((batch, 1), bos_id, dtype=input_ids.dtype), input_ids], axis=1)
    positions = mx.arange(inputs.shape[1])[None]
    shifted = mx.concatenate([input_ids, mx.zeros((batch, 1), dtype=input_ids.dtype)], axis=1)
    labels = mx.where(positions < lengths, shifted, mx.where(positions == lengths, eos_id, IGNORE_INDEX))
    return inputs, labels


class TextBridgeDecoder(nn.Module):
    tied_weights = {"gpt.lm_head.weight": "gpt.wte.weight"}  # read by sweeplab.mlx.convert

    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.config = config
        self.gpt = GPT(config.gpt_config())
        self.condition = [nn.LayerNorm(config.embed_dim), nn.Linear(config.embed_dim, config.n_prefix * config.d_model)]

    def hidden(self, embedding: mx.array, input_ids: mx.array, attention_mask: mx.array | None = None) -> mx.array:
        """(B, E) embeddings, (B, T) decoder inputs -> (B, T, d) final-norm states at the token positions."""
        gpt, n_prefix = self.gpt, self.config.n_prefix
        batch, length = input_ids.shape
        if n_prefix + length > gpt.config.block_size:
            raise ValueError(f"{length} decoder inputs exceed model.max_len + 1 = {self.config.context}")
        tokens = gpt.wte(input_ids)
        prefix = self.condition[1](self.condition[0](embedding.astype(tokens.dtype))).reshape(batch, n_prefix, -1)
        x = gpt.drop(mx.concatenate([prefix, tokens], axis=1) + gpt.wpe(mx.arange(n_prefix + length)))
        mask = None
        if attention_mask is not None:
            full = mx.concatenate([mx.ones((batch, n_prefix), dtype=attention_mask.dtype), attention_mask], axis=1)
            mask = padding_mask(full, x.dtype)
        for block in gpt.blocks:
            x = block(x, mask)
        return gpt.ln_f(x[:, n_prefix:])

    def head(self, states: mx.array) -> mx.array:
        return self.gpt.wte.as_linear(states)

    def __call__(self, embedding: mx.array, input_ids: mx.array, attention_mask: mx.array | None = None) -> mx.array:
        """(B, E) embeddings, (B, T) decoder inputs ([BOS, t1 ..]) -> (B, T, V) next-token logits."""
        return self.head(self.hidden(embedding, input_ids, attention_mask))

    def training_loss(self, batch: dict, loss_config=None) -> tuple[mx.array, dict[str, mx.array]]:
        """(loss, metrics) of a training batch, as DecoderTask.training_loss: teacher-forced token cross entropy
        over the scored positions (all positions are projected: MLX cannot select them without a host sync)."""
        config = self.config
        inputs, labels = teacher_forcing(batch["input_ids"], batch["attention_mask"], config.bos_id, config.eos_id)
        return token_loss(self(batch["target"], inputs), labels), {}


def token_loss(logits: mx.array, labels: mx.array) -> mx.array:
    """Mean token cross entropy in fp32 over labels that are not -100, as models/textbridge_decoder.token_loss."""
    logits = logits.astype(mx.float32).reshape(-1, logits.shape[-1])
    labels = labels.reshape(-1)
    scored = labels != IGNORE_INDEX
    per_token = nn.losses.cross_entropy(logits, mx.where(scored, labels, 0), reduction="none")
    return (per_token * scored).sum() / scored.sum()


def build_mlx_model(config: DecoderConfig) -> TextBridgeDecoder:
    return TextBridgeDecoder(config)


__all__ = ["TextBridgeDecoder", "build_mlx_model", "teacher_forcing", "token_loss"]
