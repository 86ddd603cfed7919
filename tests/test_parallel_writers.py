"""8 jobs logging every step to one sqlite store at once lose no metric (the store initialised first)."""

from __future__ import annotations

import multiprocessing as mp

import pytest
from mlflow.tracking import MlflowClient

from sweeplab.tracking.mlflow_store import init_store

STEPS = 60


def _writer(uri: str, experiment_id: str, index: int) -> str:
    client = MlflowClient(uri)
    run = client.create_run(experiment_id, run_name=f"writer {index}")
    for step in range(STEPS):
        client.log_metric(run.info.run_id, "train/loss", float(index * 1000 + step), step=step)
    client.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id


@pytest.mark.slow  # ~16 s: eight processes on one store (test_concurrent_store keeps four in the default suite)
def test_eight_parallel_writers_lose_no_metric(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    experiment_id = init_store(uri, "parallel")
    with mp.get_context("spawn").Pool(8) as pool:
        run_ids = pool.starmap(_writer, [(uri, experiment_id, i) for i in range(8)])
    client = MlflowClient(uri)
    for index, run_id in enumerate(run_ids):
        history = client.get_metric_history(run_id, "train/loss")
        assert sorted(m.step for m in history) == list(range(STEPS))
        assert {m.value for m in history} == {float(index * 1000 + s) for s in range(STEPS)}
        assert client.get_run(run_id).info.status == "FINISHED"
