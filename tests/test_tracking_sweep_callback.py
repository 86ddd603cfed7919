"""The study and the sweep callback without running jobs: the sweep run and how it reaches jobs, which sweeper opens
the study, required launcher keys, the best job on the sweep run."""

from __future__ import annotations

import os

import pytest
from mlflow.tracking import MlflowClient
from omegaconf import open_dict

from conftest import compose_train
from sweeplab.core import channels
from sweeplab.core.errors import UserError
from sweeplab.study.sweep import sweep_from_runs
from sweeplab.sweep.best import record_best
from sweeplab.sweep.callback import MLflowSweepCallback
from sweeplab.sweep.study import Study
from sweeplab.tracking import mlflow_store


def _sweep_config(tmp_path, *overrides):
    cfg = compose_train(list(overrides), return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.sweep.dir = str(tmp_path / "multirun" / "day" / "time")
    return cfg


def test_the_sweep_run_reaches_jobs_through_the_environment_and_the_sweep_dir(mlflow_uri, tmp_path, monkeypatch):
    monkeypatch.delenv(channels.PARENT_RUN_ENV, raising=False)
    cfg = _sweep_config(tmp_path, "data.batch_size=4")
    study = Study.open(cfg, print_report=False)
    parent_id = study.parent_run_id
    assert os.environ[channels.PARENT_RUN_ENV] == parent_id  # joblib/loky workers and submitit jobs inherit it
    assert (tmp_path / "multirun/day/time" / channels.PARENT_RUN_FILE).read_text() == parent_id
    parent = MlflowClient(mlflow_uri).get_run(parent_id)
    assert parent.data.tags["sweeplab.role"] == "sweep" and parent.data.tags["sweep_id"] == "day/time"
    assert parent.data.tags["mlflow.runName"] == "sweep day/time"  # one name for the sweep: run name, tag, report
    assert parent.info.status == "RUNNING"
    assert channels.open_sweep is study  # what the entry point closes after an interrupt
    study.finish()
    assert MlflowClient(mlflow_uri).get_run(parent_id).info.status == "FINISHED"
    assert channels.PARENT_RUN_ENV not in os.environ and channels.open_sweep is None


def test_the_callback_opens_a_study_only_for_a_sweeper_that_holds_none(mlflow_uri, tmp_path, monkeypatch):
    monkeypatch.delenv(channels.PARENT_RUN_ENV, raising=False)
    callback = MLflowSweepCallback(print_report=False)
    callback.on_multirun_start(_sweep_config(tmp_path, "data.batch_size=4"))  # the sweeplab sweeper: it holds its own
    assert callback.study is None and channels.PARENT_RUN_ENV not in os.environ
    cfg = _sweep_config(tmp_path, "data.batch_size=4", "replicates=1", "hydra/sweeper=basic")
    callback.on_multirun_start(cfg)
    parent_id = callback.study.parent_run_id
    assert MlflowClient(mlflow_uri).get_run(parent_id).data.tags["sweeper"] == "basic"
    callback.on_multirun_end(cfg)
    assert callback.study is None and MlflowClient(mlflow_uri).get_run(parent_id).info.status == "FINISHED"


def test_a_study_the_sweeper_opens_refuses_a_missing_data_path_in_one_line_before_its_run(mlflow_uri, tmp_path):
    cfg = _sweep_config(tmp_path, f"data.path={tmp_path / 'nope.jsonl'}")
    with pytest.raises(UserError, match="data.path: .*nope.jsonl: no such file or directory"):
        Study.open(cfg)
    client = MlflowClient(mlflow_uri)
    assert [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])] == []


def test_a_missing_slurm_partition_stops_the_sweep_with_one_line(mlflow_uri, tmp_path, capsys):
    cfg = _sweep_config(tmp_path, "hydra/launcher=slurm", "hydra/sweeper=basic", "replicates=1")
    with pytest.raises(SystemExit) as stop:
        MLflowSweepCallback().on_multirun_start(cfg)
    assert stop.value.code == 2
    message = "error: hydra.launcher.partition is required by hydra/launcher=slurm: add hydra.launcher.partition=..."
    assert message in capsys.readouterr().err.splitlines()


def test_a_missing_data_path_stops_the_sweep_before_its_run_exists(mlflow_uri, tmp_path, capsys):
    cfg = _sweep_config(tmp_path, f"data.path={tmp_path / 'nope.jsonl'}", "hydra/sweeper=basic", "replicates=1")
    with pytest.raises(SystemExit) as stop:
        MLflowSweepCallback().on_multirun_start(cfg)
    assert stop.value.code == 2
    assert f"error: config error: data.path: {tmp_path / 'nope.jsonl'}: no such file or directory" in capsys.readouterr().err
    client = MlflowClient(mlflow_uri)
    assert [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])] == []


def _child(client, experiment_id, parent_id, objective, mode, **params):
    run = client.create_run(experiment_id, tags={"mlflow.parentRunId": parent_id, "objective": "val/ppl",
                                                 "objective_mode": mode, "hydra_job": str(len(params))})
    for key, value in params.items():
        client.log_param(run.info.run_id, key, value)
    client.log_metric(run.info.run_id, "objective", objective)
    client.set_terminated(run.info.run_id)
    return client.get_run(run.info.run_id)


@pytest.mark.parametrize(("search", "expected_lr"), [([], "1e-4"), (["hparams_search=optuna_alpha_beta"], "5e-4")])
def test_the_parent_names_the_best_job_in_the_sweeps_direction(mlflow_uri, tmp_path, search, expected_lr):
    client = MlflowClient(mlflow_uri)
    experiment_id = mlflow_store.init_store(mlflow_uri, "sweeplab")
    parent_id = client.create_run(experiment_id).info.run_id
    children = [
        _child(client, experiment_id, parent_id, 30.0, "min", **{"optim.lr": "5e-4", "data.seed": "0"}),
        _child(client, experiment_id, parent_id, 20.0, "min", **{"optim.lr": "1e-4", "data.seed": "0"}),
    ]
    cfg = _sweep_config(tmp_path, *search)  # Optuna's direction (maximize) overrules the jobs' own mode (min)
    line = record_best(mlflow_uri, parent_id, sweep_from_runs(None, children), cfg)
    parent = client.get_run(parent_id)
    assert parent.data.params == {"best.optim.lr": expected_lr}  # what varied, not what stayed
    best = next(r for r in children if r.data.params["optim.lr"] == expected_lr)
    assert parent.data.tags["best_run_id"] == best.info.run_id and parent.data.tags["objective"] == "val/ppl"
    assert parent.data.metrics["best/objective"] == best.data.metrics["objective"]
    assert line.startswith("job ") and f"optim.lr={expected_lr}" in line


# --- the study's shape: the sweeper holds it, the callback keeps the job side ----------------------------------------

SRC = __import__("pathlib").Path(__file__).resolve().parents[1] / "src"


def test_the_sweeper_reaches_its_study_through_the_object_it_holds_not_the_environment():
    """The sweeplab sweeper learns its study's state from its `Study` (no sweep run id in the environment between two
    objects of one process), and the callback is the job-side hooks plus a study for sweepers that hold none."""
    import ast

    for path in (SRC / "sweeplab/sweep/grid.py", SRC / "sweeplab/study/rounds.py"):
        text = path.read_text(encoding="utf-8")
        assert "os.environ" not in text and "PARENT_RUN_ENV" not in text, path
    from sweeplab.sweep.grid import SweeplabSweeper

    assert SweeplabSweeper.holds_study and "self.study" in (SRC / "sweeplab/sweep/grid.py").read_text()
    callback = (SRC / "sweeplab/sweep/callback.py").read_text(encoding="utf-8")
    assert len(callback.splitlines()) <= 200
    imported = {node.module for node in ast.walk(ast.parse(callback)) if isinstance(node, ast.ImportFrom)}
    assert not any(name == "mlflow" or name.startswith("mlflow.") for name in imported if name)
