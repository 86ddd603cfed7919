"""Where a training step's time goes (`make profile`, `timing.profile=true`) and a torch.profiler trace.

The throughput timer (callbacks/timing.py) decides when profiling is on: only during its timed steps, never in
warm-up, validation or a checkpoint write. This module holds what it switches: `PhaseProfiler`, which Lightning
calls at every action edge, the phase table built from it, and the torch.profiler trace of the steps right after
warm-up.
"""

from __future__ import annotations

import gzip
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from lightning.pytorch.profilers import Profiler

from sweeplab.core.records import JobRun
from sweeplab.tracking.run_logger import ResumingMLFlowLogger

# Lightning's profiler action names -> the phase of a training step they time (exclusive of nested actions).
# Under cuda_graph=true forward, backward and clipping are one graph replay inside the optimizer's closure; the
# task profiles it as its own action (GRAPH_ACTION), a phase of its own that only such runs show.
GRAPH_ACTION = "[StepGraph]forward_backward_clip"
GRAPH_PHASE = "graph step (forward, backward, clipping in one CUDA graph)"
# steps_per_batch=k > 1 without a graph: the task runs the k whole steps itself (forward to update), one action
STEPS_ACTION = "[SweepTask]steps_of_one_batch"
STEPS_PHASE = "steps of one batch (forward, backward, clipping, update; steps_per_batch)"
PHASES = (
    (GRAPH_PHASE, (GRAPH_ACTION,)),
    (STEPS_PHASE, (STEPS_ACTION,)),
    ("data loading", ("train_dataloader_next", "batch_to_device")),
    ("forward", ("Strategy].training_step", ".training_step")),
    ("backward", (".backward",)),
    ("optimizer", (".optimizer_step", ".optimizer_zero_grad", ".configure_gradient_clipping", "lr_scheduler_step")),
)
FRAMEWORK = "framework (hooks, callbacks, logging)"


def phase_of(action: str) -> str:
    for phase, markers in PHASES:
        if any(marker in action for marker in markers):
            return phase
    return FRAMEWORK


class PhaseProfiler(Profiler):
    """Lightning's profiler interface, timing every action with a device sync at its edges, only while `active`.

    Lightning's SimpleProfiler reads the host clock without a sync, so on CUDA/MPS it times kernel launches, not
    the work; its PyTorchProfiler records kernels but attributes them to phases only loosely. This one syncs at
    every action boundary (which slows the profiled steps: compare a normal run's step time) and keeps exclusive
    time per action, so nested actions (training_step and backward inside optimizer_step) are not counted twice.
    """

    def __init__(self, device: torch.device, sync: Callable[[torch.device], None], clock: Callable[[], float]):
        super().__init__()
        self.device, self._sync, self._clock = device, sync, clock
        self.active = False
        self.exclusive: dict[str, float] = {}
        self._stack: list[list] = []  # [action, start, time spent in nested actions, recorded]

    def start(self, action_name: str) -> None:
        if self.active:
            self._sync(self.device)
        self._stack.append([action_name, self._clock(), 0.0, self.active])

    def stop(self, action_name: str) -> None:
        if not self._stack or self._stack[-1][0] != action_name:
            return  # an action started before this profiler was installed
        name, start, nested, recorded = self._stack.pop()
        if not (recorded and self.active):
            return
        self._sync(self.device)
        duration = self._clock() - start
        self.exclusive[name] = self.exclusive.get(name, 0.0) + duration - nested
        if self._stack:
            self._stack[-1][2] += duration

    def phases(self, total_seconds: float) -> dict[str, float]:
        """Seconds per phase; what no action covers (the loop itself) goes to the framework share."""
        shares: dict[str, float] = {phase: 0.0 for phase, _ in PHASES}
        shares[FRAMEWORK] = 0.0
        for action, seconds in self.exclusive.items():
            if action in ("run_training_epoch", "run_training_batch") or action.startswith("[_TrainingEpochLoop].run"):
                shares[FRAMEWORK] += seconds
            else:
                shares[phase_of(action)] += seconds
        shares[FRAMEWORK] += max(0.0, total_seconds - sum(shares.values()))
        for phase in (GRAPH_PHASE, STEPS_PHASE):  # phases of their own that only such runs show
            if not shares[phase]:
                del shares[phase]
        return shares

    def summary(self) -> str:
        return ""


def phase_table(shares: dict[str, float], steps: float) -> str:
    total = sum(shares.values()) or 1.0
    lines = ["| phase | ms per step | share |", "|---|---|---|"]
    for phase, seconds in shares.items():
        lines.append(f"| {phase} | {1000 * seconds / max(steps, 1):.2f} | {seconds / total:.1%} |")
    lines.append(f"| **step** | {1000 * total / max(steps, 1):.2f} | 100% |")
    return "\n".join(lines)


def write_profile(
    profiler: PhaseProfiler, timed_seconds: float, steps: float, device: torch.device, out_dir: Path
) -> tuple[dict[str, float], Path]:
    """profile.md in `out_dir` and the `profile/*` metrics (share and ms per step of each phase) of the timed steps."""
    shares = profiler.phases(timed_seconds)
    total = sum(shares.values()) or 1.0
    metrics = JobRun(profile_share={_metric_name(p): s / total for p, s in shares.items()} or None,
                     profile_ms={_metric_name(p): 1000 * s / max(steps, 1) for p, s in shares.items()} or None
                     ).to_mlflow().metrics
    text = (
        f"## where the step time goes ({steps:g} timed steps, {device.type})\n\n"
        f"{phase_table(shares, steps)}\n\nThe device is synchronised at every phase edge, so these steps run slower "
        "than unprofiled ones; the shares are what this table is for.\n"
    )
    out = out_dir / "profile.md"
    out.write_text(text, encoding="utf-8")
    return metrics, out


def _metric_name(phase: str) -> str:
    return phase.split(" (")[0].replace(" ", "_")


def start_trace(device: torch.device):
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    trace = torch.profiler.profile(activities=activities, record_shapes=False, with_stack=False)
    trace.start()
    return trace


def stop_trace(trace, out_dir: Path) -> Path:
    """Stop a `start_trace` recording; it goes to `out_dir`/trace.json.gz (Perfetto and chrome://tracing read it)."""
    trace.stop()
    out = out_dir / "trace.json"
    trace.export_chrome_trace(str(out))
    with open(out, "rb") as src, gzip.open(f"{out}.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    out.unlink()
    return Path(f"{out}.gz")


def log_artifacts(logger, files: list[Path]) -> None:
    """Attach files to the logger's MLflow run (other loggers keep them on disk only)."""
    if isinstance(logger, ResumingMLFlowLogger) and logger.run_id is not None:
        logger.log_files(files, "profile")
