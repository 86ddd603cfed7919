"""A job is never silent while it trains: a `progress:` line every timing.progress_every_s seconds (45 by default)
with its step of N, its samples/s and its time left (sweeplab.callbacks.progress, driven by StepTimer for both fit
loops)."""

from __future__ import annotations

import logging
import re

from conftest import smoke_config
from sweeplab.callbacks.progress import JobProgress


def test_a_line_comes_once_every_interval_with_step_rate_and_time_left():
    now = [0.0]
    progress = JobProgress(total_steps=100, every_s=45.0, clock=lambda: now[0])
    lines = []
    for step in range(1, 101):
        now[0] += 1.5  # 1.5 s a step of 32 samples
        lines.append(progress.tick(step, 32))
    said = [(step, line) for step, line in enumerate(lines, 1) if line]
    assert [step for step, _ in said] == [30, 60, 90]  # every 45 s, no more often
    assert said[0][1] == "progress: step 30 of 100 (30 %), 21 samples/s, about 1.8 min left in this job"
    assert said[-1][1].endswith("about 15 s left in this job")
    assert JobProgress(100, every_s=0, clock=lambda: now[0]).tick(1, 32) is None  # 0: off


def test_a_training_job_prints_progress_lines(demo_dir, mlflow_uri, caplog):
    from sweeplab.engine.training import train

    caplog.set_level(logging.INFO)
    train(smoke_config(demo_dir, "timing.progress_every_s=0.001", "logger.system_metrics_after_s=null"))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("progress: ")]
    assert len(lines) >= 10, lines
    pattern = re.compile(r"progress: step (\d+) of 20 \(\d+ %\), \d+ samples/s, about .+ left in this job")
    steps = [int(pattern.fullmatch(line).group(1)) for line in lines]
    assert steps == sorted(steps) and steps[-1] == 20
