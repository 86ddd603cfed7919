"""The verdict part of a sweep's report: MLflow runs into sweeplab.study.verdict's `Job` records, the summary, its lines,
the per-configuration table (Markdown) and rows (CSV).

A job's curve is its family's monitored metric (e.g. val/cos) at each validation against the training samples seen
by then: Lightning logs the validation after n optimizer steps at step n - 1, so samples seen = (step + 1) x
samples per step (batch size x gradient accumulation x data-parallel devices). Its samples/s is
`summary/samples_per_sec`, which leaves validation and checkpoint pauses out; its wall seconds at each validation
(time since the run started) give the wall time to target beside it. Jobs are grouped by their `config` tag and
paired by their `round` tag (tags the sweeplab sweeper gives every job: sweeplab.study.replicates); a sweep recorded
without them has one job per configuration as far as anyone can tell, and gets "one replicate: no verdict".
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from sweeplab.core.errors import UserError
from sweeplab.core.labels import label
from sweeplab.families import get_family
from sweeplab.study import verdict
from sweeplab.tracking import mlflow_store, naming
from sweeplab.tracking.schema import (
    BATCH_SIZE_USED_TAG,
    CONFIG_INDEX_TAG,
    CONFIG_TAG,
    REPLICATE_TAG,
    ROUND_TAG,
)

THROUGHPUT = "summary/samples_per_sec"
NO_REPLICATE_TAGS = verdict.ONE_REPLICATE.replace("one replicate: no verdict (", "one replicate: no verdict (this "
                                                  "sweep's jobs carry no replicate tags: it ran before replicates "
                                                  "existed, or with a sweeper that runs each job once; ", 1)


# the sweep run's record of what its verdict was asked (sweep_callback.verdict_option_tags)


@dataclass(frozen=True)
class VerdictOptions:
    """What the report's verdict is asked (`report.target`, `report.quality_tolerance` of the sweep's config, or
    the flags of `python -m sweeplab.report`). baseline_run: a run whose configuration is the baseline (None: the
    first configuration of the grid)."""

    target: float | None = None
    quality_tolerance: float | None = None  # None: the family's quality_tolerance, else derived from the spread
    baseline_run: str | None = None


@dataclass(frozen=True)
class VerdictReport:
    """summary: None when the sweep has no replicate tags or too little to summarize; lines: the verdict's text,
    first line first (always at least one)."""

    summary: verdict.SweepSummary | None
    lines: tuple[str, ...]




def batch_size(run) -> str:
    """The batch size a job trained with: `data.batch_size`, or the tag saying it used less (a training split
    smaller than the batch is trained on whole); '' when neither is recorded."""
    return run.data.tags.get(BATCH_SIZE_USED_TAG) or run.data.params.get("data.batch_size", "")


def samples_per_step(run) -> int | None:
    """Training samples one optimizer step consumes: batch size x gradient accumulation x data-parallel devices."""
    params = run.data.params
    try:
        return (
            int(batch_size(run))
            * int(params.get("trainer.accumulate_grad_batches", 1))
            * int(params.get("trainer.devices", 1))
        )
    except (KeyError, ValueError):
        return None


def _family_of(runs):
    """The family most of the runs trained; None when unknown or not installed where the report runs."""
    families = Counter(r.data.tags.get("family", "") for r in runs)
    try:
        return get_family(families.most_common(1)[0][0]) if families else None
    except UserError:
        return None


def monitored_metric(runs) -> tuple[str, verdict.Mode]:
    """The monitored metric and its direction of the family most of the runs trained."""
    family = _family_of(runs)
    if family is None:
        return "val/loss", "min"
    return family.monitor, "max" if family.monitor_mode == "max" else "min"


def quality_tolerance(runs, asked: float | None) -> tuple[float | None, str]:
    """The verdict's quality tolerance and where it came from: the sweep's (or the flag's), else the family's
    declared default, else None (derived from the replicates' spread by the verdict)."""
    if asked is not None:
        return asked, "report.quality_tolerance"
    family = _family_of(runs)
    if family is not None and family.quality_tolerance is not None:
        return family.quality_tolerance, f"the {family.name} family's default"
    return None, ""


def smoke_budget(runs) -> bool:
    """Whether the jobs ran with the debug=smoke preset (their `preset.debug` tag)."""
    return any(r.data.tags.get("preset.debug") == "smoke" for r in runs)


def has_replicate_tags(runs) -> bool:
    return any(REPLICATE_TAG in r.data.tags and CONFIG_TAG in r.data.tags for r in runs)


def verdict_job(client, run, metric: str) -> verdict.Job | None:
    """One finished run as a verdict Job; None when it has no throughput, batch size or replicate tags."""
    tags, rate, per_step = run.data.tags, run.data.metrics.get(THROUGHPUT), samples_per_step(run)
    if run.info.status != "FINISHED" or not rate or not per_step or REPLICATE_TAG not in tags:
        return None
    history = sorted(client.get_metric_history(run.info.run_id, metric), key=lambda m: (m.step, m.timestamp))
    start_ms = run.info.start_time or (history[0].timestamp if history else 0)
    curve = [verdict.ValidationPoint((m.step + 1) * per_step, m.value, (m.timestamp - start_ms) / 1000)
             for m in history if math.isfinite(m.value)]
    return verdict.Job(
        config=tags.get(CONFIG_TAG, ""),
        replicate=int(tags[REPLICATE_TAG]),
        round=int(tags.get(ROUND_TAG, tags[REPLICATE_TAG])),
        samples_per_sec=float(rate),
        final_metric=curve[-1].value if curve else None,
        curve=curve,
        host=tags.get("host") or None,
        concurrent_jobs=int(tags.get("concurrent_jobs", "1") or 1),
    )


def baseline_config(runs, jobs: list[verdict.Job], baseline_run: str | None) -> str:
    """The configuration of `baseline_run` (a run-name substring or run-id prefix) when given, else the grid's
    first (config_index 0), else the first job's."""
    configs = {j.config for j in jobs}
    if baseline_run is not None:
        for r in runs:
            name = r.data.tags.get("mlflow.runName", "")
            if (baseline_run in name or r.info.run_id.startswith(baseline_run)) and r.data.tags.get(CONFIG_TAG) in configs:
                return r.data.tags[CONFIG_TAG]
        raise UserError(f"--baseline {baseline_run!r}: no finished run of this sweep matches it")
    first = [r.data.tags.get(CONFIG_TAG) for r in runs if r.data.tags.get(CONFIG_INDEX_TAG) == "0"]
    return next((c for c in first if c in configs), jobs[0].config)


def pair_by(jobs: list[verdict.Job]) -> verdict.PairBy:
    """"round" when each round ran on one host (a workstation, one GPU machine: the round order cancels drift);
    "host" when a round's jobs ran on several (a cluster launcher such as SLURM, where run order means little and
    hosts differ in speed): then a configuration is compared with the baseline on the same host."""
    hosts_per_round: dict[int, set] = {}
    for job in jobs:
        hosts_per_round.setdefault(job.round, set()).add(job.host)
    return "host" if any(len(hosts) > 1 for hosts in hosts_per_round.values()) else "round"


def sweep_verdict(uri: str, runs, options: VerdictOptions = VerdictOptions()) -> VerdictReport:
    """The sweep's summary and verdict lines from its job runs."""
    runs = [r for r in runs if r.data.tags.get("sweeplab.role") != "sweep"]
    if not has_replicate_tags(runs):
        return VerdictReport(None, (NO_REPLICATE_TAGS,))
    metric, mode = monitored_metric(runs)
    client = mlflow_store.client(uri)
    jobs = [j for r in runs if (j := verdict_job(client, r, metric)) is not None]
    if not jobs:
        return VerdictReport(None, ("no verdict: no job of this sweep finished with a throughput",))
    tolerance, tolerance_source = quality_tolerance(runs, options.quality_tolerance)
    family = _family_of(runs)
    labels = family.labels if family is not None else {}
    names = naming.configuration_run_names(dict.fromkeys(j.config for j in jobs), labels)
    try:
        summary = verdict.summarize(
            jobs, baseline=baseline_config(runs, jobs, options.baseline_run), mode=mode, target=options.target,
            quality_tolerance=tolerance, tolerance_source=tolerance_source, metric_name=metric, pair_by=pair_by(jobs),
            smoke_budget=smoke_budget(runs), names=names,
        )
    except ValueError as exc:  # e.g. no final metric to derive a target from
        return VerdictReport(None, (f"no verdict: {exc}",))
    legend = label_legend(names, labels)
    return VerdictReport(summary, (*summary.verdict.lines, *(f"note: {n}" for n in summary.notes),
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
    return ["configuration", "n", "samples/s", "speedup", "samples→target", "t→target (s)", "wall t→target (s)",
            "speedup→target", summary.metric_name, "Δ", "quality"]


def config_header(summary: verdict.SweepSummary, names: Mapping[str, str] | None = None) -> str:
    """The line above the table: the baseline and the intervals' levels (the target is the verdict's `target:` line,
    said once on the page)."""
    return verdict.table_header(summary, with_target=False, names=names)


def config_rows(summary: verdict.SweepSummary, names: Mapping[str, str]) -> list[dict[str, str]]:
    """One row per configuration ({column: cell}, each figure `median (low–high)`), named by its short name
    (`names`: configuration -> `bs=64 α=0.7`, as report_figures' pictures and the run names say it)."""
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
    return ((f"{named}. " if named else "")
            + f"Cells: median (95 % t interval) over the replicates. n: replicates; samples/s: training throughput; "
            f"speedup: samples/s over the baseline's; samples→target: training samples until {metric} {sign} "
            f"{summary.target:.4g} [replicates that reached it]; t→target: samples→target / samples/s (s of training, "
            f"validation and checkpoint pauses excluded); wall t→target: wall-clock s since the job started; "
            f"speedup→target: the baseline's t→target / this one's; {metric}: final value; Δ: {metric} minus the "
            f"baseline's. Speedups and Δ are paired with the baseline's job of the same round, with simultaneous "
            f"intervals (Bonferroni): docs/verdict.md")


def config_csv_rows(summary: verdict.SweepSummary) -> list[dict[str, object]]:
    """One CSV row per configuration: each figure's point, low and high as numbers."""
    rows = []
    for config in summary.configs:
        row: dict[str, object] = {"row": "configuration", "configuration": config.config, "jobs": config.jobs,
                                  "reached target": config.reached_target, "quality": config.quality}
        figures = {
            "samples/s": config.samples_per_sec, "speedup": config.speedup,
            "samples to target": config.samples_to_target, "time to target (s)": config.time_to_target,
            "wall time to target (s)": config.wall_time_to_target, "speedup to target": config.speedup_to_target,
            f"final {summary.metric_name}": config.final_metric, "Δ vs baseline": config.quality_difference,
        }
        for name, estimate in figures.items():
            if estimate is not None:
                row[name] = estimate.point
                row[f"{name} low"], row[f"{name} high"] = estimate.interval.low, estimate.interval.high
        rows.append(row)
    return rows
