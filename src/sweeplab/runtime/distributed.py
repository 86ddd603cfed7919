"""Several processes for one job (DDP ranks) and several jobs on one host (one GPU each).

- `is_global_zero()`: rank 0 of a distributed job, known from the environment before any Trainer exists, so only
  rank 0 creates the job's MLflow run.
- `trainer_options()`: the Trainer's DDP settings, and `prepare_relaunch()`: Lightning's `ddp` strategy starts
  ranks > 0 by re-running the command line. Under Hydra multirun that command is the whole sweep (every child starts
  the sweep again and `${now:}` dirs re-resolve), and in a joblib worker `sys.argv` is not the training app at all.
  After this call Lightning starts each child as the single job it belongs to:
  `python -m sweeplab.train <this job's overrides> hydra.run.dir=<this job's dir> hydra.mode=RUN`.
  On SLURM (hydra/launcher=slurm: one task per GPU) the ranks are SLURM's tasks and nothing is relaunched.
- `claim_gpus()`: a parallel sweep job takes `trainer.devices` free GPUs of the host (a lock file per GPU) and sees
  only those (CUDA_VISIBLE_DEVICES); the Hydra sweep callback calls it before the job imports CUDA.
- `end_job()`: the next DDP job in the same process (Hydra's basic launcher runs jobs one after another in one
  process) starts its own ranks: the last job's process group is closed and Lightning's rendezvous variables go.
- `job_summary()`: each rank times its own batches; the job's throughput is that times the world size.
"""

from __future__ import annotations

import fcntl
import importlib
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sweeplab.core.channels import CUDA_VISIBLE_DEVICES_ENV, GPU_LOCK_DIR_ENV
from sweeplab.core.errors import UserError
from sweeplab.core.files import open_no_follow
from sweeplab.core.records import JOB

log = logging.getLogger(__name__)

APP_MODULE = "sweeplab.train"
# Set by torchrun (RANK), Lightning's own launcher (LOCAL_RANK, NODE_RANK), SLURM (SLURM_PROCID) and LSF/jsrun.
RANK_ENV_VARS = ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")
# Lightning 2.6 builds a Hydra child's command here (private API: lightning is pinned; tests/test_ddp*.py guard it)
_LAUNCHER_MODULES = (
    "lightning.fabric.strategies.launchers.subprocess_script",
    "lightning.pytorch.strategies.launchers.subprocess_script",
)
# Hydra overrides that belong to launching the sweep, not to the job a child rank re-creates
_LAUNCH_KEYS = (
    "hydra/launcher", "hydra.launcher", "hydra/sweeper", "hydra.sweeper", "hydra.sweep.", "hydra.mode", "hydra.run.",
    "hydra.job.name", "hydra.output_subdir",
)


# --- ranks ---------------------------------------------------------------------------------------
def is_global_zero() -> bool:
    """True in rank 0 of a distributed job and in any process that is not part of one."""
    return all(os.environ.get(key, "0").strip() in ("", "0") for key in RANK_ENV_VARS)


PER_DEVICE = {  # a DDP job's figures that count all its ranks, and where rank 0's own go
    JOB.samples_per_sec: JOB.samples_per_sec_per_device,
    JOB.samples_per_sec_overall: JOB.samples_per_sec_overall_per_device,
    JOB.tokens_per_sec: JOB.tokens_per_sec_per_device,
    JOB.samples_per_step: JOB.samples_per_step_per_device,
}


def job_summary(summary: Mapping[str, float], world_size: int) -> dict[str, float]:
    """The job's throughput from rank 0's: DDP ranks run the same number of equal batches in lock step."""
    out = dict(summary)
    if world_size > 1:
        for key, per_device in PER_DEVICE.items():
            if key in out:
                out[per_device] = out[key]
                out[key] = out[key] * world_size
    out[JOB.world_size] = float(world_size)
    return out


# --- the Trainer's distributed settings ----------------------------------------------------------
def trainer_options(devices: int) -> dict:
    """Keyword arguments of `L.Trainer` for `devices` processes; prepares the relaunch of ranks > 0.

    The train loaders' sampler shards itself across ranks (it must stay resumable), so Lightning does not swap in a
    DistributedSampler; validation runs on all of its data on every rank, so val metrics need no reduction.
    """
    prepare_relaunch()
    return {"strategy": _ddp_strategy() if devices > 1 else "auto", "use_distributed_sampler": False}


def _ddp_strategy():
    from lightning.pytorch.strategies import DDPStrategy
    from torch.nn.parallel import DistributedDataParallel

    class CurrentStreamDDP(DDPStrategy):
        """Lightning's DDP, but the model is wrapped on the current CUDA stream. Lightning wraps it on a side
        stream; with torch >= 2.10 every backward then meets gradient accumulators made on that stream and
        synchronises the two ("AccumulateGrad node's stream does not match")."""

        def _setup_model(self, model):
            return DistributedDataParallel(module=model, device_ids=self.determine_ddp_device_ids(), **self._ddp_kwargs)

    return CurrentStreamDDP(gradient_as_bucket_view=True)  # gradients live in DDP's buckets: no copy per step


# --- relaunching ranks > 0 as this one job -------------------------------------------------------
def prepare_relaunch(module: str = APP_MODULE) -> None:
    """Make Lightning's DDP launcher start ranks > 0 as this Hydra job alone; call before creating the Trainer."""

    def job_command(local_rank: int) -> tuple[list[str], str]:
        return relaunch_command(local_rank, module)

    for name in _LAUNCHER_MODULES:
        launcher = importlib.import_module(name)
        if not hasattr(launcher, "_hydra_subprocess_cmd"):
            raise RuntimeError(
                f"{name}._hydra_subprocess_cmd is gone: sweeplab's DDP relaunch is written for lightning 2.6 "
                "(the version pyproject.toml pins)"
            )
        launcher._hydra_subprocess_cmd = job_command


def relaunch_command(local_rank: int, module: str = APP_MODULE) -> tuple[list[str], str]:
    """(argv, cwd) that re-creates the current Hydra job, in its own output dir, as a single run."""
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    command = [sys.executable, "-m", module]
    for source in hc.runtime.config_sources:
        if source.provider == "command-line":  # --config-dir / -cd
            command += ["--config-dir", str(source.path)]
    if hc.job.config_name:
        command += ["--config-name", hc.job.config_name]
    command += list(hc.overrides.task)
    command += [o for o in hc.overrides.hydra if not o.lstrip("+~").startswith(_LAUNCH_KEYS)]
    command += [
        f"hydra.run.dir={_quoted(hc.runtime.output_dir)}",
        "hydra.mode=RUN",
        "hydra.output_subdir=null",  # rank 0 already wrote .hydra/ there
        f"hydra.job.name={hc.job.name}_rank{local_rank}",
    ]
    return command, hc.runtime.cwd


def _quoted(value: str) -> str:
    if re.fullmatch(r"[\w./-]+", value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


# --- between two jobs of one process --------------------------------------------------------------
# What Lightning's launcher leaves in the main process's environment; the next DDP job in the same process (Hydra's
# basic launcher, a reused joblib worker) would take LOCAL_RANK as "ranks are started externally" and start none.
LAUNCH_ENV_VARS = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")


def launch_env() -> dict[str, str | None]:
    return {key: os.environ.get(key) for key in LAUNCH_ENV_VARS}


def end_job(env_before: Mapping[str, str | None]) -> None:
    """After a job, in a process that runs more: close the job's process group and restore the launch environment."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    for key, value in env_before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


# --- one GPU (or trainer.devices GPUs) per parallel job ------------------------------------------
@dataclass
class _Claim:
    gpus: list[str]
    fds: list[int]
    slot: int  # which block of `count` GPUs of the visible ones: gpus == visible[slot * count:(slot + 1) * count]


_claim: _Claim | None = None  # held for the life of the process: CUDA binds a process to the GPUs it first saw


def visible_gpus() -> list[str]:
    """The GPU ids this process may use: CUDA_VISIBLE_DEVICES when set, else every GPU the driver reports."""
    env = os.environ.get(CUDA_VISIBLE_DEVICES_ENV)
    if env is not None:
        return [gpu.strip() for gpu in env.split(",") if gpu.strip() and gpu.strip() != "-1"]
    # not torch.cuda.device_count(): it initialises CUDA, which then ignores a later CUDA_VISIBLE_DEVICES
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip().isdigit()] if out.returncode == 0 else []


def gpu_slots(devices_per_job: int = 1) -> int:
    """How many jobs can run side by side with `devices_per_job` GPUs each (at least 1)."""
    return max(1, len(visible_gpus()) // max(1, int(devices_per_job)))


def gpu_lock_dir() -> Path:
    return Path(os.environ.get(GPU_LOCK_DIR_ENV) or Path(tempfile.gettempdir()) / f"sweeplab-gpus-{os.getuid()}")


def job_gpus(backend: str) -> list[str]:
    """The GPU ids a sweep job runs on: those it claimed (hydra/launcher=joblib_gpus), else on CUDA those the
    launcher gave it (CUDA_VISIBLE_DEVICES: SLURM's, a user's); empty on other backends or when CUDA sees every GPU."""
    if _claim is not None:
        return list(_claim.gpus)
    env = os.environ.get(CUDA_VISIBLE_DEVICES_ENV)
    return [gpu.strip() for gpu in env.split(",") if gpu.strip()] if backend == "cuda" and env else []


def claimed_slot() -> int | None:
    """The slot (block of GPUs, replicates.gpu_slot) this process holds; None before a claim."""
    return _claim.slot if _claim is not None else None


def claim_gpus(
    count: int, lock_dir: Path | None = None, wait_s: float = 7 * 24 * 3600, poll_s: float = 1.0,
    slot: int | None = None, lanes_per_gpu: int = 1,
) -> list[str]:
    """Take a block of `count` GPUs (the visible GPUs cut into blocks of `count`) no other job of this host holds
    and restrict this process to them; returns their ids. `slot`: the block to try first (the job's GPU slot).
    `lanes_per_gpu` > 1: up to that many processes hold a block side by side, each with a lock per GPU of its own
    (lane 0's is the block's plain lock, so a one-lane sweep on the host sees the GPU taken).

    Waits while all are taken. A process keeps its GPUs until it exits (a reused joblib worker keeps its GPUs
    for the next job: its CUDA context cannot move; the joblib lanes launcher gives such a worker the jobs of its
    slot).
    """
    global _claim
    if _claim is not None:
        return _claim.gpus
    gpus = visible_gpus()
    if count > len(gpus):
        raise UserError(
            f"one GPU per job: a job needs {count} GPU(s) (trainer.devices) but {len(gpus)} are visible "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get(CUDA_VISIBLE_DEVICES_ENV, 'unset')}); lower trainer.devices"
        )
    lock_dir = lock_dir or gpu_lock_dir()
    lock_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_s
    waiting_logged = False
    while True:
        held = _try_lock(gpus, count, lock_dir, slot, lanes_per_gpu)
        if held is not None:
            block, held = held
            _claim = _Claim([gpu for gpu, _ in held], [fd for _, fd in held], block)
            os.environ[CUDA_VISIBLE_DEVICES_ENV] = ",".join(_claim.gpus)
            log.info("this job runs on GPU %s", os.environ[CUDA_VISIBLE_DEVICES_ENV])
            return _claim.gpus
        if time.monotonic() > deadline:
            raise UserError(
                f"one GPU per job: no {count} free GPU(s) of {gpus} within {wait_s:.0f} s (locks in {lock_dir})"
            )
        if not waiting_logged:
            log.info("waiting for %d free GPU(s) of %s", count, gpus)
            waiting_logged = True
        time.sleep(poll_s)


def _try_lock(gpus: list[str], count: int, lock_dir: Path, first: int | None = None,
              lanes_per_gpu: int = 1) -> tuple[int, list[tuple[str, int]]] | None:
    """(block, [(gpu, lock fd)]) of the first block of `count` GPUs with a free lane, trying block `first` first,
    lane by lane (every block's first lane before any block's second: lanes spread over the GPUs)."""
    blocks = len(gpus) // count
    start = (first or 0) % max(1, blocks)
    for block, lane in [(b, k) for k in range(max(1, lanes_per_gpu)) for b in [*range(start, blocks), *range(start)]]:
        held: list[tuple[str, int]] = []
        for gpu in gpus[block * count:(block + 1) * count]:
            fd = open_no_follow(lock_dir / (f"gpu{gpu}.lock" if lane == 0 else f"gpu{gpu}.lane{lane}.lock"),
                                os.O_RDWR | os.O_CREAT, "a GPU lock file")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                break
            held.append((gpu, fd))
        if len(held) == count:
            return block, held
        for _, fd in held:  # the block is partly taken: give back what we took
            os.close(fd)
    return None


def register_resolvers() -> None:
    """`${sweeplab_gpu_slots:${trainer.devices}}`: how many jobs fit this host's GPUs (hydra/launcher=joblib_gpus)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("sweeplab_gpu_slots"):
        OmegaConf.register_new_resolver("sweeplab_gpu_slots", lambda devices=1: gpu_slots(int(devices)))
