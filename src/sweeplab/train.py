"""The training app: `python -m sweeplab.train [overrides]`, `-m` for sweeps. See conf/train.yaml."""

from __future__ import annotations

import difflib
import logging
import os
import sys

import hydra
from omegaconf import DictConfig

from sweeplab import CONF_DIR, channels, interrupts, sweep_callback
from sweeplab.console import quiet_libraries
from sweeplab.errors import ConfigError, UserError, exit_on_user_error, is_user_error, user_message
from sweeplab.families import missing_config_hint

log = logging.getLogger("sweeplab")
quiet_libraries()


def _in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
def main(cfg: DictConfig) -> float | None:
    # deferred: training imports torch and Lightning (seconds): a config error fails without them, and run() has
    # installed the signal handlers before they load
    from sweeplab.training import record_failed_job, train

    quiet_libraries()  # again: a joblib/loky worker or a submitit job runs this function, not the module's top
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


def composition_error(exc: Exception) -> UserError:
    """Hydra's composition errors (a misspelt key or option on the command line) as sweeplab's one line."""
    cause = exc.__cause__
    full_key = getattr(cause, "full_key", None)
    parent = getattr(cause, "parent_node", None)
    if full_key and parent is not None and hasattr(parent, "keys"):  # `model.freze=trunk`: not a key of the group
        key = str(getattr(cause, "key", full_key.rsplit(".", 1)[-1]))
        close = difflib.get_close_matches(key, [str(k) for k in parent.keys()], n=1)
        hint = f"did you mean {full_key.rsplit('.', 1)[0] + '.' if '.' in full_key else ''}{close[0]}? " if close else ""
        return ConfigError(full_key, f"unknown key; {hint}(`+{full_key}=...` adds a new key)")
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    if "Available options in" in str(exc):  # `model=textbrige`: name the options
        start = next(i for i, line in enumerate(lines) if line.startswith("Available options in"))
        options = [line for line in lines[start + 1 :] if not line.startswith(("Config search path", "provider="))]
        text += f"; available: {', '.join(options)}"
    if (hint := missing_config_hint(str(exc))) is not None:  # a registered family's configs out of Hydra's sight
        text += f"; {hint}"
    return UserError(f"config error: {text.removeprefix('In ' + repr('train') + ': ')}")


def run() -> None:
    interrupts.install()  # before anything slow: a SIGTERM while imports or data indexing run ends cleanly too
    from hydra.errors import HydraException

    # Hydra prints a composition error as 4 lines and exits 1 unless HYDRA_FULL_ERROR lets it reach us
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    try:
        main()
    except HydraException as exc:
        if exc.__class__.__name__ not in ("ConfigCompositionException", "MissingConfigException"):
            raise
        exit_on_user_error(composition_error(exc))
    except interrupts.Interrupted as exc:
        # the job's run is KILLED already (JobRun); the sweep's parent is closed here, as Hydra calls no callback
        # when a job raises more than an Exception
        sweep_callback.end_interrupted_sweep(exc)
        print(f"error: {exc}; the MLflow runs it stopped are marked KILLED", file=sys.stderr)
        sys.exit(exc.exit_status)

    failed = channels.failed_jobs
    if failed:
        print(f"error: {failed} job(s) of the sweep failed; see the report above and each run's `error` tag", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    run()
