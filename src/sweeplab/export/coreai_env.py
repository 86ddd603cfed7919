"""Can this interpreter export to Core AI? A cheap answer (no import of the packages), for the config checks.

`options_from_config` asks it for `export.format=coreai`, so the training app refuses such a job before training
and the export app before loading the checkpoint, in one line that says how to install the extra.
"""

from __future__ import annotations

import importlib.util
import platform
import sys

MIN_PYTHON = (3, 11)
# the import names of the `coreai` extra (pyproject.toml): converter, runtime binding, compression
PACKAGES = {"coreai_torch": "coreai-torch", "coreai": "coreai-core", "coreai_opt": "coreai-opt"}
INSTALL = "pip install 'sweeplab[coreai]' (make install does where wheels exist: Linux x86_64, macOS arm64)"


def _wheel_platform() -> bool:
    machine = platform.machine().lower()
    return (sys.platform == "linux" and machine in ("x86_64", "amd64")) or (sys.platform == "darwin" and machine == "arm64")


def missing(version: tuple[int, ...] | None = None) -> str | None:
    """Why `export.format=coreai` cannot run here (one line), or None. `version`: the Python version to judge
    (this interpreter's by default)."""
    version = tuple(version or sys.version_info[:2])
    if version[:2] < MIN_PYTHON:
        return (f"needs Python >= {MIN_PYTHON[0]}.{MIN_PYTHON[1]} (Apple's coreai wheels); this is "
                f"{version[0]}.{version[1]}: use export.format=coreml or a newer Python")
    absent = [dist for module, dist in PACKAGES.items() if importlib.util.find_spec(module) is None]
    if absent:
        where = "" if _wheel_platform() else f" (Apple publishes wheels for Linux x86_64 and macOS arm64 only; this is {sys.platform} {platform.machine()})"
        return f"{', '.join(absent)} not installed: {INSTALL}{where}"
    return None


__all__ = ["INSTALL", "MIN_PYTHON", "missing"]
