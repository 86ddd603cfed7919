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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from sweeplab.study import selection as mcb
from sweeplab.study.tdist import student_t_cdf, student_t_quantile  # noqa: F401 (re-exported)

Mode = Literal["max", "min"]
PairBy = Literal["round", "host"]
Quality = Literal["baseline", "keeps", "unclear", "loses", "unknown", "at target"]
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
    best_metric: its best value in the monitored direction, the one its kept checkpoint holds (None: use
        final_metric). Quality and the default target read this one: the checkpoint a user exports is the best.
    curve: the validation points, in any order (tuples `(samples_seen, value[, wall_seconds])` are accepted).
    host: where it ran (None: one machine). Pairs never cross hosts.
    concurrent_jobs: how many jobs shared the host (or its GPU) while this one was timed; above 1 its timing is
        disturbed by the others, and the verdict says so.
    censored_samples: the samples seen when the job was stopped behind its round's leader without reaching the
        target (engine/stopping.py, `stop.behind`); its time to target is then only known to be longer than that.
    stopped_at_target: `stop.at_target` stopped it at its first validation past the target: its metric is the
        target's give or take the validation grid, so it says nothing about the quality it would have ended at.
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
    best_metric: float | None = None
    stopped_at_target: bool = False
    peak_mem_mb: float | None = None  # the most memory the job held (its run's summary/peak_mem_mb)

    @property
    def kept_metric(self) -> float | None:
        """The metric of the checkpoint the job keeps: its best validation, else its final one."""
        return self.best_metric if self.best_metric is not None else self.final_metric

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
    paired (above 1: it gets there sooner). final_metric: the metric of each job's kept checkpoint (its best
    validation). quality_difference: that metric − the baseline's, paired, in the metric's units. quality: "keeps"
    (the whole interval within tolerance of the baseline), "loses" (the whole interval beyond it), "unclear"
    (straddles), "baseline", "unknown" (no kept metric paired with the baseline's), or "at target" (stop.at_target
    stopped every job at the target: its quality is the target's, not compared).
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
    peak_mem_mb: Estimate | None = None  # median over its jobs that recorded one, with its 95 % interval


@dataclass(frozen=True)
class Figure:
    """One per-configuration figure, as every reader names and shows it: the report's table (`column`, a cell
    `median (low–high)` in `number`'s format), report.csv (`csv`, with ` low` and ` high`), the configuration runs'
    metrics (`metric`, with `_low` and `_high`) and, where `view` > 0, the MLflow view's text column and chart (in
    that order). `{metric}` in a name stands for the monitored metric's (`val/cos`), `{metric_key}` for it inside a
    key (`val_cos`). `legend`: what the column says, for the line under the table. Adding a figure is a ConfigSummary
    field, the line that computes it and one entry here."""

    column: str
    csv: str
    metric: str
    number: str
    of: Callable[[ConfigSummary], Estimate | None]
    legend: str
    view: int = 0

    def named(self, name: str, metric_name: str) -> str:
        return name.format(metric=metric_name, metric_key=metric_name.replace("/", "_"))


FIGURES: tuple[Figure, ...] = (
    Figure("samples/s", "samples/s", "samples_per_sec", "{:.4g}", lambda c: c.samples_per_sec,
           "training throughput", view=4),
    Figure("speedup", "speedup", "speedup", "{:.2f}", lambda c: c.speedup, "samples/s over the baseline's"),
    Figure("samples→target", "samples to target", "samples_to_target", "{:.4g}", lambda c: c.samples_to_target,
           "training samples until the target [replicates that reached it]"),
    Figure("t→target (s)", "time to target (s)", "time_to_target_s", "{:.4g}", lambda c: c.time_to_target,
           "samples→target / samples/s (s of training, validation and checkpoint pauses excluded)", view=2),
    Figure("wall t→target (s)", "wall time to target (s)", "wall_time_to_target_s", "{:.4g}",
           lambda c: c.wall_time_to_target, "wall-clock s since the job started"),
    Figure("speedup→target", "speedup to target", "speedup_to_target", "{:.2f}", lambda c: c.speedup_to_target,
           "the baseline's t→target / this one's", view=1),
    Figure("{metric}", "final {metric}", "final_{metric_key}", "{:.4g}", lambda c: c.final_metric,
           "each job's best validation (the checkpoint it keeps)", view=3),
    Figure("Δ", "Δ vs baseline", "quality_delta", "{:+.3g}", lambda c: c.quality_difference,
           "that metric minus the baseline's"),
    Figure("peak MB", "peak memory (MB)", "peak_mem_mb", "{:.4g}", lambda c: c.peak_mem_mb,
           "the most memory a job held (CUDA or MPS: the device's; CPU: the process's)"),
)


def shown_in_the_view() -> list[Figure]:
    """The figures the MLflow view shows, in its order."""
    return sorted((f for f in FIGURES if f.view), key=lambda f: f.view)


@dataclass(frozen=True)
class Verdict:
    """The sweep's answer, read from the multiple comparisons with the best (sweeplab.study.selection). kind:
    "fastest" (`fastest` names one: the fastest, or with `within` > 1 the fastest or at most `within`× slower than
    it), "tie" (`fastest` names the configurations that could be the fastest; they are not ranked), "no verdict"
    (`reason` says why). "undecided" is no longer said: a quality not yet certain is its own line beside the speed
    answer. `lines`: its text, first line first. caveat: why this study cannot carry a verdict at all (fewer than 3
    replicates, a debug=smoke budget), the first line when set; "" otherwise. `to_decide`: for each comparison that
    keeps it open, about how many replicates would decide it at the measured noise (None: more than 1,000 or no
    difference measured)."""

    kind: VerdictKind
    fastest: tuple[str, ...]
    speedup_to_target: Mapping[str, Estimate]
    undetermined: tuple[str, ...]
    reason: str
    lines: tuple[str, ...]
    caveat: str = ""
    within: float = 1.0
    to_decide: Mapping[str, int | None] = field(default_factory=dict)

    def text(self) -> str:
        return "\n".join(self.lines)

    @property
    def headline(self) -> str:
        """The line that says the answer (the first one after the caveat, if any)."""
        return self.lines[1] if self.caveat and len(self.lines) > 1 else self.lines[0]


@dataclass(frozen=True)
class SweepSummary:
    """Everything `summarize` found. `comparisons`: how many configurations were compared with the baseline (K);
    `speed_level`: the level of each speedup and speedup-to-target interval of the table (a family of 2K, against
    the baseline); `quality_level`: that of each quality difference (a family of K). `selection`: the multiple
    comparisons with the best that the verdict is read from (None when there is no verdict to read); `looks`: how
    many times the study may look at it (replicates=auto), `indifference`: the zone δ (1: none)."""

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
    selection: mcb.Selection | None = None
    looks: mcb.Looks | None = None
    indifference: float = 1.0

    def config(self, name: str) -> ConfigSummary:
        return next(c for c in self.configs if c.config == name)


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
    looks: mcb.Looks | None = None,
    indifference: float = 1.0,
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
    looks: the looks a study may take at this verdict to decide whether to run more (replicates=auto: after its
    rounds `first` to `most`); the verdict's intervals then hold at every one of them. None: a fixed-size study. indifference: δ ≥ 1, the
    verdict may name a configuration "the fastest, or within δ× of it" (1: only the fastest).
    """
    if not (indifference >= 1.0 and math.isfinite(indifference)):
        raise ValueError(f"indifference must be a ratio >= 1, got {indifference}")
    by_config = _group_by_config(jobs, baseline)
    if quality_tolerance is None:
        quality_tolerance = derived_tolerance(by_config[baseline])
        tolerance_source = (f"derived: the standard deviation of the baseline's best {metric_name} over its "
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
    stopped_at_target = any(j.stopped_at_target for js in by_config.values() for j in js)
    if stopped_at_target:  # each job's metric is the target's give or take the validation grid: not compared
        quality = {name: (q if name == baseline else (q[0], "at target", True)) for name, q in quality.items()}
    target, target_source = _choose_target(by_config, quality, target, mode, metric_name, _namer(names),
                                           quality_tolerance)
    at_target = {name: [job_at_target(j, target, mode) for j in name_jobs] for name, name_jobs in by_config.items()}
    configs = tuple(
        _config_summary(name, at_target[name], at_target[baseline], quality[name], name == baseline,
                        confidence, speed_level, pair_by)
        for name in by_config
    )
    target_text = f"{metric_name} {'≥' if mode == 'max' else '≤'} {target:.4g}"
    tolerance_text = _tolerance_text(quality_tolerance, tolerance_source, metric_name, stopped_at_target)
    stopped_behind = {name for name, js in by_config.items() if all(j.censored_samples is not None for j in js)}
    times = {name: _times(at_target[name], pair_by) for name in by_config}
    undetermined = tuple(name for name in by_config
                         if name != baseline and len(times[name].keys() & times[baseline].keys()) < 2)
    candidates = _candidates(configs, undetermined, stopped_behind)
    selection = mcb.select({c.config: times[c.config] for c in candidates}, confidence=confidence, looks=looks,
                           indifference=indifference) if len(candidates) >= 2 else None
    verdict = decide(configs, baseline, target_text, target_source, tolerance_text=tolerance_text,
                     smoke_budget=smoke_budget, names=names, selection=selection, undetermined=undetermined)
    return SweepSummary(
        baseline=baseline, metric_name=metric_name, mode=mode, target=target, target_source=target_source,
        quality_tolerance=quality_tolerance, confidence=confidence, comparisons=comparisons, speed_level=speed_level,
        quality_level=quality_level,
        pair_by=pair_by, configs=configs, jobs_at_target=tuple(a for name in by_config for a in at_target[name]),
        verdict=verdict,
        notes=_notes(configs, [j for js in by_config.values() for j in js], pair_by, names, mode, metric_name,
                     quality_tolerance, target),
        tolerance_source=tolerance_source, names=dict(names or {}), selection=selection, looks=looks,
        indifference=indifference,
    )


def _tolerance_text(tolerance: float, source: str, metric_name: str, stopped_at_target: bool) -> str:
    if stopped_at_target:
        return (f"quality not compared: stop.at_target stopped jobs at their first validation past the target, so "
                f"each one's {metric_name} is the target's give or take the validation grid (stop.quality_round's "
                "whole jobs give the quality column and the Pareto front; run without stop.at_target to compare "
                "the quality the configurations end at)")
    return f"quality tolerance: {tolerance:.4g} {metric_name} worse than the baseline ({source})"


def _candidates(configs: Sequence[ConfigSummary], undetermined: Sequence[str],
                stopped_behind: set[str]) -> list[ConfigSummary]:
    """The configurations the selection compares: every one that could keep quality (not shown to lose it, its
    kept metric paired with the baseline's) with at least two rounds in common with the baseline. One whose every
    job was stopped behind has no quality measured, yet is compared: its bounds can only show it slower."""
    return [c for c in configs if c.config not in undetermined
            and (_left_out_reason(c) is None or c.config in stopped_behind)]


def _times(at_target: Sequence[JobAtTarget], pair_by: PairBy) -> dict[tuple, mcb.TimeAtTarget]:
    """A configuration's time to target per pair key, as the selection compares them: log seconds, or a lower bound
    of them (censored) for a job that never reached the target (its training time) or was stopped behind (its stop).
    Several jobs in one key (pair_by="host"): their mean log time, censored when any of them is (then a lower
    bound of that mean)."""
    grouped: dict[tuple, list[mcb.TimeAtTarget]] = defaultdict(list)
    for at in at_target:
        if math.isfinite(at.time_to_target) and at.time_to_target > 0:
            grouped[_pair_key(at.job, pair_by)].append(mcb.TimeAtTarget(math.log(at.time_to_target)))
            continue
        stopped = at.time_bound is not None
        bound = at.time_bound if stopped else at.bracket[0] / at.job.samples_per_sec
        if bound > 0:
            grouped[_pair_key(at.job, pair_by)].append(
                mcb.TimeAtTarget(math.log(bound), censored="stopped" if stopped else "never"))
    return {key: mcb.TimeAtTarget(math.fsum(t.log_seconds for t in times) / len(times),
                                  max((t.censored for t in times), key=("", "stopped", "never").index))
            for key, times in grouped.items()}


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
    """The kept metrics (each job's best validation) the quality comparison uses: not those of jobs stopped behind
    (engine/stopping.py) or at the target, whose values are wherever they were stopped, not what training ends at."""
    return [(j, j.kept_metric) for j in jobs
            if j.kept_metric is not None and math.isfinite(j.kept_metric) and j.censored_samples is None
            and not j.stopped_at_target]


def _choose_target(
    by_config: Mapping[str, list[Job]], quality: Mapping[str, tuple[Estimate, Quality, bool]], target: float | None,
    mode: Mode, metric_name: str, show, tolerance: float = 0.0,
) -> tuple[float, str]:
    if target is not None:
        return float(target), "explicit target"
    # Every configuration that could keep quality (keeps or unclear): one whose jobs were left out of the target
    # would be left out of the verdict for never reaching it, a winner by elimination again.
    keepers = [name for name, (_, status, _) in quality.items() if status not in ("loses", "unknown")]
    finals = {name: [v for _, v in _finals(jobs)] for name, jobs in by_config.items()}
    worst_value = default_target(finals, keepers, mode)
    worst = next(name for name in keepers if worst_value in finals[name])
    less = f", {'less' if mode == 'max' else 'plus'} the quality tolerance {tolerance:.4g}" if tolerance > 0 else ""
    return default_target(finals, keepers, mode, tolerance), (
        f"default: the worst best-{metric_name} of any job of the {len(keepers)} configuration(s) that could keep "
        f"quality ({worst_value:.4g}, one of {show(worst)}'s; each job's best validation, the one its kept checkpoint "
        f"holds){less}, so every one of their jobs reached it before its curve flattened")


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
        peak_mem_mb=_median_if_any([j.peak_mem_mb for j in jobs if j.peak_mem_mb], confidence),
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


def _median_if_any(values: Sequence[float], confidence: float) -> Estimate | None:
    return median_of_positive(values, confidence) if values else None


def _validation_resolution(at_target: list[JobAtTarget]) -> float:
    """Median over the jobs that reached the target of (bracket width ÷ samples to target): how much of the answer
    lies between two validations. NaN when none reached it."""
    widths = [(a.bracket[1] - a.bracket[0]) / a.samples_to_target for a in at_target
              if math.isfinite(a.samples_to_target) and a.samples_to_target > 0]
    return float(np.median(widths)) if widths else math.nan


def _notes(configs: Sequence[ConfigSummary], jobs: Sequence[Job], pair_by: PairBy,
           names: Mapping[str, str] | None = None, mode: Mode = "max", metric_name: str = "metric",
           tolerance: float = 0.0, target: float | None = None) -> tuple[str, ...]:
    show = _namer(names)
    notes = []
    if target is not None and (trivial := _met_at_first_validation(jobs, target, mode)) is not None:
        notes.append(f"every job reached the target ({metric_name} {'≥' if mode == 'max' else '≤'} {target:.4g}) at "
                     "its first validation: its times to target measure where validation falls, nothing about "
                     f"training speed; ask a harder one{trivial} (report.target, or --target of the report)")
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
    overfit = overfitting(jobs, mode, metric_name, tolerance, show)
    if overfit:
        notes.append(f"{metric_name} got worse after its best validation (overfitting): {'; '.join(overfit)}; "
                     "quality and the default target use each job's best, the checkpoint it keeps")
    return tuple(notes)


def _met_at_first_validation(jobs: Sequence[Job], target: float, mode: Mode) -> str | None:
    """None unless every job with a curve met `target` at its first validation; then the harder target to suggest:
    the worst of the jobs' best values where no job's first validation met it, else "" (no number to offer)."""
    firsts = [points[0].value for j in jobs if (points := j.validation_points())]
    if not firsts or not all((v >= target) if mode == "max" else (v <= target) for v in firsts):
        return None
    bests = [j.kept_metric for j in jobs if j.kept_metric is not None]
    worst_best = (min if mode == "max" else max)(bests) if bests else None
    beyond_firsts = worst_best is not None and ((worst_best > max(firsts)) if mode == "max" else (worst_best < min(firsts)))
    return f", e.g. {worst_best:.4g} (the worst of the jobs' best values)" if beyond_firsts else ""


def overfitting(jobs: Sequence[Job], mode: Mode, metric_name: str, tolerance: float, show=str) -> list[str]:
    """Per configuration whose jobs mostly ended worse than their best by more than the quality tolerance: how much
    (median over those jobs; a ratio for a positive metric that falls, such as a perplexity) and where the best
    was (median samples seen)."""
    by_config: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for job in jobs:
        points = job.validation_points()
        if len(points) < 2 or job.stopped_at_target or job.censored_samples is not None:
            continue
        best = (max if mode == "max" else min)(points, key=lambda p: p.value)
        by_config[job.config].append((best.value, points[-1].value, best.samples_seen))
    found = []
    for config, values in by_config.items():
        worse = [(b, f, s) for b, f, s in values if (b - f if mode == "max" else f - b) > max(tolerance, 0.0)]
        if len(worse) * 2 <= len(values):
            continue
        best, final, samples = (float(np.median(column)) for column in zip(*worse))
        if mode == "min" and best > 0:
            change = f"rose {final / best:.1f}× ({best:.4g} to {final:.4g})"
        else:
            change = f"{'fell' if mode == 'max' else 'rose'} by {abs(final - best):.3g} ({best:.4g} to {final:.4g})"
        found.append(f"{show(config)}'s {metric_name} {change} after its best at {samples:,.0f} samples "
                     f"({len(worse)} of {len(values)} jobs)")
    return found


# ---------------------------------------------------------------------------------------------------------------------
# The verdict

ONE_REPLICATE = (
    "one replicate: no verdict (an interval needs at least two replicates of a configuration, and one run per "
    "configuration cannot tell a setup's effect from run-to-run noise, which reached 37 % on the hosts of issue 26; "
    "run replicates=3 or more)"
)


def decide(configs: Sequence[ConfigSummary], baseline: str, target_text: str, target_source: str = "", *,
           tolerance_text: str = "", smoke_budget: bool = False, names: Mapping[str, str] | None = None,
           selection: mcb.Selection | None = None, undetermined: Sequence[str] = ()) -> Verdict:
    """The fastest configuration to the target among those that could keep quality, read from `selection` (the
    multiple comparisons with the best over them: sweeplab.study.selection), or the configurations that could be the
    fastest (a tie, not ranked), or why there is no verdict. `names`: configuration -> the short label the lines use.

    Candidates: every configuration whose quality is not shown to be lost ("keeps", "unclear", "at target" or the
    baseline) with at least two replicates paired with the baseline (configurations with fewer are named as
    undetermined: `summarize` says which). A time to target that is only bounded (a job that never reached the target, or was stopped
    behind) enters the comparisons as a bound, so no configuration needs most of its jobs to reach the target to be
    compared, and none is left out on a count. On the event that the best's comparisons hold (at least 95 %), the
    fastest named is the fastest (or within the indifference zone of it), the truly fastest is in a tie, and every
    configuration called slower is. Speed and quality are separate statements: a quality not yet certain is said
    beside the speed answer. Every configuration left out is named with its reason."""
    show = _namer(names)
    if max(c.jobs for c in configs) <= 1:
        return Verdict("no verdict", (), {}, tuple(c.config for c in configs), ONE_REPLICATE, (ONE_REPLICATE,))
    caveat = cannot_carry_a_verdict(configs, smoke_budget)
    head = [caveat] if caveat else []
    context = ([f"target: {target_text}, {target_source}"] if target_source else []) + (
        [tolerance_text] if tolerance_text else [])
    by_name = {c.config: c for c in configs}
    undetermined = tuple(undetermined)
    left_out: dict[str, tuple[str, str]] = {}  # configuration -> (why, in a group's words; its own figures)
    for config in configs:
        compared = selection is not None and config.config in selection.configs
        reason = _left_out_reason(config) if config.config not in undetermined and not compared else None
        if reason is not None:
            left_out[config.config] = reason
    if selection is None:
        keeper = [c for c in configs if c.config not in left_out and c.config not in undetermined]
        if len(keeper) == 1 and not undetermined and any(c.quality == "loses" for c in configs):
            # the answer without a speed comparison: every other configuration lost quality beyond its interval
            line = f"fastest to {target_text}: {show(keeper[0].config)}, the only configuration that keeps quality"
            return Verdict("fastest", (keeper[0].config,), {keeper[0].config: keeper[0].speedup_to_target}, (), "",
                           (*head, line, *context, *_exclusion_lines(left_out, undetermined, show)), caveat)
        reason = (f"no verdict: fewer than two configurations could keep quality and be compared on their time to "
                  f"{target_text} (two rounds in common with the baseline at least)")
        return Verdict("no verdict", (), {}, undetermined, reason,
                       (*head, reason, *context, *_exclusion_lines(left_out, undetermined, show)), caveat)
    for config, faster in selection.beaten_by.items():
        left_out[config] = (f"slower to the target than {', '.join(show(c) for c in faster)} (beyond the noise)", "")
    could_be = [by_name[c] for c in mcb.sorted_by_speed(selection, selection.could_be_fastest)]
    named = selection.named
    level = f"{selection.confidence_text()}, each pair's interval at {2 * selection.level - 1:.2%}"
    if named is not None:
        kind: VerdictKind = "fastest"
        tied = [by_name[named]]
        lines = [*head, _named_headline(by_name[named], baseline, target_text, selection, show)]
        if selection.fastest is not None and selection.margin(named) > 1:
            lines.append(f"  at least {format_ratio(selection.margin(named))} as fast as every other configuration "
                         f"compared (every pair compared, {level})")
        elif selection.within is not None:
            rest = [c for c in could_be if c.config != named]
            lines.append(f"  {', '.join(show(c.config) for c in rest)} could be faster, by at most "
                         f"{format_ratio(selection.indifference)} (every pair compared, {level})")
    else:
        kind = "tie"
        tied = could_be
        lines = [*head, _headline(kind, tied, selection.configs, target_text, show)]
        lines += [f"  {show(c.config)}: {_speedup_text(c, baseline)}" for c in tied]
        lines.append(f"  (every pair compared, {level})")
    lines += context
    unclear = [c for c in tied if c.quality == "unclear"]
    if unclear:
        lines.append("quality within tolerance of the baseline not yet certain (interval straddles it): "
                     + ", ".join(f"{show(c.config)} {_difference_text(c)}" for c in unclear))
    to_decide = _to_decide(selection, configs)
    lines += [_to_decide_line(pair, n, show) for pair, n in to_decide.items()]
    lines += _exclusion_lines(left_out, undetermined, show)
    return Verdict(kind, tuple(c.config for c in tied), {c.config: c.speedup_to_target for c in tied}, undetermined,
                   "", tuple(lines), caveat, within=selection.indifference if selection.within else 1.0,
                   to_decide={f"{a} vs {b}": n for (a, b), n in to_decide.items()})


def _to_decide(selection: mcb.Selection, configs: Sequence[ConfigSummary]) -> dict[tuple[str, str], int | None]:
    """(leader, other) -> about how many replicates a study of this size would need to decide it (fixed size)."""
    return {(c.first, c.second): mcb.replicates_to_decide(c, selection.confidence, len(selection.configs),
                                                          selection.indifference)
            for c in mcb.open_pairs(selection)}


def _to_decide_line(pair: tuple[str, str], replicates: int | None, show) -> str:
    first, second = (show(c) for c in pair)
    if replicates is None:
        return (f"to decide {first} against {second}: no difference measured that more replicates would likely "
                f"separate (over {mcb.MOST_REPLICATES_SUGGESTED} at this noise)")
    return (f"to decide {first} against {second}: about {replicates} replicates would (80 % power at the measured "
            f"difference and noise; replicates={replicates})")


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
        return "best metric worse than the baseline's beyond the tolerance", _difference_text(config)
    if config.quality == "unknown":
        return "no best metric paired with the baseline's (quality unknown)", ""
    return None


def _difference_text(config: ConfigSummary) -> str:
    difference = config.quality_difference
    return f"(Δ {difference.point:+.3g}, {difference.interval.low:+.3g} to {difference.interval.high:+.3g})"


def _named_headline(config: ConfigSummary, baseline: str, target_text: str, selection: mcb.Selection, show) -> str:
    zone = "" if selection.fastest else f", or within {format_ratio(selection.indifference)} of the fastest"
    return f"fastest to {target_text}{zone}: {show(config.config)}, {_speedup_text(config, baseline)}"


def _headline(kind: VerdictKind, tied: Sequence[ConfigSummary], compared: Sequence[str], target_text: str,
              show) -> str:
    names = ", ".join(show(c.config) for c in tied)
    if len(tied) == len(compared):
        return f"tie for fastest to {target_text}: all of {names} (the noise cannot order them: not ranked)"
    return f"tie for fastest to {target_text}: {names} (the noise cannot order them: not ranked; the rest are slower)"


def _speedup_text(config: ConfigSummary, baseline: str) -> str:
    if config.config == baseline:
        return "the baseline"
    estimate = config.speedup_to_target
    if estimate.bounded:
        return (f"at most {format_ratio(estimate.point)} the baseline's speed to the target (upper bound "
                f"{format_ratio(estimate.interval.high)}: its jobs were stopped behind, so its time is only bounded)")
    if not_measured(estimate):
        return (f"{format_ratio(estimate.point)} the baseline's speed to the target (interval not measured, "
                f"n = {estimate.n})")
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
        lines.append("undetermined (not compared), fewer than two rounds in common with the baseline: "
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
    dominated: slower to the target than the fastest beyond the noise (the selection's intervals hold at every look,
        so dropping them is safe): no more replicates.
    decided: nothing about them is open (e.g. quality lost beyond the interval; the named fastest).
    open_decisions: in words, what the `more` ones would settle; when the budget is spent, these stayed open.
    rounds_needed: about how many rounds in all would decide every open comparison at the measured difference and
        noise (80 % power, the study's looks counted); None when no difference was measured that any number would
        likely separate. 0 when nothing is open.
    """

    more: tuple[str, ...]
    dominated: tuple[str, ...]
    decided: tuple[str, ...]
    open_decisions: tuple[str, ...]
    rounds_needed: int | None = 0


def plan_replicates(summary: SweepSummary) -> ReplicatePlan:
    """Which configurations still straddle a decision (could be the fastest while none is named, the named one's
    quality not yet certain, too few pairs), which are slower beyond the noise, and which are decided. The caller
    runs `more` until it is empty, `rounds_needed` is beyond its budget, or the budget is spent."""
    show = _namer(summary.names)
    selection = summary.selection
    open_by_config: dict[str, list[str]] = {}
    for name in summary.verdict.undetermined:
        open_by_config[name] = ["fewer than two replicates paired with the baseline"]
    if summary.verdict.kind == "tie":
        for name in summary.verdict.fastest:
            others = ", ".join(show(o) for o in summary.verdict.fastest if o != name)
            open_by_config.setdefault(name, []).append(f"could be the fastest, with {others}")
    for name in summary.verdict.fastest:
        config = summary.config(name)
        if config.quality == "unclear":
            difference = config.quality_difference
            open_by_config.setdefault(name, []).append(
                f"keeps quality? difference {difference.point:+.4g} ({difference.interval.low:+.4g} to "
                f"{difference.interval.high:+.4g}) against tolerance {summary.quality_tolerance:g}")
    dominated = list(selection.slower()) if selection is not None else []
    more = [c.config for c in summary.configs if c.config in open_by_config]
    if more and summary.baseline not in more:
        more.insert(0, summary.baseline)
    decided = [c.config for c in summary.configs if c.config not in more and c.config not in dominated]
    open_decisions = tuple(f"{show(name)}: {reason}" for name, reasons in open_by_config.items() for reason in reasons)
    return ReplicatePlan(tuple(more), tuple(dominated), tuple(decided), open_decisions,
                         _rounds_needed(summary, open_by_config))


def _rounds_needed(summary: SweepSummary, open_by_config: Mapping[str, list[str]]) -> int | None:
    """The most rounds any open speed comparison would need (mcb.replicates_to_decide at the study's looks)."""
    selection = summary.selection
    if not open_by_config:
        return 0
    if selection is None or summary.verdict.kind != "tie":
        return max((c.jobs for c in summary.configs), default=0) + 1  # quality or pairs: one more round to see
    needed = [mcb.replicates_to_decide(pair, summary.confidence, len(selection.configs), selection.indifference,
                                       summary.looks) for pair in mcb.open_pairs(selection)]
    if not needed or any(n is None for n in needed):
        return None
    return max(needed)


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
    columns = ("config", "n", *(f.named(f.csv, summary.metric_name) for f in FIGURES), "quality")
    rows = [columns] + [table_cells(c) for c in summary.configs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    return "\n".join([header, *lines])


def table_cells(config: ConfigSummary) -> list[str]:
    """One configuration's row of the per-configuration table (this text table and the report's): its name, its
    replicates, a cell per FIGURES entry (empty where it has none; samples to target with how many reached it) and
    its quality."""
    cells = []
    for figure in FIGURES:
        estimate = figure.of(config)
        cell = "" if estimate is None else estimate_text(estimate, figure.number)
        cells.append(cell + (f" [{config.reached_target}/{config.jobs}]" if figure.metric == "samples_to_target" else ""))
    return [config.config, str(config.jobs), *cells, config.quality]


# An interval of a positive figure (a speedup, a time) whose bounds lie more than this factor from its point says
# nothing a person can use: "not measured (n = 2)" says what it means.
SANE_SPAN = 1e4


def not_measured(estimate: Estimate) -> bool:
    """The interval of a positive figure spans more than SANE_SPAN on either side of its point (a 2-replicate t
    interval at a simultaneous level). An open side (∞: a job that never reached the target) is a bound, not this."""
    point, low, high = estimate.point, estimate.interval.low, estimate.interval.high
    if not (math.isfinite(point) and point > 0 and low >= 0):
        return False
    return (math.isfinite(high) and high > point * SANE_SPAN) or low < point / SANE_SPAN


def interval_text(estimate: Estimate, show) -> str:
    """`(low–high)` with `show` for each bound, or `(not measured, n = N)`."""
    if not_measured(estimate):
        return f"(not measured, n = {estimate.n})"
    return f"({show(estimate.interval.low)}–{show(estimate.interval.high)})"


def estimate_text(estimate: Estimate, number: str) -> str:
    def show(value: float) -> str:
        if math.isinf(value):
            return "∞" if value > 0 else "-∞"
        shown = number.format(value)
        # a fixed-point format of a huge bound (a 2-replicate interval's t quantile) would print dozens of digits
        return shown if len(shown) <= 9 else f"{value:.3g}"

    return f"{show(estimate.point)} {interval_text(estimate, show)}"
