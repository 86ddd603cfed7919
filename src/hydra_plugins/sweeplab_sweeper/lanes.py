"""hydra/launcher=joblib_gpus's class, where Hydra looks for it (it instantiates plugins from `hydra_plugins` only);
the launcher is sweeplab.sweep.lanes, under sweeplab's import contracts."""

from sweeplab.sweep import lanes


class GpuLanesJoblibLauncher(lanes.GpuLanesJoblibLauncher):
    """sweeplab.sweep.lanes.GpuLanesJoblibLauncher: Hydra's joblib launcher cut into lanes, one worker per GPU slot."""
