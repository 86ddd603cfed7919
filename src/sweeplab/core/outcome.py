"""What a job did, as it returns it to the sweeper: sweeplab.train's task function returns a `JobOutcome`, Hydra hands
it back in the launch's `JobReturn.return_value` (in process, from a joblib worker, a submitit job), and the sweeper
tells its study (`Study.tell`), as Hydra's Optuna sweeper tells Optuna what `launch` returned. The rounds,
replicates=auto and the search decide from what they were told; the store is read at the end (the report) and by a
continued study (resume=true), never between rounds.

A job of a sweep carries its run as recorded (status, times, params, tags, summary metrics) and the history of its
monitored metric, the inputs of its time to target, so the study derives every figure with the formulas the report
uses (sweeplab.study.sweep). Outside a sweep, or untracked, it carries only its status and objective.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple


class Validation(NamedTuple):
    """One logged value of the monitored metric: the step it was logged at, its value, when (ms since the epoch)."""

    step: int
    value: float
    timestamp_ms: int


@dataclass(frozen=True)
class JobOutcome:
    """One job's answer to its sweeper."""

    status: str  # FINISHED | FAILED (a job that raised past its own handling returns nothing: Hydra re-raises it)
    objective: float | None = None  # the monitored metric's best (what a search optimises); None: failed or not finite
    config_index: int | None = None  # its place in the study, as the sweeper set it
    replicate: int | None = None
    round: int | None = None
    stop_reason: str | None = None  # a stop rule ended it early (policies/stopping.py): "target" | "behind" | ...
    run_id: str | None = None
    # its run as recorded, for the study's decisions between rounds (None outside a sweep or untracked)
    experiment_id: str | None = None
    start_ms: int | None = None
    end_ms: int | None = None
    params: Mapping[str, str] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)
    metrics: Mapping[str, float] = field(default_factory=dict)
    monitor: str | None = None  # the metric of `history`
    history: tuple[Validation, ...] = ()

    @property
    def finished(self) -> bool:
        return self.status == "FINISHED"

    @property
    def recorded(self) -> bool:
        """It carries its run's record (a tracked job of a sweep)."""
        return self.run_id is not None and self.experiment_id is not None

    @staticmethod
    def finite(value: float | None) -> float | None:
        """`value` as a float where it is a finite number, else None."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return None
        return float(value)
