"""The job's two checkpoints, kept consistent with each other so that a run killed at any moment resumes to the
same end as an uninterrupted one.

- `best-step{N}.ckpt` (`BestCheckpoint`): the weights of the best validation score so far; its score and path live
  in the callback's state, which every checkpoint carries.
- `last.ckpt` (`LastCheckpoint`): what a killed run resumes from, every `checkpoint.every_n_steps` optimizer steps
  and at the last step. At a step that validates, it is written *after* the validation (and after the best
  checkpoint took its score): written before, it would hold a best-checkpoint state that does not know that
  validation, Lightning does not repeat a validation whose step the checkpoint already completed, and a resumed run
  would lose that score for good (naming a worse checkpoint as its best, or one deleted since).
- `ValidateAtLastStep`: the last step always validates inside fit, so the final weights compete for the best
  checkpoint and `last.ckpt` at the last step holds everything but the summary and the export.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

from sweeplab.core.files import atomic_write
from sweeplab.runtime.lightning_private import validates_after_this_batch

log = logging.getLogger(__name__)


def _plain_state_key(callback: ModelCheckpoint) -> str:
    # the key Lightning gives a plain ModelCheckpoint of these settings: checkpoints written before these
    # subclasses existed restore into them. Kept once built: Lightning asks for it at every hook call of every
    # step (it names the hook's profiler action), and building it formats all the settings each time.
    if "_sweeplab_state_key" not in callback.__dict__:
        key = ModelCheckpoint.state_key.fget(callback)
        callback.__dict__["_sweeplab_state_key"] = "ModelCheckpoint" + key[len(type(callback).__qualname__) :]
    return callback.__dict__["_sweeplab_state_key"]


def best_files(checkpoint: dict) -> list[Path]:
    """The best checkpoints a checkpoint's ModelCheckpoint states name and that exist: what a resume brings along
    (BestCheckpoint.load_state_dict), so what a resume checks before it starts."""
    files: list[Path] = []
    for state in (checkpoint.get("callbacks") or {}).values():
        if isinstance(state, dict):
            files += [Path(p) for p in (state.get("best_k_models") or {}) if Path(p).is_file() and Path(p) not in files]
    return files


class ValidateAtLastStep(L.Callback):
    """Ask Lightning to stop after the last step; a stop request makes it validate that step before leaving fit
    (the same path EarlyStopping takes), so the final validation belongs to fit like every other one."""

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
            trainer.should_stop = True


class BestCheckpoint(ModelCheckpoint):
    """The checkpoint of the best `monitor` value so far, one file (`best-step{N}.ckpt`)."""

    def __init__(self, dirpath: str | Path, monitor: str, mode: str):
        super().__init__(
            dirpath=dirpath, filename="best-step{step}", monitor=monitor, mode=mode, auto_insert_metric_name=False,
            enable_version_counter=False,  # a resumed run re-saving a step's best overwrites it (no -v1 twin)
        )

    @property
    def state_key(self) -> str:
        return _plain_state_key(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the best score and file, keeping only best files that exist, in this job's directory.

        A run resumed into another directory (`resume=PATH`) brings its best checkpoint along (copied), so the
        directory it now writes to holds every file it names; a best file that is gone (deleted by hand, or a
        checkpoint copied without it) is dropped with a warning, and the best is chosen from the validations
        that follow."""
        here = Path(self.dirpath)
        kept: dict[str, Any] = {}
        for path, score in (state_dict.get("best_k_models") or {}).items():
            source = Path(path)
            if not source.is_file():
                log.warning("resume: the best checkpoint %s named by the resumed checkpoint is missing; the best is "
                            "chosen among the validations from here on", source)
                continue
            target = here / source.name
            if source.parent != here:
                with atomic_write(target) as f, source.open("rb") as src:
                    shutil.copyfileobj(src, f)
                log.info("resume: copied the best checkpoint %s to %s", source, target)
            kept[str(target)] = score
        state = {**state_dict, "dirpath": str(here), "best_k_models": kept}
        if kept:
            state["best_model_path"] = (min if self.mode == "min" else max)(kept, key=kept.get)
            state["kth_best_model_path"] = (max if self.mode == "min" else min)(kept, key=kept.get)
            state["best_model_score"] = kept[state["best_model_path"]]
            state["kth_value"] = kept[state["kth_best_model_path"]]
        else:
            state.update(best_model_path="", best_model_score=None, kth_best_model_path="", kth_value=self.kth_value)
        super().load_state_dict(state)


class LastCheckpoint(ModelCheckpoint):
    """`last.ckpt` every `every_n_steps` optimizer steps and at the last step; after the validation at a step that
    validates (see the module docstring)."""

    def __init__(self, dirpath: str | Path, every_n_steps: int):
        super().__init__(  # always the one last.ckpt, overwritten (atomically: AtomicCheckpointIO)
            dirpath=dirpath, every_n_train_steps=every_n_steps, save_top_k=0, save_last=True, enable_version_counter=False
        )

    @property
    def state_key(self) -> str:
        return _plain_state_key(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Nothing to restore: the file is always last.ckpt (and Lightning would warn when the resumed checkpoint
        lies in another directory)."""

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        due = step % self._every_n_train_steps == 0 or (trainer.max_steps > 0 and step >= trainer.max_steps)
        if due and validates_after_this_batch(trainer):
            # Lightning's own deferral: its on_validation_end writes last.ckpt once the validation (and the best
            # checkpoint, which runs before this callback) is done
            self._defer_save_until_validation = True
            return
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
