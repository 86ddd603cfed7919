"""sweeplab: Hydra-configured experiment sweeps for training-acceleration studies."""

from pathlib import Path

# The Hydra config tree every entry point composes from (train, export, bench, order check, run names' defaults).
CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")
