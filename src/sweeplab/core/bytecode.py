"""Whether this Python compiles the heavy libraries' sources again at every start.

Python caches each module's compiled bytecode in `__pycache__/*.pyc` and reads it at the next import. `pip install`
writes those files at install time; uv does not unless told (`--compile-bytecode`, UV_COMPILE_BYTECODE=1), and a
container image often ships none and sets `PYTHONDONTWRITEBYTECODE=1` (a common Dockerfile line), so every process
compiles torch's, Lightning's, sympy's... sources again. On an H100 host of that kind `import
sweeplab.engine.training` took 14-24 s, ~10 s of it in `compile()`, and 10.5-12.6 s once the same environment's
bytecode was compiled: in every `python -m sweeplab.train` and in every worker of a multi-GPU sweep
(docs/study-cost.md, "Python's bytecode").

This module imports no torch: it answers before the imports it is about.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import sys

#: the packages whose import dominates a sweeplab process's start
HEAVY_PACKAGES = ("torch", "lightning", "sympy")


def _cache_writable(cached: str) -> bool:
    """Whether this process could write `cached` (its __pycache__ folder, or the folder that would hold it)."""
    folder = os.path.dirname(cached)
    while folder and not os.path.isdir(folder):
        parent = os.path.dirname(folder)
        if parent == folder:
            return False
        folder = parent
    return bool(folder) and os.access(folder, os.W_OK)


def uncached_packages(packages: tuple[str, ...] = HEAVY_PACKAGES) -> list[str]:
    """The installed `packages` whose bytecode is neither cached nor cacheable: each import compiles their sources.

    A package counts when its `__init__`'s cached bytecode is missing and Python will not write it
    (`sys.dont_write_bytecode`, i.e. PYTHONDONTWRITEBYTECODE or -B, or a read-only folder). A missing file Python may
    write costs only the first process, so it does not count."""
    found = []
    for name in packages:
        try:
            spec = importlib.util.find_spec(name)  # a top-level name: found, not imported
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.cached or os.path.exists(spec.cached):
            continue
        if sys.dont_write_bytecode or not _cache_writable(spec.cached):
            found.append(name)
    return found


def uncached_warning(packages: list[str]) -> str | None:
    """One line for the log when `packages` (from `uncached_packages`) is not empty: what it costs and the fix."""
    if not packages:
        return None
    why = "PYTHONDONTWRITEBYTECODE is set" if sys.dont_write_bytecode else "their __pycache__ folders are read-only"
    sites = dict.fromkeys(os.path.dirname(os.path.dirname(importlib.util.find_spec(name).origin)) for name in packages)
    return (
        f"Python compiles {', '.join(packages)}'s sources at every start here (no cached bytecode, and {why}): each "
        f"sweeplab process and sweep worker starts seconds slower (an H100 host: its imports 14-24 s, 10.5-12.6 s "
        f"compiled); compile them once with `{os.path.basename(sys.executable)} -m compileall -q -j 0 "
        f"{' '.join(sites)}` (what pip install does; uv: --compile-bytecode)"
    )


@functools.cache
def warn_once(log: logging.Logger) -> None:
    """`uncached_warning` as a log warning, once per process (a sweep's jobs in one process share it)."""
    message = uncached_warning(uncached_packages())
    if message:
        log.warning(message)
