"""sweeplab: Hydra-configured experiment sweeps for training-acceleration studies."""

import sys

from sweeplab.core.conf_dir import CONF_DIR  # the Hydra config tree every entry point composes from

# `python -m sweeplab.<app>`: runpy imports this package before the app's module, with sys.argv[0] still "-m"
# (it becomes the module's path before the module runs), so this is the one place that runs before any app's
# imports, torch's included; torch reads PYTORCH_ENABLE_MPS_FALLBACK only when it loads (sweeplab/core/mps_fallback.py).
# An ordinary `import sweeplab` (tests, notebooks, another program) sees another argv[0] and changes nothing.
if getattr(sys, "argv", [])[:1] == ["-m"]:
    # deferred: only an app run with -m sets the env var, before its imports load torch
    from sweeplab.core.host_arch import exit_if_translated
    from sweeplab.core.interrupts import remember_early_sigint
    from sweeplab.core.mps_fallback import set_before_torch

    remember_early_sigint()  # Ctrl-C while torch and the rest are imported is not lost (core.interrupts)
    exit_if_translated()  # an x86_64 Python under Rosetta: one line, before torch (which it cannot have) loads
    set_before_torch(sys.argv[1:])

__all__ = ["CONF_DIR"]
