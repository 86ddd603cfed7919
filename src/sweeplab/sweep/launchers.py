"""What each Hydra launcher can do, in one table: the sweepers, the study and the lanes' warm-up ask it here, as they
ask a sweeper's class (`runs_replicates`, `holds_study`), never by reading a launcher's `_target_` or its private
attributes. A launcher is found by its class, its own row or the row of its nearest listed base class, so a subclass
(the hydra_plugins shells) reads its base's row; another launcher (Ray, ...) is one row.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LauncherCan:
    """side_by_side: runs a launch's jobs at once on this host (`n_jobs` of them); assigns_gpus: gives each job GPUs
    of its own (the lanes); outlives_sweeper: its jobs run on when the sweeping process exits (a cluster's queue);
    submits: the sweeper submits its jobs and watches them itself (sweep/slurm.py), so a job it loses is recorded by
    the watch, and no job dies with the sweeping process unrecorded; cluster: the submitit cluster it submits to
    (`submitit.AutoExecutor(cluster=...)`: the plugin keeps it in a private class attribute, read nowhere here;
    tests/test_launchers.py checks the two agree)."""

    side_by_side: bool = False
    assigns_gpus: bool = False
    outlives_sweeper: bool = False
    submits: bool = False
    cluster: str | None = None


_SUBMITIT = "hydra_plugins.hydra_submitit_launcher.submitit_launcher"
LAUNCHERS: dict[str, LauncherCan] = {
    "hydra._internal.core_plugins.basic_launcher.BasicLauncher": LauncherCan(),
    "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher": LauncherCan(side_by_side=True),
    "sweeplab.sweep.lanes.GpuLanesJoblibLauncher": LauncherCan(side_by_side=True, assigns_gpus=True),
    f"{_SUBMITIT}.LocalLauncher": LauncherCan(submits=True, cluster="local"),
    f"{_SUBMITIT}.SlurmLauncher": LauncherCan(outlives_sweeper=True, submits=True, cluster="slurm"),
}
UNKNOWN = LauncherCan()  # a launcher not in the table: one job at a time, dying with the sweep, as the basic one


def can(launcher: Any) -> LauncherCan:
    """The row of a launcher: an instance, a class, or its config (a mapping with `_target_`; None: Hydra's basic)."""
    if launcher is None or isinstance(launcher, Mapping):
        target = (launcher or {}).get("_target_") or "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
        module, _, name = str(target).rpartition(".")
        try:
            launcher = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError):  # a launcher Hydra cannot import: it refuses it itself
            return UNKNOWN
    cls = launcher if isinstance(launcher, type) else type(launcher)
    for base in cls.__mro__:
        row = LAUNCHERS.get(f"{base.__module__}.{base.__qualname__}")
        if row is not None:
            return row
    return UNKNOWN


def concurrent_jobs(launcher: Any, batch_size: int, lanes_per_gpu: int = 1) -> int:
    """How many of a batch's jobs run at once on one host: joblib's n_jobs (negative: CPUs + 1 + n_jobs, as joblib
    reads it) times the lanes per GPU (sweeplab.sweep.packing), capped by the batch, for a launcher that runs jobs
    side by side; 1 otherwise (the basic launcher, and cluster launchers: one job per node). `launcher`: its config
    (`hydra.launcher`)."""
    if not can(launcher).side_by_side:
        return 1
    n_jobs = int((launcher or {}).get("n_jobs", -1) or 1)
    if n_jobs < 0:
        n_jobs = max(1, (os.cpu_count() or 1) + 1 + n_jobs)
    return max(1, min(n_jobs * max(1, lanes_per_gpu), batch_size))
