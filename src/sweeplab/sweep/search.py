"""The Optuna search (`hydra/sweeper=optuna`): Optuna's ask/tell in sweeplab's own sweeper, its study kept in a journal
file beside the sweep, each trial run `replicates` times.

A trial is one configuration: the sampler proposes its values (`hydra.sweeper.params`, written as for Hydra's Optuna
plugin: `interval(0.1, 1.0)`, `tag(log, interval(1e-4, 1e-2))`, `choice(a, b)`, `range(1, 9, 2)`; a plain value pins
a key), and each of its replicates runs as a job with seed `seed + r` (sweeplab.study.replicates, the jobs' replicate
variables with the trial number as their configuration index). `n_jobs` trials are asked at once and all their jobs
go to the launcher in one launch, round after round within it (replicate 0 of each trial, then replicate 1 in reverse,
...), as the grid sweeper orders a round; the launcher decides how many run side by side. A submitit launcher's jobs
are submitted and watched as the grid sweeper does it (sweeplab.sweep.slurm): a job the scheduler ends fails its
replicate.

What Optuna is told, per trial, from what its jobs returned (sweeplab.core.outcome.JobOutcome, as `launch` gives it
back: its best monitored metric, its stop; the search reads no store between its launches):
- COMPLETE with the median of its replicates' values (the verdict's per-configuration `final_metric` point,
  verdict.median_of_values; with 2 replicates their mean); its user attributes keep each replicate's value, the 95 %
  interval (`objective_interval`), the Hydra job number of each replicate (`jobs`) and how many failed.
- FAIL when no replicate returned a finite value (every job failed or diverged). Some failed: COMPLETE over the rest.
- PRUNED when a stop rule stopped one of its jobs behind its round's leader (`stop.behind`, policies/stopping.py: slower
  to the target and not better at the same samples); the median so far is its intermediate value. A job stopped at
  the target (`stop.at_target`) or for no improvement (`stop.patience`) is a finished job: its value counts.
The search ends after `n_trials` trials of any state; the best is written to optimization_results.yaml in the sweep
dir (the sweep's report attaches it).

The study lives in `optuna_journal.log` in the sweep dir (Optuna's JournalStorage: one appended line per change), so
`-m ... resume=true hydra.sweep.dir=<that dir>` (the continue command) continues it: the trials an interruption left
RUNNING run again under their own numbers and parameters (told by number: Optuna keeps a RUNNING trial open across
processes), without their replicates that finished (their values read back from the sweep's MLflow record) and with
an interrupted one resuming from its checkpoint (`resume=true`, as the grid sweeper does); then new trials are asked
until the study holds `n_trials`. A finished trial is never run again. The sampler is seeded `seed + trials so far`
on a continuation, so it does not propose again what the first process's sampler drew.
"""

# no `from __future__ import annotations`: Hydra scans this package with a loader under which dataclasses cannot
# resolve string annotations
import dataclasses
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.plugins import Plugins
from hydra.errors import HydraException
from hydra.plugins.sweeper import Sweeper
from hydra.utils import instantiate
from omegaconf import MISSING, DictConfig, OmegaConf

from sweeplab.core import channels
from sweeplab.core.errors import ConfigError, UserError
from sweeplab.core.outcome import JobOutcome
from sweeplab.study import replicates as replicated
from sweeplab.study.rounds import job_states
from sweeplab.study.verdict import median_of_values
from sweeplab.sweep import journal, launchers, slurm
from sweeplab.sweep.best import SearchBest
from sweeplab.sweep.study import Study, conducted, next_job_number
from sweeplab.tracking.naming import hydra_quote, sweep_id

log = logging.getLogger(__name__)

JOURNAL_FILE = channels.OPTUNA_JOURNAL_FILE  # the study, in the sweep dir
RESULTS_FILE = channels.OPTUNA_RESULTS_FILE  # the best trial, in the sweep dir
SPACE_SYNTAX = ("write interval(low, high), tag(log, interval(low, high)), choice(a, b, ...), range(start, stop[, "
                "step]) or a plain value")
STOP_BEHIND = "behind"  # policies/stopping.py's stop_reason of a job stopped behind its round's leader: PRUNED


# --- the config: hydra/sweeper=optuna and hydra/sweeper/sampler=<name> (hydra_plugins' search.py registers it) -
@dataclass
class TPESamplerConf:
    _target_: str = "optuna.samplers.TPESampler"
    seed: Any = "${seed}"  # the study's seed: a search is as reproducible as its jobs
    n_startup_trials: int = 5  # random trials before the model proposes (Optuna's 10 is half a 20-trial search)
    n_ei_candidates: int = 24
    multivariate: bool | None = None  # null: Optuna's choice (multivariate TPE for one objective)
    constant_liar: bool = True  # trials of a batch still running count as bad ones: a batch does not propose twins


@dataclass
class RandomSamplerConf:
    _target_: str = "optuna.samplers.RandomSampler"
    seed: Any = "${seed}"


@dataclass
class CmaEsSamplerConf:  # needs the `cmaes` package (a dependency of sweeplab)
    _target_: str = "optuna.samplers.CmaEsSampler"
    seed: Any = "${seed}"
    n_startup_trials: int = 1
    sigma0: float | None = None
    restart_strategy: str | None = None


@dataclass
class NSGAIISamplerConf:
    _target_: str = "optuna.samplers.NSGAIISampler"
    seed: Any = "${seed}"
    population_size: int = 50


@dataclass
class GPSamplerConf:  # Gaussian-process Bayesian optimisation (torch, scipy)
    _target_: str = "optuna.samplers.GPSampler"
    seed: Any = "${seed}"
    n_startup_trials: int = 10


SAMPLERS = {"tpe": TPESamplerConf, "random": RandomSamplerConf, "cmaes": CmaEsSamplerConf,
            "nsgaii": NSGAIISamplerConf, "gp": GPSamplerConf}


@dataclass
class OptunaSearchConf:
    _target_: str = "hydra_plugins.sweeplab_sweeper.search.OptunaSearch"
    _recursive_: bool = False  # the sampler is made in sweep(), where a wrong one is one line, not a traceback
    defaults: list = field(default_factory=lambda: [{"sampler": "tpe"}])
    sampler: Any = MISSING
    direction: str | None = None  # maximize | minimize; null: the direction of the family's monitored metric
    study_name: str | None = None  # null: the sweep's id (its folder under multirun/)
    n_trials: int = 20  # trials in the study, of any state, a continued one's included
    n_jobs: int = 1  # trials asked at once: their jobs go to the launcher together
    params: dict | None = None  # the search space: key -> interval(...), choice(...), range(...) or a value



# --- the search space -------------------------------------------------------------------------------------------
def search_space(params: dict | None, arguments: Sequence[str]) -> tuple[dict, list[str]]:
    """({key: optuna distribution}, [the plain overrides every job gets]) from `hydra.sweeper.params` and the
    command line's overrides (a key's last word wins: `loss.alpha=0.7` pins a key the params search)."""
    parser = OverridesParser.create()
    parsed = []
    for key, text in (params or {}).items():
        try:
            parsed.extend(parser.parse_overrides([f"{key}={text}"]))
        except HydraException as exc:
            reason = str(exc).splitlines()[1] if len(str(exc).splitlines()) > 1 else str(exc)
            raise ConfigError(f"hydra.sweeper.params.{key}", f"cannot read {text!r} ({reason}); {SPACE_SYNTAX}") from None
    parsed.extend(parser.parse_overrides(list(arguments)))
    space: dict[str, Any] = {}
    fixed: dict[str, str] = {}
    for override in parsed:  # a key keeps its first place (job run names list the searched keys in that order)
        key = override.get_key_element()
        if override.is_sweep_override():
            fixed.pop(key, None)
            space[key] = distribution(key, override)
        else:
            space.pop(key, None)
            fixed[key] = override.input_line
    return space, list(fixed.values())


def distribution(key: str, override) -> Any:
    """One swept override as an Optuna distribution: `interval` a continuous one (floats), `range` integers (or
    evenly spaced floats) ending before `stop` as everywhere in Hydra, `choice` and `shuffle(...)` categories."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    def refuse(problem: str) -> ConfigError:
        return ConfigError(key, f"{problem}; {SPACE_SYNTAX}")

    value = override.value()
    if override.is_interval_sweep():
        low, high, tags = value.start, value.end, set(value.tags)
        if tags - {"log"}:
            raise refuse(f"unknown tag(s) {sorted(tags - {'log'})} on interval (only `log` means something here)")
        if not low < high or ("log" in tags and low <= 0):
            raise refuse(f"interval({low}, {high}) needs low < high{' and low > 0 (log)' if 'log' in tags else ''}")
        return FloatDistribution(float(low), float(high), log="log" in tags)  # Hydra reads its bounds as floats
    if override.is_choice_sweep() or override.is_range_sweep():
        try:
            values = list(override.sweep_iterator())
        except HydraException as exc:
            raise refuse(str(exc)) from None
        if not values:
            raise refuse("no value to choose from")
        if any(not isinstance(v, (str, int, float, bool)) for v in values):
            raise refuse(f"choices must be plain values (numbers, strings, booleans), got {values}")
        if override.is_range_sweep() and not value.shuffle and len(values) > 1:
            step = values[1] - values[0]
            if all(isinstance(v, int) for v in values):
                return IntDistribution(values[0], values[-1], step=step)
            return FloatDistribution(values[0], values[0] + step * (len(values) - 1), step=step)
        return CategoricalDistribution(values)
    raise refuse(f"{override.input_line!r} is a sweep the Optuna search cannot sample")


def override_value(value: Any) -> str:
    """A sampled value as an override writes it (Hydra reads it back as the same value)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return repr(value)
    return hydra_quote(str(value))


# --- what a trial's jobs returned ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrialOutcome:
    """One trial's answer from its jobs. values: each replicate's returned objective (None: the job failed, or
    returned no finite number); stops: the stop rule that ended a replicate early (policies/stopping.py), if any."""

    values: dict[int, float | None]
    stops: dict[int, str]

    @property
    def finite(self) -> list[float]:
        return [v for _, v in sorted(self.values.items()) if v is not None]

    @property
    def state(self) -> str:
        """COMPLETE, FAIL (no replicate returned a value) or PRUNED (one was stopped behind its round's leader)."""
        if not self.finite:
            return "FAIL"
        return "PRUNED" if STOP_BEHIND in self.stops.values() else "COMPLETE"

    def figure(self):
        """The trial's value: the median of its replicates' values with the 95 % interval of their mean."""
        return median_of_values(self.finite)


def job_outcome(result) -> JobOutcome | None:
    """What a job returned (sweeplab.core.outcome: its objective, its stop, its run), or None: it raised (logged) or
    returned nothing a trial can use. A plain number (another task function's objective) is its objective."""
    try:
        value = result.return_value
    except Exception as exc:  # the launcher's record of a job that raised (a scheduler's lost job among them)
        log.error("job failed: %s: %s", type(exc).__name__, exc)
        return None
    if isinstance(value, JobOutcome):
        return value
    objective = JobOutcome.finite(value)
    return JobOutcome("FINISHED", objective) if objective is not None else None


# --- the sweeper ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SearchPlan:
    """What the search runs, every input checked: the space and the overrides every job gets, the replicates, the
    direction and its metric, the sampler, the study's name, and whether it continues an interrupted search."""

    space: dict
    fixed: list[str]
    replicates: int
    direction: str
    metric: str
    sampler: Any
    study_name: str
    continued: bool


class OptunaSearch(Sweeper):
    runs_replicates = True  # what the sweep's checks and sweeplab.study.rounds ask: replicates and resume=true
    holds_study = True  # it opens, reads and finishes its own Study: the sweep callback opens none for it

    def __init__(self, sampler: Any, direction: str | None, study_name: str | None, n_trials: int,
                 n_jobs: int, params: dict | None) -> None:
        self.sampler_config = sampler
        self.direction = direction
        self.study_name = study_name
        self.n_trials = n_trials
        self.n_jobs = n_jobs
        self.params = params
        self.config: DictConfig | None = None
        self.launcher = None
        self.hydra_context = None
        self.study: Study | None = None
        self.next_job = 0

    def setup(self, *, hydra_context: Any, task_function: Any, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            config=config, hydra_context=hydra_context, task_function=task_function)

    def sweep(self, arguments: list[str]) -> list:
        """Check the search, open the study (or reopen it: resume=true), run its trials, finish it; however the
        trials end (an interrupt, a failure outside the jobs), its sweep run is closed with the reason."""
        assert self.config is not None and self.launcher is not None
        plan = self._plan(arguments)  # before the sweep run exists: a mistake is one line and leaves nothing
        with conducted(self.config) as self.study:
            returns = self._search(plan)
        return returns

    def _plan(self, arguments: list[str]) -> SearchPlan:
        config = self.config
        space, fixed = search_space(OmegaConf.to_container(self.params) if self.params else None, arguments)
        if not space:
            raise ConfigError("hydra.sweeper.params", f"nothing to search; give a key a range to search ({SPACE_SYNTAX}"
                              "), or run the grid sweeper (hydra/sweeper=sweeplab) for replicates of one configuration")
        if replicated.is_auto(config):
            raise UserError("replicates=auto decides between the configurations of a grid: give hydra/sweeper=optuna "
                            "a number of replicates (replicates=3)")
        for key in ("n_trials", "n_jobs"):
            if type(getattr(self, key)) is not int or getattr(self, key) < 1:
                raise ConfigError(f"hydra.sweeper.{key}", f"expected an integer >= 1, got {getattr(self, key)!r}")
        direction, metric = self._direction()
        sweep_dir = Path(config.hydra.sweep.dir)
        continued = config.get("resume") is True
        name = self.study_name or sweep_id(sweep_dir)
        held = self._studies_held(sweep_dir)
        if not continued and any(held.values()):
            shown = ", ".join(f"{n!r} ({count} trials)" for n, count in held.items())
            raise UserError(f"hydra.sweep.dir={sweep_dir} already holds the Optuna study {shown} in {JOURNAL_FILE}: "
                            f"continue it with resume=true, or give a new hydra.sweep.dir")
        if continued and held and name not in held:
            raise UserError(f"resume: {sweep_dir / JOURNAL_FILE} holds the study {', '.join(map(repr, held))}, not "
                            f"{name!r}: give hydra.sweeper.study_name={next(iter(held))} as the search ran")
        if continued and name in held and (was := journal.held_studies(sweep_dir / JOURNAL_FILE)[name].direction) != direction:
            raise UserError(f"resume: the study {name!r} in {sweep_dir / JOURNAL_FILE} searches to {was} {metric}, this "
                            f"command to {direction}: give hydra.sweeper.direction={was} as the search ran (a search's "
                            "direction cannot change), or give a new hydra.sweep.dir")
        return SearchPlan(space, fixed, replicated.replicates_setting(config), direction, metric,
                          self._sampler(held.get(name, 0)), name, continued)

    def _search(self, plan: SearchPlan) -> list:
        """The trials an interruption left running (under their own numbers and values), then new ones until the
        study holds `n_trials`; the best in optimization_results.yaml."""
        assert self.config is not None and self.study is not None
        sweep_dir = Path(self.config.hydra.sweep.dir)
        optuna_study = self._open_study(sweep_dir, plan)
        trials = optuna_study.get_trials(deepcopy=False)
        interrupted = [t for t in trials if t.state.name == "RUNNING"]
        log.info("search: study %r, %d trials x %d replicate(s), %s %s, %s; journal %s%s", plan.study_name,
                 self.n_trials, plan.replicates, plan.direction, plan.metric, type(plan.sampler).__name__,
                 sweep_dir / JOURNAL_FILE, f"; continuing: {len(trials) - len(interrupted)} trials done, "
                 f"{len(interrupted)} interrupted" if plan.continued else "")
        states, record = None, None
        if plan.continued:
            if slurm.watch_still_out(sweep_dir, lambda lost: self.study.record_lost(lost, counted=False)):
                self.study.read_earlier_jobs_again()  # those ended since the study was reopened
            self.next_job = next_job_number(sweep_dir)
            record = self.study.known()  # read once, when the study was reopened
            states = job_states(record)
        returns = []
        for start in range(0, len(interrupted), self.n_jobs):
            chunk = interrupted[start:start + self.n_jobs]
            returns.append(self._run_trials(optuna_study, plan, [t.number for t in chunk], [t.params for t in chunk],
                                            states, _recorded_values(record, chunk)))
        while (left := self.n_trials - len(optuna_study.get_trials(deepcopy=False))) > 0:
            asked = [optuna_study.ask(plan.space) for _ in range(min(self.n_jobs, left))]
            returns.append(self._run_trials(optuna_study, plan, [t.number for t in asked], [t.params for t in asked],
                                            states, {}))
        self.study.search_best = write_results(optuna_study, sweep_dir, plan.metric)
        return returns

    def _direction(self) -> tuple[str, str]:
        """("maximize" | "minimize", the metric's name): `direction`, else the family's monitored direction."""
        from sweeplab.families import get_family

        try:
            family = get_family(OmegaConf.select(self.config, "model.family", default=""))
            metric, mode = family.monitor, family.monitor_mode
        except UserError:  # each job says why its family is unknown
            metric, mode = "objective", "min"
        if self.direction is None:
            return ("maximize" if mode == "max" else "minimize"), metric
        if self.direction not in ("maximize", "minimize"):
            raise ConfigError("hydra.sweeper.direction", f"expected maximize or minimize (or null: {metric}'s own "
                              f"direction), got {self.direction!r}")
        return self.direction, metric

    def _sampler(self, trials_so_far: int) -> Any:
        """The sampler its config names; on a continuation seeded `seed + trials_so_far` (a fresh draw, not the
        first process's again). A wrong one is one line naming the sampler and the choices."""
        sampler = OmegaConf.to_container(self.sampler_config, resolve=True) if self.sampler_config else {}
        target = sampler.get("_target_", "?")
        if trials_so_far and isinstance(sampler.get("seed"), int):
            sampler["seed"] += trials_so_far
        try:
            return instantiate(sampler)
        except Exception as exc:
            cause = exc.__cause__ or exc
            raise UserError(f"hydra.sweeper.sampler: cannot make {target} ({type(cause).__name__}: "
                            f"{str(cause).splitlines()[0] if str(cause) else ''}); choose hydra/sweeper/sampler="
                            f"{'|'.join(SAMPLERS)} (cmaes needs `pip install cmaes`, gp scipy) or fix its keys") from None

    @staticmethod
    def _studies_held(sweep_dir: Path) -> dict[str, int]:
        """{study name: trials} of the journal in the sweep dir, read without writing ({} when there is none)."""
        return {name: held.trials for name, held in journal.held_studies(sweep_dir / JOURNAL_FILE).items()}

    def _open_study(self, sweep_dir: Path, plan: SearchPlan) -> Any:
        """The sweep's Optuna study in its journal: created, or (resume=true) loaded."""
        import optuna

        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # sweeplab's own lines say what each trial did
        return optuna.create_study(storage=_journal(sweep_dir / JOURNAL_FILE), sampler=plan.sampler,
                                   study_name=plan.study_name, direction=plan.direction, load_if_exists=True)

    def _run_trials(self, optuna_study: Any, plan: SearchPlan, numbers: list[int], params: list[dict],
                    states: dict | None, known_values: dict[int, dict[int, float]]) -> list:
        """Launch the jobs of trials `numbers` (sampled `params`) that have no value yet, in one launch, and tell
        Optuna each trial's outcome. `states`: a continued study's job states ((trial, replicate) -> finished |
        interrupted); `known_values`: the values of replicates that finished before (trial -> replicate -> value)."""
        assert self.config is not None and self.launcher is not None
        grid = [(*(f"{key}={override_value(value)}" for key, value in trial_params.items()), *plan.fixed)
                for trial_params in params]
        jobs = [dataclasses.replace(job, config_index=numbers[job.config_index])  # the trial number
                for round_jobs in replicated.rounds(grid, plan.replicates, int(self.config.get("seed", 0)))
                for job in round_jobs]
        if states is not None:  # a continuation: finished jobs left out, each other one told whether it resumes
            jobs = [job for job in replicated.continue_round(jobs, states)
                    if job.replicate not in known_values.get(job.config_index, {})]
        at_once = launchers.concurrent_jobs(OmegaConf.select(self.config, "hydra.launcher"), len(jobs))
        gpu_slots = min(replicated.gpu_slots(self.config), at_once)
        batch = [[*job.overrides, *replicated.job_environment(job, at_once, gpu_slots)] for job in jobs]
        results: list = []
        if batch:
            self.validate_batch_is_legal(batch)
            for number in numbers:  # each replicate's Hydra job (its folder), before the launch
                kept = trial_id(optuna_study, number)
                recorded = dict(optuna_study._storage.get_trial(kept).user_attrs.get("jobs", {}))
                recorded.update({str(job.replicate): self.next_job + i for i, job in enumerate(jobs)
                                 if job.config_index == number})
                optuna_study._storage.set_trial_user_attr(kept, "jobs", recorded)
            results = self._launch(batch, jobs)
            self.next_job += len(batch)
        outcomes = {n: TrialOutcome(dict(known_values.get(n, {})), {}) for n in numbers}
        for job, result in zip(jobs, results):
            returned = job_outcome(result)
            outcomes[job.config_index].values[job.replicate] = returned.objective if returned is not None else None
            if returned is not None:
                self.study.tell(returned)
                if returned.finished and returned.stop_reason:  # a stop rule ended it (policies/stopping.py)
                    outcomes[job.config_index].stops[job.replicate] = returned.stop_reason
        for number in numbers:
            for replicate in range(plan.replicates):
                outcomes[number].values.setdefault(replicate, None)
        for number in numbers:
            tell(optuna_study, number, outcomes[number])
        return results

    def _launch(self, batch: list, jobs: list) -> list:
        """Launch a batch and wait for it. With a submitit launcher (SLURM, local) the search submits and watches the
        jobs itself, as the grid sweeper does (sweeplab.sweep.slurm): a job the scheduler ends is recorded as a KILLED or
        FAILED run and counts as a failed replicate, the others go on; SLURM running a job again continues its run."""
        if not slurm.drives(self.launcher):
            return list(self.launcher.launch(batch, initial_job_idx=self.next_job))
        placed = {self.next_job + i: job for i, job in enumerate(jobs)}
        submitted = slurm.submit(self.launcher, batch, self.next_job)
        return slurm.watch(submitted, lambda lost: self.study.record_lost(lost, placed[lost.number]))


def trial_id(study: Any, number: int) -> int:
    """The storage's id of trial `number`, whichever process asked it: its attributes and reports are written through
    the storage (an `optuna.trial.Trial` made for it would call the sampler's `before_trial` again)."""
    return study._storage.get_trial_id_from_study_id_trial_number(study._study_id, number)


def tell(study: Any, number: int, outcome: TrialOutcome) -> None:
    """Tell Optuna trial `number`'s outcome (COMPLETE, FAIL or PRUNED) and keep its replicates in its attributes."""
    from optuna.trial import TrialState

    def keep(key: str, value: Any) -> None:
        study._storage.set_trial_user_attr(trial_id(study, number), key, value)

    values = [outcome.values[r] for r in sorted(outcome.values)]
    keep("replicate_values", values)
    keep("replicates_failed", sum(v is None for v in values))
    if outcome.stops:
        keep("stop_reasons", {str(r): reason for r, reason in sorted(outcome.stops.items())})
    state = outcome.state
    if state == "FAIL":
        study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
        log.info("search: trial %d FAIL: no replicate returned a value", number)
        return
    figure = outcome.figure()
    if len(outcome.finite) > 1:
        keep("objective_interval", [figure.interval.low, figure.interval.high])
    if state == "PRUNED":  # its value: the median so far, as its intermediate value
        study._storage.set_trial_intermediate_value(trial_id(study, number), 0, figure.point)
        told = study.tell(number, state=TrialState.PRUNED, skip_if_finished=True)
    else:
        told = study.tell(number, figure.point, skip_if_finished=True)
    shown = ", ".join("failed" if v is None else f"{v:.4g}" for v in values)
    params = " ".join(f"{k}={override_value(v)}" for k, v in told.params.items())
    log.info("search: trial %d %s: %.4g (median of %s); %s", number, state, figure.point, shown, params)


def write_results(study: Any, sweep_dir: Path, metric: str) -> SearchBest | None:
    """optimization_results.yaml: the best trial's parameters and value (as Hydra's Optuna plugin wrote it), with
    its number, replicates' values and interval, and how many trials ended in each state. Returns the best, which
    the study marks on its sweep run (None when no trial completed)."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    counts = {state.name: sum(t.state == state for t in trials) for state in TrialState if state.is_finished()}
    results: dict[str, Any] = {"name": "optuna", "study_name": study.study_name, "metric": metric,
                               "direction": study.direction.name.lower(), "trials": counts,
                               "journal": str((sweep_dir / JOURNAL_FILE).resolve())}
    if counts.get("COMPLETE"):
        best = study.best_trial
        results |= {"best_params": best.params, "best_value": best.value, "best_trial": best.number,
                    "best_replicate_values": best.user_attrs.get("replicate_values"),
                    "best_objective_interval": best.user_attrs.get("objective_interval")}
        log.info("search: best trial %d: %s %.4g; %s", best.number, metric, best.value,
                 " ".join(f"{k}={override_value(v)}" for k, v in best.params.items()))
    else:
        log.warning("search: no trial completed: no best to report")
    OmegaConf.save(OmegaConf.create(results), sweep_dir / RESULTS_FILE)
    if "best_trial" not in results:
        return None
    return SearchBest(results["best_trial"], float(results["best_value"]),
                      {k: override_value(v) for k, v in results["best_params"].items()}, metric,
                      "max" if results["direction"] == "maximize" else "min")


# --- the study's MLflow record: the replicates an interrupted trial finished --------------------------------------
def _recorded_values(record: Any, trials: Sequence[Any]) -> dict[int, dict[int, float]]:
    """trial number -> replicate -> the value of its job that finished before (its `objective`, else its best
    validation), for the interrupted trials of a continued study."""
    numbers = {t.number for t in trials}
    values: dict[int, dict[int, float]] = {}
    for job in record.jobs if record is not None else ():
        if job.finished and job.config_index in numbers and job.replicate is not None:
            value = job.run.objective if job.run.objective is not None else job.best_metric(record.mode)
            if value is not None and math.isfinite(value):
                values.setdefault(job.config_index, {})[job.replicate] = float(value)
    return values


def _journal(path: Path) -> Any:
    """Optuna's JournalStorage in the file `path` (made if missing)."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(str(path)))
