"""A job's place in its study (configuration index, replicate, round, how many jobs ran beside it ...), as the sweeplab
sweeper composed it into the job's config: `hydra.job.env_set.SWEEPLAB_*` overrides (study/replicates.job_environment,
the names in core/channels.py). The job's entry (sweeplab.train) reads it once from `HydraConfig.get().job.env_set`,
the job's own config, and hands it to what needs it (the run's tags and name, the stop rules, the outcome). Hydra also
sets those variables in the job's environment, which its children (DDP ranks) inherit; no other module of the job
reads them from there (tests/test_job_place.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sweeplab.core import channels

# the variables that say where a job stands; the lane is the lanes launcher's worker's, the others the sweeper's
PLACE_VARIABLES = (channels.CONFIG_INDEX_ENV, channels.REPLICATE_ENV, channels.ROUND_ENV, channels.CONCURRENT_JOBS_ENV,
                   channels.LANES_PER_GPU_ENV, channels.SOLO_STEP_TIME_ENV, channels.LANE_ENV)


def _number(value: Any, kind: type) -> Any:
    try:
        return kind(str(value)) if value not in (None, "") else None
    except ValueError:
        return None


@dataclass(frozen=True)
class JobPlace:
    """Where a job stands in its study; every field None for a job that is not a sweep's."""

    config_index: int | None = None  # 0: the baseline of the verdict
    replicate: int | None = None  # 0-based: seed = seed + replicate
    round: int | None = None
    concurrent_jobs: int | None = None
    lanes_per_gpu: int | None = None
    solo_step_time_s: float | None = None
    lane: str | None = None

    @classmethod
    def of_env_set(cls, env_set: Mapping[str, Any] | None) -> JobPlace:
        """The place `env_set` (a job's `hydra.job.env_set`, or an environment) gives; values that do not read as
        their type are None."""
        env = dict(env_set or {})
        return cls(config_index=_number(env.get(channels.CONFIG_INDEX_ENV), int),
                   replicate=_number(env.get(channels.REPLICATE_ENV), int),
                   round=_number(env.get(channels.ROUND_ENV), int),
                   concurrent_jobs=_number(env.get(channels.CONCURRENT_JOBS_ENV), int),
                   lanes_per_gpu=_number(env.get(channels.LANES_PER_GPU_ENV), int),
                   solo_step_time_s=_number(env.get(channels.SOLO_STEP_TIME_ENV), float),
                   lane=str(env[channels.LANE_ENV]) if env.get(channels.LANE_ENV) else None)

    @property
    def is_baseline(self) -> bool:
        """Configuration 0, or no configuration at all (a single job): what the other configurations are compared with."""
        return self.config_index in (None, 0)


NOWHERE = JobPlace()
