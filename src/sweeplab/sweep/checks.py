"""What a study's config must hold before its sweep run opens: each mistake one line (UserError), no job started.

The checks of the values every job shares run here once (report.target among them: a wrong one fails now, not after
the sweep); the swept values are each job's own plan's to check.
"""

from __future__ import annotations

import math

from omegaconf import DictConfig, OmegaConf

from sweeplab.core import cli
from sweeplab.core.errors import UserError
from sweeplab.engine import settings
from sweeplab.families import missing_config_hint
from sweeplab.study import replicates
from sweeplab.study.rounds import expands_a_grid, runs_replicates, sweeper_class, verdict_options
from sweeplab.tracking import mlflow_store, naming


def tracking_settings(config: DictConfig) -> tuple[str, str, bool]:
    """(tracking URI, experiment name, logger enabled) of the study's config."""
    logger = config.get("logger") or {}
    return (
        mlflow_store.resolve_uri(logger.get("tracking_uri")),
        logger.get("experiment_name", "sweeplab"),
        bool(logger.get("enabled", True)),
    )


def check_study(config: DictConfig) -> None:
    """Every check a study passes before its sweep run opens."""
    check_required(config)
    swept = naming.swept_keys(config)
    if (values := unswept_values(config, swept)) is not None:  # the swept ones: each job checks its own
        settings.check_values(values)
    check_replicates(config)
    verdict_options(config)
    check_every_configuration(config)
    if "data.path" not in swept:  # one missing path for every job: no sweep run at all
        settings.check_data_path(OmegaConf.select(config, "data.path", default=None))


MAX_CONFIGURATIONS_CHECKED = 512  # a larger grid: each swept value checked once, with the others at their first


def check_every_configuration(config: DictConfig) -> None:
    """Every configuration of a grid (Hydra's basic sweeper and the sweeplab sweeper: each combination of the swept
    values) checked as its job's early check would, before the sweep run exists: `loss.alpha=0.5,nan` is one line
    now, not a study whose good jobs train and whose bad ones fail at set-up. A swept config group (`model=a,b`)
    recomposes its node: the keys under it are each job's plan's to check. A search's space is its sampler's."""
    import itertools

    from hydra.core.override_parser.overrides_parser import OverridesParser

    if not expands_a_grid(sweeper_class(config)):
        return
    parser = OverridesParser.create()
    params = [f"{k}={v}" for k, v in (OmegaConf.select(config, "hydra.sweeper.params") or {}).items()]
    try:
        overrides = parser.parse_overrides([*params, *(OmegaConf.select(config, "hydra.overrides.task") or [])])
    except Exception:  # Hydra's own message, when the sweeper parses them
        return
    groups = set((OmegaConf.select(config, "hydra.runtime.choices") or {}).keys())
    swept = [o for o in overrides if o.is_sweep_override()]
    regrouped = [o.key_or_group for o in swept if o.key_or_group in groups]
    values = {}
    for override in swept:
        key = override.key_or_group
        if key in groups or any(key.startswith(f"{group}.") for group in regrouped):
            continue
        values[key] = [parser.parse_override(f"{key}={v}").value() for v in override.sweep_string_iterator()]
    if not values:
        return
    base = OmegaConf.masked_copy(config, [k for k in config if k != "hydra"])
    OmegaConf.set_struct(base, False)
    keys = list(values)
    if math.prod(len(v) for v in values.values()) <= MAX_CONFIGURATIONS_CHECKED:
        combinations = itertools.product(*values.values())
    else:
        first = [v[0] for v in values.values()]
        combinations = ([*first[:i], value, *first[i + 1:]] for i, key in enumerate(keys) for value in values[key])
    for combination in combinations:
        job = base.copy()
        for key, value in zip(keys, combination):
            OmegaConf.update(job, key, value, force_add=True)
        if (plain := settings.plain_values(job)) is not None:
            settings.check_values(plain)


def check_required(config: DictConfig) -> None:
    """A `???` left in the launcher or sweeper (e.g. the SLURM partition) fails here, naming the key."""
    for node in ("hydra.launcher", "hydra.sweeper"):
        section = OmegaConf.select(config, node)
        if section is None:
            continue
        missing = sorted(OmegaConf.missing_keys(section))
        if missing:
            choice = (OmegaConf.select(config, "hydra.runtime.choices") or {}).get(node.replace(".", "/"), "")
            raise UserError(f"{missing[0]} is required by {node.replace('.', '/')}={choice}: add {missing[0]}=...")


def unswept_values(config: DictConfig, swept: list[str]) -> dict | None:
    """The sweep's config as plain values, without `hydra` and the swept keys; None where an interpolation cannot
    resolve yet (each job's plan names it)."""
    values = settings.plain_values(config)
    for key in swept if values is not None else ():
        *parents, last = key.lstrip("+~").split(".")
        node = values
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return values


def check_replicates(config: DictConfig) -> None:
    """replicates=N needs a sweeper that runs replicates, and sets the seed itself: one line otherwise, before any
    job. replicates=auto reads the jobs' results between rounds: it needs the MLflow logger too."""
    count = replicates.replicates_setting(config)
    if count == 1:
        return
    if replicates.is_auto(config) and not tracking_settings(config)[2]:
        raise UserError("replicates=auto decides from the jobs' results in MLflow: it needs logger.enabled=true "
                        "(or give a number of replicates)")
    setting = f"replicates={config.get('replicates')}"
    if not runs_replicates(config):
        choice = (OmegaConf.select(config, "hydra.runtime.choices") or {}).get("hydra/sweeper", "")
        raise UserError(f"{setting} needs hydra/sweeper=sweeplab; the {choice} sweeper runs each job once "
                        "(run it with replicates=1)")
    if "seed" in naming.swept_keys(config):
        raise UserError(f"{setting} gives replicate r the seed seed + r: sweep seed with replicates=1, or leave it out")


def composition_error(exc: Exception) -> UserError:
    """Hydra's composition and override-syntax errors (a misspelt key or option on the command line) as one line."""
    return cli.hydra_error(exc, "train", missing_config_hint)


def one_line_error(exc: BaseException) -> BaseException:
    """The error a failed study is closed with: Hydra's errors (a misspelt swept key, found when the sweeper checks
    its first batch) as their one line, any other as it is."""
    return composition_error(exc) if isinstance(exc, Exception) and cli.is_hydra_error(exc) else exc
