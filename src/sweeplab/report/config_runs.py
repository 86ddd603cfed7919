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
from collections.abc import Iterable, Mapping, Sequence

from sweeplab.core import stability
from sweeplab.core.records import (
    CONFIGURATION,
    CONFIGURATION_ROLE,
    TARGET_ROLE,
    ConfigurationRun,
    JobRun,
    SweepRun,
    key_of,
    merged,
)
from sweeplab.report import plots, saved_view
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
from sweeplab.tracking import mlflow_store, naming, runs
from sweeplab.tracking.mlflow_store import RunRecord

MAX_TAG_CHARS = 8000  # MLflow's limit on a tag's value


def configuration_runs(uri: str, parent_run_id: str) -> list[RunRecord]:
    """The configuration runs under a sweep's parent run (active ones), in the order they were written."""
    return runs.configuration_runs(uri, parent_run_id)


def metric_key(metric_name: str) -> str:
    """A metric's name inside another metric's name: `val/cos` -> `val_cos` (`final_val_cos`)."""
    return metric_name.replace("/", "_")


def configuration_figures(config: ConfigSummary, summary: SweepSummary) -> ConfigurationRun:
    """The configuration's figures as its run's metrics: jobs, reached_target, the target, and per figure `<name>`
    (median, ratio or difference), `<name>_low` and `<name>_high` (its interval); infinite and NaN values left out."""
    # the view's figures first, the answer (speedup to target) leading: MLflow's compare view opens on the first
    figures: dict[str, Estimate | None] = {f.named(f.metric, summary.metric_name): f.of(config)
                                           for f in [*shown_in_the_view(), *FIGURES]}
    bounds: dict[str, float] = {}
    for name, estimate in figures.items():
        if estimate is not None:
            bounds.update(_bounds(name, estimate))
    return ConfigurationRun(jobs=config.jobs, reached_target=config.reached_target,
                            target=summary.target if math.isfinite(summary.target) else None,
                            figures={name: value for name, value in bounds.items() if math.isfinite(value)})


def configuration_metrics(config: ConfigSummary, summary: SweepSummary) -> dict[str, float]:
    """configuration_figures as MLflow's metric names and values."""
    return configuration_figures(config, summary).to_mlflow().metrics


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
    text += ["", f"Per configuration: the runs under this one tagged `{CONFIGURATION.role} = "
                 f"{CONFIGURATION_ROLE}` (medians with 95 % intervals as metrics); the report: "
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
    overrides = sweep.run.sweep_overrides
    command = naming.sweep_description(naming.recorded_overrides(overrides)) if overrides is not None else None
    mlflow_store.write(uri, parent_run_id, SweepRun(description=verdict_description(lines, command)))
    for run in [*configuration_runs(uri, parent_run_id), *runs.children(uri, parent_run_id, None, TARGET_ROLE)]:
        runs.delete(uri, run.run_id)
    if summary is None or max(c.jobs for c in summary.configs) <= 1:
        return []
    names = naming.configuration_run_names([c.config for c in summary.configs], family_labels)
    caveat = caveats.short_text(caveats.study_caveats(sweep.jobs, summary))
    mlflow_store.write(uri, parent_run_id, SweepRun(caveats=caveat))
    runs_by_config: dict[str, list[JobRecord]] = {}
    for job in sweep.jobs:
        runs_by_config.setdefault(job.config or "", []).append(job)
    jobs_by_config: dict[str, list[Job]] = {}
    for at_target in summary.jobs_at_target:
        jobs_by_config.setdefault(at_target.job.config, []).append(at_target.job)
    places = {name: place for place, name in enumerate(sorted(names.values(), key=natural_key))}
    ids = [
        _create_configuration_run(uri, parent, sweep.run, config, summary, names[config.config],
                                  runs_by_config.get(config.config, []), jobs_by_config.get(config.config, []),
                                  places[names[config.config]], caveat, color)
        for config, color in zip(summary.configs, plots.colors(len(summary.configs)))  # as the report's figures
    ]
    seconds = [s for js in jobs_by_config.values() for _, s, _ in median_curve(js)]
    if seconds and math.isfinite(summary.target):
        _create_target_run(uri, parent, sweep.run, summary, min(seconds), max(seconds), validation_steps(sweep.jobs))
    comparison_view(uri, parent_run_id)
    spread_view(uri, parent, sweep.jobs, summary.metric_name)
    return ids


def validation_steps(job_runs: Sequence[JobRecord]) -> tuple[int, int] | None:
    """(first, last) step at which the jobs logged a validation (Lightning logs a validation at step s after (s + 1)
    optimizer steps' samples), None where no job tells its samples per step."""
    steps = [round(p.samples_seen / j.samples_per_step) - 1 for j in job_runs if j.samples_per_step
             for p in j.curve]
    return (min(steps), max(steps)) if steps else None


def spread_view(uri: str, parent: RunRecord, job_runs: Sequence[JobRecord], monitored: str) -> str | None:
    """Save the sweep's second view (sweeplab.report.saved_view.spread_state): every replicate's curve in its
    configuration's colour and the target line; its id. None under an MLflow whose UI sweeplab has not checked."""
    if not saved_view.view_supported():
        return None
    # every metric the view's runs log: the jobs', and the target line's median-curve keys (the comparison's chart)
    logged = {key for job in job_runs for key in job.metrics}
    logged |= {key_of(CONFIGURATION.curve, monitored), CONFIGURATION.curve_seconds}
    state = saved_view.spread_state(mlflow_store.spread_filter(parent.run_id), monitored, metric_keys=sorted(logged))
    name = saved_view.spread_view_name(SweepRun.from_run(parent).sweep_id or parent.run_id[:8], monitored)
    return saved_view.write_comparison_view(uri, parent.experiment_id, parent.run_id, name, state,
                                            saved_view.spread_view_id(parent.run_id))


def comparison_view(uri: str, parent_run_id: str) -> str | None:
    """Save the sweep's comparison as a view of its experiment's runs table (sweeplab.report.saved_view), from its
    configuration runs; its id. None under an MLflow whose UI sweeplab has not checked (the address is then a filter
    and a sort) or for a sweep without configuration runs."""
    found = configuration_runs(uri, parent_run_id)
    if not saved_view.view_supported() or not found:
        return None
    parent = mlflow_store.read_run(uri, parent_run_id)
    first = ConfigurationRun.from_run(found[0])
    monitored = first.objective_metric or ""
    final = f"final_{metric_key(monitored)}"
    texts = [name for name in figure_tag_names(monitored) if name in found[0].tags]  # the answer first
    target = first.target_text or _target_text(
        monitored, first.objective_mode or "max", first.target if first.target is not None else math.nan)
    state = saved_view.comparison_state(
        list(naming.config_values(first.config or "")), texts, final, monitored,
        mlflow_store.compared_filter(parent_run_id),
        target, sorted({key for run in found for key in run.metrics} | {monitored}),  # the target's line logs it
    )
    name = saved_view.view_name(SweepRun.from_run(parent).sweep_id or parent_run_id[:8], target)
    return saved_view.write_comparison_view(uri, parent.experiment_id, parent_run_id, name, state)


def natural_key(label: str) -> list:
    """A label's sort key with its numbers as numbers: `bs=4` before `bs=16`, `α=0.7` before `α=1`."""
    parts = re.split(r"(-?\d+(?:\.\d+)?(?:e[-+]?\d+)?)", label)
    return [(0, float(part), "") if i % 2 else (1, 0.0, part) for i, part in enumerate(parts)]


def _create_configuration_run(uri: str, parent: RunRecord, sweep_run: SweepRun, config: ConfigSummary,
                              summary: SweepSummary, name: str,
                              job_runs: list[JobRecord], jobs: list[Job], place: int = 0, caveat: str = "",
                              color: str | None = None) -> str:
    group, standing = verdict_standing(config.config, summary.verdict)
    ids = ",".join(j.run_id for j in job_runs)
    record = merged(configuration_figures(config, summary), ConfigurationRun(
        role=CONFIGURATION_ROLE,
        name=name,
        parent_run_id=parent.run_id,
        config=config.config,
        quality=config.quality,
        baseline=config.config == summary.baseline,
        job_run_ids=ids if len(ids) <= MAX_TAG_CHARS else ids[: MAX_TAG_CHARS - 40].rsplit(",", 1)[0] + ",...",
        objective_metric=summary.metric_name,
        objective_mode=summary.mode,
        description=(f"Configuration `{name}` ({config.config}): {config.jobs} jobs, {config.reached_target} reached "
                     f"{summary.metric_name} {'≥' if summary.mode == 'max' else '≤'} {summary.target:.4g}. Medians "
                     "with 95 % intervals over its replicates; speedups and quality_delta paired with the baseline's "
                     f"jobs: the speedups at the level the verdict decided them "
                     f"({config.speedup_to_target.interval.level:.2%}), quality_delta at "
                     f"{summary.quality_level:.2%}."),
        verdict=standing,
        target_text=_target_text(summary.metric_name, summary.mode, summary.target),
        # the view's sort (MLflow sorts text): verdict group, then the label's place in natural order, then the label
        verdict_order=f"{group} {place:04d} {name}",
        caveat=caveat or "none",
        figure_texts=figure_tags(config, summary),
        stability=stability_text(job_runs) or None,
        sweep_id=sweep_run.sweep_id,
        sweep_dir=sweep_run.sweep_dir,
        swept_values=naming.config_values(config.config),
        color=color,
    ))
    start_ms, end_ms = run_span(job_runs)
    run_id = runs.create(uri, parent.experiment_id, record, start_ms=start_ms)
    curve_value = key_of(CONFIGURATION.curve, summary.metric_name)
    points = []
    for step, seconds, value in median_curve(jobs):
        points += [(CONFIGURATION.curve_seconds, step, seconds), (curve_value, step, value)]
    runs.log_history(uri, run_id, points)
    runs.end(uri, run_id, "FINISHED", end_ms=end_ms)
    for job in job_runs:  # its replicates' lines in the spread view: its label, its colour
        mlflow_store.write(uri, job.run_id, JobRun(spread_line=name, color=color))
    return run_id


# after every verdict group (verdict_standing's 1-3): the target's row comes last in the view
TARGET_ORDER = "9"


# the target line's run name: its row reads it (its target column: `val/cos ≥ 0.5364`), its legend entry `target
# (median val/cos)`; short: the view's name column is 120 px
TARGET_RUN_NAME = "target"


def _create_target_run(uri: str, parent: RunRecord, sweep_run: SweepRun, summary: SweepSummary, start: float,
                       end: float, steps: tuple[int, int] | None = None) -> str:
    """The chart view's one target line: a run of its own under the sweep's run (role target) holding the target
    under the curves' key, from the first validation any configuration made to the last. MLflow 3.17's chart
    lists every selected key of every run in its legend, so a target logged by a configuration's run under a key
    of its own gave one `<label> (the target)` entry per configuration; a run of its own gives one. The spread view's
    target line likewise: the target under the monitored metric's own key at the jobs' first and last validation
    step (`steps`), the run's spread line `target`."""
    text = _target_text(summary.metric_name, summary.mode, summary.target)
    record = ConfigurationRun(
        role=TARGET_ROLE, name=TARGET_RUN_NAME, parent_run_id=parent.run_id, target_text=text,
        verdict_order=f"{TARGET_ORDER} {text}", objective_metric=summary.metric_name, objective_mode=summary.mode,
        description=f"The target's line in the sweep's chart view: {text}, the level each configuration's time to "
                    "target is timed to.",
        sweep_id=sweep_run.sweep_id, sweep_dir=sweep_run.sweep_dir,
        color=plots.TARGET_COLOR, spread_line=TARGET_RUN_NAME if steps is not None else None)
    run_id = runs.create(uri, parent.experiment_id, record)
    curve_value = key_of(CONFIGURATION.curve, summary.metric_name)
    runs.log_history(uri, run_id, [(CONFIGURATION.curve_seconds, step, seconds) for step, seconds in enumerate((start, end))]
                     + [(curve_value, step, summary.target) for step in range(2)]
                     + [(summary.metric_name, step, summary.target) for step in sorted(set(steps or ()))])
    runs.end(uri, run_id, "FINISHED")
    return run_id


def verdict_standing(config: str, verdict: Verdict) -> tuple[int, str]:
    """(group, words) of a configuration in the sweep's verdict, for its run's `verdict` tag and the view's sort:
    1 the fastest (or within the indifference zone of it) or tied for fastest (not ranked), with the verdict's
    qualifier ("not an answer", "of those compared"); 2 left out, with why in a few words ("slower than bs=32":
    against the one named, not the baseline whose interval the row shows); 3 undetermined or no verdict."""
    if config in verdict.fastest:
        if verdict.caveat and verdict.kind in ("fastest", "tie"):
            # the view's verdict column is 120 px: the study's "not an answer" first, in two words (the caveat
            # column beside it says why; `tied for fastest (not an answer)` was cut at 1280 px)
            return 1, "no answer: " + ("fastest" if verdict.kind == "fastest" else "tied")
        if verdict.kind != "fastest":
            return 1, verdict.qualified("tied for fastest")
        return 1, verdict.qualified("fastest" if verdict.within == 1.0 else f"fastest (or within {verdict.within:g}x)")
    if verdict.kind == "no verdict":
        return 3, "no verdict"
    if config in verdict.undetermined:
        return 3, "undetermined"
    why = verdict.left_out.get(config)
    return 2, why or "left out"  # "slower than bs=32": against the one named (the view's column is narrow)


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
