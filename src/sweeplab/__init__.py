"""sweeplab: Hydra-configured experiment sweeps for training-acceleration studies."""

from pathlib import Path

# The Hydra config tree every entry point composes from (train, export, bench, order check, run names' defaults).
# It lives inside the package, so an installed wheel carries it; the checkout's top-level conf/ links here.
CONF_DIR = str(Path(__file__).resolve().parent / "conf")
