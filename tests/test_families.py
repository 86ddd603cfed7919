"""Model families from outside sweeplab: examples/mlp_regressor installed the way a user installs it (a wheel built
from its pyproject, entry point and configs included) and trained, reported and benched through the CLI; the
family record's contract checks."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from console_formats import foreign_lines
from sweeplab.core.errors import ConfigError, UserError
from sweeplab.data.sampling import ResumableShuffleBatchSampler, check_resumable
from sweeplab.families.pagating_lm.task import LMTask

CHECKOUT = Path(__file__).resolve().parents[1]
EXAMPLE = CHECKOUT / "examples" / "mlp_regressor"


def test_the_example_installs_without_a_warning_and_with_its_configs(example_install):
    """`pip install ./examples/mlp_regressor` is the template authors copy: setuptools' "Package would be ignored"
    warnings for its conf folders (a later setuptools may leave their YAML out) must not come back."""
    site, output = example_install
    assert "warning" not in output.lower(), [line for line in output.splitlines() if "warning" in line.lower()][:5]
    shipped = sorted(str(p.relative_to(site / "mlp_regressor")) for p in (site / "mlp_regressor").rglob("*.yaml"))
    assert shipped == sorted(str(p.relative_to(EXAMPLE / "mlp_regressor")) for p in (EXAMPLE / "mlp_regressor").rglob("*.yaml"))
    assert shipped and (site / "mlp_regressor" / "__init__.py").is_file()


def _run(args: list[str], site: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_an_installed_family_trains_reports_and_benches_through_the_cli(example_site, mlflow_uri, tmp_path):
    from mlflow.tracking import MlflowClient

    sweep = _run(["sweeplab.train", "-m", "debug=smoke", "model=mlp_regressor", "data.batch_size=16,32",
                  f"hydra.sweep.dir={tmp_path / 'sweep'}"], example_site, tmp_path)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    runs = MlflowClient(mlflow_uri).search_runs(["1"], "tags.family = 'mlp_regressor'")
    assert sorted(r.data.params["data.batch_size"] for r in runs) == ["16", "32"]
    for run in runs:
        assert run.info.status == "FINISHED"
        assert run.data.metrics["summary/samples_per_sec"] > 0  # samples counted from the batch's leading dimension
        assert "summary/tokens_per_sec" not in run.data.metrics  # no tokens: none reported, not 0
        assert "val/r2" in run.data.metrics and run.data.tags["objective"] == "val/loss"
        assert run.data.tags["monitor"] == "val/loss" and run.data.tags["monitor_mode"] == "min"
        assert "train/mae" in run.data.metrics and "mae" not in run.data.metrics  # under the step's prefix
        # what size=tiny expanded to, as params (the group's own keys are null)
        assert run.data.params["model.hidden"] == "16" and run.data.params["model.n_layers"] == "1"
        assert not [k for k, v in run.data.params.items() if k.startswith("model.") and v == "None"]
    report = (tmp_path / "sweep" / "report.md").read_text()
    assert "val/loss" in report and "val R²" not in report  # one metric: the one the jobs monitor
    assert foreign_lines(sweep.stdout + sweep.stderr, report) == [], sweep.stdout + sweep.stderr

    bench = _run(["sweeplab.bench", "experiment=bench_mlp", "bench.steps=5", "bench.warmup_steps=1", "bench.repeats=1"],
                 example_site, tmp_path)
    assert bench.returncode == 0, bench.stderr[-3000:]
    (written,) = (tmp_path / "reports" / "bench").glob("*/bench.csv")
    (row,) = csv.DictReader(written.open())
    assert row["row"] == "MLP regressor CPU" and float(row["overhead"]) > 0
    assert "no noise estimate (1 pair)" in row["status"]  # one pair: an overhead, but not an `ok`
    bench_md = written.with_name("bench.md").read_text()
    assert foreign_lines(bench.stdout + bench.stderr, bench_md) == [], bench.stdout + bench.stderr


def test_no_sweeplab_file_names_the_example_family():
    tracked = subprocess.run(["git", "ls-files", "src", "Makefile", "pyproject.toml"], cwd=CHECKOUT,
                             capture_output=True, text=True, check=True).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout")
    assert [f for f in tracked if "mlp_regressor" in (CHECKOUT / f).read_text(errors="ignore")] == []


def _register(tmp_path: Path, monkeypatch, name: str, value: str) -> None:
    """A distribution on sys.path whose only content is a `sweeplab.families` entry point."""
    dist = tmp_path / f"fake_{name}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fake-{name}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[sweeplab.families]\n{name} = {value}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from sweeplab import families

    families._entry_points.cache_clear()  # cleared again by the test on the way out
    families.get_family.cache_clear()


def test_a_registered_entry_point_that_is_not_a_family_is_one_line(tmp_path, monkeypatch):
    from sweeplab import families

    _register(tmp_path, monkeypatch, "broken", "json:dumps")
    try:
        assert "broken" in families.names()
        with pytest.raises(UserError, match="entry point json:dumps is a function, not a sweeplab Family"):
            families.get_family("broken")
    finally:
        families._entry_points.cache_clear()
        families.get_family.cache_clear()


def test_an_unknown_family_lists_the_known_ones():
    from sweeplab.families import get_family

    with pytest.raises(ConfigError, match="unknown family 'nope'; accepted: textbridge, pagating_lm"):
        get_family("nope")


def test_a_loader_without_the_resumable_sampler_is_refused_for_ddp_and_resume():
    data = list(range(10))
    with pytest.raises(UserError, match="ResumableShuffleBatchSampler, which trainer.devices > 1 needs"):
        check_resumable(DataLoader(data, batch_size=2), "trainer.devices > 1")
    check_resumable(DataLoader(data, batch_sampler=ResumableShuffleBatchSampler(10, 2, seed=0)), "resume")


def test_samples_are_counted_from_the_leading_dimension_of_any_batch():
    from sweeplab.tasks.base import SweepTask

    task = SweepTask.__new__(SweepTask)  # samples_in reads nothing of the task
    assert task.samples_in({"x": torch.zeros(7, 3), "y": torch.zeros(7)}) == 7
    assert task.samples_in((torch.zeros(5, 2), torch.zeros(5))) == 5
    assert task.samples_in({"pair": (torch.zeros(3, 1),)}) == 3
    with pytest.raises(TypeError, match="leading dimension"):
        task.samples_in({"scale": torch.tensor(1.0)})


# --- the family contract: each missing piece is one line naming it, before any training ---------------------------
class _NotATask:
    family = ""


class _UnnamedLMTask(LMTask):
    family = ""  # left to the record, which names it


def _small_family(**changes):
    """The paGating LM as a record of targets (nothing is imported or built until a check asks)."""
    from sweeplab.families import Family

    fields = dict(
        monitor="val/ppl", monitor_mode="min", model_config="sweeplab.models.gpt:GPTConfig", model="sweeplab.models.gpt:GPT",
        datamodule="sweeplab.families.pagating_lm.data:LMDataModule", task=f"{__name__}:_UnnamedLMTask",
        model_keys_for_data=("block_size",),
    )
    return Family("forgetful", **{**fields, **changes})


@pytest.mark.parametrize(
    ("changes", "config", "message"),
    [
        ({}, {}, None),  # the whole record: passes
        ({"model_config": None}, {}, "family forgetful: its record has no model_config; set model_config="),
        ({"datamodule": None}, {}, "family forgetful: its record has no datamodule; set datamodule="),
        ({"task": None}, {}, "family forgetful: its record has no task; set task="),
        ({"sizes": {"small": {}}}, {}, "its sizes \\(small\\) have no 'tiny', which debug=smoke"),
        ({"task": f"{__name__}:_NotATask"}, {}, "is not a subclass of sweeplab.tasks.base.SweepTask"),
        ({"task": "sweeplab.families.pagating_lm.task:NoSuchTask"}, {}, "task='sweeplab.families.pagating_lm.task:NoSuchTask'"),
        ({"monitor": ""}, {}, "monitor='' names no logged metric"),
        ({}, {"export": {"format": "coreml"}}, "the forgetful family has no Core ML export"),
        ({}, {"backend": {"name": "mlx"}}, "the forgetful family has no MLX port"),
    ],
    ids=["complete", "model_config", "datamodule", "task", "tiny", "not-a-SweepTask", "bad-target", "monitor", "export", "mlx"],
)
def test_a_family_forgetting_a_contract_piece_is_refused_at_plan_time(changes, config, message):
    from sweeplab.families import check_contract

    family = _small_family(**changes)
    if message is None:
        check_contract(family, config)
        return
    with pytest.raises((UserError, ConfigError), match=message):
        check_contract(family, config)


def test_a_task_keeping_no_model_config_is_refused_before_training(tmp_path):
    from sweeplab.families import check_task
    from sweeplab.models.gpt import SIZES, GPTConfig
    from sweeplab.tasks.base import SweepTask
    from sweeplab.tasks.optim import OptimConfig

    family = _small_family()
    config = GPTConfig(**SIZES["tiny"], vocab_size=300)
    check_task(family, family.make_task(config, {}, OptimConfig()))  # the record's builder: family name and hparams set

    class Forgetful(SweepTask):  # a model without a dataclass `config`, and no hparams passed
        family = "forgetful"

        def __init__(self, model_config, loss, optim):
            super().__init__(torch.nn.Linear(2, 2), optim)

    with pytest.raises(UserError, match="keeps no model config in hparams\\['model'\\]"):
        check_task(family, Forgetful(config, None, OptimConfig()))
    with pytest.raises(UserError, match="says family='pagating_lm'; set it to 'forgetful'"):
        check_task(family, LMTask(config, None, OptimConfig()))
    assert not list(tmp_path.iterdir())  # nothing trained, nothing written


def test_a_registered_family_without_config_searchpath_is_named_at_composition(tmp_path, monkeypatch):
    from sweeplab import families
    from sweeplab.sweep.checks import composition_error

    monkeypatch.setattr(families, "_entry_points", lambda: {"forgetful": None})
    monkeypatch.setattr(families, "get_family", lambda name: _small_family())
    exc = Exception("In 'train': Could not find 'model/forgetful'")
    assert "family forgetful sets no config_searchpath" in str(composition_error(exc))
    assert families.missing_config_hint("Could not find 'model/textbridge2'") is None  # not a registered family


@pytest.mark.parametrize(("removed", "message"), [
    ({"build_task": lambda config, loss, optim: None},
     "family old_style: its record passes build_task, a field removed after sweeplab 0.1; write task='pkg.task:Task' "
     "(built as Task(model_config, loss, optim)) (docs/families.md)"),
    ({"build_model_config": lambda values: values, "report_params": ("model.x",)},
     "family old_style: its record passes build_model_config, report_params, fields removed after sweeplab 0.1; "
     "build_model_config: write model_config='pkg.model:Config'; report_params: write report_keys=(...) (docs/families.md)"),
    ({"data_keys": ("vocab_size",)}, "family old_style: its record passes data_keys, a field removed after sweeplab 0.1; drop it"),
    ({"modle": "pkg.model:Model"}, "family old_style: its record passes modle, which is not a field of Family; did you mean model?"),
], ids=["build_task", "two", "data_keys", "typo"])
def test_a_record_passing_a_removed_field_is_refused_in_one_line(removed, message, tmp_path, monkeypatch):
    """A record written for sweeplab 0.1 fails when it is constructed, in one line naming the field and what to
    write instead (not the dataclass's TypeError); through an entry point the line comes back as it is."""
    from sweeplab import families

    with pytest.raises(UserError) as raised:
        families.Family("old_style", monitor="val/loss", monitor_mode="min", **removed)
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)

    package = tmp_path / "old_style_family.py"
    keywords = ", ".join(f"{key}={value!r}" for key, value in removed.items() if not callable(value))
    package.write_text("from sweeplab.families import Family\n"
                       f"FAMILY = Family('old_style', monitor='val/loss', monitor_mode='min', {keywords or 'build_task=print'})\n")
    _register(tmp_path, monkeypatch, "old_style", "old_style_family:FAMILY")
    try:
        with pytest.raises(UserError, match="^family old_style: its record passes "):
            families.get_family("old_style")
    finally:
        families._entry_points.cache_clear()
        families.get_family.cache_clear()


def test_a_record_survives_replace_and_builds_from_its_targets():
    """dataclasses.replace goes through the same constructor; the methods build from the new targets."""
    import dataclasses

    from omegaconf import OmegaConf

    from sweeplab.models.gpt import SIZES, GPTConfig

    family = dataclasses.replace(_small_family(), name="renamed", default_size="tiny")
    config = family.make_model_config({"vocab_size": 300})
    assert config == GPTConfig(**{**SIZES["tiny"], "vocab_size": 300})
    assert family.rebuild_model_config(dataclasses.asdict(config)) == config
    assert family.fitted_model_config(config, None, {}) is config  # the default fit: the data decides nothing
    named = dataclasses.replace(family, name_keys=("model.x", "model.y"), labels={"model.x": "ex"})
    assert named.run_name_parts(OmegaConf.create({"model": {"x": 1, "y": None}})) == {"model.x": "ex=1"}


def test_the_example_family_stays_a_dozen_lines_of_record_and_150_of_code():
    """The contract's promise, held: the example's record is at most 15 lines, the whole example at most 150 non-blank
    lines of Python, YAML and TOML, and no config file is empty."""
    example = Path(__file__).resolve().parents[1] / "examples" / "mlp_regressor"
    files = [p for p in example.rglob("*") if p.suffix in (".py", ".yaml", ".toml") and "egg-info" not in str(p)]
    non_blank = {p: [line for line in p.read_text().splitlines() if line.strip()] for p in files}
    assert sum(len(lines) for lines in non_blank.values()) <= 150
    assert [p for p, lines in non_blank.items() if p.suffix == ".yaml" and not any(
        not line.lstrip().startswith("#") and line.strip() != "{}" for line in lines)] == []
    record = (example / "mlp_regressor" / "__init__.py").read_text()
    start = record.index("FAMILY = Family(")
    assert len(record[start:record.index("\n)", start)].splitlines()) + 1 <= 15


def test_a_model_group_without_family_says_what_to_add():
    """The error names the missing `family:` key and where it goes, not the entry point (issue 38)."""
    from omegaconf import OmegaConf, open_dict

    from conftest import compose_train
    from sweeplab.engine.plan import plan

    cfg = compose_train(["debug=smoke"])
    with open_dict(cfg):
        del cfg.model["family"]
    with pytest.raises(ConfigError, match=r"model.family: the model group has no `family:` key; add `family: <the name "
                                          r"in your Family record>` at the top of "):
        plan(cfg)
    assert OmegaConf.select(cfg, "model.family") is None
