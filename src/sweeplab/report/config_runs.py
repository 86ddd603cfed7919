"""The sweep's verdict in MLflow: one run per configuration, nested under the sweep's parent run, with the
per-configuration answers as metrics; and the verdict's text as the sweep run's description.

A configuration run (tag `sweeplab.role=configuration`) holds, for its configuration of a replicated sweep: the
medians over its replicates with their 95 % interval bounds (`samples_per_sec`, `samples_per_sec_low`,
`samples_per_sec_high`, `samples_to_target...`, `time_to_target_s...`, `wall_time_to_target_s...`,
`final_<metric>...`), the comparisons with the baseline with their simultaneous bounds (`speedup...`,
`speedup_to_target...`, `quality_delta...`), `jobs`, `reached_target` and `target`; its swept keys as params (the
jobs' param names, so the compare view lines them up with the jobs); tags `config`, `quality`, `verdict` (fastest |
tied for fastest | fastest (or within 1.1x) | left out | undetermined | no verdict), `target` (`val/cos ≥ 0.5364`),
`sweeplab.verdict_order` (the saved view's sort), `baseline`, `job_run_ids` (its jobs, which stay under the sweep
run: the report, the job counts, `best_*` and resuming read the sweep's children as its jobs). An infinite or undefined figure (a
target not reached in most replicates, an interval with no bound on a side) is not logged: its cell stays empty.

Writing them again (a report re-run) deletes the sweep's previous configuration runs first: one run per
configuration, never two. A sweep with one replicate per configuration gets none (its jobs are the rows already).
"""

from __future__ import annotations

import math
import re
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence

from sweeplab.core import schema, stability
from sweeplab.report import saved_view
from sweeplab.study import caveats
from sweeplab.study.sweep import JobRecord, Sweep
from sweeplab.study.verdict import (
    FIGURES,
    ConfigSummary,
    Estimate,
    Job,
    SweepSummary,
    Verdict,
    estimate_text,
    not_measured,
    shown_in_the_view,
)
from sweeplab.tracking import mlflow_store, naming
from sweeplab.tracking.mlflow_store import RunRecord

NOTE_TAG = "mlflow.note.content"  # the UI's "Description" of a run (Markdown)
JOB_IDS_TAG = "job_run_ids"
MAX_TAG_CHARS = 8000  # MLflow's limit on a tag's value
STABILITY_TAG = "stability"


def configuration_runs(uri: str, parent_run_id: str) -> list[RunRecord]:
    """The configuration runs under a sweep's parent run (active ones), in the order they were written."""
    store = mlflow_store.client(uri)
    parent = store.get_run(parent_run_id)
    return [mlflow_store.record_of(r) for r in store.search_runs(
        [parent.info.experiment_id],
        filter_string=(f"tags.mlflow.parentRunId = '{parent_run_id}' and "
                       f"tags.`{mlflow_store.ROLE_TAG}` = '{mlflow_store.CONFIGURATION_ROLE}'"),
        max_results=10000,
        order_by=["attributes.start_time ASC"],
    )]


def metric_key(metric_name: str) -> str:
    """A metric's name inside another metric's name: `val/cos` -> `val_cos` (`final_val_cos`)."""
    return metric_name.replace("/", "_")


def configuration_metrics(config: ConfigSummary, summary: SweepSummary) -> dict[str, float]:
    """The configuration's figures as MLflow metrics: `<name>` (median, ratio or difference), `<name>_low` and
    `<name>_high` (its interval); infinite and NaN values left out."""
    figures: dict[str, Estimate | None] = {f.named(f.metric, summary.metric_name): f.of(config) for f in FIGURES}
    metrics = {"jobs": float(config.jobs), "reached_target": float(config.reached_target), "target": summary.target}
    for name, estimate in figures.items():
        if estimate is not None:
            metrics.update(_bounds(name, estimate))
    return {name: float(value) for name, value in metrics.items() if math.isfinite(value)}


def _bounds(name: str, estimate: Estimate) -> dict[str, float]:
    """A figure's point and bounds as metrics; bounds nobody can use (verdict.not_measured: the cells read `not
    measured`) stay out, as an infinite one does."""
    if not_measured(estimate):
        return {name: estimate.point}
    return {name: estimate.point, f"{name}_low": estimate.interval.low, f"{name}_high": estimate.interval.high}


def figure_tag_names(metric_name: str) -> tuple[str, ...]:
    """The text tags of the figures the MLflow view shows (verdict.FIGURES' `view`), named as report.csv names them."""
    return tuple(f.named(f.csv, metric_name) for f in shown_in_the_view())


BASELINE_SPEEDUP = "1 (the baseline)"  # the baseline's speedup cells: the word on its row, not `1.00 (1.00–1.00)`


def figure_tags(config: ConfigSummary, summary: SweepSummary) -> dict[str, str]:
    """The figures the comparison shows as text, `median (low–high)` as in the report (verdict.estimate_text: an
    interval too wide to mean anything reads `not measured`), one tag each (a readable runs-table column; the
    metrics of the same figures sort and chart). The baseline's speedup says that it is the baseline."""
    figures = {f.named(f.csv, summary.metric_name): (f.of(config), f.number) for f in shown_in_the_view()}
    tags = {name: estimate_text(estimate, number) for name, (estimate, number) in figures.items() if estimate is not None}
    if config.config == summary.baseline and "speedup to target" in tags:
        tags["speedup to target"] = BASELINE_SPEEDUP
    return tags


def stability_text(jobs: Iterable[JobRecord]) -> str:
    """How far the configuration's speed can be trusted, from its jobs' stability figures: `ok`, or how many of its
    jobs were unreliable and why (each reason's first words, as the report's stability column words them)."""
    runs = [j for j in jobs if stability.has_stability_data(j.metrics)]
    found = [stability.problems(j.metrics, j.tags) for j in runs]
    bad = [p for p in found if p]
    if not bad:
        return "ok" if runs else ""
    reasons = sorted({reason.split(" (")[0] for problems in bad for reason in problems})
    return f"{len(bad)}/{len(runs)} jobs: {'; '.join(reasons)}"


def median_curve(jobs: Sequence[Job]) -> list[tuple[int, float, float]]:
    """The configuration's validation curve for the chart view: at each validation all of its jobs made (the same
    samples seen), (index, median training seconds = samples seen ÷ the job's samples/s, median value)."""
    seen = [{p.samples_seen: p for p in job.curve} for job in jobs if job.samples_per_sec > 0]
    shared = sorted(set.intersection(*(set(points) for points in seen))) if seen else []
    return [(i, statistics.median(samples / job.samples_per_sec for job in jobs if job.samples_per_sec > 0),
             statistics.median(points[samples].value for points in seen))
            for i, samples in enumerate(shared)]


def verdict_description(lines: Sequence[str], command: str | None) -> str:
    """The sweep run's description (Markdown): the verdict's first line in bold, the rest as a list, where the
    per-configuration rows are, and the command that launched the sweep."""
    text = [f"**{lines[0]}**" if lines else "**no verdict**", ""]
    text += [f"- {line.strip()}" for line in lines[1:]]
    text += ["", f"Per configuration: the runs under this one tagged `{mlflow_store.ROLE_TAG} = "
                 f"{mlflow_store.CONFIGURATION_ROLE}` (medians with 95 % intervals as metrics); the report: "
                 "artifacts `report/`."]
    if command:
        text += ["", f"Launched with: `{command}`"]
    return "\n".join(text)


def record_verdict(sweep: Sweep, lines: Sequence[str], summary: SweepSummary | None,
                   family_labels: Mapping[str, str] | None = None) -> list[str]:
    """Set the verdict as the sweep run's description and replace its configuration runs by one per configuration
    of `summary` (none with one replicate or no summary); returns the new runs' ids."""
    uri, parent = sweep.uri, sweep.parent
    parent_run_id = parent.run_id
    client = mlflow_store.client(uri)
    overrides = parent.tags.get(schema.SWEEP_OVERRIDES_TAG)
    command = naming.sweep_description(naming.recorded_overrides(overrides)) if overrides is not None else None
    client.set_tag(parent_run_id, NOTE_TAG, verdict_description(lines, command))
    for run in configuration_runs(uri, parent_run_id):
        client.delete_run(run.run_id)
    if summary is None or max(c.jobs for c in summary.configs) <= 1:
        return []
    names = naming.configuration_run_names([c.config for c in summary.configs], family_labels)
    caveat = caveats.short_text(caveats.study_caveats(sweep.jobs, summary))
    client.set_tag(parent_run_id, caveats.CAVEATS_TAG, caveat)
    runs_by_config: dict[str, list[JobRecord]] = {}
    for job in sweep.jobs:
        runs_by_config.setdefault(job.config or "", []).append(job)
    jobs_by_config: dict[str, list[Job]] = {}
    for at_target in summary.jobs_at_target:
        jobs_by_config.setdefault(at_target.job.config, []).append(at_target.job)
    places = {name: place for place, name in enumerate(sorted(names.values(), key=natural_key))}
    curve_end = max((seconds for js in jobs_by_config.values() for _, seconds, _ in median_curve(js)), default=0.0)
    ids = [
        _create_configuration_run(client, parent, config, summary, names[config.config],
                                  runs_by_config.get(config.config, []), jobs_by_config.get(config.config, []),
                                  places[names[config.config]], caveat, curve_end)
        for config in summary.configs
    ]
    comparison_view(uri, parent_run_id)
    return ids


def comparison_view(uri: str, parent_run_id: str) -> str | None:
    """Save the sweep's comparison as a view of its experiment's runs table (sweeplab.report.saved_view), from its
    configuration runs; its id. None under an MLflow whose UI sweeplab has not checked (the address is then a filter
    and a sort) or for a sweep without configuration runs."""
    runs = configuration_runs(uri, parent_run_id)
    if not saved_view.view_supported() or not runs:
        return None
    client = mlflow_store.client(uri)
    parent = mlflow_store.read_run(uri, parent_run_id)
    monitored = runs[0].tags.get(schema.OBJECTIVE_TAG, "")
    final = f"final_{metric_key(monitored)}"
    texts = [name for name in figure_tag_names(monitored) if name in runs[0].tags]  # the answer first
    target = runs[0].tags.get(saved_view.TARGET_TAG) or _target_text(
        monitored, runs[0].tags.get(schema.OBJECTIVE_MODE_TAG, "max"), runs[0].metrics.get("target", math.nan))
    state = saved_view.comparison_state(
        list(naming.config_values(runs[0].tags.get(schema.CONFIG_TAG, ""))), texts, final, monitored,
        f"tags.mlflow.parentRunId = '{parent_run_id}' and "
        f"tags.`{mlflow_store.ROLE_TAG}` = '{mlflow_store.CONFIGURATION_ROLE}'",
        target, sorted({key for run in runs for key in run.metrics}),
    )
    name = saved_view.view_name(parent.tags.get(schema.SWEEP_ID_TAG) or parent_run_id[:8], target)
    return saved_view.write_comparison_view(client, parent.experiment_id, parent_run_id, name, state)


def natural_key(label: str) -> list:
    """A label's sort key with its numbers as numbers: `bs=4` before `bs=16`, `α=0.7` before `α=1`."""
    parts = re.split(r"(-?\d+(?:\.\d+)?(?:e[-+]?\d+)?)", label)
    return [(0, float(part), "") if i % 2 else (1, 0.0, part) for i, part in enumerate(parts)]


def _create_configuration_run(client, parent: RunRecord, config: ConfigSummary, summary: SweepSummary, name: str,
                              job_runs: list[JobRecord], jobs: list[Job], place: int = 0, caveat: str = "",
                              curve_end: float = 0.0) -> str:
    from mlflow.entities import Metric

    group, standing = verdict_standing(config.config, summary.verdict)
    ids = ",".join(j.run_id for j in job_runs)
    tags = {
        "mlflow.parentRunId": parent.run_id,
        mlflow_store.ROLE_TAG: mlflow_store.CONFIGURATION_ROLE,
        "config": config.config,
        "quality": config.quality,
        "baseline": str(config.config == summary.baseline).lower(),
        JOB_IDS_TAG: ids if len(ids) <= MAX_TAG_CHARS else ids[: MAX_TAG_CHARS - 40].rsplit(",", 1)[0] + ",...",
        "objective": summary.metric_name,
        schema.OBJECTIVE_MODE_TAG: summary.mode,
        NOTE_TAG: (f"Configuration `{name}` ({config.config}): {config.jobs} jobs, {config.reached_target} reached "
                   f"{summary.metric_name} {'≥' if summary.mode == 'max' else '≤'} {summary.target:.4g}. Medians with "
                   "95 % intervals over its replicates; speedups and quality_delta paired with the baseline's jobs, "
                   f"simultaneous intervals ({summary.speed_level:.2%} and {summary.quality_level:.2%})."),
    }
    tags[saved_view.VERDICT_TAG] = standing
    tags[saved_view.TARGET_TAG] = _target_text(summary.metric_name, summary.mode, summary.target)
    # the view's sort (MLflow sorts text): verdict group, then the label's place in natural order, then the label
    tags[saved_view.ORDER_TAG] = f"{group} {place:04d} {name}"
    tags[caveats.CAVEAT_TAG] = caveat or "none"
    tags.update(figure_tags(config, summary))
    if text := stability_text(job_runs):
        tags[STABILITY_TAG] = text
    for key in (schema.SWEEP_ID_TAG, schema.SWEEP_DIR_TAG):
        if key in parent.tags:
            tags[key] = parent.tags[key]
    start_ms, end_ms = run_span(job_runs)
    run = client.create_run(parent.experiment_id, start_time=start_ms, run_name=name, tags=tags)
    now = int(time.time() * 1000)
    mlflow_store.log_params(client, run.info.run_id, naming.config_values(config.config))
    metrics = [Metric(k, v, now, 0) for k, v in configuration_metrics(config, summary).items()]
    curve_value = saved_view.CURVE_PREFIX + summary.metric_name
    curve = median_curve(jobs)
    for step, seconds, value in curve:
        metrics += [Metric(saved_view.CURVE_TIME, seconds, now, step), Metric(curve_value, value, now, step)]
    if config.config == summary.baseline and curve:  # one target line in the chart: the baseline's run draws it,
        end = max(curve_end, curve[-1][1])  # as far as the longest curve goes (a point past its own curve's end)
        metrics += [Metric(saved_view.CURVE_TARGET, summary.target, now, step) for step, _, _ in curve]
        if end > curve[-1][1]:
            metrics += [Metric(saved_view.CURVE_TIME, end, now, len(curve)),
                        Metric(saved_view.CURVE_TARGET, summary.target, now, len(curve))]
    for start in range(0, len(metrics), 1000):  # MLflow's limit per batch
        client.log_batch(run.info.run_id, metrics=metrics[start:start + 1000])
    client.set_terminated(run.info.run_id, "FINISHED", end_time=end_ms)
    return run.info.run_id


def verdict_standing(config: str, verdict: Verdict) -> tuple[int, str]:
    """(group, words) of a configuration in the sweep's verdict, for its run's `verdict` tag and the view's sort:
    1 the fastest (or within the indifference zone of it) or tied for fastest (not ranked); 2 left out (the sweep
    run's description says why); 3 undetermined or no verdict."""
    if config in verdict.fastest:
        if verdict.kind != "fastest":
            return 1, "tied for fastest"
        return 1, "fastest" if verdict.within == 1.0 else f"fastest (or within {verdict.within:g}x)"
    if verdict.kind == "no verdict":
        return 3, "no verdict"
    if config in verdict.undetermined:
        return 3, "undetermined"
    return 2, "left out"


def _target_text(metric: str, mode: str, target: float) -> str:
    return f"{metric} {'≥' if mode == 'max' else '≤'} {target:.4g}"


def run_span(job_runs: Sequence[JobRecord]) -> tuple[int | None, int | None]:
    """(start, end) in ms for a configuration run: from its first job's start, as long as its jobs took together
    (the UI's Duration is then what the configuration cost; its jobs ran in rounds between the others'). (None,
    None) without finished jobs: now, as MLflow sets it."""
    spans = [(j.start_ms, j.end_ms) for j in job_runs if j.start_ms and j.end_ms]
    if not spans:
        return None, None
    start = min(s for s, _ in spans)
    return start, start + sum(e - s for s, e in spans)
