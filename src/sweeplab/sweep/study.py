"""A study in the process that runs it: its sweep run in MLflow (the parent of every job's run), the sweep folder's
lock, its record read between rounds, and its end (the report, the best, the job counts, the status).

The sweeplab sweeper holds its `Study`, as Hydra's Optuna sweeper holds its optuna study: it opens (or reopens) it
before its first round, reads it to plan each next round, records the jobs a scheduler lost, and finishes it after
its last round. For any other sweeper (Hydra's basic one, a plugin) the sweep callback opens one in
`on_multirun_start` and finishes it in `on_multirun_end`, so every sweep keeps its report.

Opening: the store and the experiment are created once (parallel jobs racing to create a fresh sqlite schema fail),
an unreachable tracking server or a missing launcher setting stops the study with one line, and the sweep run is
created (or, with `-m ... resume=true`, the sweep recorded in `hydra.sweep.dir` is reopened). Its id reaches every
job through the `mlflow_parent_run_id` file in the sweep dir and the SWEEPLAB_PARENT_RUN_ID variable (inherited by
joblib/loky workers and submitit jobs); sweeplab.core.channels lists these and every other channel to the jobs.

Finishing: the sweep's report (tables, plots and report.html: sweeplab.report.tables) and, for a search, an
objective-per-job plot are attached to the sweep run, which also names the best (sweep.best); the closing lines are
`best: ...` and `report: <absolute path of report.html>`. However the study ends, its sweep run is closed with the job
counts (`jobs_done`, `jobs_failed`, `jobs_killed`, `jobs_planned`, `jobs_not_run`): FINISHED, FAILED when a job
failed or a scheduler lost one, KILLED when Ctrl-C or SIGTERM stopped it, FAILED when the study itself failed
outside its jobs (a misspelt swept key found when the sweeper checks its first batch). A study submitted and left
(`hydra.sweeper.leave=true`) leaves its run RUNNING, naming the jobs out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from sweeplab.core import bytecode, channels, interrupts, wall
from sweeplab.core.errors import UserError, is_user_error, user_message
from sweeplab.core.files import hold_run_lock, write_text_atomic
from sweeplab.core.interrupts import is_interrupt
from sweeplab.core.outcome import JobOutcome
from sweeplab.core.records import SWEEP, SWEEP_ROLE, JobRun, SweepRun, merged
from sweeplab.report import ui_links
from sweeplab.report.tables import sweep_report
from sweeplab.study.record import VerdictOptions
from sweeplab.study.rounds import job_states, planned_jobs, runs_replicates, verdict_options
from sweeplab.study.sweep import Sweep, read_sweep, sweep_from_runs
from sweeplab.sweep import best, launchers, lost_jobs
from sweeplab.sweep.checks import check_study, one_line_error, tracking_settings
from sweeplab.tracking import mlflow_store, naming, runs
from sweeplab.tracking.mlflow_store import RunRecord
from sweeplab.tracking.resume import close_abandoned_runs

log = logging.getLogger(__name__)


class Study:
    """One sweep's study, from its sweep run's opening to its closing, in the process that launches its jobs."""

    def __init__(self, config: DictConfig, print_report: bool = True) -> None:
        self.config = config
        self.print_report = print_report
        self.sweep_dir = Path(config.hydra.sweep.dir)
        self.uri, self.experiment, self.tracked = tracking_settings(config)
        self.options: VerdictOptions = verdict_options(config)
        self.parent_run_id: str | None = None  # the sweep run, while it is open
        self.planned_jobs: int | None = None
        self.continue_command = ""  # how to continue the study after an interruption (printed when one stops it)
        self.lost_jobs: list[str] = []  # jobs a scheduler ended before they could (sweep.lost_jobs)
        self.lost_states: list[str] = []  # the scheduler's end of each (CANCELLED, TIMEOUT, NODE_FAIL, ...)
        self.left_jobs: list[str] = []  # jobs submitted and left running (hydra.sweeper.leave=true)
        self.failed_jobs = 0
        self.search_best: best.SearchBest | None = None  # a search's best trial, handed over by its sweeper
        # local launchers' jobs end with this process; those the sweeper submits are watched, and close their own runs
        self._jobs_die_with_the_study = not launchers.can(OmegaConf.select(config, "hydra.launcher")).submits
        self._held = contextlib.ExitStack()  # the sweep folder's lock, for the study's life in this process
        self._told: dict[str, JobOutcome] = {}  # run id -> what its job returned (tell)
        self._earlier: Sweep | None = None  # a continued study's jobs before this process, read when it reopened

    def __getstate__(self) -> dict:
        """Pickled with a submitit job's Hydra context: without the sweep folder's lock, which stays with the process
        holding it (an open lock is not picklable), and without what its jobs told it (no job reads it)."""
        return {**self.__dict__, "_held": contextlib.ExitStack(), "_told": {}, "_earlier": None}

    # --- opening ----------------------------------------------------------------------------------------------------
    @classmethod
    def open(cls, config: DictConfig, print_report: bool = True) -> Study:
        """Check the config, take the sweep folder, and create (or, with resume=true, reopen) the sweep run. A
        failure after the run exists closes it FAILED (an interrupt: KILLED, by `end_open_study`)."""
        channels.failed_jobs, channels.failed_summary = 0, ""
        study = cls(config, print_report)
        try:
            study._open()
        except BaseException as exc:
            if study.parent_run_id is not None and not is_interrupt(exc):
                study.close("FAILED")
            study._held.close()  # refused before its run existed: the folder's lock goes with the refusal
            raise
        return study

    def _open(self) -> None:
        config = self.config
        check_study(config)
        os.environ[channels.SWEPT_KEYS_ENV] = ",".join(naming.swept_keys(config))  # job run names show what differs
        os.environ[channels.SWEEP_PROGRESS_ENV] = f"{time.time()} {planned_jobs(config) or 0}"
        # one process runs or continues a study: a second continue command refused in one line naming the first's
        # pid (two trained the same jobs under different folders); held until the study ends
        self._held.enter_context(hold_run_lock(self.sweep_dir, f"sweep {self.sweep_dir}", "run or continued"))
        if config.get("resume") is not True:  # a new study never takes a folder where another one's jobs are
            check_folder_is_free(self.sweep_dir, self.uri if self.tracked else None)
        if not self.tracked:
            return
        overrides = list(OmegaConf.select(config, "hydra.overrides.task") or [])
        self.continue_command = naming.continue_command(
            overrides, self.sweep_dir,
            naming.launcher_overrides(OmegaConf.select(config, "hydra.overrides.hydra") or []))
        experiment_id = mlflow_store.init_store(self.uri, self.experiment)
        if config.get("resume") is True:
            if not runs_replicates(config):
                raise UserError("resume=true with -m continues a sweep of hydra/sweeper=sweeplab or optuna only (this "
                                "sweeper cannot skip the jobs that finished)")
            self.parent_run_id = reopen_sweep(self.uri, self.sweep_dir, overrides)
            self._earlier = self.read()  # the jobs it ran before, read once: the rounds learn the rest from the jobs
        else:
            self.parent_run_id = self._create_run(experiment_id, overrides)
        channels.open_sweep = self
        os.environ[channels.PARENT_RUN_ENV] = self.parent_run_id  # for the jobs' processes (joblib, submitit)
        try:
            self.planned_jobs = planned_jobs(config)
        except Exception as exc:  # a sweep type the count does not know: no jobs_not_run, the study still runs
            log.warning("could not count the sweep's jobs in advance: %s", exc)
        if self.planned_jobs and config.get("resume") is True:
            # progress counts this continuation's jobs, numbered after the sweep's folders
            left = self.planned_jobs - sum(state == "finished" for state in self.job_states().values())
            os.environ[channels.SWEEP_PROGRESS_ENV] = f"{time.time()} {left} {next_job_number(self.sweep_dir)}"

    def _create_run(self, experiment_id: str, overrides: list[str]) -> str:
        choices = OmegaConf.select(self.config, "hydra.runtime.choices") or {}
        search_space = OmegaConf.select(self.config, "hydra.sweeper.params") or {}
        uncached = bytecode.uncached_packages()  # its report says what compiling them at the start cost
        record = merged(self.options.record(), SweepRun(
            role=SWEEP_ROLE,
            name=naming.sweep_run_name(self.sweep_dir),
            sweep_id=naming.sweep_id(self.sweep_dir),
            sweep_dir=str(self.sweep_dir.resolve()),
            launcher=str(choices.get("hydra/launcher", "")),
            sweeper=str(choices.get("hydra/sweeper", "")),
            sweep_overrides=naming.overrides_tag(overrides)[:5000],
            continue_command=self.continue_command[:5000],
            description=naming.sweep_description(overrides),
            uncached_bytecode=", ".join(uncached) if uncached else None,
            swept={str(k): str(v) for k, v in search_space.items()} or None,
            # a report asked for while the study runs counts against it (report.tables.still_running)
            jobs_planned=planned_jobs(self.config) or None,
        ))
        run_id = runs.create(self.uri, experiment_id, record, context=True)
        write_text_atomic(self.sweep_dir / channels.PARENT_RUN_FILE, run_id)
        return run_id

    # --- between rounds ---------------------------------------------------------------------------------------------
    def tell(self, outcome: Any) -> None:
        """What a job returned (its launch's `JobReturn.return_value`, sweeplab.core.outcome): the study's record of it.
        Anything else (a job of another task function, a scheduler's lost job) tells nothing."""
        if isinstance(outcome, JobOutcome) and outcome.recorded:
            self._told[outcome.run_id] = outcome  # a job run again into its run (SLURM's requeue) replaces it

    def known(self) -> Sweep | None:
        """The study's record so far, from what its jobs returned (a continued study's earlier jobs: as read once when
        it was reopened), with the report's formulas (sweeplab.study.sweep); it reads no store. None without a sweep
        run (logger.enabled=false)."""
        if self.parent_run_id is None:
            return None
        told = [RunRecord(o.run_id, o.experiment_id, o.status, o.start_ms, o.end_ms, "active", o.params, o.tags,
                          o.metrics) for o in self._told.values()]
        histories = {(o.run_id, o.monitor): o.history for o in self._told.values() if o.monitor}
        told_sweep = sweep_from_runs(None, told, histories=histories)
        if self._earlier is None:
            return told_sweep
        jobs = [job for job in self._earlier.jobs if job.run_id not in self._told] + list(told_sweep.jobs)
        return dataclasses.replace(self._earlier, jobs=tuple(sorted(jobs, key=lambda job: job.start_ms or 0)))

    def read(self) -> Sweep | None:
        """The study's record as the store holds it (its jobs' runs); None without a sweep run. Read once, by a
        continued study when it is reopened; the rounds ask `known()`."""
        return read_sweep(self.uri, self.parent_run_id) if self.parent_run_id else None

    def read_earlier_jobs_again(self) -> None:
        """A continued study's earlier jobs read again (once more): jobs an earlier process left on the scheduler
        and that ended since the study was reopened (watched to their end, or ended before the watch began) wrote
        their runs after the first read, and were told to no process of this study."""
        if self.parent_run_id is not None:
            self._earlier = self.read()

    def job_states(self) -> dict[tuple[int, int], str]:
        """(configuration index, replicate) -> "finished" | "interrupted" for the jobs the study has run."""
        return job_states(self.known())

    def record_lost(self, lost, planned=None, counted: bool = True) -> None:
        """A job the scheduler ended before it could (slurm.LostJob): its run ended KILLED or FAILED, the
        others go on; `counted`: the study ends FAILED naming it (not a job a continued study runs again at once)."""
        if counted:
            self.lost_jobs.append(f"job {lost.number} (scheduler job {lost.scheduler_id}): {lost.state}")
            self.lost_states.append(lost.state)
        lost_jobs.record(self.uri if self.tracked else None, self.parent_run_id, lost, planned)

    def _write(self, record: SweepRun) -> None:
        mlflow_store.write(self.uri, self.parent_run_id, record)

    # --- the end ----------------------------------------------------------------------------------------------------
    def finish(self) -> None:
        """After the last round: the report, the best and the counts on the sweep run, closed FINISHED (FAILED when a
        job failed or was lost; KILLED when an interrupt lands in the report); a study left running stays open."""
        if self.parent_run_id is None:
            return
        if self.left_jobs:
            self._leave()
            return
        status, sweep = "FINISHED", None
        try:
            if os.environ.get(channels.FAULT_PAUSE_IN_ENV):  # reliability tests: a signal lands in the report
                from sweeplab.callbacks.faults import pause_in  # imports Lightning: only when a test asks for it

                pause_in("report")
            if (process_wall := wall.process_age_s()) > 0:  # what the study cost until its report, which reads it
                self._write(SweepRun(process_wall_s=process_wall, process_start_s=time.time() - process_wall))
            # the run list once, each job's history once: `best`, the plot and the job counts read the report's record
            report = sweep_report(self.uri, self.parent_run_id, self.sweep_dir, options=self.options)
            sweep = report.sweep
            summary = report.verdict.summary if report.verdict is not None else None
            best_line = (best.record_search_best(self.uri, self.parent_run_id, self.search_best) if self.search_best
                         else best.record_best(self.uri, self.parent_run_id, sweep, self.config, summary))
            files = list(report.files) + best.objective_plot(sweep, self.sweep_dir, self.config, self.search_best)
            if (self.sweep_dir / channels.OPTUNA_RESULTS_FILE).exists():
                files.append(self.sweep_dir / channels.OPTUNA_RESULTS_FILE)
            if self.print_report:
                print(report.markdown + (f"\nbest: {best_line}" if best_line else ""), flush=True)
                print(ui_links.sweep_line(self.uri, self.parent_run_id), flush=True)  # where make ui's address opens
                if report.html:
                    print(f"report: {report.html}", flush=True)  # the page, for those who never open the UI
            runs.log_artifacts(self.uri, self.parent_run_id, files, "report")
            if report.failed:
                self.failed_jobs = report.failed
                status = "FAILED"
                self._write(SweepRun(failed_jobs=report.failed))
            if self.lost_jobs:  # ended by the scheduler: the study is not done
                status = "FAILED"
                self.failed_jobs = report.failed + sum(j.status == "KILLED" for j in sweep.jobs)
                self._write(SweepRun(lost_jobs="; ".join(self.lost_jobs)[:5000]))
                failed_too = f"; {report.failed} other job(s) failed" if report.failed else ""
                # the last line says what happened (sweeplab.train prints it instead of its count of failed jobs)
                channels.failed_summary = (
                    f"sweep: {lost_jobs.described(self.lost_states)} ({'; '.join(self.lost_jobs)}){failed_too}; the "
                    f"others ran. Continue the study with: {self.continue_command}")
            channels.failed_jobs = self.failed_jobs
            interrupts.check()  # a stop request swallowed where it landed in the report still ends the study KILLED
        except BaseException as exc:
            if is_interrupt(exc):  # Ctrl-C while the report is written: the study itself is over
                status = "KILLED"
            else:  # the report could not be written (a full disk): not a FINISHED study; continuing it writes it
                status = "FAILED"
                reason = user_message(exc) if is_user_error(exc) else f"{type(exc).__name__}: {exc}"
                with contextlib.suppress(Exception):
                    self._write(SweepRun(error=f"its report could not be written: {reason}"[:5000]))
                if self.continue_command:
                    print(f"sweep: its report could not be written ({reason}); its jobs are kept. Write the report "
                          f"and finish the study with: {self.continue_command}", file=sys.stderr, flush=True)
            raise
        finally:
            self.close(status, sweep)

    def _leave(self) -> None:
        """Leave the sweep run RUNNING, naming the jobs left running and where they are recorded, and say how to
        finish the study (the continue command watches them, runs what is left and writes the report)."""
        parent, self.parent_run_id = self.parent_run_id, None
        channels.open_sweep = None
        self._held.close()  # the continue command takes the sweep's folder
        os.environ.pop(channels.PARENT_RUN_ENV, None)
        left = f"{'; '.join(self.left_jobs)} (recorded in {self.sweep_dir.resolve() / channels.SUBMITTED_JOBS_FILE})"
        mlflow_store.write(self.uri, parent, SweepRun(left_jobs=left[:5000]))
        print(f"sweep: submitted {len(self.left_jobs)} job(s) and left them running ({'; '.join(self.left_jobs)})"
              f"; the sweep run stays RUNNING. Watch, continue and finish the study with: {self.continue_command}",
              flush=True)

    def end(self, exc: BaseException) -> None:
        """The study stopped outside its report: KILLED for an interrupt (it says how to continue), else FAILED with
        the reason in the sweep run's `error` tag; the job counts either way."""
        if self.parent_run_id is None:
            self._held.close()
            return
        killed, exc = is_interrupt(exc), one_line_error(exc)
        reason = str(exc) if killed else user_message(exc) if is_user_error(exc) else f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(Exception):
            self._write(SweepRun(error=reason[:5000]))
        self.close("KILLED" if killed else "FAILED")

    def close(self, status: str, sweep: Sweep | None = None) -> None:
        """End the sweep run with `status` and the job counts (from `sweep`, read after the last job, where the report
        read it); once, whichever way the study ends."""
        parent, self.parent_run_id = self.parent_run_id, None
        channels.open_sweep = None
        self._held.close()  # the sweep folder's lock: the study is over
        os.environ.pop(channels.PARENT_RUN_ENV, None)
        if parent is None:
            return
        try:
            if sweep is not None and status != "KILLED":  # a FAILED job run again since is the study's job once
                # one status a run: a continued study's record may hold a job read at its reopening and told again
                statuses = list({job.run_id: job.status for job in sweep.jobs
                                 if job.run_id not in sweep.run_again()}.values())
            else:
                if status == "KILLED" and self._jobs_die_with_the_study:
                    # joblib's workers are terminated with the launching process before they can close their runs
                    for run in runs.job_runs(self.uri, parent):
                        if run.status == "RUNNING":
                            mlflow_store.write(self.uri, run.run_id, JobRun(error="Interrupted: the sweep was interrupted"))
                            runs.end(self.uri, run.run_id, "KILLED")
                statuses = [run.status for run in runs.job_runs(self.uri, parent)]
            mlflow_store.write(self.uri, parent, job_counts(statuses, self.planned_jobs))
        except Exception as exc:  # the counts are bookkeeping; closing the sweep run is what matters
            log.warning("could not record the sweep's job counts in MLflow: %s", exc)
        runs.end(self.uri, parent, status)
        if status == "KILLED" and self.continue_command:  # interrupted in a job, between two, or in the report
            print(f"sweep interrupted; its finished jobs are kept. Continue it with: {self.continue_command}",
                  file=sys.stderr, flush=True)


@contextlib.contextmanager
def conducted(config: DictConfig) -> Iterator[Study]:
    """The study of a sweeper that holds its own (`holds_study`: the grid sweeper, the search): opened (or reopened:
    resume=true) on entry, finished after the body's last round; however the body ends (an interrupt, a failure
    outside the jobs), its sweep run is closed with the reason."""
    study = Study.open(config)
    try:
        yield study
    except BaseException as exc:
        study.end(exc)
        raise
    study.finish()


def end_open_study(exc: BaseException) -> None:
    """Close the sweep run of the study this process has open, if any (KILLED for an interrupt, else FAILED with the
    reason). The entry point calls this: Hydra runs no callback when a job raises more than an Exception, nor when
    the sweeper fails outside its jobs."""
    study = channels.open_sweep
    if study is not None and study.parent_run_id is not None:
        study.end(exc)


def job_counts(statuses: list[str], planned: int | None) -> SweepRun:
    """The sweep run's job counts from its jobs' statuses: FINISHED, FAILED, KILLED and, when the sweeper says how
    many jobs it plans, those planned and those never started."""
    return SweepRun(jobs_done=statuses.count("FINISHED"), jobs_failed=statuses.count("FAILED"),
                    jobs_killed=statuses.count("KILLED"), jobs_planned=planned,
                    jobs_not_run=None if planned is None else max(0, planned - len(statuses)))


def next_job_number(sweep_dir: Path) -> int:
    """The number a continued sweep's first job gets: after every job folder the sweep has, so no two share one."""
    numbered = [int(p.name) for p in sweep_dir.iterdir() if p.name.isdigit()] if sweep_dir.is_dir() else []
    return max(numbered, default=-1) + 1


def check_folder_is_free(sweep_dir: Path, uri: str | None) -> None:
    """A sweep folder belongs to one study: a new study (no resume=true) into a folder that holds another study's
    jobs is refused in one line, before anything is written (it would replace their checkpoints, its report and its
    `mlflow_parent_run_id`, and the old runs' `checkpoint` tags would point at the new study's weights). The study
    it holds is named with its sweep run and status (`uri`: the store to look it up in; None, not tracked). A folder
    whose study ran no job (one refused at its first batch) holds nothing to lose: the new study takes it."""
    jobs = sorted((p.name for p in sweep_dir.iterdir() if p.name.isdigit() and p.is_dir()), key=int) \
        if sweep_dir.is_dir() else []
    if not jobs:
        return
    shown = f"{jobs[0]}-{jobs[-1]}" if len(jobs) > 1 else jobs[0]
    marker = sweep_dir / channels.PARENT_RUN_FILE
    run_id = marker.read_text(errors="replace").strip() if marker.is_file() and not marker.is_symlink() else ""
    if run_id and uri is not None:
        try:
            status = runs.fetch(uri, run_id).status
        except Exception:  # another store's, or deleted: the folder is still that study's
            status = f"not in the store {uri}"
        held = f"sweep run {run_id} ({status}) with job folders {shown}"
    else:
        held = f"an earlier study's job folders {shown}"
    raise UserError(f"hydra.sweep.dir={sweep_dir} holds {held}: continue it with resume=true, or give a new folder "
                    "(a new study there would overwrite its checkpoints)")


def _move_to_earlier(uri: str, parent_id: str, parent) -> None:
    """What the sweep run said about its last attempt (why it failed, the jobs lost or left) no longer holds once
    it is continued: moved to its `earlier` tag (the history), so a study continued to its end reads as finished."""
    record = SweepRun.from_run(parent)
    past = {SWEEP.error: record.error, SWEEP.lost_jobs: record.lost_jobs, SWEEP.left_jobs: record.left_jobs,
            SWEEP.failed_jobs: record.failed_jobs}
    past = {key: value for key, value in past.items() if value is not None}
    if not past:
        return
    entries = [record.earlier] if record.earlier else []
    entries += [f"{key}: {value}" for key, value in past.items()]
    mlflow_store.write(uri, parent_id, SweepRun(earlier="; ".join(entries)[-5000:]))
    runs.delete_tags(uri, parent_id, past)


def reopen_sweep(uri: str, sweep_dir: Path, overrides: list[str]) -> str:
    """`-m ... resume=true`: continue the sweep recorded in `hydra.sweep.dir` under its own sweep run (RUNNING
    again); the sweeplab sweeper then skips its finished jobs, resumes the interrupted ones and starts the missing
    ones (sweeplab.study.rounds.job_states). The same study only: the overrides must be the ones it ran with."""
    marker = sweep_dir / channels.PARENT_RUN_FILE
    if not marker.is_file():
        raise UserError(f"resume=true with -m continues the sweep in hydra.sweep.dir; {sweep_dir} holds none (no "
                        f"{channels.PARENT_RUN_FILE}): pass hydra.sweep.dir=<the interrupted sweep's folder>")
    parent_id = marker.read_text().strip()
    try:
        parent = runs.fetch(uri, parent_id)
    except Exception:
        raise UserError(f"resume: the sweep run {parent_id} of {sweep_dir} is not in this MLflow store") from None
    recorded = naming.recorded_overrides(SweepRun.from_run(parent).sweep_overrides or "")
    if naming.study_overrides(recorded) != naming.study_overrides(overrides):
        raise UserError(f"resume: {sweep_dir} ran with overrides {' '.join(naming.study_overrides(recorded))!r}, this "
                        f"command has {' '.join(naming.study_overrides(overrides))!r}: give the same ones")
    runs.reopen(uri, parent_id)
    _move_to_earlier(uri, parent_id, parent)
    # the jobs a kill -9 left RUNNING are closed now (KILLED): the interrupted ones resume into their run again
    close_abandoned_runs(uri, runs.children(uri, parent_id, parent.experiment_id))
    mlflow_store.write(uri, parent_id, SweepRun(resumed=(SweepRun.from_run(parent).resumed or 0) + 1))
    log.info("sweep: continuing sweep run %s of %s (its finished jobs are kept)", parent_id, sweep_dir)
    return parent_id
