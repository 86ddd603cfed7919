"""Honest step time and throughput.

CUDA and MPS run asynchronously: a host clock read without a device sync times kernel launches, not work. This
callback synchronises only at the edges of each timed window (a sync per step would itself cost throughput),
excludes warm-up steps (compilation, allocator growth) and validation, and fetches device-side token counts once
per window. Windows are back to back: each ends at the end of a training batch and the next starts right there,
so data loading between batches is inside the measurement.

Lightning's `ThroughputMonitor` synchronises only on CUDA, has no MPS branch and misses the plain "NVIDIA H200"
name in its peak-FLOPs table; we reuse its table (`get_available_flops`) and add what it lacks.
"""

from __future__ import annotations

import resource
import statistics
import sys
import time
from collections.abc import Callable

import lightning as L
import torch
from lightning.fabric.utilities.throughput import get_available_flops

PRECISION_DTYPES = {
    "32-true": torch.float32,
    "32": torch.float32,
    "bf16-mixed": torch.bfloat16,
    "bf16-true": torch.bfloat16,
    "16-mixed": torch.float16,
    "16-true": torch.float16,
}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def peak_flops(device: torch.device, precision: str) -> float | None:
    """Theoretical dense peak FLOP/s of the device at this precision, where known (CUDA only)."""
    if device.type != "cuda":
        return None
    dtype = PRECISION_DTYPES.get(str(precision), torch.float32)
    name = torch.cuda.get_device_name(device).lower()
    if "h200" in name and "sxm1" not in name and "nvl1" not in name:
        # Lightning parses only "H200 SXM1"/"NVL1"; the plain name reported by H200 SXM boards gets the SXM figures
        from lightning.fabric.utilities.throughput import _CUDA_FLOPS

        table = _CUDA_FLOPS.get("h200 sxm1", {})
        if dtype is torch.float32 and torch.get_float32_matmul_precision() != "highest":
            dtype = "tfloat32"
        return float(table[dtype]) if dtype in table else None
    flops = get_available_flops(device, dtype)
    return float(flops) if flops else None


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    if device.type == "mps":
        return torch.mps.driver_allocated_memory() / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10  # bytes on macOS, KiB on Linux


class ThroughputTimer(L.Callback):
    def __init__(
        self,
        warmup_steps: int = 5,
        window: int = 20,
        sync: Callable[[torch.device], None] = synchronize,
        clock: Callable[[], float] = time.perf_counter,
    ):
        if warmup_steps < 0 or window < 1:
            raise ValueError(f"timing: warmup_steps must be >= 0 and window >= 1, got {warmup_steps}, {window}")
        self.warmup_steps = warmup_steps
        self.window = window
        self._sync = sync
        self._clock = clock
        self.summary: dict[str, float] = {}
        self.windows: list[dict[str, float]] = []  # one entry per full window: what was logged
        self._reset_totals()

    def _reset_totals(self) -> None:
        self._batches_seen = 0
        self._t0: float | None = None
        self._paused_elapsed = 0.0
        self._win = self._empty_window()
        self._total = self._empty_window()
        self._peak_mem_mb = 0.0

    @staticmethod
    def _empty_window() -> dict:
        return {"steps": 0, "samples": 0, "tokens": 0, "flops": 0.0, "elapsed": 0.0}

    # --- window edges ------------------------------------------------------------------------------
    def _start(self, device: torch.device) -> None:
        self._sync(device)
        self._t0 = self._clock()

    def _elapsed_since_start(self, device: torch.device) -> float:
        self._sync(device)
        return self._clock() - self._t0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._reset_totals()
        self._device = pl_module.device
        self._peak = peak_flops(self._device, str(trainer.precision))
        if self.warmup_steps == 0:
            self._start(self._device)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._batches_seen += 1
        if self._t0 is None:
            if self._batches_seen == self.warmup_steps:
                self._start(self._device)  # the first window starts where warm-up ends
            return
        win = self._win
        win["steps"] += 1
        win["samples"] += pl_module.samples_in(batch)
        win["tokens"] = win["tokens"] + pl_module.tokens_in(batch)  # may stay a device tensor: no sync here
        flops = pl_module.flops_in(batch)
        win["flops"] += flops or 0.0
        if win["steps"] >= self.window:
            self._close_window(trainer, log=True)

    def _close_window(self, trainer: L.Trainer, log: bool) -> None:
        elapsed = self._paused_elapsed + self._elapsed_since_start(self._device)
        win = self._win
        win["elapsed"] = elapsed
        win["tokens"] = float(win["tokens"].item() if torch.is_tensor(win["tokens"]) else win["tokens"])
        self._peak_mem_mb = max(self._peak_mem_mb, peak_memory_mb(self._device))
        for key in self._total:
            self._total[key] += win[key]
        if log and win["steps"] > 0 and elapsed > 0:
            metrics = {
                "train/step_time_s": elapsed / win["steps"],
                "train/samples_per_sec": win["samples"] / elapsed,
                "train/tokens_per_sec": win["tokens"] / elapsed,
            }
            if self._peak and win["flops"]:
                metrics["train/mfu"] = win["flops"] / elapsed / self._peak
            self.windows.append({**metrics, "elapsed": elapsed, "samples": win["samples"], "steps": win["steps"]})
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)
        self._win = self._empty_window()
        self._paused_elapsed = 0.0
        self._t0 = self._clock()  # the next window starts where this one ended (sync already done)

    # --- validation is not training time -----------------------------------------------------------
    def on_validation_start(self, trainer, pl_module) -> None:
        if self._t0 is not None and not trainer.sanity_checking:
            self._paused_elapsed += self._elapsed_since_start(self._device)
            self._t0 = None
            self._paused = True

    def on_validation_end(self, trainer, pl_module) -> None:
        if getattr(self, "_paused", False):
            self._paused = False
            self._start(self._device)

    def on_train_end(self, trainer, pl_module) -> None:
        if self._t0 is not None and self._win["steps"] > 0:
            self._close_window(trainer, log=False)  # a partial window counts in the totals, not as a sample
        self._peak_mem_mb = max(self._peak_mem_mb, peak_memory_mb(self._device))
        self.summary = self.summarize()

    def summarize(self) -> dict[str, float]:
        summary = {"summary/peak_mem_mb": self._peak_mem_mb}
        total = self._total
        if total["elapsed"] > 0:
            summary["summary/samples_per_sec"] = total["samples"] / total["elapsed"]
            summary["summary/tokens_per_sec"] = total["tokens"] / total["elapsed"]
            summary["summary/timed_steps"] = float(total["steps"])
            if self._peak and total["flops"]:
                summary["summary/mfu"] = total["flops"] / total["elapsed"] / self._peak
        step_times = [w["train/step_time_s"] for w in self.windows]
        if not step_times and total["steps"]:
            step_times = [total["elapsed"] / total["steps"]]
        if step_times:
            summary["summary/step_time_s_median"] = statistics.median(step_times)
            summary["summary/step_time_s_p90"] = (
                statistics.quantiles(step_times, n=10)[-1] if len(step_times) >= 2 else step_times[0]
            )
        return summary
