"""What sweeplab's entry points print: sweeplab's own lines, not the libraries' tips, banners and deprecation notes.

`quiet_libraries()` is called once by every entry point (train, report, profile, bench, export), by every job's
process (joblib/loky workers and submitit jobs run the task function, not the module's top level) and by every
Lightning fit (Lightning adds a console handler of its own when it is first imported, which may be after the entry
point's call). Each filter names the one message it drops, so a warning we have not seen before still shows; the
list of the lines sweeplab itself prints is held by tests/test_console.py.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

# (logger name, message start): Lightning's start-up banner, its advertisement, its echo of the validation limit and
# of mixed precision (the config and the run name say them), its line at the end of every fit (sweeplab's `done:`
# line says what ended) and on a resume (sweeplab's `resume: continuing ...` says it), the GPUs each fit sees (a
# sweep job's `cuda_visible_devices` tag has them); matplotlib's notes on its font cache
_DROPPED_LOG_LINES = {
    "lightning.pytorch.utilities.rank_zero": (
        "GPU available:", "TPU available:", "HPU available:", "💡 Tip:", "You are using a CUDA device",
        "`Trainer(limit_val_batches=", "`Trainer(limit_train_batches=", "`Trainer.fit` stopped:",
        "Using bfloat16 Automatic Mixed Precision", "Using 16bit Automatic Mixed Precision",
        "Restoring states from the checkpoint path at", "Restored all states from the checkpoint at",
    ),
    "lightning.pytorch.accelerators.cuda": ("LOCAL_RANK:",),
    "lightning.fabric.utilities.rank_zero": ("GPU available:", "TPU available:", "💡 Tip:"),
    "matplotlib.font_manager": ("generated new fontManager", "Matplotlib is building the font cache"),
    # coremltools 9.0, once per conversion (twice per export): the traced program's int64 token ids become the
    # package's int32 inputs, which sweeplab declares as such (export/convert.py): nothing for the user to do
    "coremltools": ("int64 dtype input ",),
    # torchao (the Core AI and speed extras), imported by the teacher's transformers in `make data`: on a CPU wheel
    # its CUDA kernels' libraries do not load, and torch notes its enums are natively supported now
    "torchao": ("Failed to load ",),
    "torch.utils._pytree": ("%s is an Enum subclass and is now natively supported",),
}
# warning message regexes: what the user can do nothing about
_IGNORED_WARNINGS = (
    r"'set_vital' is deprecated",  # torchdata 0.11 on torch >= 2.10, in every DataLoader
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",  # Lightning 2.6 on torch >= 2.10
    r"The specified dataset source can be interpreted in multiple ways",  # MLflow, a local path
    # Lightning on a host with more than 2 CPUs per device: data.num_workers is sweeplab's setting (0: the data is in
    # memory; the bench compares the loops with the same loader)
    r"The '\w+' does not have many workers which may be a bottleneck",
    # cuda_graph=true and steps_per_batch > 1 train with manual optimization, and Lightning then warns that checkpoints
    # hold the weights after the optimizer step: true of every run here, automatic optimization included
    r"Using ModelCheckpoint with manual optimization",
    # Lightning, when an epoch has fewer batches than trainer.log_every_n_steps: sweeplab runs count steps across
    # epochs, and Lightning logs every n-th step of the run whatever the epoch's length
    r"The number of training batches \(\d+\) is smaller than the logging interval",
    # Lightning, when a job's checkpoint folder holds files: a resumed job continues in its own folder on purpose
    r"Checkpoint directory .+ exists and is not empty",
    # Lightning, on any host with SLURM's `srun` on PATH (a cluster's login node) for a process not started by srun:
    # sweeplab decided where its jobs run (this process, its workers, or SLURM tasks through hydra/launcher=slurm,
    # where srun is used and Lightning detects SLURM), so the hint to prepend srun is never the user's to follow
    r"The `srun` command is available on your system but is not used",
)
# Kineto (torch.profiler's tracer, C++) writes `USDT: ... profiler_start` / `profiler_stop` around every trace at its
# default level; above its highest level (5) it writes nothing. Read once, when the process first profiles; a value
# the user sets wins.
_KINETO_QUIET = ("KINETO_LOG_LEVEL", "6")
# Hugging Face's progress bars (transformers' "Loading weights" in `make data`'s teacher, the hub's): read when
# huggingface_hub is first imported; sweeplab's own progress (console.progress) is its own. A value the user sets wins.
_HF_BARS_OFF = ("HF_HUB_DISABLE_PROGRESS_BARS", "1")
_said: set[tuple[str, str]] = set()


class _DropLines(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


def quiet_libraries() -> None:
    """Install the filters (idempotent) and route Lightning's log lines through the root logger only once."""
    os.environ.setdefault(*_KINETO_QUIET)
    os.environ.setdefault(*_HF_BARS_OFF)
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


def once(logger: logging.Logger, level: int, message: str, *args) -> None:
    """Log a line the first time this process would log it: a warning about a config that every job of a bench
    row (and its raw loop) plans again says it once."""
    key = (logger.name, message % args if args else message)
    if key not in _said:
        _said.add(key)
        logger.log(level, message, *args)


def progress_bar_shown(setting: bool | str) -> bool:
    """trainer.enable_progress_bar: true or false as set; `auto`: for a job run alone at a terminal, not for a sweep's
    jobs (their bars would interleave with the sweep's lines) nor into a file or a pipe (every refresh a line)."""
    if setting != "auto":
        return bool(setting)
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    in_sweep = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    return sys.stderr.isatty() and not in_sweep


def progress(items, desc: str, unit: str, enabled: bool = True, stream=None):
    """Iterate `items` (a sized iterable) with progress: a tqdm bar at a terminal; into a log file or a pipe, where
    each refresh of a bar would pile up as one carriage-return line, a plain line at every tenth of the way
    (`teacher: 30/100 batch`) and one at the end."""
    stream = stream if stream is not None else sys.stderr
    if not enabled:
        yield from items
        return
    if stream.isatty():
        from tqdm.auto import tqdm

        yield from tqdm(items, desc=desc, unit=unit, leave=False, file=stream)
        return
    total = len(items)
    step = max(1, total // 10)
    for done, item in enumerate(items, start=1):
        yield item
        if done % step == 0 or done == total:
            print(f"{desc}: {done}/{total} {unit}", file=stream, flush=True)
