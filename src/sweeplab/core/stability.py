"""How far a run's speed can be trusted, judged in one place for the report, the bench and the order check.

Every job records (callbacks/timing.py) the spread of its window step times, the batch shapes its timed steps saw and
how many of them were new there, graphs compiled there, the host's load average at start and end, its CPUs, and how
steady the host's own single-thread speed was at start and end (a short pure-Python probe).
A run is unreliable when its own speed moved a lot, when other work competed for the host or the host's speed
itself wavered, or when one-off costs
(a compilation, a new batch shape) fell inside its timed steps. Two runs are only called different when their
throughputs differ by more than the noise of both.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

from sweeplab.core.records import JOB

# (p90 - p10) / median of a run's window step times above this: its own speed moved too much to compare closely.
# A quiet machine gives a few percent.
NOISY_SPREAD = 0.10
# 1-minute load average per usable CPU, at start or end, above this: other work competed for the CPUs. The run's own
# threads count in the load, so a CPU run with as many threads as CPUs sits near 1.0 by itself.
LOADED_HOST = 1.0
# Host-steadiness probe (devices.host_speed_spread: (p90 - p10) / median of a pure-Python loop's speed over 10 ms
# slices) above this, at start or end: the host's own speed moved, so a host-bound run's numbers move with it
# (unsteady_host: unless the run's own step times held within NOISE_FLOOR, as a job the device paces does).
# The 2-core development VM gives 2-6 % idle (now and then ~30 %), 35-110 % with two busy processes on its 2 CPUs,
# 60-100 % sharing its CPU with a process busy 30 ms in every 60; the H100 VM of issue 12 gave 75 % (50 ms slices).
UNSTEADY_HOST = 0.50
# Throughputs closer than this are never called different, however small the spreads: run-to-run and order effects
# of a few percent remain on a quiet machine (issue 12 asks for ±5 % between the two orders of a sweep).
NOISE_FLOOR = 0.05
# `python -m sweeplab.order_check`: a configuration's samples/s in the two orders must agree within this.
ORDER_TOLERANCE = 0.05
# The timer's time for a window under this share of the host's time until a result of that window was read back:
# the timer's device sync did not wait for the work (issue #30; an unsynchronised MPS clock reads up to 10x fast,
# pytorch#152199).
UNSYNCHRONISED = 0.5
# MPS: the Metal driver's allocation grew by more than this (MiB) inside timed steps: MPSGraph compiled and cached
# graphs for new (op, dtype, shape) keys, never evicted (pytorch#77753: a run went from 8 s to 45 s a step), or the
# allocator took new heaps. Past the shape warm-up a steady run allocates nothing new; the MPS allocator's larger
# heaps come in tens of MiB, so growth below this is not called.
MPS_DRIVER_GROWTH_MB = 64.0


def deciles(values: Sequence[float]) -> tuple[float, float, float]:
    """(p10, median, p90) of `values`, the figures every spread here is read from ((p90 - p10) / median: a run's
    window step times, the host probe's slice speeds). One value: itself three times."""
    median = statistics.median(values)
    if len(values) < 2:
        return values[0], median, values[0]
    cuts = statistics.quantiles(values, n=10, method="inclusive")
    return cuts[0], median, cuts[-1]


def _over(value: float, threshold: float) -> str:
    """"V > T" in percent, with a decimal where whole percents would read "10% > 10%"."""
    digits = 1 if round(value * 100) == round(threshold * 100) else 0
    return f"{value:.{digits}%} > {threshold:.0%}"


def problems(metrics: Mapping[str, float], tags: Mapping[str, str] | None = None) -> list[str]:
    """Why a run's speed cannot be trusted (empty: nothing known against it); `tags`: the run's, for what it records
    as tags (the MPS fallback)."""
    found = []
    spread = metrics.get(JOB.step_time_spread)
    if spread is not None and spread > NOISY_SPREAD:
        found.append(f"noisy (spread {_over(spread, NOISY_SPREAD)})")
    cpus = metrics.get(JOB.host_cpus)
    loads = [metrics[k] for k in (JOB.load_avg_start, JOB.load_avg_end) if metrics.get(k) is not None]
    if cpus and loads and max(loads) / cpus > LOADED_HOST:
        found.append(f"loaded host (load {max(loads):.1f} on {cpus:g} CPUs)")
    if (host := unsteady_host(metrics)) is not None:
        found.append(f"unsteady host (Python speed spread {_over(host, UNSTEADY_HOST)})")
    if compiles := metrics.get(JOB.compiles_in_timed_steps):
        found.append(f"{compiles:g} compilation(s) in timed steps")
    if new_shapes := metrics.get(JOB.new_shapes_in_timed_steps):
        found.append(f"{new_shapes:g} new batch shape(s) in timed steps")
    return found + apple_problems(metrics, tags or {})


def apple_problems(metrics: Mapping[str, float], tags: Mapping[str, str]) -> list[str]:
    """The MPS (and any host-clock) pitfalls a run records: a timer that does not wait for the device, MPS driver
    memory growing in timed steps, ops MPS lacks run on the CPU (`mps_fallback`)."""
    found = []
    ratio = metrics.get(JOB.timer_readback_ratio)
    if ratio is not None and ratio < UNSYNCHRONISED:
        found.append(f"unsynchronised clock (timer {ratio:.0%} of a result's read-back time)")
    growth = metrics.get(JOB.mps_driver_growth_mb)
    if growth is not None and growth > MPS_DRIVER_GROWTH_MB:
        found.append(f"MPS driver memory grew {growth:,.0f} MiB in timed steps (graph cache or new buffers)")
    if tags.get(JOB.mps_fallback) == "true":
        found.append("MPS fallback on (ops MPS lacks ran on the CPU)")
    return found


def unsteady_host(metrics: Mapping[str, float]) -> float | None:
    """The run's host-steadiness spread when it is over UNSTEADY_HOST and the run's own window step times did not
    hold within NOISE_FLOOR, else None. A job the device paces keeps still on an unsteady host, and its numbers do
    with it: on the H100 VM of issue 12 the paGating LM's batch-16 and batch-32 jobs (window spreads 0-4 %) agreed
    within 1 % over four runs while the probe read 53-196 %. Host-bound jobs on that host never held that still
    (6-69 %), and some of them moved 30-60 % between runs with window spreads of 6-9 %: those stay flagged."""
    spread = metrics.get(JOB.host_speed_spread)
    if spread is None or spread <= UNSTEADY_HOST:
        return None
    steps = metrics.get(JOB.step_time_spread)
    return None if steps is not None and steps < NOISE_FLOOR else spread


def has_stability_data(metrics: Mapping[str, float]) -> bool:
    """Runs recorded before sweeplab measured its own stability have none of it."""
    return JOB.batch_shapes in metrics


def noise(metrics: Mapping[str, float]) -> float:
    """Relative noise of a run's throughput: its spread, at least NOISE_FLOOR."""
    return max(NOISE_FLOOR, metrics.get(JOB.step_time_spread) or 0.0)


def within_noise(rate: float, metrics: Mapping[str, float], other_rate: float, other: Mapping[str, float]) -> bool:
    """Whether two throughputs differ by no more than the larger noise of the two runs (compared as a ratio)."""
    return abs(math.log(rate / other_rate)) <= math.log1p(max(noise(metrics), noise(other)))
