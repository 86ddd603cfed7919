"""The checkpoint policy of a job, one for both fit loops: Lightning's callbacks (callbacks/checkpoints.py:
LastCheckpoint, BestCheckpoint) and the MLX loop (engine/mlx_fit.py) ask it every decision and only write the files.

- **last.ckpt is due** at an optimizer step that is a multiple of `checkpoint.every_n_steps`, or once
  `checkpoint.every_n_seconds` have passed since the last save was decided (the clock starts with the fit), and
  always at the last step (`max_steps`, when the loop has one). When it is due, the clock restarts. The ranks of a
  data-parallel job take one timed decision (their clocks differ and a save is collective): the loop says how they
  agree (Lightning: rank 0's, broadcast).
- **A validation is a new best** when its monitored value beats the best so far strictly (`mode`: min or max; a tie
  is not a best); the first validation with a value is always one. A NaN beats nothing and is kept as the worst value
  there is (+inf under min, -inf under max), so any later finite value beats it (Lightning's ModelCheckpoint keeps
  NaN so).
- **A resumed job keeps its best checkpoint**: the best files the resumed checkpoint names are brought into this
  job's directory (copied when they lie elsewhere: `resume=PATH`); one that is gone is dropped with a warning, and the
  best is chosen among the validations that follow. Of those kept, the best by `mode` is the best.

State: only the clock of every_n_seconds, which no checkpoint carries: last.ckpt is written the moment the clock
restarts, so a resumed job whose clock starts with its fit counts from the same point. The best score lives in the
best checkpoint's state (Lightning's ModelCheckpoint format, which both loops write and `best_files` reads).
Plain Python: no Lightning, torch or MLX here (a contract in pyproject.toml holds it).
"""

from __future__ import annotations

import logging
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweeplab.core.files import atomic_write

log = logging.getLogger(__name__)


@dataclass
class CheckpointPolicy:
    """When last.ckpt is written and which validation is a new best (the module docstring's rules)."""

    every_n_steps: int | None = None  # checkpoint.every_n_steps: last.ckpt at every multiple (optimizer steps)
    every_n_seconds: float | None = None  # checkpoint.every_n_seconds: ... and/or this long after the last one
    mode: str = "min"  # the monitored metric's direction: "min" | "max"
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)  # seconds; tests move it by hand
    _since: float = field(init=False, repr=False)  # when the last save was decided (or the fit started)

    def __post_init__(self) -> None:
        self.start()

    def start(self) -> None:
        """The fit starts: every_n_seconds counts from here."""
        self._since = self.clock()

    def last_due(self, step: int, max_steps: int, agree: Callable[[bool], bool] | None = None) -> bool:
        """Whether last.ckpt is written after optimizer step `step` (`max_steps` <= 0: no last step). `agree`: the
        timed decision the ranks take together (None: one process)."""
        due = max_steps > 0 and step >= max_steps
        if not due:
            due = bool(self.every_n_steps) and step % self.every_n_steps == 0
            if self.every_n_seconds is not None:
                timed = self.clock() - self._since >= self.every_n_seconds
                due = (agree(timed) if agree is not None else timed) or due
        if due:
            self._since = self.clock()
        return due

    def is_new_best(self, value: float | None, best: float | None) -> bool:
        """Whether a validation's monitored `value` makes a new best checkpoint, `best` the best score so far (None:
        no best yet; a value of None: the metric was not logged)."""
        if value is None:
            return False
        if best is None:
            return True
        return value < best if self.mode == "min" else value > best

    def score(self, value: float) -> float:
        """The score a new best is kept with: NaN as the worst value there is."""
        if math.isnan(value):
            return math.inf if self.mode == "min" else -math.inf
        return float(value)

    def best_of(self, scores: dict[Any, float]) -> Any:
        """The key of the best score (None when there is none)."""
        if not scores:
            return None
        return (min if self.mode == "min" else max)(scores, key=scores.get)


def bring_best_files(named: dict[str, Any], directory: Path) -> dict[Path, Any]:
    """The best checkpoints a resumed checkpoint names (path -> score), in `directory`: copied there when they lie
    elsewhere, dropped with a warning when gone (the module docstring's rule)."""
    kept: dict[Path, Any] = {}
    for path, score in (named or {}).items():
        source = Path(path)
        if not source.is_file():
            log.warning("resume: the best checkpoint %s named by the resumed checkpoint is missing; the best is "
                        "chosen among the validations from here on", source)
            continue
        target = directory / source.name
        if source.resolve() != target.resolve():
            directory.mkdir(parents=True, exist_ok=True)
            with atomic_write(target) as f, source.open("rb") as src:
                shutil.copyfileobj(src, f)
            log.info("resume: copied the best checkpoint %s to %s", source, target)
        kept[target] = score
    return kept


__all__ = ["CheckpointPolicy", "bring_best_files"]
