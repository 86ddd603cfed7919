"""The sweeplab sweeper (`hydra/sweeper=sweeplab`; Hydra instantiates plugins from the hydra_plugins package only):
Hydra's BasicSweeper grid, run `replicates` times in rounds (sweeplab.study.replicates says which seed and order).

With a fixed number of replicates the whole study is one launch, round after round (in chunks of `max_batch_size`
when set): a parallel launcher starts its workers once and gives a free worker the next job at once, with no
barrier at the end of a round that would idle the GPUs of the round's fast jobs. The jobs still run round-major, so
a configuration is compared with the baseline's job of the same round, which ran at about the same time beside the
same number of jobs. Every job gets its replicate, round, configuration index, how many jobs ran at once on its
host and, where each job has GPUs of its own (hydra/launcher=joblib_gpus), its GPU slot, rotated per round
(replicates.gpu_slot), through `hydra.job.env_set` (channels.REPLICATE_ENV ...), which each job reads from its config (core/place.py).
With replicates=1 the jobs are the BasicSweeper's, in its order, with the same overrides.

`-m ... resume=true` continues the sweep in `hydra.sweep.dir` (sweeplab.sweep.study.Study.open): its finished jobs are
skipped, an interrupted one resumes from its last checkpoint (`resume=true`), one that never ran starts afresh
(`resume=false`), numbered after the sweep's existing job folders so that no two jobs share one.

replicates=auto: after the first `replicates_auto.first` rounds, each further round runs only the configurations
whose intervals still straddle a decision (sweeplab.study.verdict.plan_replicates over the jobs so far; the baseline with
them, as every comparison pairs with it), until none does or the budget of rounds or seconds is spent.

With a submitit launcher (hydra/launcher=slurm) the sweeper submits each launch as one array and watches its jobs
itself (sweeplab.sweep.slurm): a job the scheduler cancels, times out or loses is noticed within seconds, recorded
as a KILLED or FAILED run (sweeplab.sweep.lost_jobs), and the other jobs go on; the sweep then ends with the continue
command, and a job SLURM runs again (requeue, preemption, time limit) continues its own run.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

# Hydra's private API (hydra-core 1.3.8, pinned in pyproject.toml): Hydra has no public grid sweeper to build on, so
# the grid is BasicSweeper's: its constructor and setup (config, launcher, hydra_context), `_parse_config` (the
# sweeper's params as overrides), `split_arguments` (the grid, in its order) and `split_overrides_to_chunks`
# (max_batch_size). tests/test_hydra_private.py fails when an upgrade changes any of them.
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from sweeplab.core.errors import UserError
from sweeplab.study import replicates as replicated
from sweeplab.study import rounds
from sweeplab.sweep import launchers, packing, slurm
from sweeplab.sweep.study import Study, conducted, next_job_number

log = logging.getLogger(__name__)


class SweeplabSweeper(BasicSweeper):
    runs_replicates = True  # what the study's checks and sweeplab.study.rounds ask of a sweeper's class
    holds_study = True  # it opens, reads and finishes its own Study: the sweep callback opens none for it
    plans_lanes = True  # it runs the lanes' probe (packing.plan_lanes), whose process starts with the sweep

    def __init__(self, max_batch_size: int | None = None, params: dict[str, str] | None = None,
                 leave: bool = False) -> None:
        # What BasicSweeper.__init__ sets, set here: it calls super(BasicSweeper, self), and a second plugin scan in
        # one process (Hydra executes its core plugin modules again, in place) rebinds that name to a new class this
        # one is no subclass of, so the call refused every sweeper made after it (tests/test_hydra_private.py holds
        # the two to the same attributes)
        self.overrides: list | None = None
        self.batch_index = 0
        self.max_batch_size = max_batch_size
        self.params = params if params is not None else {}
        self.hydra_context = self.config = self.launcher = None
        self.leave = leave  # submit and leave: the first launch only, not watched (hydra/launcher=slurm)
        self.study: Study | None = None
        self.lanes: packing.LanesChoice | None = None  # hydra/launcher=joblib_gpus: jobs side by side per GPU

    def sweep(self, arguments: list[str]) -> Any:
        """Open the study (or reopen it: resume=true), run its rounds, finish it: its report, best and counts; however
        the rounds end (an interrupt, a failure outside the jobs), its sweep run is closed with the reason."""
        assert self.config is not None and self.launcher is not None and self.hydra_context is not None
        if self.leave and not slurm.outlives_this_process(self.launcher):  # before the sweep run exists
            raise UserError("hydra.sweeper.leave=true submits the study and exits: it needs hydra/launcher=slurm, "
                            "whose jobs run on without this process")
        with conducted(self.config) as self.study:
            returns = self._rounds(arguments)
        return returns

    def _rounds(self, arguments: list[str]) -> list:
        assert self.config is not None and self.study is not None
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        overrides = parser.parse_overrides([*self._parse_config(), *arguments])
        (grid,) = self.split_arguments(overrides, None)
        count = replicated.replicates_setting(self.config)
        auto = replicated.auto_setting(self.config) if replicated.is_auto(self.config) else None
        planned = replicated.rounds(grid, count, int(self.config.get("seed", 0)))

        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        if auto is not None:
            log.info("sweep: %d configurations, replicates=auto: %d rounds, then only the undecided ones, up to %d",
                     len(grid), auto.first, auto.most)
        elif count > 1:
            log.info("sweep: %d configurations x %d replicates, %d rounds", len(grid), count, len(planned))

        returns, next_index, started = [], 0, time.monotonic()
        if self.config.get("resume") is True:
            if slurm.watch_still_out(sweep_dir, lambda lost: self.study.record_lost(lost, counted=False)):
                self.study.read_earlier_jobs_again()  # those ended since the study was reopened
            planned, next_index = self._continued(planned, sweep_dir)
        stops_behind = OmegaConf.select(self.config, "stop.behind") is not None
        round_size = max((len(round_jobs) for round_jobs in planned), default=1)
        one_launch = auto is None and not stops_behind
        round_size = self._plan_lanes(grid, round_size, sum(map(len, planned)) if one_launch else round_size)
        # replicates=auto (and early stopping, stop.behind) keep a barrier per round: which configurations run
        # again depends on the rounds before; otherwise no round waits for the one before it: one launch
        if auto is None and not stops_behind:
            planned = [[job for round_jobs in planned for job in round_jobs]]  # the rounds in order within it
            self._cap_parallel_jobs(round_size)
        for round_number, round_jobs in enumerate(planned):
            if stops_behind and round_number >= rounds.ROUNDS_BEHIND_FOR_GOOD:
                round_jobs = self._without_the_clearly_lost(round_jobs)
            if auto is not None:
                round_jobs, stop = self._auto_round(auto, round_jobs, round_number, time.monotonic() - started)
                if stop is not None:
                    log.info("sweep: replicates=auto stops: %s", stop)
                    break
            next_index = self._launch_round(round_jobs, next_index, returns, round_size)
            if self.leave and self.study.left_jobs:  # submitted: the continue command takes it from here
                break
        else:
            if auto is not None:  # every planned round ran: is anything still open?
                _, stop = self._auto_round(auto, [], count, time.monotonic() - started)
                log.info("sweep: replicates=auto stops: %s", stop)
        self.batch_index = len(returns)
        return returns

    def _auto_round(self, auto: replicated.AutoReplicates, round_jobs: list, round_number: int,
                    elapsed_s: float) -> tuple[list, str | None]:
        """The jobs of this round that replicates=auto runs, or why it stops; the decisions still open are logged."""
        if round_number < auto.first:
            return replicated.auto_round(round_jobs, [], auto, round_number, elapsed_s)
        more, plan = rounds.undecided_configurations(self.study.known(), self.study.options)
        jobs, stop = replicated.auto_round(round_jobs, more, auto, round_number, elapsed_s,
                                           plan.rounds_needed if plan is not None else 0)
        for decision in plan.open_decisions if plan is not None else ():
            log.info("sweep: replicates=auto: %s: %s", "open" if stop is None else "stayed open", decision)
        if stop is None:
            log.info("sweep: replicates=auto: round %d runs %d of %d configurations", round_number + 1, len(jobs),
                     len(round_jobs))
        return jobs, stop

    def _without_the_clearly_lost(self, round_jobs: list) -> list:
        """stop.behind: the round without the configurations stopped behind in enough rounds (study/rounds.py)."""
        lost = rounds.stopped_for_good(self.study.known())
        if lost:
            log.info("sweep: stop.behind: no more rounds for configurations %s (stopped behind their round's leader "
                     "in %d rounds)", sorted(lost), rounds.ROUNDS_BEHIND_FOR_GOOD)
        return [job for job in round_jobs if job.config_index not in lost]

    def _continued(self, planned: list, sweep_dir: Path) -> tuple[list, int]:
        """The rounds of a continued sweep: finished jobs left out, each other job told whether it resumes."""
        states = self.study.job_states()
        continued = [replicated.continue_round(round_jobs, states) for round_jobs in planned]
        done = sum(states.get((j.config_index, j.replicate)) == "finished" for r in planned for j in r)
        resumed = sum("resume=true" in j.overrides for r in continued for j in r)
        log.info("sweep: continuing: %d jobs finished, %d resume from a checkpoint, %d start afresh", done, resumed,
                 sum(len(r) for r in continued) - resumed)
        return continued, next_job_number(sweep_dir)

    def _plan_lanes(self, grid: list, round_size: int, launch_size: int) -> int:
        """hydra/launcher=joblib_gpus: how many jobs run side by side on each GPU (sweeplab.sweep.packing), said on
        one line; the launcher's workers are that many per GPU slot. Returns how many jobs may run at once: a
        round's, or every lane's where that is more (packed lanes may run the next rounds' jobs beside a round's)."""
        gpus = max(1, replicated.gpu_slots(self.config))
        self.lanes = packing.plan_lanes(self.config, grid, launch_size, gpus)
        if self.lanes is None:
            return round_size
        log.info("sweep: %s", self.lanes.line())
        self.launcher.joblib["lanes_per_gpu"] = self.lanes.lanes_per_gpu
        at_once = max(round_size, gpus * self.lanes.lanes_per_gpu if self.lanes.lanes_per_gpu > 1 else 0)
        self._cap_parallel_jobs(at_once)
        return at_once

    def _cap_parallel_jobs(self, round_size: int) -> None:
        """With every round in one launch, a joblib launcher still runs at most a round's worth of jobs at once (as
        when each round was launched on its own), so `concurrent_jobs` and the GPU slots keep their meaning."""
        options = getattr(self.launcher, "joblib", None)
        if options is not None and "n_jobs" in options:
            options["n_jobs"] = launchers.concurrent_jobs(OmegaConf.select(self.config, "hydra.launcher"), round_size,
                                                            self._lanes_per_gpu())

    def _lanes_per_gpu(self) -> int:
        return self.lanes.lanes_per_gpu if self.lanes is not None else 1

    def _run(self, batch: list, first_number: int, planned: list) -> list:
        """Launch a batch and wait for it. With a submitit launcher (SLURM) the sweeper submits and watches the jobs
        itself (sweeplab.sweep.slurm): a job the scheduler ends is recorded in MLflow and the others go on."""
        if not slurm.drives(self.launcher):
            results = self.launcher.launch(batch, initial_job_idx=first_number)
            for result in results:
                self.study.tell(result.return_value)  # a job that raised raises here, as under BasicSweeper
            return results
        placed = {first_number + i: job for i, job in enumerate(planned)}
        submitted = slurm.submit(self.launcher, batch, first_number)
        if self.leave:
            self.study.left_jobs.extend(f"job {job.number}: {job.scheduler_id}" for job in submitted)
            return []
        lost_numbers: set[int] = set()

        def on_lost(lost: slurm.LostJob) -> None:  # recorded as it is seen; the study goes on
            lost_numbers.add(lost.number)
            self.study.record_lost(lost, placed[lost.number])

        results = slurm.watch(submitted, on_lost)
        for job, result in zip(submitted, results):
            if job.number not in lost_numbers:
                self.study.tell(result.return_value)  # a job that raised raises here
        return results

    def _launch_round(self, round_jobs: list, next_index: int, returns: list, round_size: int) -> int:
        launcher_config = OmegaConf.select(self.config, "hydra.launcher")
        if not round_jobs:  # a continued sweep's round whose jobs all finished before
            return next_index
        for chunk in self.split_overrides_to_chunks(round_jobs, self.max_batch_size):
            at_once = launchers.concurrent_jobs(launcher_config, min(len(chunk), round_size), self._lanes_per_gpu())
            gpu_slots = min(replicated.gpu_slots(self.config), at_once)  # 0: the jobs do not claim GPUs
            packed = self.lanes.job_overrides if self.lanes is not None else lambda _: ()
            batch = [[*job.overrides, *replicated.job_environment(job, at_once, gpu_slots), *packed(job.config_index)]
                     for job in chunk]
            started = time.perf_counter()
            self.validate_batch_is_legal(batch)
            log.debug("validated %d jobs in %.2f s", len(batch), time.perf_counter() - started)
            results = self._run(batch, next_index, chunk)
            next_index += len(batch)
            returns.append(results)
        return next_index

