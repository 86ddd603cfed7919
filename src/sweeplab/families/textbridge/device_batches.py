"""Training batches that live on the device: the split is padded once and moved there; a step only gathers rows.

With per-sample reading and collation in DataLoader workers the GPU waits for data (batch 1024 on an H100: ~43k
samples/s fed by 4 workers, ~64k trained). Here the whole training split is read once into padded tensors on the
training device; a step copies one index list to the device (from pinned memory) and gathers rows. A batch's width is computed on the
host from the known lengths, so nothing is read back from the device: a step needs no host sync.

The index lists are those of `ResumableShuffleBatchSampler`, so order, epochs, DDP sharding and checkpoint state are
the DataLoader path's.

`steps_per_batch=k > 1`: each batch is the rows of the sampler's next k batches, in order, for k optimizer steps (one
graph replay under cuda_graph). The sampler's batches are drawn as one stream across its epochs (a group may hold
the last batches of one epoch and the first of the next), so the batches, their order and the sampler's resumable
state are exactly those of k single steps; a pass (Lightning's epoch) is len(sampler) // k groups.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import ClassVar

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from sweeplab.core.errors import ConfigError
from sweeplab.data.sampling import SWITCHED_DATA_PATH, ResumableShuffleBatchSampler, worker_start
from sweeplab.runtime.devices import to_device

log = logging.getLogger(__name__)

PAD_TO_MODES = ("batch", "bucket", "max")
PAD_TO_SETTINGS = (*PAD_TO_MODES, "auto")  # what `data.pad_to` accepts; `auto` is resolved by `resolve_pad_to`
_BUILD_BATCH = 1024  # samples read and collated per step of the one-off build pass
_PROGRESS_MIN = 10_000  # build passes over fewer samples show no progress bar


def resolve_pad_to(pad_to: str, cuda_graph: bool, backend: str = "cpu") -> str:
    """`data.pad_to=auto`: `max` on CUDA (and under cuda_graph, whose captured graph holds one shape), else `bucket`.

    Every new batch shape costs a one-off price the first time a process meets it (cuDNN autotuning on CUDA, a Metal
    graph on MPS, oneDNN primitives on the CPU: ~12 ms a shape for TextBridge small, 20 % of a step). With
    per-batch widths the first job of a sweep meets most shapes inside its timed steps and later jobs do not, so a
    job's speed depended on its place in the sweep. Buckets bound the shapes, and the timer's shape warm-up pays for
    each one before timing. On the CPU too: the extra padding (< `pad_multiple` tokens a row) costs every job alike.
    On CUDA one width is cheaper still: with cuDNN's autotuning on, the first job of each batch size in a process
    spent 5-6 s tuning its bucket widths (the default study on an H200: 10.2 s for that job against 5.6 s with
    `max`; every GPU lane of a multi-GPU study pays it again), while a step of a model this size waits on the host,
    not on the padded FLOPs (9.0-11.7 ms a step bucketed, 7.5-10.4 ms at `max`; the same validation cosines:
    padding is masked). docs/study-cost.md.
    """
    if pad_to not in PAD_TO_SETTINGS:
        raise ConfigError("data.pad_to", f"{pad_to!r} is not one of {', '.join(PAD_TO_SETTINGS)}")
    if pad_to == "auto":
        return "max" if cuda_graph or backend == "cuda" else "bucket"
    return pad_to


@dataclass(frozen=True)
class Padding:
    """The width of a training batch: its longest sample (`batch`), that rounded up to a multiple of `multiple`
    (`bucket`), or always `fixed_len` (`max`); never wider than `fixed_len`. Picklable, for DataLoader workers."""

    mode: str
    fixed_len: int
    multiple: int = 8

    def __post_init__(self) -> None:
        if self.mode not in PAD_TO_MODES:
            raise ValueError(f"data.pad_to={self.mode!r} is not one of {PAD_TO_MODES}")
        if self.multiple < 1:
            raise ValueError(f"data.pad_multiple must be >= 1, got {self.multiple}")

    def width(self, longest: int) -> int:
        if self.mode == "max":
            return self.fixed_len
        longest = max(1, longest)  # L >= 1 keeps all-empty batches well-shaped
        if self.mode == "bucket":
            return min(self.fixed_len, -(-longest // self.multiple) * self.multiple)
        return longest

    def widths_from(self, narrowest: int) -> list[int]:
        """Every width a batch whose longest sample has at least `narrowest` tokens can get (`batch`: all of them)."""
        return sorted({self.width(n) for n in range(max(1, narrowest), self.fixed_len + 1)})


def _collate_with_lengths(items: list[dict], collate: Callable) -> tuple[dict[str, torch.Tensor], list[int]]:
    """The collated batch and each sample's real length (the mask may hold zeros, so it cannot tell)."""
    return collate(items), [len(item["input_ids"]) for item in items]


@dataclass
class ResidentSplit:
    """One split as the tensors `collate_textbridge` gives, one row per sample, all padded to `width` columns."""

    TENSORS: ClassVar[tuple[str, ...]] = ("input_ids", "attention_mask", "target", "sample_id")  # the per-row tensors

    input_ids: torch.Tensor  # int64 (N, width), padded with pad_id
    attention_mask: torch.Tensor  # int64 (N, width)
    target: torch.Tensor  # float32 (N, D)
    sample_id: torch.Tensor  # int64 (N,): position in the source
    lengths: np.ndarray  # int64 (N,): real tokens per row, kept on the host so a batch's width needs no device read

    @classmethod
    def build(
        cls, dataset: Dataset, collate: Callable, width: int, target_dim: int, num_workers: int = 0
    ) -> ResidentSplit:
        """Read every sample of `dataset` in order through `collate` (which must pad to `width`); on the CPU."""
        n = len(dataset)
        split = cls(
            input_ids=torch.empty((n, width), dtype=torch.int64),
            attention_mask=torch.empty((n, width), dtype=torch.int64),
            target=torch.empty((n, target_dim), dtype=torch.float32),
            sample_id=torch.empty((n,), dtype=torch.int64),
            lengths=np.empty(n, dtype=np.int64),
        )
        # a plain sequential DataLoader: workers read and pad in parallel, rows arrive in dataset order
        loader = DataLoader(
            dataset,
            batch_size=_BUILD_BATCH,
            num_workers=num_workers,
            collate_fn=functools.partial(_collate_with_lengths, collate=collate),
            worker_init_fn=worker_start(),  # its workers end with the job
        )
        from tqdm.auto import tqdm

        start = 0
        for batch, lengths in tqdm(loader, desc="data.on_device", leave=False, disable=n < _PROGRESS_MIN):
            stop = start + len(lengths)
            for name in cls.TENSORS:
                getattr(split, name)[start:stop] = batch[name]
            split.lengths[start:stop] = lengths
            start = stop
        return split

    def to(self, device: torch.device) -> ResidentSplit:
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in self.TENSORS:
            moved[name] = moved[name].to(device)
        return ResidentSplit(**moved)

    @property
    def device(self) -> torch.device:
        return self.input_ids.device

    @property
    def width(self) -> int:
        return self.input_ids.shape[1]

    @property
    def size_mb(self) -> float:
        tensors = [getattr(self, name) for name in self.TENSORS]
        return sum(t.numel() * t.element_size() for t in tensors) / 2**20

    def __len__(self) -> int:
        return len(self.lengths)


class DeviceBatches:
    """Batches gathered from a `ResidentSplit` in the order `batch_sampler` gives, as dicts like the collate function's.

    Each batch is cut to `padding`'s width of its longest sample (the DataLoader path's tensors exactly): with
    `max` the split's fixed width (one shape for CUDA graphs and torch.compile). Lightning resumes it like a StatefulDataLoader:
    `state_dict`/`load_state_dict` make it `_Stateful`, and the state is the sampler's.
    """

    def __init__(
        self,
        split: ResidentSplit,
        batch_sampler: ResumableShuffleBatchSampler,
        padding: Padding | None = None,
        steps_per_batch: int = 1,
    ):
        if batch_sampler.num_samples != len(split):
            raise ValueError(f"the sampler covers {batch_sampler.num_samples} samples, the split holds {len(split)}")
        self.split = split
        self.batch_sampler = batch_sampler
        self.padding = padding if padding is not None else Padding("batch", split.width)
        if steps_per_batch < 1:
            raise ValueError(f"steps_per_batch must be >= 1, got {steps_per_batch}")
        if steps_per_batch > 1 and self.padding.mode != "max":
            raise ConfigError("data.pad_to", "steps_per_batch > 1 needs one batch width; set data.pad_to=max")
        self.steps_per_batch = steps_per_batch

    def __len__(self) -> int:
        return max(1, len(self.batch_sampler) // self.steps_per_batch)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        # a generator: Lightning calls iter() once just to check the object is iterable, which must not advance it
        if self.steps_per_batch > 1:
            yield from self._groups()
            return
        for indices in self.batch_sampler:
            yield self.gather(indices)

    def _groups(self) -> Iterator[dict[str, torch.Tensor]]:
        """Endless: the caller stops after len(self) groups; the next pass continues from the sampler's state."""
        batches = iter(self.batch_sampler)
        while True:
            rows: list[int] = []
            for _ in range(self.steps_per_batch):
                indices = next(batches, None)
                if indices is None:  # the sampler's epoch ended inside this group: its next epoch goes on
                    batches = iter(self.batch_sampler)
                    indices = next(batches)
                if len(indices) != self.batch_sampler.batch_size:
                    raise ConfigError(
                        "steps_per_batch",
                        f"needs full batches of data.batch_size={self.batch_sampler.batch_size}; the training split "
                        f"has only {self.batch_sampler.num_samples} samples",
                    )
                rows += indices
            yield self.gather(rows)

    def gather(self, indices: list[int]) -> dict[str, torch.Tensor]:
        """Rows `indices` of the split, on its device; the width comes from host-side lengths (no device read)."""
        split = self.split
        host_rows = np.asarray(indices, dtype=np.int64)  # one conversion of the list serves both uses
        width = self.padding.width(int(split.lengths[host_rows].max()))
        rows = torch.from_numpy(host_rows)
        if split.device.type == "cuda":
            # from pinned memory (torch caches pinned blocks) the copy is truly asynchronous; from pageable memory
            # the host can wait for the GPU to reach the copy, which serialises host and device every step
            rows = rows.pin_memory()
        rows = to_device(rows, split.device)  # non-blocking to CUDA only: MPS would read `rows` after it is freed
        return {
            "input_ids": split.input_ids[:, :width].index_select(0, rows),
            "attention_mask": split.attention_mask[:, :width].index_select(0, rows),
            "target": split.target.index_select(0, rows),
            "sample_id": split.sample_id.index_select(0, rows),
        }

    def state_dict(self) -> dict[str, int]:
        return self.batch_sampler.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        if "epoch" not in state:  # a StatefulDataLoader's state: the checkpoint was written with on_device=false
            raise ConfigError("data.on_device", SWITCHED_DATA_PATH.format(saved="false"))
        self.batch_sampler.load_state_dict(state)


def resolve_data(data: dict, config: dict) -> dict:
    """The `data` group as the job records and builds it (`Family.resolve_data`): `pad_to=auto` resolved for this
    job's backend and `cuda_graph`, so the run's params say which padding it trained with."""
    if "pad_to" not in data:
        return dict(data)
    backend = (config.get("backend") or {}).get("name", "cpu")
    return {**data, "pad_to": resolve_pad_to(data["pad_to"], bool(config.get("cuda_graph", False)), backend)}


__all__ = ["DeviceBatches", "Padding", "ResidentSplit", "PAD_TO_MODES", "PAD_TO_SETTINGS", "resolve_data", "resolve_pad_to"]
