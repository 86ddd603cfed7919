"""The host's architecture as the run records it, and the one combination refused outright: an x86_64 Python run by
Rosetta 2 on Apple silicon.

Such a Python needs an x86_64 torch, and torch has published no macOS x86_64 wheel since 2.2, below sweeplab's torch
range, so the install fails (or an older torch runs MPS through Rosetta, about 2x slower than natively); MLX's Metal
wheel is arm64-only. macOS says whether a process
is translated through `sysctlbyname("sysctl.proc_translated")`: 1 under Rosetta, 0 native, and no such key (ENOENT)
on an Intel Mac without Rosetta (Apple, "About the Rosetta translation environment").

This module imports no torch: `python -m sweeplab.<app>` refuses before anything heavy loads (sweeplab/__init__.py).
"""

from __future__ import annotations

import platform
import sys

from sweeplab.core.errors import UserError
from sweeplab.core.records import JobRun


def proc_translated() -> int | None:
    """`sysctl.proc_translated` of this process: 1 under Rosetta, 0 native; None off macOS or where macOS has no such
    key."""
    if sys.platform != "darwin":
        return None
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    value = ctypes.c_int(0)
    size = ctypes.c_size_t(ctypes.sizeof(value))
    if libc.sysctlbyname(b"sysctl.proc_translated", ctypes.byref(value), ctypes.byref(size), None, ctypes.c_size_t(0)):
        return None
    return value.value


def check_native() -> None:
    """Refuse an x86_64 Python under Rosetta on Apple silicon in one line (UserError)."""
    if proc_translated() == 1:
        raise UserError(
            f"this Python is {platform.machine()} run by Rosetta 2 on Apple silicon (sysctl.proc_translated=1): torch "
            "has no macOS x86_64 build for sweeplab, and MPS and MLX need an arm64 Python; install an arm64 Python "
            "(`python3 -c 'import platform; print(platform.machine())'` prints arm64)"
        )


def exit_if_translated() -> None:
    """`check_native` for an entry point: one `error:` line on stderr and exit status 2."""
    try:
        check_native()
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


def host_record() -> JobRun:
    """`platform.machine` (what this Python was built for: arm64, x86_64) and, on macOS, `rosetta` (true or false)."""
    translated = proc_translated()
    return JobRun(platform_machine=platform.machine(), rosetta=translated == 1 if translated is not None else None)
