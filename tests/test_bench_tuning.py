"""`tune.batch_size`: Lightning's batch-size finder as a switch, on a toy task that runs out of 'memory'."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from sweeplab.engine.tuning import TuneConfig, tune_batch_size

LIMIT = 48  # batches larger than this "run out of memory"


class Data(L.LightningDataModule):
    def __init__(self, batch_size: int = 4):
        super().__init__()
        self.batch_size = batch_size

    def train_dataloader(self):
        return DataLoader(torch.randn(4096, 3), batch_size=self.batch_size)


class Task(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)
        self.tried: list[int] = []

    def training_step(self, batch, batch_idx):
        self.tried.append(len(batch))
        if len(batch) > LIMIT:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")  # what Lightning recognises
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _trainer(tmp_path) -> L.Trainer:
    return L.Trainer(accelerator="cpu", max_steps=5, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)


# binsearch keeps Lightning's 5 % margin below the limit it found (48)
@pytest.mark.parametrize("mode, expected", [("power", 32), ("binsearch", 45)])
def test_finder_stops_below_out_of_memory(mode, expected, tmp_path):
    data, task = Data(), Task()
    weights = task.layer.weight.detach().clone()
    found = tune_batch_size(_trainer(tmp_path), task, data, TuneConfig(batch_size=mode, init_val=4, max_trials=6, steps_per_trial=1))
    assert found == expected == data.batch_size
    assert max(task.tried) > LIMIT  # it did go past the limit and came back
    torch.testing.assert_close(task.layer.weight, weights)  # the trial steps trained nothing


def test_off_by_default_and_bounded_on_cpu(tmp_path):
    data, task = Data(), Task()
    assert tune_batch_size(_trainer(tmp_path), task, data, TuneConfig()) is None and data.batch_size == 4
    found = tune_batch_size(_trainer(tmp_path), task, data, TuneConfig(batch_size="power", init_val=2, max_trials=3, steps_per_trial=1))
    assert found == 8  # nothing failed: 2 -> 4 -> 8, three trials


def test_config_is_checked():
    with pytest.raises(ValueError, match="false, power, binsearch"):
        TuneConfig(batch_size="linear")
    assert TuneConfig(batch_size=True).batch_size == "power"
    with pytest.raises(ValueError, match="max_trials"):
        TuneConfig(batch_size="power", max_trials=0)
