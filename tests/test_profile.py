"""`make profile`: the phase table (exclusive times, synced edges), the trace, and the MLflow artifacts."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest
import torch
from mlflow.tracking import MlflowClient

from console_formats import foreign_lines
from sweeplab import profile
from sweeplab.callbacks.profiler import FRAMEWORK, PhaseProfiler, phase_of


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_nested_actions_count_once_and_edges_are_synced():
    clock, syncs = Clock(), []
    profiler = PhaseProfiler(torch.device("cuda"), lambda d: syncs.append(d), clock)
    profiler.active = True
    profiler.start("[_TrainingEpochLoop].train_dataloader_next")
    clock.now += 1.0
    profiler.stop("[_TrainingEpochLoop].train_dataloader_next")
    profiler.start("[LightningModule]Task.optimizer_step")
    clock.now += 0.5  # optimizer work before the closure
    profiler.start("[Strategy]SingleDeviceStrategy.training_step")
    clock.now += 2.0
    profiler.stop("[Strategy]SingleDeviceStrategy.training_step")
    profiler.start("[Strategy]SingleDeviceStrategy.backward")
    clock.now += 4.0
    profiler.stop("[Strategy]SingleDeviceStrategy.backward")
    clock.now += 0.5
    profiler.stop("[LightningModule]Task.optimizer_step")
    shares = profiler.phases(total_seconds=9.0)
    assert shares == {"data loading": 1.0, "forward": 2.0, "backward": 4.0, "optimizer": 1.0, FRAMEWORK: 1.0}
    assert len(syncs) == 8  # both edges of every action


def test_inactive_profiler_records_nothing():
    profiler = PhaseProfiler(torch.device("cpu"), lambda d: None, Clock())
    profiler.start("run_training_batch")
    profiler.active = True
    profiler.stop("run_training_batch")  # started before the timed window: not counted
    assert profiler.exclusive == {}


@pytest.mark.parametrize(
    "action, phase",
    [("[Strategy]SingleDeviceStrategy.batch_to_device", "data loading"),
     ("[LightningModule]LMTask.optimizer_zero_grad", "optimizer"),
     ("[Callback]ThroughputTimer.on_train_batch_end", FRAMEWORK)],
)
def test_phase_names(action, phase):
    assert phase_of(action) == phase


@pytest.mark.slow  # the default suite's time budget; `make test-all` runs it
def test_profile_command_writes_table_trace_and_artifacts(demo_dir, mlflow_uri, tmp_path):
    """The command as a user runs it (its own process: the profiler's C++ tracer reads its log level once per
    process); what it prints is the table and sweeplab's own lines only (tests/console_formats.py)."""
    out = tmp_path / "prof"
    result = subprocess.run(
        [sys.executable, "-m", "sweeplab.profile", "debug=smoke", f"data.path={demo_dir}", "model.out_dim=64",
         "data.batch_size=16", "--steps", "6", "--trace-steps", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "MPLCONFIGDIR": str(tmp_path / "mpl")},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    table = (out / "profile.md").read_text()
    for phase in ("data loading", "forward", "backward", "optimizer", "framework"):
        assert f"| {phase}" in table
    assert "| **step** |" in table and "| **step** |" in result.stdout
    assert foreign_lines(result.stdout + result.stderr, table) == [], result.stdout + result.stderr
    trace = json.loads(gzip.decompress((out / "trace.json.gz").read_bytes()))
    assert trace["traceEvents"]
    client = MlflowClient(mlflow_uri)
    (run,) = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    shares = [v for k, v in run.data.metrics.items() if k.startswith("profile/") and k.endswith("_share")]
    assert len(shares) == 5 and sum(shares) == pytest.approx(1.0)
    assert {a.path for a in client.list_artifacts(run.info.run_id, "profile")} == {"profile/profile.md", "profile/trace.json.gz"}


def _ms_per_step(table) -> dict[str, float]:
    """{phase: ms per step} of a profile.md table."""
    rows = {}
    for line in table.read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 3 and cells[1].replace(".", "").isdigit():
            rows[cells[0]] = float(cells[1])
    return rows


def test_a_cuda_graph_step_gets_its_own_phase_not_the_optimizers(demo_dir, mlflow_uri, tmp_path, monkeypatch):
    from sweeplab.callbacks.profiler import GRAPH_PHASE
    from sweeplab.runtime import backends

    original = backends.check_combination  # let cuda_graph=true plan on the CPU: StepGraph then runs eagerly
    monkeypatch.setattr(backends, "check_combination", lambda *a, **k: original(*a, **{**k, "cuda_graph": False}))
    out = tmp_path / "prof"
    code = profile.main(["debug=smoke", f"data.path={demo_dir}", "model.out_dim=64", "data.batch_size=16",
                         "trainer.enable_progress_bar=false", "cuda_graph=true", "--steps", "6", "--out", str(out)])
    assert code == 0
    rows = _ms_per_step(out / "profile.md")
    # forward, backward and clipping run inside the graph step; the optimizer phase is the optimizer's own work
    assert rows[GRAPH_PHASE] > rows["optimizer"] and rows["forward"] < rows[GRAPH_PHASE]


def test_several_steps_per_batch_get_their_own_phase(demo_dir, mlflow_uri, tmp_path):
    """steps_per_batch=4: forward, backward, clipping and update of the 4 steps are one action of the task."""
    from sweeplab.callbacks.profiler import GRAPH_PHASE, STEPS_PHASE

    out = tmp_path / "prof"
    code = profile.main(["debug=smoke", f"data.path={demo_dir}", "model.out_dim=64", "data.batch_size=16", "data.on_device=true",
                         "data.pad_to=max", "steps_per_batch=4", "trainer.log_every_n_steps=4",
                         "trainer.enable_progress_bar=false", "--warmup-steps", "4", "--trace-steps", "4",
                         "--steps", "8", "--out", str(out)])
    assert code == 0
    rows = _ms_per_step(out / "profile.md")
    assert GRAPH_PHASE not in rows
    assert rows[STEPS_PHASE] > rows["forward"] and rows[STEPS_PHASE] > rows["optimizer"]
