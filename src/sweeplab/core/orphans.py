"""Processes sweeplab starts end with the process that started them, `kill -9` of it included.

A process killed with SIGKILL runs no handler, so its children (DataLoader workers, a joblib sweep's loky workers,
the export's isolated child, an order check's sweeps) must notice on their own. On Linux the kernel tells them: the
parent-death signal (`prctl(PR_SET_PDEATHSIG)`), set in the child, is sent when the thread that started it ends
(`die_with_parent`; for children started from a thread that lives as long as they need it, as the DataLoader's and
a subprocess call's). A child whose starting thread may end before its parent (a loky worker is started from the
executor's manager thread) watches its parent's pid from a thread instead (`watch_parent`); so does every child on
a system without prctl.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

from sweeplab.core.channels import PARENT_PID_ENV

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
WATCH_INTERVAL_S = 0.2


def die_with_parent(parent_pid: int | None = None) -> None:
    """End this process (SIGKILL) when its parent ends. `parent_pid`: the pid expected as parent (default: the
    current one); a parent already gone by the time this runs ends this process at once."""
    parent = parent_pid if parent_pid is not None else os.getppid()
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
                if os.getppid() != parent:  # it ended before the signal was armed
                    os.kill(os.getpid(), signal.SIGKILL)
                return
        except (OSError, AttributeError):
            pass
    watch_parent(parent)


def watch_parent(parent_pid: int | None = None, interval_s: float = WATCH_INTERVAL_S) -> None:
    """A daemon thread that ends this process (SIGKILL: its own children then get their parent-death signal) once
    its parent is no longer `parent_pid` (it was reparented: the parent ended)."""
    parent = parent_pid if parent_pid is not None else os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="sweeplab-parent-watch", daemon=True).start()


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a child that is to die with this process (`die_with_parent_if_asked` in the child)."""
    return {**(os.environ if env is None else env), PARENT_PID_ENV: str(os.getpid())}


def die_with_parent_if_asked() -> None:
    """In a sweeplab entry point: die with the parent that started it with `child_env` (the variable is removed,
    so this process's own children are not tied to its parent)."""
    value = os.environ.pop(PARENT_PID_ENV, None)
    if value and value.isdigit():
        die_with_parent(int(value))


def watch_launcher(launcher_pid_env: str) -> None:
    """In a job's process: when it is a pool worker of the process that launched the sweep (the pid in
    `launcher_pid_env`; joblib's loky workers, started from a thread that may end first), watch that parent. A job
    a launcher starts to outlive it (submitit's, local ones included) is left alone: it closes its own run."""
    import multiprocessing

    launcher = os.environ.get(launcher_pid_env, "")
    pool_worker = (multiprocessing.current_process().name.startswith("LokyProcess")
                   or multiprocessing.parent_process() is not None)
    if pool_worker and launcher.isdigit() and int(launcher) != os.getpid() and os.getppid() == int(launcher):
        if not getattr(watch_launcher, "started", False):
            watch_launcher.started = True
            watch_parent(int(launcher))


# The reaper of a process group that is no sweeplab process (the UI's `mlflow server` and its uvicorn workers, in a
# group of their own): a tiny Python process that waits for its parent to end, however it ends (kill -9 included:
# the server's group is not the parent's, so the parent-death signal of one process would leave its workers
# serving), then stops the group, SIGTERM and SIGKILL 10 s later. It imports nothing but the standard library.
_REAPER = """
import os, signal, sys, time
parent, group = int(sys.argv[1]), int(sys.argv[2])
while os.getppid() == parent:
    time.sleep(0.3)
for signum, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 0.0)):
    try:
        os.killpg(group, signum)
    except OSError:
        break
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except OSError:
            sys.exit(0)
        time.sleep(0.2)
"""


def reap_group_with_this_process(group: int) -> None:
    """Stop process group `group` once this process ends, however it ends (`_REAPER`, a child of this process in
    its own session: Ctrl-C at the terminal does not reach it; the group it stops is stopped by this process
    itself on an orderly end, and then the reaper finds it gone and exits)."""
    import subprocess

    subprocess.Popen([sys.executable, "-S", "-c", _REAPER, str(os.getpid()), str(group)], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)
