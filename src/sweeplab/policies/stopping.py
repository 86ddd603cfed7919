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
Each stop is recorded on the job's run (core/records.py JobRun: `stop_reason`, `stop_step`); the job ends FINISHED.

Each rule owns its settings: a rule class declares its `stop.*` keys with their types, bounds and defaults
(`settings`), whether they turn it on (`is_on`), whether it needs the target, and how it is built for a job (`of`);
`RULES` lists the rules. The `stop` group's dataclass (`StopConfig`), the early config check (engine/settings.py,
`accepted`), "which rules are on" (`StopConfig.rules_on`, `enabled`, `needs_target`: the jobs and the Optuna search
ask it) and the job's rules (`rules_of`) are all derived from that list, so a new rule is one class and one entry.

Plain Python, as the checkpoint policy is (a contract: no Lightning, torch or MLX): both fit loops ask StopRule;
Lightning's side is callbacks/stop_rules.py's StopWhatIsDecided.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Protocol

from annotated_types import Ge, Gt

from sweeplab.core import channels
from sweeplab.core.errors import ConfigError
from sweeplab.core.files import write_text_atomic
from sweeplab.core.place import JobPlace
from sweeplab.core.records import SWEEP


def check(stop: Any, target: Any, backend: str) -> float | None:
    """The target the rules stop at (None when no rule needs one); one line where the settings cannot work."""
    if not stop.enabled:
        return None
    if backend == "mlx":
        raise ConfigError("stop", "stop.* is not built for backend=mlx yet")
    if not stop.needs_target:
        return None
    if target is None:
        raise ConfigError("stop", "at_target and behind need report.target: the quality the study asks "
                                  "for must be known while the jobs train (stop.patience needs none)")
    try:
        return float(target)
    except (TypeError, ValueError):
        raise ConfigError(SWEEP.target, f"expected a number, got {target!r}") from None


@dataclass
class RoundBoard:
    """The leader's time to target in one round of a study, shared by its jobs through a file."""

    path: Path

    @classmethod
    def of_this_job(cls, sweep_dir: str | Path | None, place: JobPlace) -> RoundBoard | None:
        """The board of this job's round (None outside a replicated sweep)."""
        if sweep_dir is None or place.round is None or place.round < 0:
            return None
        return cls(Path(sweep_dir) / channels.ROUND_BOARD_FILE.format(round=place.round))

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


@dataclass(frozen=True)
class Setting:
    """One `stop.*` key a rule owns: its type and bounds (`annotated_types`, which engine/settings.py checks before
    any import and core.config.bind when the job is planned), its default (conf/train.yaml's `stop:` lists the same)
    and what it means."""

    key: str
    annotation: Any
    default: Any
    meaning: str


@dataclass(frozen=True)
class Place:
    """What a rule may need of the job it stops: the target (None when the study asks none), the metric's direction
    ("max" | "min"), its round's board, its configuration's index in the grid and whether it is the baseline's."""

    target: float | None
    mode: str
    board: RoundBoard | None = None
    config_index: str = ""
    is_baseline: bool = False


class Rule(Protocol):
    """One stop rule (one class each, the shape of optuna's pruners): at each validation, whether the job stops now.
    Its state travels in the job's checkpoints (`state_dict` / `load_state_dict`), so a resumed job keeps counting
    where it was. The class declares its settings and when they turn it on; `RULES` lists the classes."""

    settings: ClassVar[tuple[Setting, ...]]  # its `stop.*` keys
    needs_target: ClassVar[bool]  # it cannot work without report.target
    reason: str  # what the job's run records as stop_reason
    spares_the_quality_round: bool  # a rule about the target: never stops a job of round 0 (stop.quality_round)

    @staticmethod
    def is_on(stop: Any) -> bool: ...  # whether the `stop` group's values turn it on

    @classmethod
    def of(cls, stop: Any, place: Place) -> Rule: ...  # the rule of one job

    def at_validation(self, seen: Seen) -> bool: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class Seen:
    """One validation as every rule sees it. `training_seconds`: samples seen ÷ samples per second so far (None
    before the timer has a step time)."""

    value: float
    training_seconds: float | None
    samples_seen: float


def _better(value: float, than: float, mode: str) -> bool:
    return value > than if mode == "max" else value < than


@dataclass
class AtTarget:
    """stop.at_target: the metric reached the target and stayed there `confirm` more validations."""

    settings: ClassVar = (
        Setting("at_target", bool, False, "stop once the monitored metric reached report.target"),
        Setting("confirm", Annotated[int, Ge(0)], 0, "more validations that must stay at the target before the job "
                                                      "stops"))
    needs_target: ClassVar = True

    target: float
    mode: str
    confirm: int = 0
    reason: str = "target"
    spares_the_quality_round: bool = True
    _reached: int = 0  # consecutive validations at the target

    @staticmethod
    def is_on(stop: Any) -> bool:
        return stop.at_target

    @classmethod
    def of(cls, stop: Any, place: Place) -> AtTarget:
        return cls(place.target, place.mode, stop.confirm)

    def at_validation(self, seen: Seen) -> bool:
        reached = math.isfinite(seen.value) and not _better(self.target, seen.value, self.mode)
        self._reached = self._reached + 1 if reached else 0
        return self._reached > self.confirm

    def state_dict(self) -> dict[str, Any]:
        return {"reached": self._reached}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._reached = int(state.get("reached", 0))


@dataclass
class Behind:
    """stop.behind: k × the round leader's time to target without reaching it, and no better than the leader at the
    same samples seen (the module's docstring). Every job posts its curve on the round's board once it reaches the
    target, and keeps extending it while it leads. The baseline's jobs are never stopped this way."""

    settings: ClassVar = (
        Setting("behind", Annotated[float, Gt(1)] | None, None, "k > 1: stop a job k x the round leader's time to "
                                                                 "target without reaching it"),)
    needs_target: ClassVar = True

    k: float
    target: float
    mode: str
    board: RoundBoard | None
    config_index: str = ""
    is_baseline: bool = False
    reason: str = "behind"
    spares_the_quality_round: bool = True
    _ever_reached: bool = False
    _posted: bool = False
    _curve: list = dataclasses.field(default_factory=list)  # (samples seen, value) at each validation

    @staticmethod
    def is_on(stop: Any) -> bool:
        return stop.behind is not None

    @classmethod
    def of(cls, stop: Any, place: Place) -> Behind:
        return cls(stop.behind, place.target, place.mode, place.board, place.config_index, place.is_baseline)

    def at_validation(self, seen: Seen) -> bool:
        self._curve.append((seen.samples_seen, seen.value))
        if self.board is None:
            return False
        if self._posted:
            self.board.extend(self.config_index, self._curve)
        if math.isfinite(seen.value) and not _better(self.target, seen.value, self.mode):
            self._ever_reached = True
            if not self._posted and seen.training_seconds is not None:
                self.board.post(seen.training_seconds, self.config_index, self._curve)
                self._posted = True
            return False
        if self.is_baseline or self._ever_reached or seen.training_seconds is None:
            return False
        leader = self.board.leader_seconds()
        if leader is None or seen.training_seconds <= self.k * leader:
            return False
        return not self._better_than_the_leader_at(seen.samples_seen, seen.value)

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
        return _better(value, theirs, self.mode)

    def state_dict(self) -> dict[str, Any]:
        return {"ever_reached": self._ever_reached, "posted": self._posted, "curve": [list(p) for p in self._curve]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._ever_reached = bool(state.get("ever_reached", False))
        self._posted = bool(state.get("posted", False))
        self._curve = [tuple(p) for p in state.get("curve", [])]


@dataclass
class NoImprovement:
    """stop.patience: `patience` validations in a row without beating the best so far by more than `min_delta` (the
    rule of Lightning's EarlyStopping; it needs no target)."""

    settings: ClassVar = (
        Setting("patience", Annotated[int, Ge(1)] | None, None, "stop after this many validations without "
                                                                 "improvement (no target)"),
        Setting("min_delta", Annotated[float, Ge(0)], 0.0, "an improvement is a gain of more than this (metric "
                                                            "units)"))
    needs_target: ClassVar = False

    patience: int
    mode: str
    min_delta: float = 0.0
    reason: str = "no_improvement"
    spares_the_quality_round: bool = False
    _best: float | None = None
    _waited: int = 0

    @staticmethod
    def is_on(stop: Any) -> bool:
        return stop.patience is not None

    @classmethod
    def of(cls, stop: Any, place: Place) -> NoImprovement:
        return cls(stop.patience, place.mode, stop.min_delta)

    def at_validation(self, seen: Seen) -> bool:
        if not math.isfinite(seen.value):
            self._waited += 1
        elif self._best is None or _better(seen.value, self._best + (self.min_delta if self.mode == "max"
                                                                      else -self.min_delta), self.mode):
            self._best, self._waited = seen.value, 0
        else:
            self._waited += 1
        return self._waited >= self.patience

    def state_dict(self) -> dict[str, Any]:
        return {"best": self._best, "waited": self._waited}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._best, self._waited = state.get("best"), int(state.get("waited", 0))


# --- the registry: every rule, and what is derived from it -----------------------------------------------------------

RULES: tuple[type, ...] = (AtTarget, Behind, NoImprovement)  # in the order they are asked; the first stop names it
SHARED = (Setting("quality_round", bool, True, "round 0 trains every configuration to its last step (its quality "
                                               "measured once)"),)


def settings_of(rules: tuple[type, ...] = RULES) -> tuple[Setting, ...]:
    """Every `stop.*` setting: each rule's, then the ones the rules share."""
    return (*(setting for rule in rules for setting in rule.settings), *SHARED)


def accepted(rules: tuple[type, ...] = RULES) -> dict[str, Any]:
    """`stop.*` key -> its annotation (type and bounds): what engine/settings.py checks the group against."""
    return {setting.key: setting.annotation for setting in settings_of(rules)}


class _Answers:
    """What every StopConfig answers from its rules (`RULES`, set on the class stop_config makes)."""

    RULES: ClassVar[tuple[type, ...]] = ()

    def rules_on(self) -> list[type]:
        """The rules these values turn on, in RULES' order."""
        return [rule for rule in self.RULES if rule.is_on(self)]

    @property
    def enabled(self) -> bool:
        return bool(self.rules_on())

    @property
    def needs_target(self) -> bool:
        return any(rule.needs_target for rule in self.rules_on())


def stop_config(rules: tuple[type, ...] = RULES) -> type:
    """The `stop` group's frozen dataclass: one field per setting of `rules` (and the shared ones) with its
    annotation and default; `enabled`, `needs_target` and `rules_on()` derived from the rules."""
    fields = [(s.key, s.annotation, dataclasses.field(default=s.default)) for s in settings_of(rules)]
    return dataclasses.make_dataclass("StopConfig", fields, bases=(_Answers,), frozen=True, namespace={
        "RULES": rules, "__module__": __name__,
        "__doc__": "The `stop.*` settings, one field per setting a rule of RULES declares (stopping.stop_config)."})


StopConfig = stop_config()


@dataclass
class StopRule:
    """The job's stop rules, built from `stop.*`; no Lightning in here (the MLX loop can call it too). The first rule
    that says stop names the reason. In the quality round (round 0 under stop.quality_round) the rules about the
    target do not stop the job, so its quality is measured at its last step (the behind rule still sees its
    validations, so it posts the round's leader)."""

    stop: Any  # a StopConfig
    target: float | None
    mode: str  # "max" | "min"
    board: RoundBoard | None = None
    is_baseline: bool = False
    config_index: str = ""
    measures_quality: bool = False
    rules: list = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.rules:
            self.rules = rules_of(self.stop, self.target, self.mode, self.board, self.config_index, self.is_baseline)

    @classmethod
    def for_this_job(cls, stop: Any, target: float | None, mode: str,
                     sweep_dir: str | Path | None, place: JobPlace) -> StopRule:
        """The rules of the job `place` says (core/place.py): its round's board, its place in the grid (index 0, or
        none: the baseline), and whether it is in the quality round."""
        in_quality_round = bool(stop.quality_round) and place.round == 0
        index = "" if place.config_index is None else str(place.config_index)
        return cls(stop, target, mode, RoundBoard.of_this_job(sweep_dir, place), is_baseline=place.is_baseline,
                   config_index=index, measures_quality=in_quality_round)

    def at_validation(self, value: float, training_seconds: float | None, samples_seen: float = 0.0) -> str | None:
        """The reason to stop now, or None. Every rule sees every validation (their states stay whole)."""
        seen = Seen(value, training_seconds, samples_seen)
        stops = [rule.reason for rule in self.rules if rule.at_validation(seen)
                 and not (self.measures_quality and rule.spares_the_quality_round)]
        return stops[0] if stops else None

    def state_dict(self) -> dict[str, Any]:
        return {rule.reason: rule.state_dict() for rule in self.rules}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for rule in self.rules:
            if rule.reason in state:
                rule.load_state_dict(state[rule.reason])


def rules_of(stop: Any, target: float | None, mode: str, board: RoundBoard | None, config_index: str = "",
             is_baseline: bool = False) -> list[Rule]:
    """The job's rule of each rule the `stop` values turn on (check() has made sure a target is there where one is
    needed)."""
    place = Place(target, mode, board, config_index, is_baseline)
    return [rule.of(stop, place) for rule in stop.rules_on() if target is not None or not rule.needs_target]
