"""Issue 50 (reliability round 5), what the first pass left open: `resume=true` after a kill -9 with a changed
`trainer.max_steps` finds its run, a kill -9 before the first checkpoint leaves no run RUNNING, a report of a study
still running (or whose process is gone) says so first, a target every job met at its first validation is named, a
continued study's step share counts its own session, a finished job leaves no lock file, and `stop.*` values are
refused before the heavy imports. Real processes and real SIGKILLs where a kill is the fault."""

from __future__ import annotations

import signal
import sys

import pytest
from mlflow.tracking import MlflowClient

from test_reliability_round5 import _heavy, _one_line, _train

PY = sys.executable


# --- stop.* answers before the heavy imports ----------------------------------------------------------------------


@pytest.mark.parametrize(("override", "message"), [
    ("stop.confirm=-1", "stop.confirm: must be >= 0, got -1"),
    ("stop.behind=0.5", "stop.behind: must be > 1, got 0.5"),
])
def test_a_wrong_stop_value_is_one_line_before_torch(override, message, demo_dir, mlflow_uri, tmp_path):
    """stop.confirm=-1 took 8.6 CPU-s: its bound was a __post_init__ check, met only after torch and Lightning."""
    result, imported = _train([override, "report.target=0.5", f"data.path={demo_dir}", "model.out_dim=64", "debug=smoke",
                            f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    _one_line(result.stderr, message)
    assert not _heavy(imported), _heavy(imported)[:5]
    assert MlflowClient(mlflow_uri).get_experiment_by_name("sweeplab") is None


# --- a target every job met at its first validation ---------------------------------------------------------------


def _rising(config: str, round_: int):
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


# --- kill -9, then resume=true ------------------------------------------------------------------------------------


def _job(demo_dir, tmp_path, *more: str) -> list[str]:
    return ["debug=smoke", f"data.path={demo_dir}", "model.out_dim=64", "data.batch_size=16",
            "trainer.val_check_interval=2", "checkpoint.every_n_steps=2", "logger.system_metrics_after_s=null",
            f"hydra.run.dir={tmp_path / 'run'}", *more]


def _runs(mlflow_uri):
    client = MlflowClient(mlflow_uri)
    experiment = client.get_experiment_by_name("sweeplab")
    return client, (client.search_runs([experiment.experiment_id]) if experiment else [])


@pytest.mark.slow  # ~18 s: kill -9 and a resume (the kill -9 before the first checkpoint stays in the default suite)
def test_resume_true_with_a_changed_max_steps_after_a_kill_9_continues_the_run(demo_dir, mlflow_uri, tmp_path):
    """The docs say trainer.max_steps may change on resume; after a kill -9, `resume=true trainer.max_steps=8` said
    "no interrupted run with this configuration" (its hash held max_steps). It continues the run to step 8, which
    records the change."""
    killed, _ = _train(_job(demo_dir, tmp_path, "trainer.max_steps=6"), tmp_path, {"SWEEPLAB_FAULT_KILL_AT_STEP": "4"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
    resumed, _ = _train(_job(demo_dir, tmp_path, "trainer.max_steps=8", "resume=true"), tmp_path, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    client, (run,) = _runs(mlflow_uri)  # the same run, continued
    assert run.info.status == "FINISHED"
    assert run.data.tags["changed_on_resume.trainer.max_steps"].startswith("6 -> 8 (from step ")
    assert max(m.step for m in client.get_metric_history(run.info.run_id, "val/cos")) >= 6
    assert not (tmp_path / "run" / ".sweeplab.lock").exists()  # a finished job's folder keeps no lock file


def test_a_kill_9_before_the_first_checkpoint_leaves_no_run_running_and_resume_says_so(demo_dir, mlflow_uri, tmp_path):
    """Killed at its stop decision (the validation at step 2, before the first checkpoint at step 4), the run stayed
    RUNNING forever and `resume=true` said there was nothing to resume. That resume closes it KILLED and says what
    happened in one line; a job still running (its run lock held) is never closed."""
    job = _job(demo_dir, tmp_path, "trainer.max_steps=6", "checkpoint.every_n_steps=4", "stop.at_target=true",
               "report.target=0.99")
    killed, _ = _train(job, tmp_path, {"SWEEPLAB_FAULT_KILL_IN_VALIDATION_AT_STEP": "2"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert not (tmp_path / "run" / "checkpoints" / "last.ckpt").exists()
    client, (run,) = _runs(mlflow_uri)
    assert run.info.status == "RUNNING"  # the premise: a kill -9 cannot close its run

    resumed, _ = _train([*job, "resume=true"], tmp_path)
    assert resumed.returncode == 2, resumed.stderr[-3000:]
    _one_line(resumed.stderr, f"run {run.info.run_id} of this configuration was killed before its first checkpoint",
              "marked KILLED now", "drop resume=true")
    assert client.get_run(run.info.run_id).info.status == "KILLED"


# --- the report of a study that has not ended ---------------------------------------------------------------------


def test_the_report_of_a_running_study_says_so_first_with_its_count(mlflow_uri, tmp_path, capsys):
    """`make report` on a running study said "one replicate: no verdict ... run replicates=3". It says "still running
    (2 of 4 jobs done)" first while the sweep's process holds its folder, and once that process is gone (a kill -9:
    the run stays RUNNING), that the study was interrupted, with the command that continues it; no verdict from part
    of the jobs, and none recorded on the sweep's run."""
    from sweeplab.core.files import hold_run_lock
    from sweeplab.report.__main__ import main
    from sweeplab.tracking import mlflow_store

    client = MlflowClient(mlflow_uri)
    experiment = mlflow_store.init_store(mlflow_uri, "sweeplab")
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    parent = client.create_run(experiment, tags={"sweeplab.role": "sweep", "sweep_dir": str(sweep_dir),
                                                 "sweep_overrides": "data.batch_size=8,16 replicates=2"}).info.run_id
    client.log_metric(parent, "jobs_planned", 4)
    for status in ("FINISHED", "FINISHED", "RUNNING"):
        job = client.create_run(experiment, tags={"mlflow.parentRunId": parent}).info.run_id
        client.log_metric(job, "val/cos", 0.5)
        if status != "RUNNING":
            client.set_terminated(job, status)

    with hold_run_lock(sweep_dir, "sweep", "run or continued"):  # the sweep's process, still at work
        assert main(["--sweep", parent, "--out", str(tmp_path / "report")]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == "still running (2 of 4 jobs done): no verdict until its last job ends; run the report again then"
    assert "mlflow.note.content" not in client.get_run(parent).data.tags  # no verdict recorded from part of it

    assert main(["--sweep", parent, "--out", str(tmp_path / "report")]) == 0  # its process gone, the run RUNNING
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("interrupted (2 of 4 jobs done): the sweep's process is gone and left its run RUNNING"), first
    assert "continue it with: python -m sweeplab.train -m " in first and "resume=true" in first


# --- a continued study's share of training steps ------------------------------------------------------------------


def _timed_job(number: int, steps_s: float, end_s: float):
    from sweeplab.study.sweep import JobRecord

    return JobRecord(str(number), f"job {number}", "FINISHED", int((end_s - 60) * 1000), {}, {},
                     {"summary/wall_breakdown/steps_s": steps_s, "summary/wall_breakdown/setup_s": 5.0}, "textbridge",
                     None, None, None, None, None, 1, "16", 16, 100.0, end_ms=int(end_s * 1000))


def test_a_continued_studys_training_steps_are_set_against_the_jobs_its_process_ran():
    """A continued study reported its training steps as "184 %" of its process's wall: every session's jobs over the
    last session's wall. The jobs that ended before that process started are left out of the share (and named)."""
    from sweeplab.report.cost import cost_table

    start = 1_800_000_000.0  # the continuing process's start (sweep/process_start_s)
    jobs = [_timed_job(n, 50.0, start - 100 + n) for n in range(3)] + [_timed_job(3, 20.0, start + 30)]
    (line,) = [a for a in cost_table(jobs, 40.0, None, start * 1000).above if a.startswith("the sweep's process")]
    assert line == ("the sweep's process: 40.0 s from its start to this report; the training steps of the 1 job it ran "
                    "(a continued sweep: the other 3 ran in an earlier process) are 50 % of it"), line
    (whole,) = [a for a in cost_table(jobs[3:], 40.0, None, start * 1000).above if a.startswith("the sweep's process")]
    assert whole.endswith("the jobs' training steps are 50 % of it")  # a sweep run in one go reads as before
