"""Every job's run holds its model as built: what `size` expanded to and what the data decided, never the model
group's null keys (issue 38: `model.d_model: None` on every run made runs incomparable by width or depth in MLflow).
TextBridge is checked in test_train_smoke, the example family in test_families."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient
from omegaconf import open_dict

from conftest import compose_train
from sweeplab.tasks.base import train_metric_names

SHORT = ["debug=smoke", "trainer.max_steps=2", "trainer.val_check_interval=2", "trainer.log_every_n_steps=1",
         "trainer.limit_val_batches=1", "timing.warmup_steps=0", "timing.window=1", "optim.warmup_steps=1"]


@pytest.mark.slow  # a short training run each (~20 s on 2 busy cores)
@pytest.mark.parametrize(("overrides", "expected"), [
    (["model=pagating_lm"], {"model.n_layer": "2", "model.d_model": "64", "model.d_ff": "256", "model.n_head": "2"}),
    (["model=textbridge_decoder", "data.batch_size=16", "model.max_len=32"],
     {"model.n_layer": "2", "model.d_model": "64", "model.d_ff": "256"}),
], ids=["pagating_lm", "textbridge_decoder"])
def test_a_runs_params_hold_the_model_as_built(overrides, expected, demo_dir, mlflow_uri):
    from sweeplab.engine.training import train

    extra = [f"data.path={demo_dir}"] if "model=textbridge_decoder" in overrides else []
    cfg = compose_train([*overrides, *SHORT, *extra])
    with open_dict(cfg):
        cfg.trainer.enable_progress_bar = False
    train(cfg)
    client = MlflowClient(mlflow_uri)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments() if e.name == "sweeplab"])
    params = run.data.params
    assert {k: params.get(k) for k in expected} == expected
    assert int(params["model.vocab_size"]) > 0  # the data's tokenizer decided it
    assert not [k for k, v in params.items() if k.startswith("model.") and v == "None"]


def test_extra_training_metrics_are_named_under_the_steps_prefix():
    assert list(train_metric_names({"acc": 1, "train/cos": 2, "aux/kl": 3})) == ["train/acc", "train/cos", "aux/kl"]
