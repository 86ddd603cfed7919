"""Ctrl-C and SIGTERM: the run they stop ends KILLED and the process exits with 128 + the signal (130, 143).

Left alone, neither ends well. Python turns SIGINT into KeyboardInterrupt, which Lightning's trainer catches and
turns into `sys.exit(1)`; SIGTERM's default action ends the process on the spot (its run stays RUNNING), and while
Lightning's handler is in place fit ends with `SIGTERMException`, a SystemExit with status 0 (SLURM, `timeout` and
`docker stop` read that as success). `install()` (the entry points call it first) makes both signals raise
`Interrupted` instead, a BaseException that is no KeyboardInterrupt and no SystemExit: Lightning's trainer runs its
own shutdown for it (callbacks' on_exception, the logger's finalize, teardown, DDP children stopped) and re-raises
it, `JobRun` ends the run KILLED, the sweep callback closes its parent run, and the entry point exits with
`exit_status`.

Cooperation with other handlers: Lightning chains the SIGTERM handler it finds behind its own notifier and puts it
back after every fit, so its DDP and SLURM logic still sees the signal. SIGUSR1/SIGUSR2 (Lightning's and submitit's
requeue signals) are left alone, and submitit's job processes never call `install()` (they start through submitit's
own entry point, whose SIGTERM bypass and SIGUSR2 checkpoint-and-requeue stay as they are).

Only the first signal interrupts: later ones, while the run is being closed, are reported and ignored (as Lightning
ignores a second Ctrl-C), so the run cannot be left RUNNING by an impatient second Ctrl-C; kill -9 still works.
"""

from __future__ import annotations

import signal
import sys
import threading

HANDLED = (signal.SIGINT, signal.SIGTERM)
_first_signal: int | None = None


class Interrupted(BaseException):
    """SIGINT or SIGTERM asked the process to stop."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}")

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


def _raise_interrupted(signum: int, frame) -> None:
    global _first_signal
    if _first_signal is not None:
        print(
            f"{signal.Signals(signum).name} ignored: already stopping after {signal.Signals(_first_signal).name}, "
            "closing the MLflow run",
            file=sys.stderr,
            flush=True,
        )
        return
    _first_signal = signum
    raise Interrupted(signum)


def install() -> None:
    """Make SIGINT and SIGTERM raise `Interrupted` in this (main) thread."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in HANDLED:
        signal.signal(signum, _raise_interrupted)


def is_interrupt(exc: BaseException) -> bool:
    """An exception that stops a run without it having failed: the run ends KILLED, not FAILED."""
    return not isinstance(exc, Exception)  # Interrupted, KeyboardInterrupt, SystemExit (Lightning's SIGTERMException)
