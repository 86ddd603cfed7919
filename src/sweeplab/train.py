"""The training app: `python -m sweeplab.train [overrides]`, `-m` for sweeps. See conf/train.yaml."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from sweeplab.errors import is_user_error

CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")
log = logging.getLogger("sweeplab")


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
def main(cfg: DictConfig) -> float | None:
    from sweeplab.training import train

    # Lightning adds its own console handlers; Hydra's root handlers already print (and file) its messages.
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True

    try:
        return train(cfg)
    except Exception as exc:
        if not is_user_error(exc):
            raise
        log.error("%s", exc)
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
