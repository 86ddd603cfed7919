"""hydra/launcher=joblib_gpus: Hydra's joblib launcher cut into lanes, one worker per GPU slot.

Hydra's joblib launcher hands each job to whichever worker is free, and a worker keeps its GPU for life (its CUDA
context cannot move; distributed.claim_gpus), so which GPU a job gets is a race and a configuration can land on the
same GPU in every round. Here each worker is a lane: it claims a slot (a block of trainer.devices GPUs) and runs the
jobs the sweeper gave that slot (replicates.gpu_slot, rotated per round), in launch order, one after another, with no
barrier between them; a lane that has run its own jobs then takes the next job nobody has started, so no GPU idles
while jobs wait. The lanes are processes: which one runs a job is settled by a marker file per job (os.O_EXCL) in a
folder of the sweep directory, removed after the launch. Jobs without a slot (another sweeper) are dealt round-robin.

One wait is kept on purpose: a lane starts its jobs once every lane holds its GPUs (or after `READY_WAIT_S`).
Workers come up seconds apart (importing torch); without the wait the first one up would take the first jobs of
the lanes still starting, and the rotation would be the start-up's order, not the plan's.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, configure_log, filter_overrides, setup_globals
from hydra_plugins.hydra_joblib_launcher._core import execute_job, process_joblib_cfg
from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher
from omegaconf import OmegaConf

from sweeplab.core.channels import GPU_SLOT_ENV
from sweeplab.runtime import distributed

log = logging.getLogger(__name__)

_SLOT_OVERRIDE = f"hydra.job.env_set.{GPU_SLOT_ENV}="
READY_WAIT_S = 300.0

# (job number, overrides, GPU slot)
LaneJob = tuple[int, list[str], int]


def slot_of(overrides: Sequence[str], position: int, lanes: int) -> int:
    """The GPU slot the sweeper set in a job's overrides, else its position in the launch round-robin."""
    for override in overrides:
        if override.startswith(_SLOT_OVERRIDE) and override[len(_SLOT_OVERRIDE):].isdigit():
            return int(override[len(_SLOT_OVERRIDE):]) % lanes
    return position % lanes


def lane_order(jobs: Sequence[LaneJob], slot: int) -> list[LaneJob]:
    """The order a lane on `slot` tries the jobs in: its own, then everyone else's, each in launch order."""
    return [job for job in jobs if job[2] == slot] + [job for job in jobs if job[2] != slot]


def take(taken_dir: Path, name: int | str) -> bool:
    """True for the one lane that takes job (or lane) `name` first."""
    try:
        os.close(os.open(taken_dir / str(name), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False
    return True


def join_lanes(taken_dir: Path, block: int, lanes: int, wait_s: float = READY_WAIT_S) -> int:
    """Register as a lane, then wait until `lanes` lanes have (at most `wait_s`); the lane's slot. A worker keeps
    the slot of its GPU block where that is a lane (so from launch to launch, replicates=auto's rounds, a slot
    stays on one GPU); one whose GPUs lie past the lanes (another sweep holds the first GPUs) takes a free slot."""
    slot = next((k for k in dict.fromkeys([block, *range(lanes)]) if k < lanes and take(taken_dir, f"lane{k}.ready")),
                block % lanes)  # every slot taken: a worker given a second lane task, whose jobs are all taken
    deadline = time.monotonic() + wait_s
    while len(list(taken_dir.glob("lane*.ready"))) < lanes and time.monotonic() < deadline:
        time.sleep(0.05)
    return slot


def run_lane(jobs: Sequence[LaneJob], taken_dir: str, devices_per_job: int, lanes: int, run_job=None,
             job_args: tuple = ()) -> list[tuple[int, Any]]:
    """In a worker: claim a slot's GPUs (kept for the worker's life), wait for the other lanes, then run the jobs
    in `lane_order`, each one no other lane took; returns [(job number, what run_job returned)].
    `run_job(number, overrides, *job_args)`: Hydra's execute_job."""
    distributed.claim_gpus(devices_per_job)
    slot = join_lanes(Path(taken_dir), distributed.claimed_slot() or 0, lanes)
    done = []
    for number, overrides, _ in lane_order(jobs, slot):
        if take(Path(taken_dir), number):
            done.append((number, (run_job or execute_job)(number, overrides, *job_args)))
    return done


class GpuLanesJoblibLauncher(JoblibLauncher):
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from joblib import Parallel, delayed

        setup_globals()
        assert self.config is not None and self.task_function is not None and self.hydra_context is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        joblib_cfg = dict(self.joblib, backend="loky")  # as Hydra's: its threading backend cannot run Hydra jobs
        process_joblib_cfg(joblib_cfg)
        lanes = max(1, int(joblib_cfg.get("n_jobs") or 1))
        jobs = [(initial_job_idx + i, list(o), slot_of(o, i, lanes)) for i, o in enumerate(job_overrides)]
        log.info("%d GPU lanes (joblib workers, one per slot) run %d jobs; sweep output dir: %s", lanes, len(jobs),
                 sweep_dir)
        for number, overrides, slot in jobs:
            log.info("\t#%d (slot %d) : %s", number, slot, " ".join(filter_overrides(overrides)))
        devices = int(OmegaConf.select(self.config, "trainer.devices", default=1) or 1)
        taken_dir = tempfile.mkdtemp(prefix=".lanes-", dir=sweep_dir)
        job_args = (self.hydra_context, self.config, self.task_function, Singleton.get_state())
        try:
            results = Parallel(**joblib_cfg)(delayed(run_lane)(jobs, taken_dir, devices, lanes, None, job_args)
                                             for _ in range(lanes))
        finally:
            shutil.rmtree(taken_dir, ignore_errors=True)
        returns = dict(pair for lane in results for pair in lane)
        return [returns[number] for number, _, _ in jobs]
