"""What sweeplab takes from Hydra's private API, or from a plugin's private attributes, checked against the pinned
versions (hydra-core 1.3.8, hydra-submitit-launcher 1.2.0): each test fails when an upgrade renames or changes it.

The grid sweeper subclasses hydra._internal's BasicSweeper (Hydra has no public grid sweeper); the submitit
launchers' cluster lives in their private `_EXECUTOR`, which sweeplab no longer reads: its launcher table
(sweep/launchers.py) names the cluster, and this file checks the two agree."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import hydra
import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from sweeplab.sweep import launchers
from sweeplab.sweep.grid import SweeplabSweeper

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def test_hydra_is_the_version_its_private_api_was_checked_against():
    assert hydra.__version__ == "1.3.8", ("an upgraded Hydra: check what sweeplab.sweep.grid takes from BasicSweeper "
                                          "(this file), then move this pin")


def test_the_grid_sweeper_gets_basic_sweepers_grid_params_and_chunks():
    # by name, and without making a sweeper: Hydra's plugin scan executes hydra._internal.core_plugins again in a
    # process that scans twice (other tests), so the class the sweeper subclasses may be an earlier BasicSweeper
    # object than the module's (whose __init__ then refuses the subclass); a real sweep scans once
    (basic,) = [b for b in SweeplabSweeper.__mro__ if f"{b.__module__}.{b.__qualname__}" == BASIC_SWEEPER]
    init = inspect.getsource(basic.__init__)
    assert all(line in init for line in ("self.max_batch_size = max_batch_size", "self.params = params",
                                         "self.batch_index = 0"))
    params = {"data.batch_size": "32,64", "loss.alpha": "1.0,0.7"}
    assert basic._parse_config(SimpleNamespace(params=params)) == ["data.batch_size=32,64", "loss.alpha=1.0,0.7"]
    overrides = OverridesParser.create().parse_overrides(["data.batch_size=32,64", "loss.alpha=1.0,0.7",
                                                          "optim.lr=0.01"])
    (grid,) = basic.split_arguments(overrides, None)
    assert grid == [["data.batch_size=32", "loss.alpha=1.0", "optim.lr=0.01"],
                    ["data.batch_size=32", "loss.alpha=0.7", "optim.lr=0.01"],
                    ["data.batch_size=64", "loss.alpha=1.0", "optim.lr=0.01"],
                    ["data.batch_size=64", "loss.alpha=0.7", "optim.lr=0.01"]]
    assert [len(chunk) for chunk in basic.split_overrides_to_chunks(grid[:3], 2)] == [2, 1]
    assert list(inspect.signature(basic.setup).parameters) == ["self", "hydra_context", "task_function", "config"]
    setup = inspect.getsource(basic.setup)  # what the sweeper reads after it
    assert all(f"self.{name} =" in setup for name in ("config", "launcher", "hydra_context"))


@pytest.mark.parametrize("name", ["LocalLauncher", "SlurmLauncher"])
def test_each_submitit_launchers_row_names_the_cluster_the_plugin_submits_to(name):
    from hydra_plugins.hydra_submitit_launcher import submitit_launcher

    cls = getattr(submitit_launcher, name)
    assert launchers.can(cls).cluster == cls._EXECUTOR  # the plugin's private name for it: read here only


def test_the_grid_sweeper_sets_what_basic_sweepers_init_sets_and_survives_a_second_plugin_scan():
    """SweeplabSweeper.__init__ sets BasicSweeper's attributes itself (its __init__'s super(BasicSweeper, self) refused
    every sweeper made after a second plugin scan: Hydra executes hydra._internal.core_plugins again, in place)."""
    import importlib

    module_name, _, class_name = BASIC_SWEEPER.rpartition(".")
    module = importlib.import_module(module_name)
    basic = getattr(module, class_name)(None, {"a": "1,2"})
    importlib.reload(module)  # what a second scan does to the module the grid sweeper's base class came from
    ours = SweeplabSweeper(None, {"a": "1,2"})
    assert {k: v for k, v in vars(ours).items() if k in vars(basic)} == vars(basic)
