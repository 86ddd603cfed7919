"""Several jobs side by side on one GPU (hydra/launcher=joblib_gpus, `lanes_per_gpu`): how many, and what each
job's run learns about it.

A small model leaves most of a GPU idle (the default TextBridge study: 10-13 ms a step, launch-bound, 0.1-0.3 % MFU),
so the lanes launcher may run N workers on each GPU, each taking the next job of the study's round-major order as
it finishes one: a round's configurations run side by side (the pairing within a round still cancels the packing's
contention), and the next round's jobs start as the last round's end, with no barrier.

`lanes_per_gpu`:
- a number N (1 to MOST_LANES): N lanes on each GPU;
- `auto`: 1 where a launch has no more jobs than the host has GPUs or the backend is not CUDA; otherwise a short
  probe (sweeplab.sweep.probe: a few steps of each configuration, alone on the first GPU, in one process, the
  largest first) measures the GPU memory one job holds and the busy share of the largest, and `choose` packs as
  many jobs as keep the GPU busy under BUSY_BUDGET and its memory under MEMORY_SHARE, never more lanes than the
  launch has jobs for; a job that keeps the GPU busy ALONE_BUSY or more runs alone (paGating small at 42 % MFU),
  and the probe stops after it. More lanes than a round has jobs run the next round's jobs beside it: each
  round's jobs still start side by side, in order.

The probe's cost is kept to a share of the study (`probe_steps`): each configuration's probe runs the least of
`probe_steps`, a job's steps and PROBE_SHARE of the steps the study plans for that configuration (its replicates,
or replicates=auto's first rounds, times its steps), but not under MIN_PROBE_STEPS on the share's account; where
even MIN_PROBE_STEPS would be over that share, `auto` runs no probe (one job per GPU: the study is too short for
packing to pay), while a fixed N still probes (its packing check needs each configuration's time alone).

The probe's step time of each configuration alone is recorded on every packed job's run (tag `solo_step_time_s`,
with `lanes_per_gpu`), so the study's packing check (study/caveats.py) can tell whether packing slowed one
configuration more than another: the ratio the verdict reads.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sweeplab.core.channels import CUDA_VISIBLE_DEVICES_ENV, LANES_PER_GPU_ENV, SOLO_STEP_TIME_ENV
from sweeplab.core.errors import ConfigError

log = logging.getLogger(__name__)

AUTO = "auto"
LAUNCHER_KEYS = ("lanes_per_gpu", "probe_steps")  # the lanes launcher's own options, not joblib's
MOST_LANES = 8  # 8 TextBridge jobs on one H200 were no faster than 4 (issue 62)
BUSY_BUDGET = 0.8  # the packed GPU's busy share aimed at: 4 default TextBridge jobs kept an H200's SMs 79 % busy
ALONE_BUSY = 0.5  # a job that keeps the GPU this busy alone runs alone: a second one would only wait for it
# The margin on memory, the one place it is stated: of the GPU's memory the packed jobs may hold, each counted at
# its probe's reading (the allocator's peak reserve in a fresh process plus the CUDA context); the rest is for
# batches and validation shapes a probe's few steps did not meet, fragmentation and other processes
MEMORY_SHARE = 0.85
# A probe's steps per configuration, at most this share of the steps the study plans for it: the 100-step default
# study (5 replicates) probed 100 steps of each of its 4 configurations, a fifth of its training steps, before its
# first job (BENCHMARKS.md, "Jobs side by side on one GPU"); the 1,000-step study's 100 were 2 %
PROBE_SHARE = 0.1
MIN_PROBE_STEPS = 20  # timing.warmup_steps (5) plus 15 timed steps for a median step time: fewer measure nothing
PROBE_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Probe:
    """What the probe measured on one GPU: each configuration's step time alone (s, by configuration index; only
    the largest where it filled the GPU), the largest GPU memory one job held (MB, its CUDA context included) and
    GPU busy share (0-1) of any configuration (None: not measured), and the GPU's memory (MB)."""

    step_time_s: Mapping[int, float] = field(default_factory=dict)
    memory_mb: float | None = None
    busy: float | None = None
    gpu_memory_mb: float | None = None
    seconds: float = 0.0  # the probe's own wall time
    context_mb: float | None = None  # of memory_mb, the CUDA context's and libraries' (None: not measured)

    @staticmethod
    def from_json(text: str) -> Probe:
        data = json.loads(text)
        return Probe({int(k): float(v) for k, v in data.get("step_time_s", {}).items()}, data.get("memory_mb"),
                     data.get("busy"), data.get("gpu_memory_mb"), float(data.get("seconds", 0.0)),
                     data.get("context_mb"))

    def to_json(self) -> str:
        return json.dumps({"step_time_s": {str(k): v for k, v in self.step_time_s.items()},
                           "memory_mb": self.memory_mb, "busy": self.busy, "gpu_memory_mb": self.gpu_memory_mb,
                           "seconds": self.seconds, "context_mb": self.context_mb})

    def with_seconds(self, seconds: float) -> Probe:
        return replace(self, seconds=seconds)

    def describe(self) -> str:
        memory = f"probe {self.memory_mb / 1000:.1f} GB" if self.memory_mb is not None else "probe memory unknown"
        busy = f"GPU busy {self.busy:.0%}" if self.busy is not None else "GPU busy unknown"
        return f"{memory}, {busy}"


@dataclass(frozen=True)
class LanesChoice:
    """How many jobs run side by side on each of `gpus` GPU slots, and why (the choice's one line)."""

    lanes_per_gpu: int
    gpus: int
    why: str
    probe: Probe | None = None

    def line(self) -> str:
        jobs = "1 job at a time" if self.lanes_per_gpu == 1 else f"{self.lanes_per_gpu} jobs side by side"
        return f"{jobs} on each of {self.gpus} GPU{'s' if self.gpus != 1 else ''}: {self.why}"

    def job_overrides(self, config_index: int) -> tuple[str, ...]:
        """`hydra.job.env_set` overrides telling a job how it was packed (training.run_tags records them)."""
        values: dict[str, Any] = {LANES_PER_GPU_ENV: self.lanes_per_gpu}
        solo = self.probe.step_time_s.get(config_index) if self.probe is not None else None
        if solo is not None:
            values[SOLO_STEP_TIME_ENV] = f"{solo:.6g}"
        return tuple(f"hydra.job.env_set.{name}={value}" for name, value in values.items())


def setting(value: Any) -> int | str:
    """`lanes_per_gpu` checked: `auto` or a whole number in [1, MOST_LANES]; one line naming the key otherwise."""
    if value == AUTO:
        return AUTO
    if type(value) is not int or not 1 <= value <= MOST_LANES:
        raise ConfigError("hydra.launcher.lanes_per_gpu", f"expected auto or an integer in [1, {MOST_LANES}], got "
                                                          f"{value!r}")
    return value


def most_lanes(launch_size: int, gpus: int) -> int:
    """No more lanes than a launch has jobs for every one of them (at most MOST_LANES a GPU)."""
    return max(1, min(MOST_LANES, launch_size // max(1, gpus)))


def choose(probe: Probe, gpus: int, launch_size: int) -> LanesChoice:
    """lanes_per_gpu=auto from the probe: as many jobs as keep the GPU busy under BUSY_BUDGET and its memory under
    MEMORY_SHARE, no more lanes than the launch (`launch_size` jobs: the study, or a round of replicates=auto) has
    jobs for; one where a job alone keeps the GPU ALONE_BUSY busy (or how busy is unknown)."""
    measured = probe.describe()
    if probe.busy is None:
        return LanesChoice(1, gpus, f"{measured} (not packed without a measure of how busy a job keeps the GPU)",
                           probe)
    if probe.busy >= ALONE_BUSY:
        return LanesChoice(1, gpus, f"{measured}: one job fills it", probe)
    limits = {"jobs": most_lanes(launch_size, gpus), "busy": max(1, math.floor(BUSY_BUDGET / max(probe.busy, 1e-3)))}
    if probe.memory_mb and probe.gpu_memory_mb:
        limits["memory"] = max(1, math.floor(MEMORY_SHARE * probe.gpu_memory_mb / probe.memory_mb))
    lanes = min(limits.values())
    bound = min(limits, key=limits.get)
    why = {"jobs": "the study's jobs", "busy": "the busy share", "memory": "the GPU's memory"}[bound]
    return LanesChoice(lanes, gpus, f"{measured} (as many as {why} allow)", probe)


def resolved_lanes(options: Mapping[str, Any]) -> int:
    """The lanes per GPU a launch runs (the sweeper resolved `auto` before the launch; 1 when never resolved)."""
    value = options.get("lanes_per_gpu", 1)
    return value if type(value) is int and value >= 1 else 1


def largest_first(grid: Sequence[Sequence[str]]) -> list[int]:
    """The configurations' indices, the one that likely needs the most of a GPU first (the largest batch size
    among its overrides: the probe's first and maybe only measurement), the rest as listed."""
    def size(index: int) -> float:
        values = [o.partition("=")[2] for o in grid[index] if "batch_size=" in o]
        return max((float(v) for v in values if v.replace(".", "", 1).isdigit()), default=0.0)

    largest = max(range(len(grid)), key=lambda i: (size(i), -i), default=0)
    return [largest, *(i for i in range(len(grid)) if i != largest)]


def probe_steps(asked: int, job_steps: int | None, replicates: int) -> int:
    """Steps of each configuration the probe runs: the least of `asked` (probe_steps), a job's steps and
    PROBE_SHARE of a configuration's planned steps (`replicates` x `job_steps`), the share never cutting it under
    MIN_PROBE_STEPS. `job_steps` None: not bounded by steps (an epoch-bounded study)."""
    if job_steps is None:
        return asked
    return min(asked, job_steps, max(MIN_PROBE_STEPS, math.floor(PROBE_SHARE * max(1, replicates) * job_steps)))


def probe_pays(job_steps: int | None, replicates: int) -> bool:
    """Whether a probe's least measurement (MIN_PROBE_STEPS a configuration) stays within PROBE_SHARE of the steps
    the study plans for each configuration; where not, lanes_per_gpu=auto runs no probe and no packing."""
    return job_steps is None or PROBE_SHARE * max(1, replicates) * job_steps >= MIN_PROBE_STEPS


def _job_steps(config: Any, grid: Sequence[Sequence[str]]) -> int | None:
    """The fewest trainer.max_steps of the study's configurations (the grid's own where it sweeps it); None where
    a configuration is not bounded by steps."""
    from omegaconf import OmegaConf

    base = OmegaConf.select(config, "trainer.max_steps", default=None)
    values = [dict(o.lstrip("+").split("=", 1) for o in overrides if "=" in o).get("trainer.max_steps", base)
              for overrides in grid or [[]]]
    try:
        steps = [int(value) for value in values]
    except (TypeError, ValueError):
        return None
    return min(steps) if min(steps) > 0 else None


def _planned_replicates(config: Any) -> int:
    """The rounds the study surely runs: `replicates`, or replicates=auto's first rounds."""
    from sweeplab.study import replicates

    return replicates.auto_setting(config).first if replicates.is_auto(config) else replicates.replicates_setting(config)


def plan_lanes(config: Any, grid: Sequence[Sequence[str]], launch_size: int, gpus: int,
               run_probe=None) -> LanesChoice | None:
    """The study's lanes per GPU (None: the launcher runs no lanes). `launch_size`: the most jobs one launch holds
    (the whole study, or a round where replicates=auto or stop.behind launch round by round); `gpus`: the host's
    GPU slots; `run_probe(grid, order, steps, config)`: the probe (default: sweeplab.sweep.probe in the process
    started with the sweep, or one of its own, on the first GPU)."""
    try:
        return _plan_lanes(config, grid, launch_size, gpus, run_probe)
    finally:
        _close_early_probe()  # a probe process started with the sweep and not asked is not left waiting


def _plan_lanes(config: Any, grid: Sequence[Sequence[str]], launch_size: int, gpus: int,
                run_probe) -> LanesChoice | None:
    from omegaconf import OmegaConf

    launcher = OmegaConf.select(config, "hydra.launcher")
    if launcher is None or "lanes_per_gpu" not in launcher:
        return None
    value = setting(launcher.lanes_per_gpu)
    backend = OmegaConf.select(config, "backend.name", default="cpu")
    if value == 1:
        return LanesChoice(1, gpus, "lanes_per_gpu=1")
    if value == AUTO and backend != "cuda":
        return LanesChoice(1, gpus, f"lanes_per_gpu=auto packs CUDA jobs only (backend={backend})")
    if value == AUTO and launch_size <= gpus:
        return LanesChoice(1, gpus, f"{launch_size} jobs at a time fit the {gpus} GPU slots")
    job_steps, rounds = _job_steps(config, grid), _planned_replicates(config)
    if value == AUTO and not probe_pays(job_steps, rounds):
        return LanesChoice(1, gpus, f"too short for a probe to pay ({rounds} x {job_steps} steps a configuration: "
                                    f"{MIN_PROBE_STEPS} steps of probe would be over {PROBE_SHARE:.0%} of it)")
    steps = probe_steps(int(launcher.get("probe_steps") or 100), job_steps, rounds)
    probe = (run_probe or _probe_process)(grid, largest_first(grid), steps, config)
    log.info("the lanes' probe: %d of %d configurations alone, %d steps each, in %.1f s", len(probe.step_time_s),
             len(grid), steps, probe.seconds)
    if value == AUTO:
        return choose(probe, gpus, launch_size)
    return LanesChoice(value, gpus, f"lanes_per_gpu={value}; {probe.describe()}", probe)


class ProbeProcess:
    """sweeplab.sweep.probe in a process of its own on the first visible GPU (the main process never starts CUDA),
    in the sweep's working directory, as its jobs (relative paths in the config, data/, mean the same). Started
    with the sweep where it will likely probe (start_probe_early), it imports what a job imports meanwhile and waits
    for its request; `close` sends none."""

    def __init__(self):
        from sweeplab.runtime import distributed

        gpus = distributed.visible_gpus()
        env = dict(os.environ, **({CUDA_VISIBLE_DEVICES_ENV: gpus[0]} if gpus else {}))
        self.started = time.monotonic()
        self.process = subprocess.Popen([sys.executable, "-m", "sweeplab.sweep.probe"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    def run(self, grid: Sequence[Sequence[str]], order: Sequence[int], steps: int, sweep_dir: Path) -> Probe:
        """The probe's measurements; an empty Probe (the lanes then stay at one per GPU) where it fails, with the
        reason logged."""
        with tempfile.TemporaryDirectory(prefix=".probe-", dir=sweep_dir) as folder:
            out = Path(folder) / "probe.json"
            request = {"out": str(out), "steps": steps, "sweep_dir": str(sweep_dir), "grid": [list(o) for o in grid],
                       "order": list(order), "alone_busy": ALONE_BUSY}
            try:
                _, stderr = self.process.communicate(json.dumps(request) + "\n", timeout=PROBE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.communicate()
                log.warning("the lanes' probe took over %.0f s; one job per GPU", PROBE_TIMEOUT_S)
                return Probe()
            if self.process.returncode != 0 or not out.is_file():
                log.warning("the lanes' probe failed (exit %d); one job per GPU: %s", self.process.returncode,
                            (stderr.strip().splitlines() or ["no output"])[-1])
                return Probe()
            return Probe.from_json(out.read_text())

    def close(self) -> None:
        """No request: the process ends now (until its request it only imports: nothing of it is left behind)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate()


_early_probe: ProbeProcess | None = None


def start_probe_early(config: Any) -> ProbeProcess | None:
    """Start the probe's process with the sweep (the lanes' warm-up callback), where plan_lanes will likely run a
    probe: its imports then run beside the main's start-up. plan_lanes takes it, or closes it where it probes
    nothing (a round that fits the GPU slots, a study too short); so does the main's exit."""
    global _early_probe
    from omegaconf import OmegaConf

    from sweeplab.study.rounds import sweeper_class

    lanes = OmegaConf.select(config, "hydra.launcher.lanes_per_gpu", default=1)
    auto_on_cuda = lanes == AUTO and OmegaConf.select(config, "backend.name", default="cpu") == "cuda"
    if _early_probe is not None or not (auto_on_cuda or (lanes != AUTO and lanes != 1)):
        return _early_probe
    if not getattr(sweeper_class(config), "plans_lanes", False):  # a sweeper that runs no probe (the search)
        return None
    try:
        if lanes == AUTO and not probe_pays(_job_steps(config, []), _planned_replicates(config)):
            return None
    except ConfigError:  # a wrong replicates setting: the study's checks name it
        return None
    _early_probe = ProbeProcess()
    atexit.register(_close_early_probe)
    return _early_probe


def _close_early_probe() -> None:
    global _early_probe
    probe, _early_probe = _early_probe, None
    if probe is not None:
        probe.close()


def _probe_process(grid: Sequence[Sequence[str]], order: Sequence[int], steps: int, config: Any) -> Probe:
    """The probe: in the process started with the sweep where there is one, else in one started now."""
    global _early_probe
    sweep_dir = Path(str(config.hydra.sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    early, _early_probe = _early_probe, None
    if early is not None:
        log.info("the lanes' probe process started with the sweep, %.1f s before its request",
                 time.monotonic() - early.started)
    return (early or ProbeProcess()).run(grid, order, steps, sweep_dir)
