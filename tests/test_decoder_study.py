"""The TextBridge decoder as a study subject like the other families: a replicated sweep over batch size gives one
run per job, the per-configuration table and the verdict; the bench's hand-written loop trains it exactly as the
sweeplab job does (so its overhead row compares like with like)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from conftest import compose_train
from sweeplab import bench
from sweeplab.engine.training import train
from sweeplab.tracking import mlflow_store

DECODER = ["model=textbridge_decoder", "debug=smoke", "model.max_len=32", "trainer.enable_progress_bar=false"]


@pytest.mark.slow  # ~1 min on 2 cores: four decoder jobs and the report
def test_a_replicated_decoder_sweep_reports_each_configuration(demo_dir, mlflow_uri, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "sweeplab.train", "-m", *DECODER, f"data.path={demo_dir}", "data.batch_size=8,16",
         "replicates=2", "trainer.max_steps=10", "trainer.val_check_interval=5", "trainer.limit_val_batches=1",
         f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(mlflow_uri)
    (experiment,) = [e for e in client.search_experiments() if e.name == "sweeplab"]
    runs = client.search_runs([experiment.experiment_id])
    jobs = [r for r in runs if mlflow_store.is_job_run(r)]
    assert len(jobs) == 4 and all(r.info.status == "FINISHED" for r in runs)
    assert {r.data.tags["family"] for r in jobs} == {"textbridge_decoder"}
    assert sorted((r.data.params["data.batch_size"], r.data.tags["replicate"]) for r in jobs) == [
        ("16", "0"), ("16", "1"), ("8", "0"), ("8", "1")]
    for run in jobs:
        assert {"train/step_time_s", "summary/samples_per_sec", "val/loss", "val/token_acc"} <= set(run.data.metrics)
    report = (tmp_path / "sweep" / "report.md").read_text()
    # the per-configuration table (n = 2 each) and a verdict over the decoder's monitored metric, the validation loss
    assert "comparisons with bs=8 (the baseline)" in report and "every configuration: n 2" in report, report
    assert "| bs=8 |" in report and "| bs=16 |" in report, report
    assert "val/loss ≤" in report.split("### per configuration")[0], report


@pytest.mark.slow  # ~20 s: one decoder job and the hand-written loop
def test_the_bench_loop_trains_the_decoder_exactly_like_the_sweeplab_job(demo_dir, mlflow_uri, tmp_path):
    cfg = compose_train([*DECODER, f"data.path={demo_dir}", "data.batch_size=16", "trainer.max_steps=8",
                         "trainer.val_check_interval=8", "optim.grad_clip=0.05"])
    train(cfg)
    (ckpt,) = (Path.cwd() / "outputs" / "checkpoints").glob("best-step*.ckpt")
    trained = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    raw = bench.RawLoop(cfg)
    raw.run(warmup_steps=0, steps=8)
    for name, value in raw.model.state_dict().items():
        torch.testing.assert_close(value, trained[f"model.{name}"], rtol=1e-4, atol=1e-5, msg=name)
