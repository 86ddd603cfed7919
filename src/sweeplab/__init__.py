"""sweeplab: Hydra-configured experiment sweeps for training-acceleration studies."""

from pathlib import Path

# The Hydra config tree every entry point composes from (train, export, bench, order check, run names' defaults):
# inside the package in an installed wheel (setup.py copies it there), the checkout's top-level conf/ otherwise.
_PACKAGED_CONF = Path(__file__).resolve().parent / "conf"
CONF_DIR = str(_PACKAGED_CONF if _PACKAGED_CONF.is_dir() else Path(__file__).resolve().parents[2] / "conf")
