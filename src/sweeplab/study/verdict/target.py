"""Time to target: when a job first reached the target (interpolated between validations), and the default target."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from sweeplab.study.verdict.records import Job, JobAtTarget, Mode, ValidationPoint


def reaches(value: float, target: float, mode: Mode) -> bool:
    return value >= target if mode == "max" else value <= target


def job_at_target(job: Job, target: float, mode: Mode) -> JobAtTarget:
    """When `job` first reached `target`: linear between the validation before and the first at or beyond it."""
    points = job.validation_points()
    previous = ValidationPoint(0.0, math.nan, 0.0)
    for point in points:
        if reaches(point.value, target, mode):
            samples, wall = _interpolate_crossing(previous, point, target)
            time_to_target = samples / job.samples_per_sec
            return JobAtTarget(job, samples, (previous.samples_seen, point.samples_seen), time_to_target, wall)
        previous = point
    last_seen = points[-1].samples_seen if points else 0.0
    wall = math.inf if any(p.wall_seconds is not None for p in points) else None
    bound = job.censored_samples / job.samples_per_sec if job.censored_samples else None
    return JobAtTarget(job, math.inf, (last_seen, math.inf), math.inf, wall, bound)


def _interpolate_crossing(before: ValidationPoint, at: ValidationPoint, target: float) -> tuple[float, float | None]:
    """Samples (and wall seconds) where the straight line between two validations meets the target. Before the
    first validation nothing was measured: the first point itself is used (an upper bound)."""
    if math.isnan(before.value) or at.value == before.value:
        return at.samples_seen, at.wall_seconds
    fraction = (target - before.value) / (at.value - before.value)
    samples = before.samples_seen + fraction * (at.samples_seen - before.samples_seen)
    if at.wall_seconds is None or before.wall_seconds is None:
        return samples, at.wall_seconds
    return samples, before.wall_seconds + fraction * (at.wall_seconds - before.wall_seconds)


def default_target(final_by_config: Mapping[str, Sequence[float]], candidates: Iterable[str], mode: Mode,
                   tolerance: float = 0.0) -> float:
    """The worst kept (best) metric of any job of `candidates` (the configurations that keep quality), less the
    quality tolerance: a quality every one of their jobs reached at some validation, so each has a finite time to it
    and every round gives a pair. The best, not the last: a metric that overfits (val/ppl rising after its best)
    would otherwise set a target every job passed on its way down, and judge each by a value no one exports.

    Less the tolerance: the worst job reaches its own best where its curve has flattened, and a time to a point on
    the flat part is the metric's noise divided by a slope near zero. On simulated studies whose validations carry
    0.002 of noise, a true 2x was named at 5 replicates in 30 % of studies at the worst best itself and in
    99 % at the worst best less textbridge's 0.01 (docs/verdict.md); a configuration within the tolerance of that
    quality keeps quality by the study's own definition.

    Not the worst *median* final metric: that one is, by construction, reached by only about half the replicates of
    the configuration that sets it, and a round where one side never reaches the target opens that comparison's
    interval to 0 or ∞: with 3-5 replicates every verdict was then a tie (issue 26's first make sweep)."""
    finals = [v for c in candidates for v in final_by_config[c]]
    if not finals:
        raise ValueError("no final metric to derive a target from: pass target=")
    return min(finals) - tolerance if mode == "max" else max(finals) + tolerance
