"""Stop what is decided (issue 37): a study's job stops once its answer is known, under `stop.*` of the config.

- `stop.at_target`: the job stops at the validation where its monitored metric reached `report.target` (and stayed
  there `stop.confirm` more validations); its time to target is then exact and it trained no further.
- `stop.behind: k`: in a round, once some job reached the target after t seconds of training (time to target as the
  verdict reads it: samples seen / samples per second), a job of another configuration that has trained k·t seconds
  without reaching it stops. Its time to target is only known to be longer than its training time (right-censored);
  the verdict treats it as such (sweeplab.study.verdict: such a configuration can be "slower", never faster or tied).
  The baseline (configuration index 0) is never stopped this way, so every round keeps the pair the comparisons need.
  Nor is a job whose metric is better than the leader's at the same samples seen (the leader posts its curve at
  every validation, past its target too): slower to the target but perhaps better in quality, it keeps training
  (two objectives). Nor is a job that reached the target once and dipped below it again: its time to target is
  known, and it is not behind.
- `stop.quality_round` (default true): round 0 is never stopped, so every configuration's quality is measured on one
  job that trained to its last step (the report's quality column and its Pareto front read it); a configuration that
  learns more slowly but ends better is then on the front even when its later jobs are stopped.

The round's leader time is posted on a small board in the sweep's directory (`stop/round-<r>.json`, written
atomically under a file lock), so jobs of one round share it whether they run one after the other or side by side.
Each stop is recorded on the job's run (core/schema.py: `stop_reason`, `stop_step`); the job ends FINISHED.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import lightning as L
from annotated_types import Ge, Gt

from sweeplab.core import channels, schema
from sweeplab.core.errors import ConfigError
from sweeplab.core.files import write_text_atomic

log = logging.getLogger(__name__)

Reason = Literal["target", "behind"]


@dataclass(frozen=True)
class StopConfig:
    """The bounds live in the annotations, so engine/settings.py refuses a wrong value before the heavy imports
    (a `__post_init__` check answered only after torch and Lightning loaded: 8.6 CPU-s for stop.confirm=-1)."""

    at_target: bool = False  # stop once the monitored metric reached report.target
    confirm: Annotated[int, Ge(0)] = 0  # more validations that must stay at the target before the job stops
    behind: Annotated[float, Gt(1)] | None = None  # k > 1: stop a job k × the round leader's time to target without reaching it
    quality_round: bool = True  # round 0 trains every configuration to its last step (its quality measured once)

    @property
    def enabled(self) -> bool:
        return self.at_target or self.behind is not None


def check(stop: StopConfig, target: Any, backend: str) -> float | None:
    """The target the rule stops at (None when stopping is off); one line where the settings cannot work."""
    if not stop.enabled:
        return None
    if target is None:
        raise ConfigError("stop", "at_target and behind need report.target: the quality the study asks "
                                  "for must be known while the jobs train")
    if backend == "mlx":
        raise ConfigError("stop", "stop.at_target and stop.behind are not built for backend=mlx yet")
    try:
        return float(target)
    except (TypeError, ValueError):
        raise ConfigError(schema.TARGET_TAG, f"expected a number, got {target!r}") from None


@dataclass
class RoundBoard:
    """The leader's time to target in one round of a study, shared by its jobs through a file."""

    path: Path

    @classmethod
    def of_this_job(cls, sweep_dir: str | Path | None) -> RoundBoard | None:
        """The board of this job's round (None outside a replicated sweep)."""
        round_ = os.environ.get(channels.ROUND_ENV, "")
        if sweep_dir is None or not round_.isdigit():
            return None
        return cls(Path(sweep_dir) / "stop" / f"round-{round_}.json")

    def _read(self) -> dict:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}

    def leader_seconds(self) -> float | None:
        seconds = self._read().get("leader_seconds")
        return float(seconds) if isinstance(seconds, (int, float)) else None

    def leader_curve(self) -> list[tuple[float, float]]:
        """The leader's (samples seen, metric) up to its target."""
        return [(float(s), float(v)) for s, v in self._read().get("curve", [])]

    def extend(self, config_index: str, curve: list[tuple[float, float]]) -> None:
        """The leader's curve past its target, so that a slower job is compared with it at equal samples seen there
        too (a job that is not the leader changes nothing)."""
        from filelock import FileLock

        with FileLock(str(self.path) + ".lock"):
            posted = self._read()
            if posted.get("configuration") == config_index:
                write_text_atomic(self.path, json.dumps({**posted, "curve": list(curve)}))

    def post(self, seconds: float, config_index: str, curve: list[tuple[float, float]] = ()) -> None:
        """Record a job's time to target and its curve so far; the board keeps the shortest time's."""
        from filelock import FileLock

        self.path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.path) + ".lock"):
            best = self.leader_seconds()
            if best is None or seconds < best:
                write_text_atomic(self.path, json.dumps({"leader_seconds": seconds, "configuration": config_index,
                                                         "curve": list(curve)}))


@dataclass
class StopRule:
    """The decision at each validation; no Lightning in here (the MLX loop can call it too)."""

    stop: StopConfig
    target: float
    mode: str  # "max" | "min"
    board: RoundBoard | None
    is_baseline: bool
    config_index: str = ""
    measures_quality: bool = False  # round 0 under stop.quality_round: never stopped
    _reached: int = 0  # consecutive validations at the target
    _ever_reached: bool = False
    _posted: bool = False
    _curve: list = dataclasses.field(default_factory=list)  # (samples seen, value) at each validation

    @classmethod
    def for_this_job(cls, stop: StopConfig, target: float, mode: str, sweep_dir: str | Path | None) -> StopRule:
        """The rule of the job this process runs: its round's board, its place in the grid (index 0, or none: the
        baseline), and whether it is in the quality round (round 0 under stop.quality_round)."""
        index = os.environ.get(channels.CONFIG_INDEX_ENV, "")
        in_quality_round = stop.quality_round and os.environ.get(channels.ROUND_ENV, "") == "0"
        return cls(stop, target, mode, RoundBoard.of_this_job(sweep_dir), is_baseline=index in ("", "0"),
                   config_index=index, measures_quality=in_quality_round)

    def reached(self, value: float) -> bool:
        return math.isfinite(value) and (value >= self.target if self.mode == "max" else value <= self.target)

    def at_validation(self, value: float, training_seconds: float | None, samples_seen: float = 0.0) -> Reason | None:
        """The reason to stop now, or None. `training_seconds`: samples seen ÷ samples per second so far."""
        self._curve.append((samples_seen, value))
        if self._posted and self.board is not None:
            self.board.extend(self.config_index, self._curve)
        if self.reached(value):
            self._reached += 1
            self._ever_reached = True
            if not self._posted and self.board is not None and training_seconds is not None:
                self.board.post(training_seconds, self.config_index, self._curve)
                self._posted = True
            if self.stop.at_target and self._reached > self.stop.confirm and not self.measures_quality:
                return "target"
            return None
        self._reached = 0
        if (self.stop.behind is None or self.is_baseline or self.measures_quality or self._ever_reached
                or self.board is None or training_seconds is None):
            return None
        leader = self.board.leader_seconds()
        if leader is None or training_seconds <= self.stop.behind * leader:
            return None
        if self._better_than_the_leader_at(samples_seen, value):
            return None  # slower to the target, but perhaps better in quality: not clearly lost
        return "behind"

    def _better_than_the_leader_at(self, samples: float, value: float) -> bool:
        """This job's metric beats the leader's at the same samples seen (linear between the leader's validations;
        past its last one, its last value)."""
        curve = sorted(self.board.leader_curve()) if self.board is not None else []
        if not curve or not math.isfinite(value):
            return False
        theirs = curve[-1][1]
        for (s0, v0), (s1, v1) in zip(curve, curve[1:]):
            if s0 <= samples <= s1:
                theirs = v0 if s1 == s0 else v0 + (v1 - v0) * (samples - s0) / (s1 - s0)
                break
        if samples < curve[0][0]:
            theirs = curve[0][1]
        return value > theirs if self.mode == "max" else value < theirs


class StopWhatIsDecided(L.Callback):
    """Lightning's side of StopRule: after each validation, stop the fit with the reason on the run."""

    def __init__(self, rule: StopRule, monitor: str, timer, record, samples_per_step: int) -> None:
        self.rule, self.monitor, self.timer, self.record = rule, monitor, timer, record  # record(tags: dict[str, str])
        self.samples_per_step = samples_per_step
        self.reason: str | None = None  # why it stopped the fit ("target" | "behind"), once it did

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or self.monitor not in trainer.callback_metrics:
            return
        value = float(trainer.callback_metrics[self.monitor])
        step_time = self.timer.step_time_so_far()  # steps × step time = samples seen ÷ samples per second
        samples = trainer.global_step * self.samples_per_step
        reason = self.rule.at_validation(value, trainer.global_step * step_time if step_time else None, samples)
        if reason is None:
            return
        log.info("stop: %s after %d steps (%s %.4g, target %.4g)", "target reached" if reason == "target"
                 else "behind the round's leader", trainer.global_step, self.monitor, value, self.rule.target)
        self.record({schema.STOP_REASON_TAG: reason, schema.STOP_STEP_TAG: str(trainer.global_step)})
        self.reason = reason
        trainer.should_stop = True
