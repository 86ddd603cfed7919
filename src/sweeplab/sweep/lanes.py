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

The workers start while the sweep's main process does (`warm_lanes`): Hydra calls the callbacks' on_multirun_start
(the sweep callback's checks, which import Lightning, its MLflow store and parent run: most of the main's start-up)
before it sets the sweeper and this launcher up, so `WarmLanes`, a callback listed before the sweep's, starts them
from a thread, and `setup()` does where that callback is not configured. Each worker imports what a job imports
(`WARM_MODULES`: the training engine with torch and Lightning, MLflow's sqlalchemy store) once it has claimed its
lane's GPUs, so CUDA_VISIBLE_DEVICES is set before anything imported could start CUDA. `launch()` joins that
thread and runs the lanes on the same workers: joblib's loky executor is reused while its arguments (n_jobs among
them) are the same. The workers inherited the main's environment as it was
before the sweep callback set the parent run and the like: each lane task applies what changed since. A warm-up
that failed is logged and the launch goes on (its workers start as before); a sweep that ends before its launch
kills them rather than wait for their imports; a warmed worker's first job counts its
set-up from the lane's start (`process_start`: the GPU claim and the wait for the other lanes), not from the
worker's start, whose imports ran beside the main's.
"""

from __future__ import annotations

import importlib
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, configure_log, filter_overrides, setup_globals
from hydra.experimental.callback import Callback
from hydra_plugins.hydra_joblib_launcher._core import execute_job, process_joblib_cfg
from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher
from omegaconf import DictConfig, OmegaConf

from sweeplab.core import wall
from sweeplab.core.channels import GPU_SLOT_ENV, LANE_ENV
from sweeplab.core.records import JOB
from sweeplab.runtime import distributed
from sweeplab.sweep import launchers, packing

log = logging.getLogger(__name__)

_SLOT_OVERRIDE = f"hydra.job.env_set.{GPU_SLOT_ENV}="
READY_WAIT_S = 300.0
# What a job imports before its first batch, imported by each worker while the main process starts; never CUDA
WARM_MODULES = (
    "sweeplab.train", "sweeplab.engine.training", "hydra_plugins.hydra_joblib_launcher._core",
    "mlflow.tracking", "mlflow.store.tracking.sqlalchemy_store",
)
WARM_WAIT_S = 60.0
_warmed = False  # in a worker: its warm-up ran

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


def join_lanes(taken_dir: Path, block: int, lanes: int, wait_s: float = READY_WAIT_S, lanes_per_gpu: int = 1) -> int:
    """Register as a lane, then wait until `lanes` x `lanes_per_gpu` lanes have (at most `wait_s`); the lane's slot.
    A worker keeps the slot of its GPU block where that is a lane (so from launch to launch, replicates=auto's
    rounds, a slot stays on one GPU); one whose GPUs lie past the lanes (another sweep holds the first GPUs) takes a
    free slot. With several lanes per GPU (sweeplab.sweep.packing) the lanes of one GPU share its slot."""
    slot = next((k for k in dict.fromkeys([block, *range(lanes)]) for i in range(lanes_per_gpu)
                 if k < lanes and take(taken_dir, f"lane{k}.{i}.ready")),
                block % lanes)  # every slot taken: a worker given a second lane task, whose jobs are all taken
    deadline = time.monotonic() + wait_s
    while len(list(taken_dir.glob("lane*.ready"))) < lanes * lanes_per_gpu and time.monotonic() < deadline:
        time.sleep(0.05)
    return slot


def run_lane(jobs: Sequence[LaneJob], taken_dir: str, devices_per_job: int, lanes: int, run_job=None,
             job_args: tuple = (), env_changes: dict[str, str | None] | None = None,
             lanes_per_gpu: int = 1) -> list[tuple[int, Any]]:
    """In a worker: claim a slot's GPUs (kept for the worker's life; `lanes_per_gpu` workers share each slot),
    wait for the other lanes, then run the jobs in `lane_order`, each one no other lane took; returns
    [(job number, what run_job returned)]. `lanes`: the GPU slots. `run_job(number, overrides, *job_args)`:
    Hydra's execute_job; `env_changes`: the main's environment variables set (or removed: None) since the worker
    started."""
    if _warmed:
        wall.count_from_now()  # the worker's imports ran beside the main's start-up: its first job starts here
    for key, value in (env_changes or {}).items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    distributed.claim_gpus(devices_per_job, lanes_per_gpu=lanes_per_gpu)
    slot = join_lanes(Path(taken_dir), distributed.claimed_slot() or 0, lanes, lanes_per_gpu=lanes_per_gpu)
    done = []
    for number, overrides, _ in lane_order(jobs, slot):
        if take(Path(taken_dir), number):
            os.environ[LANE_ENV] = f"{slot}:{os.getpid()}"  # the job's run records its lane (the report's timeline)
            done.append((number, (run_job or execute_job)(number, overrides, *job_args)))
    return done


def warm_worker(modules: Sequence[str], ready_dir: str, workers: int, devices_per_job: int,
                wait_s: float = WARM_WAIT_S) -> int:
    """In a worker: claim a slot's GPUs (as run_lane does, first: CUDA_VISIBLE_DEVICES is set before anything is
    imported, so nothing imported can start CUDA on other GPUs), import `modules`, then wait until `workers`
    warm-up tasks have started (at most `wait_s`), so that each task holds a worker of its own; returns the pid."""
    global _warmed
    take(Path(ready_dir), os.getpid())
    distributed.claim_gpus(devices_per_job)
    for name in modules:
        importlib.import_module(name)
    _warmed = True
    deadline = time.monotonic() + wait_s
    while len(os.listdir(ready_dir)) < workers and time.monotonic() < deadline:
        time.sleep(0.05)
    return os.getpid()


def _joblib_options(options: dict) -> dict:
    """Parallel's arguments from the launcher's options, as launch() passes them (the warm-up must match them for
    joblib to reuse its workers)."""
    joblib_cfg = {k: v for k, v in options.items() if k not in packing.LAUNCHER_KEYS}
    joblib_cfg["backend"] = "loky"  # as Hydra's: its threading backend cannot run Hydra jobs
    process_joblib_cfg(joblib_cfg)
    return joblib_cfg


class WarmUp:
    """The lanes' workers, started and warmed from a thread of the main process (`warm_lanes`)."""

    def __init__(self, joblib_cfg: dict, devices_per_job: int = 1, modules: Sequence[str] = WARM_MODULES):
        self.joblib_cfg = joblib_cfg
        self.devices_per_job = devices_per_job
        self.modules = tuple(modules)
        self.env = dict(os.environ)  # what the workers start with
        self.pids: list[int] = []
        self.error: BaseException | None = None
        self.seconds = 0.0
        self._joined = False
        self._thread = threading.Thread(target=self._run, name="sweeplab-lanes-warm-up", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from joblib import Parallel, delayed

        started = time.perf_counter()
        workers = int(self.joblib_cfg["n_jobs"])
        ready_dir = tempfile.mkdtemp(prefix="sweeplab-warm-")
        try:
            tasks = Parallel(**self.joblib_cfg, return_as="generator")(
                delayed(warm_worker)(self.modules, ready_dir, workers, self.devices_per_job)
                for _ in range(workers))
            # the executor exists now: this runs before loky's exit hook, which would wait for the imports
            threading._register_atexit(_stop_unused_workers)
            self.pids = list(tasks)
        except BaseException as exc:  # the launch goes on without it (its jobs' own errors are theirs)
            self.error = exc
        finally:
            shutil.rmtree(ready_dir, ignore_errors=True)
            self.seconds = time.perf_counter() - started

    def join(self) -> list[int]:
        """Wait for the warm-up; the warmed workers' pids (empty: it failed, which is logged once)."""
        self._thread.join()
        first, self._joined = not self._joined, True
        if first and self.error is not None:
            log.warning("the lanes' warm-up failed (%s: %s); the lanes start new workers now",
                        type(self.error).__name__, self.error)
            _kill_workers()  # a half-warmed worker never runs a lane
        elif first:
            log.info("%d lane workers warmed in %.1f s beside the sweep's start (pids %s)", len(set(self.pids)),
                     self.seconds, sorted(set(self.pids)))
        return [] if self.error is not None else list(self.pids)

    def env_changes(self) -> dict[str, str | None]:
        """The main's environment variables set, changed or removed (None) since the workers started."""
        now = dict(os.environ)
        changed: dict[str, str | None] = {k: v for k, v in now.items() if self.env.get(k) != v}
        changed.update({k: None for k in self.env if k not in now})
        return changed


_warm_up: WarmUp | None = None


def warm_lanes(launcher_options: dict, devices_per_job: int = 1,
               modules: Sequence[str] = WARM_MODULES) -> WarmUp | None:
    """Start the lanes' workers and their warm-up now, once per process (None: one lane, no workers to warm)."""
    global _warm_up
    joblib_cfg = _joblib_options({k: v for k, v in launcher_options.items() if k != "_target_"})
    if _warm_up is None and int(joblib_cfg.get("n_jobs") or 1) > 1:
        _warm_up = WarmUp(joblib_cfg, devices_per_job, modules)
    return _warm_up


def _stop_unused_workers() -> None:
    """A sweep that ends before its launch (a config error) exits now, not after its workers' imports."""
    if _warm_up is not None and not _warm_up._joined:
        _kill_workers()


def _kill_workers() -> None:
    from joblib.externals.loky import reusable_executor

    executor = getattr(reusable_executor, "_executor", None)  # loky's one executor (joblib is pinned)
    if executor is not None:
        executor.shutdown(wait=False, kill_workers=True)


class WarmLanes(Callback):
    """hydra.callbacks.lanes_warm_up (listed before the sweep's callback): the lanes' workers start with the sweep,
    and so does the process of their probe where one will likely run (sweeplab.sweep.packing)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if launchers.can(OmegaConf.select(config, "hydra.launcher")).assigns_gpus:
            packing.start_probe_early(config)
            warm_lanes(OmegaConf.to_container(config.hydra.launcher, resolve=True), _devices_per_job(config))


def _devices_per_job(config: DictConfig) -> int:
    return int(OmegaConf.select(config, JOB.devices, default=1) or 1)  # the run record's key is the config's


def _lane_in_worker(*lane_args) -> tuple[int, list[tuple[int, Any]]]:
    return os.getpid(), run_lane(*lane_args)


def launch_lanes(joblib_cfg: dict, jobs: Sequence[LaneJob], taken_dir: str, devices_per_job: int, lanes: int,
                 run_job=None, job_args: tuple = (), lanes_per_gpu: int = 1) -> dict[int, Any]:
    """Run `jobs` in `lanes` x `lanes_per_gpu` joblib workers (run_lane), on the workers `warm_lanes` started where
    it did (more workers are added beside them where packing asks for more); returns {job number: what run_job
    returned}. A job's exception is raised here, as joblib raises it."""
    from joblib import Parallel, delayed

    warm_up = _warm_up
    warmed = warm_up.join() if warm_up is not None else []
    env_changes = warm_up.env_changes() if warm_up is not None else None
    workers = lanes * lanes_per_gpu
    ran = Parallel(**dict(joblib_cfg, n_jobs=workers))(
        delayed(_lane_in_worker)(jobs, taken_dir, devices_per_job, lanes, run_job, job_args, env_changes,
                                 lanes_per_gpu) for _ in range(workers))
    pids = sorted({pid for pid, _ in ran})
    if warmed:
        log.info("the lanes ran on %s (pids %s)", "the warmed workers" if set(pids) <= set(warmed)
                 else "other workers than the warmed (the worker set changed)", pids)
    return dict(pair for _, lane in ran for pair in lane)


class GpuLanesJoblibLauncher(JoblibLauncher):
    def setup(self, *, hydra_context, task_function, config: DictConfig) -> None:
        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)
        warm_lanes(self.joblib, _devices_per_job(config))  # where WarmLanes is not configured (else it did)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        setup_globals()
        assert self.config is not None and self.task_function is not None and self.hydra_context is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        joblib_cfg = _joblib_options(self.joblib)
        lanes_per_gpu = packing.resolved_lanes(self.joblib)
        lanes = max(1, int(joblib_cfg.get("n_jobs") or 1) // lanes_per_gpu)  # GPU slots
        jobs = [(initial_job_idx + i, list(o), slot_of(o, i, lanes)) for i, o in enumerate(job_overrides)]
        log.info("%d GPU lanes (joblib workers, %d per slot) run %d jobs; sweep output dir: %s",
                 lanes * lanes_per_gpu, lanes_per_gpu, len(jobs), sweep_dir)
        for number, overrides, slot in jobs:
            log.info("\t#%d (slot %d) : %s", number, slot, " ".join(filter_overrides(overrides)))
        devices = _devices_per_job(self.config)
        taken_dir = tempfile.mkdtemp(prefix=".lanes-", dir=sweep_dir)
        job_args = (self.hydra_context, self.config, self.task_function, Singleton.get_state())
        try:
            returns = launch_lanes(joblib_cfg, jobs, taken_dir, devices, lanes, None, job_args, lanes_per_gpu)
        finally:
            shutil.rmtree(taken_dir, ignore_errors=True)
        return [returns[number] for number, _, _ in jobs]
