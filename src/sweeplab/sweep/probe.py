"""The lanes launcher's probe (sweeplab.sweep.packing): a few steps of each configuration of a study, alone on one
GPU, in one process, the largest first.

    python -m sweeplab.sweep.probe    # then one line on stdin:
    {"out": "OUT.json", "steps": STEPS, "sweep_dir": "...", "grid": [[overrides], ...], "order": [...],
     "alone_busy": 0.5}

The process starts with the sweep (packing.start_probe_early, from the lanes' warm-up callback): it reads what the
GPU holds before it starts CUDA and imports what a job imports while the sweep's main process starts, then waits
for its request, which the sweeper sends once it knows its grid; stdin closed with no request: it exits, having
done nothing. Run in the sweep's working directory (relative paths in the config mean what they mean to its jobs);
each configuration's output folder is beside OUT.json. Each configuration trains STEPS steps untracked
(logger=none, one validation batch, no stop rule), sharing the study's compile cache (what it compiles the study's
jobs load).

How busy a configuration keeps the GPU comes from `nvidia-smi`, sampled every 100 ms: the median of the utilisation
samples during its timed steps (the fit's wall-clock parts, sweeplab.core.wall, say when they ran; where fewer than
MIN_STEP_SAMPLES fell there, the upper quartile of those during its whole fit, whose set-up is idle).

What one job of a configuration holds on the GPU comes from torch in this process (CudaMemory): the caching
allocator's peak reserve during its fit (reserved, not allocated: a lane's process keeps its reserve), the cache of
the configuration before handed back first (else its blocks count again), plus the CUDA context and the libraries'
own memory, which no allocator counts: what `nvidia-smi` shows the GPU hold above its start, less torch's reserve,
read once after the first configuration (its kernels, cuBLAS and cuDNN loaded). The margin for what a probe's few
steps did not meet is packing.MEMORY_SHARE.

Where the first (largest) configuration alone keeps the GPU `alone_busy` busy, the others are not measured: the
study is not packed. Writes packing.Probe's JSON to OUT.json.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sweeplab.core.records import JOB
from sweeplab.sweep.packing import Probe

SAMPLE_MS = 100
MIN_STEP_SAMPLES = 5  # samples within the timed steps that make their median the busy share
SETTLE_S = 3 * SAMPLE_MS / 1000  # a few of nvidia-smi's samples: what the GPU holds once nothing changes it


def probe_overrides(steps: int) -> list[str]:
    """What makes a study's job a probe: short, untracked, one validation batch, no stop rule, no checkpoint timer."""
    return [f"trainer.max_steps={steps}", f"trainer.val_check_interval={steps}", "trainer.limit_val_batches=1",
            "logger=none", "stop.at_target=false", "stop.behind=null", "stop.patience=null",
            "checkpoint.every_n_seconds=null", "replicates=1", "tune.batch_size=false"]


class GpuSampler:
    """`nvidia-smi` sampling one GPU's utilisation (0-1) and memory used (MB) every SAMPLE_MS, timestamped."""

    def __init__(self, gpu: str):
        self.samples: list[tuple[float, float, float]] = []
        self.total_mb: float | None = None
        try:
            self._process = subprocess.Popen(
                ["nvidia-smi", "-i", gpu, "--query-gpu=utilization.gpu,memory.used,memory.total",
                 "--format=csv,noheader,nounits", f"-lms={SAMPLE_MS}"], stdout=subprocess.PIPE, text=True)
        except OSError:
            self._process = None
            return
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self._process.stdout:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 3 and all(p.replace(".", "", 1).isdigit() for p in parts):
                self.total_mb = float(parts[2])
                self.samples.append((time.perf_counter(), float(parts[0]) / 100, float(parts[1])))

    def between(self, start: float, end: float) -> list[tuple[float, float, float]]:
        return [s for s in self.samples if start <= s[0] <= end]

    def most_mb(self) -> float | None:
        """The most memory the GPU held in any sample so far (None: nothing sampled)."""
        return max((m for _, _, m in self.samples), default=None)

    def latest_mb(self) -> float | None:
        return self.samples[-1][2] if self.samples else None

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)


class CudaMemory:
    """One configuration's GPU memory as torch in this process reads it. `cuda`: torch.cuda (a test passes a
    pretend one); None where CUDA is not available (nothing is measured)."""

    def __init__(self, cuda: Any = None):
        if cuda is None:
            from sweeplab.runtime import devices  # torch: this process trains (sweeplab.sweep's others never do)

            cuda = devices.cuda_if_available()
        self.cuda = cuda

    def _started(self) -> bool:
        return self.cuda is not None and self.cuda.is_initialized()

    def start(self) -> None:
        """Before a configuration: the configuration before's cached blocks handed back, the peak reset to now."""
        if self._started():
            self.cuda.empty_cache()
            self.cuda.reset_peak_memory_stats()

    def peak_reserved_mb(self) -> float | None:
        """The allocator's peak reserve since `start` (MB; None: CUDA never started)."""
        return self.cuda.max_memory_reserved() / 2**20 if self._started() else None

    def reserved_mb(self) -> float | None:
        return self.cuda.memory_reserved() / 2**20 if self._started() else None


def gpu_memory_used_mb(gpu: str) -> float | None:
    """What the GPU holds now (MB), by one `nvidia-smi` query (None: it cannot say)."""
    try:
        done = subprocess.run(["nvidia-smi", "-i", gpu, "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=30)
        return float(done.stdout.strip().splitlines()[0])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def context_mb(gpu_used_mb: float | None, base_mb: float | None, reserved_mb: float | None) -> float | None:
    """The CUDA context and the libraries' memory: what the GPU holds above its start, less the allocator's reserve
    (None: nvidia-smi or torch could not say)."""
    if gpu_used_mb is None or base_mb is None or reserved_mb is None:
        return None
    return max(0.0, gpu_used_mb - base_mb - reserved_mb)


# fit(index) -> (its summary metrics, its wall-clock parts (sweeplab.core.wall), the perf_counter of its start)
Fit = Callable[[int], tuple[Mapping[str, Any], Mapping[str, float], float]]


def probe_configurations(order: Sequence[int], fit: Fit, sampler: GpuSampler, memory: CudaMemory,
                         alone_busy: float, base_mb: float | None) -> Probe:
    """Fit each configuration in `order` alone and measure it (the module's docstring says how); stops after the
    first where it keeps the GPU `alone_busy` busy. `base_mb`: what the GPU held before this process started CUDA."""
    step_time, busy, reserved = {}, [], []
    context = None
    for position, index in enumerate(order):
        memory.start()
        summary, parts, start = fit(index)
        end = time.perf_counter()
        window = sampler.between(start, end)
        steps_from = start + parts.get("setup", 0.0) + parts.get("warmup", 0.0)
        timed = sampler.between(steps_from, steps_from + parts.get("steps", 0.0))
        if (step := summary.get(JOB.step_time_median)) is not None:
            step_time[index] = float(step)
        if len(timed) >= MIN_STEP_SAMPLES:
            busy.append(statistics.median([u for _, u, _ in timed]))
        elif window:  # too few samples within the steps: the busier quarter of the fit's (its set-up is idle)
            busy.append(statistics.quantiles([u for _, u, _ in window], n=4)[2] if len(window) > 1 else window[0][1])
        if (peak := memory.peak_reserved_mb()) is not None:
            reserved.append(peak)
        if position == 0:
            time.sleep(SETTLE_S)  # nvidia-smi's next samples: the GPU as the fit left it
            context = context_mb(sampler.latest_mb(), base_mb, memory.reserved_mb())
        if position == 0 and busy and busy[0] >= alone_busy:
            break  # the largest fills the GPU alone: the study is not packed, nothing else to measure
    job_mb = max(reserved) + (context or 0.0) if reserved else None
    return Probe(step_time, job_mb, max(busy, default=None), sampler.total_mb, context_mb=context)


def main() -> int:
    import json
    import os

    gpu = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
    base = gpu_memory_used_mb(gpu)  # what the GPU holds before this process starts CUDA
    from sweeplab.core import cli, wall  # while the sweep's main process starts: what a job imports
    from sweeplab.engine import training

    line = sys.stdin.readline()
    if not line.strip():
        return 0  # the sweep runs no probe
    request = json.loads(line)
    waited = time.perf_counter()
    out, steps, sweep_dir = Path(request["out"]), int(request["steps"]), request["sweep_dir"]

    def fit(index: int) -> tuple[Mapping[str, Any], Mapping[str, float], float]:
        cfg = cli.compose("train", [*request["grid"][index], *probe_overrides(steps)])
        training.share_compile_cache(sweep_dir, cfg.get("compile_cache", "study"))
        clock = wall.start_job()  # the fit's parts: where its timed steps lie in time
        start = time.perf_counter()
        summary = training.measure(cfg, out.parent / f"config{index}")
        return summary, clock.totals(), start

    sampler = GpuSampler(gpu)  # only now: a probe process killed while it waits leaves no nvidia-smi behind
    try:
        probe = probe_configurations(request["order"], fit, sampler, CudaMemory(), request.get("alone_busy", 0.5),
                                     base)
    finally:
        sampler.stop()
    # what the sweep waits for: from the request on (the start before it ran beside the sweep's main process)
    probe = probe.with_seconds(time.perf_counter() - waited)
    out.write_text(probe.to_json())
    print(probe.to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
