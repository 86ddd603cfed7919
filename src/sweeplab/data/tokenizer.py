"""The project tokenizer: a WordPiece vocabulary trained locally with HF `tokenizers`, or a local HF tokenizer.

Nothing downloads: `train` learns a vocabulary from a list of sentences, `load` reads a `tokenizer.json` or a local
Hugging Face tokenizer directory. `encode` adds no special tokens; TextBridge sees the words only. `decode` reads the
TextBridge decoder's token ids back as text.
"""

from __future__ import annotations

import os
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from sweeplab.core.errors import UserError
from sweeplab.core.files import atomic_write

PAD_TOKEN = "[PAD]"
UNK_TOKEN = "[UNK]"
# BERT's special tokens, in BERT's order after [PAD]: [PAD] is id 0, [UNK] id 1. The others cost nothing and keep the
# vocabulary usable by BERT-style models (and by a decoder that needs start/end tokens later).
SPECIAL_TOKENS = (PAD_TOKEN, UNK_TOKEN, "[CLS]", "[SEP]", "[MASK]")
_PAD_CANDIDATES = (PAD_TOKEN, "<pad>", "<|pad|>", "<PAD>")


class TextTokenizer:
    """A `tokenizers.Tokenizer` with the few things TextBridge needs: `vocab_size`, `pad_id`, `encode`."""

    def __init__(self, tokenizer: Tokenizer, pad_id: int | None = None):
        # Padding and truncation are done by the caller (the collate function, `encode`'s max_len), so a loaded
        # tokenizer's own settings must not pad or cut behind our back.
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self.tokenizer = tokenizer
        if pad_id is None:
            pad_id = next((i for t in _PAD_CANDIDATES if (i := tokenizer.token_to_id(t)) is not None), 0)
        self.pad_id = pad_id

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    @classmethod
    def train(cls, sentences: list[str], vocab_size: int = 8000) -> TextTokenizer:
        """WordPiece on `sentences`: lowercase, BERT pre-tokenizer, [PAD]=0, [UNK]=1. Same sentences, same vocabulary.

        A small corpus may yield a smaller vocabulary than asked; `vocab_size` reports what was learned.
        """
        draft = _bert_style_wordpiece()
        # tokenizers' trainer numbers the "##x" continuation pieces in hash-map order, and equally frequent merges are
        # ranked by those numbers, so each run learns a slightly different vocabulary (huggingface/tokenizers#1794).
        # Reserving every continuation piece up front, sorted, fixes their numbers and makes training reproducible.
        continuation_pieces = sorted(
            {
                "##" + char
                for sentence in sentences
                for word, _ in draft.pre_tokenizer.pre_tokenize_str(draft.normalizer.normalize_str(sentence))
                for char in word[1:]
            }
        )
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, special_tokens=[*SPECIAL_TOKENS, *continuation_pieces], show_progress=False
        )
        draft.train_from_iterator(sentences, trainer=trainer)
        # Rebuild from the learned vocabulary so that only the real special tokens are special (the reserved pieces
        # are ordinary vocabulary entries, as the trainer would have made them).
        tokenizer = _bert_style_wordpiece(vocab=draft.get_vocab(with_added_tokens=False))
        tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
        return cls(tokenizer, pad_id=tokenizer.token_to_id(PAD_TOKEN))

    @classmethod
    def load(cls, path: str | os.PathLike) -> TextTokenizer:
        """A `tokenizer.json` file, a directory holding one, or a local HF tokenizer directory."""
        path = Path(path)
        if path.is_file():
            return cls(_tokenizer_from_file(path))
        if not path.is_dir():
            raise UserError(f"{path}: no such tokenizer file or directory")
        if (path / "tokenizer.json").is_file():
            return cls(_tokenizer_from_file(path / "tokenizer.json"))
        from transformers import AutoTokenizer

        try:
            hf_tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except (OSError, ValueError) as e:
            first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserError(f"{path}: not a local Hugging Face tokenizer directory ({first_line})") from None
        backend = getattr(hf_tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise UserError(f"{path}: tokenizer has no fast (tokenizers) backend; save it with a tokenizer.json")
        return cls(backend, pad_id=hf_tokenizer.pad_token_id)

    def save(self, path: str | os.PathLike) -> Path:
        """Write `tokenizer.json` (atomically); `path` is the file or a directory to put it in."""
        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        with atomic_write(path) as f:
            f.write(self.tokenizer.to_str(pretty=True).encode("utf-8"))
        return path

    def encode(self, texts: list[str], max_len: int) -> tuple[list[list[int]], list[list[int]], int]:
        """Token ids and all-ones masks of each text, cut to `max_len`; also how many texts were cut."""
        encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        ids_list, masks_list, n_truncated = [], [], 0
        for encoding in encodings:
            ids = encoding.ids
            if len(ids) > max_len:
                ids = ids[:max_len]
                n_truncated += 1
            ids_list.append(ids)
            masks_list.append([1] * len(ids))
        return ids_list, masks_list, n_truncated

    def decode(self, rows: list[list[int]]) -> list[str]:
        """Token ids -> text, special tokens dropped (the decoder's output, read back)."""
        return self.tokenizer.decode_batch([list(row) for row in rows], skip_special_tokens=True)

    def token_id(self, token: str) -> int | None:
        """The id of `token` ("[CLS]"), None when the vocabulary has no such token."""
        return self.tokenizer.token_to_id(token)

    def __repr__(self) -> str:
        return f"TextTokenizer(vocab_size={self.vocab_size}, pad_id={self.pad_id})"


def _bert_style_wordpiece(vocab: dict[str, int] | None = None) -> Tokenizer:
    model = models.WordPiece(vocab=vocab, unk_token=UNK_TOKEN) if vocab else models.WordPiece(unk_token=UNK_TOKEN)
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    return tokenizer


def _tokenizer_from_file(path: Path) -> Tokenizer:
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception on malformed files
        raise UserError(f"{path}: not a valid tokenizer.json ({str(e).splitlines()[0] if str(e) else e!r})") from None


__all__ = ["TextTokenizer", "PAD_TOKEN", "UNK_TOKEN", "SPECIAL_TOKENS"]
