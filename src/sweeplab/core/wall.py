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

The set-up is split further (`summary/setup_split/<segment>_s`, and one log line when the first training batch
starts): `mark(label)` at a point of the set-up closes the segment that ends there, named by the label; the
segment from the last mark to the set-up's end is `fit_start`. Segments count the set-up part's own time, so the
MLflow writes inside the set-up are in none of them, and they add up to the set-up part.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator

PARTS = ("setup", "warmup", "steps", "validation", "checkpoints", "mlflow", "teardown")
# the set-up's segments in the order a job passes them (docs/study-cost.md says what each holds); the last, from the
# last mark to the first training batch, has no mark
SETUP_SEGMENTS = ("process_start", "plan", "resume_check", "run_tags", "run_open", "data", "task", "trainer",
                  "fit_start")
LAST_SEGMENT = SETUP_SEGMENTS[-1]

log = logging.getLogger(__name__)


def process_age_s() -> float:
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
        self._setup_marks: list[tuple[str, float]] = []  # (label, the setup part's seconds when it was marked)

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

    def mark(self, label: str) -> None:
        """The set-up reached the point `label` names: the set-up time since the previous mark (or the clock's start)
        is the segment `label`. Ignored outside the set-up part (an MLflow write inside it, a later stage)."""
        if self.part != "setup":
            return
        self.switch("setup")
        self._setup_marks.append((label, self.seconds_in["setup"]))

    def setup_split(self) -> dict[str, float]:
        """The setup part's seconds in segments, in the order marked (a label marked twice: the sum of both); the
        remainder after the last mark is LAST_SEGMENT. They add up to the setup part's seconds so far."""
        total = self.totals()["setup"]
        split: dict[str, float] = {}
        before = 0.0
        for label, at in self._setup_marks:
            split[label] = split.get(label, 0.0) + (at - before)
            before = at
        split[LAST_SEGMENT] = split.get(LAST_SEGMENT, 0.0) + total - sum(split.values())
        return split

    def end_setup(self, part: str) -> None:
        """The first training batch starts: make `part` current and log the set-up's split in one line."""
        was_setup = self.part == "setup"
        self.switch(part)
        if was_setup:
            log.info("%s", self.setup_line())

    def setup_line(self) -> str:
        """`set-up 43.5 s: process_start 12.1, ..., fit_start 9.6 (MLflow 2.1 s besides)`: segments under 0.05 s
        left out (the run's metrics hold them all); MLflow's writes during the set-up are in no segment."""
        split = self.setup_split()
        shown = [label for label, seconds in split.items() if seconds >= 0.05] or [max(split, key=split.get)]
        shown = ", ".join(f"{label} {split[label]:.1f}" for label in shown)
        besides = self.seconds_in["mlflow"]
        return (f"set-up {sum(split.values()):.1f} s: {shown}"
                + (f" (MLflow {besides:.1f} s besides)" if besides >= 0.05 else ""))


_current: WallClock | None = None
_jobs_started = 0
_from_process_start = False  # set by the command line's entry point (sweeplab.train), not by a library caller
_first_job_from: float | None = None  # a perf_counter() value the process's first job counts from, not its start


def count_from_process_start() -> None:
    """The process was started for its jobs (the command line, a launcher's worker): its first job's clock starts at
    the process's start, so its set-up includes the interpreter and the imports. Elsewhere (tests, notebooks, the
    bench) a job's clock starts when the job does."""
    global _from_process_start
    _from_process_start = True


def count_from_now() -> None:
    """The process's first job counts from now, not from the process's start: a worker started and warmed up
    before its jobs were handed out (hydra/launcher=joblib_gpus) idled, beside the sweep's own start-up, till now."""
    global _first_job_from
    if _jobs_started == 0:
        _first_job_from = time.perf_counter()


def start_job() -> WallClock:
    """A new clock for a job starting now (the process's first, after count_from_process_start: at its start, or
    where count_from_now said)."""
    global _current, _jobs_started
    if _jobs_started == 0 and _from_process_start:
        started = _first_job_from if _first_job_from is not None else time.perf_counter() - process_age_s()
    else:
        started = time.perf_counter()
    _jobs_started += 1
    _current = WallClock(started)
    _current.mark("process_start")  # the interpreter and the imports (a later job of the process: nothing)
    return _current


def clock() -> WallClock:
    """The current job's clock (a throwaway one outside a job: code that charges time never needs to ask)."""
    global _current
    if _current is None:
        _current = WallClock()
    return _current


def mark(label: str) -> None:
    """WallClock.mark on the current job's clock: the set-up reached the point `label` names."""
    clock().mark(label)


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
