"""The frozen-trunk cache changes speed, not results: the loss curve matches computing the trunk every step."""

from __future__ import annotations

import pytest
import torch

from conftest import smoke_config
from sweeplab.engine.training import train


@pytest.mark.parametrize("freeze", ["trunk_except_last", "trunk"])
def test_cached_frozen_trunk_gives_the_same_loss_curve(freeze, demo_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from sweeplab.families.textbridge import task as textbridge

    original = textbridge.TextBridgeTask.training_step
    curves = {}
    for cache in (True, False):
        losses: list[float] = []

        def recording_step(self, batch, batch_idx, _original=original, _losses=losses, _cache=cache):
            loss = _original(self, batch, batch_idx)
            _losses.append(float(loss))
            assert (self.feature_cache is not None) == _cache
            return loss

        monkeypatch.setattr(textbridge.TextBridgeTask, "training_step", recording_step)
        cfg = smoke_config(
            demo_dir, f"model.freeze={freeze}", f"model.cache_frozen={cache}", "model.n_blocks=3",
            "model.dilations=[1,2,4]", "trainer.max_steps=25", "trainer.val_check_interval=100", "logger=none", "optim.lr=3e-3",
        )
        train(cfg)
        curves[cache] = torch.tensor(losses)
    assert len(curves[True]) == 25
    assert curves[True][-1] < curves[True][0]  # it trains
    torch.testing.assert_close(curves[True], curves[False], rtol=1e-5, atol=1e-6)
