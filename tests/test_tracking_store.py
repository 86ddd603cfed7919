"""The tracking store: where it is, how a job finds its sweep's parent run, and an unreachable server failing fast."""

from __future__ import annotations

import os
import socket
import time

import pytest
from mlflow.tracking import MlflowClient

from sweeplab.core import channels
from sweeplab.core.errors import UserError
from sweeplab.core.records import JobRun
from sweeplab.tracking import mlflow_store
from test_sweeps_parallel import sweep


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # free now, nobody listens after the close


def test_a_relative_sqlite_store_is_made_absolute_for_jobs_elsewhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert mlflow_store.resolve_uri() == f"sqlite:///{tmp_path}/mlflow.db"
    assert mlflow_store.resolve_uri("sqlite:///runs/m.db?timeout=30") == f"sqlite:///{tmp_path}/runs/m.db?timeout=30"
    assert mlflow_store.resolve_uri("http://127.0.0.1:5000") == "http://127.0.0.1:5000"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////abs/m.db")
    assert mlflow_store.resolve_uri("sqlite:///ignored.db") == "sqlite:////abs/m.db"


def test_a_job_finds_its_sweeps_parent_file_first_then_the_environment(tmp_path, monkeypatch):
    sweep_dir = tmp_path / "multirun" / "d" / "t"
    sweep_dir.mkdir(parents=True)
    monkeypatch.setenv(channels.PARENT_RUN_ENV, "from-env")
    assert mlflow_store.read_parent_run_id(None) is None  # a single run has no parent, whatever the environment
    assert mlflow_store.read_parent_run_id(str(sweep_dir)) == "from-env"  # a job that cannot see the file
    (sweep_dir / channels.PARENT_RUN_FILE).write_text("from-file\n")
    assert mlflow_store.read_parent_run_id(str(sweep_dir)) == "from-file"  # names this very sweep: wins
    monkeypatch.delenv(channels.PARENT_RUN_ENV)
    assert mlflow_store.read_parent_run_id(str(sweep_dir)) == "from-file"


def test_an_unreachable_tracking_server_fails_fast_with_its_uri():
    uri = f"http://127.0.0.1:{_closed_port()}"
    start = time.perf_counter()
    with pytest.raises(UserError) as error:
        mlflow_store.init_store(uri, "sweeplab")
    assert time.perf_counter() - start < 5
    message = str(error.value)
    assert uri in message and "\n" not in message and "not reachable" in message


def test_an_unreachable_server_stops_a_sweep_before_any_job_with_one_line(demo_dir, tmp_path):
    uri = f"http://127.0.0.1:{_closed_port()}"
    result = sweep(tmp_path, "-m", "debug=smoke", f"data.path={demo_dir}", "data.batch_size=4,8", env={"MLFLOW_TRACKING_URI": uri})
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [f"error: MLflow tracking server {uri} is not reachable (ConnectionError); start it (`mlflow server`) "
                     "or point MLFLOW_TRACKING_URI elsewhere"]
    assert not list(tmp_path.glob("multirun/*/*/0"))  # no job started


def test_the_job_run_is_what_the_sweep_callback_records_the_objective_on(mlflow_uri):
    with mlflow_store.JobRun(mlflow_uri, "sweeplab", JobRun(name="a job", config_params={"a": 1})) as job:
        assert mlflow_store.current_run_id() == job.run_id
    mlflow_store.forget_current_run()
    assert mlflow_store.current_run_id() is None
    assert MlflowClient(mlflow_uri).get_run(job.run_id).info.status == "FINISHED"


def test_a_job_run_ends_only_after_its_asynchronous_metric_writes_are_stored(mlflow_uri, monkeypatch):
    """JobRun relies on MLflow's set_terminated draining the asynchronous queue first; this holds it to that."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    from sweeplab.tracking.run_logger import ResumingMLFlowLogger

    real_log_batch = SqlAlchemyStore.log_batch

    def slow_log_batch(self, run_id, metrics=(), *args, **kwargs):
        if metrics:
            time.sleep(0.3)  # a slow store: the writes are still queued when the job's body ends
        return real_log_batch(self, run_id, metrics, *args, **kwargs)

    monkeypatch.setattr(SqlAlchemyStore, "log_batch", slow_log_batch)
    started = time.perf_counter()
    with mlflow_store.JobRun(mlflow_uri, "async", JobRun(name="a job", config_params={})) as job:
        logger = ResumingMLFlowLogger(experiment_name="async", tracking_uri=mlflow_uri, run_id=job.run_id,
                                      synchronous=False)
        for step in range(10):
            logger.log_metrics({"loss": float(step)}, step=step)
        logger.send_held()  # as training does when fit ends: asynchronous writes, not waited for here
    history = MlflowClient(mlflow_uri).get_metric_history(job.run_id, "loss")
    assert sorted(m.step for m in history) == list(range(10))
    assert MlflowClient(mlflow_uri).get_run(job.run_id).info.status == "FINISHED"
    assert time.perf_counter() - started < 5


def test_experiments_open_in_the_uis_machine_learning_view_also_when_made_before(mlflow_uri):
    client = MlflowClient(mlflow_uri)
    new_id = mlflow_store.init_store(mlflow_uri, "fresh")
    old_id = client.create_experiment("older")  # as MLflow itself or an older sweeplab made it: no kind tag
    assert mlflow_store.init_store(mlflow_uri, "older") == old_id
    for experiment_id in (new_id, old_id):
        tags = client.get_experiment(experiment_id).tags
        assert tags.get(mlflow_store.EXPERIMENT_KIND_TAG) == "custom_model_development"


@pytest.mark.slow  # the default suite's time budget; tests/test_ui_view.py covers make ui's address for a replicated sweep
def test_make_ui_prints_the_latest_sweeps_runs_in_the_machine_learning_view(demo_dir, mlflow_uri, tmp_path):
    import subprocess
    import sys

    from test_sweeps_parallel import smoke

    result = sweep(tmp_path, "-m", *smoke(demo_dir, "data.batch_size=8,16"), "trainer.max_steps=2")
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(mlflow_uri)
    (parent,) = client.search_runs(
        [e.experiment_id for e in client.search_experiments()], "tags.`sweeplab.role` = 'sweep'"
    )
    env = {k: v for k, v in os.environ.items() if k != mlflow_store.UI_URL_ENV}
    out = subprocess.run(
        [sys.executable, "-m", "sweeplab.ui", "--no-serve"], capture_output=True, text=True, check=True, env=env
    ).stdout
    assert f"http://127.0.0.1:5000/#/experiments/{parent.info.experiment_id}/runs?workflowType=machine_learning" in out
    assert parent.info.run_id in out  # the filter names this sweep's jobs
    # where the jobs' closing lines say the UI is (test_console), make ui serves it
    moved = subprocess.run([sys.executable, "-m", "sweeplab.ui", "--no-serve"], capture_output=True, text=True,
                           check=True, env={**env, mlflow_store.UI_URL_ENV: "http://127.0.0.1:5123"}).stdout
    assert f"http://127.0.0.1:5123/#/experiments/{parent.info.experiment_id}/runs?" in moved


def test_metric_points_wait_in_the_process_until_a_pause_or_their_time_is_up(mlflow_uri):
    """A write costs the training process host time even from MLflow's thread, so points logged during training are
    held: nothing reaches the store until the job pauses (send_held) or the oldest point has waited its time; then all
    of them arrive, each with the step and time it was logged at."""
    from mlflow.entities import Metric

    from sweeplab.tracking.run_logger import _PendingWritesClient

    now = [0.0]
    with mlflow_store.JobRun(mlflow_uri, "held", JobRun(name="a job", config_params={})) as job:
        client = _PendingWritesClient(mlflow_uri, hold_s=30.0, clock=lambda: now[0])
        stored = lambda: sorted((m.step, m.timestamp) for m in MlflowClient(mlflow_uri).get_metric_history(job.run_id, "loss"))  # noqa: E731
        for step in range(5):
            now[0] = step * 5.0
            client.log_batch(job.run_id, metrics=[Metric("loss", float(step), 1000 + step, step)], synchronous=False)
        client.log_batch(job.run_id, params=[], tags=[], metrics=[])  # not a metric write: straight through
        for operation in client.pending:
            operation.wait()
        assert stored() == []
        now[0] = 31.0  # the first point has waited 31 s: this write sends all six
        client.log_batch(job.run_id, metrics=[Metric("loss", 5.0, 1005, 5)], synchronous=False)
        client.wait_for_writes()
        assert stored() == [(step, 1000 + step) for step in range(6)]
        client.log_batch(job.run_id, metrics=[Metric("loss", 6.0, 1006, 6)], synchronous=False)
        client.send_held()
        client.wait_for_writes()
        assert stored()[-1] == (6, 1006)
