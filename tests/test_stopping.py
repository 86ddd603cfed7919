"""Stop what is decided (issue 37): jobs that stop at the target, jobs that stop once clearly behind the round's
leader, and a verdict that counts their times honestly (a stopped-behind job's time to target is a lower bound)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import pytest
from annotated_types import Ge
from mlflow.tracking import MlflowClient

from conftest import smoke_config
from sweeplab.core import channels
from sweeplab.core.errors import ConfigError
from sweeplab.core.place import JobPlace
from sweeplab.core.records import JOB
from sweeplab.engine.plan import plan
from sweeplab.engine.training import train
from sweeplab.policies import stopping
from sweeplab.study import verdict


def test_stopping_needs_an_explicit_target_and_a_multiple_above_one(demo_dir):
    with pytest.raises(ConfigError, match="need report.target"):
        plan(smoke_config(demo_dir, "stop.at_target=true"))
    with pytest.raises(ConfigError, match="stop.behind: must be > 1, got 0.5"):
        plan(smoke_config(demo_dir, "stop.behind=0.5", "report.target=0.5"))
    assert plan(smoke_config(demo_dir, "stop.at_target=true", "report.target=0.5")).stop_target == 0.5


def test_the_rule_stops_at_the_target_after_its_confirmations_and_behind_the_leader(tmp_path):
    board = stopping.RoundBoard(tmp_path / "stop" / "round-0.json")
    leader = stopping.StopRule(stopping.StopConfig(at_target=True, confirm=1, behind=2.0), 0.5, "max", board,
                               is_baseline=True)
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


def test_a_job_stops_at_the_target_and_says_why(demo_dir, mlflow_uri, caplog):
    """A real job: a target every validation reaches stops it at its first validation (debug=smoke validates every
    10 of 20 steps), FINISHED, with the reason and the step on its run and in its closing line."""
    with caplog.at_level("INFO", logger="sweeplab.engine.job"):
        train(smoke_config(demo_dir, "stop.at_target=true", "report.target=-1.0"))
    assert any(r.getMessage().startswith("done: ") and ", stopped at step 10 of 20, " in r.getMessage()
               for r in caplog.records), caplog.text
    (run,) = MlflowClient(mlflow_uri).search_runs(["1"])
    assert run.info.status == "FINISHED"
    assert run.data.tags[JOB.stop_reason] == "target" and run.data.tags[JOB.stop_step] == "10"
    assert [m.step for m in MlflowClient(mlflow_uri).get_metric_history(run.info.run_id, "val/cos")] == [9]


@pytest.mark.slow
def test_a_job_of_a_round_stops_behind_the_posted_leader(demo_dir, mlflow_uri, tmp_path, monkeypatch):
    """The round's board says the leader reached the target after a millisecond: a job of another configuration
    that has not reached it stops as behind at its first validation; its time to target is then censored."""
    sweep_dir = tmp_path / "sweep"  # round 1: round 0 trains to the end for the quality (stop.quality_round)
    stopping.RoundBoard(sweep_dir / "stop" / "round-1.json").post(0.001, "0")
    monkeypatch.setattr("sweeplab.engine.training._hydra_runtime", lambda: (tmp_path / "out", str(sweep_dir)))
    # a smoke run never reaches it
    train(smoke_config(demo_dir, "stop.behind=2", "report.target=0.999"), place=JobPlace(config_index=1, round=1))
    (run,) = MlflowClient(mlflow_uri).search_runs(["1"])
    assert run.info.status == "FINISHED" and run.data.tags[JOB.stop_reason] == "behind"
    assert run.data.tags[JOB.stop_step] == "10"


# --- the verdict with censored times ------------------------------------------------------------------------------

def _job(config: str, r: int, rate: float, reach_at: float | None, stopped_at: float | None = None) -> verdict.Job:
    """A job whose metric rises linearly to 1.0 at `reach_at` samples (never, with None), validated every 100."""
    end = stopped_at if stopped_at is not None else 1000.0
    curve = [(s, min(1.0, s / reach_at) if reach_at else 0.1) for s in range(100, int(end) + 1, 100)]
    return verdict.Job(config, r, r, rate, curve[-1][1], curve, censored_samples=stopped_at)


def test_a_stopped_configuration_is_slower_on_its_bound_never_faster_or_tied():
    jobs = []
    for r in range(5):
        ahead = 1 + 0.02 * (r % 2)  # a and b take turns being a little ahead: equal
        jobs += [_job("a", r, 100.0 * ahead, 500.0), _job("b", r, 100.0 * (1.02 / ahead), 500.0),
                 _job("slow", r, 40.0, None, stopped_at=300.0)]  # stopped behind: time to target > 300/40 = 7.5 s
    summary = verdict.summarize(jobs, baseline="a", target=0.9, metric_name="m")
    slow = summary.config("slow")
    assert slow.speedup_to_target.bounded and slow.speedup_to_target.interval.high < 1
    assert "slow" not in summary.verdict.fastest and set(summary.verdict.fastest) == {"a", "b"}
    assert summary.selection.beaten_by["slow"] == ("a", "b")
    assert any("slow" in line and "slower" in line for line in summary.verdict.lines)


def test_a_bound_that_does_not_clear_the_leader_says_nothing_for_either():
    """Stopped before the leader's time: its bound (4 s) lies below the leader's 5 s, so a round says neither is
    faster. The baseline is not crowned by the stopped configuration's bound: the fastest stays open between them."""
    jobs = []
    for r in range(5):
        jobs += [_job("a", r, 100.0, 500.0), _job("late", r, 100.0, None, stopped_at=400.0)]  # bound 4 s < 5 s
    summary = verdict.summarize(jobs, baseline="a", target=0.9, metric_name="m")
    late = summary.selection.comparison("late", "a")
    assert late.censored == 5 and late.mean == 0.0
    assert summary.verdict.kind == "tie" and set(summary.verdict.fastest) == {"a", "late"}


def test_a_job_that_reached_the_target_is_never_stopped_behind(tmp_path):
    """Its metric dipped below the target again after it reached it: its time to target is known and not behind,
    so its own posted time is not used against it (it was stopped and counted towards "stopped for good")."""
    board = stopping.RoundBoard(tmp_path / "round-0.json")
    rule = stopping.StopRule(stopping.StopConfig(behind=1.5), 0.5, "max", board, is_baseline=False)
    assert rule.at_validation(0.55, 1.0, samples_seen=100) is None  # reached at 1 s: posts it, it leads
    assert rule.at_validation(0.45, 2.0, samples_seen=200) is None  # 2 s > 1.5 x 1 s, below the target again
    assert rule.at_validation(0.40, 9.0, samples_seen=900) is None


def test_the_leader_posts_its_curve_past_its_target_and_a_better_slower_learner_keeps_training(tmp_path):
    """The protection follows the leader's curve past its target: a job that is better than the leader at the same
    samples seen there is not stopped behind (the leader used to post its curve only up to its target)."""
    board = stopping.RoundBoard(tmp_path / "round-0.json")
    leader = stopping.StopRule(stopping.StopConfig(behind=1.5), 0.5, "max", board, is_baseline=True,
                               config_index="0")
    for samples, value in ((100, 0.3), (200, 0.5), (300, 0.52), (400, 0.53)):
        leader.at_validation(value, samples / 100, samples_seen=samples)
    assert board.leader_curve()[-1] == (400.0, 0.53)
    slow = stopping.StopRule(stopping.StopConfig(behind=1.5), 0.6, "max", board, is_baseline=False,
                             config_index="1")
    assert slow.at_validation(0.55, 4.0, samples_seen=400) is None  # better than the leader's 0.53 at 400
    assert slow.at_validation(0.50, 4.0, samples_seen=400) == "behind"


def test_the_quality_round_is_never_stopped(tmp_path):
    """stop.quality_round: round 0 trains every configuration to its last step, so every configuration's quality is
    measured once even when its other jobs stop at the target or behind."""
    for round_, expected in ((0, None), (1, "behind")):
        stopping.RoundBoard(tmp_path / "stop" / f"round-{round_}.json").post(1.0, "0", [(100, 0.5)])
        rule = stopping.StopRule.for_this_job(stopping.StopConfig(at_target=True, behind=1.5), 0.5, "max", tmp_path,
                                              JobPlace(config_index=1, round=round_))
        assert rule.at_validation(0.1, 3.0, samples_seen=300) == expected
        assert rule.at_validation(0.9, 4.0, samples_seen=400) in (None, "target")
    round_zero = JobPlace(config_index=1, round=0)
    off = stopping.StopRule.for_this_job(stopping.StopConfig(at_target=True, quality_round=False), 0.5, "max",
                                         tmp_path, round_zero)
    assert stopping.StopRule.for_this_job(stopping.StopConfig(at_target=True), 0.5, "max",
                                          tmp_path, round_zero).at_validation(0.9, 1.0, 100) is None
    assert off.at_validation(0.9, 1.0, 100) == "target"


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


def test_configurations_stopped_behind_in_two_rounds_get_no_more_rounds():
    from sweeplab.study.rounds import stopped_for_good
    from sweeplab.study.sweep import JobRecord, Sweep

    def job(index: int, round_: int, reason: str | None) -> JobRecord:
        return JobRecord(f"r{index}{round_}", "", "FINISHED", 0, {}, {}, {}, "x", f"c{index}", index, round_, round_,
                         None, 1, "8", 8, 1.0, stop_reason=reason, stop_step=10, max_steps=100)

    sweep = Sweep(None, (job(0, 0, None), job(1, 0, "behind"), job(2, 0, "behind"),
                         job(0, 1, None), job(1, 1, "behind"), job(2, 1, "target")))
    assert stopped_for_good(sweep) == {1}
    assert sweep.jobs[1].censored_samples == 80.0 and sweep.jobs[2].samples_not_trained == 720.0


@pytest.mark.slow
def test_a_known_effect_keeps_its_verdict_at_half_the_training(example_site, mlflow_uri, tmp_path):
    """Three configurations with per-step costs 1x, 1x and 2.5x and the same learning curve, an explicit target,
    5 replicates: stopped at the target and behind the leader, the study says what the unstopped one says (the fast
    two tied, the slow one slower) for at most half of the unstopped study's training time."""
    import subprocess
    import sys

    from sweeplab.report import tables as report
    from sweeplab.study.record import VerdictOptions
    from sweeplab.study.sweep import read_sweep

    def study(name: str, *stop: str):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(example_site), os.environ.get("PYTHONPATH", "")])}
        command = [sys.executable, "-m", "sweeplab.train", "-m", "debug=smoke", "model=mlp_regressor",
                   "model.sleep_ms=20,20.0,50", "replicates=5", "report.target=0.6", "trainer.max_steps=100",
                   "trainer.val_check_interval=10", "timing.warmup_steps=5", "timing.window=20",
                   "logger.system_metrics_after_s=null", f"logger.experiment_name={name}",
                   f"hydra.sweep.dir={tmp_path / name}", *stop]
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
        assert done.returncode == 0, done.stderr[-3000:]
        parent = (tmp_path / name / channels.PARENT_RUN_FILE).read_text().strip()
        found = report.sweep_report(mlflow_uri, parent, None, options=VerdictOptions(target=0.6))
        trained = sum(j.metrics.get("summary/timed_seconds", 0.0) for j in read_sweep(mlflow_uri, parent).jobs)
        return found, trained, done.stdout

    unstopped, unstopped_s, _ = study("unstopped")
    stopped, stopped_s, stdout = study("stopped", "stop.at_target=true", "stop.behind=2")
    for found in (unstopped, stopped):
        verdict_ = found.verdict.summary.verdict
        assert set(verdict_.fastest) == {"model.sleep_ms=20", "model.sleep_ms=20.0"}, found.verdict.lines
    print(f"training time: stopped {stopped_s:.1f} s, unstopped {unstopped_s:.1f} s ({stopped_s / unstopped_s:.0%})")
    assert stopped_s <= 0.5 * unstopped_s
    assert any("stopping what was decided" in line and "saved" in line for line in stopped.verdict.lines)


def test_a_slower_but_better_configuration_is_on_the_reported_pareto_front():
    """1.5x slower to the target, but its final metric is better beyond its interval: on the front with the
    fastest, never dropped by the verdict."""
    jobs = []
    for r in range(5):
        a = _job("a", r, 100.0 * (1 + 0.01 * r), 500.0)
        good = _job("good", r, 100.0 * (1 - 0.01 * r) / 1.5, 500.0)
        jobs += [a, verdict.Job("good", r, r, good.samples_per_sec, 1.2 + 0.01 * r, good.curve)]
    summary = verdict.summarize(jobs, baseline="a", target=0.9, metric_name="m", quality_tolerance=0.01)
    good = summary.config("good")
    assert good.quality_difference.interval.low > 0 and good.speedup_to_target.interval.high < 1
    assert verdict.speed_quality_front(summary) == ["a", "good"]


# ---------------------------------------------------------------------------------------------------------------------
# A stop rule is one class: one that needs no target, its state across a resume, the ranks of a data-parallel job


def test_a_rule_that_needs_no_target_stops_after_its_patience():
    """stop.patience: Lightning's EarlyStopping rule as one class and one config entry; no report.target needed."""
    rule = stopping.StopRule(stopping.StopConfig(patience=3, min_delta=0.005), None, "max")
    said = [rule.at_validation(v, None) for v in (0.50, 0.60, 0.603, 0.59, 0.604)]
    assert said == [None, None, None, None, "no_improvement"]  # 0.603 and 0.604 are within min_delta of 0.60
    assert stopping.check(stopping.StopConfig(patience=3), None, "cpu") is None  # no target asked for
    with pytest.raises(ConfigError, match="need report.target"):
        stopping.check(stopping.StopConfig(at_target=True, patience=3), None, "cpu")
    fresh = stopping.StopRule(stopping.StopConfig(patience=3, min_delta=0.005), None, "max")
    fresh.load_state_dict(rule.state_dict())
    assert fresh.rules[0].state_dict() == rule.rules[0].state_dict() == {"best": 0.60, "waited": 3}


def test_a_resumed_job_keeps_counting_where_it_was(demo_dir, mlflow_uri, tmp_path):
    """A real job whose metric cannot improve (a learning rate of 1e-9) validates every step with stop.patience=5:
    4 steps, then extended to 10 from its last.ckpt. The count travels in the checkpoint, so it stops at step 6; a
    rule that started afresh would count from step 5 and stop at step 10 (or never)."""
    import torch

    base = ["optim.lr=1e-9", "optim.min_lr=0", "stop.patience=5", "stop.min_delta=0.01", "trainer.val_check_interval=1",
            "checkpoint.every_n_steps=1", "trainer.log_every_n_steps=1"]
    train(smoke_config(demo_dir, *base, "trainer.max_steps=4"))
    ckpt = Path.cwd() / "outputs" / "checkpoints" / "last.ckpt"
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["callbacks"]["StopWhatIsDecided"]
    assert state["rules"]["no_improvement"]["waited"] == 3
    train(smoke_config(demo_dir, *base, "trainer.max_steps=10", f"resume={ckpt}"), output_dir=tmp_path / "longer")
    runs = MlflowClient(mlflow_uri).search_runs(["1"], order_by=["attributes.start_time DESC"])
    assert runs[0].data.tags[JOB.stop_reason] == "no_improvement"
    assert runs[0].data.tags[JOB.stop_step] == "6"


@pytest.mark.slow  # ~40 s: two gloo ranks on the CPU
def test_the_ranks_of_a_data_parallel_job_stop_together(demo_dir, mlflow_uri, tmp_path):
    """trainer.devices=2 on the CPU (gloo): the ranks follow rank 0's decision, so the job ends (a rank that stopped
    alone would leave the other waiting in a collective) with one run that names the rule."""
    from test_sweeps_parallel import smoke, sweep

    result = sweep(tmp_path, "backend=cpu", *smoke(demo_dir, "data.batch_size=8", "trainer.devices=2",
                                                   "trainer.max_steps=12", "trainer.val_check_interval=2",
                                                   "optim.lr=1e-9", "optim.min_lr=0", "stop.patience=2", "stop.min_delta=0.01"))
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = MlflowClient(mlflow_uri).search_runs(["1"])
    assert run.info.status == "FINISHED" and run.data.tags[JOB.stop_reason] == "no_improvement"
    assert run.data.tags[JOB.stop_step] == "6"


def test_the_lightning_side_counts_samples_with_the_timers_samples_per_step():
    """Samples seen at a validation are steps × the timer's measured samples per step (the figure the verdict reads:
    summary/samples_per_step), the plan's batch × accumulation × devices only before the timer measured any."""
    from types import SimpleNamespace

    from sweeplab.callbacks.stop_rules import StopWhatIsDecided

    seen = []
    rule = SimpleNamespace(at_validation=lambda value, seconds, samples: seen.append(samples))
    measured = {"per_step": None}
    timer = SimpleNamespace(step_time_so_far=lambda: 0.01, samples_per_step_so_far=lambda: measured["per_step"])
    callback = StopWhatIsDecided(rule, "val/cos", timer, lambda record: None, samples_per_step=64)
    trainer = SimpleNamespace(sanity_checking=False, callback_metrics={"val/cos": 0.5}, global_step=10,
                              strategy=SimpleNamespace(broadcast=lambda value, src: value), should_stop=False)
    callback.on_validation_end(trainer, None)
    measured["per_step"] = 48.0  # e.g. a training split that ends in a short batch
    callback.on_validation_end(trainer, None)
    assert seen == [640, 480.0]


# --- each rule owns its settings: one class and one entry in the registry -------------------------------------------


class AfterValidations:
    """A rule from outside the registry: stop after n validations, whatever the metric (needs no target)."""

    settings = (stopping.Setting("max_validations", Annotated[int, Ge(1)] | None, None, "stop after n validations"),)
    needs_target = False
    reason = "validations"
    spares_the_quality_round = False

    def __init__(self, n: int) -> None:
        self.n, self.seen = n, 0

    @staticmethod
    def is_on(stop) -> bool:
        return stop.max_validations is not None

    @classmethod
    def of(cls, stop, place: stopping.Place) -> AfterValidations:
        return cls(stop.max_validations)

    def at_validation(self, seen: stopping.Seen) -> bool:
        self.seen += 1
        return self.seen >= self.n

    def state_dict(self) -> dict:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict) -> None:
        self.seen = state["seen"]


def test_a_new_rule_is_one_class_in_the_registry_and_the_config_its_check_and_on_follow():
    """The rule declares its key, bound and default; the `stop` dataclass, "which rules are on", the job's rules and
    the early check's accepted keys all come from the registry, with no edit elsewhere."""
    from sweeplab.core.config import build, check_values

    rules = (*stopping.RULES, AfterValidations)
    config = stopping.stop_config(rules)
    assert not config().enabled and config(max_validations=2).enabled and not config(max_validations=2).needs_target
    job = stopping.StopRule(config(max_validations=2, patience=5), None, "max")
    assert [type(rule) for rule in job.rules] == [stopping.NoImprovement, AfterValidations]
    assert [job.at_validation(0.5, 1.0) for _ in range(2)] == [None, "validations"]
    with pytest.raises(ConfigError, match=r"^config error: stop\.max_validations: must be >= 1, got 0"):
        check_values(stopping.accepted(rules), {"max_validations": 0}, "stop")
    with pytest.raises(ConfigError, match=r"^config error: stop\.max_validations: expected int \| null"):
        build(config, {"max_validations": "x"}, "stop")
    assert "max_validations" not in stopping.accepted()  # the registry itself is untouched


def test_the_early_check_and_conf_read_the_stop_settings_the_rules_declare():
    """engine/settings.py checks `stop.*` against the rules' declarations (a bound and an unknown key, named before
    any import of the engine); conf/train.yaml's `stop:` holds the rules' defaults, and StopConfig their fields."""
    import dataclasses

    from omegaconf import OmegaConf

    from sweeplab.engine import settings

    defaults = OmegaConf.to_container(OmegaConf.load(Path(__file__).parents[1] / "conf" / "train.yaml").stop)
    assert defaults == {setting.key: setting.default for setting in stopping.settings_of()}
    assert [f.name for f in dataclasses.fields(stopping.StopConfig)] == list(stopping.accepted())
    assert {f.name: f.default for f in dataclasses.fields(stopping.StopConfig)} == defaults
    with pytest.raises(ConfigError, match=r"^config error: stop\.confirm: must be >= 0, got -1"):
        settings.check_values({"stop": {**defaults, "confirm": -1}})
    with pytest.raises(ConfigError, match=r"^config error: stop\.patiense: unknown key \(did you mean 'patience'\?\)"):
        settings.check_values({"stop": {**defaults, "patiense": 3}})
    settings.check_values({"stop": {**defaults, "patience": 3, "min_delta": 0.01}})
