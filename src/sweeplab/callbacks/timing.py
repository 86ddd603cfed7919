"""Honest step time and throughput.

CUDA and MPS run asynchronously: a host clock read without a device sync times kernel launches, not work, and a
sync drains the device's queue, so the device idles until the host launches more: a timer that syncs slows what it
times. On CUDA this callback marks the edges of each timed window on the device's own timeline (an event in its
queue, stamped when the device gets there: sweeplab.runtime.devices.DeviceTimeline) and reads a window's time once the next
window is queued behind it, so no timed step ever waits for the measurement; on the CPU, MPS (whose events are host
timestamps and drain the queue when read: sweeplab.runtime.devices.timeline) and MLX the marks are the host's clock after a
device sync. `clock_name` says which clock timed the run. It
excludes warm-up steps (compilation, allocator growth) and validation, and fetches device-side token counts once
per window. Windows are back to back: each ends at the end of a training batch and the next starts right there,
so data loading between batches is inside the measurement. A validation pauses the clock from its start to the
next training batch, so the checkpoint it triggers is not counted either; so does the periodic checkpoint (its
file write is I/O, not a training step, and a hand-written loop timed beside it writes none).

A job's numbers must not depend on its place in a sweep. The first time a process meets a batch shape it pays once
(cuDNN autotuning, a Metal graph on MPS, oneDNN primitives, a torch.compile recompilation); before the first step,
the timer runs one forward/backward of every shape the data can give (`shape_warmup_batches` of the datamodule,
`warm_up_shapes` of the task: no optimizer step, so training is unchanged), so no timed step pays. Every run also
says how far it can be trusted: the spread of its window step times, the batch shapes its timed steps saw and how
many of them were new there, graphs compiled there, host load and CPU threads (`summarize`; judged in
sweeplab.core.stability).

Lightning's `ThroughputMonitor` synchronises only on CUDA, has no MPS branch and needs a full window before it emits
anything. Device facts (peak FLOP/s, memory, the sync itself) come from sweeplab.runtime.devices; the phase profiler and the
trace this timer switches on and off live in callbacks/profiler.py.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import lightning as L
import torch
from annotated_types import Ge, Interval

from sweeplab.callbacks.profiler import PhaseProfiler, log_artifacts, start_trace, stop_trace, write_profile
from sweeplab.callbacks.progress import JobProgress
from sweeplab.core.records import JOB, JobRun
from sweeplab.core.stability import UNSYNCHRONISED, deciles
from sweeplab.runtime.devices import (
    HostTimeline,
    TorchMemory,
    host_cpus,
    host_speed_spread,
    load_average,
    peak_flops,
    synchronize,
)
from sweeplab.runtime.devices import timeline as device_timeline
from sweeplab.runtime.lightning_private import logging_step

log = logging.getLogger(__name__)

#: a start probe reuses a probe of this process that ended less than this many seconds ago (the previous job's end
#: probe, in a sweep whose jobs run one after another in one process): the host it measured is the same one
HOST_PROBE_REUSE_S = 30.0
_last_host_probe: tuple[float, float | None] | None = None  # (time.monotonic() at its end, its spread)


def probe_host(seconds: float, reuse: bool = False) -> float | None:
    """devices.host_speed_spread over `seconds`; with `reuse`, the value of this process's last probe instead when it
    ended less than HOST_PROBE_REUSE_S ago."""
    global _last_host_probe
    if reuse and _last_host_probe is not None and time.monotonic() - _last_host_probe[0] < HOST_PROBE_REUSE_S:
        return _last_host_probe[1]
    spread = host_speed_spread(seconds)
    _last_host_probe = (time.monotonic(), spread)
    return spread


def batch_shape(batch, steps: int = 1) -> tuple:
    """The shapes of a batch's tensors, as one hashable key (a dict's in key order). A batch of `steps` optimizer
    steps' rows (steps_per_batch) is keyed by the shape each of its steps trains on."""
    if steps > 1:  # shape arithmetic, not slices: a slice is a device op, paid in host time every batch
        return tuple(
            (k, (v.shape[0] // steps, *v.shape[1:])) for k, v in batch.items() if torch.is_tensor(v) and v.ndim
        )
    if torch.is_tensor(batch):
        return tuple(batch.shape)
    if isinstance(batch, dict):
        return tuple((k, tuple(v.shape)) for k, v in batch.items() if torch.is_tensor(v))
    if isinstance(batch, (list, tuple)):
        return tuple(tuple(v.shape) for v in batch if torch.is_tensor(v))
    return ()


def compiled_graphs() -> int:
    """How many graphs torch.compile has compiled in this process so far (0 if it never ran). A compilation inside a
    timed stretch puts seconds of compile time into its step time."""
    utils = sys.modules.get("torch._dynamo.utils")  # not imported: nothing was compiled, and importing costs a second
    return int(utils.counters["stats"]["unique_graphs"]) if utils is not None else 0


@dataclass
class TimedFit:
    """What a fit loop tells the timer when training starts: the clock/step-count interface between the timer and
    whichever loop drives it (Lightning's, through ThroughputTimer; the MLX loop, directly). Steps are the loop's
    own: `StepTimer.batch_end` is handed the step a batch's metrics are logged at."""

    device: torch.device
    precision: str
    log_metrics: Callable[[dict[str, float], int], None]  # (metrics, step) -> the run's loggers
    samples_in: Callable[[object], int]
    tokens_in: Callable[[object], object] = lambda batch: 0
    flops_in: Callable[[object], float | None] = lambda batch: None
    out_dir: Path = Path("profile")  # where profile.md and the trace go unless timing.profile_dir says otherwise
    accumulate: int = 1  # training batches per optimizer step
    steps_per_batch: int = 1  # optimizer steps in one training batch
    # one forward/backward of each batch shape the run will meet (passes) -> the batches warmed up; None: no warm-up
    warm_up_shapes: Callable[[int], Sequence] | None = None
    log_artifacts: Callable[[list[Path]], None] = lambda files: None
    peak_flops: float | None = None  # the device's peak FLOP/s where the loop knows it (MLX); None: devices.peak_flops
    total_steps: int | None = None  # the optimizer steps the job plans (trainer.max_steps): its progress line's N
    memory: object | None = None  # reset/peak_mb/driver_mb (devices.MlxMemory); None: devices.TorchMemory(device)


def planned_steps(trainer) -> int | None:
    """The optimizer steps a Lightning fit plans (max_steps, or what its epochs come to); None when unknown."""
    if trainer.max_steps and trainer.max_steps > 0:
        return int(trainer.max_steps)
    try:
        steps = float(trainer.estimated_stepping_batches)
    except Exception:  # no loader length (an iterable dataset): no N in the line
        return None
    return int(steps) if math.isfinite(steps) else None


class StepTimer:
    """The timer itself, driven by any fit loop through `start`, `batch_start`, `batch_end`, `pause`,
    `resume_profiling` and `end` (ThroughputTimer is Lightning's driver). Logs `train/step_time_s`,
    `train/samples_per_sec`, `train/tokens_per_sec` and `train/mfu` once per window of `window` optimizer steps,
    after `warmup_steps` untimed steps (and, before them, `warmup_per_shape` forward/backward passes of every batch
    shape the data can give); `summary` holds the run's median, p10 and p90 step time, throughput at the median,
    stability figures and peak memory. `timeline` (device -> marks; default sweeplab.runtime.devices.timeline), `sync` and
    `clock` are injectable so tests can stand in for an async device; an injected `sync` or `clock` alone times on
    the host clock with that sync at every mark."""

    def __init__(
        self,
        warmup_steps: Annotated[int, Ge(0)] = 5,
        window: Annotated[int, Ge(1)] = 20,
        warmup_per_shape: Annotated[int, Ge(0)] = 1,
        profile: bool = False,
        trace_steps: Annotated[int, Ge(0)] = 0,
        profile_dir: str | None = None,
        host_probe_s: Annotated[float, Interval(ge=0, le=60)] = 0.25,  # a literal bound: read from source too
        progress_every_s: Annotated[float, Interval(ge=0, le=3600)] = 45.0,
        sync: Callable[[torch.device], None] = synchronize,
        clock: Callable[[], float] = time.perf_counter,
        timeline: Callable[[torch.device], object] | None = None,
    ):
        """warmup_per_shape: forward/backward passes of each batch shape before the first step (0: none);
        profile: also time the phases of each timed step (data, forward, backward, optimizer, framework) with a
        device sync at every phase edge, logged as `profile/*` and written to profile.md; trace_steps: record that
        many steps right after warm-up with torch.profiler (trace.json.gz, untimed); profile_dir: where those
        files go (default: TimedFit.out_dir); host_probe_s: seconds of a pure-Python probe of the host's
        steadiness (devices.host_speed_spread) when training starts and when it ends, untimed (0: off; the start's is
        the previous job's end probe when that ended less than HOST_PROBE_REUSE_S ago in this process)."""
        if warmup_steps < 0 or window < 1 or trace_steps < 0 or warmup_per_shape < 0 or host_probe_s < 0:
            raise ValueError(
                f"timing: warmup_steps, warmup_per_shape, trace_steps and host_probe_s must be >= 0 and window >= 1, "
                f"got {warmup_steps}, {warmup_per_shape}, {trace_steps}, {host_probe_s}, {window}"
            )
        self.host_probe_s = host_probe_s
        self.progress_every_s = progress_every_s
        self._progress: JobProgress | None = None
        self.warmup_steps = warmup_steps
        self.window = window
        self.warmup_per_shape = warmup_per_shape
        self.profile = profile
        self.trace_steps = trace_steps
        self.profile_dir = profile_dir
        self.profiler: PhaseProfiler | None = None  # set by the driver that runs the phase profiler (Lightning's)
        self.files: list[Path] = []  # profile.md, trace.json.gz once training ends
        self._trace = None
        self._sync = sync
        self._clock = clock
        if timeline is None and (sync is not synchronize or clock is not time.perf_counter):
            timeline = lambda device: HostTimeline(device, sync, clock)  # noqa: E731
        self._new_timeline = timeline or device_timeline
        self._timeline = None  # built for the fit's device (start)
        self.summary: dict[str, float] = {}
        self.windows: list[dict[str, float]] = []  # one entry per full window: what was logged
        self._fit: TimedFit | None = None
        self._accumulate = 1  # training batches per optimizer step
        self._steps_per_batch = 1  # optimizer steps per training batch
        self._peak: float | None = None
        self._memory = TorchMemory(torch.device("cpu"))
        self._reset_totals()

    @property
    def clock_name(self) -> str | None:
        """Which clock timed the run: "device" (CUDA events) or "host" (the host's clock after a device sync: the
        CPU, MPS, MLX, or CUDA without timed events); None before training starts or for an injected timeline that
        does not say. For the run's `timing.clock` tag."""
        return getattr(self._timeline, "clock", None)

    def run_record(self) -> JobRun:
        """What the run records about its timing: `timing.clock` (`clock_name`) and, once the read-back check ran,
        `timing.sync_check`: `agrees`, or `unsynchronised` where the timer's window time was under half the
        read-back time (`_check_readback`)."""
        sync_check = None
        if self._readback is not None:
            timer_s, readback_s = self._readback
            sync_check = "unsynchronised" if timer_s < UNSYNCHRONISED * readback_s else "agrees"
        return JobRun(timing_clock=self.clock_name or None, sync_check=sync_check)

    def run_tags(self) -> dict[str, str]:
        """run_record's tags, as MLflow gets them."""
        return self.run_record().to_mlflow().tags

    def _reset_totals(self) -> None:
        self._batches_seen = 0
        self._t0 = None  # the mark where the running stretch of timed steps started; None: the clock is stopped
        self._paused = False
        self._pending: list[tuple[dict, int, bool]] = []  # closed windows not read yet: (window, its step, log it)
        self._graphs_at_start = 0
        self._compiles_timed = 0
        self._win = self._empty_window()
        self._total = self._empty_window()
        self._peak_mem_mb = 0.0
        self._shapes_seen: set[tuple] = set()  # in the shape warm-up and every step so far
        self._timed_shapes: set[tuple] = set()
        self._new_timed_shapes = 0  # shapes a timed step met first
        self._load_start: float | None = None
        self._driver_growth_mb = 0.0  # MPS: growth of the driver's allocation inside timed stretches
        self._driver_at: float | None = None  # ... at the running stretch's start
        self._host_t0: float | None = None  # the host clock at the running window's start (the read-back check)
        self._readback: tuple[float, float] | None = None  # (timer seconds, read-back seconds) of the checked window
        self._readback_done = False

    @staticmethod
    def _empty_window() -> dict:
        # stretches: (start mark, end mark) of each timed stretch in the window (a validation splits one in two)
        return {"batches": 0, "samples": 0, "tokens": 0, "flops": 0.0, "elapsed": 0.0, "stretches": []}

    @property
    def device(self) -> torch.device:
        return self._fit.device if self._fit is not None else torch.device("cpu")

    # --- window edges ------------------------------------------------------------------------------
    def _start(self) -> None:
        self._t0 = self._timeline.mark()
        self._graphs_at_start = compiled_graphs()
        self._driver_at = self._memory.driver_mb()
        self._host_t0 = self._clock() if not self._readback_done else None

    def _count_compiles(self) -> None:  # at the end of a timed stretch (a pause or the end of training)
        self._compiles_timed += compiled_graphs() - self._graphs_at_start

    def _end_stretch(self):
        """Close the running stretch at a new mark (no wait for the device); the mark is returned."""
        end = self._timeline.mark()
        self._win["stretches"].append((self._t0, end))
        if self._driver_at is not None:  # MPS: what the driver allocated during the stretch (graphs, new buffers)
            now = self._memory.driver_mb()
            self._driver_growth_mb += max(0.0, now - self._driver_at)
            self._driver_at = now  # the next window goes on from this mark
        return end

    def _batches(self, steps: int) -> int:
        """Training batches that make `steps` optimizer steps (plan() refuses step counts a batch would split)."""
        return steps * self._accumulate // self._steps_per_batch

    def _steps(self, batches: float) -> float:
        return batches * self._steps_per_batch / self._accumulate

    @property
    def _untimed_batches(self) -> int:
        return self._batches(self.warmup_steps + self.trace_steps)

    def start(self, fit: TimedFit) -> None:
        """Training starts: warm every batch shape up (untimed), then start the clock unless warm-up steps come first."""
        self._fit = fit
        self._progress = JobProgress(fit.total_steps, self.progress_every_s)
        self._reset_totals()
        self._accumulate, self._steps_per_batch = fit.accumulate, fit.steps_per_batch
        self.windows = []
        self._load_start = load_average()
        self._host_spreads = [probe_host(self.host_probe_s, reuse=True)] if self.host_probe_s else []
        self._timeline = self._new_timeline(fit.device)
        self._peak = fit.peak_flops if fit.peak_flops is not None else peak_flops(fit.device, fit.precision)
        self._memory = fit.memory if fit.memory is not None else TorchMemory(fit.device)
        if self.warmup_per_shape and fit.warm_up_shapes is not None:
            batches = fit.warm_up_shapes(self.warmup_per_shape)
            self._shapes_seen.update(batch_shape(batch) for batch in batches)
            self._sync(fit.device)
        self._memory.reset()
        if self.profiler is not None:
            self.profiler.device = fit.device
        if self._untimed_batches == 0:
            self._start()

    def batch_start(self) -> None:
        if self._paused:  # first batch after a validation or a checkpoint: the clock runs again from here
            self._paused = False
            self._start()
            self._set_profiling(True)
        if self.trace_steps and self._trace is None and self._batches_seen == self._batches(self.warmup_steps):
            self._trace = start_trace(self.device)

    def _set_profiling(self, on: bool) -> None:
        if self.profiler is not None:
            self.profiler.active = on

    def batch_end(self, batch, step: int, result=None) -> None:
        """A training batch ended; `step`: the step its metrics are logged at (a window closing here logs there);
        `result`: something the step computed on the device (its loss: `.item()` reads it back to the host), for the
        run's one read-back check (`_check_readback`), or None."""
        fit = self._fit
        self._batches_seen += 1
        samples = fit.samples_in(batch)
        if self._progress is not None and (line := self._progress.tick(step + 1, samples)):
            log.info("%s", line)
        shape = batch_shape(batch, self._steps_per_batch)
        if self._t0 is not None:
            self._timed_shapes.add(shape)
            self._new_timed_shapes += shape not in self._shapes_seen
        self._shapes_seen.add(shape)
        if self._trace is not None and self._batches_seen == self._untimed_batches:
            self._stop_trace()
        if self._t0 is None:
            if not self._paused and self._batches_seen == self._untimed_batches:
                self._start()  # the first window starts where warm-up (and tracing) ends
                self._set_profiling(True)
            return
        win = self._win
        win["batches"] += 1
        win["samples"] += samples
        win["tokens"] = win["tokens"] + fit.tokens_in(batch)  # may stay a device tensor: no sync here
        win["flops"] += fit.flops_in(batch) or 0.0
        if win["batches"] >= self._batches(self.window):
            self._t0 = self._end_stretch()  # the next window starts where this one ended
            self._check_readback(result)
            self._close_window(step, log=True)
            self._read_windows(keep=1)  # the one before: the device is past it, this one is queued behind

    def _check_readback(self, result) -> None:
        """Once per run, on the host clock: does the timer's figure cover the device's work? The first window timed
        in one stretch is also timed from its start on the host clock to the moment `result` (computed by its last
        step) has been read back to the host, which cannot happen before the device has done that step. A timer whose
        device sync does not wait (the clock reads launches only: up to 10x too fast on MPS, pytorch#152199) times
        the window at a fraction of that; the summary keeps the ratio (`summary/timer_readback_ratio`) and
        sweeplab.core.stability flags the run below half. CUDA's event timeline is the device's own clock: not checked."""
        if self._readback_done or result is None or self._host_t0 is None or len(self._win["stretches"]) != 1:
            self._host_t0 = self._clock() if not self._readback_done else None  # the next window's start
            return
        if self.clock_name != "host":
            self._readback_done, self._host_t0 = True, None
            return
        result.item()  # waits for the device to have computed it
        self._win["readback_s"] = self._clock() - self._host_t0
        self._readback_done, self._host_t0 = True, None

    def _close_window(self, step: int, log: bool) -> None:
        """Queue the current window to be read once the device is past its end (`_read_windows`)."""
        self._peak_mem_mb = max(self._peak_mem_mb, self._memory.peak_mb())
        # logged at this batch's step (the loop's own step for this batch, as train/loss gets), whenever it is read
        self._pending.append((self._win, step, log))
        self._win = self._empty_window()

    def _read_windows(self, keep: int = 0) -> None:
        """Read the closed windows' times, all but the newest `keep`: reading waits for the device to reach a
        window's end, so the newest one is left until the next is queued behind it."""
        while len(self._pending) > keep:
            win, step, log = self._pending.pop(0)
            self._read_window(win, step, log)

    def _read_window(self, win: dict, step: int, log: bool) -> None:
        elapsed = win["elapsed"] = sum(self._timeline.seconds(start, end) for start, end in win["stretches"])
        if win.get("readback_s"):
            self._readback = (elapsed, win["readback_s"])
        win["tokens"] = float(win["tokens"].item() if torch.is_tensor(win["tokens"]) else win["tokens"])
        for key in self._total:
            self._total[key] += win[key]
        steps = self._steps(win["batches"])
        if log and steps > 0 and elapsed > 0:
            metrics = JobRun(
                window_step_time=elapsed / steps,
                window_samples_per_sec=win["samples"] / elapsed,
                # a family without tokens (tokens_in is 0) reports none
                window_tokens_per_sec=win["tokens"] / elapsed if win["tokens"] else None,
                window_mfu=win["flops"] / elapsed / self._peak if self._peak and win["flops"] else None,
            ).to_mlflow().metrics
            self.windows.append({**metrics, "elapsed": elapsed, "samples": win["samples"], "steps": steps})
            # Straight to the loggers, once, at the window's step. Through pl_module.log the value stayed in
            # Lightning's results and was written again at the next `log_every_n_steps` step. The run logger holds
            # it until the next pause (tracking/run_logger.py): no timed step waits for the store.
            self._fit.log_metrics(metrics, step)

    def step_time_so_far(self) -> float | None:
        """Seconds per optimizer step over the timed stretches read so far (warm-up excluded); None before the
        first. Steps × this is training time as the verdict reads it (samples seen ÷ samples per second)."""
        steps = self._steps(self._total["batches"])
        return self._total["elapsed"] / steps if steps > 0 and self._total["elapsed"] > 0 else None

    def samples_per_step_so_far(self) -> float | None:
        """Training samples per optimizer step over the timed stretches read so far (what `summary/samples_per_step`
        records at the end, and the verdict reads); None before the first."""
        steps = self._steps(self._total["batches"])
        return self._total["samples"] / steps if steps > 0 and self._total["samples"] > 0 else None

    # --- validation and checkpoint saving are not training time -----------------------------------
    def pause(self) -> None:
        """Stop the clock (a validation, a checkpoint write); it runs again at the next training batch. The windows
        closed so far are read now, while nothing is timed: a checkpoint written here covers their logged numbers."""
        if self._t0 is None:
            return
        self._end_stretch()
        self._read_windows()
        self._count_compiles()
        self._t0 = None
        self._paused = True
        self._set_profiling(False)

    def resume_profiling(self) -> None:
        """After a validation: the clock restarts at the next batch, whose data loading the profiler times."""
        if self._paused and self.profiler is not None:
            self._set_profiling(True)

    def end(self, step: int) -> None:
        """Training ended after `step` optimizer steps: read every window and fill `summary`."""
        if self._win["batches"] > 0:  # a partial window counts in the totals, not as a logged sample
            if self._t0 is not None:
                self._end_stretch()
            self._close_window(step, log=False)
        self._read_windows()
        if self._t0 is not None:
            self._count_compiles()
        if self._compiles_timed:
            log.warning(
                "torch.compile compiled %d graph(s) during the timed steps: their compile time is in the step time "
                "(raise timing.warmup_steps, or look for recompilations with TORCH_LOGS=recompiles)",
                self._compiles_timed,
            )
        self._t0 = None
        self._paused = False
        self._set_profiling(False)
        if self._trace is not None:
            self._stop_trace()
        self._peak_mem_mb = max(self._peak_mem_mb, self._memory.peak_mb())
        self.summary = self.summarize()
        self.summary.update(self.host_summary(self._load_start, load_average(), self._host_spreads))
        if self.profiler is not None:
            self._write_profile(step)

    def end_host_probe(self) -> None:
        """The host-steadiness probe at the end of training, into `summary` (after `end`). A fit loop calls it once its
        own wall part is the teardown: the probe is sweeplab's measurement, not a training step."""
        if self.host_probe_s and self._fit is not None:  # None: training never started (a resumed job already done)
            self._host_spreads.append(probe_host(self.host_probe_s))
            self.summary.update(self.host_summary(self._load_start, load_average(), self._host_spreads))

    # --- profile and trace -------------------------------------------------------------------------
    def _out_dir(self) -> Path:
        out = Path(self.profile_dir) if self.profile_dir else self._fit.out_dir
        out.mkdir(parents=True, exist_ok=True)
        return out

    def _stop_trace(self) -> None:
        trace, self._trace = self._trace, None
        self.files.append(stop_trace(trace, self._out_dir()))

    def _write_profile(self, step: int) -> None:
        steps = self._steps(self._total["batches"])
        metrics, table = write_profile(self.profiler, self._total["elapsed"], steps, self.device, self._out_dir())
        self.summary.update(metrics)
        self.files.insert(0, table)
        self._fit.log_metrics(metrics, step)
        self._fit.log_artifacts(self.files)

    def summarize(self) -> dict[str, float]:
        """The run's timed steps in one place. Throughput is at the median window step time (per-step samples,
        tokens and FLOPs of all timed steps over `step_time_s_median`), so samples/s = samples per step / median step
        time exactly; `samples_per_sec_overall` is all timed samples over all timed seconds (what a stopwatch around
        the timed steps gives; the bench compares it with its raw loop). `step_time_spread` = (p90 - p10) / median of
        the window step times: how much the run's own speed moved (sweeplab.core.stability judges it)."""
        figures: dict[str, float | None] = dict(
            peak_mem_mb=self._peak_mem_mb,
            compiles_in_timed_steps=self._compiles_timed,
            batch_shapes=len(self._timed_shapes),
            new_shapes_in_timed_steps=self._new_timed_shapes,
        )
        if self._driver_at is not None or self._driver_growth_mb:
            figures.update(mps_driver_growth_mb=self._driver_growth_mb)
        if self._readback is not None:
            figures.update(timer_readback_ratio=self._readback[0] / self._readback[1])
        total = self._total
        steps = self._steps(total["batches"])
        if total["elapsed"] > 0:
            figures.update(samples_per_sec_overall=total["samples"] / total["elapsed"], timed_steps=steps,
                           timed_seconds=total["elapsed"])
        step_times = [w[JOB.window_step_time] for w in self.windows]
        if not step_times and steps and total["elapsed"] > 0:
            step_times = [total["elapsed"] / steps]
        if step_times:
            p10, median, p90 = deciles(step_times)
            figures.update(step_time_median=median, step_time_p10=p10, step_time_p90=p90,
                           step_time_spread=(p90 - p10) / median if len(step_times) >= 2 else None)
            if steps and median > 0:
                figures.update(
                    samples_per_sec=total["samples"] / steps / median,
                    samples_per_step=total["samples"] / steps,
                    tokens_per_sec=total["tokens"] / steps / median if total["tokens"] else None,
                    mfu=total["flops"] / steps / median / self._peak if self._peak and total["flops"] else None,
                )
        return JobRun(**figures).to_mlflow().metrics

    @staticmethod
    def host_summary(
        load_start: float | None, load_end: float | None, host_spreads: Sequence[float | None] = ()
    ) -> dict[str, float]:
        """What else ran on the host: its 1-minute load average when training started and ended (this run's threads
        included), the CPUs this process may use, torch's intra-op threads, and the larger of the host-steadiness
        probes at start and end (`summary/host_speed_spread`)."""
        spreads = [x for x in host_spreads if x is not None]
        return JobRun(cpu_threads=torch.get_num_threads(), host_cpus=host_cpus(), load_avg_start=load_start,
                      load_avg_end=load_end, host_speed_spread=max(spreads) if spreads else None).to_mlflow().metrics


class ThroughputTimer(StepTimer, L.Callback):
    """The step timer driven by Lightning's hooks (StepTimer says what it logs and takes the same arguments)."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.profile and stage == "fit":
            # Lightning set its profiler up before callbacks; this one replaces it for the whole fit
            profiler = PhaseProfiler(pl_module.device, self._sync, self._clock)
            trainer.profiler = self.profiler = profiler

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        steps = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
        accumulate = max(1, int(trainer.accumulate_grad_batches or 1))
        source = getattr(trainer.datamodule, "shape_warmup_batches", None)
        warm_up = getattr(pl_module, "warm_up_shapes", None)

        def warm_up_shapes(passes: int) -> list:
            # the shapes of the batches this run will train on (its first max_steps); under DDP, this rank's
            host_batches = source(steps * accumulate if steps else None)
            batches = [pl_module.transfer_batch_to_device(batch, pl_module.device, 0) for batch in host_batches]
            warm_up(batches, passes)
            return batches

        def log_metrics(metrics: dict[str, float], step: int) -> None:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=step)

        def log_profile_files(files: list[Path]) -> None:
            for logger in trainer.loggers:
                log_artifacts(logger, files)

        self.start(TimedFit(
            device=pl_module.device,
            precision=str(trainer.precision),
            log_metrics=log_metrics,
            samples_in=pl_module.samples_in,
            tokens_in=pl_module.tokens_in,
            flops_in=pl_module.flops_in,
            out_dir=Path(trainer.default_root_dir) / "profile",
            accumulate=accumulate,
            steps_per_batch=max(1, int(getattr(pl_module, "steps_per_batch", 1))),
            warm_up_shapes=warm_up_shapes if source is not None and warm_up is not None else None,
            log_artifacts=log_profile_files,
            total_steps=planned_steps(trainer),
        ))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.batch_start()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs  # the step's loss, on the device
        self.batch_end(batch, logging_step(trainer), loss if torch.is_tensor(loss) else None)

    def on_validation_start(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.pause()

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        # a periodic checkpoint (checkpoint.every_n_steps) is written between two training batches: I/O, not a step
        # (`make profile` leaves it out too: its shares are of the timed steps)
        self.pause()

    def on_validation_end(self, trainer, pl_module) -> None:
        self.resume_profiling()

    def on_train_end(self, trainer, pl_module) -> None:
        self.end(trainer.global_step)

    def on_fit_end(self, trainer, pl_module) -> None:
        # after every on_train_end (WallBreakdown's switch to the teardown) and Lightning's teardown
        self.end_host_probe()
