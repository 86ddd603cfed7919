"""The study's best, marked on its sweep run: the verdict's configuration (or tie) for a replicated study, the
finished job with the best objective otherwise; and, for a search (a sweeper with a direction), every trial's
objective in launch order beside the best so far (objective.png)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from sweeplab.core.errors import UserError
from sweeplab.core.records import JOB, SweepRun
from sweeplab.families import get_family
from sweeplab.report import plots
from sweeplab.study.sweep import JobRecord, Sweep
from sweeplab.study.verdict import SweepSummary
from sweeplab.tracking import mlflow_store, naming

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SearchBest:
    """A search's best trial as its sweeper found it: its number, its value (with replicates, the median of its
    jobs' objectives), its parameters, the metric and its direction ("max" | "min")."""

    trial: int
    value: float
    params: Mapping[str, str]
    metric: str
    mode: str


def record_search_best(uri: str, parent_run_id: str, best: SearchBest) -> str:
    """Mark a search's best trial on the sweep run (its parameters as `best.<key>` params, its value as
    `best/objective`); returns the closing line's description."""
    mlflow_store.write(uri, parent_run_id, SweepRun(
        objective_metric=best.metric, objective_mode=best.mode, best_params=dict(best.params) or None,
        best_objective=best.value))
    shown = ", ".join(f"{k}={v}" for k, v in best.params.items())
    line = f"trial {best.trial}: {best.metric or 'objective'} {best.value:.4g} ({best.mode})"
    return f"{line}; {shown}" if shown else line


def objective_of(config: DictConfig) -> tuple[str, str]:
    """(metric, "max"|"min") the job's return value is: the family's monitored metric."""
    try:
        family = get_family(OmegaConf.select(config, "model.family", default=""))
    except UserError:  # the jobs fail on it, each with its own line
        return "", ""
    return family.monitor, family.monitor_mode


def _direction(config: DictConfig, jobs: list[JobRecord]) -> str:
    """The sweeper's direction when it has one (Optuna), else the jobs' own monitor mode."""
    direction = OmegaConf.select(config, "hydra.sweeper.direction")
    if isinstance(direction, str):
        return "max" if direction.lower().startswith("max") else "min"
    modes = {j.run.objective_mode for j in jobs} - {None, ""}
    return modes.pop() if len(modes) == 1 else ""


def record_best(uri: str, parent_run_id: str, sweep: Sweep, config: DictConfig,
                summary: SweepSummary | None = None) -> str | None:
    """Mark the best on the sweep run `parent_run_id` of the store `uri`; returns a one-line description, or None. With replicates (`summary` of
    configurations with more than one job) the best is the verdict's: one configuration, a tie, or none; else the
    finished job with the best objective."""
    if summary is not None and max(c.jobs for c in summary.configs) > 1:
        return _record_verdict_best(uri, parent_run_id, summary, _family_labels(config))
    scored = [j for j in sweep.jobs if j.finished and j.run.objective is not None]
    mode = _direction(config, scored)
    if not scored or not mode:
        return None
    pick = max if mode == "max" else min
    best = pick(scored, key=lambda j: j.run.objective)
    value = best.run.objective
    metric = best.run.objective_metric or ""
    swept = set(OmegaConf.select(config, "hydra.sweeper.params") or {})
    configured = [j for j in sweep.jobs if j.params]  # not the jobs that failed before training
    swept |= {k for k in best.params if len({j.config_value(k) for j in configured}) > 1}
    swept -= {JOB.data_seed}
    params = {k: best.params[k] for k in sorted(swept) if k in best.params}
    name, job = best.name, best.run.hydra_job or ""
    mlflow_store.write(uri, parent_run_id, SweepRun(
        best_run_id=best.run_id, best_run_name=name, best_job=job, objective_metric=metric, objective_mode=mode,
        best_params=params or None, best_objective=value))
    shown = ", ".join(f"{k}={v}" for k, v in params.items())
    line = f"job {job} ({name}): {metric or 'objective'} {value:.4g} ({mode})"
    return f"{line}; {shown}" if shown else line


def _family_labels(config: DictConfig) -> dict[str, str]:
    try:
        return dict(get_family(OmegaConf.select(config, "model.family", default="")).labels)
    except UserError:
        return {}


def _record_verdict_best(uri: str, parent_run_id: str, summary: SweepSummary, labels: dict[str, str]) -> str:
    """Tags `best_verdict` (fastest | tie | no verdict) and `best_config` (the configuration, the tied ones joined
    by " | ", or empty): a tie stays a tie, never a pick by the last digit."""
    verdict = summary.verdict
    names = naming.configuration_run_names([c.config for c in summary.configs], labels)  # the tables' short labels
    # a winner named by a study too small to carry a verdict, or beside an undetermined configuration, says so
    # in the tag too ("fastest (not an answer)"): export offers only an unqualified "fastest"
    mlflow_store.write(uri, parent_run_id, SweepRun(best_verdict=verdict.qualified(verdict.kind),
                                                    best_config=" | ".join(verdict.fastest),
                                                    objective_metric=summary.metric_name, objective_mode=summary.mode))
    if verdict.kind == "fastest":
        return verdict.best_line
    if verdict.kind == "tie":
        tie = f"tie between {', '.join(names.get(c, c) for c in verdict.fastest)} (intervals overlap: not ranked)"
        return verdict.qualified(tie)
    return f"none ({verdict.headline})"


def objective_plot(sweep: Sweep, sweep_dir: Path, config: DictConfig, search: SearchBest | None = None) -> list[Path]:
    """objective.png for a search (`search`: its best, or a sweeper with a direction): every trial's objective in
    launch order and the best so far. A grid's job order means nothing, so a grid gets none (the report draws its
    curves)."""
    scored = [j for j in sweep.jobs if j.run.objective is not None]
    direction = search.mode if search is not None else _direction(config, scored)
    if not scored or not direction or (search is None and not isinstance(
            OmegaConf.select(config, "hydra.sweeper.direction"), str)):
        return []
    try:
        jobs = sorted((_job_number(j), j.run.objective) for j in scored)
        metric = scored[0].run.objective_metric or ""
        return [plots.objective_plot(jobs, metric, direction, sweep_dir / "objective.png")]
    except Exception as exc:  # a plot is a convenience: the table is the report
        log.warning("objective plot skipped: %s", exc)
        return []


def _job_number(job: JobRecord) -> int:
    text = job.run.hydra_job or ""
    return int(text) if text.isdigit() else 0
