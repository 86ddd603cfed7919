"""Model families: what sweeplab needs to know about a model to plan, train, report, bench and export it.

A family is one `Family` record. `model.family=<name>` in a config picks it; training, the sweep callback, the
report, the bench and the export ask the record, never a table of their own. The two built-in families live in
`families/textbridge/` and `families/pagating_lm/`, each with its task, data module and record (`FAMILY` in the
package's `__init__`).

A family from outside sweeplab registers the same way, through a Python entry point in its own package's
metadata (why an entry point and not a `_target_` in the model config: the report, the export and `resume` meet a
family by its name alone, in a run's tags or a checkpoint, long after the config that trained it is gone):

    [project.entry-points."sweeplab.families"]
    my_family = "my_package:FAMILY"

Its configs (`model/<name>.yaml`, `data/<name>.yaml`, `loss/<name>.yaml`, any sweeps) join sweeplab's through
`Family.config_searchpath` (e.g. "pkg://my_package.conf"), which sweeplab's Hydra search-path plugin
(`hydra_plugins/sweeplab_families`) adds for every registered family. The checkout's `examples/` holds a
complete one.

The contract a family's objects keep (each is checked where it can be, with an error naming the family):
- the task subclasses `tasks.base.SweepTask` and defines `training_loss(batch) -> (loss, {name: tensor})` in plain
  torch (no Lightning calls): it is what trains, what torch.compile and CUDA graphs capture, and what the bench's
  hand-written loop runs;
- a batch is a dict of tensors whose leading dimension is the batch size (the timer counts samples from it);
  a task with tokens or a FLOP count says so in `tokens_in` / `flops_in`;
- the training DataLoader draws its batches from `data.sampling.ResumableShuffleBatchSampler`: it shards itself
  across DDP ranks and resumes mid-epoch. A loader without it is refused when `trainer.devices > 1` or `resume` is
  set (every rank would train on the same batches; a resumed run would start its epoch again);
- the model config group has `family` and `size` keys, and the family's sizes include `tiny`, which `debug=smoke`
  asks for.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sweeplab.errors import ConfigError, UserError
from sweeplab.tracking.naming import name_value  # noqa: F401  (family records name their runs' values with it)

if TYPE_CHECKING:
    import lightning as L
    import numpy as np

    from sweeplab.tasks.base import SweepTask
    from sweeplab.tasks.optim import OptimConfig

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "sweeplab.families"
# the built-in families, by the module holding their record (imported only when asked for)
BUILTIN = {"textbridge": "sweeplab.families.textbridge", "pagating_lm": "sweeplab.families.pagating_lm"}


@dataclass(frozen=True)
class ExportSpec:
    """What the Core ML export needs to know about a family's model (forward(input_ids, attention_mask) -> tensor)."""

    output: str  # the Core ML output's name
    context: str  # the model config field holding the longest sequence the model takes
    summary: str  # the output, as the package's description shows it
    # (path, vocab_size, seq_len, max_rows) -> rows of real token ids for the export's checks (export.real_data)
    real_rows: Callable[[Path, int, int, int], list[np.ndarray]] | None = None


def _no_loss_settings(values: Mapping[str, Any]) -> None:
    if values:
        raise ConfigError(f"loss.{next(iter(values))}", "this family's loss takes no settings (its `loss` group is empty)")


def _model_fits_any_data(model_config: Any, datamodule: Any, model_values: Mapping[str, Any]) -> Any:
    return model_config


@dataclass(frozen=True)
class Family:
    """One model family. The first six fields are required; every other one has a default that works.

    Functions receive the config groups as plain dicts (Hydra's composed values, interpolations resolved) and raise
    `ConfigError(key, problem)` for a bad value, which sweeplab prints as one line before any job trains.
    """

    name: str
    # the validation metric the best checkpoint and a sweeper optimise, and which way
    monitor: str
    monitor_mode: Literal["max", "min"]
    # `model` group -> the model's config object (`config.build_sized` builds a dataclass from a named size)
    build_model_config: Callable[[Mapping[str, Any]], Any]
    # (`data` group, model config) -> a LightningDataModule, constructed but no data read yet
    build_datamodule: Callable[[Mapping[str, Any], Any], L.LightningDataModule]
    # (model config, `loss` group, optimizer config) -> the task (a SweepTask)
    build_task: Callable[[Any, Mapping[str, Any], OptimConfig], SweepTask]
    # checks the `loss` group up front (before any data is read); the default accepts an empty group only
    check_loss: Callable[[Mapping[str, Any]], Any] = _no_loss_settings
    # after the data is set up: fill in what the data decides (vocabulary, output size); gets the model keys as the
    # user wrote them, so it can tell "unset" from a value to check
    fit_model_to_data: Callable[[Any, L.LightningDataModule, Mapping[str, Any]], Any] = _model_fits_any_data
    # the config keys a run's name always shows, as {dotted key: "short=value"} (a swept key is named anyway)
    name_parts: Callable[[Any], dict[str, str]] = lambda cfg: {}
    # a checkpoint's `model` hyperparameters -> model config, and model config -> plain nn.Module (export, resume)
    model_config_from_dict: Callable[[Mapping[str, Any]], Any] | None = None
    build_model: Callable[[Any], Any] | None = None
    # the report: config keys its table shows for this family (after the batch size), and the final metric column
    report_params: tuple[str, ...] = ()
    report_metric: tuple[str, str] | None = None  # (metric, column label); None: the monitored metric
    # the Core ML export; None: this family is not exported
    export: ExportSpec | None = None
    # where Hydra finds the family's configs, e.g. "pkg://my_package.conf"; None: in sweeplab's own conf/
    config_searchpath: str | None = None
    # model config -> the MLX port of build_model's module (backend=mlx); None: the family has no MLX port
    build_mlx_model: Callable[[Any], Any] | None = None

    def __post_init__(self) -> None:
        if self.monitor_mode not in ("max", "min"):
            raise ValueError(f"family {self.name}: monitor_mode must be 'max' or 'min', got {self.monitor_mode!r}")

    @property
    def final_metric(self) -> tuple[str, str]:
        return self.report_metric or (self.monitor, self.monitor.replace("/", " "))


@cache
def _entry_points() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def names() -> list[str]:
    """Every family sweeplab can train: the built-in ones, then the registered ones (nothing is imported)."""
    return [*BUILTIN, *(name for name in sorted(_entry_points()) if name not in BUILTIN)]


@cache
def get_family(name: str) -> Family:
    """The family record called `name`; a ConfigError naming `model.family` when there is none or it is broken."""
    if name in BUILTIN:
        return importlib.import_module(BUILTIN[name]).FAMILY
    ep = _entry_points().get(name)
    if ep is None:
        raise ConfigError(
            "model.family",
            f"unknown family {name!r}; accepted: {', '.join(names())} (a family from another package registers "
            f"in the {ENTRY_POINT_GROUP!r} entry point group)",
        )
    try:
        family = ep.load()
    except Exception as exc:
        raise UserError(f"family {name!r} (entry point {ep.value}) failed to load: {type(exc).__name__}: {exc}") from exc
    if not isinstance(family, Family):
        raise UserError(f"family {name!r}: entry point {ep.value} is a {type(family).__name__}, not a sweeplab Family")
    if family.name != name:
        raise UserError(f"family {name!r}: entry point {ep.value} holds the record of {family.name!r}")
    return family


def config_searchpaths() -> list[str]:
    """The Hydra search paths of the registered families' configs (read by hydra_plugins/sweeplab_families)."""
    paths = []
    for name in _entry_points():
        try:
            family = get_family(name)
        except UserError as exc:  # one broken family must not hide the others' configs; training it says why
            log.warning("%s", exc)
            continue
        if family.config_searchpath:
            paths.append(family.config_searchpath)
    return paths


__all__ = ["BUILTIN", "ENTRY_POINT_GROUP", "ExportSpec", "Family", "config_searchpaths", "get_family", "name_value", "names"]
