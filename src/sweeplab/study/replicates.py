"""Replicates as a sweep dimension (issue 26): which job runs with which seed, in which round, in which order.

`replicates=N` (a top-level config key; `sweep` is a config group) runs every configuration of the grid N times.
Replicate r uses seed `seed + r` in every configuration (data order and initialisation), so the configurations of
one round differ only in what was swept. Round r runs each configuration once; the order is reversed every other
round (round 0 as listed, round 1 reversed, ...), so a drift of the machine over the sweep weighs on every
configuration alike and the paired comparisons of sweeplab.study.verdict cancel it.

Pure: the sweeper (sweeplab/sweep/grid.py) launches what `rounds` returns; the jobs learn their replicate, round and
configuration index through the environment variables named in sweeplab.core.channels.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sweeplab.core.channels import CONCURRENT_JOBS_ENV, CONFIG_INDEX_ENV, GPU_SLOT_ENV, REPLICATE_ENV, ROUND_ENV
from sweeplab.core.errors import ConfigError
from sweeplab.core.records import JOB

MAX_REPLICATES = 1000  # a typo guard (replicates=300000 would queue a sweep nobody meant)
AUTO = "auto"


@dataclass(frozen=True)
class PlannedJob:
    """One job of a replicated sweep: the grid's overrides of configuration `config_index`, run as replicate
    `replicate` (seed `seed + replicate`) in round `round`."""

    config_index: int
    replicate: int
    round: int
    seed: int
    overrides: tuple[str, ...]


@dataclass(frozen=True)
class AutoReplicates:
    """replicates=auto: `first` rounds of every configuration, then rounds of the undecided ones only, up to `most`
    rounds in all or `budget_s` seconds since the sweep started (None: no time limit)."""

    first: int
    most: int
    budget_s: float | None


def replicates_setting(config: Mapping[str, Any]) -> int:
    """The `replicates` key as the most rounds the sweep may run (replicates=auto: `replicates_auto.most`); one line
    naming the key when it is neither a count nor `auto`."""
    value = config.get("replicates", 1)
    auto = auto_setting(config)  # checked whether or not it is used: a wrong value is wrong everywhere
    if value == AUTO:
        return auto.most
    if type(value) is not int or not 1 <= value <= MAX_REPLICATES:
        raise ConfigError("replicates", f"expected an integer in [1, {MAX_REPLICATES}] or auto, got {value!r}")
    return value


def auto_setting(config: Mapping[str, Any]) -> AutoReplicates:
    """`replicates_auto` checked: 2 <= first <= most <= MAX_REPLICATES (an interval needs two replicates)."""
    section = config.get("replicates_auto") or {}
    first, most, budget = section.get("first", 3), section.get("most", 12), section.get("budget_s")
    if type(first) is not int or type(most) is not int or not 2 <= first <= most <= MAX_REPLICATES:
        raise ConfigError("replicates_auto", f"expected integers 2 <= first <= most <= {MAX_REPLICATES}, got "
                                             f"first={first!r} most={most!r}")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float))
                               or not math.isfinite(budget) or budget <= 0):
        raise ConfigError("replicates_auto.budget_s", f"expected a finite number of seconds > 0 or null, got {budget!r}")
    return AutoReplicates(first, most, None if budget is None else float(budget))


def is_auto(config: Mapping[str, Any]) -> bool:
    return config.get("replicates", 1) == AUTO


# More rounds are not run when the open comparisons would need more than this many times the budget of rounds at the
# measured difference and noise (verdict.ReplicatePlan.rounds_needed): a difference that small is not what the study
# can tell. Stopping for futility never adds a false claim; the factor, and judging only from FUTILITY_FROM rounds
# past `first` (a spread measured on 3 pairs is itself far from the truth), leave room for a noisy early estimate.
FUTILE_BEYOND_BUDGET = 2
FUTILITY_FROM = 3


def auto_round(
    round_jobs: Sequence[PlannedJob], more: Sequence[int], setting: AutoReplicates, round_number: int,
    elapsed_s: float, rounds_needed: int | None = 0,
) -> tuple[list[PlannedJob], str | None]:
    """The jobs of round `round_number` that replicates=auto runs: all of them for the first rounds, then those of
    the configurations in `more` (indices into the grid; the still undecided ones). The second value says why the
    sweep stops here (None: it goes on). `rounds_needed`: about how many rounds in all the open comparisons would
    need (None: no difference measured that any number would likely separate)."""
    if round_number < setting.first:
        return list(round_jobs), None
    if not more:
        return [], f"decided after {round_number} rounds"
    if round_number >= setting.most:
        return [], f"the budget of {setting.most} rounds is spent"
    futile = rounds_needed is None or rounds_needed > FUTILE_BEYOND_BUDGET * setting.most
    if futile and round_number >= setting.first + FUTILITY_FROM:
        needed = "no difference measured" if rounds_needed is None else f"about {rounds_needed} rounds needed"
        return [], (f"more rounds are unlikely to decide within the budget of {setting.most} ({needed} at the "
                    f"measured noise; {round_number} rounds run)")
    if setting.budget_s is not None and elapsed_s >= setting.budget_s:
        return [], f"the time budget of {setting.budget_s:g} s is spent ({round_number} rounds)"
    chosen = set(more)
    return [job for job in round_jobs if job.config_index in chosen], None


def round_order(configurations: int, round_number: int) -> list[int]:
    """The configurations' indices in the order round `round_number` runs them: as listed, then reversed, ..."""
    order = list(range(configurations))
    return order if round_number % 2 == 0 else order[::-1]


def rounds(grid: Sequence[Sequence[str]], replicates: int, seed: int) -> list[list[PlannedJob]]:
    """The sweep's jobs, round by round. `grid`: each configuration's overrides (BasicSweeper's expansion).

    With one replicate the overrides are the grid's own (today's sweep, unchanged); with more, each job's `seed`
    override is replaced by `seed=<seed + r>`."""
    planned = []
    for round_number in range(replicates):
        jobs = []
        for index in round_order(len(grid), round_number):
            overrides = tuple(grid[index])
            if replicates > 1:
                overrides = (*(o for o in overrides if _key(o) != "seed"), f"seed={seed + round_number}")
            jobs.append(PlannedJob(index, round_number, round_number, seed + round_number, overrides))
        planned.append(jobs)
    return planned


def continue_round(round_jobs: Sequence[PlannedJob], states: Mapping[tuple[int, int], str]) -> list[PlannedJob]:
    """A round of a sweep being continued: its finished jobs left out; an interrupted one (a checkpoint to resume
    from) gets `resume=true`, one that never ran `resume=false`. states: (config index, replicate) -> "finished" |
    "interrupted"; a job not in it never ran."""
    jobs = []
    for job in round_jobs:
        state = states.get((job.config_index, job.replicate))
        if state == "finished":
            continue
        overrides = (*(o for o in job.overrides if _key(o) != "resume"), f"resume={str(state == 'interrupted').lower()}")
        jobs.append(PlannedJob(job.config_index, job.replicate, job.round, job.seed, overrides))
    return jobs


def _key(override: str) -> str:
    return override.partition("=")[0].lstrip("+~")


def gpu_slot(config_index: int, round_number: int, slots: int) -> int:
    """The GPU slot of a configuration's job in a round: shifted by one each round, so that over `slots` rounds
    every configuration runs once on every slot and none stays on one GPU (a slow GPU would otherwise always slow
    the same configuration, and the replicates would not see it)."""
    return (config_index + round_number) % max(1, slots)


def job_environment(job: PlannedJob, concurrent_jobs: int, gpu_slots: int = 0) -> tuple[str, ...]:
    """Hydra overrides that set the job's replicate variables in its own process (hydra.job.env_set, applied by
    Hydra's run_job wherever the launcher runs it: in process, a joblib worker, a submitit job); with `gpu_slots`
    (a sweep that gives each job GPUs of its own) the job's GPU slot too."""
    values = {
        REPLICATE_ENV: job.replicate,
        ROUND_ENV: job.round,
        CONFIG_INDEX_ENV: job.config_index,
        CONCURRENT_JOBS_ENV: concurrent_jobs,
    }
    if gpu_slots:
        values[GPU_SLOT_ENV] = gpu_slot(job.config_index, job.round, gpu_slots)
    # plain keys (conf/train.yaml declares them): Hydra's launch line `#N : <overrides>` leaves hydra.* keys out
    return tuple(f"hydra.job.env_set.{name}={value}" for name, value in values.items())


def gpu_slots(config: Mapping[str, Any]) -> int:
    """How many GPU slots the sweep's jobs rotate over: the host's GPUs // trainer.devices when the sweep gives each
    job GPUs of its own (hydra/launcher=joblib_gpus: the callback's assign_gpus); 0 otherwise."""
    from omegaconf import OmegaConf

    from sweeplab.runtime import distributed

    if not OmegaConf.select(config, "hydra.callbacks.mlflow_sweep.assign_gpus", default=False):
        return 0
    return distributed.gpu_slots(int(OmegaConf.select(config, JOB.devices, default=1) or 1))  # the config key


