"""`backend.mps_fallback`: PyTorch's `PYTORCH_ENABLE_MPS_FALLBACK`, put in the environment before torch is imported.

torch reads the variable once, when its library loads: `TORCH_LIBRARY_IMPL(_, MPS, m)` in
aten/src/ATen/mps/MPSFallback.mm registers, at static initialisation, either the CPU fallback for every op MPS lacks
(the variable holds an integer other than 0, parsed with `std::stoi`) or an error. Setting it once torch is imported
does nothing. So the switch is read from the command line when the `sweeplab` package is imported as the parent of
a `python -m sweeplab.<app>` entry point (sweeplab/__init__.py), which runpy does before the app's module runs, so
before any of its imports (sweeplab.bench imports torch at its top). The plan refuses a job whose
`backend.mps_fallback` disagrees with what torch loaded (`backends.check_mps_fallback`).

This module imports no torch.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence

ENV_VAR = "PYTORCH_ENABLE_MPS_FALLBACK"
OVERRIDE_KEY = "backend.mps_fallback"


def requested(argv: Sequence[str]) -> bool | None:
    """The value of the last `backend.mps_fallback=true|false` override in `argv` (Hydra's `+`/`++` prefixes
    accepted, booleans case-insensitive as Hydra reads them); None when there is none or it sweeps several values."""
    value = None
    for arg in argv:
        key, sep, text = arg.partition("=")
        if sep and key.lstrip("+") == OVERRIDE_KEY:
            value = {"true": True, "false": False}.get(text.strip().lower())
    return value


def set_before_torch(argv: Sequence[str]) -> None:
    """Put the command line's `backend.mps_fallback` into the environment torch reads at import ("1" or "0"); nothing
    once torch is imported (too late: the plan then refuses a job that asks for the fallback) or without the
    override (the shell's own variable, if any, stands)."""
    if "torch" in sys.modules:
        return
    value = requested(argv)
    if value is not None:
        os.environ[ENV_VAR] = "1" if value else "0"


def in_effect() -> bool:
    """Whether torch runs missing MPS ops on the CPU: the variable as torch parses it (`std::stoi`: a leading
    integer; other than 0 is on). Valid once torch is imported, as sweeplab only sets the variable before that."""
    match = re.match(r"\s*[+-]?\d+", os.environ.get(ENV_VAR, ""))
    return bool(match) and int(match.group()) != 0
