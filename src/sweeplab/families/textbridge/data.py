"""TextBridge batches: (input_ids, attention_mask, target) from a JSONL/EFB1 file or the offline demo dataset.

Records are read lazily (`formats.open_dataset`); the train/val split is seeded, so one seed gives one split on every
run (the original's split was an unseeded shuffle). Batches are padded on the right to the longest sample in them;
training batches with `pad_to="bucket"` to that rounded up to a multiple of `pad_multiple` (a few shapes, each warmed
up before timing: `shape_warmup_batches`), with `pad_to="max"` to one fixed width (fixed shapes for CUDA graphs and
torch.compile). The causal TCN pools with the mask, so extra right padding changes no real output. `on_device=true`
serves training batches from tensors kept on the training device (`device_batches.DeviceBatches`, beside this file) instead of a
DataLoader.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import torch
from annotated_types import Ge, Interval, MinLen
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader, Dataset

from sweeplab.data.sampling import ResumableDataLoader, ResumableShuffleBatchSampler
from sweeplab.data.tokenizer import TextTokenizer
from sweeplab.families.contract import FamilyDataModule
from sweeplab.families.textbridge.device_batches import PAD_TO_MODES, DeviceBatches, Padding, ResidentSplit
from sweeplab.families.textbridge.formats import DataFormatError, SampleSource, open_dataset
from sweeplab.families.textbridge.prepare import prepare_textbridge_demo, read_manifest

log = logging.getLogger(__name__)

TOO_LONG_MODES = ("truncate", "error")
_TEXT_PASS_CHUNK = 1024  # texts tokenised per call in the setup pass over text-mode data
_NO_LIMIT = 2**31 - 1  # a max_len that cuts nothing
# Without a tokenizer the vocabulary is implied by the largest id in the data. Real vocabularies stay below 2^18
# (GPT-2 50k, BERT 30k, Gemma 256k); an id far above that is a corrupt record, and believing it would build an
# embedding of gigabytes (id 4e9 in EFB1: 512 GB). Beyond this bound, model.vocab_size must be given.
MAX_IMPLIED_VOCAB = 2**20


class TextBridgeDataset(Dataset):
    """Samples `indices` of a source as dicts of tensors, cut to `max_len` (text is tokenised on access)."""

    def __init__(self, source: SampleSource, indices: np.ndarray, max_len: int, tokenizer: TextTokenizer | None):
        if not source.has_tokens and tokenizer is None:
            raise ValueError(f"{source.path}: text-mode data needs a tokenizer")
        self.source = source
        self.indices = indices
        self.max_len = max_len
        self.tokenizer = tokenizer

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, k: int) -> dict[str, torch.Tensor]:
        sample_id = int(self.indices[k])
        sample = self.source[sample_id]
        if sample.input_ids is not None:
            input_ids = torch.from_numpy(sample.input_ids[: self.max_len].astype(np.int64))
            attention_mask = torch.from_numpy(sample.attention_mask[: self.max_len].astype(np.int64))
        else:
            ids, masks, _ = self.tokenizer.encode([sample.text], self.max_len)
            input_ids = torch.tensor(ids[0], dtype=torch.int64)
            attention_mask = torch.tensor(masks[0], dtype=torch.int64)
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "target": torch.from_numpy(sample.target),
            "sample_id": sample_id,  # position in the source: what per-sample caches are keyed by
        }


def collate_textbridge(
    batch: list[dict[str, torch.Tensor]], pad_id: int = 0, length: int | None = None, padding: Padding | None = None
) -> dict[str, torch.Tensor]:
    """Pad on the right to the longest sample (or to `length`, for fixed shapes, or to `padding`'s width of the longest
    sample): input_ids int64 (B, L) with `pad_id`, attention_mask int64 0/1 (B, L), target float32 (B, D), sample_id
    int64 (B,)."""
    longest = max([len(item["input_ids"]) for item in batch] + [1])  # L >= 1 keeps all-empty batches well-shaped
    if length is not None:
        longest = length
    elif padding is not None:
        longest = padding.width(longest)
    input_ids = torch.full((len(batch), longest), pad_id, dtype=torch.int64)
    attention_mask = torch.zeros((len(batch), longest), dtype=torch.int64)
    for row, item in enumerate(batch):
        length = len(item["input_ids"])
        input_ids[row, :length] = item["input_ids"]
        attention_mask[row, :length] = item["attention_mask"]
    target = torch.stack([item["target"] for item in batch]).to(torch.float32)
    sample_id = torch.tensor([item.get("sample_id", -1) for item in batch], dtype=torch.int64)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "target": target, "sample_id": sample_id}


# shape_warmup_batches walks the batches of a run up to this cost (each batch: its samples' lengths, plus about 32
# samples' worth of Python): about a second of one core; a longer run warms up every shape a batch can have instead
SHAPE_WALK_COST = 8_000_000


class TextBridgeDataModule(FamilyDataModule):  # its hooks: path, data_path, steps_per_batch, shape_warmup_batches, device
    def __init__(
        self,
        path: Annotated[str, MinLen(1)] | None = None,  # every bound on its annotation: the early check reads it
        demo_dir: str = "data/textbridge_demo",
        batch_size: Annotated[int, Ge(1)] = 64,
        val_fraction: Annotated[float, Interval(ge=0, lt=1)] = 0.1,
        seed: int = 0,
        max_len: Annotated[int, Ge(1)] = 128,
        num_workers: Annotated[int, Ge(0)] = 0,
        pin_memory: bool = False,
        tokenizer_path: str | None = None,
        too_long: Literal["truncate", "error"] = "truncate",
        drop_last: bool = True,
        pad_to: str = "batch",
        pad_multiple: Annotated[int, Ge(1)] = 8,
        on_device: bool = False,
    ):
        super().__init__()
        if pad_to not in PAD_TO_MODES:
            raise ValueError(f"data.pad_to={pad_to!r} is not one of {PAD_TO_MODES}")
        # No save_hyperparameters(): Lightning refuses to fit when a datamodule hparam and a model hparam share a
        # name with different values (max_len, batch_size); the run logs the resolved Hydra config instead.
        self.path = path
        self.demo_dir = demo_dir
        self.batch_size = batch_size
        self.val_fraction = val_fraction
        self.seed = seed
        self.max_len = max_len
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.tokenizer_path = tokenizer_path
        self.too_long = too_long
        self.drop_last = drop_last
        self.pad_to = pad_to
        self.pad_multiple = pad_multiple
        self.on_device = on_device
        # where on_device keeps the training split when no trainer is attached (a hand-written loop sets it)
        self.device = torch.device("cpu")
        self.steps_per_batch = 1  # on_device: optimizer steps per training batch (steps_per_batch; set by plan())

        self.source: SampleSource | None = None
        self.tokenizer: TextTokenizer | None = None
        self.train_dataset: TextBridgeDataset | None = None
        self.val_dataset: TextBridgeDataset | None = None
        self._max_token_id = -1
        self._longest = 0  # tokens in the longest record of the source, before truncation
        self._train_lengths: np.ndarray | None = None  # tokens per training sample, after truncation
        self._resident: ResidentSplit | None = None  # the on_device training split, built on first use

    # --- Lightning hooks ----------------------------------------------------------------------
    def prepare_data(self) -> None:
        if self.path is None:
            self._ensure_demo()

    def setup(self, stage: str | None = None) -> None:
        if self.source is not None:  # one split for every stage
            return
        source = open_dataset(self.data_path())
        self.tokenizer = self._load_tokenizer(source)
        lengths, self._max_token_id = self._token_lengths(source)
        unmasked = source.unmasked_tokens if source.has_tokens else int(lengths.sum())
        if unmasked == 0:
            what = "attention_mask is 0 everywhere" if source.has_tokens else "every text is empty (no tokens)"
            raise DataFormatError(f"{source.path}: {what} in all {len(source)} records: nothing to train on")
        self._check_lengths(source, lengths)
        self._longest = int(lengths.max()) if len(lengths) else 0

        n = len(source)
        n_val = round(n * self.val_fraction)
        if self.val_fraction > 0:
            n_val = max(1, n_val)
        if n - n_val < 1:
            raise DataFormatError(
                f"{source.path}: {n} records leave nothing to train on with val_fraction={self.val_fraction}"
            )
        order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed)).numpy()
        self.val_dataset = TextBridgeDataset(source, np.sort(order[:n_val]), self.max_len, self.tokenizer)
        self.train_dataset = TextBridgeDataset(source, order[n_val:], self.max_len, self.tokenizer)
        self._train_lengths = np.minimum(lengths[order[n_val:]], self.max_len)
        self.source = source

    def train_dataloader(self) -> DataLoader | DeviceBatches:
        sampler = self._train_sampler(warn=True)
        if self.on_device:
            return DeviceBatches(self._resident_train(), sampler, self.padding, self.steps_per_batch)
        return self._loader(self.train_dataset, batch_sampler=sampler, collate_fn=self.train_collate)

    def _train_sampler(self, warn: bool = False) -> ResumableShuffleBatchSampler:
        """The training batches' indices, from the first batch of the first epoch."""
        self.setup()
        drop_last = self.drop_last
        if drop_last and self.num_train < self.batch_size:
            if warn:
                rank_zero_warn(
                    f"data: {self.num_train} training samples < batch_size {self.batch_size}; keeping the partial "
                    "batch (drop_last would leave no batch at all)"
                )
            drop_last = False
        return ResumableShuffleBatchSampler(len(self.train_dataset), self.batch_size, self.seed, drop_last)

    def val_dataloader(self) -> DataLoader:
        self.setup()
        return self._loader(self.val_dataset, shuffle=False, drop_last=False)

    def teardown(self, stage: str | None = None) -> None:
        if self.source is not None:
            self.source.close()

    # --- what the model needs to know ---------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """The tokenizer's vocabulary; without a tokenizer, the largest token id in the data + 1 (at most
        MAX_IMPLIED_VOCAB: a larger one raises DataFormatError naming the record)."""
        self.setup()
        if self.tokenizer is not None:
            return self.tokenizer.vocab_size
        if self._max_token_id >= MAX_IMPLIED_VOCAB:
            raise DataFormatError(
                f"{self.source.locate(self.source.max_token_record)}: token id {self._max_token_id} would make a "
                f"vocabulary of {self._max_token_id + 1:,} tokens (more than {MAX_IMPLIED_VOCAB:,}) and there is no "
                "tokenizer.json to say otherwise; set model.vocab_size if that is meant, or fix the record"
            )
        return self._max_token_id + 1

    @property
    def pad_id(self) -> int:
        self.setup()
        return self.tokenizer.pad_id if self.tokenizer is not None else 0

    @property
    def source_path(self) -> Path:
        """The data file in use (a directory `path` resolved to the file it holds)."""
        self.setup()
        return self.source.path

    @property
    def target_dim(self) -> int:
        self.setup()
        return self.source.target_dim

    @property
    def fixed_len(self) -> int:
        """The one width of every training batch with pad_to=max: max_len, or the longest record if shorter."""
        self.setup()
        return max(1, min(self.max_len, self._longest))

    @property
    def padding(self) -> Padding:
        """How wide each training batch is (data.pad_to, data.pad_multiple)."""
        return Padding(self.pad_to, self.fixed_len, self.pad_multiple)

    def shape_warmup_batches(self, num_batches: int | None = None) -> list[dict[str, torch.Tensor]]:
        """One host batch of every shape the first `num_batches` training batches have (the sampler's order is a
        function of the seed, and the widths come from the known lengths: nothing is read), or without
        `num_batches`, or for a run too long to walk (SHAPE_WALK_COST), of every shape a training batch can have
        (widths from the padding of the `batch_size`-th shortest sample up). For a forward/backward before the timed steps (callbacks/timing.py). With
        pad_to=batch the widths are too many to cover: none. The tokens are the first training samples cut to each
        width: what a warm-up computes does not matter, only its shapes."""
        self.setup()
        if self.pad_to == "batch" or not len(self.train_dataset):
            return []
        padding, lengths = self.padding, self._train_lengths
        sampler = self._train_sampler()
        if not len(sampler):
            return []
        # every shape a batch can have: widths from the padding of the `batch_size`-th shortest sample up
        full = min(self.batch_size, self.num_train)
        every = {(full, w) for w in padding.widths_from(int(np.sort(lengths)[full - 1]))}
        if not sampler.drop_last and self.num_train % self.batch_size:  # the short last batch of each epoch
            every |= {(self.num_train % self.batch_size, w) for _, w in every}
        if num_batches is None or num_batches * (sampler.batch_size + 32) > SHAPE_WALK_COST:
            # too long a run to walk (O(steps): trainer.max_steps=1e12 sat in this loop with no safe point): every
            # shape there can be, a bound on what the run meets
            shapes = every
        else:  # the shapes the run's batches really have (a shape no batch meets is a compile for nothing)
            shapes, seen = set(), 0
            while seen < num_batches and not shapes >= every:  # every shape met: the rest adds none
                for indices in sampler:
                    shapes.add((len(indices), padding.width(int(lengths[indices].max()))))
                    seen += 1
                    if seen == num_batches or shapes >= every:
                        break
        batches = []
        for size, width in sorted(shapes):
            items = [self.train_dataset[k] for k in range(size)]
            cut = [{**item, "input_ids": item["input_ids"][:width], "attention_mask": item["attention_mask"][:width]}
                   for item in items]
            batches.append(collate_textbridge(cut, self.pad_id, length=width))
        return batches

    @property
    def num_train(self) -> int:
        self.setup()
        return len(self.train_dataset)

    @property
    def num_val(self) -> int:
        self.setup()
        return len(self.val_dataset)

    def check_vocab(self, vocab_size: int) -> None:
        """Raise DataFormatError naming the first record with a token id >= vocab_size (an embedding would crash)."""
        self.setup()
        if self._max_token_id < vocab_size:
            return
        source = self.source
        for index in range(len(source)):
            sample = source[index]
            if sample.input_ids is not None:
                ids = sample.input_ids
            else:
                ids = np.asarray(self.tokenizer.encode([sample.text], _NO_LIMIT)[0][0], dtype=np.int64)
            if ids.size and ids.max() >= vocab_size:
                raise DataFormatError(
                    f"{source.locate(index)}: token id {int(ids.max())} >= model vocab_size {vocab_size} (largest id in "
                    f"the data: {self._max_token_id}); set model.vocab_size >= {self._max_token_id + 1} or use the "
                    "tokenizer the data was made with"
                )

    # --- helpers ------------------------------------------------------------------------------
    def _ensure_demo(self) -> Path:
        # Any prepared demo is used as it is: one built with other settings (`prepare --vocab-size ...`) was asked for.
        if read_manifest(self.demo_dir) is not None:
            return Path(self.demo_dir)
        log.info("preparing the demo data in %s (once; about a minute on 2 cores, `make data` does it ahead)", self.demo_dir)
        return prepare_textbridge_demo(self.demo_dir)

    def data_path(self) -> Path:
        """`data.path`, else the demo set, prepared on first use."""
        return self._ensure_demo() if self.path is None else Path(self.path)


    def _load_tokenizer(self, source: SampleSource) -> TextTokenizer | None:
        if self.tokenizer_path is not None:
            return TextTokenizer.load(self.tokenizer_path)
        beside = source.path.parent / "tokenizer.json"
        if beside.is_file():
            return TextTokenizer.load(beside)
        if not source.has_tokens:
            raise DataFormatError(
                f"{source.path}: text-mode JSONL needs a tokenizer: put tokenizer.json beside it or set data.tokenizer_path"
            )
        return None  # token data: ids are used as they are, the vocabulary comes from the data

    def _token_lengths(self, source: SampleSource) -> tuple[np.ndarray, int]:
        """Token count per record and the largest id. Token data has them from the index pass; text data is
        tokenised once here (only counts are kept) so too-long texts are known before training starts."""
        if source.has_tokens:
            return source.token_lengths, source.max_token_id
        lengths = np.empty(len(source), dtype=np.int64)
        max_token_id = -1
        for start in range(0, len(source), _TEXT_PASS_CHUNK):
            stop = min(start + _TEXT_PASS_CHUNK, len(source))
            texts = [source[i].text for i in range(start, stop)]
            ids_list, _, _ = self.tokenizer.encode(texts, max_len=_NO_LIMIT)
            lengths[start:stop] = [len(ids) for ids in ids_list]
            max_token_id = max([max_token_id, *(max(ids) for ids in ids_list if ids)])
        return lengths, max_token_id

    def _check_lengths(self, source: SampleSource, lengths: np.ndarray) -> None:
        too_long = np.flatnonzero(lengths > self.max_len)
        if too_long.size == 0:
            return
        if self.too_long == "error":
            first = int(too_long[0])
            raise DataFormatError(
                f"{source.locate(first)}: {int(lengths[first])} tokens > data.max_len={self.max_len} "
                f"({too_long.size} records in all); raise data.max_len or set data.too_long=truncate"
            )
        rank_zero_warn(
            f"{source.path}: {too_long.size} of {len(source)} samples are longer than data.max_len={self.max_len} "
            "tokens and are truncated"
        )

    def _collate_to(self, length: int | None, padding: Padding | None = None):
        return functools.partial(collate_textbridge, pad_id=self.pad_id, length=length, padding=padding)

    @property
    def collate(self):
        return self._collate_to(None)

    @property
    def train_collate(self):
        """The collate function of training batches: padding to `padding`'s width (data.pad_to)."""
        return self._collate_to(None, self.padding)

    def _train_device(self) -> torch.device:
        """The attached trainer's device (the rank's own under DDP); without a trainer, `self.device`."""
        if self.trainer is not None:
            return self.trainer.strategy.root_device
        return torch.device(self.device)

    def _resident_train(self) -> ResidentSplit:
        """The training split padded to `fixed_len` on the training device; read once, moved if the device changes
        (train_dataloader is called again by batch-size tuning and dataloader reloads)."""
        device = self._train_device()
        if self._resident is None:
            width = self.fixed_len
            split = ResidentSplit.build(self.train_dataset, self._collate_to(width), width, self.target_dim, self.num_workers)
            log.info(
                "data.on_device: %d training samples x %d tokens, %.1f MB on %s", len(split), width, split.size_mb,
                device,
            )
            self._resident = split.to(device)
        elif self._resident.device != device:
            self._resident = self._resident.to(device)
        return self._resident

    def _loader(self, dataset: Dataset, **kwargs) -> DataLoader:
        # stateful: a checkpoint records how far into the epoch the sampler got, so a resumed run sees exactly
        # the batches an uninterrupted one would have
        if "batch_sampler" not in kwargs:
            kwargs["batch_size"] = self.batch_size
        kwargs.setdefault("collate_fn", self.collate)
        return ResumableDataLoader(
            dataset,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.num_workers > 0,
            **kwargs,
        )


__all__ = ["TextBridgeDataModule", "TextBridgeDataset", "collate_textbridge", "TOO_LONG_MODES", "PAD_TO_MODES"]
