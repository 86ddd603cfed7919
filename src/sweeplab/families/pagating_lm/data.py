"""Language-model data: raw UTF-8 text -> byte-level BPE tokens (cached memmaps) -> packed blocks -> batches.

Reads top to bottom: where the text comes from (`TextSource`, `resolve_sources`), the tokenizer (trained locally
with HF `tokenizers`, or a local tokenizer.json), tokenising a split once into a memmap, the packed-block dataset,
and the `LMDataModule` that ties them together.

- `data.path`: a directory with train.txt/valid.txt/test.txt or WikiText's wiki.train.raw/wiki.valid.raw/
  wiki.test.raw; None -> the offline corpus (`corpus.demo_lm_splits()`). Nothing downloads.
- Cache (`cache_dir`): tokenizer-<key>.json (the trained tokenizer, keyed by the train file and vocab size) and
  <split>-<key>.<dtype>.bin per split, keyed by the source (path + size + mtime, or a content hash for in-memory
  text) and the tokenizer's content hash. Files are written to a temp name and os.replace'd, so a crash or two
  processes preparing at once never leave a half-written cache; later runs reuse it.
- Batches: {"input_ids": (B, T), "labels": (B, T)} int64, labels = inputs shifted by one token, cut from the token
  stream in contiguous blocks of T + 1. No padding exists anywhere, so nothing padded can enter the loss.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import numpy as np
import torch
from annotated_types import Ge
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from sweeplab.core.errors import UserError
from sweeplab.core.files import atomic_write
from sweeplab.data.corpus import demo_lm_splits
from sweeplab.data.sampling import ResumableDataLoader, ResumableShuffleBatchSampler
from sweeplab.data.tokenizer import TextTokenizer
from sweeplab.families.contract import FamilyDataModule

log = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")
END_OF_TEXT = "<|endoftext|>"  # in the vocabulary (GPT-2 convention) but never inserted: files are one stream
CACHE_VERSION = 1  # bump when the tokenised format changes, so old caches are not reused
CHUNK_BYTES = 1 << 20  # text is read and tokenised in ~1 MiB chunks cut at line ends
CHUNKS_PER_BATCH = 16  # chunks handed to the (multi-threaded) tokenizer at once
PROGRESS_MIN_BYTES = 8 << 20  # show progress bars for files at least this large


# --- where the text comes from -----------------------------------------------------------------
@dataclass(frozen=True)
class TextSource:
    """One split's raw text: a UTF-8 file, or in-memory text (the offline corpus)."""

    split: str
    name: str  # what errors and progress bars call it: the file path, or "demo corpus (train)"
    path: Path | None = None
    text: str | None = None

    @property
    def size_bytes(self) -> int:
        return self.path.stat().st_size if self.path is not None else len(self.text.encode("utf-8"))

    def identity(self) -> str:
        """Changes whenever the text may have: path + size + mtime for a file, a content hash for text."""
        if self.path is not None:
            stat = self.path.stat()
            return f"file:{self.path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
        return "text:" + hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    def chunks(self) -> Iterator[str]:
        """The text in ~CHUNK_BYTES pieces cut after a newline (never inside a UTF-8 sequence)."""
        stream = open(self.path, "rb") if self.path is not None else io.BytesIO(self.text.encode("utf-8"))
        with stream:
            offset, pending, pending_bytes = 0, [], 0
            for line in stream:
                pending.append(line)
                pending_bytes += len(line)
                if pending_bytes >= CHUNK_BYTES:
                    yield self._decode(b"".join(pending), offset)
                    offset, pending, pending_bytes = offset + pending_bytes, [], 0
            if pending:
                yield self._decode(b"".join(pending), offset)

    def _decode(self, data: bytes, offset: int) -> str:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise UserError(
                f"{self.name}: not valid UTF-8 at byte {offset + err.start}; re-encode it (e.g. iconv -t UTF-8)"
            ) from None


def resolve_sources(path: str | os.PathLike | None) -> dict[str, TextSource]:
    """train/valid/test sources of a data directory, or of the offline corpus when path is None."""
    if path is None:
        splits = demo_lm_splits()
        return {s: TextSource(s, f"demo corpus ({s})", text=splits[s]) for s in SPLITS}
    root = Path(path).expanduser()
    if not root.is_dir():
        raise UserError(f"data.path={path}: no such directory; point it at a folder with train.txt/valid.txt/test.txt")
    sources = {}
    for split in SPLITS:
        candidates = (root / f"{split}.txt", root / f"wiki.{split}.raw")
        file = next((c for c in candidates if c.is_file()), None)
        if file is None:
            raise UserError(
                f"{root}: no {split}.txt or wiki.{split}.raw; an LM data folder needs train, valid and test text"
            )
        if file.stat().st_size == 0:
            raise UserError(f"{file}: empty file; an LM split needs text")
        sources[split] = TextSource(split, str(file), path=file)
    return sources


# --- tokenizer ---------------------------------------------------------------------------------
def train_tokenizer(source: TextSource, vocab_size: int) -> Tokenizer:
    """A GPT-2-style byte-level BPE tokenizer (256 byte symbols + END_OF_TEXT + merges) trained on `source`."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=source.size_bytes >= PROGRESS_MIN_BYTES,
    )
    tokenizer.train_from_iterator(source.chunks(), trainer=trainer)  # a bad-UTF-8 ValueError passes through as is
    return tokenizer


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """A local tokenizer: tokenizer.json, a directory holding one, or a local HF tokenizer directory."""
    return TextTokenizer.load(path).tokenizer  # the project's one loader (padding and truncation switched off)


def fingerprint(*parts: object) -> str:
    return hashlib.sha256("\x1f".join(str(p) for p in parts).encode("utf-8")).hexdigest()[:16]


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size < 65536 else np.uint32)


def cached_tokenizer(source: TextSource, vocab_size: int, cache_dir: Path) -> Tokenizer:
    """Train once on the train split, then reuse the saved tokenizer-<key>.json."""
    path = cache_dir / f"tokenizer-{fingerprint(CACHE_VERSION, 'bytelevel-bpe', vocab_size, source.identity())}.json"
    if not path.exists():
        log.info("training a %d-token BPE tokenizer on %s (once; cached in %s)", vocab_size, source.name, cache_dir)
        tokenizer = train_tokenizer(source, vocab_size)
        with atomic_write(path) as f:
            f.write(tokenizer.to_str().encode("utf-8"))
    return Tokenizer.from_file(str(path))


# --- tokenising a split once -------------------------------------------------------------------
def tokenize_to_file(source: TextSource, tokenizer: Tokenizer, target: Path) -> int:
    """Tokenise `source` into a flat binary file of token ids (dtype from the vocab size); returns the count."""
    dtype = token_dtype(tokenizer.get_vocab_size())
    size = source.size_bytes
    progress = tqdm(
        total=size, unit="B", unit_scale=True, desc=f"tokenising {source.name}", disable=size < PROGRESS_MIN_BYTES
    )
    n_tokens = 0
    chunks = source.chunks()
    with atomic_write(target) as f, progress:
        while batch := list(itertools.islice(chunks, CHUNKS_PER_BATCH)):
            for encoding in tokenizer.encode_batch_fast(batch, add_special_tokens=False):
                ids = np.asarray(encoding.ids, dtype=dtype)
                ids.tofile(f)
                n_tokens += len(ids)
            progress.update(sum(len(text.encode("utf-8")) for text in batch))
    return n_tokens


def cached_tokens(source: TextSource, tokenizer: Tokenizer, cache_dir: Path) -> Path:
    """The split's token file, tokenised on first use; keyed by the source and the tokenizer's content."""
    vocab_size = tokenizer.get_vocab_size()
    key = fingerprint(
        CACHE_VERSION, source.identity(), hashlib.sha256(tokenizer.to_str().encode()).hexdigest(), vocab_size
    )
    path = cache_dir / f"{source.split}-{key}.{token_dtype(vocab_size).name}.bin"
    if not path.exists():
        log.info("tokenising the %s split (once; cached in %s)", source.split, cache_dir)
        tokenize_to_file(source, tokenizer, path)
    return path


# --- packed blocks -----------------------------------------------------------------------------
class PackedBlocks(Dataset):
    """Block i = tokens[i·T : i·T + T + 1]: input_ids its first T tokens, labels its last T (shifted by one)."""

    def __init__(self, path: Path, dtype: np.dtype, block_size: int, n_tokens: int):
        self.path, self.dtype, self.block_size, self.n_tokens = path, dtype, block_size, n_tokens
        self._tokens = None  # opened lazily, so DataLoader workers each map the file instead of pickling it

    @property
    def tokens(self) -> np.memmap:
        if self._tokens is None:
            self._tokens = np.memmap(self.path, dtype=self.dtype, mode="r", shape=(self.n_tokens,))
        return self._tokens

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_tokens": None}

    def __len__(self) -> int:
        return (self.n_tokens - 1) // self.block_size

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        start = index * self.block_size
        block = torch.from_numpy(self.tokens[start : start + self.block_size + 1].astype(np.int64))
        return {"input_ids": block[:-1], "labels": block[1:]}


# --- the DataModule ----------------------------------------------------------------------------
class LMDataModule(FamilyDataModule):  # its hook: path (None: the built-in corpus, in memory)
    def __init__(
        self,
        path: str | os.PathLike | None = None,
        cache_dir: str | os.PathLike = "data/lm_cache",
        block_size: int = 128,
        batch_size: int = 8,
        vocab_size: int = 2048,
        tokenizer_path: str | os.PathLike | None = None,
        num_workers: Annotated[int, Ge(0)] = 0,
        pin_memory: bool = False,
        seed: int = 0,
        max_train_tokens: int | None = None,
    ):
        super().__init__()
        if block_size <= 0 or batch_size <= 0:
            raise ValueError(f"data.block_size and data.batch_size must be > 0, got {block_size} and {batch_size}")
        if tokenizer_path is None and vocab_size < 257:
            raise ValueError(
                f"data.vocab_size={vocab_size} is too small: byte-level BPE needs >= 257 (256 bytes + {END_OF_TEXT})"
            )
        if max_train_tokens is not None and max_train_tokens < block_size + 1:
            raise ValueError(
                f"data.max_train_tokens={max_train_tokens} is shorter than one block (block_size + 1 = {block_size + 1})"
            )
        self.path = path
        self.cache_dir = Path(cache_dir).expanduser()
        self.block_size = block_size
        self.batch_size = batch_size
        self.requested_vocab_size = vocab_size
        self.tokenizer_path = tokenizer_path
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.seed = seed
        self.max_train_tokens = max_train_tokens
        self._sources: dict[str, TextSource] | None = None
        self._tokenizer: Tokenizer | None = None
        self.datasets: dict[str, PackedBlocks] = {}

    @property
    def sources(self) -> dict[str, TextSource]:
        if self._sources is None:
            self._sources = resolve_sources(self.path)
        return self._sources

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            if self.tokenizer_path is not None:
                self._tokenizer = load_tokenizer(self.tokenizer_path)
            else:
                self._tokenizer = cached_tokenizer(self.sources["train"], self.requested_vocab_size, self.cache_dir)
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        """The tokenizer's actual size (what the model's embedding needs); trains or loads it on first use."""
        return self.tokenizer.get_vocab_size()

    def prepare_data(self) -> None:
        """Tokenise every split into the cache (a no-op when the cache is there)."""
        for source in self.sources.values():
            cached_tokens(source, self.tokenizer, self.cache_dir)

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        dtype = token_dtype(self.vocab_size)
        for split, source in self.sources.items():
            path = cached_tokens(source, self.tokenizer, self.cache_dir)
            n_tokens = path.stat().st_size // dtype.itemsize
            if split == "train" and self.max_train_tokens is not None:
                n_tokens = min(n_tokens, self.max_train_tokens)
            if n_tokens < self.block_size + 1:
                raise UserError(
                    f"{source.name}: {n_tokens} tokens, shorter than one block (block_size + 1 = {self.block_size + 1}); "
                    "lower data.block_size or use more text"
                )
            self.datasets[split] = PackedBlocks(path, dtype, self.block_size, n_tokens)

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        if not self.datasets:
            self.setup()
        dataset = self.datasets[split]
        # stateful: a checkpoint records how far into the epoch the sampler got, so a resumed run sees exactly
        # the batches an uninterrupted one would have
        if shuffle:
            drop_last = len(dataset) >= self.batch_size  # static train shapes (torch.compile, CUDA graphs)
            batching = {"batch_sampler": ResumableShuffleBatchSampler(len(dataset), self.batch_size, self.seed, drop_last)}
        else:
            batching = {"batch_size": self.batch_size, "shuffle": False}
        return ResumableDataLoader(
            dataset,
            **batching,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("valid", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)


__all__ = [
    "SPLITS",
    "END_OF_TEXT",
    "LMDataModule",
    "PackedBlocks",
    "TextSource",
    "cached_tokenizer",
    "cached_tokens",
    "load_tokenizer",
    "resolve_sources",
    "tokenize_to_file",
    "train_tokenizer",
]


def token_file_rows(path: Path, vocab_size: int, seq_len: int, max_rows: int) -> list[np.ndarray]:
    """`max_rows` windows of `seq_len` tokens spread over a token file of the LM cache (*.bin): real data for the
    export's checks."""
    if not (path.is_file() and path.suffix == ".bin"):
        raise UserError("for the language model give a token file (*.bin from the LM cache)")
    dtype = np.uint32 if ".uint32." in path.name else np.uint16 if ".uint16." in path.name else None
    if dtype is None:
        dtype = np.uint16 if vocab_size < 65536 else np.uint32
    tokens = np.memmap(path, dtype=dtype, mode="r")
    if len(tokens) < seq_len:
        raise UserError(f"{len(tokens)} tokens, fewer than one sequence of {seq_len}")
    starts = np.linspace(0, len(tokens) - seq_len, num=max_rows).astype(np.int64)
    return [np.asarray(tokens[s : s + seq_len], dtype=np.int64) for s in starts]
