"""The training app: `python -m sweeplab.train [overrides]`, `-m` for sweeps. See conf/train.yaml."""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path

import hydra
from omegaconf import DictConfig

from sweeplab import interrupts
from sweeplab.errors import exit_on_user_error, is_user_error, user_message

CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")
log = logging.getLogger("sweeplab")
warnings.filterwarnings("ignore", message="'set_vital' is deprecated")  # torchdata 0.11 on torch >= 2.10


def _in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
def main(cfg: DictConfig) -> float | None:
    from sweeplab.training import record_failed_job, train

    # Lightning adds its own console handlers; Hydra's root handlers already print (and file) its messages.
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
    # INFO "Creating initial MLflow database tables"; ERROR: a traceback for every database error it then raises
    # anyway (read-only, locked, full), which mlflow_store reports in one line
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)

    try:
        return train(cfg)
    except Exception as exc:
        expected = is_user_error(exc)
        if _in_multirun():
            # One failed job must not end the sweep: it is recorded as a FAILED run (reason in its `error` tag),
            # the other jobs run, the report lists it and the sweep's exit code says so.
            log.error("job failed: %s", user_message(exc) if expected else f"{type(exc).__name__}: {exc}", exc_info=not expected)
            record_failed_job(cfg, exc)
            return None
        exit_on_user_error(exc)


def run() -> None:
    interrupts.install()  # before anything slow: a SIGTERM while imports or data indexing run ends cleanly too
    from sweeplab.tracking import sweep_callback

    try:
        main()
    except interrupts.Interrupted as exc:
        # the job's run is KILLED already (JobRun); the sweep's parent is closed here, as Hydra calls no callback
        # when a job raises more than an Exception
        sweep_callback.end_interrupted_sweep(exc)
        print(f"error: {exc}; the MLflow runs it stopped are marked KILLED", file=sys.stderr)
        sys.exit(exc.exit_status)

    failed = getattr(sweep_callback, "FAILED_JOBS", 0)
    if failed:
        print(f"error: {failed} job(s) of the sweep failed; see the report above and each run's `error` tag", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    run()
