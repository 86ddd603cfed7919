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
import resource
import sys
import time

import torch

from sweeplab.stability import deciles

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


def device_name(backend: str) -> str:
    if backend == "mlx":
        from sweeplab.backends import import_mlx

        mx = import_mlx()
        if mx.default_device().type == mx.gpu:
            return f"MLX gpu ({mx.device_info().get('device_name', 'Apple GPU')})"
        return f"MLX cpu ({device_name('cpu')})"
    if backend == "cuda":
        return torch.cuda.get_device_name()
    if backend == "mps":
        return "Apple MPS"
    import platform

    try:  # Linux: the CPU's marketing name says more than "x86_64"
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA or MPS); nothing to wait for on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


class HostTimeline:
    """Timestamps on the host's clock, each taken after waiting for the device's queued work (`sync`): right on the
    CPU, where nothing is queued, and on MLX (`mx.synchronize`). On an asynchronous device every mark drains its
    queue, so the device idles until the host has launched the next work: see DeviceTimeline."""

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
    """Timestamps on the device's own timeline (CUDA, MPS): a mark is an event recorded in the device's queue, which
    the device stamps when it reaches it; recording costs the host microseconds and waits for nothing. The time
    between two marks is what the device took to get from one to the other, idle gaps included (a host too slow to
    keep it fed, data loading), so it is the wall time of that stretch of training, measured without draining the
    queue. Reading it (`seconds`) waits until the device reached the later mark: read a mark once newer work is
    queued behind it, and the device never idles for the measurement.

    With a sync at each window edge instead, an H100 replaying TextBridge's bs32 CUDA graph idled after every window
    until the host had launched the next batch: 16,000 samples/s timed in windows of 20 steps, 20,150 in one window
    (BENCHMARKS.md)."""

    def __init__(self, device: torch.device):
        self.device = device

    def mark(self):
        if self.device.type == "cuda":  # on the stream training launches to (the device's current one)
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
        else:  # MPS: its own event class (torch >= 2.1), recorded in the default stream
            event = torch.mps.event.Event(enable_timing=True)
            event.record()
        return event

    def seconds(self, start, end) -> float:
        end.synchronize()
        return start.elapsed_time(end) / 1000.0


def timeline(device: torch.device) -> HostTimeline | DeviceTimeline:
    """The device's own timeline where it has timed events (CUDA, MPS), else the host's clock. Tried once before it
    is used (MPS events with timing are not run here: no Mac), so a device without them times on the host clock,
    synchronising at each mark, rather than fail mid-run."""
    if device.type not in ("cuda", "mps"):
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
    """Theoretical dense peak FLOP/s of the device at this precision, where known (CUDA only)."""
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
    """CUDA: the caching allocator's peak; MPS: memory the Metal driver holds now; CPU: the process's peak RSS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    if device.type == "mps":
        return torch.mps.driver_allocated_memory() / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10  # bytes on macOS, KiB on Linux


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


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
