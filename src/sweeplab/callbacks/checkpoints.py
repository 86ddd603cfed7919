"""The job's two checkpoints on Lightning, kept consistent with each other so that a run killed at any moment
resumes to the same end as an uninterrupted one. When each is written is the job's CheckpointPolicy's decision
(policies/checkpoints.py, the MLX loop's too); these callbacks ask it and write the files.

- `best-step{N}.ckpt` (`BestCheckpoint`): the weights of the best validation score so far; its score and path live
  in the callback's state, which every checkpoint carries.
- `last.ckpt` (`LastCheckpoint`): what a killed run resumes from, when the policy says it is due (every
  `checkpoint.every_n_steps` optimizer steps and/or `checkpoint.every_n_seconds`, and at the last step). At a step
  that validates, it is written *after* the validation (and after the best
  checkpoint took its score): written before, it would hold a best-checkpoint state that does not know that
  validation, Lightning does not repeat a validation whose step the checkpoint already completed, and a resumed run
  would lose that score for good (naming a worse checkpoint as its best, or one deleted since).
- `ValidateAtLastStep`: the last step always validates inside fit, so the final weights compete for the best
  checkpoint and `last.ckpt` at the last step holds everything but the summary and the export.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any
from weakref import proxy

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

from sweeplab.core import wall
from sweeplab.policies.checkpoints import CheckpointPolicy, bring_best_files
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
    """The checkpoint of the best `monitor` value so far, one file (`best-step{N}.ckpt`); which validation makes a
    new best is the policy's decision."""

    def __init__(self, dirpath: str | Path, monitor: str, policy: CheckpointPolicy, optimizer_state: bool = True):
        """`optimizer_state=False` (checkpoint.best=weights): the file holds the weights, the hyperparameters and
        the callbacks' state (the best score), not the optimizer's, a third of a full AdamW checkpoint; what the
        export, the report and a resume's best-checkpoint bookkeeping read from it. A run resumes from last.ckpt."""
        super().__init__(
            dirpath=dirpath, filename="best-step{step}", monitor=monitor, mode=policy.mode,
            auto_insert_metric_name=False,
            enable_version_counter=False,  # a resumed run re-saving a step's best overwrites it (no -v1 twin)
        )
        self.policy, self.optimizer_state = policy, optimizer_state

    def check_monitor_top_k(self, trainer: L.Trainer, current=None) -> bool:
        """CheckpointPolicy.is_new_best; the ranks of a data-parallel job agree as in Lightning's own check."""
        best = None if not self.best_k_models or self.best_model_score is None else float(self.best_model_score)
        new = self.policy.is_new_best(None if current is None else float(current), best)
        return trainer.strategy.reduce_boolean_decision(new) if best is not None else new

    @wall.charged_to("checkpoints")
    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        if self.optimizer_state:
            super()._save_checkpoint(trainer, filepath)
            return
        # Trainer.save_checkpoint's steps, with the optimizer and scheduler state left out before anything is copied
        trainer.strategy.barrier("Trainer.save_checkpoint")
        checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        for key in ("optimizer_states", "lr_schedulers"):
            checkpoint.pop(key, None)
        trainer.strategy.save_checkpoint(checkpoint, filepath)
        trainer.strategy.barrier("Trainer.save_checkpoint")
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = filepath
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.after_save_checkpoint(proxy(self))

    @property
    def state_key(self) -> str:
        return _plain_state_key(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the best score and file, the best files brought into this job's directory as the policy's
        resume rule says (bring_best_files: copied from another directory, a file that is gone dropped)."""
        here = Path(self.dirpath)
        kept = {str(path): score for path, score in bring_best_files(state_dict.get("best_k_models"), here).items()}
        state = {**state_dict, "dirpath": str(here), "best_k_models": kept}
        if kept:
            state["best_model_path"] = self.policy.best_of(kept)
            state["kth_best_model_path"] = (max if self.mode == "min" else min)(kept, key=kept.get)
            state["best_model_score"] = kept[state["best_model_path"]]
            state["kth_value"] = kept[state["kth_best_model_path"]]
        else:
            state.update(best_model_path="", best_model_score=None, kth_best_model_path="", kth_value=self.kth_value)
        super().load_state_dict(state)


class LastCheckpoint(ModelCheckpoint):
    """`last.ckpt` when the policy says it is due (CheckpointPolicy.last_due); after the validation at a step that
    validates (see the module docstring)."""

    def __init__(self, dirpath: str | Path, policy: CheckpointPolicy):
        super().__init__(  # always the one last.ckpt, overwritten (atomically: AtomicCheckpointIO)
            dirpath=dirpath, every_n_train_steps=policy.every_n_steps or 0, save_top_k=0, save_last=True,
            enable_version_counter=False,
        )
        self.policy = policy

    @property
    def state_key(self) -> str:
        return _plain_state_key(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Nothing to restore: the file is always last.ckpt (and Lightning would warn when the resumed checkpoint
        lies in another directory)."""

    def on_train_start(self, trainer: L.Trainer, pl_module) -> None:
        self.policy.start()

    @wall.charged_to("checkpoints")
    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        super()._save_checkpoint(trainer, filepath)

    def _due(self, trainer: L.Trainer) -> bool:
        agree = trainer.strategy.broadcast if trainer.world_size > 1 else None  # every rank takes rank 0's decision
        return self.policy.last_due(trainer.global_step, trainer.max_steps, agree)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._should_skip_saving_checkpoint(trainer) or not self._due(trainer):
            return
        if validates_after_this_batch(trainer):
            # Lightning's own deferral: its on_validation_end writes last.ckpt once the validation (and the best
            # checkpoint, which runs before this callback) is done
            self._defer_save_until_validation = True
            return
        self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
