"""Every setting's value checked before the heavy imports: `check_values(container)` in milliseconds.

`plan()` binds each group to the class it configures, which means importing that class's module, and most of them
import torch and Lightning (10-15 CPU-seconds on a small machine). A wrong value (`data.batch_size=abc`,
`timing.host_probe_s=1e9`, `replicates=sometimes`) should not wait for that. This module reads the same annotations
from the classes' source (core.config.source_accepted: no import) and checks the values against them, naming the
key exactly as `plan()` would; the top-level settings are checked here for both. What needs the built objects (a
constructor's own checks, a family's model regions, the data) stays in `plan()`, which runs all of this again.

Imports nothing heavy: the training app calls it before it imports the engine, the sweep callback before the first job.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sweeplab.core.config import check_values as check_against
from sweeplab.core.config import shown, source_accepted, source_keys
from sweeplab.core.errors import ConfigError, UserError
from sweeplab.core.records import SWEEP
from sweeplab.policies import stopping

# config group -> the class it configures (plan() builds each group into it)
GROUP_TARGETS = {
    "trainer": "sweeplab.engine.plan:TrainerConfig",
    "logger": "sweeplab.engine.plan:LoggerConfig",
    "checkpoint": "sweeplab.engine.plan:CheckpointConfig",
    "optim": "sweeplab.tasks.optim:OptimConfig",
    "backend": "sweeplab.runtime.backends:BackendConfig",
    "timing": "sweeplab.callbacks.timing:StepTimer",
    "guard": "sweeplab.callbacks.guard:NonFiniteGuard",
    "tune": "sweeplab.engine.tuning:TuneConfig",
    "export": "sweeplab.export.options:ExportOptions",
}
# a family's groups: the record's target field that configures each, and the group's keys that are not the class's
FAMILY_GROUPS = {"data": ("datamodule", frozenset()), "model": ("model_config", frozenset({"family", "size"})),
                 "loss": ("loss", frozenset())}

MAX_SEED = 2**32 - 1  # numpy's seed range, which Lightning's seed_everything enforces with a traceback
COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune")
COMPILE_SCOPES = ("whole", "regions")  # compile_scope: what torch.compile compiles (tasks/base.configure_training)
COMPILE_CACHES = ("study", "shared")  # compile_cache: one cache per study, or torch's own for every study


def check_values(container: Mapping[str, Any]) -> None:
    """The composed config's values (interpolations resolved), checked without importing what they configure; a
    ConfigError naming the first wrong key."""
    check_top_level(container)
    report_settings(container)
    for group, target in GROUP_TARGETS.items():
        _check_group(container.get(group), source_accepted(target), group)
    # the stop rules' settings, as each rule declares them (policies/stopping.py's registry; plain, so imported)
    _check_group(container.get("stop"), stopping.accepted(), "stop", unknown_keys=True)
    family = _family(container)
    _check_size(container.get("model"), family)
    for group, (field_name, ignore) in FAMILY_GROUPS.items():
        target = getattr(family, field_name, None) if family is not None else None
        if isinstance(target, str):
            _check_group(container.get(group), source_accepted(target), group, ignore)


def check_config(cfg: Any) -> None:
    """`check_values` of a composed DictConfig (its `hydra` node left out); an interpolation that cannot resolve yet
    is left to the plan, which names it."""
    container = plain_values(cfg)
    if container is not None:
        check_values(container)


def plain_values(cfg: Any) -> dict | None:
    """A composed DictConfig as plain values, interpolations resolved, without its `hydra` node; None where one
    cannot resolve yet."""
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_container(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]), resolve=True,
                                      throw_on_missing=True)
    except Exception:
        return None


def _check_group(values: Any, accepted: Mapping[str, Any], where: str, ignore: frozenset[str] = frozenset(),
                 unknown_keys: bool = False) -> None:
    if isinstance(values, Mapping):
        values = {k: v for k, v in values.items() if v is not None}  # null: the class's default (a size's, the data's)
        # keys the source does not show (a base class's, **kwargs) pass here: plan() refuses the unknown ones
        check_against(accepted, values, where, ignore, unknown_keys=unknown_keys)


def _check_size(model: Any, family: Any) -> None:
    """model.size against the family's named sizes (its `sizes` target, else SIZES beside its model config), read
    from the source; a family whose sizes are no literal there is checked when the job is planned."""
    size = model.get("size") if isinstance(model, Mapping) else None
    if size is None or family is None:
        return
    target = family.sizes if isinstance(family.sizes, str) else (
        f"{family.model_config.partition(':')[0]}:SIZES" if isinstance(family.model_config, str) else None)
    sizes = source_keys(target) if target else None
    if sizes is not None and size not in sizes:
        raise ConfigError("model.size", f"unknown size {shown(size)}; accepted: {', '.join(sizes)}")


def _family(container: Mapping[str, Any]):
    from sweeplab.families import get_family  # the records are light; their targets are not imported

    name = (container.get("model") or {}).get("family")
    try:
        return get_family(str(name)) if name else None
    except UserError:  # plan() names an unknown family, with the installed ones
        return None


def check_top_level(container: Mapping[str, Any]) -> tuple[str, str, bool, str]:
    """seed, cuda_graph, steps_per_batch, resume and the compile switches; returns (compile mode, compile_scope,
    compile_validation, compile_cache). A switch that would change nothing with compile=off is refused (the README's
    rule for options that would do nothing)."""
    seed = container.get("seed", 0)
    if type(seed) is not int or not 0 <= seed <= MAX_SEED:
        raise ConfigError("seed", f"expected an integer in [0, {MAX_SEED}], got {seed!r}")
    if not isinstance(container.get("cuda_graph", False), bool):
        raise ConfigError("cuda_graph", f"expected true or false, got {container['cuda_graph']!r}")
    steps_per_batch = container.get("steps_per_batch", 1)
    if type(steps_per_batch) is not int or steps_per_batch < 1:
        raise ConfigError("steps_per_batch", f"expected an integer >= 1, got {steps_per_batch!r}")
    resume = container.get("resume", False)
    if resume is not None and not isinstance(resume, (bool, str)):
        raise ConfigError("resume", f"expected true, false or a checkpoint path, got {resume!r}")
    mode = str(container.get("compile", "off"))
    scope = container.get("compile_scope", "whole")
    if scope not in COMPILE_SCOPES:
        raise ConfigError("compile_scope", f"{scope!r} is not one of {', '.join(COMPILE_SCOPES)}")
    validation = container.get("compile_validation", False)
    if not isinstance(validation, bool):
        raise ConfigError("compile_validation", f"expected true or false, got {validation!r}")
    cache = container.get("compile_cache", "study")
    if cache not in COMPILE_CACHES:
        raise ConfigError("compile_cache", f"{cache!r} is not one of {', '.join(COMPILE_CACHES)}")
    if mode == "off":
        for key, value, default in (("compile_scope", scope, "whole"), ("compile_validation", validation, False),
                                    ("compile_cache", cache, "study")):
            if value != default:
                shown = str(value).lower() if isinstance(value, bool) else value
                raise ConfigError(key, f"{shown} does nothing with compile=off; set compile=default (or another "
                                       f"mode), or leave {key} out")
    return mode, scope, validation, cache


def report_settings(container: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """`report.target` and `report.quality_tolerance` (the study's question, docs/verdict.md), checked: finite
    numbers, a tolerance >= 0, a target inside the values the family's monitored metric can take (a cosine above 1
    is never reached)."""
    report = container.get("report") or {}
    target = finite_number(report.get("target"), SWEEP.target)
    tolerance = finite_number(report.get("quality_tolerance"), SWEEP.quality_tolerance)
    if tolerance is not None and tolerance < 0:
        raise ConfigError(SWEEP.quality_tolerance, f"must be >= 0 (how much worse than the baseline still keeps "
                                                f"quality, in metric units), got {report['quality_tolerance']!r}")
    indifference = finite_number(report.get("indifference"), SWEEP.indifference)
    if indifference is not None and indifference < 1:
        raise ConfigError(SWEEP.indifference, f"must be a ratio >= 1 (1.1: the verdict may name the fastest or "
                                                   f"one within 1.1x of it; 1: only the fastest), got {indifference:g}")
    family = _family(container)
    bounds = getattr(family, "monitor_range", None)
    if target is not None and bounds is not None and not bounds[0] <= target <= bounds[1]:
        raise ConfigError(SWEEP.target, f"{target:g} is outside the values {family.monitor} can take "
                                             f"([{bounds[0]:g}, {bounds[1]:g}]): no job can reach it; give a value in that range")
    return target, tolerance


def finite_number(value: Any, key: str) -> float | None:
    """`value` as a finite float (None stays None); one line naming `key` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigError(key, f"expected a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(key, f"expected a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ConfigError(key, f"expected a finite number, got {value!r}")
    return number


def check_data_path(path: Any) -> None:
    """`data.path` (a data module's `path`, sweeplab.families.contract) names a file or directory that exists: a
    missing one fails here, before a run exists, not when the data is first read (the study checks it once for every
    job, before its sweep run opens: sweeplab.sweep.checks)."""
    if path is not None and not Path(str(path)).exists():
        raise ConfigError("data.path", f"{path}: no such file or directory")
