"""The verdict part of a sweep's report: a `Sweep` (sweeplab.study.sweep: its jobs and their curves, read once)
into the summary and its lines, the per-configuration table (Markdown) and rows (CSV). Jobs are grouped by their
configuration and paired by their round (the sweeplab sweeper's tags: sweeplab.study.replicates); a sweep recorded
without them gets "one replicate: no verdict".
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from sweeplab.core.errors import UserError
from sweeplab.core.labels import label
from sweeplab.core.records import SWEEP, SweepRun
from sweeplab.families import get_family
from sweeplab.study import selection, verdict
from sweeplab.study.sweep import Sweep
from sweeplab.tracking import naming

NO_REPLICATE_TAGS = verdict.ONE_REPLICATE.replace("one replicate: no verdict (", "one replicate: no verdict (this "
                                                  "sweep's jobs carry no replicate tags: it ran before replicates "
                                                  "existed, or with a sweeper that runs each job once; ", 1)


# the sweep run's record of what its verdict was asked (sweep.callback.verdict_option_tags)


@dataclass(frozen=True)
class VerdictOptions:
    """What the report's verdict is asked (`report.target`, `report.quality_tolerance`, `report.indifference` of
    the sweep's config, or the flags of `python -m sweeplab.report`). baseline_run: a run whose configuration is the
    baseline (None: the first configuration of the grid). looks: how many times the study may read its verdict to
    decide whether to run more (replicates=auto: its rounds from `first` to `most`), so that its intervals hold at
    every look; recorded on the sweep run, so a report run again reads the same intervals."""

    target: float | None = None
    quality_tolerance: float | None = None  # None: the family's quality_tolerance, else derived from the spread
    baseline_run: str | None = None
    indifference: float = 1.0
    looks: selection.Looks | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.indifference) and self.indifference >= 1.0):
            raise UserError(f"{SWEEP.indifference}: expected a ratio >= 1 (1.1: the verdict may name the "
                            f"fastest or one within 1.1x of it; 1: none), got {self.indifference}")

    def tags(self) -> dict[str, str]:
        """As the sweep run's tags: `python -m sweeplab.report` run again on the sweep asks the same question unless
        its flags say otherwise."""
        return self.record().to_mlflow().tags

    def record(self) -> SweepRun:
        """The sweep run's fields these options fill (`tags`)."""
        return SweepRun(target=self.target, quality_tolerance=self.quality_tolerance,
                        indifference=self.indifference if self.indifference != 1.0 else None,
                        looks=f"{self.looks.first}-{self.looks.most}" if self.looks is not None else None)

    @classmethod
    def of_sweep(cls, run: SweepRun, *, target: float | None = None, quality_tolerance: float | None = None,
                 indifference: float | None = None, baseline_run: str | None = None) -> VerdictOptions:
        """The options a sweep ran with (its run's record, `record`'s fields), each overridden where a flag gives
        one."""
        def given(flag: float | None, recorded: float | None) -> float | None:
            return flag if flag is not None else recorded

        first, _, most = (run.looks or "").partition("-")
        looks = selection.Looks(int(first), int(most)) if first.isdigit() and most.isdigit() else None
        return cls(given(target, run.target), given(quality_tolerance, run.quality_tolerance), baseline_run,
                   given(indifference, run.indifference) or 1.0, looks)


@dataclass(frozen=True)
class VerdictReport:
    """summary: None when the sweep has no replicate tags or too little to summarize; lines: the verdict's text,
    first line first (always at least one)."""

    summary: verdict.SweepSummary | None
    lines: tuple[str, ...]




def _family_of(sweep: Sweep):
    """The family most of the jobs trained; None when unknown or not installed where the report runs."""
    families = Counter(j.family for j in sweep.jobs)
    try:
        return get_family(families.most_common(1)[0][0]) if families else None
    except UserError:
        return None


def quality_tolerance(sweep: Sweep, asked: float | None) -> tuple[float | None, str]:
    """The verdict's quality tolerance and where it came from: the sweep's (or the flag's), else the family's
    declared default, else None (derived from the replicates' spread by the verdict)."""
    if asked is not None:
        return asked, SWEEP.quality_tolerance
    family = _family_of(sweep)
    if family is not None and family.quality_tolerance is not None:
        return family.quality_tolerance, f"the {family.name} family's default"
    return None, ""


def smoke_budget(sweep: Sweep) -> bool:
    """Whether the jobs ran with the debug=smoke preset (their `preset.debug` tag)."""
    return any((j.run.presets or {}).get("debug") == "smoke" for j in sweep.jobs)


def baseline_config(sweep: Sweep, jobs: list[verdict.Job], baseline_run: str | None) -> str:
    """The configuration of the job `baseline_run` names (Sweep.baseline_job: the report's one reading of
    `--baseline`) when given, else the grid's first (config_index 0), else the first job's."""
    configs = {j.config for j in jobs}
    named = sweep.baseline_job(baseline_run)
    if named is not None:
        if named.config not in configs:
            raise UserError(f"--baseline {baseline_run!r}: {named.name} belongs to no configuration with a finished "
                            "replicated job")
        return named.config
    first = [j.config for j in sweep.jobs if j.config_index == 0]
    return next((c for c in first if c in configs), jobs[0].config)


def pair_by(jobs: list[verdict.Job]) -> verdict.PairBy:
    """"round" when each round ran on one host (a workstation, one GPU machine: the round order cancels drift);
    "host" when a round's jobs ran on several (a cluster launcher such as SLURM, where run order means little and
    hosts differ in speed): then a configuration is compared with the baseline on the same host."""
    hosts_per_round: dict[int, set] = {}
    for job in jobs:
        hosts_per_round.setdefault(job.round, set()).add(job.host)
    return "host" if any(len(hosts) > 1 for hosts in hosts_per_round.values()) else "round"


def sweep_verdict(sweep: Sweep, options: VerdictOptions = VerdictOptions()) -> VerdictReport:
    """The sweep's summary and verdict lines from its jobs."""
    if not sweep.replicated:
        return VerdictReport(None, (NO_REPLICATE_TAGS,))
    jobs = sweep.verdict_jobs()
    if not jobs:
        return VerdictReport(None, ("no verdict: no job of this sweep finished with a throughput",))
    tolerance, tolerance_source = quality_tolerance(sweep, options.quality_tolerance)
    family = _family_of(sweep)
    labels = family.labels if family is not None else {}
    names = naming.configuration_run_names(dict.fromkeys(j.config for j in jobs), labels)
    try:
        summary = verdict.summarize(
            jobs, baseline=baseline_config(sweep, jobs, options.baseline_run), mode=sweep.mode, target=options.target,
            quality_tolerance=tolerance, tolerance_source=tolerance_source, metric_name=sweep.metric,
            pair_by=pair_by(jobs), smoke_budget=smoke_budget(sweep), names=names, looks=options.looks,
            indifference=options.indifference,
        )
    except ValueError as exc:  # e.g. no final metric to derive a target from
        return VerdictReport(None, (f"no verdict: {exc}",))
    notes = [*summary.notes]
    if (saved := sweep.stopping_saved()) is not None:
        samples, total, seconds = saved
        if total:
            notes.append(f"stopping what was decided (stop.*) saved {samples:,.0f} of the {total:,.0f} training "
                         f"samples the jobs would have trained to their last step ({samples / total:.0%}), about "
                         f"{seconds:,.0f} s of training")
        else:  # no job recorded trainer.max_steps (a run trained to max_epochs, or by a family without it)
            notes.append("stopping what was decided (stop.*) stopped jobs early; what it saved is not known: no job "
                         "recorded its last step (trainer.max_steps)")
        notes.append("Pareto front (speedup to target x final metric, point estimates): "
                     + ", ".join(names.get(c, c) for c in verdict.speed_quality_front(summary)))
    legend = label_legend(names, labels)
    return VerdictReport(summary, (*summary.verdict.lines, *(f"note: {n}" for n in notes),
                                   *([f"note: labels: {legend}"] if legend else [])))


def label_legend(names: Mapping[str, str], labels: Mapping[str, str] | None) -> str:
    """What the short labels of the configurations' names stand for ("bs = data.batch_size, α = loss.alpha");
    "" when every name is its keys."""
    keys = {k: None for config in names for k in naming.config_values(config)}
    return ", ".join(f"{label(k, labels)} = {k}" for k in keys if label(k, labels) != k)


# --- the per-configuration table --------------------------------------------------------------------------------------

def config_columns(summary: verdict.SweepSummary) -> list[str]:
    """The per-configuration table's columns, short so that the table fits MLflow's Markdown viewer (config_legend
    says what each is); the final metric's column is named by the metric."""
    return ["configuration", "n", *(f.named(f.column, summary.metric_name) for f in verdict.FIGURES), "quality"]


def config_header(summary: verdict.SweepSummary, names: Mapping[str, str] | None = None) -> str:
    """The line above the table: the baseline and the intervals' levels (the target is the verdict's `target:` line,
    said once on the page)."""
    return verdict.table_header(summary, with_target=False, names=names)


def config_rows(summary: verdict.SweepSummary, names: Mapping[str, str]) -> list[dict[str, str]]:
    """One row per configuration ({column: cell}, each figure `median (low–high)`), named by its short name
    (`names`: configuration -> `bs=64 α=0.7`, as report.figures' pictures and the run names say it)."""
    columns = config_columns(summary)
    rows = []
    for config in summary.configs:
        cells = verdict.table_cells(config)
        cells[0] = names.get(config.config, config.config)
        rows.append(dict(zip(columns, cells)))
    return rows


def config_legend(summary: verdict.SweepSummary, labels: Mapping[str, str] | None = None) -> str:
    """One line saying what the short labels and columns of the per-configuration table mean."""
    keys = {k: None for c in summary.configs for k in naming.config_values(c.config)}
    named = ", ".join(f"{label(k, labels)} = {k}" for k in keys if label(k, labels) != k)
    metric, sign = summary.metric_name, "≥" if summary.mode == "max" else "≤"
    columns = "; ".join(f"{f.named(f.column, metric)}: {f.legend}" for f in verdict.FIGURES)
    return ((f"{named}. " if named else "")
            + f"Cells: median (95 % t interval) over the replicates. n: replicates; {columns}. The target: {metric} "
            f"{sign} {summary.target:.4g}. Speedups and Δ are paired with the baseline's job of the same round, with "
            f"simultaneous intervals (Bonferroni): docs/verdict.md")


def config_csv_rows(summary: verdict.SweepSummary) -> list[dict[str, object]]:
    """One CSV row per configuration: each figure's point, low and high as numbers."""
    rows = []
    for config in summary.configs:
        row: dict[str, object] = {"row": "configuration", "configuration": config.config, "jobs": config.jobs,
                                  "reached target": config.reached_target, "quality": config.quality}
        figures = {f.named(f.csv, summary.metric_name): f.of(config) for f in verdict.FIGURES}
        for name, estimate in figures.items():
            if estimate is not None:
                row[name] = estimate.point
                row[f"{name} low"], row[f"{name} high"] = estimate.interval.low, estimate.interval.high
        rows.append(row)
    return rows
