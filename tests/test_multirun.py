"""A real Hydra multirun through the command line: jobs nest under one parent run, the table is printed."""

from __future__ import annotations

import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient


def test_two_job_multirun_records_two_runs_under_one_parent(demo_dir, mlflow_uri, tmp_path):
    result = subprocess.run(
        [
            sys.executable, "-m", "sweeplab.train", "-m", "debug=smoke", f"data.path={demo_dir}", "model.out_dim=64",
            "data.batch_size=8,16", "trainer.max_steps=10", "trainer.val_check_interval=5",
        ],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(mlflow_uri)
    (experiment,) = [e for e in client.search_experiments() if e.name == "sweeplab"]
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if r.data.tags.get("sweeplab.role") == "sweep"]
    children = [r for r in runs if r.data.tags.get("sweeplab.role") != "sweep"]
    assert len(parents) == 1 and len(children) == 2
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}
    assert all(r.info.status == "FINISHED" for r in runs)
    assert sorted(r.data.params["data.batch_size"] for r in children) == ["16", "8"]
    assert {r.data.tags["sweep_id"] for r in children} == {parents[0].data.tags["sweep_id"]}
    # report.quality_tolerance left null: no tag, so `python -m sweeplab.report` asks again for the family's default
    assert "report.quality_tolerance" not in parents[0].data.tags
    # the comparison table is printed and attached to the parent run
    assert "every run: status FINISHED, backend cpu" in result.stdout, result.stdout[-3000:]
    assert "| bs=8 textbridge tiny α=0.7 β=0.7 steps=10 cpu | 8 |" in result.stdout, result.stdout[-3000:]
    # how to run each job again, and who ran it from where, in the UI's description and source fields
    job = next(r for r in children if r.data.params["data.batch_size"] == "8")
    assert job.data.tags["mlflow.note.content"].startswith("python -m sweeplab.train debug=smoke ")
    assert "data.batch_size=8 " in job.data.tags["mlflow.note.content"] + " "
    assert "data.batch_size=8,16" in parents[0].data.tags["mlflow.note.content"]
    assert "train.log" in {a.path for a in client.list_artifacts(job.info.run_id)}  # the job's own log
    for run in (job, parents[0]):
        assert run.data.tags["mlflow.source.name"].endswith("sweeplab/train.py") and run.data.tags["mlflow.user"]
    logged = {a.path for a in client.list_artifacts(parents[0].info.run_id, "report")}
    assert {"report/report.md", "report/report.csv", "report/report.html"} <= logged
    (sweep_dir,) = (tmp_path / "multirun").glob("*/*")
    assert result.stdout.splitlines()[-1] == f"report: {(sweep_dir / 'report.html').resolve()}"  # the closing line
    assert (sweep_dir / "report.md").exists() and (sweep_dir / "0" / "checkpoints" / "last.ckpt").exists()


@pytest.mark.slow  # the default suite's time budget; tests/test_alpha_callback.py covers the α logging
def test_lm_alpha_sweep_logs_ppl_and_alpha_curves(mlflow_uri, tmp_path, monkeypatch):
    monkeypatch.setenv("SWEEPLAB_DATA_DIR", str(tmp_path / "data"))
    result = subprocess.run(
        [
            sys.executable, "-m", "sweeplab.train", "-m", "model=pagating_lm", "debug=smoke",
            "model.alpha=cosine,learnable", "trainer.max_steps=12", "trainer.log_every_n_steps=2",
        ],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(mlflow_uri)
    (experiment,) = [e for e in client.search_experiments() if e.name == "sweeplab"]
    children = [r for r in client.search_runs([experiment.experiment_id]) if r.data.tags.get("sweeplab.role") != "sweep"]
    assert len(children) == 2
    for run in children:
        assert {"val/ppl", "val/loss", "train/tokens_per_sec", "alpha/layer_0", "alpha/layer_1"} <= set(run.data.metrics)
    cosine = next(r for r in children if r.data.params["model.alpha"] == "cosine")
    history = [m.value for m in client.get_metric_history(cosine.info.run_id, "alpha/layer_0")]
    assert history[0] == 1.0 and history[-1] < history[0]  # the schedule was stepped during training


def test_failing_jobs_are_recorded_and_the_sweep_runs_on_and_exits_nonzero(demo_dir, mlflow_uri, tmp_path):
    result = subprocess.run(
        [
            sys.executable, "-m", "sweeplab.train", "-m", "debug=smoke", "model.out_dim=64", "trainer.max_steps=6",
            f"data.path={demo_dir},{tmp_path / 'missing.jsonl'}", "optim.lr=3e-4,1e30",
        ],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert result.returncode == 1
    assert "error: 3 job(s) of the sweep failed" in result.stderr
    client = MlflowClient(mlflow_uri)
    (experiment,) = [e for e in client.search_experiments() if e.name == "sweeplab"]
    runs = client.search_runs([experiment.experiment_id])
    parent = next(r for r in runs if r.data.tags.get("sweeplab.role") == "sweep")
    children = [r for r in runs if r is not parent]
    assert parent.info.status == "FAILED" and parent.data.tags["failed_jobs"] == "3"
    counts = {k: v for k, v in parent.data.metrics.items() if k.startswith("jobs_")}
    assert counts == {"jobs_planned": 4, "jobs_done": 1, "jobs_failed": 3, "jobs_killed": 0, "jobs_not_run": 0}
    by_status = {}
    for run in children:
        by_status.setdefault(run.info.status, []).append(run)
    assert len(by_status["FINISHED"]) == 1 and len(by_status["FAILED"]) == 3
    reasons = sorted(r.data.tags["error"] for r in by_status["FAILED"])
    assert sum("missing.jsonl: no such file" in reason for reason in reasons) == 2
    assert sum("non-finite loss or gradient norm at step" in reason for reason in reasons) == 1
    for run in by_status["FAILED"]:
        assert "error.txt" in {a.path for a in client.list_artifacts(run.info.run_id)}
    assert result.stdout.count("| FAILED: ") == 3
