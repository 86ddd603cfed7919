"""The task: a mean-squared-error loss and two validation metrics."""

import time

import torch
import torch.nn.functional as F

from mlp_regressor.model import MLPConfig, MLPRegressor
from sweeplab.tasks.base import SweepTask


class RegressionTask(SweepTask):
    def __init__(self, config: MLPConfig, loss, optim):  # loss: None, the MSE takes no settings
        super().__init__(MLPRegressor(config), optim)  # the checkpoint keeps config (model.config) and optim
        self._val = []
        self._sleep_s = config.sleep_ms / 1000

    def training_loss(self, batch):  # plain torch: compiled, captured and timed as is
        if self._sleep_s:  # a known effect on the step time, nothing else (the math is untouched)
            time.sleep(self._sleep_s)
        pred = self.model(batch["x"])
        return F.mse_loss(pred, batch["y"]), {"mae": F.l1_loss(pred, batch["y"])}  # logged as train/mae

    def validation_step(self, batch, batch_idx):
        self._val.append((self.forward_fn(batch["x"]), batch["y"]))

    def on_validation_epoch_end(self):
        pred, y = (torch.cat(t) for t in zip(*self._val))
        self._val.clear()
        mse = F.mse_loss(pred, y)
        self.log_dict({"val/loss": mse, "val/r2": 1 - mse / y.var(unbiased=False).clamp_min(1e-12)})
