"""A shuffling batch sampler that a checkpoint can stop and restart exactly, across epochs.

torchdata's StatefulDataLoader restores the position inside the current epoch, but the next epoch's shuffle comes
from a generator whose state it does not carry over, so a resumed run sees different batches from the second epoch
on. Here the permutation of epoch e is a pure function of (seed, e), and the state is just (epoch, batches
yielded): the resumed run sees exactly the batches an uninterrupted one would.

Under DDP every rank walks the same permutation and takes every world-size-th sample of each global batch
(`batch_size` × world size samples), so the ranks share one state and never see the same sample in a step; with one
process the batches are exactly those above.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import lightning as L
import torch
from torch.utils.data import Sampler
from torchdata.stateful_dataloader import StatefulDataLoader

from sweeplab.core.errors import ConfigError, UserError
from sweeplab.core.orphans import die_with_parent

SWITCHED_DATA_PATH = "the checkpoint's data position was saved with data.on_device={saved}; resume with that setting"


class ResumableShuffleBatchSampler(Sampler[list[int]]):
    def __init__(self, num_samples: int, batch_size: int, seed: int, drop_last: bool = True):
        if num_samples <= 0 or batch_size <= 0:
            raise ValueError(f"num_samples and batch_size must be > 0, got {num_samples}, {batch_size}")
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self.batches_yielded = 0  # within `epoch`

    @staticmethod
    def shard() -> tuple[int, int]:
        """(world size, rank) of the DDP process group; (1, 0) outside one."""
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_world_size(), torch.distributed.get_rank()
        return 1, 0

    def __len__(self) -> int:
        global_batch = self.batch_size * self.shard()[0]
        if self.drop_last:
            return self.num_samples // global_batch
        return -(-self.num_samples // global_batch)

    @property
    def samples_per_batch(self) -> int:
        """The samples a full batch holds on each rank: `batch_size`, or, when the split is smaller than one global
        batch and drop_last is off, the whole split (one short batch, shared among the ranks)."""
        world = self.shard()[0]
        if self.drop_last or self.num_samples >= self.batch_size * world:
            return self.batch_size
        return -(-self.num_samples // world)

    def permutation(self, epoch: int) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.num_samples, generator=generator).tolist()

    def __iter__(self) -> Iterator[list[int]]:
        if self.batches_yielded >= len(self):  # the last pass stopped after its last batch, before StopIteration
            self.epoch, self.batches_yielded = self.epoch + 1, 0  # (Lightning knows the length and never asks again)
        world, rank = self.shard()
        global_batch = self.batch_size * world
        order = self.permutation(self.epoch)
        for b in range(self.batches_yielded, len(self)):
            self.batches_yielded = b + 1
            batch = order[b * global_batch : (b + 1) * global_batch]
            if len(batch) < world:  # a short last batch (drop_last=False): every rank needs a sample
                batch += order[: world - len(batch)]
            yield batch[rank::world]
        self.epoch += 1
        self.batches_yielded = 0

    def state_dict(self) -> dict[str, int]:
        if self.batches_yielded >= len(self):  # saved right at the end of an epoch: resume at the next one
            return {"epoch": self.epoch + 1, "batches_yielded": 0}
        return {"epoch": self.epoch, "batches_yielded": self.batches_yielded}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])
        self.batches_yielded = int(state["batches_yielded"])
        if self.batches_yielded >= len(self):
            self.epoch, self.batches_yielded = self.epoch + 1, 0


class WorkerStart:
    """A DataLoader's `worker_init_fn` that first ties the worker to the process that started it (a worker outlived
    a `kill -9` of its job), then does what the loader's own would: `inner`, else Lightning's worker seeding
    where `seed_everything(workers=True)` asked for it (Lightning adds it only to a loader without one)."""

    def __init__(self, inner=None):
        self.inner = inner

    def __call__(self, worker_id: int) -> None:
        die_with_parent()
        if self.inner is not None:
            self.inner(worker_id)
        elif int(os.environ.get("PL_SEED_WORKERS", 0)):
            from lightning.fabric.utilities.seed import pl_worker_init_function

            pl_worker_init_function(worker_id)


def worker_start(worker_init_fn=None) -> WorkerStart:
    """`worker_init_fn` wrapped in WorkerStart (once)."""
    return worker_init_fn if isinstance(worker_init_fn, WorkerStart) else WorkerStart(worker_init_fn)


class ResumableDataLoader(StatefulDataLoader):
    """torchdata's StatefulDataLoader that names the setting when handed a position it did not write: the state of
    device-resident batches (data.on_device=true) is the bare sampler's, on which torchdata stops with a KeyError.
    Its workers end with the job (WorkerStart)."""

    def __init__(self, *args, worker_init_fn=None, **kwargs):
        super().__init__(*args, worker_init_fn=worker_start(worker_init_fn), **kwargs)

    def load_state_dict(self, state_dict: dict) -> None:
        if "batches_yielded" in state_dict:
            raise ConfigError("data.on_device", SWITCHED_DATA_PATH.format(saved="true"))
        super().load_state_dict(state_dict)


def check_resumable(loader, why: str) -> None:
    """Refuse a training loader whose batches do not come from ResumableShuffleBatchSampler, saying `why` it must.

    A family's data module is a plain LightningDataModule; this is where its one obligation to sweeplab is checked:
    under DDP (`use_distributed_sampler=False`, see distributed.py) a plain sampler gives every rank the same
    batches, and a resumed run would start its epoch again instead of continuing where the checkpoint stopped."""
    sampler = getattr(loader, "batch_sampler", None)
    if not isinstance(sampler, ResumableShuffleBatchSampler):
        raise UserError(
            f"data: the training loader ({type(loader).__name__}) does not draw its batches from "
            f"sweeplab.data.sampling.ResumableShuffleBatchSampler, which {why} needs; build the family's "
            "train_dataloader with one (batch_sampler=ResumableShuffleBatchSampler(len(dataset), batch_size, seed))"
        )


class ResumableDataCheck(L.Callback):
    """check_resumable on the loader the fit really uses, before its first step, when DDP or a resume needs it."""

    def __init__(self, resuming: bool):
        self.resuming = resuming

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        needs = [why for why, needed in (("trainer.devices > 1", trainer.world_size > 1), ("resume", self.resuming)) if needed]
        if needs:
            check_resumable(trainer.train_dataloader, " and ".join(needs))
