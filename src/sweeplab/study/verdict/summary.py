"""Per-configuration answers: `summarize` groups the jobs, judges quality on each job's best validation, picks the
target, times each job to it, compares the configurations (sweeplab.study.selection) and calls `decide`."""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

import numpy as np

from sweeplab.study import selection as mcb
from sweeplab.study.verdict.decision import _left_out_reason, decide
from sweeplab.study.verdict.intervals import (
    difference_from_pairs,
    median_of_positive,
    median_of_values,
    ratio_from_log_ratios,
    simultaneous_level,
)
from sweeplab.study.verdict.pairing import _log_ratios, _pair_key, paired_values
from sweeplab.study.verdict.records import (
    CONFIDENCE,
    ConfigSummary,
    Estimate,
    Interval,
    Job,
    JobAtTarget,
    Mode,
    PairBy,
    Quality,
    SweepSummary,
    measured_per_job,
)
from sweeplab.study.verdict.target import default_target, job_at_target
from sweeplab.study.verdict.text import _namer

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
    quality_tolerance, tolerance_source = _tolerance(quality_tolerance, tolerance_source, by_config[baseline],
                                                     metric_name)
    comparisons = len(by_config) - 1
    # Both speed columns can say "faster": one family. Quality claims are of another kind: a family of their own.
    speed_level = simultaneous_level(confidence, 2 * comparisons) if adjust_for_multiple_comparisons else confidence
    quality_level = simultaneous_level(confidence, comparisons) if adjust_for_multiple_comparisons else confidence
    quality = {name: _quality(name_jobs, by_config[baseline], name == baseline, mode, quality_tolerance,
                              quality_level, pair_by) for name, name_jobs in by_config.items()}
    stopped_at_target = any(j.stopped_at_target for js in by_config.values() for j in js)
    if stopped_at_target:  # each job's metric is the target's give or take the validation grid: not compared
        quality = {name: (q if name == baseline else (q[0], "at target", True)) for name, q in quality.items()}
    target, target_source = _choose_target(by_config, quality, target, mode, metric_name, _namer(names),
                                           quality_tolerance)
    at_target = {name: [job_at_target(j, target, mode) for j in name_jobs] for name, name_jobs in by_config.items()}
    configs = tuple(_config_summary(name, at_target[name], at_target[baseline], quality[name], name == baseline,
                                    confidence, speed_level, pair_by) for name in by_config)
    target_text = f"{metric_name} {'≥' if mode == 'max' else '≤'} {target:.4g}"
    tolerance_text = _tolerance_text(quality_tolerance, tolerance_source, metric_name, stopped_at_target)
    stopped_behind = {name for name, js in by_config.items() if all(j.censored_samples is not None for j in js)}
    times = {name: _times(at_target[name], pair_by) for name in by_config}
    undetermined = tuple(name for name in by_config
                         if name != baseline and len(times[name].keys() & times[baseline].keys()) < 2)
    candidates = _candidates(configs, undetermined, stopped_behind)
    selection = mcb.select({c.config: times[c.config] for c in candidates}, confidence=confidence, looks=looks,
                           indifference=indifference) if len(candidates) >= 2 else None
    if adjust_for_multiple_comparisons:  # the speed columns at the level the decision used (_as_decided)
        configs = tuple(_as_decided(c, times, baseline, selection, confidence, looks, len(candidates), at_target,
                                    pair_by) for c in configs)
        speed_level = min([c.speedup.interval.level for c in configs if c.config != baseline] or [speed_level])
    verdict = decide(configs, baseline, target_text, target_source, tolerance_text=tolerance_text,
                     smoke_budget=smoke_budget, names=names, selection=selection, undetermined=undetermined)
    return SweepSummary(
        baseline=baseline, metric_name=metric_name, mode=mode, target=target, target_source=target_source,
        quality_tolerance=quality_tolerance, confidence=confidence, comparisons=comparisons, speed_level=speed_level,
        quality_level=quality_level, pair_by=pair_by, configs=configs, jobs_at_target=tuple(a for name in by_config for a in at_target[name]),
        verdict=verdict,
        notes=_notes(configs, [j for js in by_config.values() for j in js], pair_by, names, mode, metric_name,
                     quality_tolerance, target),
        tolerance_source=tolerance_source, names=dict(names or {}), selection=selection, looks=looks,
        indifference=indifference,
    )


def _tolerance(given: float | None, source: str, baseline_jobs: Sequence[Job], metric_name: str) -> tuple[float, str]:
    """The quality tolerance and where it came from: given (with its source, else "given"), else derived."""
    if given is not None:
        return given, source or "given"
    return derived_tolerance(baseline_jobs), (f"derived: the standard deviation of the baseline's best {metric_name} "
                                              "over its replicates (a difference smaller than seed-to-seed noise is no "
                                              "loss of quality)")


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
    (policies/stopping.py) or at the target, whose values are wherever they were stopped, not what training ends at."""
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
        measured={key: median_of_positive(values, confidence) for key in measured_per_job()
                  if (values := [j.measured[key] for j in jobs if j.measured.get(key)])},
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


def _as_decided(config: ConfigSummary, times: Mapping[str, Mapping[tuple, mcb.TimeAtTarget]], baseline: str,
                selection: mcb.Selection | None, confidence: float, looks: mcb.Looks | None, compared: int,
                at_target: Mapping[str, list[JobAtTarget]], pair_by: PairBy) -> ConfigSummary:
    """The configuration's speed comparisons with the baseline at the level its decision used at this look: the
    speedup to target is the selection's interval of its pair with the baseline (the same pair's look, the same
    share of α, the same censored rounds); a configuration the selection did not compare gets the interval it would
    have had there. The samples/s speedup is read at that same level. A reader never sees a fixed-size interval
    that excludes 1 beside a tie decided at a stricter look (issue 59)."""
    if config.config == baseline:
        return config
    if selection is not None and config.config in selection.configs and baseline in selection.configs:
        pair = selection.comparison(config.config, baseline)
    else:
        rounds = len(times[config.config].keys() & times[baseline].keys())
        level = mcb.looked_level(confidence, max(compared, 2), looks, rounds)
        pair = mcb.compare(config.config, baseline, times[config.config], times[baseline], level)
    two_sided = 2 * pair.level - 1
    to_target = Estimate(math.exp(pair.center) if math.isfinite(pair.center) else math.nan,
                         Interval(math.exp(pair.low), math.exp(pair.high), two_sided), pair.n,
                         bounded=config.speedup_to_target.bounded)
    speedup = _speedup(at_target[config.config], at_target[baseline], False, two_sided, pair_by, "samples_per_sec")
    return dataclasses.replace(config, speedup_to_target=to_target, speedup=speedup)


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
