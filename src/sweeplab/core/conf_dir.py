"""Where sweeplab's Hydra config tree is: the one directory every entry point composes from (train, export, bench,
profile, order check, run names' defaults). Re-exported as `sweeplab.CONF_DIR`."""

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]  # src/sweeplab, or site-packages/sweeplab in a wheel
# inside the package in an installed wheel (setup.py copies it there), the checkout's top-level conf/ otherwise
CONF_DIR = str(_PACKAGE / "conf" if (_PACKAGE / "conf").is_dir() else _PACKAGE.parents[1] / "conf")

__all__ = ["CONF_DIR"]
