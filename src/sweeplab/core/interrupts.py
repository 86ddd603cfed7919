"""Ctrl-C, SIGTERM and SIGHUP: the run they stop ends KILLED and the process exits with 128 + the signal (130, 143, 129).

Left alone, none ends well. Python turns SIGINT into KeyboardInterrupt, which Lightning's trainer catches and turns
into `sys.exit(1)`; SIGTERM's and SIGHUP's default action ends the process on the spot (its run stays RUNNING), and
while Lightning's handler is in place fit ends with `SIGTERMException`, a SystemExit with status 0 (SLURM, `timeout`
and `docker stop` read that as success). `install()` (the entry points call it first) puts `_on_signal` in place.

A stop request is recorded, then acted on at a safe point. The handler records the first signal (`requested()`); the
code that runs the job calls `check()` at its safe points, which raises `Interrupted` there: a BaseException that is
no KeyboardInterrupt and no SystemExit, raised from sweeplab's own code, so no weakref callback, `__del__` or
library's bare `except:` can swallow it. Lightning's trainer runs its own shutdown for it (callbacks' on_exception,
the logger's finalize, teardown, DDP children stopped) and re-raises it, `JobRun` ends the run KILLED, the sweep
callback closes its parent run, and the entry point exits with `exit_status`. The safe points: every training batch's
end, validation's start, batches and end, a checkpoint's save (callbacks/stop.py; the MLX loop: every step and
validation), and the stages of a job (training.train, job.start_fit, job.finish: before the export, before uploads).

Two modes. Inside `at_safe_points()` (the fit loops, `job.finish`) the handler only records. Outside it (imports,
config, data indexing, opening the MLflow run: code with no loop to check a flag, possibly blocked in a read) the
handler also raises `Interrupted` at once, as it always did; should that exception be swallowed where it lands, the
request stays recorded and the next stage check (or the fit loop's first safe point) raises it again, so it is never
lost.

A second signal before the first was acted on (the job is inside a stage that cannot look at the flag: coremltools'
convert, a torch.compile, an upload) raises `Interrupted` at once, skipping what is left of that stage and the
stages after it; the exit status stays the first signal's. Once `Interrupted` has been raised the run is being closed
(KILLED): later signals are reported and ignored, so an impatient second Ctrl-C cannot leave the run RUNNING; kill -9
still works.

SIGHUP (a closed terminal, a dropped SSH session) is handled like SIGTERM, unless it was ignored when the process
started (`nohup`): then it stays ignored.

Cooperation with other handlers: Lightning chains the SIGTERM handler it finds behind its own notifier and puts it
back after every fit, so its DDP and SLURM logic still sees the signal (a `SIGTERMException` it raises itself is turned
into `Interrupted` by sweeplab.engine.lightning_fit). SIGUSR1/SIGUSR2 (Lightning's and submitit's requeue signals) are left
alone, and submitit's job processes never call `install()` (they start through submitit's own entry point, whose
SIGTERM bypass and SIGUSR2 checkpoint-and-requeue stay as they are).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_requested: int | None = None  # the first signal's number, once one came
_stopping = False  # Interrupted has been raised: the run is being closed
_deferred = 0  # > 0 inside at_safe_points(): the handler only records


class Interrupted(BaseException):
    """SIGINT, SIGTERM or SIGHUP asked the process to stop."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}")

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


def _say(text: str) -> None:
    """One line on stderr from a signal handler: a plain write(2), no buffered stream that the handler may have
    interrupted in the middle of a write."""
    with contextlib.suppress(OSError):
        os.write(2, f"{text}\n".encode())


def _on_signal(signum: int, frame) -> None:
    global _requested, _stopping
    name = signal.Signals(signum).name
    if _stopping:
        _say(f"{name} ignored: already stopping after {signal.Signals(_requested).name}, closing the MLflow run")
        return
    if _requested is None:
        _requested = signum
        if _deferred:
            _say(f"{name}: stopping at the next safe point (a second signal skips what is left)")
            return
    else:
        _say(f"{name}: stopping now after {signal.Signals(_requested).name}, skipping what is left")
    _stopping = True
    raise Interrupted(_requested)


def requested() -> int | None:
    """The signal that asked the process to stop, or None."""
    return _requested


def check() -> None:
    """A safe point: raise `Interrupted` if a stop was requested."""
    global _stopping
    if _requested is not None:
        _stopping = True
        raise Interrupted(_requested)


@contextlib.contextmanager
def at_safe_points() -> Iterator[None]:
    """Code that calls `check()` often enough: inside, a signal is only recorded; checked again on the way in and out."""
    check()
    with deferred():
        yield
    check()


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Code that must not be cut in the middle (a write to the run's store: a signal landing inside sqlite's write
    leaves its connection holding the write lock, and closing the run then waits on it for ever): inside, a signal is
    only recorded; the caller's next `check()` acts on it. Unlike `at_safe_points`, nothing is checked on the way in
    (it also serves `finally` blocks that run while `Interrupted` is on its way) nor out."""
    global _deferred
    _deferred += 1
    try:
        yield
    finally:
        _deferred -= 1


@contextlib.contextmanager
def uncut() -> Iterator[None]:
    """One write to a store that must not be cut in the middle (every MLflow client write: tracking.mlflow_store): a
    signal inside is recorded, then acted on right after the write (inside `deferred` or `at_safe_points`: at their
    next check, as there). Once the run is being closed (`Interrupted` raised), nothing more is raised."""
    with deferred():
        yield
    if not _deferred and _requested is not None and not _stopping:
        check()


def install() -> None:
    """Put `_on_signal` in place for SIGINT, SIGTERM and SIGHUP (not SIGHUP when it is ignored, as under nohup), in
    this (main) thread."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in HANDLED:
        if signum == signal.SIGHUP and signal.getsignal(signum) == signal.SIG_IGN:
            continue
        signal.signal(signum, _on_signal)


@contextlib.contextmanager
def exit_on_interrupt(what: str) -> Iterator[None]:
    """For an entry point with no run to close (the report, the data preparation, the round trip): SIGINT, SIGTERM
    or SIGHUP inside ends the process with one line and 128 + the signal (130 for Ctrl-C), no traceback; the
    `finally` blocks and context managers below run first, so temporary files are removed and nothing is left
    half-written. `what`: the entry point, for the line."""
    def stop(signum: int, frame) -> None:
        global _requested
        if _requested is None:
            _requested = signum
        raise Interrupted(signum)

    def end(signum: int) -> SystemExit:
        _say(f"error: {what}: interrupted by {signal.Signals(signum).name}; nothing was left half-written")
        return SystemExit(128 + signum)

    if _requested is not None:  # came while the entry point was imported (and was swallowed there)
        raise end(_requested)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.signal(s, stop) for s in HANDLED if signal.getsignal(s) != signal.SIG_IGN}
    try:
        yield
    except (Interrupted, KeyboardInterrupt) as exc:
        raise end(getattr(exc, "signum", signal.SIGINT)) from None
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if _requested is not None:  # a library swallowed the exception: the signal still ends the process
        raise end(_requested)


def remember_early_sigint() -> None:
    """`python -m sweeplab.<entry>`, from sweeplab/__init__, before anything heavy is imported: Ctrl-C raises
    KeyboardInterrupt as Python's own handler does, and is remembered, so one that a library swallows while it is
    imported (torchao's extension loader catches everything) still stops the entry point once it installs its own
    handling (`install`, `exit_on_interrupt`)."""
    def early(signum: int, frame) -> None:
        global _requested
        if _requested is None:
            _requested = signum
        raise KeyboardInterrupt

    def last_resort(kind, value, traceback) -> None:  # the interrupt escaped everything: one line, 128 + signal
        if not issubclass(kind, (KeyboardInterrupt, Interrupted)):
            return previous_hook(kind, value, traceback)
        signum = getattr(value, "signum", signal.SIGINT)
        argv = getattr(sys, "orig_argv", [])
        app = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else "sweeplab"
        _say(f"error: {app}: interrupted by {signal.Signals(signum).name}")
        os._exit(128 + signum)

    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, early)
    previous_hook = sys.excepthook
    sys.excepthook = last_resort


def reset() -> None:
    """Forget a stop request (tests that run several jobs in one process)."""
    global _requested, _stopping, _deferred
    _requested, _stopping, _deferred = None, False, 0


def is_interrupt(exc: BaseException) -> bool:
    """An exception that stops a run without it having failed: the run ends KILLED, not FAILED."""
    return not isinstance(exc, Exception)  # Interrupted, KeyboardInterrupt, SystemExit (Lightning's SIGTERMException)



def run_child(command: list[str], name: str, **popen_kwargs) -> int:
    """Run `command` to its end and return its exit status; SIGINT, SIGTERM and SIGHUP sent to this process meanwhile
    are passed on to it (it stops at its own safe points and closes its MLflow runs), it is waited for, and then
    `Interrupted` is raised here with the first signal, so the caller stops too and exits with 128 + that signal.

    The child runs in its own process group, so a terminal's Ctrl-C reaches it once, through this process, not twice
    (a second signal would make it skip its closing stages). A signal this process ignores (SIGHUP under nohup) stays
    ignored, and the child inherits that. For local child processes only: a job a cluster scheduler owns is stopped
    through the scheduler, not from here (the submitit launcher's jobs are never a child of this process)."""
    import subprocess

    received: list[int] = []
    children: list[subprocess.Popen] = []

    def forward(signum: int, frame) -> None:
        if not received:
            _say(f"{signal.Signals(signum).name}: passed on to the {name}; waiting for it to end")
        received.append(signum)
        if children and children[0].poll() is None:
            children[0].send_signal(signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.signal(s, forward) for s in HANDLED if signal.getsignal(s) != signal.SIG_IGN}
    try:
        from sweeplab.core.orphans import child_env  # the child ends with this process, kill -9 included

        popen_kwargs["env"] = child_env(popen_kwargs.get("env"))
        children.append(subprocess.Popen(command, process_group=0, **popen_kwargs))
        for signum in received:  # came while it started
            children[0].send_signal(signum)
        status = children[0].wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if children and children[0].poll() is None:  # torn down by something else: leave no orphan behind
            children[0].kill()
            children[0].wait()
    if received:
        raise Interrupted(received[0])
    return status
