"""A Hydra callback that checks the run's (or sweep's) output directory is writable before Hydra itself writes there.

Hydra creates the directory inside its own error handler, which prints a traceback and exits 1 on a read-only or
foreign path; this runs first and ends in one `error:` line and exit status 2, like every other bad input.
"""

from __future__ import annotations

from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from sweeplab.core.errors import exit_on_user_error
from sweeplab.core.files import check_writable_dir


class WritableOutputDir(Callback):
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check(config.hydra.run.dir)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check(config.hydra.sweep.dir)


def _check(directory: str) -> None:
    try:
        check_writable_dir(directory)
    except OSError as exc:
        exit_on_user_error(exc)
