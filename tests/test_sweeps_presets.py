"""The launcher and search presets compose into what their comments promise (no job runs here)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

import sweeplab.sweep.callback  # noqa: F401  (registers the ${sweeplab_gpu_slots:} resolver)
from conftest import compose_train


@pytest.mark.parametrize(("gpus", "devices", "jobs"), [("0,1,2,3", 1, 4), ("0,1,2,3", 2, 2), ("0,1,2", 2, 1), ("", 1, 1)])
def test_joblib_gpus_runs_as_many_jobs_as_fit_the_gpus(monkeypatch, gpus, devices, jobs):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", gpus)
    cfg = compose_train(["hydra/launcher=joblib_gpus", f"trainer.devices={devices}"], return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith("JoblibLauncher")
    assert cfg.hydra.launcher.n_jobs == jobs
    assert cfg.hydra.callbacks.mlflow_sweep.assign_gpus is True


def test_slurm_preset_one_task_per_gpu_and_a_required_partition():
    cfg = compose_train(["hydra/launcher=slurm", "trainer.devices=4"], return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    assert launcher.gpus_per_node == launcher.tasks_per_node == 4 and launcher.nodes == 1
    assert launcher.timeout_min > 0 and launcher.max_num_timeout == 3  # a job at its time limit is requeued, 3 times
    assert OmegaConf.missing_keys(launcher) == {"hydra.launcher.partition"}
    given = compose_train(["hydra/launcher=slurm", "hydra.launcher.partition=gpu"], return_hydra_config=True)
    assert given.hydra.launcher.partition == "gpu" and not OmegaConf.missing_keys(given.hydra.launcher)


def test_slurm_preset_keys_are_the_plugins_own():
    from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf

    cfg = compose_train(["hydra/launcher=slurm"], return_hydra_config=True)
    assert set(cfg.hydra.launcher) == set(OmegaConf.structured(SlurmQueueConf))


def test_optuna_alpha_beta_searches_textbridge_loss_weights_for_the_best_val_cos():
    cfg = compose_train(["hparams_search=optuna_alpha_beta"], return_hydra_config=True)
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_.endswith("sweeper.search.OptunaSearch") and cfg.hydra.mode.name == "MULTIRUN"
    assert sweeper.direction == "maximize" and sweeper.sampler._target_ == "optuna.samplers.TPESampler"
    assert sweeper.sampler.seed == cfg.seed  # the search is as reproducible as its jobs
    assert set(sweeper.params) == {"loss.alpha", "loss.beta", "optim.lr"}
    assert cfg.model.family == "textbridge"


def test_optuna_lm_searches_alpha_mode_and_lr_for_the_lowest_val_ppl():
    cfg = compose_train(["hparams_search=optuna_lm"], return_hydra_config=True)
    sweeper = cfg.hydra.sweeper
    assert sweeper.direction == "minimize" and set(sweeper.params) == {"model.alpha", "optim.lr"}
    assert "learnable" in sweeper.params["model.alpha"] and "cosine" in sweeper.params["model.alpha"]
    assert cfg.model.family == "pagating_lm" and cfg.hydra.runtime.choices.data == "pagating_lm"
