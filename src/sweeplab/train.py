"""The training app: `python -m sweeplab.train [overrides]`, `-m` for sweeps. See conf/train.yaml."""

from __future__ import annotations

import logging
import os
import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from sweeplab import CONF_DIR
from sweeplab.core import bytecode, channels, cli, interrupts, orphans, wall
from sweeplab.core.console import quiet_libraries
from sweeplab.core.errors import exit_on_user_error, is_user_error, user_message
from sweeplab.core.outcome import JobOutcome
from sweeplab.core.place import JobPlace
from sweeplab.engine import settings
from sweeplab.runtime.availability import refuse_absent_backend
from sweeplab.study import replicates
from sweeplab.sweep.checks import composition_error
from sweeplab.sweep.study import end_open_study

log = logging.getLogger("sweeplab")
quiet_libraries()


def job_place() -> JobPlace:
    """This job's place in its study, read once, here: from its config as Hydra composed it (`hydra.job.env_set`, where
    the sweeplab sweeper writes it; conf/train.yaml declares it empty), which Hydra also sets in the job's environment
    for its children (DDP ranks, which Lightning starts as single runs: empty there, as before). Only the lane comes
    from the environment: the lanes launcher's worker sets it there before each job."""
    from hydra.core.hydra_config import HydraConfig

    env_set = dict(HydraConfig.get().job.env_set or {}) if HydraConfig.initialized() else {}
    return JobPlace.of_env_set({**env_set, channels.LANE_ENV: os.environ.get(channels.LANE_ENV)})


def _in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
def main(cfg: DictConfig) -> JobOutcome | None:
    wall.count_from_process_start()  # the job's wall breakdown starts with the process (a worker's too)
    quiet_libraries()  # again: a joblib/loky worker or a submitit job runs this function, not the module's top
    orphans.watch_launcher(channels.LAUNCHER_PID_ENV)  # a loky worker ends with the sweep that started it
    # INFO "Creating initial MLflow database tables"; ERROR: a traceback for every database error it then raises
    # anyway (read-only, locked, full), which mlflow_store reports in one line
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    # once, in the process the user started (its workers pay the same); not a function of this module: a joblib
    # worker unpickles main() by value, and what it calls from __main__ must be too
    if os.environ.get(channels.LAUNCHER_PID_ENV) == str(os.getpid()):
        bytecode.warn_once(log)

    place = job_place()
    try:
        settings.check_config(cfg)  # every setting's value, in milliseconds, before the heavy imports
        replicates.replicates_setting(cfg)  # a single job's too: replicates=sometimes means nothing anywhere
        # backend=cuda without a GPU, mps off macOS, mlx not installed: refused before torch's import (seconds)
        refuse_absent_backend(str(OmegaConf.select(cfg, "backend.name", default="")))
        # deferred: training imports torch and Lightning (seconds): a config error fails without them, and run() has
        # installed the signal handlers before they load
        from sweeplab.engine.training import run_job

        return run_job(cfg, place)  # what the job did, for its sweeper (Hydra's JobReturn.return_value)
    except Exception as exc:
        expected = is_user_error(exc)
        if _in_multirun():
            from sweeplab.engine.outcome import failed_outcome
            from sweeplab.engine.training import record_failed_job

            # One failed job must not end the sweep: it is recorded as a FAILED run (reason in its `error` tag),
            # the other jobs run, the report lists it and the sweep's exit code says so.
            log.error("job failed: %s", user_message(exc) if expected else f"{type(exc).__name__}: {exc}", exc_info=not expected)
            record_failed_job(cfg, exc, place)
            return failed_outcome(exc, place)
        exit_on_user_error(exc)


def run() -> None:
    interrupts.install()  # before anything slow: a SIGTERM while imports or data indexing run ends cleanly too
    orphans.die_with_parent_if_asked()  # started by another sweeplab process (the order check): ends with it
    os.environ[channels.LAUNCHER_PID_ENV] = str(os.getpid())  # the jobs' workers (joblib) tell themselves from it
    # Hydra prints a composition error as 4 lines and a syntax error as a traceback, and exits 1, unless
    # HYDRA_FULL_ERROR lets the exception reach us (SWEEPLAB_TRACEBACK=1 shows the trace)
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    try:
        main()
    except interrupts.Interrupted as exc:
        # the job's run is KILLED already (JobRun); the sweep's parent is closed here, as Hydra calls no callback
        # when a job raises more than an Exception
        end_open_study(exc)
        print(f"error: {exc}; the MLflow runs it stopped are marked KILLED", file=sys.stderr)
        sys.exit(exc.exit_status)
    except Exception as exc:
        # a sweep that failed outside its jobs (a misspelt swept key fails when the sweeper checks the first batch):
        # Hydra calls no on_multirun_end, so its parent run is closed here, FAILED with the reason
        error = composition_error(exc) if cli.is_hydra_error(exc) else exc
        end_open_study(error)
        exit_on_user_error(error)  # re-raises what is no user error, with its traceback

    failed = channels.failed_jobs
    if failed:
        print(channels.failed_summary
              or f"error: {failed} job(s) of the sweep failed; see the report above and each run's `error` tag",
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    run()
