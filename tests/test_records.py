"""The run records (sweeplab.core.records): what a writer logs is what a reader reads back, in one batch."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from sweeplab.core.records import JOB, SWEEP, SWEEP_ROLE, JobRun, SweepRun, key_of
from sweeplab.tracking import mlflow_store


def test_a_partial_record_logs_only_its_fields():
    logged = SweepRun(jobs_done=3, jobs_failed=0).to_mlflow()
    assert (logged.tags, logged.params, logged.metrics) == ({}, {}, {SWEEP.jobs_done: 3.0, SWEEP.jobs_failed: 0.0})


def test_values_become_mlflows_strings_and_floats():
    logged = JobRun(replicate=2, cuda_graph=False, wall_breakdown={"setup": 1.5}, presets={"debug": "smoke"},
                    config_params={"data.batch_size": 8}).to_mlflow()
    assert logged.tags == {JOB.replicate: "2", JOB.cuda_graph: "false", key_of(JOB.presets, "debug"): "smoke"}
    assert logged.metrics == {key_of(JOB.wall_breakdown, "setup"): 1.5}
    assert logged.params == {JOB.batch_size: "8"}


def test_a_record_written_in_one_batch_reads_back_the_same(mlflow_uri, monkeypatch):
    experiment_id = mlflow_store.init_store(mlflow_uri, "sweeplab")
    run_id = MlflowClient(mlflow_uri).create_run(experiment_id).info.run_id
    batches = []
    log_batch = MlflowClient.log_batch
    monkeypatch.setattr(MlflowClient, "log_batch", lambda self, *a, **k: batches.append(k) or log_batch(self, *a, **k))
    written = SweepRun(role=SWEEP_ROLE, sweep_id="2026-11-24/13-39-32", target=0.5, swept={"data.batch_size": "8,16"},
                       jobs_planned=4, jobs_done=3, best_objective=0.61, resumed=1)
    mlflow_store.write(mlflow_uri, run_id, written)
    assert len(batches) == 1
    read = SweepRun.from_run(mlflow_store.read_run(mlflow_uri, run_id))
    assert read.jobs_done == 3 and read.jobs_failed is None
    assert read == SweepRun(**{**written.__dict__, "name": read.name})  # MLflow names an unnamed run itself



def test_negative_integers_read_back_as_written():
    """Lightning's -1s (`trainer.max_steps=-1`: no step limit; `trainer.devices=-1`: every device) are numbers, not
    missing values; a value that is no integer reads as none."""
    run = mlflow_store.RunRecord("r", "0", "FINISHED", 0, 0, "active",
                                 {JOB.max_steps: "-1", JOB.devices: "-1", JOB.batch_size: "1.5"}, {JOB.seed: "-7"}, {})
    read = JobRun.from_run(run)
    assert (read.max_steps, read.devices, read.seed, read.batch_size) == (-1, -1, -7, None)
