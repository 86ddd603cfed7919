"""A job's progress line while it trains, so that a long job is never silent between its set-up line and its
`done:` line: `progress: step 120 of 1000 (12 %), 410 samples/s, about 2.1 min left in this job`, once every
`every_s` seconds of the host clock (StepTimer.batch_end drives it for both fit loops; no device sync: the line
reads the steps the loop has handed out, and its rate averages over everything since training started, validations
and checkpoints included, so its time left includes them too). Plain Python: no torch, no Lightning."""

from __future__ import annotations

import time
from collections.abc import Callable


class JobProgress:
    """tick(step, samples) at each training batch's end; returns the line when one is due (None otherwise)."""

    def __init__(self, total_steps: int | None, every_s: float = 45.0, clock: Callable[[], float] = time.monotonic):
        self.total_steps = total_steps if total_steps and total_steps > 0 else None
        self.every_s = every_s
        self._clock = clock
        self._start = clock()
        self._last = self._start
        self._samples = 0

    def tick(self, step: int, samples: int) -> str | None:
        """step: the optimizer steps done (the loop's logging step + 1); samples: this batch's."""
        self._samples += samples
        now = self._clock()
        if self.every_s <= 0 or now - self._last < self.every_s:
            return None
        self._last = now
        elapsed = now - self._start
        rate = self._samples / elapsed if elapsed > 0 else 0.0
        if self.total_steps is None:
            return f"progress: step {step}, {rate:.0f} samples/s, {duration(elapsed)} training"
        left = elapsed / step * (self.total_steps - step) if step > 0 else float("nan")
        share = min(100.0, 100.0 * step / self.total_steps)
        return (f"progress: step {step} of {self.total_steps} ({share:.0f} %), {rate:.0f} samples/s, "
                f"about {duration(left)} left in this job")


def duration(seconds: float) -> str:
    if seconds != seconds:  # nan: not known yet
        return "an unknown time"
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"
