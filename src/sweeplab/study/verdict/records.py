"""The verdict's records: the jobs in, the estimates, summaries and verdict out, and the table of per-configuration
figures every reader iterates (FIGURES)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from sweeplab.core.records import JOB
from sweeplab.study import selection as mcb

Mode = Literal["max", "min"]
PairBy = Literal["round", "host"]
Quality = Literal["baseline", "keeps", "unclear", "loses", "unknown", "at target"]
VerdictKind = Literal["fastest", "tie", "undecided", "no verdict"]

CONFIDENCE = 0.95




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
        target (policies/stopping.py, `stop.behind`); its time to target is then only known to be longer than that.
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
    # what the job's run measured, by its metric's key, for the figures summarised over a configuration's jobs
    # (Figure.per_job): e.g. summary/peak_mem_mb
    measured: Mapping[str, float] = field(default_factory=dict)

    @property
    def kept_metric(self) -> float | None:
        """The metric of the checkpoint the job keeps: its best validation, else its final one."""
        return self.best_metric if self.best_metric is not None else self.final_metric

    def validation_points(self) -> list[ValidationPoint]:
        """The curve as ValidationPoints, in the order training saw them."""
        points = [p if isinstance(p, ValidationPoint) else ValidationPoint(*p) for p in self.curve]
        return sorted(points, key=lambda p: p.samples_seen)




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
    # each per-job figure (Figure.per_job: its jobs' run metric) as the median over the jobs that recorded it, with
    # its 95 % interval; a figure none of them recorded is absent
    measured: Mapping[str, Estimate] = field(default_factory=dict)


@dataclass(frozen=True)
class Figure:
    """One per-configuration figure, as every reader names and shows it: the report's table (`column`, a cell
    `median (low–high)` in `number`'s format), report.csv (`csv`, with ` low` and ` high`), the configuration runs'
    metrics (`metric`, with `_low` and `_high`) and, where `view` > 0, the MLflow view's text column and chart (in
    that order). `{metric}` in a name stands for the monitored metric's (`val/cos`), `{metric_key}` for it inside a
    key (`val_cos`). `legend`: what the column says, for the line under the table. A figure the verdict derives
    (speedups, time to target) is a ConfigSummary field, the line that computes it and an entry here; a figure each
    job's run measures (`per_job`: the run's metric, e.g. `summary/peak_mem_mb`) is only its entry here: the study
    reads that metric of every job and the summary takes its median with its interval."""

    column: str
    csv: str
    metric: str
    number: str
    of: Callable[[ConfigSummary], Estimate | None] | None
    legend: str
    view: int = 0
    per_job: str | None = None

    def __post_init__(self) -> None:
        if self.of is None:  # a per-job figure: its summary is the median the configuration's summary holds
            object.__setattr__(self, "of", lambda c: c.measured.get(self.per_job))

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
    Figure("peak MB", "peak memory (MB)", "peak_mem_mb", "{:.4g}", None,
           "the most memory a job held (CUDA or MPS: the device's; CPU: the process's)", per_job=JOB.peak_mem_mb),
)


def measured_per_job() -> list[str]:
    """The run metrics the per-job figures summarise (Figure.per_job), which the study reads of every job."""
    return [f.per_job for f in FIGURES if f.per_job]


def figures_table() -> str:
    """The report's per-configuration figures as docs/verdict.md lists them (a Markdown table, one row per entry of
    FIGURES: its report.md column, its report.csv column, its configuration run's metric, what it says);
    tests/test_docs.py keeps the page's copy equal to this, so a figure added here is documented there."""
    metric = "val/cos"  # TextBridge's, standing for the study's monitored metric
    rows = ["| report.md | report.csv (with ` low`, ` high`) | configuration run's metric (with `_low`, `_high`) | "
            "what it says |", "|---|---|---|---|"]
    rows += [f"| {f.named(f.column, metric)} | {f.named(f.csv, metric)} | `{f.named(f.metric, metric)}` | {f.legend} |"
             for f in FIGURES]
    return "\n".join(rows) + "\n"


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
    keeps it open, the replicates a fixed-size study would need to decide it and their assurance
    (selection.PrintedCount; None: no difference measured)."""

    kind: VerdictKind
    fastest: tuple[str, ...]
    speedup_to_target: Mapping[str, Estimate]
    undetermined: tuple[str, ...]
    reason: str
    lines: tuple[str, ...]
    caveat: str = ""
    within: float = 1.0
    to_decide: Mapping[str, mcb.PrintedCount | None] = field(default_factory=dict)
    # configuration -> why it is left out, in a few words ("slower than bs=32 α=1", "quality lost beyond tolerance")
    left_out: Mapping[str, str] = field(default_factory=dict)

    def text(self) -> str:
        return "\n".join(self.lines)

    @property
    def qualifier(self) -> str:
        """What every place that names a winner says beside it (the `best:` line, the sweep run's `best_verdict`
        tag, the configuration runs' `verdict` tag): "not an answer" when the study cannot carry a verdict, "of
        those compared" while a configuration is undetermined (it was never compared: it could be faster)."""
        if self.kind not in ("fastest", "tie"):
            return ""
        words = ["not an answer"] if self.caveat else []
        if self.undetermined:
            words.append(f"of those compared; {len(self.undetermined)} undetermined")
        return ", ".join(words)

    def qualified(self, words: str) -> str:
        """`words` naming the winner, with the qualifier in parentheses when there is one."""
        return f"{words} ({self.qualifier})" if self.qualifier else words

    @property
    def best_line(self) -> str:
        """The answer in one line, as the sweep's closing `best:` line says it: the headline, after the reason the
        study cannot carry a verdict when it cannot."""
        if not self.caveat:
            return self.headline
        why = self.caveat.split(": ", 1)[-1].split(";", 1)[0]
        return f"not an answer ({why}): {self.headline}"

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
