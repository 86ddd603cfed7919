"""Sweep-level MLflow bookkeeping as a Hydra callback: the store, one parent run per multirun, the best job, the report.

In the process that launches the sweep, before any job starts (`on_multirun_start`): the store and the experiment
are created once (parallel jobs racing to create a fresh sqlite schema fail), an unreachable tracking server or a
missing launcher setting stops the sweep with one line, and the parent run is created. Its id reaches every job
through the `mlflow_parent_run_id` file in the sweep dir and the SWEEPLAB_PARENT_RUN_ID variable (inherited by
joblib/loky workers and submitit jobs); sweeplab.core.channels lists these and every other channel to the jobs.

In each job's own process (`on_job_start`, `on_job_end`), wherever the launcher runs it: with `assign_gpus` the job
takes its own GPU(s) before CUDA starts; the job's return value (what a sweeper optimises: the best monitored
metric) is logged to the job's run as the metric `objective`.

At the end (`on_multirun_end`): the sweep's report (tables, plots and report.html: sweeplab.report.tables) and an
objective-per-job plot are attached to the parent, which also names the best job (tags `best_run_id`,
`best_run_name`, `best_job`; params `best.<swept key>`; metric `best/objective`); the closing lines are `best: ...`
and `report: <absolute path of report.html>`.

However the sweep ends, the parent run is closed with the job counts (metrics `jobs_done`, `jobs_failed`,
`jobs_killed`, `jobs_planned`, `jobs_not_run`): FINISHED, FAILED when a job failed, KILLED when Ctrl-C or SIGTERM
stopped the sweep (`end_interrupted_sweep`, called by the entry point), FAILED when the sweep itself failed outside
its jobs, e.g. a misspelt swept key found when the sweeper checks its first batch (`end_failed_sweep`, likewise).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from sweeplab.core import bytecode, channels, interrupts, schema, wall
from sweeplab.core.errors import UserError, is_user_error, user_message
from sweeplab.core.files import hold_run_lock, write_text_atomic
from sweeplab.core.interrupts import is_interrupt
from sweeplab.engine import settings
from sweeplab.families import get_family
from sweeplab.report import plots, ui_links
from sweeplab.report.tables import sweep_report
from sweeplab.runtime import distributed
from sweeplab.study import replicates
from sweeplab.study.record import VerdictOptions
from sweeplab.study.rounds import job_states, planned_jobs, read_open_sweep, runs_replicates, verdict_options
from sweeplab.study.sweep import JobRecord, Sweep
from sweeplab.study.verdict import SweepSummary
from sweeplab.tracking import mlflow_store, naming

log = logging.getLogger(__name__)
OPTUNA_RESULTS = "optimization_results.yaml"  # what hydra-optuna-sweeper writes in the sweep dir

distributed.register_resolvers()  # hydra/launcher=joblib_gpus sizes n_jobs with it


def progress_line(job_number: int, progress: str | None, now: float, placement: str = "") -> str | None:
    """"sweep: job 3 (the 4th of 8; configuration 1, replicate 1; sweep started 25 s ago, about 42 s left)".

    Job numbers are Hydra's, counted from 0 as its job folders (multirun/<date>/<time>/3), the `hydra_job` tag and
    the sweep's `best: job 3` line count them; `placement` names the job's configuration and replicate in a
    replicated sweep (both counted from 0, as their tags)."""
    try:
        start_text, total_text, *first_text = (progress or "").split()
        start, total, first = float(start_text), int(total_text), int(first_text[0]) if first_text else 0
    except (ValueError, IndexError):
        return None
    done = job_number - first  # a continued sweep's jobs are numbered after its folders; `total` counts its own
    details = [f"the {_ordinal(done + 1)} of {total}"] if 0 <= done < total else []
    if placement:
        details.append(placement)
    elapsed = now - start
    if 0 < done < total:
        left = elapsed / done * (total - done)
        details.append(f"sweep started {_duration(elapsed)} ago, about {_duration(left)} left")
    return f"sweep: job {job_number}" + (f" ({'; '.join(details)})" if details else "")


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


class MLflowSweepCallback(Callback):
    def __init__(self, print_report: bool = True, assign_gpus: bool = False) -> None:
        self.print_report = print_report
        self.assign_gpus = assign_gpus  # each parallel job gets `trainer.devices` GPUs of its own
        self.parent_run_id: str | None = None
        self._uri = ""
        self._planned_jobs: int | None = None
        self._jobs_die_with_the_sweep = True
        self._launch_env: dict[str, str | None] | None = None
        self.continue_command = ""  # how to continue this sweep after an interruption (printed when one stops it)
        self._held = contextlib.ExitStack()  # the sweep folder's lock (files.hold_run_lock), for the sweep's life

    def __getstate__(self) -> dict[str, Any]:
        """A submitit job (hydra/launcher=slurm) receives the callback pickled with Hydra's context: without the sweep
        folder's lock, which stays with the process holding it (an open lock is not picklable: every submission
        failed with "cannot pickle 'generator' object")."""
        return {**self.__dict__, "_held": contextlib.ExitStack()}

    @staticmethod
    def _settings(config: DictConfig) -> tuple[str, str, bool]:
        logger = config.get("logger") or {}
        return (
            mlflow_store.resolve_uri(logger.get("tracking_uri")),
            logger.get("experiment_name", "sweeplab"),
            bool(logger.get("enabled", True)),
        )

    # --- the launching process, before the first job ------------------------------------------------
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        channels.failed_jobs = 0
        channels.lost_jobs = []
        channels.left_jobs = []
        try:
            self._start(config)
        except BaseException as exc:
            if self.parent_run_id is not None and not is_interrupt(exc):  # an interrupt: end_interrupted_sweep
                self._close("FAILED")
            if not isinstance(exc, UserError):
                raise
            # expected mistakes: one line, no traceback, no job started (printed once: a log line would repeat it)
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)

    def _start(self, config: DictConfig) -> None:
        _check_required(config)
        swept = naming.swept_keys(config)
        if (values := _unswept_values(config, swept)) is not None:  # the swept ones: each job checks its own
            settings.check_values(values)  # report.target among them: a wrong one fails now, not after the sweep
        _check_replicates(config)
        verdict_options(config)
        if "data.path" not in swept:  # one missing path for every job: no sweep run at all
            from sweeplab.engine.plan import check_data_path  # deferred: the engine imports Lightning (seconds)

            check_data_path(OmegaConf.select(config, "data.path", default=None))
        os.environ[channels.SWEPT_KEYS_ENV] = ",".join(naming.swept_keys(config))  # job run names show what differs
        os.environ[channels.SWEEP_PROGRESS_ENV] = f"{time.time()} {planned_jobs(config) or 0}"
        sweep_dir = Path(config.hydra.sweep.dir)
        # one process runs or continues a sweep: a second continue command refused in one line naming the first's
        # pid (two trained the same jobs under different folders); held until this process ends
        self._held.enter_context(hold_run_lock(sweep_dir, f"sweep {sweep_dir}", "run or continued"))
        uri, experiment, enabled = self._settings(config)
        if not enabled:
            return
        self._uri = uri
        experiment_id = mlflow_store.init_store(uri, experiment)
        client = mlflow_store.client(uri)
        choices = OmegaConf.select(config, "hydra.runtime.choices") or {}
        overrides = list(OmegaConf.select(config, "hydra.overrides.task") or [])
        self.continue_command = naming.continue_command(
            overrides, sweep_dir, naming.launcher_overrides(OmegaConf.select(config, "hydra.overrides.hydra") or []))
        if config.get("resume") is True:
            if not runs_replicates(config):
                raise UserError("resume=true with -m continues a sweep of hydra/sweeper=sweeplab only (this sweeper "
                                "cannot skip the jobs that finished)")
            self.parent_run_id = reopen_sweep(client, sweep_dir, overrides)
            channels.open_sweep = self
            self._jobs_die_with_the_sweep = "submitit" not in str(OmegaConf.select(config, "hydra.launcher._target_"))
            self._planned_jobs = planned_jobs(config)
            os.environ[channels.PARENT_RUN_ENV] = self.parent_run_id
            if self._planned_jobs:  # progress counts this continuation's jobs, numbered after the sweep's folders
                states = job_states(read_open_sweep(config))
                left = self._planned_jobs - sum(state == "finished" for state in states.values())
                os.environ[channels.SWEEP_PROGRESS_ENV] = f"{time.time()} {left} {next_job_number(sweep_dir)}"
            return
        run = client.create_run(
            experiment_id,
            run_name=naming.sweep_run_name(sweep_dir),
            tags=mlflow_store.context_tags({
                "sweeplab.role": "sweep",
                schema.SWEEP_ID_TAG: naming.sweep_id(sweep_dir),
                schema.SWEEP_DIR_TAG: str(sweep_dir.resolve()),
                "launcher": str(choices.get("hydra/launcher", "")),
                "sweeper": str(choices.get("hydra/sweeper", "")),
                schema.SWEEP_OVERRIDES_TAG: naming.overrides_tag(overrides)[:5000],
                schema.CONTINUE_COMMAND_TAG: self.continue_command[:5000],
                "mlflow.note.content": naming.sweep_description(overrides),
                **verdict_option_tags(verdict_options(config)),
                **_bytecode_tags(),
            }),
        )
        self.parent_run_id = run.info.run_id
        channels.open_sweep = self
        # local launchers' jobs end with this process; submitit's run on in the cluster and close their own runs
        self._jobs_die_with_the_sweep = "submitit" not in str(OmegaConf.select(config, "hydra.launcher._target_"))
        try:
            self._planned_jobs = planned_jobs(config)
        except Exception as exc:  # a sweep type the count does not know: no jobs_not_run, the sweep still runs
            log.warning("could not count the sweep's jobs in advance: %s", exc)
            self._planned_jobs = None
        search_space = OmegaConf.select(config, "hydra.sweeper.params") or {}
        mlflow_store.log_params(client, self.parent_run_id, {f"sweep.{k}": v for k, v in search_space.items()})
        if self._planned_jobs:  # a report asked for while the sweep runs counts against it (report.tables.still_running)
            client.log_metric(self.parent_run_id, schema.JOBS_PLANNED, self._planned_jobs)
        os.environ[channels.PARENT_RUN_ENV] = self.parent_run_id
        write_text_atomic(sweep_dir / channels.PARENT_RUN_FILE, self.parent_run_id)

    # --- each job's process ---------------------------------------------------------------------------
    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        mlflow_store.forget_current_run()
        if _in_multirun():
            number = OmegaConf.select(config, "hydra.job.num", default=0) or 0
            progress = os.environ.get(channels.SWEEP_PROGRESS_ENV)
            if (line := progress_line(int(number), progress, time.time(), _placement(config))) is not None:
                log.info("%s", line)
        self._launch_env = distributed.launch_env()
        if self.assign_gpus and _in_multirun():
            slot = os.environ.get(channels.GPU_SLOT_ENV, "")
            distributed.claim_gpus(int(OmegaConf.select(config, "trainer.devices", default=1) or 1),
                                   slot=int(slot) if slot.isdigit() else None)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        if _in_multirun() and self._launch_env is not None:
            distributed.end_job(self._launch_env)  # the next job in this process starts its own DDP ranks
        self._record_objective(config, job_return)

    def _record_objective(self, config: DictConfig, job_return: Any) -> None:
        run_id = mlflow_store.current_run_id()
        mlflow_store.forget_current_run()
        if run_id is None or job_return.status.name != "COMPLETED":
            return
        value = job_return.return_value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return
        from mlflow.entities import Metric, RunTag

        metric, mode = _objective_of(config)
        job_number = str(OmegaConf.select(config, "hydra.job.num", default=""))
        tags = {"objective": metric, schema.OBJECTIVE_MODE_TAG: mode, schema.HYDRA_JOB_TAG: job_number}
        if os.environ.get(channels.CUDA_VISIBLE_DEVICES_ENV) is not None:
            tags["cuda_visible_devices"] = os.environ[channels.CUDA_VISIBLE_DEVICES_ENV]
        try:
            mlflow_store.client(self._settings(config)[0]).log_batch(
                run_id,
                metrics=[Metric("objective", float(value), int(time.time() * 1000), 0)],
                tags=[RunTag(k, v) for k, v in tags.items()],
            )
        except Exception as exc:  # bookkeeping must never fail a job that trained
            log.warning("could not record the job's objective in MLflow: %s", exc)

    # --- the launching process, after the last job ---------------------------------------------------
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.parent_run_id is None:
            return
        if channels.left_jobs:  # submitted and left running (hydra.sweeper.leave=true): no report yet
            self._leave(Path(config.hydra.sweep.dir))
            return
        uri, _, _ = self._settings(config)
        client = mlflow_store.client(uri)
        sweep_dir = Path(config.hydra.sweep.dir)
        status, sweep = "FINISHED", None
        try:
            if os.environ.get(channels.FAULT_PAUSE_IN_ENV):  # reliability tests: a signal lands in the report
                from sweeplab.callbacks.faults import pause_in  # imports Lightning: only when a test asks for it

                pause_in("report")
            if (process_wall := wall.process_age_s()) > 0:  # what the study cost until its report, which reads it
                from mlflow.entities import Metric

                now = time.time()
                client.log_batch(self.parent_run_id, metrics=[
                    Metric(schema.SWEEP_PROCESS_WALL_METRIC, process_wall, int(now * 1000), 0),
                    Metric(schema.SWEEP_PROCESS_START_METRIC, now - process_wall, int(now * 1000), 0)])
            # the run list once, each job's history once: `best`, the plot and the job counts read the report's record
            report = sweep_report(uri, self.parent_run_id, sweep_dir, options=verdict_options(config))
            sweep = report.sweep
            summary = report.verdict.summary if report.verdict is not None else None
            best = record_best(client, self.parent_run_id, sweep, config, summary)
            files = list(report.files) + _objective_plot(sweep, sweep_dir, config)
            if (sweep_dir / OPTUNA_RESULTS).exists():
                files.append(sweep_dir / OPTUNA_RESULTS)
            if self.print_report:
                print(report.markdown + (f"\nbest: {best}" if best else ""), flush=True)
                print(ui_links.sweep_line(uri, self.parent_run_id), flush=True)  # where make ui's address opens
                if report.html:
                    print(f"report: {report.html}", flush=True)  # the page, for those who never open the UI
            for path in files:
                client.log_artifact(self.parent_run_id, str(path), "report")
            if report.failed:
                channels.failed_jobs = report.failed
                status = "FAILED"
                client.set_tag(self.parent_run_id, "failed_jobs", str(report.failed))
            if channels.lost_jobs:  # ended by the scheduler (sweep.lost_jobs): the study is not done
                status = "FAILED"
                channels.failed_jobs = report.failed + sum(j.status == "KILLED" for j in sweep.jobs)
                client.set_tag(self.parent_run_id, schema.LOST_JOBS_TAG, "; ".join(channels.lost_jobs)[:5000])
                print(f"sweep: {len(channels.lost_jobs)} job(s) ended by the scheduler ({'; '.join(channels.lost_jobs)})"
                      f"; the others ran. Continue the study with: {self.continue_command}", file=sys.stderr, flush=True)
            interrupts.check()  # a stop request swallowed where it landed in the report still ends the sweep KILLED
        except BaseException as exc:
            if is_interrupt(exc):  # Ctrl-C while the report is written: the sweep itself is over
                status = "KILLED"
            raise
        finally:
            self._close(status, sweep)

    def _leave(self, sweep_dir: Path) -> None:
        """Leave the parent run RUNNING, naming the jobs left running and where they are recorded, and say how to
        finish the study (the continue command watches them, runs what is left and writes the report)."""
        parent, self.parent_run_id = self.parent_run_id, None
        channels.open_sweep = None
        self._held.close()  # the continue command takes the sweep's folder
        os.environ.pop(channels.PARENT_RUN_ENV, None)
        left = f"{'; '.join(channels.left_jobs)} (recorded in {sweep_dir.resolve() / channels.SUBMITTED_JOBS_FILE})"
        mlflow_store.client(self._uri).set_tag(parent, schema.LEFT_JOBS_TAG, left[:5000])
        print(f"sweep: submitted {len(channels.left_jobs)} job(s) and left them running ({'; '.join(channels.left_jobs)})"
              f"; the sweep run stays RUNNING. Watch, continue and finish the study with: {self.continue_command}",
              flush=True)

    def _close(self, status: str, sweep: Sweep | None = None) -> None:
        """End the parent run with `status` and the job counts (from `sweep`, read after the last job, where the
        report read it); once, whichever way the sweep ends."""
        parent, self.parent_run_id = self.parent_run_id, None
        channels.open_sweep = None
        self._held.close()  # the sweep folder's lock: the sweep is over
        os.environ.pop(channels.PARENT_RUN_ENV, None)
        if parent is None:
            return
        client = mlflow_store.client(self._uri)
        try:
            if sweep is not None and status != "KILLED":
                statuses = [job.status for job in sweep.jobs]
            else:
                children = mlflow_store.sweep_jobs(self._uri, parent)
                if status == "KILLED" and self._jobs_die_with_the_sweep:
                    # joblib's workers are terminated with the launching process before they can close their runs
                    for run in children:
                        if run.info.status == "RUNNING":
                            client.set_tag(run.info.run_id, schema.ERROR_TAG, "Interrupted: the sweep was interrupted")
                            client.set_terminated(run.info.run_id, "KILLED")
                    children = mlflow_store.sweep_jobs(self._uri, parent)
                statuses = [run.info.status for run in children]
            record_job_counts(client, parent, statuses, self._planned_jobs)
        except Exception as exc:  # the counts are bookkeeping; closing the parent is what matters
            log.warning("could not record the sweep's job counts in MLflow: %s", exc)
        client.set_terminated(parent, status)
        if status == "KILLED" and self.continue_command:  # interrupted in a job, between two, or in the report
            print(f"sweep interrupted; its finished jobs are kept. Continue it with: {self.continue_command}",
                  file=sys.stderr, flush=True)


def end_interrupted_sweep(exc: BaseException) -> None:
    """Close the parent run of the sweep an interrupt stopped (KILLED, with the job counts), if this process opened
    one. The entry point calls this: Hydra runs no callback when a job raises more than an Exception."""
    sweep = channels.open_sweep
    if sweep is not None and sweep.parent_run_id is not None:
        with contextlib.suppress(Exception):
            mlflow_store.client(sweep._uri).set_tag(sweep.parent_run_id, "error", str(exc))
        sweep._close("KILLED")  # says how to continue it


def end_failed_sweep(exc: BaseException) -> None:
    """Close the parent run of a sweep that failed outside its jobs (FAILED, the reason in its `error` tag, the job
    counts: `jobs_not_run` says none ran), if this process opened one and nothing closed it yet."""
    sweep = channels.open_sweep
    if sweep is not None and sweep.parent_run_id is not None:
        with contextlib.suppress(Exception):
            reason = user_message(exc) if is_user_error(exc) else f"{type(exc).__name__}: {exc}"
            mlflow_store.client(sweep._uri).set_tag(sweep.parent_run_id, "error", reason[:5000])
        sweep._close("FAILED")


def record_job_counts(client, parent_run_id: str, statuses: list[str], planned: int | None) -> dict[str, int]:
    """Metrics `jobs_done` (FINISHED), `jobs_failed`, `jobs_killed` and, when the sweeper says how many jobs it
    plans, `jobs_planned` and `jobs_not_run` on the parent run, from the statuses of its jobs' runs."""
    from mlflow.entities import Metric

    counts = {
        "jobs_done": statuses.count("FINISHED"),
        "jobs_failed": statuses.count("FAILED"),
        "jobs_killed": statuses.count("KILLED"),
    }
    if planned is not None:
        counts[schema.JOBS_PLANNED] = planned
        counts[schema.JOBS_NOT_RUN] = max(0, planned - len(statuses))
    now = int(time.time() * 1000)
    client.log_batch(parent_run_id, metrics=[Metric(k, float(v), now, 0) for k, v in counts.items()])
    return counts



def _placement(config: DictConfig) -> str:
    """"configuration 1, replicate 2" for a job of a replicated sweep (the sweeplab sweeper sets both in the job's
    environment); "" otherwise."""
    if config.get("replicates", 1) == 1:
        return ""
    index, replicate = os.environ.get(channels.CONFIG_INDEX_ENV), os.environ.get(channels.REPLICATE_ENV)
    return f"configuration {index}, replicate {replicate}" if index and replicate else ""


def _in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def _bytecode_tags() -> dict[str, str]:
    """The parent run's note that this Python compiled the heavy libraries' sources at its start (its report says
    what that cost); none when their bytecode is cached."""
    uncached = bytecode.uncached_packages()
    return {schema.SWEEP_UNCACHED_BYTECODE_TAG: ", ".join(uncached)} if uncached else {}


def _unswept_values(config: DictConfig, swept: list[str]) -> dict | None:
    """The sweep's config as plain values, without `hydra` and the swept keys; None where an interpolation cannot
    resolve yet (each job's plan names it)."""
    values = settings.plain_values(config)
    for key in swept if values is not None else ():
        *parents, last = key.lstrip("+~").split(".")
        node = values
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return values


def _check_required(config: DictConfig) -> None:
    """A `???` left in the launcher or sweeper (e.g. the SLURM partition) fails here, naming the key."""
    for node in ("hydra.launcher", "hydra.sweeper"):
        section = OmegaConf.select(config, node)
        if section is None:
            continue
        missing = sorted(OmegaConf.missing_keys(section))
        if missing:
            choice = (OmegaConf.select(config, "hydra.runtime.choices") or {}).get(node.replace(".", "/"), "")
            raise UserError(f"{missing[0]} is required by {node.replace('.', '/')}={choice}: add {missing[0]}=...")


def next_job_number(sweep_dir: Path) -> int:
    """The number a continued sweep's first job gets: after every job folder the sweep has, so no two share one."""
    numbered = [int(p.name) for p in sweep_dir.iterdir() if p.name.isdigit()] if sweep_dir.is_dir() else []
    return max(numbered, default=-1) + 1


def reopen_sweep(client, sweep_dir: Path, overrides: list[str]) -> str:
    """`-m ... resume=true`: continue the sweep recorded in `hydra.sweep.dir` under its own parent run (RUNNING
    again); the sweeplab sweeper then skips its finished jobs, resumes the interrupted ones and starts the missing
    ones (sweeplab.study.rounds.job_states). The same study only: the overrides must be the ones it ran with."""
    marker = sweep_dir / channels.PARENT_RUN_FILE
    if not marker.is_file():
        raise UserError(f"resume=true with -m continues the sweep in hydra.sweep.dir; {sweep_dir} holds none (no "
                        f"{channels.PARENT_RUN_FILE}): pass hydra.sweep.dir=<the interrupted sweep's folder>")
    parent_id = marker.read_text().strip()
    try:
        parent = mlflow_store.record_of(client.get_run(parent_id))
    except Exception:
        raise UserError(f"resume: the sweep run {parent_id} of {sweep_dir} is not in this MLflow store") from None
    recorded = naming.recorded_overrides(parent.tags.get(schema.SWEEP_OVERRIDES_TAG, ""))
    if naming.study_overrides(recorded) != naming.study_overrides(overrides):
        raise UserError(f"resume: {sweep_dir} ran with overrides {' '.join(naming.study_overrides(recorded))!r}, this "
                        f"command has {' '.join(naming.study_overrides(overrides))!r}: give the same ones")
    client.update_run(parent_id, status="RUNNING")
    # the jobs a kill -9 left RUNNING are closed now (KILLED): the interrupted ones resume into their run again
    from sweeplab.engine.job import close_abandoned_runs  # deferred: the engine imports Lightning (seconds)

    close_abandoned_runs(client, client.search_runs([parent.experiment_id], max_results=10000,
                                                    filter_string=f"tags.mlflow.parentRunId = '{parent_id}'"))
    client.set_tag(parent_id, "resumed", str(int(parent.tags.get("resumed", "0")) + 1))
    log.info("sweep: continuing sweep run %s of %s (its finished jobs are kept)", parent_id, sweep_dir)
    return parent_id




def _check_replicates(config: DictConfig) -> None:
    """replicates=N needs the sweeplab sweeper, and sets the seed itself: one line otherwise, before any job.
    replicates=auto reads the jobs' results between rounds: it needs the MLflow logger too."""
    count = replicates.replicates_setting(config)
    if count == 1:
        return
    if replicates.is_auto(config) and not MLflowSweepCallback._settings(config)[2]:
        raise UserError("replicates=auto decides from the jobs' results in MLflow: it needs logger.enabled=true "
                        "(or give a number of replicates)")
    setting = f"replicates={config.get('replicates')}"
    if not runs_replicates(config):
        choice = (OmegaConf.select(config, "hydra.runtime.choices") or {}).get("hydra/sweeper", "")
        raise UserError(f"{setting} needs hydra/sweeper=sweeplab; the {choice} sweeper runs each job once "
                        "(run it with replicates=1)")
    if "seed" in naming.swept_keys(config):
        raise UserError(f"{setting} gives replicate r the seed seed + r: sweep seed with replicates=1, or leave it out")


def verdict_option_tags(options: VerdictOptions) -> dict[str, str]:
    """The sweep's `report.target` and `report.quality_tolerance` as its run's tags: `python -m sweeplab.report` run
    again on the sweep asks the same question unless its flags say otherwise."""
    return options.tags()



def _objective_of(config: DictConfig) -> tuple[str, str]:
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
    modes = {j.tags.get(schema.OBJECTIVE_MODE_TAG) for j in jobs} - {None, ""}
    return modes.pop() if len(modes) == 1 else ""


def record_best(client, parent_run_id: str, sweep: Sweep, config: DictConfig,
                summary: SweepSummary | None = None) -> str | None:
    """Mark the best on the parent run; returns a one-line description, or None. With replicates (`summary` of
    configurations with more than one job) the best is the verdict's: one configuration, a tie, or none; else the
    finished job with the best objective."""
    if summary is not None and max(c.jobs for c in summary.configs) > 1:
        return _record_verdict_best(client, parent_run_id, summary, _family_labels(config))
    scored = [j for j in sweep.jobs if j.finished and schema.OBJECTIVE in j.metrics]
    mode = _direction(config, scored)
    if not scored or not mode:
        return None
    pick = max if mode == "max" else min
    best = pick(scored, key=lambda j: j.metrics[schema.OBJECTIVE])
    value = best.metrics[schema.OBJECTIVE]
    metric = best.tags.get(schema.OBJECTIVE_TAG, "")
    swept = set(OmegaConf.select(config, "hydra.sweeper.params") or {})
    configured = [j for j in sweep.jobs if j.params]  # not the jobs that failed before training
    swept |= {k for k in best.params if len({j.params.get(k) for j in configured}) > 1}
    swept -= {schema.SEED_PARAM}
    params = {f"best.{k}": best.params[k] for k in sorted(swept) if k in best.params}
    name = best.name
    tags = {
        "best_run_id": best.run_id,
        "best_run_name": name,
        "best_job": best.tags.get(schema.HYDRA_JOB_TAG, ""),
        "objective": metric,
        schema.OBJECTIVE_MODE_TAG: mode,
    }
    for key, text in tags.items():
        client.set_tag(parent_run_id, key, text)
    mlflow_store.log_params(client, parent_run_id, params)
    client.log_metric(parent_run_id, "best/objective", value)
    shown = ", ".join(f"{k[5:]}={v}" for k, v in params.items())
    line = f"job {tags['best_job']} ({name}): {metric or 'objective'} {value:.4g} ({mode})"
    return f"{line}; {shown}" if shown else line


def _family_labels(config: DictConfig) -> dict[str, str]:
    try:
        return dict(get_family(OmegaConf.select(config, "model.family", default="")).labels)
    except UserError:
        return {}


def _record_verdict_best(client, parent_run_id: str, summary: SweepSummary, labels: dict[str, str]) -> str:
    """Tags `best_verdict` (fastest | tie | no verdict) and `best_config` (the configuration, the tied ones joined
    by " | ", or empty): a tie stays a tie, never a pick by the last digit."""
    verdict = summary.verdict
    names = naming.configuration_run_names([c.config for c in summary.configs], labels)  # the tables' short labels
    client.set_tag(parent_run_id, "best_verdict", verdict.kind)
    client.set_tag(parent_run_id, "best_config", " | ".join(verdict.fastest))
    client.set_tag(parent_run_id, "objective", summary.metric_name)
    client.set_tag(parent_run_id, schema.OBJECTIVE_MODE_TAG, summary.mode)
    if verdict.kind == "fastest":
        return verdict.headline
    if verdict.kind == "tie":
        return f"tie between {', '.join(names.get(c, c) for c in verdict.fastest)} (intervals overlap: not ranked)"
    return f"none ({verdict.headline})"


def _objective_plot(sweep: Sweep, sweep_dir: Path, config: DictConfig) -> list[Path]:
    """objective.png for a search (a sweeper with a direction: Optuna): every trial's objective in launch order and
    the best so far. A grid's job order means nothing, so a grid gets none (the report draws its curves)."""
    scored = [j for j in sweep.jobs if schema.OBJECTIVE in j.metrics]
    if not scored or not isinstance(OmegaConf.select(config, "hydra.sweeper.direction"), str):
        return []
    try:
        jobs = sorted((_job_number(j), j.metrics[schema.OBJECTIVE]) for j in scored)
        metric = scored[0].tags.get(schema.OBJECTIVE_TAG, "")
        return [plots.objective_plot(jobs, metric, _direction(config, scored) or "max", sweep_dir / "objective.png")]
    except Exception as exc:  # a plot is a convenience: the table is the report
        log.warning("objective plot skipped: %s", exc)
        return []


def _job_number(job: JobRecord) -> int:
    text = job.tags.get(schema.HYDRA_JOB_TAG, "")
    return int(text) if text.isdigit() else 0
