"""The launchers' table (sweeplab/sweep/launchers.py): each launcher sweeplab offers finds its row by its class, a
subclass reads its base's row, and no module decides what a launcher can do from its `_target_` or private state."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from conftest import compose_train
from sweeplab.sweep import launchers

SRC = Path(__file__).resolve().parents[1] / "src"


def test_every_row_of_the_table_names_a_class_that_exists():
    for name in launchers.LAUNCHERS:
        module, _, attribute = name.rpartition(".")
        assert isinstance(getattr(importlib.import_module(module), attribute), type), name


@pytest.mark.parametrize("choice, expected", [
    ("basic", launchers.LauncherCan()),
    ("joblib", launchers.LauncherCan(side_by_side=True)),
    ("joblib_gpus", launchers.LauncherCan(side_by_side=True, assigns_gpus=True)),
    ("submitit_local", launchers.LauncherCan(submits=True, cluster="local")),
    ("slurm", launchers.LauncherCan(outlives_sweeper=True, submits=True, cluster="slurm")),
])
def test_each_launcher_config_reads_its_row(choice, expected):
    config = compose_train(["debug=smoke", f"hydra/launcher={choice}"], return_hydra_config=True)
    assert launchers.can(config.hydra.launcher) == expected


def test_a_subclass_reads_its_base_row_and_an_unknown_launcher_the_plain_one():
    from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher

    class Mine(JoblibLauncher):
        pass

    assert launchers.can(Mine).side_by_side and launchers.can(Mine()).side_by_side
    assert launchers.can({"_target_": "no.such.Launcher"}) == launchers.UNKNOWN == launchers.LauncherCan()


def test_no_module_decides_from_a_launchers_target():
    """What a launcher can do comes from the table: a Ray launcher is one row, not a string looked for in many places."""
    sniffing = re.compile(r"launcher\._target_|_EXECUTOR|\"(joblib|submitit)\" (not )?in ")
    found = [f"{path.relative_to(SRC)}:{number}" for path in sorted(SRC.rglob("*.py"))
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if sniffing.search(line)]
    assert found == []
