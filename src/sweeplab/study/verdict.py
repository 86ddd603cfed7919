"""The sweep's answer from replicated jobs: per-configuration figures with intervals, and a verdict (issue 26).

Which configuration reaches the target quality fastest, by how much, and which ones the noise cannot separate.
Pure: plain dataclasses and numpy, no engine. The sweeper, the MLflow wiring and the report build `Job` records from
their runs and call `summarize`; `plan_replicates` tells `replicates=auto` where more replicates would decide something.

Methods, in short (docs/verdict.md has the reasoning and the measured coverage):
- Speed comparisons are paired: a configuration's samples/s is compared with the baseline's in the same round on the
  same host (`pair_by="round"`; `"host"` on a cluster), as the log of their ratio, so a machine drift that weighs on a
  whole round cancels.
- Intervals are Student-t intervals on the mean of the paired log-ratios (ratios) or of the paired differences (final
  metric), exponentiated where on logs. With 3-5 replicates the percentile bootstrap undercovers; t does not.
- The comparisons with the baseline are simultaneous (Bonferroni): the two speed columns (speedup in samples/s and
  speedup to target) of the K compared configurations are one family of 2K intervals, each at level
  1 - (1 - confidence) / 2K, so the chance that any of them misses is at most 1 - confidence; the K quality
  differences are a family of their own. Every "faster", "slower" and "not tied" the verdict says is read from
  those intervals.
- Samples to target: linear interpolation between the last validation point before the target and the first at or
  beyond it; a job that never reaches it counts as infinitely slow.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal

import numpy as np

Mode = Literal["max", "min"]
PairBy = Literal["round", "host"]
Quality = Literal["baseline", "keeps", "unclear", "loses", "unknown"]
VerdictKind = Literal["fastest", "tie", "undecided", "no verdict"]

CONFIDENCE = 0.95


# ---------------------------------------------------------------------------------------------------------------------
# Records in


@dataclass(frozen=True)
class ValidationPoint:
    """One validation of a job: the training samples seen before it, the monitored metric's value, and (optional) the
    job's wall-clock seconds since its start, for the wall time to target reported beside the time to target."""

    samples_seen: float
    value: float
    wall_seconds: float | None = None


@dataclass(frozen=True)
class Job:
    """One finished training job of a sweep, as the verdict needs it.

    config: the configuration's name (every job of one configuration has the same one).
    replicate: r, the job ran with seed `seed + r` (the same r in every configuration: same data order and init).
    round: the pass over the configurations this job ran in (round r runs each configuration once); jobs of the same
        round on the same host are paired. Usually equal to `replicate`; a resumed study may run a replicate later.
    samples_per_sec: training throughput with validation and checkpoint pauses left out.
    final_metric: the monitored metric at the end of training (None: the job has none, e.g. it failed).
    curve: the validation points, in any order (tuples `(samples_seen, value[, wall_seconds])` are accepted).
    host: where it ran (None: one machine). Pairs never cross hosts.
    concurrent_jobs: how many jobs shared the host (or its GPU) while this one was timed; above 1 its timing is
        disturbed by the others, and the verdict says so.
    censored_samples: the samples seen when the job was stopped behind its round's leader without reaching the
        target (engine/stopping.py, `stop.behind`); its time to target is then only known to be longer than that.
    """

    config: str
    replicate: int
    round: int
    samples_per_sec: float
    final_metric: float | None
    curve: Sequence[ValidationPoint | tuple[float, ...]] = ()
    host: str | None = None
    concurrent_jobs: int = 1
    censored_samples: float | None = None

    def validation_points(self) -> list[ValidationPoint]:
        """The curve as ValidationPoints, in the order training saw them."""
        points = [p if isinstance(p, ValidationPoint) else ValidationPoint(*p) for p in self.curve]
        return sorted(points, key=lambda p: p.samples_seen)


# ---------------------------------------------------------------------------------------------------------------------
# Results out


@dataclass(frozen=True)
class Interval:
    """[low, high] at confidence `level`. No bound on a side reads as 0 or -inf below, inf above."""

    low: float
    high: float
    level: float

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def overlaps(self, other: Interval) -> bool:
        return self.low <= other.high and other.low <= self.high


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its interval and the number of values (jobs, or pairs for a comparison) behind it."""

    point: float
    interval: Interval
    n: int
    # a speedup to target where some of the configuration's times are lower bounds (jobs stopped behind): the point
    # and the interval are then upper bounds of the true speedup, good for "slower", never for "faster" or "tied"
    bounded: bool = False


@dataclass(frozen=True)
class JobAtTarget:
    """When one job reached the target. `samples_to_target` is interpolated inside `bracket` (the samples of the last
    validation before the target and of the first at or beyond it); inf with bracket (last samples seen, inf) when
    the job never reached it. At the first validation point the bracket is (0, that point) and the point is used."""

    job: Job
    samples_to_target: float
    bracket: tuple[float, float]
    time_to_target: float
    wall_time_to_target: float | None
    time_bound: float | None = None  # a job stopped behind: its time to target is longer than this (seconds)


@dataclass(frozen=True)
class ConfigSummary:
    """One configuration's answers. Medians over its jobs with 95 % intervals (not simultaneous: descriptive);
    the comparisons with the baseline carry the sweep's simultaneous level (`Interval.level`).

    speedup: its samples/s ÷ the baseline's, paired. speedup_to_target: the baseline's time to target ÷ its own,
    paired (above 1: it gets there sooner). quality_difference: its final metric − the baseline's, paired, in the
    metric's units. quality: "keeps" (the whole interval within tolerance of the baseline), "loses" (the whole
    interval beyond it), "unclear" (straddles), "baseline", or "unknown" (no final metrics).
    within_tolerance: the point estimate of the quality difference is within tolerance (descriptive: candidacy for
    the verdict and the default target read `quality`, where only "loses" and "unknown" leave a configuration out).
    """

    config: str
    jobs: int
    reached_target: int
    samples_per_sec: Estimate
    samples_to_target: Estimate
    time_to_target: Estimate
    wall_time_to_target: Estimate | None
    final_metric: Estimate
    speedup: Estimate
    speedup_to_target: Estimate
    quality_difference: Estimate
    quality: Quality
    within_tolerance: bool
    validation_resolution: float


@dataclass(frozen=True)
class Verdict:
    """The sweep's answer. kind: "fastest" (one configuration), "tie" (`fastest` names several that the intervals
    cannot order; they are not ranked), "undecided" (the one that could be fastest has a quality interval that
    straddles the tolerance: `fastest` is empty, `reason` names it), "no verdict" (`reason` says why). `lines`: its
    text, first line first. caveat: why this study cannot carry a verdict at all (fewer than 3 replicates, a
    debug=smoke budget), the first line when set; "" otherwise."""

    kind: VerdictKind
    fastest: tuple[str, ...]
    speedup_to_target: Mapping[str, Estimate]
    undetermined: tuple[str, ...]
    reason: str
    lines: tuple[str, ...]
    caveat: str = ""

    def text(self) -> str:
        return "\n".join(self.lines)

    @property
    def headline(self) -> str:
        """The line that says the answer (the first one after the caveat, if any)."""
        return self.lines[1] if self.caveat and len(self.lines) > 1 else self.lines[0]


@dataclass(frozen=True)
class SweepSummary:
    """Everything `summarize` found. `comparisons`: how many configurations were compared with the baseline (K);
    `speed_level`: the level of each speedup and speedup-to-target interval (a family of 2K); `quality_level`: that
    of each quality difference (a family of K)."""

    baseline: str
    metric_name: str
    mode: Mode
    target: float
    target_source: str
    quality_tolerance: float
    confidence: float
    comparisons: int
    speed_level: float
    quality_level: float
    pair_by: PairBy
    configs: tuple[ConfigSummary, ...]
    jobs_at_target: tuple[JobAtTarget, ...]
    verdict: Verdict
    notes: tuple[str, ...]
    tolerance_source: str = ""
    names: Mapping[str, str] = field(default_factory=dict)  # configuration -> the short label its lines use

    def config(self, name: str) -> ConfigSummary:
        return next(c for c in self.configs if c.config == name)


# ---------------------------------------------------------------------------------------------------------------------
# Student's t without scipy (numpy has no t quantile; scipy is not a dependency)


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes §6.4)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    fraction = d
    for m in range(1, 500):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            fraction *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return fraction


def _regularized_incomplete_beta(a: float, b: float, x: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    # The fraction converges fast on this side of the mean; the other side goes through the symmetry I_x = 1 - I_1-x.
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, 1.0 - x) / b


def student_t_cdf(t: float, df: float) -> float:
    """P(T ≤ t) for Student's t with `df` degrees of freedom."""
    tail = 0.5 * _regularized_incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


@lru_cache(maxsize=1024)
def student_t_quantile(p: float, df: float) -> float:
    """The t with P(T ≤ t) = p, by bisection on the CDF (to ~1e-12; cached: a sweep asks for few distinct ones)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if p < 0.5:
        return -student_t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while student_t_cdf(high, df) < p:
        low, high = high, high * 2.0
    for _ in range(100):
        middle = 0.5 * (low + high)
        low, high = (middle, high) if student_t_cdf(middle, df) < p else (low, middle)
        if high - low < 1e-12 * max(1.0, high):
            break
    return 0.5 * (low + high)


# ---------------------------------------------------------------------------------------------------------------------
# Intervals


def mean_interval(values: np.ndarray, level: float = CONFIDENCE) -> tuple[np.ndarray, np.ndarray]:
    """Student-t interval for the mean along the last axis (vectorised: one interval per row). Fewer than two values:
    (-inf, inf). Identical values give a zero-width interval: nothing in the data says they could differ."""
    values = np.asarray(values, dtype=float)
    n = values.shape[-1]
    if n < 2:
        shape = values.shape[:-1]
        return np.full(shape, -np.inf), np.full(shape, np.inf)
    mean = values.mean(axis=-1)
    # Squared deviations summed directly: np.std's generality costs more than the rest of a sweep's summary.
    standard_error = np.sqrt(((values - mean[..., None]) ** 2).sum(axis=-1) / (n - 1) / n)
    half_width = student_t_quantile(0.5 + level / 2.0, n - 1) * standard_error
    return mean - half_width, mean + half_width


def median_of_positive(values: Sequence[float], level: float = CONFIDENCE) -> Estimate:
    """Median of positive values (samples/s, samples or time to target) with the t interval on their logs: the
    interval of a log-symmetric spread's median. Infinite values (never reached the target) count in the median;
    the interval then comes from the finite ones and reaches up to inf, and with fewer than two finite values it is
    (0, inf)."""
    values = np.asarray(values, dtype=float)
    if values.size == 0:
        return Estimate(math.nan, Interval(0.0, math.inf, level), 0)
    finite = values[np.isfinite(values)]
    low, high = 0.0, math.inf
    if finite.size >= 2:
        log_low, log_high = mean_interval(np.log(finite), level)
        low, high = float(np.exp(log_low)), float(np.exp(log_high))
    if finite.size < values.size:
        high = math.inf
    return Estimate(float(np.median(values)), Interval(low, high, level), int(values.size))


def median_of_values(values: Sequence[float], level: float = CONFIDENCE) -> Estimate:
    """Median of a metric's values (any sign) with the t interval of their mean."""
    values = np.asarray(values, dtype=float)
    if values.size == 0:
        return Estimate(math.nan, Interval(-math.inf, math.inf, level), 0)
    low, high = mean_interval(values, level)
    return Estimate(float(np.median(values)), Interval(float(low), float(high), level), int(values.size))


def ratio_from_log_ratios(log_ratios: Sequence[float], level: float) -> Estimate:
    """A ratio from paired log-ratios: the geometric mean (exp of their mean) inside the exp of their t interval.

    ±inf log-ratios (one side of a pair never reached the target) open that side of the interval (0 or inf) and the
    interval of the rest is used for the other side (that rest leaves out the pairs that pulled that way, so the
    side it gives is wider than it would be: conservative); the point is then the median ratio. NaN (neither side
    reached) pairs are left out: they say nothing about the ratio."""
    log_ratios = np.asarray(log_ratios, dtype=float)
    log_ratios = log_ratios[~np.isnan(log_ratios)]
    if log_ratios.size == 0:
        return Estimate(math.nan, Interval(0.0, math.inf, level), 0)
    finite = log_ratios[np.isfinite(log_ratios)]
    with np.errstate(invalid="ignore"):  # as many -inf as +inf in the middle: NaN, no ratio (the verdict says so)
        point = np.mean(finite) if finite.size == log_ratios.size else np.median(log_ratios)
    low, high = mean_interval(finite, level) if finite.size >= 2 else (-np.inf, np.inf)
    low = -np.inf if np.any(log_ratios == -np.inf) else low
    high = np.inf if np.any(log_ratios == np.inf) else high
    return Estimate(float(np.exp(point)), Interval(float(np.exp(low)), float(np.exp(high)), level), int(log_ratios.size))


def difference_from_pairs(differences: Sequence[float], level: float) -> Estimate:
    """A paired difference: the mean difference and its t interval."""
    differences = np.asarray(differences, dtype=float)
    if differences.size == 0:
        return Estimate(math.nan, Interval(-math.inf, math.inf, level), 0)
    low, high = mean_interval(differences, level)
    return Estimate(float(differences.mean()), Interval(float(low), float(high), level), int(differences.size))


def simultaneous_level(confidence: float, comparisons: int) -> float:
    """Each interval's level so that all `comparisons` of them cover together with at least `confidence`
    (Bonferroni)."""
    return 1.0 - (1.0 - confidence) / max(comparisons, 1)


# ---------------------------------------------------------------------------------------------------------------------
# Time to target


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


def default_target(final_by_config: Mapping[str, Sequence[float]], candidates: Iterable[str], mode: Mode) -> float:
    """The worst final metric of any job of `candidates` (the configurations that keep quality): a quality every one
    of their jobs had reached by its last validation, so each has a finite time to it and every round gives a pair.

    Not the worst *median* final metric: that one is, by construction, reached by only about half the replicates of
    the configuration that sets it, and a round where one side never reaches the target opens that comparison's
    interval to 0 or ∞: with 3-5 replicates every verdict was then a tie (issue 26's first make sweep)."""
    finals = [v for c in candidates for v in final_by_config[c]]
    if not finals:
        raise ValueError("no final metric to derive a target from: pass target=")
    return min(finals) if mode == "max" else max(finals)


# ---------------------------------------------------------------------------------------------------------------------
# Pairing


def _pair_key(job: Job, pair_by: PairBy) -> tuple:
    return (job.host,) if pair_by == "host" else (job.host, job.round)


def _by_pair_key(items: Iterable[tuple[Job, float]], pair_by: PairBy) -> dict[tuple, float]:
    """One value per pair key: the mean of the values of a configuration's jobs that share it (several only with
    pair_by="host", or a round run twice)."""
    grouped: dict[tuple, list[float]] = defaultdict(list)
    for job, value in items:
        grouped[_pair_key(job, pair_by)].append(value)
    return {key: math.fsum(values) / len(values) for key, values in grouped.items()}


def paired_values(
    ours: Iterable[tuple[Job, float]], theirs: Iterable[tuple[Job, float]], pair_by: PairBy
) -> list[tuple[float, float]]:
    """(our value, their value) for every pair key both sides have, values combined within a key first
    (see _by_pair_key). A key one side lacks (a missing round) gives no pair."""
    ours_by_key, theirs_by_key = _by_pair_key(ours, pair_by), _by_pair_key(theirs, pair_by)
    return [(ours_by_key[key], theirs_by_key[key]) for key in sorted(ours_by_key.keys() & theirs_by_key.keys(), key=repr)]


def _log_ratios(pairs: Sequence[tuple[float, float]]) -> np.ndarray:
    """log(numerator) − log(denominator) per pair: inf − inf (both never reached) is NaN, dropped later."""
    return np.array(
        [math.log(a) - math.log(b) if math.isfinite(a) and math.isfinite(b) else _infinite_log_ratio(a, b)
         for a, b in pairs],
        dtype=float,
    )


def _infinite_log_ratio(numerator: float, denominator: float) -> float:
    if math.isinf(numerator) and math.isinf(denominator):
        return math.nan
    return math.inf if math.isinf(numerator) else -math.inf


# ---------------------------------------------------------------------------------------------------------------------
# Per-configuration answers

# A validation bracket wider than this share of the samples to target: the interpolation carries much of the answer.
COARSE_VALIDATION = 0.25


def summarize(
    jobs: Iterable[Job],
    *,
    baseline: str,
    mode: Mode = "max",
    target: float | None = None,
    quality_tolerance: float | None = None,
    tolerance_source: str = "",
    confidence: float = CONFIDENCE,
    pair_by: PairBy = "round",
    metric_name: str = "metric",
    adjust_for_multiple_comparisons: bool = True,
    smoke_budget: bool = False,
    names: Mapping[str, str] | None = None,
) -> SweepSummary:
    """Per-configuration answers and the verdict from a sweep's jobs.

    baseline: the configuration every other is compared with. mode: "max" if a higher metric is better.
    target: the metric value to reach (None: the worst final metric of any job of the configurations that could keep
    quality, those whose quality is not "loses": default_target).
    quality_tolerance: how much worse than the baseline's final metric still keeps quality, in the metric's units;
    None: derived from the replicates' own spread (derived_tolerance). tolerance_source: where a given tolerance
    came from, in words ("the textbridge family's default"), said in the verdict.
    smoke_budget: the jobs ran with a debug=smoke budget: the verdict's first line says the study cannot carry one.
    names: configuration -> the short label its verdict lines and notes use (the tables' `bs=64 α=0.7`); the
    summary's records keep the configurations' own names.
    adjust_for_multiple_comparisons: False only to see what the Bonferroni adjustment buys (tests, docs).
    """
    by_config = _group_by_config(jobs, baseline)
    if quality_tolerance is None:
        quality_tolerance = derived_tolerance(by_config[baseline])
        tolerance_source = (f"derived: the standard deviation of the baseline's final {metric_name} over its "
                            "replicates (a difference smaller than seed-to-seed noise is no loss of quality)")
    elif not tolerance_source:
        tolerance_source = "given"
    comparisons = len(by_config) - 1
    # Both speed columns can say "faster": one family. Quality claims are of another kind: a family of their own.
    speed_level = simultaneous_level(confidence, 2 * comparisons) if adjust_for_multiple_comparisons else confidence
    quality_level = simultaneous_level(confidence, comparisons) if adjust_for_multiple_comparisons else confidence
    quality = {
        name: _quality(name_jobs, by_config[baseline], name == baseline, mode, quality_tolerance, quality_level,
                       pair_by)
        for name, name_jobs in by_config.items()
    }
    target, target_source = _choose_target(by_config, quality, target, mode, metric_name, _namer(names))
    at_target = {name: [job_at_target(j, target, mode) for j in name_jobs] for name, name_jobs in by_config.items()}
    configs = tuple(
        _config_summary(name, at_target[name], at_target[baseline], quality[name], name == baseline,
                        confidence, speed_level, pair_by)
        for name in by_config
    )
    target_text = f"{metric_name} {'≥' if mode == 'max' else '≤'} {target:.4g}"
    tolerance_text = f"quality tolerance: {quality_tolerance:.4g} {metric_name} worse than the baseline ({tolerance_source})"
    verdict = decide(configs, baseline, target_text, target_source, tolerance_text=tolerance_text,
                     smoke_budget=smoke_budget, names=names)
    return SweepSummary(
        baseline=baseline, metric_name=metric_name, mode=mode, target=target, target_source=target_source,
        quality_tolerance=quality_tolerance, confidence=confidence, comparisons=comparisons, speed_level=speed_level,
        quality_level=quality_level,
        pair_by=pair_by, configs=configs, jobs_at_target=tuple(a for name in by_config for a in at_target[name]),
        verdict=verdict, notes=_notes(configs, [j for js in by_config.values() for j in js], pair_by, names),
        tolerance_source=tolerance_source, names=dict(names or {}),
    )


def derived_tolerance(baseline_jobs: Sequence[Job]) -> float:
    """The default quality tolerance of a family that declares none: the sample standard deviation of the
    baseline's final metric over its replicates (seed r + data order r). A configuration whose quality difference
    lies within the baseline's own seed-to-seed spread has lost nothing the study could tell; 0 with fewer than two
    final metrics."""
    finals = np.array([v for _, v in _finals(baseline_jobs)], dtype=float)
    return float(finals.std(ddof=1)) if finals.size >= 2 else 0.0


def _group_by_config(jobs: Iterable[Job], baseline: str) -> dict[str, list[Job]]:
    """Jobs by configuration, the baseline first, the others in the order they first appear."""
    by_config: dict[str, list[Job]] = {baseline: []}
    for job in jobs:
        if not job.samples_per_sec > 0:
            raise ValueError(f"job {job.config!r} replicate {job.replicate}: samples_per_sec must be > 0")
        by_config.setdefault(job.config, []).append(job)
    if not by_config[baseline]:
        raise ValueError(f"baseline {baseline!r} has no jobs (configurations: {sorted(set(by_config) - {baseline})})")
    return by_config


def _quality(
    jobs: list[Job], baseline_jobs: list[Job], is_baseline: bool, mode: Mode, tolerance: float, level: float,
    pair_by: PairBy,
) -> tuple[Estimate, Quality, bool]:
    """The paired final-metric difference from the baseline, what its interval says against `tolerance`, and
    whether its point is within tolerance."""
    if is_baseline:
        return Estimate(0.0, Interval(0.0, 0.0, level), len(jobs)), "baseline", True
    pairs = paired_values(_finals(jobs), _finals(baseline_jobs), pair_by)
    difference = difference_from_pairs([ours - theirs for ours, theirs in pairs], level)
    if difference.n == 0:
        return difference, "unknown", False
    # Gains are "better than the baseline" in either mode: the tolerance is on how much worse it may be.
    sign = 1.0 if mode == "max" else -1.0
    gains = sorted((sign * difference.interval.low, sign * difference.interval.high))
    if gains[0] >= -tolerance:
        status: Quality = "keeps"
    elif gains[1] < -tolerance:
        status = "loses"
    else:
        status = "unclear"
    return difference, status, sign * difference.point >= -tolerance


def _finals(jobs: Iterable[Job]) -> list[tuple[Job, float]]:
    """The final metrics the quality comparison uses: not those of jobs stopped behind (engine/stopping.py), whose
    last value is wherever they were stopped, not the end of their training."""
    return [(j, j.final_metric) for j in jobs
            if j.final_metric is not None and math.isfinite(j.final_metric) and j.censored_samples is None]


def _choose_target(
    by_config: Mapping[str, list[Job]], quality: Mapping[str, tuple[Estimate, Quality, bool]], target: float | None,
    mode: Mode, metric_name: str, show,
) -> tuple[float, str]:
    if target is not None:
        return float(target), "explicit target"
    # Every configuration that could keep quality (keeps or unclear): one whose jobs were left out of the target
    # would be left out of the verdict for never reaching it, a winner by elimination again.
    keepers = [name for name, (_, status, _) in quality.items() if status not in ("loses", "unknown")]
    finals = {name: [v for _, v in _finals(jobs)] for name, jobs in by_config.items()}
    value = default_target(finals, keepers, mode)
    worst = next(name for name in keepers if value in finals[name])
    return value, (f"default: the worst final {metric_name} of any job of the {len(keepers)} configuration(s) "
                   f"that could keep quality (one of {show(worst)}'s), so every one of their jobs reached it")


def _config_summary(
    name: str, at_target: list[JobAtTarget], baseline_at_target: list[JobAtTarget],
    quality: tuple[Estimate, Quality, bool], is_baseline: bool, confidence: float, level: float, pair_by: PairBy,
) -> ConfigSummary:
    jobs = [a.job for a in at_target]
    walls = [a.wall_time_to_target for a in at_target if a.wall_time_to_target is not None]
    return ConfigSummary(
        config=name,
        jobs=len(jobs),
        reached_target=sum(math.isfinite(a.samples_to_target) for a in at_target),
        samples_per_sec=median_of_positive([j.samples_per_sec for j in jobs], confidence),
        samples_to_target=median_of_positive([a.samples_to_target for a in at_target], confidence),
        time_to_target=median_of_positive([a.time_to_target for a in at_target], confidence),
        wall_time_to_target=median_of_positive(walls, confidence) if walls else None,
        final_metric=median_of_values([v for _, v in _finals(jobs)], confidence),
        speedup=_speedup(at_target, baseline_at_target, is_baseline, level, pair_by, "samples_per_sec"),
        speedup_to_target=_speedup(at_target, baseline_at_target, is_baseline, level, pair_by, "time_to_target"),
        quality_difference=quality[0],
        quality=quality[1],
        within_tolerance=quality[2],
        validation_resolution=_validation_resolution(at_target),
    )


def _speedup(
    at_target: list[JobAtTarget], baseline_at_target: list[JobAtTarget], is_baseline: bool, level: float,
    pair_by: PairBy, figure: Literal["samples_per_sec", "time_to_target"],
) -> Estimate:
    """Paired speedup over the baseline (above 1: faster), from samples/s or from time to target (a shorter time
    is the faster one, so that ratio is the baseline's over ours). The baseline against itself: exactly 1."""
    if is_baseline:
        return Estimate(1.0, Interval(1.0, 1.0, level), len(at_target))
    if figure == "samples_per_sec":
        pairs = paired_values([(a.job, a.job.samples_per_sec) for a in at_target],
                              [(a.job, a.job.samples_per_sec) for a in baseline_at_target], pair_by)
        return ratio_from_log_ratios(_log_ratios(pairs), level)
    # a job stopped behind counts with its bound: the ratio baseline ÷ bound is an upper bound of the true one
    bounded = any(a.time_bound is not None for a in at_target)
    pairs = paired_values([(a.job, a.time_to_target) for a in baseline_at_target],
                          [(a.job, a.time_bound if a.time_bound is not None else a.time_to_target) for a in at_target],
                          pair_by)
    return dataclasses.replace(ratio_from_log_ratios(_log_ratios(pairs), level), bounded=bounded)


def _validation_resolution(at_target: list[JobAtTarget]) -> float:
    """Median over the jobs that reached the target of (bracket width ÷ samples to target): how much of the answer
    lies between two validations. NaN when none reached it."""
    widths = [(a.bracket[1] - a.bracket[0]) / a.samples_to_target for a in at_target
              if math.isfinite(a.samples_to_target) and a.samples_to_target > 0]
    return float(np.median(widths)) if widths else math.nan


def _notes(configs: Sequence[ConfigSummary], jobs: Sequence[Job], pair_by: PairBy,
           names: Mapping[str, str] | None = None) -> tuple[str, ...]:
    show = _namer(names)
    notes = []
    if pair_by == "host":
        notes.append("comparisons are paired within a host (a cluster: run order means little there)")
    concurrent = sorted({show(j.config) for j in jobs if j.concurrent_jobs > 1})
    if concurrent:
        notes.append(f"timings came from concurrent jobs (several on one host or GPU) for: {', '.join(concurrent)}; "
                     "they disturb each other's samples/s")
    coarse = [show(c.config) for c in configs if c.validation_resolution > COARSE_VALIDATION]
    if coarse:
        notes.append(f"validation is coarse next to the samples to target (a bracket over {COARSE_VALIDATION:.0%} of "
                     f"it; linear interpolation inside) for: {', '.join(coarse)}")
    unknown = [show(c.config) for c in configs if c.quality == "unknown"]
    if unknown:
        notes.append(f"no paired final metric, quality unknown: {', '.join(unknown)}")
    return tuple(notes)


# ---------------------------------------------------------------------------------------------------------------------
# The verdict

ONE_REPLICATE = (
    "one replicate: no verdict (an interval needs at least two replicates of a configuration, and one run per "
    "configuration cannot tell a setup's effect from run-to-run noise, which reached 37 % on the hosts of issue 26; "
    "run replicates=3 or more)"
)


def decide(configs: Sequence[ConfigSummary], baseline: str, target_text: str, target_source: str = "", *,
           tolerance_text: str = "", smoke_budget: bool = False,
           names: Mapping[str, str] | None = None) -> Verdict:
    """The fastest configuration to the target among those that could keep quality, or the tie among the ones that
    could be the fastest (not ranked), or "undecided" when the one that could be fastest has an unclear quality, or
    why there is no verdict. `names`: configuration -> the short label the lines use (`bs=64 α=0.7`).

    Candidates: every configuration whose quality is not shown to be lost ("keeps", "unclear" or the baseline: a
    quality interval that straddles the tolerance is not a loss, and dropping it would crown a winner by
    elimination), median time to target finite, a speed to the target against the baseline, and at least two pairs
    with the baseline (configurations with fewer are named as undetermined). Tied for fastest: every candidate
    whose speedup-to-target interval does not lie wholly below another candidate's; they all overlap the interval
    of the one with the highest point. Intervals that do not overlap, all covering together, put the two in that
    order: that is the only "faster" said, so on the event that every interval covers (at least 95 %), the truly
    fastest candidate is in the tie. Every configuration left out is named with its reason."""
    show = _namer(names)
    if max(c.jobs for c in configs) <= 1:
        return Verdict("no verdict", (), {}, tuple(c.config for c in configs), ONE_REPLICATE, (ONE_REPLICATE,))
    caveat = cannot_carry_a_verdict(configs, smoke_budget)
    head = [caveat] if caveat else []
    context = ([f"target: {target_text}, {target_source}"] if target_source else []) + (
        [tolerance_text] if tolerance_text else [])
    undetermined = tuple(c.config for c in configs if c.config != baseline and c.speedup_to_target.n < 2)
    left_out: dict[str, tuple[str, str]] = {}  # configuration -> (why, in a group's words; its own figures)
    candidates, bounded = [], []
    for config in configs:
        if config.config in undetermined:
            continue
        if config.speedup_to_target.bounded:  # jobs stopped behind: a bound says "slower", never "faster" or "tied"
            bounded.append(config)
            continue
        reason = _left_out_reason(config)
        if reason is None:
            candidates.append(config)
        else:
            left_out[config.config] = reason
    if not candidates:
        left_out |= {c.config: (BOUNDED_UNDECIDED, _bound_text(c)) for c in bounded}
        reason = f"no verdict: no configuration could keep quality and reach {target_text} in most of its replicates"
        return Verdict("no verdict", (), {}, undetermined, reason,
                       (*head, reason, *context, *_exclusion_lines(left_out, undetermined, show)), caveat)
    # Could-be-fastest: no other candidate's interval lies wholly above its own. The leader (highest point) always
    # is; one that overlaps the leader but lies wholly below another (often the baseline's exact 1) is not.
    tied = sorted((c for c in candidates if not any(_beats(other, c) for other in candidates)),
                  key=lambda c: -c.speedup_to_target.point)
    leaders = ", ".join(show(c.config) for c in tied)
    for config in candidates:
        if config not in tied:
            left_out[config.config] = (f"slower to the target than {leaders} (intervals apart)", "")
    # a configuration whose jobs were stopped behind: slower where even its bound lies below every could-be-fastest
    # interval; otherwise it stays in the tie, not ranked, so nothing is crowned by its absence
    floor = min(c.speedup_to_target.interval.low for c in tied)
    open_bounded = [c for c in bounded if c.speedup_to_target.interval.high >= floor]
    for config in bounded:
        if config not in open_bounded:
            left_out[config.config] = (f"slower to the target than {leaders} (jobs stopped behind their round's "
                                       "leader; time to target only bounded)", _bound_text(config))
    exclusions = _exclusion_lines(left_out, undetermined, show)
    exclusions += [f"{BOUNDED_UNDECIDED}: {show(c.config)} {_bound_text(c)}" for c in open_bounded]
    if len(tied) == 1 and tied[0].quality == "unclear":
        leader = tied[0]
        reason = (f"undecided: quality unclear: {show(leader.config)} could be the fastest to {target_text} "
                  f"({_speedup_text(leader, baseline)}), but its quality difference from the baseline "
                  f"{_difference_text(leader)} straddles the tolerance; more replicates decide it")
        return Verdict("undecided", (), {leader.config: leader.speedup_to_target}, undetermined, reason,
                       (*head, reason, *context, *exclusions), caveat)
    tied += open_bounded
    kind: VerdictKind = "fastest" if len(tied) == 1 else "tie"
    lines = [*head, _headline(kind, tied, candidates + open_bounded, baseline, target_text, show)]
    lines += [f"  {show(c.config)}: {_speedup_text(c, baseline)}" for c in tied] if kind == "tie" else []
    lines += context
    unclear = [c for c in tied if c.quality == "unclear"]
    if unclear:
        lines.append("quality within tolerance of the baseline not yet certain (interval straddles it): "
                     + ", ".join(f"{show(c.config)} {_difference_text(c)}" for c in unclear))
    lines += exclusions
    return Verdict(kind, tuple(c.config for c in tied), {c.config: c.speedup_to_target for c in tied}, undetermined,
                   "", tuple(lines), caveat)


FEWEST_REPLICATES = 3


def cannot_carry_a_verdict(configs: Sequence[ConfigSummary], smoke_budget: bool) -> str:
    """The verdict's first line when the study is too small to carry one: fewer than 3 replicates (a t interval on
    2 values is 12.7 standard errors wide at 95 %, more with the simultaneous level), or a debug=smoke budget (a few
    steps: the quality is near chance and says nothing about the setups). "" when neither."""
    replicates = max(c.jobs for c in configs)
    why = []
    if replicates < FEWEST_REPLICATES:
        why.append(f"{replicates} replicates ({FEWEST_REPLICATES} or more are needed)")
    if smoke_budget:
        why.append("a debug=smoke budget (too few steps for the quality to mean anything)")
    if not why:
        return ""
    return (f"this study cannot carry a verdict: {' and '.join(why)}; what follows checks that the study runs, it "
            "is not an answer")


def _namer(names: Mapping[str, str] | None):
    names = names or {}
    return lambda config: names.get(config, config)


def _left_out_reason(config: ConfigSummary) -> tuple[str, str] | None:
    """Why `config` cannot be a candidate (a group's words, its own figures), or None."""
    if config.quality == "loses":
        return "final metric worse than the baseline's beyond the tolerance", _difference_text(config)
    if config.quality == "unknown":
        return "no final metric paired with the baseline's (quality unknown)", ""
    if not math.isfinite(config.time_to_target.point):
        return "target not reached in most replicates", f"{config.reached_target}/{config.jobs} reached it"
    if not config.speedup_to_target.point > 0:
        # point 0 or NaN: as many pairs where only it never reached the target as pairs where only the baseline did
        return ("no speed to the target against the baseline: its pairs with the baseline are half infinite (one "
                "side never reached the target)", f"{config.speedup_to_target.n} pairs")
    return None


BOUNDED_UNDECIDED = ("undecided (jobs stopped behind their round's leader; time to target only bounded, and the bound "
                     "does not clear the fastest)")


def _bound_text(config: ConfigSummary) -> str:
    estimate = config.speedup_to_target
    return (f"(at most {format_ratio(estimate.point)} the baseline's speed to the target, upper bound "
            f"{format_ratio(estimate.interval.high)}, {estimate.n} pairs)")


def _difference_text(config: ConfigSummary) -> str:
    difference = config.quality_difference
    return f"(Δ {difference.point:+.3g}, {difference.interval.low:+.3g} to {difference.interval.high:+.3g})"


def _beats(one: ConfigSummary, other: ConfigSummary) -> bool:
    """Faster to the target beyond both simultaneous intervals."""
    return one.speedup_to_target.interval.low > other.speedup_to_target.interval.high


def _headline(kind: VerdictKind, tied: Sequence[ConfigSummary], candidates: Sequence[ConfigSummary], baseline: str,
              target_text: str, show) -> str:
    if kind == "fastest":
        return f"fastest to {target_text}: {show(tied[0].config)}, {_speedup_text(tied[0], baseline)}"
    names = ", ".join(show(c.config) for c in tied)
    if len(tied) == len(candidates):
        return f"tie for fastest to {target_text}: all of {names} (intervals overlap: not ranked)"
    return f"tie for fastest to {target_text}: {names} (intervals overlap: not ranked; the rest are slower)"


def _speedup_text(config: ConfigSummary, baseline: str) -> str:
    if config.config == baseline:
        return "the baseline"
    estimate = config.speedup_to_target
    if estimate.bounded:
        return (f"at most {format_ratio(estimate.point)} the baseline's speed to the target (upper bound "
                f"{format_ratio(estimate.interval.high)}: its jobs were stopped behind, so its time is only bounded)")
    return (f"{format_ratio(estimate.point)} the baseline's speed to the target "
            f"({format_ratio(estimate.interval.low)}–{format_ratio(estimate.interval.high)}, "
            f"{estimate.interval.level:.1%} simultaneous interval, {estimate.n} pairs)")


def _exclusion_lines(left_out: Mapping[str, tuple[str, str]], undetermined: Sequence[str], show) -> list[str]:
    """One line per reason, naming every configuration left out for it (with its own figures where they help)."""
    by_reason: dict[str, list[str]] = defaultdict(list)
    for config, (reason, figures) in left_out.items():
        by_reason[reason].append(f"{show(config)} {figures}".rstrip())
    lines = [f"left out, {reason}: {', '.join(named)}" for reason, named in by_reason.items()]
    if undetermined:
        lines.append("undetermined, fewer than two replicates paired with the baseline: "
                     + ", ".join(show(c) for c in undetermined))
    return lines


def pareto_front(points: Mapping[str, tuple[float, float]], lower_speed_is_better: bool,
                 higher_quality_is_better: bool) -> set[str]:
    """The configurations no other dominates: none is at least as good on both (speed, quality) and better on one.
    `points`: name -> (speed figure, quality figure), point estimates; a NaN on either is on no front. A speed of inf
    (time to target never reached) is the slowest there is."""
    oriented = {
        name: (-speed if lower_speed_is_better else speed, quality if higher_quality_is_better else -quality)
        for name, (speed, quality) in points.items() if not (math.isnan(speed) or math.isnan(quality))
    }

    def dominated(name: str) -> bool:
        s, q = oriented[name]
        return any(s2 >= s and q2 >= q and (s2 > s or q2 > q) for other, (s2, q2) in oriented.items() if other != name)

    return {name for name in oriented if not dominated(name)}


def speed_quality_front(summary: SweepSummary) -> list[str]:
    """The configurations on the Pareto front of speedup to target and final metric (point estimates), fastest
    first: none of them is both slower and no better in quality than another."""
    points = {c.config: (c.speedup_to_target.point, c.final_metric.point) for c in summary.configs}
    front = pareto_front(points, lower_speed_is_better=False, higher_quality_is_better=summary.mode == "max")
    return sorted(front, key=lambda name: -points[name][0])


def format_ratio(value: float) -> str:
    if math.isinf(value):
        return "∞"
    return f"{value:.2f}×" if value >= 0.01 else f"{value:.2g}×"


# ---------------------------------------------------------------------------------------------------------------------
# replicates=auto


@dataclass(frozen=True)
class ReplicatePlan:
    """Where another round of replicates would decide something.

    more: the configurations to run again (the baseline is among them whenever another is: the pairs need it).
    dominated: clearly slower to the target than a candidate and not clearly better in quality: no more replicates.
    decided: nothing about them is open (e.g. quality lost beyond the interval; the lone fastest).
    open_decisions: in words, what the `more` ones would settle; when the budget is spent, these stayed open.
    """

    more: tuple[str, ...]
    dominated: tuple[str, ...]
    decided: tuple[str, ...]
    open_decisions: tuple[str, ...]


def plan_replicates(summary: SweepSummary) -> ReplicatePlan:
    """Which configurations still straddle a decision (the fastest tie, keeps quality, too few pairs), which are
    clearly dominated, and which are decided. The caller runs `more` until it is empty or the budget is spent."""
    open_by_config: dict[str, list[str]] = {}
    dominated, decided = [], []
    verdict = summary.verdict
    candidates = [c for c in summary.configs if _could_keep_quality(c) and c.speedup_to_target.n >= 2]
    for config in summary.configs:
        reasons = _open_decisions(config, summary, verdict)
        if reasons:
            open_by_config[config.config] = reasons
        elif config.config != summary.baseline and _dominator(config, candidates, summary.mode) is not None:
            dominated.append(config.config)
        else:
            decided.append(config.config)
    more = list(open_by_config)
    if more and summary.baseline not in more:
        more.insert(0, summary.baseline)
        decided.remove(summary.baseline)
    show = _namer(summary.names)
    open_decisions = tuple(f"{show(name)}: {reason}" for name, reasons in open_by_config.items() for reason in reasons)
    return ReplicatePlan(tuple(more), tuple(dominated), tuple(decided), open_decisions)


def _open_decisions(config: ConfigSummary, summary: SweepSummary, verdict: Verdict) -> list[str]:
    if config.config != summary.baseline and config.speedup_to_target.n < 2:
        return ["fewer than two replicates paired with the baseline"]
    reasons = []
    if verdict.kind == "tie" and config.config in verdict.fastest:
        others = ", ".join(_namer(summary.names)(name) for name in verdict.fastest if name != config.config)
        reasons.append(f"tied for fastest with {others}")
    candidates = [c for c in summary.configs if _could_keep_quality(c) and c.speedup_to_target.n >= 2]
    if config.quality == "unclear" and _dominator(config, candidates, summary.mode) is None:
        difference = config.quality_difference
        reasons.append(f"keeps quality? difference {difference.point:+.4g} ({difference.interval.low:+.4g} to "
                       f"{difference.interval.high:+.4g}) against tolerance {summary.quality_tolerance:g}")
    return reasons


def _could_keep_quality(config: ConfigSummary) -> bool:
    return config.quality not in ("loses", "unknown")


def _dominator(config: ConfigSummary, candidates: Sequence[ConfigSummary], mode: Mode) -> str | None:
    """A candidate that is faster to the target than `config` beyond both intervals while `config` is not better in
    quality beyond both intervals; None if there is none."""
    sign = 1.0 if mode == "max" else -1.0
    for other in candidates:
        if other.config == config.config:
            continue
        slower = config.speedup_to_target.interval.high < other.speedup_to_target.interval.low
        ours, theirs = config.quality_difference.interval, other.quality_difference.interval
        better = min(sign * ours.low, sign * ours.high) > max(sign * theirs.low, sign * theirs.high)
        if slower and not better:
            return other.config
    return None


# ---------------------------------------------------------------------------------------------------------------------
# Text


def table_header(summary: SweepSummary, with_target: bool = True, names: Mapping[str, str] | None = None) -> str:
    """The line above the per-configuration table: the target (unless the page says it already: the verdict's
    `target:` line), the baseline and the intervals' levels."""
    target = (f"target: {summary.metric_name} {'≥' if summary.mode == 'max' else '≤'} {summary.target:.4g} "
              f"({summary.target_source}); ") if with_target else ""
    return (f"{target}comparisons with {_namer(names)(summary.baseline)} (the baseline): {summary.comparisons}, "
            f"speed intervals each at {summary.speed_level:.2%}, quality intervals at {summary.quality_level:.2%}")


def render_table(summary: SweepSummary) -> str:
    """The per-configuration table as text: medians with their 95 % intervals, comparisons with their simultaneous
    ones (the header says the level)."""
    header = table_header(summary)
    columns = ("config", "n", "samples/s", "speedup", "samples to target [reached]", "time to target (s)",
               "wall time to target (s)", "speedup to target", "final metric", "Δ vs baseline", "quality")
    rows = [columns] + [table_cells(c) for c in summary.configs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    return "\n".join([header, *lines])


def table_cells(config: ConfigSummary) -> list[str]:
    """One configuration's row of the per-configuration table (this text table and the report's)."""
    wall = config.wall_time_to_target
    return [
        config.config,
        str(config.jobs),
        estimate_text(config.samples_per_sec, "{:.4g}"),
        estimate_text(config.speedup, "{:.2f}"),
        estimate_text(config.samples_to_target, "{:.4g}") + f" [{config.reached_target}/{config.jobs}]",
        estimate_text(config.time_to_target, "{:.4g}"),
        estimate_text(wall, "{:.4g}") if wall is not None else "",
        estimate_text(config.speedup_to_target, "{:.2f}"),
        estimate_text(config.final_metric, "{:.4g}"),
        estimate_text(config.quality_difference, "{:+.3g}"),
        config.quality,
    ]


def estimate_text(estimate: Estimate, number: str) -> str:
    def show(value: float) -> str:
        if math.isinf(value):
            return "∞" if value > 0 else "-∞"
        shown = number.format(value)
        # a fixed-point format of a huge bound (a 2-replicate interval's t quantile) would print dozens of digits
        return shown if len(shown) <= 9 else f"{value:.3g}"

    return f"{show(estimate.point)} ({show(estimate.interval.low)}–{show(estimate.interval.high)})"
