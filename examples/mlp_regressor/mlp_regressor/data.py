"""Synthetic regression data made from a seed: y = sin(x·w) + noise."""

import torch
from torch.utils.data import DataLoader, TensorDataset

from sweeplab.data.sampling import ResumableDataLoader, ResumableShuffleBatchSampler
from sweeplab.families.contract import FamilyDataModule


class RegressionData(FamilyDataModule):  # a LightningDataModule; its optional hooks: none needed (data in memory)
    def __init__(self, in_dim: int, n_samples: int = 4096, batch_size: int = 64, noise: float = 0.05,
                 val_fraction: float = 0.1, seed: int = 0):
        super().__init__()
        if n_samples < 2 or batch_size < 1 or not 0 < val_fraction < 1:
            raise ValueError("n_samples >= 2, batch_size >= 1 and 0 < val_fraction < 1 needed")
        self.in_dim, self.n_samples, self.batch_size = in_dim, n_samples, batch_size
        self.noise, self.val_fraction, self.seed = noise, val_fraction, seed

    def setup(self, stage=None):
        g = torch.Generator().manual_seed(self.seed)
        x = torch.randn(self.n_samples, self.in_dim, generator=g)
        y = torch.sin(x @ torch.randn(self.in_dim, generator=g) / self.in_dim**0.5)
        y = y + self.noise * torch.randn(self.n_samples, generator=g)
        n_val = max(1, int(self.n_samples * self.val_fraction))
        self.train_set, self.val_set = TensorDataset(x[n_val:], y[n_val:]), TensorDataset(x[:n_val], y[:n_val])

    @staticmethod
    def collate(items):  # a dict of tensors, batch size first: what sweeplab's timer counts samples from
        x, y = zip(*items)
        return {"x": torch.stack(x), "y": torch.stack(y)}

    def train_dataloader(self):
        # the resumable sampler: DDP ranks get their own shards and a resumed run continues mid-epoch
        sampler = ResumableShuffleBatchSampler(len(self.train_set), self.batch_size, self.seed)
        return ResumableDataLoader(self.train_set, batch_sampler=sampler, collate_fn=self.collate)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.batch_size, collate_fn=self.collate)
