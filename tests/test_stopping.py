"""Stop what is decided (issue 37): jobs that stop at the target, jobs that stop once clearly behind the round's
leader, and a verdict that counts their times honestly (a stopped-behind job's time to target is a lower bound)."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from conftest import smoke_config
from sweeplab.core import channels, schema
from sweeplab.core.errors import ConfigError
from sweeplab.engine import stopping
from sweeplab.engine.plan import plan
from sweeplab.engine.training import train
from sweeplab.study import verdict


def test_stopping_needs_an_explicit_target_and_a_multiple_above_one(demo_dir):
    with pytest.raises(ConfigError, match="need report.target"):
        plan(smoke_config(demo_dir, "stop.at_target=true"))
    with pytest.raises(ConfigError, match="behind must be > 1"):
        plan(smoke_config(demo_dir, "stop.behind=0.5", "report.target=0.5"))
    assert plan(smoke_config(demo_dir, "stop.at_target=true", "report.target=0.5")).stop_target == 0.5


def test_the_rule_stops_at_the_target_after_its_confirmations_and_behind_the_leader(tmp_path):
    board = stopping.RoundBoard(tmp_path / "stop" / "round-0.json")
    leader = stopping.StopRule(stopping.StopConfig(at_target=True, confirm=1), 0.5, "max", board, is_baseline=True)
    assert leader.at_validation(0.4, 1.0) is None
    assert leader.at_validation(0.55, 2.0) is None  # reached; one confirmation still owed
    assert board.leader_seconds() == 2.0  # the first time at the target is posted for the round
    assert leader.at_validation(0.56, 3.0) == "target"
    behind = stopping.StopRule(stopping.StopConfig(behind=2.0), 0.5, "max", board, is_baseline=False)
    assert behind.at_validation(0.3, 3.9) is None  # within 2 x the leader's 2.0 s
    assert behind.at_validation(0.3, 4.1) == "behind"
    baseline = stopping.StopRule(stopping.StopConfig(behind=2.0), 0.5, "max", board, is_baseline=True)
    assert baseline.at_validation(0.3, 100.0) is None  # the baseline keeps every round's pair
    faster = stopping.StopRule(stopping.StopConfig(behind=2.0), 0.5, "max", board, is_baseline=False)
    assert faster.at_validation(0.6, 1.5) is None and board.leader_seconds() == 1.5  # a new leader


def test_a_job_stops_at_the_target_and_says_why(demo_dir, mlflow_uri):
    """A real job: a target every validation reaches stops it at its first validation (debug=smoke validates every
    10 of 20 steps), FINISHED, with the reason and the step on its run."""
    train(smoke_config(demo_dir, "stop.at_target=true", "report.target=-1.0"))
    (run,) = MlflowClient(mlflow_uri).search_runs(["1"])
    assert run.info.status == "FINISHED"
    assert run.data.tags[schema.STOP_REASON_TAG] == "target" and run.data.tags[schema.STOP_STEP_TAG] == "10"
    assert [m.step for m in MlflowClient(mlflow_uri).get_metric_history(run.info.run_id, "val/cos")] == [9]


@pytest.mark.slow
def test_a_job_of_a_round_stops_behind_the_posted_leader(demo_dir, mlflow_uri, tmp_path, monkeypatch):
    """The round's board says the leader reached the target after a millisecond: a job of another configuration
    that has not reached it stops as behind at its first validation; its time to target is then censored."""
    sweep_dir = tmp_path / "sweep"
    stopping.RoundBoard(sweep_dir / "stop" / "round-0.json").post(0.001, "0")
    monkeypatch.setenv(channels.ROUND_ENV, "0")
    monkeypatch.setenv(channels.CONFIG_INDEX_ENV, "1")
    monkeypatch.setattr("sweeplab.engine.training._hydra_runtime", lambda: (tmp_path / "out", str(sweep_dir)))
    train(smoke_config(demo_dir, "stop.behind=2", "report.target=2.0"))  # val/cos never reaches 2
    (run,) = MlflowClient(mlflow_uri).search_runs(["1"])
    assert run.info.status == "FINISHED" and run.data.tags[schema.STOP_REASON_TAG] == "behind"
    assert run.data.tags[schema.STOP_STEP_TAG] == "10"


# --- the verdict with censored times ------------------------------------------------------------------------------

def _job(config: str, r: int, rate: float, reach_at: float | None, stopped_at: float | None = None) -> verdict.Job:
    """A job whose metric rises linearly to 1.0 at `reach_at` samples (never, with None), validated every 100."""
    end = stopped_at if stopped_at is not None else 1000.0
    curve = [(s, min(1.0, s / reach_at) if reach_at else 0.1) for s in range(100, int(end) + 1, 100)]
    return verdict.Job(config, r, r, rate, curve[-1][1], curve, censored_samples=stopped_at)


def test_a_stopped_configuration_is_slower_on_its_bound_never_faster_or_tied():
    jobs = []
    for r in range(5):
        jobs += [_job("a", r, 100.0 * (1 + 0.01 * r), 500.0), _job("b", r, 100.0 * (1 - 0.01 * r), 500.0),
                 _job("slow", r, 40.0, None, stopped_at=300.0)]  # stopped behind: time to target > 300/40 = 7.5 s
    summary = verdict.summarize(jobs, baseline="a", target=0.9, metric_name="m")
    slow = summary.config("slow")
    assert slow.speedup_to_target.bounded and slow.speedup_to_target.interval.high < 1
    assert "slow" not in summary.verdict.fastest and set(summary.verdict.fastest) == {"a", "b"}
    assert any("slow" in line and "slower" in line for line in summary.verdict.lines)


def test_a_bound_that_does_not_clear_the_leader_leaves_the_configuration_undecided_not_tied():
    jobs = []
    for r in range(5):
        jobs += [_job("a", r, 100.0, 500.0), _job("late", r, 100.0, None, stopped_at=400.0)]  # bound 4 s < 5 s
    summary = verdict.summarize(jobs, baseline="a", target=0.9, metric_name="m")
    late = summary.config("late")
    assert late.speedup_to_target.bounded and late.speedup_to_target.interval.high > 1
    # the baseline is not crowned by the stopped configuration's absence: the fastest stays open between them
    assert summary.verdict.kind == "tie" and set(summary.verdict.fastest) == {"a", "late"}
    assert any(line.startswith("undecided") and "late" in line for line in summary.verdict.lines)
    assert any("at most" in line and "late" in line for line in summary.verdict.lines)


def test_a_job_better_than_the_leader_at_equal_samples_is_not_stopped_behind(tmp_path):
    """Two objectives: slower to the target than k x the leader, but its metric beats the leader's at the same
    samples seen: perhaps better in quality, so it is not clearly lost and keeps training."""
    board = stopping.RoundBoard(tmp_path / "round-0.json")
    leader = stopping.StopRule(stopping.StopConfig(behind=1.2), 0.5, "max", board, is_baseline=True)
    leader.at_validation(0.3, 1.0, samples_seen=100)
    leader.at_validation(0.5, 2.0, samples_seen=200)  # reached: posts 2.0 s and its curve
    better = stopping.StopRule(stopping.StopConfig(behind=1.2), 0.5, "max", board, is_baseline=False)
    assert better.at_validation(0.45, 3.0, samples_seen=150) is None  # leader had 0.4 at 150 samples
    worse = stopping.StopRule(stopping.StopConfig(behind=1.2), 0.5, "max", board, is_baseline=False)
    assert worse.at_validation(0.35, 3.0, samples_seen=150) == "behind"
