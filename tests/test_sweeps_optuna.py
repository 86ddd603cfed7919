"""Optuna searches through hydra-optuna-sweeper: every trial is a job with its own run, the parent names the best."""

from __future__ import annotations

import pytest
import yaml
from mlflow.tracking import MlflowClient

from test_sweeps_parallel import assert_one_sweep, smoke, sweep


@pytest.mark.slow  # ~20 s; test_optuna_trials_that_differ_in_any_param covers the sweeper in the default suite
def test_optuna_alpha_beta_runs_8_trials_and_the_parent_shows_the_best(demo_dir, mlflow_uri, tmp_path):
    result = sweep(
        tmp_path, "hparams_search=optuna_alpha_beta", "hydra.sweeper.n_trials=8",
        *smoke(demo_dir, "data.batch_size=16", "trainer.max_steps=4", "trainer.val_check_interval=2"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    parent, trials = assert_one_sweep(mlflow_uri, 8, "textbridge-optuna-alpha-beta-lr")
    assert len({(r.data.params["loss.alpha"], r.data.params["loss.beta"], r.data.params["optim.lr"]) for r in trials}) == 8
    (sweep_dir,) = (tmp_path / "multirun").glob("*/*")
    optuna_best = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    parent = MlflowClient(mlflow_uri).get_run(parent.info.run_id)
    # the parent's best is Optuna's best: same value, same parameters, and the run that produced them
    assert parent.data.metrics["best/objective"] == pytest.approx(optuna_best["best_value"])
    best = next(r for r in trials if r.info.run_id == parent.data.tags["best_run_id"])
    assert best.data.metrics["objective"] == max(r.data.metrics["objective"] for r in trials)
    for key, value in optuna_best["best_params"].items():
        assert float(parent.data.params[f"best.{key}"]) == pytest.approx(value)
    assert parent.data.tags["objective"] == "val/cos" and parent.data.tags["objective_mode"] == "max"
    assert parent.data.params["sweep.loss.alpha"] == "interval(0.05, 1.0)"
    reported = {a.path for a in MlflowClient(mlflow_uri).list_artifacts(parent.info.run_id, "report")}
    assert {"report/optimization_results.yaml", "report/objective.png"} <= reported
    assert "best: job " in result.stdout


@pytest.mark.slow  # the default suite's time budget; `make test-all` runs it
def test_optuna_trials_that_differ_in_any_param_have_different_run_names(demo_dir, mlflow_uri, tmp_path):
    """α and β held to one value: only lr differs between the trials, and the names must still tell them apart."""
    result = sweep(
        tmp_path, "hparams_search=optuna_alpha_beta", "hydra.sweeper.n_trials=3", "loss.alpha=choice(0.7)",
        "loss.beta=choice(0.5)", "logger.experiment_name=names",
        *smoke(demo_dir, "data.batch_size=16", "trainer.max_steps=2", "trainer.val_check_interval=2"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    _, trials = assert_one_sweep(mlflow_uri, 3, "names")
    names = {r.info.run_name for r in trials}
    assert len({r.data.params["optim.lr"] for r in trials}) == len(names) == 3, names
    for name in names:  # the swept keys first, where a narrow column still shows them
        assert name.startswith("α=0.7 β=0.5 lr=") and " textbridge tiny bs=16 steps=2 cpu" in name, name


@pytest.mark.slow
def test_optuna_lm_minimises_val_ppl_over_alpha_mode_and_lr(mlflow_uri, tmp_path):
    result = sweep(
        tmp_path, "hparams_search=optuna_lm", "hydra.sweeper.n_trials=3", "debug=smoke", "trainer.max_steps=4",
        "trainer.val_check_interval=2", env={"SWEEPLAB_DATA_DIR": str(tmp_path / "data")},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    parent, trials = assert_one_sweep(mlflow_uri, 3, "pagating-optuna-alpha-lr")
    parent = MlflowClient(mlflow_uri).get_run(parent.info.run_id)
    assert parent.data.tags["objective"] == "val/ppl" and parent.data.tags["objective_mode"] == "min"
    assert parent.data.metrics["best/objective"] == min(r.data.metrics["objective"] for r in trials)
    assert {"best.model.alpha", "best.optim.lr"} <= set(parent.data.params)
