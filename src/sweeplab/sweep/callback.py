"""The sweep's Hydra callback: the job-side hooks, and a `Study` for the sweepers that hold none of their own.

In each job's own process (`on_job_start`, `on_job_end`), wherever the launcher runs it: the job's progress line;
with `assign_gpus` the job takes its own GPU(s) before CUDA starts; the job's return value (what a sweeper optimises:
the best monitored metric) is logged to the job's run as the metric `objective`.

In the launching process: the sweeplab sweeper opens, reads and finishes its own study (sweep.study.Study). For any
other sweeper (Hydra's basic one, a plugin) this callback opens a `Study` in `on_multirun_start` and finishes it in
`on_multirun_end`, so every sweep gets its sweep run, its report and its job counts.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from sweeplab.core import channels
from sweeplab.core.errors import UserError
from sweeplab.core.outcome import JobOutcome
from sweeplab.core.place import JobPlace
from sweeplab.core.records import JOB, JobRun
from sweeplab.runtime import distributed
from sweeplab.study.rounds import sweeper_class
from sweeplab.sweep.best import objective_of
from sweeplab.sweep.checks import tracking_settings
from sweeplab.sweep.progress import progress_line
from sweeplab.sweep.study import Study
from sweeplab.tracking import mlflow_store

log = logging.getLogger(__name__)

distributed.register_resolvers()  # hydra/launcher=joblib_gpus sizes n_jobs with it


def holds_its_study(config: DictConfig) -> bool:
    """The sweep's sweeper opens and finishes its own `Study` (the class says so: `holds_study = True`)."""
    return bool(getattr(sweeper_class(config), "holds_study", False))


class MLflowSweepCallback(Callback):
    def __init__(self, print_report: bool = True, assign_gpus: bool = False) -> None:
        self.print_report = print_report
        self.assign_gpus = assign_gpus  # each parallel job gets `trainer.devices` GPUs of its own
        self.study: Study | None = None  # the study this callback opened for a sweeper that holds none
        self._launch_env: dict[str, str | None] | None = None

    # --- the launching process: a study for a sweeper that holds none -------------------------------------------
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if holds_its_study(config):
            return
        try:
            self.study = Study.open(config, self.print_report)
        except UserError as exc:
            # expected mistakes: one line, no traceback, no job started (Hydra turns what a callback raises into a
            # warning, so the callback ends the process itself)
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        study, self.study = self.study, None
        if study is not None:
            study.finish()

    # --- each job's process ---------------------------------------------------------------------------------------
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
            distributed.claim_gpus(int(OmegaConf.select(config, JOB.devices, default=1) or 1),
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
        if isinstance(value, JobOutcome):  # sweeplab.train's jobs return what they did; another task its objective
            value = value.objective
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return
        metric, mode = objective_of(config)
        record = JobRun(objective=float(value), objective_metric=metric, objective_mode=mode,
                        hydra_job=str(OmegaConf.select(config, "hydra.job.num", default="")),
                        cuda_visible_devices=os.environ.get(channels.CUDA_VISIBLE_DEVICES_ENV))
        try:
            mlflow_store.write(tracking_settings(config)[0], run_id, record)
        except Exception as exc:  # bookkeeping must never fail a job that trained
            log.warning("could not record the job's objective in MLflow: %s", exc)


def _placement(config: DictConfig) -> str:
    """"configuration 1, replicate 2" for a job of a replicated sweep (the sweeplab sweeper composes both into the
    job's config, `hydra.job.env_set`: core/place.py); "" otherwise."""
    if config.get("replicates", 1) == 1:
        return ""
    place = JobPlace.of_env_set(OmegaConf.select(config, "hydra.job.env_set", default=None))
    if place.config_index is None or place.replicate is None:
        return ""
    return f"configuration {place.config_index}, replicate {place.replicate}"


def _in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
