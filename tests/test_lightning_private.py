"""sweeplab.runtime.lightning_private is the one place that reads or writes Lightning's private state. These tests run a real
Trainer and fail when a Lightning upgrade renames any of it or changes what it means."""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from sweeplab.runtime.lightning_private import count_optimizer_steps, logging_step, validates_after_this_batch


class TinyTask(L.LightningModule):
    def __init__(self, steps_per_batch: int = 1):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.steps_per_batch = steps_per_batch
        self.automatic_optimization = steps_per_batch == 1

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch[0]).pow(2).mean()
        if self.automatic_optimization:
            self.log("train/loss", loss)
            return loss
        optimizer = self.optimizers()
        for _ in range(self.steps_per_batch):  # as the task's steps_per_batch path: the torch optimizer, k times
            optimizer.optimizer.zero_grad()
            self.manual_backward(loss)
            optimizer.optimizer.step()
            loss = self.layer(batch[0]).pow(2).mean()
        count_optimizer_steps(self.trainer, self.steps_per_batch)
        self.log("train/loss", loss)

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self.layer(batch[0]).pow(2).mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Recorder(L.Callback):
    def __init__(self):
        self.seen: list[tuple[int, int, bool]] = []  # (global_step, logging step, validates next) per batch

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.seen.append((trainer.global_step, logging_step(trainer), validates_after_this_batch(trainer)))


class LoggedSteps(L.pytorch.loggers.logger.Logger):
    """Records the steps Lightning logs training metrics at."""

    def __init__(self):
        super().__init__()
        self.steps: list[int] = []

    name, version = "steps", 0

    @property
    def experiment(self):
        return None

    def log_metrics(self, metrics, step=None):
        if "train/loss" in metrics:
            self.steps.append(step)

    def log_hyperparams(self, params, *args, **kwargs):
        pass


def _fit(task: TinyTask, max_steps: int, val_every: int, tmp_path) -> tuple[Recorder, LoggedSteps]:
    data = DataLoader(TensorDataset(torch.randn(64, 2)), batch_size=4)
    recorder, logger = Recorder(), LoggedSteps()
    trainer = L.Trainer(
        max_steps=max_steps, val_check_interval=val_every, check_val_every_n_epoch=None, limit_val_batches=1,
        log_every_n_steps=1, logger=logger, callbacks=[recorder], enable_progress_bar=False,
        enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=tmp_path,
    )
    trainer.fit(task, data, data)
    return recorder, logger


def test_the_logging_step_is_the_batch_index_lightning_logs_at_and_validation_is_foreseen(tmp_path):
    recorder, logger = _fit(TinyTask(), max_steps=6, val_every=3, tmp_path=tmp_path)
    assert [global_step for global_step, _, _ in recorder.seen] == [1, 2, 3, 4, 5, 6]
    assert [step for _, step, _ in recorder.seen] == [0, 1, 2, 3, 4, 5] == logger.steps
    assert [validates for *_, validates in recorder.seen] == [False, False, True, False, False, True]


def test_several_optimizer_steps_per_batch_count_in_global_and_logging_steps(tmp_path):
    recorder, logger = _fit(TinyTask(steps_per_batch=3), max_steps=9, val_every=2, tmp_path=tmp_path)
    # three batches of three optimizer steps: global_step and the logging step move by three per batch
    assert [global_step for global_step, _, _ in recorder.seen] == [3, 6, 9]
    assert [step for _, step, _ in recorder.seen] == [2, 5, 8] == logger.steps
