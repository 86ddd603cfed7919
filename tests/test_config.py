"""Every config composes and validates; mistakes fail before any data is read, naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import open_dict

from conftest import CONF_DIR, compose_train
from sweeplab.core.errors import ConfigError, UserError
from sweeplab.engine.plan import plan
from sweeplab.export.coreai_env import missing

GROUPS = ["model", "optim", "trainer", "backend", "logger", "timing", "sweep", "debug", "export"]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml"))


@pytest.mark.parametrize("model", options("model"))
@pytest.mark.parametrize("extra", [[], ["debug=smoke"], ["optim=adam_l2"], ["logger=none"], ["trainer.precision=bf16-mixed"]])
def test_every_model_composes_and_validates(model, extra):
    cfg = compose_train([f"model={model}", *extra])
    p = plan(cfg)
    assert p.family.name == cfg.model.family
    assert p.datamodule.batch_size == cfg.data.batch_size


@pytest.mark.parametrize("group", GROUPS)
def test_every_option_of_every_group_composes(group):
    for option in options(group):
        model = "pagating_lm" if option.startswith("pagating") else "textbridge"
        cfg = compose_train([f"model={model}", f"{group}={option}"])
        if group == "backend" and option in ("cuda", "mps"):
            with pytest.raises(UserError, match=f"backend={option}"):
                plan(cfg)
        elif group == "export" and option == "coreai" and missing():  # without the coreai extra: refused in planning
            with pytest.raises(UserError, match="export.format=coreai"):
                plan(cfg)
        else:
            plan(cfg)


def test_sweep_presets_define_the_study_grid():
    cfg = compose_train(["model=pagating_lm", "sweep=pagating_alpha"], return_hydra_config=True)
    params = cfg.hydra.sweeper.params
    assert params["model.alpha"] == "0.0,0.5,0.8,learnable,cosine" and params["optim.lr"] == "5e-4,1e-4"
    cfg = compose_train(["model=pagating_lm", "sweep=pagating_units"], return_hydra_config=True)
    assert len(cfg.hydra.sweeper.params["model.unit"].split(",")) == 7


def test_a_misspelt_key_on_the_command_line_fails_in_composition():
    with pytest.raises(ConfigCompositionException, match="freze"):
        compose_train(["model.freze=trunk"])
    with pytest.raises(ConfigCompositionException):
        compose_train(["model=textbrige"])


@pytest.mark.parametrize(
    "group,key,value,match",
    [
        ("model", "freze", "trunk", "model.freze: unknown key .*did you mean 'freeze'"),
        ("data", "batchsize", 8, "data.batchsize: unknown key"),
        ("optim", "lr", "fast", "optim.lr: expected float"),
        ("data", "batch_size", "eight", "data.batch_size: expected int"),
        ("trainer", "max_steps", 2.5, "trainer.max_steps: expected int"),
    ],
)
def test_a_typo_or_wrong_type_inside_a_yaml_file_is_named(group, key, value, match):
    cfg = compose_train()
    with open_dict(cfg):
        cfg[group][key] = value
    with pytest.raises(ConfigError, match=match):
        plan(cfg)


@pytest.mark.parametrize(
    "override,match",
    [
        ("data.batch_size=0", "data.batch_size: must be >= 1, got 0"),
        ("data.batch_size=-4", "data.batch_size: must be >= 1, got -4"),
        ("trainer.max_steps=0", "trainer.max_steps: must be >= 1, got 0"),
        ("optim.lr=0", "optim: lr must be > 0"),
        ("optim.lr=-1e-3", "optim: lr must be > 0"),
        ("loss.alpha=-1", "loss.alpha: must be >= 0, got -1"),
        ("loss.alpha=0", None),
        ("model.freeze=all", "model.freeze='all' is not one of"),
        ("model.size=huge", "model.size: unknown size 'huge'"),
        ("backend=mps", "backend=mps: MPS is not available"),
        ("backend=cuda", "backend=cuda: no CUDA device"),
        ("trainer.precision=16-mixed", "16-mixed needs a GPU"),
        ("trainer.precision=fp8", "trainer.precision: expected '32-true' | 'bf16-mixed' | '16-mixed' | 'bf16-true', got 'fp8'"),
        ("compile=reduce-overhead", "reduce-overhead uses CUDA graphs"),
        ("compile=turbo", "compile: 'turbo' is not one of"),
        ("compile_scope=layers", "compile_scope: 'layers' is not one of whole, regions"),
        ("compile_validation=sometimes", "compile_validation: expected true or false"),
    ],
)
def test_bad_values_fail_before_training(override, match):
    cfg = compose_train([override])
    if match is None:  # alpha 0 with beta > 0 is a valid MSE-only loss
        plan(cfg)
        return
    with pytest.raises(UserError, match=match):
        plan(cfg)


def test_both_loss_weights_zero_is_refused():
    with pytest.raises(ConfigError, match="alpha and beta are both 0"):
        plan(compose_train(["loss.alpha=0", "loss.beta=0"]))


@pytest.mark.parametrize(
    "override,match",
    [
        ("model.alpha=1.5", "alpha"),
        ("model.alpha=sometimes", "alpha"),
        ("model.ffn=moe", "model.ffn='moe'"),
        ("model.unit=paFOO", "paFOO"),
    ],
)
def test_bad_lm_values_fail_before_training(override, match):
    cfg = compose_train(["model=pagating_lm", override])
    with pytest.raises(UserError, match=match):
        plan(cfg)


def test_the_lm_takes_no_loss_weights():
    cfg = compose_train(["model=pagating_lm"])
    with open_dict(cfg):
        cfg.loss = {"alpha": 0.5}  # the LM has no loss group (optional since the family contract of issue 25)
    with pytest.raises(ConfigError, match="loss.alpha"):
        plan(cfg)
