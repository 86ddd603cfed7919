"""The study between its rounds, as the sweeplab sweeper sees it: which sweeper runs a study, how many jobs it
plans, which jobs of a continued study already finished, and which configurations replicates=auto runs again.

The sweeper (sweeplab/sweep/grid.py) calls these with the `Sweep` its study (sweeplab.sweep.study.Study)
read; the study keeps the MLflow side: the store, the sweep run, closing it.
"""

from __future__ import annotations

from pathlib import Path

from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from sweeplab.core.errors import UserError
from sweeplab.core.records import SWEEP
from sweeplab.study import replicates
from sweeplab.study.record import VerdictOptions, sweep_verdict
from sweeplab.study.selection import Looks
from sweeplab.study.sweep import Sweep
from sweeplab.study.verdict import ReplicatePlan, plan_replicates


def sweeper_class(config: DictConfig):
    """The class of the sweep's sweeper (None when there is none or it cannot be imported)."""
    target = OmegaConf.select(config, "hydra.sweeper._target_")
    try:
        return get_class(target) if isinstance(target, str) and target else None
    except Exception:  # a sweeper Hydra will refuse itself, with its own message
        return None


def runs_replicates(config: DictConfig) -> bool:
    """The sweep's sweeper runs replicates in rounds (the class says so: `runs_replicates = True`)."""
    return bool(getattr(sweeper_class(config), "runs_replicates", False))


def expands_a_grid(cls: type | None) -> bool:
    """The sweeper class is Hydra's BasicSweeper or built on it (the sweeplab sweeper). By name: Hydra's plugin scan
    executes hydra._internal.core_plugins again, in place, in a process that scans twice (tests), so a sweeper class
    made before holds an earlier BasicSweeper object than the module's, and issubclass said no."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    basic = f"{BasicSweeper.__module__}.{BasicSweeper.__qualname__}"
    return cls is not None and any(f"{base.__module__}.{base.__qualname__}" == basic for base in cls.__mro__)


def planned_jobs(config: DictConfig) -> int | None:
    """How many jobs the sweeper will launch: the product of the swept values (a grid sweeper) times the replicates
    (the sweeplab sweeper), `n_trials` times the replicates (Optuna); None when it cannot be told in advance."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    sweeper = OmegaConf.select(config, "hydra.sweeper")
    if sweeper is None:
        return None
    if expands_a_grid(sweeper_class(config)):
        params = [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items()]
        overrides = OverridesParser.create().parse_overrides(params + list(config.hydra.overrides.task))
        grid = sum(len(batch) for batch in BasicSweeper.split_arguments(overrides, None))
        if not runs_replicates(config):
            return grid
        if replicates.is_auto(config):
            return None  # replicate until decided: how many rounds is found out on the way
        return grid * replicates.replicates_setting(config)
    n_trials = sweeper.get("n_trials")
    if not isinstance(n_trials, int):
        return None
    # a search that runs replicates runs each trial's parameters that many times
    return n_trials * (replicates.replicates_setting(config) if runs_replicates(config) else 1)


def verdict_options(config: DictConfig) -> VerdictOptions:
    """The config's `report.target`, `report.quality_tolerance` and `report.indifference` (the report's CLI has the
    same as flags; the sweep run records them under the same names), and the looks replicates=auto takes at the verdict (its rounds from `first` to `most`)."""
    target = OmegaConf.select(config, SWEEP.target, default=None)
    tolerance = OmegaConf.select(config, SWEEP.quality_tolerance, default=None)
    indifference = OmegaConf.select(config, SWEEP.indifference, default=None)
    looks = None
    if replicates.is_auto(config):
        auto = replicates.auto_setting(config)
        looks = Looks(auto.first, auto.most)
    try:
        return VerdictOptions(None if target is None else float(target),
                              None if tolerance is None else float(tolerance),
                              indifference=1.0 if indifference is None else float(indifference), looks=looks)
    except (TypeError, ValueError) as exc:
        raise UserError(f"config error: report.target, report.quality_tolerance and report.indifference must be "
                        f"numbers ({exc})") from None


def job_states(sweep: Sweep | None) -> dict[tuple[int, int], str]:
    """(configuration index, replicate) -> "finished" | "interrupted" (its run has a last checkpoint to resume
    from) for the jobs the sweep being continued has run; a job missing here never ran (or left nothing to resume)."""
    states: dict[tuple[int, int], str] = {}
    for job in sweep.jobs if sweep is not None else ():
        if job.config_index is None or job.replicate is None:
            continue
        key = (job.config_index, job.replicate)
        if job.finished:
            states[key] = "finished"
        elif states.get(key) != "finished" and (
                Path(job.run.output_dir or "") / "checkpoints" / "last.ckpt").is_file():
            states[key] = "interrupted"
    return states


def undecided_configurations(sweep: Sweep | None, options: VerdictOptions) -> tuple[list[int], ReplicatePlan | None]:
    """replicates=auto, between two rounds: the grid indices of the configurations whose intervals still straddle a
    decision (sweeplab.study.verdict.plan_replicates over the sweep's finished jobs so far), and that plan (None while
    there is no summary yet: then every configuration runs again)."""
    if sweep is None or not sweep.jobs:
        return [], None
    index_of = sweep.config_indices()
    summary = sweep_verdict(sweep, options).summary
    if summary is None:
        return sorted(set(index_of.values())), None
    plan = plan_replicates(summary)
    return sorted(index_of[name] for name in plan.more if name in index_of), plan


# A configuration whose jobs were stopped behind their round's leader (policies/stopping.py) in this many rounds gets
# no further rounds. Each such stop already found it slower than k x the leader and not better in quality than the
# leader at the same samples seen; scripts/stop_simulation.py: a configuration truly as fast as the baseline is
# stopped for good in 0.3 % of studies at sigma 0.3 (k = 2), none at sigma 0.1.
ROUNDS_BEHIND_FOR_GOOD = 2


def stopped_for_good(sweep: Sweep | None, rounds_behind: int = ROUNDS_BEHIND_FOR_GOOD) -> set[int]:
    """Grid indices of the configurations whose jobs stopped behind in `rounds_behind` rounds (never the baseline's:
    its jobs are never stopped behind)."""
    behind: dict[int, set[int]] = {}
    for job in sweep.jobs if sweep is not None else ():
        if job.stop_reason == "behind" and job.config_index is not None and job.round is not None:
            behind.setdefault(job.config_index, set()).add(job.round)
    return {index for index, rounds_ in behind.items() if len(rounds_) >= rounds_behind and index != 0}

