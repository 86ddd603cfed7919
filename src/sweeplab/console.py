"""What sweeplab's entry points print: sweeplab's own lines, not the libraries' tips, banners and deprecation notes.

`quiet_libraries()` is called once by every entry point (train, profile, bench, export) and by every job's process
(joblib/loky workers and submitit jobs run the task function, not the module's top level). Each filter names the one
message it drops, so a warning we have not seen before still shows.
"""

from __future__ import annotations

import logging
import warnings

# (logger name, message start): Lightning's start-up banner, its advertisement, its note that a whole split is used
_DROPPED_LOG_LINES = {
    "lightning.pytorch.utilities.rank_zero": (
        "GPU available:", "TPU available:", "HPU available:", "💡 Tip:", "You are using a CUDA device",
        "`Trainer(limit_val_batches=1.0)` was configured", "`Trainer(limit_train_batches=1.0)` was configured",
    ),
    "lightning.fabric.utilities.rank_zero": ("GPU available:", "TPU available:", "💡 Tip:"),
}
# warning message regexes: what the user can do nothing about
_IGNORED_WARNINGS = (
    r"'set_vital' is deprecated",  # torchdata 0.11 on torch >= 2.10, in every DataLoader
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",  # Lightning 2.6 on torch >= 2.10
    r"The specified dataset source can be interpreted in multiple ways",  # MLflow, a local path
)


class _DropLines(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


def quiet_libraries() -> None:
    """Install the filters (idempotent) and route Lightning's log lines through the root logger only once."""
    for pattern in _IGNORED_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    for name, prefixes in _DROPPED_LOG_LINES.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropLines) for f in logger.filters):
            logger.addFilter(_DropLines(prefixes))
    # Lightning adds console handlers of its own; with the root's (Hydra's or basicConfig's) every line came twice
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)  # "Creating initial MLflow database tables"
    logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)  # its start/stop lines
