"""The sweeplab sweeper (`hydra/sweeper=sweeplab`; Hydra instantiates plugins from the hydra_plugins package only):
Hydra's BasicSweeper grid, run `replicates` times in rounds (sweeplab.replicates says which seed and order).

Each round is launched on its own (in chunks of `max_batch_size` when set), so with a parallel launcher a round's
jobs run side by side and the next round starts after them: a configuration is always compared with the baseline's
job of the same round. Every job gets its replicate, round, configuration index and how many jobs ran at once on
its host through `hydra.job.env_set` (channels.REPLICATE_ENV ...); training.run_tags records them as run tags.
With replicates=1 the jobs are the BasicSweeper's, in its order, with the same overrides.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from sweeplab import replicates as replicated

log = logging.getLogger(__name__)


class SweeplabSweeper(BasicSweeper):
    def sweep(self, arguments: list[str]) -> Any:
        assert self.config is not None and self.launcher is not None and self.hydra_context is not None
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        overrides = parser.parse_overrides([*self._parse_config(), *arguments])
        (grid,) = self.split_arguments(overrides, None)
        count = replicated.replicates_setting(self.config)
        planned = replicated.rounds(grid, count, int(self.config.get("seed", 0)))

        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        if count > 1:
            log.info("sweep: %d configurations x %d replicates, %d rounds", len(grid), count, len(planned))

        launcher_config = OmegaConf.select(self.config, "hydra.launcher")
        returns, next_index = [], 0
        for round_jobs in planned:
            for chunk in self.split_overrides_to_chunks(round_jobs, self.max_batch_size):
                at_once = replicated.concurrent_jobs(launcher_config, len(chunk))
                batch = [[*job.overrides, *replicated.job_environment(job, at_once)] for job in chunk]
                started = time.perf_counter()
                self.validate_batch_is_legal(batch)
                log.debug("validated %d jobs in %.2f s", len(batch), time.perf_counter() - started)
                results = self.launcher.launch(batch, initial_job_idx=next_index)
                for result in results:
                    _ = result.return_value  # a job that raised raises here, as under BasicSweeper
                next_index += len(batch)
                returns.append(results)
        self.batch_index = len(returns)
        return returns
