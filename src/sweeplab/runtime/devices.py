"""Facts about the machine a job runs on: the device's name, its peak FLOP/s and memory, waiting for its queued work,
the timeline a timer reads, and the host's CPUs and load. `backends` decides what runs where; this module describes
what is there.

Lightning's `ThroughputMonitor` peak-FLOPs table parses "NVIDIA H200" to nothing and lists Hopper figures with 2:4
sparsity for some boards. We reuse its table (`get_available_flops`) for every other GPU and keep dense Hopper
figures here.
"""

from __future__ import annotations

import gc
import os
import re
import resource
import sys
import time

import torch

from sweeplab.core import interrupts
from sweeplab.core.stability import deciles
from sweeplab.runtime.backends import import_mlx

PRECISION_DTYPES = {
    "32-true": torch.float32,
    "32": torch.float32,
    "bf16-mixed": torch.bfloat16,
    "bf16-true": torch.bfloat16,
    "16-mixed": torch.float16,
    "16-true": torch.float16,
}

# Dense (no 2:4 sparsity) tensor-core peaks, FLOP/s, from NVIDIA's H100/H200 datasheets. Lightning's table has the
# sparse figure for "h200 sxm1"/"h100 nvl" and cannot parse the plain "NVIDIA H200" that H200 SXM boards report.
# The H200 is the H100 SXM's die with more memory: same compute.
_HOPPER_DENSE = {
    "h100 sxm": {torch.float32: 66.9e12, "tfloat32": 494.7e12, torch.bfloat16: 989.4e12, torch.float16: 989.4e12},
    "h100 pcie": {torch.float32: 51.2e12, "tfloat32": 378e12, torch.bfloat16: 756e12, torch.float16: 756e12},
    "h100 nvl": {torch.float32: 60e12, "tfloat32": 417.5e12, torch.bfloat16: 835.5e12, torch.float16: 835.5e12},
    "h200 sxm": {torch.float32: 66.9e12, "tfloat32": 494.7e12, torch.bfloat16: 989.4e12, torch.float16: 989.4e12},
    "h200 nvl": {torch.float32: 60e12, "tfloat32": 417.5e12, torch.bfloat16: 835.5e12, torch.float16: 835.5e12},
}


# Apple GPUs, FP32 FLOP/s: ESTIMATES, not Apple's figures (Apple publishes no GPU FLOP/s for these chips), each
# computed as GPU cores x 128 ALUs x 2 (a fused multiply-add) x the GPU clock, from the clocks and shader counts
# (cores x 128) of hmc-tech.com's GPU database (https://hmc-tech.com/gpu/, pages such as apple-10-core-m4-fl-vs-...,
# apple-32-core-m4-max-vs-apple-40-core-m3-max, apple-20-core-m4-pro-vs-...; read 2026). FP16 and BF16 are taken at
# the FP32 rate (no faster half-precision path on these GPUs in those figures). Keyed by (chip, GPU cores): an
# M4 Max has 32 or 40.
_APPLE_GPU_CLOCK_GHZ = {  # chip -> (GPU clock in GHz, GPU core counts sold)
    "M1 Max": (1.296, (24, 32)),
    "M3 Pro": (1.398, (14, 18)),
    "M3 Max": (1.398, (30, 40)),
    "M4": (1.470, (8, 10)),
    "M4 Pro": (1.470, (16, 20)),
    "M4 Max": (1.678, (32, 40)),
}
APPLE_GPU_FLOPS_ESTIMATE = {
    (chip, cores): cores * 128 * 2 * ghz * 1e9
    for chip, (ghz, core_counts) in _APPLE_GPU_CLOCK_GHZ.items()
    for cores in core_counts
}


def apple_gpu(device_name: str) -> tuple[str, int] | None:
    """The `APPLE_GPU_FLOPS_ESTIMATE` key of an MPS device name ("Apple M4 Max (40-core GPU)" -> ("M4 Max", 40)), or
    None for a chip or core count the table does not hold."""
    match = re.search(r"\b(M\d+(?: Pro| Max| Ultra)?)\b.*?\((\d+)-core GPU\)", device_name)
    if match is None:
        return None
    key = (match.group(1), int(match.group(2)))
    return key if key in APPLE_GPU_FLOPS_ESTIMATE else None


def apple_gpu_peak(device_name: str) -> float | None:
    """The estimated peak FLOP/s (`APPLE_GPU_FLOPS_ESTIMATE`) of an Apple GPU by its device name, the same at every
    precision; None for a name the table does not hold."""
    chip = apple_gpu(device_name)
    return APPLE_GPU_FLOPS_ESTIMATE[chip] if chip is not None else None


def _mps_device_name() -> str:
    """The Metal device's name and GPU core count, as torch reports them ("Apple M4 Max (40-core GPU)")."""
    try:
        return f"{torch.backends.mps.get_name()} ({torch.backends.mps.get_core_count()}-core GPU)"
    except (AttributeError, RuntimeError):  # a torch without these, or no Metal device
        return "Apple MPS"


def mlx_gpu_name() -> str | None:
    """The Apple GPU MLX runs on, or None where it runs on the CPU. MLX's `device_info` names the chip but not its GPU
    core count, which the peak table needs; torch reads both from the same Metal device ("Apple M4 Max (40-core
    GPU)"), so its name is used where torch has one, else MLX's ("Apple M4 Max": no peak, so no MFU)."""
    mx = import_mlx()
    if mx.default_device().type != mx.gpu:
        return None
    name = _mps_device_name()
    return name if apple_gpu(name) is not None else str(mx.device_info().get("device_name", "Apple GPU"))


def device_name(backend: str) -> str:
    if backend == "mlx":
        gpu = mlx_gpu_name()
        return f"MLX gpu ({gpu})" if gpu is not None else f"MLX cpu ({device_name('cpu')})"
    if backend == "cuda":
        return torch.cuda.get_device_name()
    if backend == "mps":
        return _mps_device_name()
    import platform

    try:  # Linux: the CPU's marketing name says more than "x86_64"
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def non_blocking_copy(source: torch.Tensor, target: torch.device | str) -> bool:
    """Whether copying `source` to `target` may be non-blocking: only to CUDA, from host memory or CUDA memory.

    To CUDA the copy is safe whatever happens to `source` after the call: from pinned host memory torch's pinned
    allocator keeps the block until the copy has run (it records the stream's event on it), from pageable host
    memory CUDA stages the data before the call returns, and CUDA-to-CUDA copies are ordered on the stream. Nothing
    keeps the source alive for a non-blocking copy to MPS: a temporary freed when the caller returns is read later,
    silently corrupting the batch (pytorch#189690, #139550). Every other target blocks too (no such guarantee known).
    """
    return torch.device(target).type == "cuda" and source.device.type in ("cpu", "cuda")


def to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`tensor` on `device`, non-blocking only where that is safe (`non_blocking_copy`)."""
    return tensor.to(device, non_blocking=non_blocking_copy(tensor, device))


def copy_into(target: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """`target.copy_(source)`, non-blocking only where that is safe (`non_blocking_copy`)."""
    return target.copy_(source, non_blocking=non_blocking_copy(source, target.device))


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA or MPS); nothing to wait for on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


class HostTimeline:
    """Timestamps on the host's clock, each taken after waiting for the device's queued work (`sync`): right on the
    CPU, where nothing is queued, on MPS (`torch.mps.synchronize`: see `timeline`) and on MLX (`mx.synchronize`). On
    an asynchronous device every mark drains its queue, so the device idles until the host has launched the next
    work: see DeviceTimeline."""

    clock = "host"  # the run's `timing.clock` tag

    def __init__(self, device: torch.device, sync=None, clock=time.perf_counter):
        self.device = device
        self._sync = sync or synchronize
        self._clock = clock

    def mark(self) -> float:
        self._sync(self.device)
        return self._clock()

    def seconds(self, start: float, end: float) -> float:
        return end - start


class DeviceTimeline:
    """Timestamps on a CUDA device's own timeline: a mark is an event recorded in the device's queue, which the
    device stamps when it reaches it; recording costs the host microseconds and waits for nothing. The time between
    two marks is what the device took to get from one to the other, idle gaps included (a host too slow to keep it
    fed, data loading), so it is the wall time of that stretch of training, measured without draining the queue.
    Reading it (`seconds`) waits until the device reached the later mark: read a mark once newer work is queued
    behind it, and the device never idles for the measurement.

    With a sync at each window edge instead, an H100 replaying TextBridge's bs32 CUDA graph idled after every window
    until the host had launched the next batch: 16,000 samples/s timed in windows of 20 steps, 20,150 in one window
    (BENCHMARKS.md). CUDA only: MPS events give none of this (`timeline`)."""

    clock = "device"  # the run's `timing.clock` tag

    def __init__(self, device: torch.device):
        if device.type != "cuda":
            raise ValueError(f"DeviceTimeline times CUDA events; {device} times on the host clock (devices.timeline)")
        self.device = device

    def mark(self):  # on the stream training launches to (the device's current one)
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def seconds(self, start, end) -> float:
        end.synchronize()
        return start.elapsed_time(end) / 1000.0


def timeline(device: torch.device) -> HostTimeline | DeviceTimeline:
    """CUDA: the device's own timeline (timed events), tried once before it is used, so a build without CUDA events
    times on the host clock, synchronising at each mark, rather than fail mid-run. Every other device: the host
    clock after a device sync at each mark (the window edges), MPS included, always.

    MPS, from torch's aten/src/ATen/mps/MPSEvent.mm: a timed MPS event's time is a host timestamp taken by a
    listener thread once the GPU has signalled it, and `elapsed_time` commits and waits for the whole queue
    (MPSEventPool::elapsedTime), so MPS events neither time on the device nor leave its queue full: a host clock
    read after `torch.mps.synchronize()` measures the same wall time without their hazards. Those hazards:
    `end.synchronize()` before `elapsed_time` can wait forever (pytorch#162872: both wait on one completion flag,
    which the first wait consumes), and two marks in a row can raise (pytorch#196395: `elapsed_time` requires the
    end's timestamp to be later than the start's), so a try-out made the clock a matter of chance."""
    if device.type != "cuda":
        return HostTimeline(device)
    events = DeviceTimeline(device)
    try:
        events.seconds(events.mark(), events.mark())
    except (RuntimeError, TypeError, AttributeError) as exc:
        import logging

        logging.getLogger(__name__).warning("timing on the host clock: %s has no timed events (%s)", device, exc)
        return HostTimeline(device)
    return events


def load_average() -> float | None:
    """The host's 1-minute load average (runnable threads, ours included), where the OS reports one."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows
        return None


def host_speed_spread(seconds: float, slice_s: float = 0.01) -> float | None:
    """How steady the host's single-thread speed is right now: a pure-Python counting loop run for `seconds` in
    slices of `slice_s`, each slice's count rate compared: (p90 - p10) / median, as a run's step-time spread is
    read. A host-bound job is made of such Python; where this spread is large, so is that job's, whatever
    sweeplab does. Load average and steal time can both read idle while it is large: on the H100 VM the load was
    0.8 of 16 CPUs and steal 0.01 %, yet 50 ms slices ran at 0.67-1.42 times the median speed (p10-p90; the 2-core
    development VM: 0.98-1.10). None when `seconds` leaves fewer than 5 slices."""
    rates, end = [], time.perf_counter() + seconds
    while True:
        interrupts.check()  # a safe point every slice: a stop requested while the probe runs ends it at once
        start = now = time.perf_counter()
        if now >= end:
            break
        count = 0
        while now - start < slice_s:
            for _ in range(200):
                count += 1
            now = time.perf_counter()
        rates.append(count / (now - start))
    if len(rates) < 5:
        return None
    p10, median, p90 = deciles(rates)
    return (p90 - p10) / median


def host_cpus() -> int:
    """CPUs this process may run on (its affinity mask: a container's or taskset's share, not the whole host)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def hopper_chip(device_name: str) -> str | None:
    """The `_HOPPER_DENSE` key of a CUDA device name ("NVIDIA H100 80GB HBM3" -> "h100 sxm"), else None."""
    name = device_name.lower()
    if "h200" in name:
        return "h200 nvl" if "nvl" in name else "h200 sxm"
    if "h100" in name:
        if "nvl" in name:
            return "h100 nvl"
        if "pcie" in name or "hbm2e" in name:
            return "h100 pcie"
        return "h100 sxm"
    return None


def peak_flops(device: torch.device, precision: str, device_name: str | None = None) -> float | None:
    """Theoretical dense peak FLOP/s of the device at this precision, where known: CUDA, and MPS from the estimated
    `APPLE_GPU_FLOPS_ESTIMATE` (the same figure at every precision)."""
    if device.type == "mps":
        return apple_gpu_peak(device_name if device_name is not None else _mps_device_name())
    if device.type != "cuda":
        return None
    dtype = PRECISION_DTYPES.get(str(precision), torch.float32)
    name = device_name if device_name is not None else torch.cuda.get_device_name(device)
    chip = hopper_chip(name)
    if chip is not None:
        if dtype is torch.float32 and torch.get_float32_matmul_precision() != "highest":
            dtype = "tfloat32"
        return _HOPPER_DENSE[chip].get(dtype)
    from lightning.fabric.utilities.throughput import get_available_flops

    flops = get_available_flops(device, dtype)
    return float(flops) if flops else None


def peak_memory_mb(device: torch.device) -> float:
    """CUDA: the caching allocator's peak of tensor memory since `reset_peak_memory`. MPS: torch keeps no peak, so
    this is what the Metal driver has allocated for the process at the call (`torch.mps.driver_allocated_memory`:
    live tensors, the blocks the MPS allocator keeps cached after tensors are freed, and MPS/MPSGraph's own), which
    the timer reads at every window edge and keeps the largest of; the cached blocks make it at least the tensors'
    high-water mark since the job emptied the cache (`release_earlier_jobs`), as long as the allocator kept them, so
    it reads higher than CUDA's figure for the same job. CPU: the process's peak RSS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    if device.type == "mps":
        return torch.mps.driver_allocated_memory() / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10  # bytes on macOS, KiB on Linux


def mps_driver_mb() -> float:
    """What the Metal driver has allocated for this process, MiB (`torch.mps.driver_allocated_memory`): the MPS
    allocator's heaps and MPS/MPSGraph's own buffers, the compiled-graph cache among them (torch 2.13 exposes no
    count of cached graphs; the cache grows with every new (op, dtype, shape), pytorch#77753, and shows here)."""
    return torch.mps.driver_allocated_memory() / 2**20


class TorchMemory:
    """A torch device's memory as the timer reads it: `reset` and `peak_mb` (peak_memory_mb), and `driver_mb`, read
    at the edges of every timed stretch to see growth inside them: MPS only (None elsewhere)."""

    def __init__(self, device: torch.device):
        self.device = device

    def reset(self) -> None:
        reset_peak_memory(self.device)

    def peak_mb(self) -> float:
        return peak_memory_mb(self.device)

    def driver_mb(self) -> float | None:
        return mps_driver_mb() if self.device.type == "mps" else None


class MlxMemory:
    """MLX's memory: on the GPU, MLX's own peak of what its allocator holds (`mx.get_peak_memory`, reset when timing
    starts); on the CPU, or an MLX without it, the process's peak RSS, as a CPU job reports."""

    def __init__(self, on_gpu: bool):
        mx = import_mlx()
        self._peak = getattr(mx, "get_peak_memory", None) if on_gpu else None
        self._reset = getattr(mx, "reset_peak_memory", None) if on_gpu else None

    def reset(self) -> None:
        if self._reset is not None:
            self._reset()

    def peak_mb(self) -> float:
        return self._peak() / 2**20 if self._peak is not None else peak_memory_mb(torch.device("cpu"))

    def driver_mb(self) -> float | None:
        return None


def release_earlier_jobs() -> None:
    """Start a job with the memory state of a process's first: collect the garbage earlier jobs of this process
    left (a Lightning trainer holds reference cycles, collected otherwise whenever the collector next runs, possibly
    inside this job's timed steps), freeze what survives (imports, caches, whatever earlier jobs keep alive), so that
    the collector's passes during this job scan only this job's objects (a full pass over the ~560k objects of the
    imported libraries takes 0.2 s on the 2-core development VM, a stall inside a timed step, and grows with
    whatever earlier jobs left), and hand the device allocator's cached blocks back to the driver (after a larger job
    its blocks stay cached and a smaller job's tensors would be carved from them)."""
    gc.collect()
    gc.freeze()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    if torch.backends.mps.is_available():
        torch.mps.empty_cache()


def cuda_if_available():
    """torch.cuda, whose caching allocator's counters the lanes' probe reads (sweeplab.sweep.probe); None without
    CUDA."""
    return torch.cuda if torch.cuda.is_available() else None


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
