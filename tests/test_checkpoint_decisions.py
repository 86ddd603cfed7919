"""One checkpoint policy for both fit loops (policies/checkpoints.py): Lightning's callbacks and the MLX loop,
asked about the same steps, clock and validations, decide the same last.ckpt saves and the same best checkpoints,
and both follow whatever the policy object they hold says."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from sweeplab.callbacks.checkpoints import BestCheckpoint, LastCheckpoint
from sweeplab.policies.checkpoints import CheckpointPolicy, bring_best_files

MAX_STEPS = 12
MONITOR = "val/loss"
# one fit as both loops meet it: (optimizer step, seconds since the previous step, the validation's value or None)
EVENTS = [(1, 1.0, None), (2, 1.0, math.nan), (3, 5.0, None), (4, 1.0, 0.5), (5, 4.0, None), (6, 1.0, 0.5),
          (7, 1.0, None), (8, 1.0, 0.75), (9, 9.0, None), (10, 1.0, 0.25), (11, 12.0, None), (12, 1.0, 0.125)]


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _lightning_trainer(step: int) -> SimpleNamespace:
    strategy = SimpleNamespace(broadcast=lambda decision, src=0: decision, reduce_boolean_decision=lambda d, **_: d,
                               remove_checkpoint=lambda path: None)
    return SimpleNamespace(global_step=step, max_steps=MAX_STEPS, world_size=1, strategy=strategy, ckpt_path=None)


def _lightning_decisions(policy: CheckpointPolicy, clock: _Clock, directory: Path) -> tuple[list, list]:
    """The steps at which LastCheckpoint writes last.ckpt and BestCheckpoint writes a best, for EVENTS."""
    last, best = LastCheckpoint(directory, policy), BestCheckpoint(directory, MONITOR, policy)
    bests: list[int] = []
    best._save_checkpoint = lambda trainer, path: bests.append(int(Path(path).stem.removeprefix("best-step")))
    saves = []
    last.on_train_start(None, None)
    for step, seconds, value in EVENTS:
        clock.now += seconds
        trainer = _lightning_trainer(step)
        if value is not None:
            candidates = {MONITOR: torch.tensor(value), "step": torch.tensor(step), "epoch": torch.tensor(0)}
            best._save_topk_checkpoint(trainer, candidates)
        if last._due(trainer):
            saves.append(step)
    return saves, bests


def _mlx_decisions(policy: CheckpointPolicy, clock: _Clock, directory: Path) -> tuple[list, list]:
    """The same for the MLX loop's _Loop.last_checkpoint_due and _Best.update."""
    pytest.importorskip("mlx.core")
    from sweeplab.engine.mlx_fit import _Best, _Loop

    best = _Best(directory, MONITOR, policy)
    plan = SimpleNamespace(trainer=SimpleNamespace(max_steps=MAX_STEPS))
    loop = _Loop(plan, None, None, None, None, None, None, best, None)
    bests, saves = [], []
    loop.policy.start()  # as _Loop.run does
    for step, seconds, value in EVENTS:
        clock.now += seconds
        if value is not None:
            before = best.path
            best.update(value, step, lambda at=step: {"global_step": at})
            if best.path != before:
                bests.append(step)
        if loop.last_checkpoint_due(step):
            saves.append(step)
    return saves, bests


def _both(tmp_path, make_policy) -> tuple[tuple, tuple]:
    decided = []
    for name, decide in (("lightning", _lightning_decisions), ("mlx", _mlx_decisions)):
        clock = _Clock()
        decided.append(decide(make_policy(clock), clock, tmp_path / name))
    return decided[0], decided[1]


@pytest.mark.parametrize("mode,saves,bests", [
    # every 4 steps; 10 s after the last save (at 10: 10 s after the save at 8; at 11: 12 s); the last step. A NaN is
    # a first best that any finite value beats; a tie (0.5 at 6) is not a best
    ("min", [4, 8, 10, 11, 12], [2, 4, 10, 12]),
    ("max", [4, 8, 10, 11, 12], [2, 4, 8]),
])
def test_both_loops_take_the_same_checkpoint_decisions(tmp_path, mode, saves, bests):
    lightning, mlx = _both(tmp_path, lambda clock: CheckpointPolicy(4, 10.0, mode, clock=clock))
    assert lightning == mlx == (saves, bests)


class _OddSteps(CheckpointPolicy):
    """Another rule: last.ckpt at odd steps, a new best at every validation below 0.6."""

    def last_due(self, step, max_steps, agree=None):
        return step % 2 == 1

    def is_new_best(self, value, best):
        return value is not None and value < 0.6


def test_both_loops_ask_the_policy_they_hold_for_every_decision(tmp_path):
    """Neither loop keeps a rule of its own: a policy with another rule changes both loops' decisions alike."""
    lightning, mlx = _both(tmp_path, lambda clock: _OddSteps(clock=clock))
    assert lightning == mlx == ([1, 3, 5, 7, 9, 11], [4, 6, 10, 12])


def test_the_ranks_take_one_timed_decision_and_the_clock_restarts_at_each_save():
    clock = _Clock()
    policy = CheckpointPolicy(every_n_seconds=10.0, clock=clock)
    clock.now += 10.0
    assert not policy.last_due(1, MAX_STEPS, agree=lambda timed: False)  # rank 0 says not yet: no rank saves
    assert policy.last_due(2, MAX_STEPS)
    clock.now += 9.0
    assert not policy.last_due(3, MAX_STEPS)  # 9 s since the save at step 2
    assert policy.last_due(3, -1) is False and policy.last_due(MAX_STEPS, MAX_STEPS)
    assert not CheckpointPolicy(clock=clock).last_due(5, -1)  # no trigger, no last step: never


def test_a_resumed_best_is_brought_along_and_a_missing_one_dropped(tmp_path, caplog):
    elsewhere, here = tmp_path / "first", tmp_path / "second"
    elsewhere.mkdir()
    (elsewhere / "best-step4.ckpt").write_bytes(b"weights")
    with caplog.at_level(logging.WARNING, logger="sweeplab.policies.checkpoints"):
        kept = bring_best_files({str(elsewhere / "best-step4.ckpt"): 0.5, str(elsewhere / "best-step2.ckpt"): 0.75},
                                here)
    assert kept == {here / "best-step4.ckpt": 0.5} and (here / "best-step4.ckpt").read_bytes() == b"weights"
    assert "best-step2.ckpt named by the resumed checkpoint is missing" in caplog.text
    assert CheckpointPolicy(mode="max").best_of({"a": 1.0, "b": 2.0}) == "b"
