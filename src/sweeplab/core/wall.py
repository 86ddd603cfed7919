"""A job's wall time in disjoint parts: one clock, one current part; every switch charges the time since the last
switch to the part that was current. The parts cover the job from its process's start (the first job of a process:
interpreter start-up and imports count as its set-up) to the moment its breakdown is recorded, so they add up to
its wall time by construction, and each second is charged to exactly one part.

The parts (docs/metrics.md, `summary/wall_breakdown/<part>_s`):
- setup: process start (or, for a later job of the same process, the job's start) to its first training batch:
  imports, config, the MLflow run, data, model, trainer, Lightning's own set-up and sanity validation;
- warmup: the training batches of the timer's warm-up steps (torch.compile's compilation falls here);
- steps: every later training batch, from one batch's start to the next (data loading and callbacks included);
- validation: validations during fit;
- checkpoints: checkpoint writes on the training thread (with background writes: the CPU copy and any wait for the
  writer, including the final join);
- mlflow: MLflow writes on the training thread (opening the run, metric batches, the summary, tags, artifacts);
- teardown: from the end of training to the record (summary, export, the job log), less the MLflow writes in it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

PARTS = ("setup", "warmup", "steps", "validation", "checkpoints", "mlflow", "teardown")


def _process_age_s() -> float:
    """Seconds since this process started, from the kernel's record of its start (0.0 where it cannot be read)."""
    try:
        import psutil

        return max(0.0, time.time() - psutil.Process(os.getpid()).create_time())
    except Exception:
        return 0.0


class WallClock:
    def __init__(self, started: float | None = None):
        """`started`: a time.perf_counter() value (default: now)."""
        self.seconds_in = dict.fromkeys(PARTS, 0.0)
        self.part = "setup"
        self._since = time.perf_counter() if started is None else started

    def switch(self, part: str) -> str:
        """Charge the time since the last switch to the current part and make `part` current; returns the part that
        was current."""
        now = time.perf_counter()
        self.seconds_in[self.part] += now - self._since
        self._since, previous, self.part = now, self.part, part
        return previous

    @contextlib.contextmanager
    def within(self, part: str) -> Iterator[None]:
        """The block's time goes to `part`, then the part that was current goes on."""
        previous = self.switch(part)
        try:
            yield
        finally:
            self.switch(previous)

    def totals(self) -> dict[str, float]:
        """Seconds per part so far (the current part up to now); their sum is the wall time since the start."""
        self.switch(self.part)
        return dict(self.seconds_in)


_current: WallClock | None = None
_jobs_started = 0
_from_process_start = False  # set by the command line's entry point (sweeplab.train), not by a library caller


def count_from_process_start() -> None:
    """The process was started for its jobs (the command line, a launcher's worker): its first job's clock starts at
    the process's start, so its set-up includes the interpreter and the imports. Elsewhere (tests, notebooks, the
    bench) a job's clock starts when the job does."""
    global _from_process_start
    _from_process_start = True


def start_job() -> WallClock:
    """A new clock for a job starting now (the process's first, after count_from_process_start: at its start)."""
    global _current, _jobs_started
    started = time.perf_counter() - (_process_age_s() if _jobs_started == 0 and _from_process_start else 0.0)
    _jobs_started += 1
    _current = WallClock(started)
    return _current


def clock() -> WallClock:
    """The current job's clock (a throwaway one outside a job: code that charges time never needs to ask)."""
    global _current
    if _current is None:
        _current = WallClock()
    return _current


def charged_to(part: str):
    """Decorator: every call's time goes to `part` of the current job's clock."""

    def decorate(function):
        import functools

        @functools.wraps(function)
        def charged(*args, **kwargs):
            with clock().within(part):
                return function(*args, **kwargs)

        return charged

    return decorate
