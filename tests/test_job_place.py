"""A job learns its place in its study (configuration index, replicate, round ...) from its config as Hydra composed it
(`hydra.job.env_set`, core/place.py), read once by its entry (sweeplab.train.job_place), not from the environment."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.core.hydra_config import HydraConfig
from mlflow.tracking import MlflowClient

from conftest import compose_train
from sweeplab.core import channels
from sweeplab.core.place import PLACE_VARIABLES, JobPlace
from sweeplab.train import job_place

SRC = Path(__file__).resolve().parents[1] / "src" / "sweeplab"
ENTRY = SRC / "train.py"
_NAMES = {name for name in dir(channels) if getattr(channels, name) in PLACE_VARIABLES}  # REPLICATE_ENV ...


def _is_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ"


def _names_a_place_variable(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in PLACE_VARIABLES
    return (isinstance(node, ast.Name) and node.id in _NAMES) or (isinstance(node, ast.Attribute) and node.attr in _NAMES)


def place_reads(source: str) -> list[int]:
    """The lines of `source` that read a place variable from the environment: os.environ[X], os.environ.get(X),
    os.getenv(X), or the whole environment handed to JobPlace.of_env_set."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript) and _is_environ(node.value) and isinstance(node.ctx, ast.Load):
            key = node.slice
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args and (
                (node.func.attr in ("get", "pop") and _is_environ(node.func.value)) or node.func.attr == "getenv"):
            key = node.args[0]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "of_env_set"
              and any(_is_environ(n) for arg in node.args for n in ast.walk(arg))):
            lines.append(node.lineno)
            continue
        else:
            continue
        if _names_a_place_variable(key):
            lines.append(node.lineno)
    return lines


def test_the_scan_finds_each_way_of_reading_a_place_variable():
    """The scan below would refuse a module that reads its place from the environment."""
    source = ("import os\nfrom sweeplab.core import channels\nfrom sweeplab.core.channels import ROUND_ENV\n"
              "a = os.environ.get(channels.ROUND_ENV, '')\nb = os.environ[ROUND_ENV]\n"
              "c = os.getenv('SWEEPLAB_CONFIG_INDEX')\nd = JobPlace.of_env_set(dict(os.environ))\n"
              "os.environ[channels.LANE_ENV] = 'x'\ne = os.environ.get(channels.SWEEP_PROGRESS_ENV)\n")
    assert place_reads(source) == [4, 5, 6, 7]  # setting one (the lanes' worker) and other variables are fine


def test_no_module_but_the_entry_reads_the_place_from_the_environment():
    readers = {str(path.relative_to(SRC)): lines for path in sorted(SRC.rglob("*.py"))
               if path != ENTRY and (lines := place_reads(path.read_text()))}
    assert readers == {}, f"read the job's place from sweeplab.train.job_place (core/place.py), not os.environ: {readers}"


def test_the_place_reads_its_types_and_is_empty_outside_a_sweep():
    place = JobPlace.of_env_set({channels.CONFIG_INDEX_ENV: 2, channels.REPLICATE_ENV: "1", channels.ROUND_ENV: 0,
                                 channels.SOLO_STEP_TIME_ENV: "0.25", channels.LANE_ENV: "0:123",
                                 channels.CONCURRENT_JOBS_ENV: "x"})
    assert place == JobPlace(config_index=2, replicate=1, round=0, solo_step_time_s=0.25, lane="0:123")
    assert not place.is_baseline and JobPlace.of_env_set({channels.CONFIG_INDEX_ENV: "0"}).is_baseline
    assert JobPlace.of_env_set({}) == JobPlace.of_env_set(None) == JobPlace()


@pytest.fixture
def hydra_job():
    """Installs a composed config as the running job's HydraConfig (as Hydra's run_job does), then clears it."""
    def install(*overrides: str) -> None:
        HydraConfig.instance().set_config(compose_train(list(overrides), return_hydra_config=True))

    yield install
    HydraConfig.instance().cfg = None


def test_the_entry_reads_the_place_from_the_config_not_the_environment(hydra_job, monkeypatch):
    """The environment says round 7, configuration 5 (a variable left by an earlier job of the same worker, or the
    user's shell); the job's config says round 1, configuration 2: the config wins."""
    hydra_job(f"hydra.job.env_set.{channels.ROUND_ENV}=1", f"hydra.job.env_set.{channels.CONFIG_INDEX_ENV}=2",
              f"hydra.job.env_set.{channels.REPLICATE_ENV}=0")
    for name, value in ((channels.ROUND_ENV, "7"), (channels.CONFIG_INDEX_ENV, "5"), (channels.REPLICATE_ENV, "4"),
                        (channels.CONCURRENT_JOBS_ENV, "3"), (channels.LANE_ENV, "1:42")):
        monkeypatch.setenv(name, value)
    # the lane is the lanes launcher worker's (set in its environment before each job), never the config's
    assert job_place() == JobPlace(config_index=2, replicate=0, round=1, lane="1:42")


def test_a_job_that_is_not_a_sweeps_has_no_place_whatever_the_environment_says(hydra_job, monkeypatch):
    hydra_job()  # conf/train.yaml declares the place empty; Hydra sets it so in the job's environment (DDP ranks too)
    monkeypatch.setenv(channels.ROUND_ENV, "7")
    monkeypatch.delenv(channels.LANE_ENV, raising=False)
    assert job_place() == JobPlace()


@pytest.mark.slow
def test_a_real_sweep_job_records_the_place_its_config_gives(demo_dir, mlflow_uri, tmp_path):
    """`python -m sweeplab.train -m` started from a shell whose environment says round 7, configuration 5, replicate
    4: its one job (configuration 0, replicate 0, round 0 as the sweeper composed it) records and returns its config's
    place."""
    env = {**os.environ, channels.ROUND_ENV: "7", channels.CONFIG_INDEX_ENV: "5", channels.REPLICATE_ENV: "4"}
    result = subprocess.run(
        [sys.executable, "-m", "sweeplab.train", "-m", "debug=smoke", f"data.path={demo_dir}", "model.out_dim=64",
         "trainer.max_steps=4", "trainer.val_check_interval=2"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    runs = MlflowClient(mlflow_uri).search_runs(
        [e.experiment_id for e in MlflowClient(mlflow_uri).search_experiments() if e.name == "sweeplab"])
    (job,) = [r for r in runs if r.data.tags.get("sweeplab.role") != "sweep"]
    assert {k: job.data.tags.get(k) for k in ("round", "config_index", "replicate")} == {
        "round": "0", "config_index": "0", "replicate": "0"}


def test_the_line_that_starts_a_job_names_its_configs_place(monkeypatch):
    """The sweep callback's "configuration 1, replicate 0" (Hydra hands on_job_start the job's whole config)."""
    from sweeplab.sweep.callback import _placement

    monkeypatch.setenv(channels.CONFIG_INDEX_ENV, "5")
    monkeypatch.setenv(channels.REPLICATE_ENV, "4")
    placed = [f"hydra.job.env_set.{channels.CONFIG_INDEX_ENV}=1", f"hydra.job.env_set.{channels.REPLICATE_ENV}=0"]
    assert _placement(compose_train(["replicates=2", *placed], return_hydra_config=True)) == "configuration 1, replicate 0"
    assert _placement(compose_train(["replicates=2"], return_hydra_config=True)) == ""
    assert _placement(compose_train(placed, return_hydra_config=True)) == ""  # one replicate: nothing to tell apart
