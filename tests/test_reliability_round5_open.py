"""Issue 50 (reliability round 5), what the first pass left open: `resume=true` after a kill -9 with a changed
`trainer.max_steps` finds its run, a kill -9 before the first checkpoint leaves no run RUNNING, a report of a study
still running (or whose process is gone) says so first, a target every job met at its first validation is named, a
continued study's step share counts its own session, a finished job leaves no lock file, and `stop.*` values are
refused before the heavy imports. Real processes and real SIGKILLs where a kill is the fault."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from test_reliability_round5 import FAST_CPU_S, _one_line, _train

PY = sys.executable


# --- stop.* answers before the heavy imports ----------------------------------------------------------------------


@pytest.mark.parametrize(("override", "message"), [
    ("stop.confirm=-1", "stop.confirm: must be >= 0, got -1"),
    ("stop.behind=0.5", "stop.behind: must be > 1, got 0.5"),
])
def test_a_wrong_stop_value_is_one_line_in_under_3_cpu_seconds(override, message, demo_dir, mlflow_uri, tmp_path):
    """stop.confirm=-1 took 8.6 CPU-s: its bound was a __post_init__ check, met only after torch and Lightning."""
    result, cpu_s = _train([override, "report.target=0.5", f"data.path={demo_dir}", "model.out_dim=64", "debug=smoke",
                            f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    _one_line(result.stderr, message)
    assert cpu_s < FAST_CPU_S, f"{cpu_s:.1f} CPU-s"
    assert MlflowClient(mlflow_uri).get_experiment_by_name("sweeplab") is None


# --- a target every job met at its first validation ---------------------------------------------------------------


def _rising(config: str, round_: int) -> "verdict.Job":
    from sweeplab.study import verdict

    curve = [(s, 0.9 * min(1.0, s / 50_000)) for s in range(5_000, 100_001, 5_000)]  # 0.09 at the first validation
    return verdict.Job(config, round_, round_, 1000.0 * (1 + 0.1 * (config == "b")), 0.9, curve)


def test_a_target_every_job_met_at_its_first_validation_is_named_with_a_harder_one():
    """`python -m sweeplab.report --target -5` on val/cos was accepted without a word: every job's time to target was
    its first validation's, which measures the validation grid. The verdict's notes (the report's `note:` lines,
    sweeplab.study.record) say so and offer the worst of the jobs' best values; a target reached later gets none."""
    from sweeplab.study import verdict

    jobs = [_rising(c, r) for c in ("a", "b") for r in range(3)]
    trivial = verdict.summarize(jobs, baseline="a", target=-5.0, quality_tolerance=0.01, metric_name="val/cos")
    (note,) = [n for n in trivial.notes if "first validation" in n]
    assert note.startswith("every job reached the target (val/cos ≥ -5) at its first validation"), note
    assert "e.g. 0.9 (the worst of the jobs' best values)" in note and "report.target" in note
    fair = verdict.summarize(jobs, baseline="a", target=0.5, quality_tolerance=0.01, metric_name="val/cos")
    assert not [n for n in fair.notes if "first validation" in n]
