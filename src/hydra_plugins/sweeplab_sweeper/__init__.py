"""Hydra sweeper plugin `hydra/sweeper=sweeplab` (conf/train.yaml selects it): Hydra's grid, run in replicated rounds.

Hydra imports every module under the `hydra_plugins` namespace package when it starts and instantiates plugins from
there only, so this package holds what Hydra must find and nothing else: this module registers the grid sweeper's
config; grid.py, search.py (hydra/sweeper=optuna, which registers its own) and lanes.py (hydra/launcher=joblib_gpus)
each hold the class Hydra instantiates, a subclass of the one in sweeplab.sweep (grid, search, lanes), where the
logic lives under sweeplab's import contracts.
"""

from dataclasses import dataclass

from hydra.core.config_store import ConfigStore


@dataclass
class SweeplabSweeperConf:
    _target_: str = "hydra_plugins.sweeplab_sweeper.grid.SweeplabSweeper"
    max_batch_size: int | None = None  # as BasicSweeper's: at most this many jobs per launch (within a round)
    params: dict[str, str] | None = None  # the swept keys and their values, as BasicSweeper's
    # hydra/launcher=slurm: submit the study's first launch (every job of a fixed number of replicates; the first
    # round of replicates=auto) and exit; the printed continue command watches, continues and finishes it later
    leave: bool = False


ConfigStore.instance().store(group="hydra/sweeper", name="sweeplab", node=SweeplabSweeperConf, provider="sweeplab")
