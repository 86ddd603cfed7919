"""hydra/sweeper=sweeplab's class, where Hydra looks for it (it instantiates plugins from `hydra_plugins` only); the
sweeper is sweeplab.sweep.grid, under sweeplab's import contracts. Its config is registered in __init__.py."""

from sweeplab.sweep import grid


class SweeplabSweeper(grid.SweeplabSweeper):
    """sweeplab.sweep.grid.SweeplabSweeper: Hydra's grid, run `replicates` times in rounds."""
