"""Lightning's side of the stop rules (sweeplab.policies.stopping.StopRule, plain Python both fit loops ask): after each
validation the rules decide, and the fit stops with the reason on the run."""

from __future__ import annotations

import logging
from typing import Any

import lightning as L

from sweeplab.core.records import JobRun

log = logging.getLogger(__name__)


class StopWhatIsDecided(L.Callback):
    """Lightning's side of StopRule: after each validation, stop the fit with the reason on the run. As Lightning's
    EarlyStopping: its rules' state goes into every checkpoint (a resumed job keeps counting), and the ranks of a
    data-parallel job follow rank 0's decision (each rank reads the round's board at its own moment)."""

    def __init__(self, rule: Any, monitor: str, timer, record, samples_per_step: int) -> None:
        self.rule, self.monitor, self.timer, self.record = rule, monitor, timer, record  # record(JobRun): onto the run
        self.samples_per_step = samples_per_step  # the plan's, until the timer has measured its own
        self.reason: str | None = None  # why it stopped the fit (a rule's reason), once it did

    def state_dict(self) -> dict[str, Any]:
        return {"rules": self.rule.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.rule.load_state_dict(state_dict.get("rules", {}))

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or self.monitor not in trainer.callback_metrics:
            return
        value = float(trainer.callback_metrics[self.monitor])
        step_time = self.timer.step_time_so_far()  # steps × step time = samples seen ÷ samples per second
        # samples per step as the timer measured them (the verdict reads the same figure), the plan's before that
        samples = trainer.global_step * (self.timer.samples_per_step_so_far() or self.samples_per_step)
        reason = self.rule.at_validation(value, trainer.global_step * step_time if step_time else None, samples)
        reason = trainer.strategy.broadcast(reason, src=0)
        if reason is None:
            return
        log.info("stop: %s after %d steps (%s %.4g)", reason, trainer.global_step, self.monitor, value)
        self.record(JobRun(stop_reason=reason, stop_step=trainer.global_step))
        self.reason = reason
        trainer.should_stop = True
