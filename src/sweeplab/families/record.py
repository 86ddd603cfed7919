"""The `Family` record: what sweeplab needs to know about a model family, mostly as lazy "module:Name" targets.

A record names the family's classes; sweeplab builds them the one way every family shares (docs/families.md):

    FAMILY = Family(
        "my_family", monitor="val/loss", monitor_mode="min",
        model_config="my_package.model:MyConfig",  # a dataclass; SIZES beside it, `tiny` among them
        model="my_package.model:MyModel",          # MyModel(config): export, resume, load_model
        datamodule="my_package.data:MyData",       # built from the `data` group (+ model_keys_for_data)
        task="my_package.task:MyTask",             # MyTask(model_config, loss, optim)
        config_searchpath="pkg://my_package.conf",
    )

A target is imported on first use, so a record imports nothing heavy: the report, the search-path plugin and
`names()` read records of families whose torch code they never run. Every field may also hold the object itself.

The `build_*`, `check_loss`, `model_config_from_dict`, `name_parts` and `report_params` fields are what a record
written for sweeplab 0.1 set by hand; they are derived from the targets now, and a record that still sets them
works for this release, with one deprecation line naming what to change.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

from omegaconf import OmegaConf

from sweeplab.core.config import build, build_sized
from sweeplab.core.errors import ConfigError, UserError
from sweeplab.core.labels import label
from sweeplab.tracking.naming import name_value

if TYPE_CHECKING:
    import lightning as L

    # annotations only: tasks import Lightning (seconds), and the records stay light
    from sweeplab.tasks.base import SweepTask
    from sweeplab.tasks.optim import OptimConfig

log = logging.getLogger("sweeplab.families")

Target = str | Callable[..., Any]  # "package.module:Name" (imported on first use), or the object itself


def resolve(target: Target, owner: str, field_name: str) -> Any:
    """The object a "module:Name" target names (a dotted Name reaches into classes); any other value as it is.
    `owner` and `field_name` name the target in the one-line error of a bad one."""
    if not isinstance(target, str):
        return target
    module_name, colon, attribute = target.partition(":")
    where = f"{owner}: {field_name}={target!r}"
    if not colon or not module_name or not attribute:
        raise UserError(f"{where} is not a target; write it as 'package.module:Name'")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as exc:
        raise UserError(f"{where}: cannot import {module_name} ({type(exc).__name__}: {exc}); is its package installed?") from None
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise UserError(f"{where}: {module_name} has no {attribute}; name a class or function defined there")
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class ExportSpec:
    """What the Core ML export needs to know about a family's model (forward(input_ids, attention_mask) -> tensor, or
    the `module` it names, which may take `extra_inputs` after those two)."""

    output: str  # the Core ML output's name
    context: str  # the model config field holding the longest sequence the model takes
    summary: str  # the output, as the package's description shows it
    # (path, vocab_size, seq_len, max_rows) -> rows of real token ids for the export's checks (export.real_data)
    real_rows: Target | None = None
    # trained model -> its Neural-Engine layout (export.layout=ane), e.g. "pkg.ane:ANEModel"; None: no ANE layout
    ane_layout: Target | None = None
    # trained model -> the module the package holds, forward(input_ids, attention_mask, *extra inputs) -> output (the
    # TextBridge decoder: one generation step); None: the model itself
    module: Target | None = None
    # (model config, batch size, numpy Generator) -> {name: (float32 array, description)}: the inputs after
    # input_ids and attention_mask, in the order `module` takes them (the decoder's sentence embedding); None: none
    extra_inputs: Target | None = None


def _model_fits_any_data(model_config: Any, datamodule: Any, model_values: Mapping[str, Any]) -> Any:
    return model_config


class _Derived(partial):
    """A builder the record derived from its targets (not one a 0.1 record set by hand): `dataclasses.replace`
    derives it again from the new targets."""


LEGACY_FIELDS = (
    "build_model_config", "build_datamodule", "build_task", "check_loss", "model_config_from_dict", "build_model",
    "build_mlx_model", "name_parts", "report_params",
)
# what each 0.1 field becomes
_LEGACY_HINTS = {
    "build_model_config": "model_config='pkg.model:Config'",
    "build_datamodule": "datamodule='pkg.data:DataModule' (+ model_keys_for_data)",
    "build_task": "task='pkg.task:Task' (built as Task(model_config, loss, optim))",
    "check_loss": "loss='pkg.task:LossConfig'",
    "model_config_from_dict": "model_config='pkg.model:Config'",
    "build_model": "model='pkg.model:Model'",
    "build_mlx_model": "mlx_model='pkg.mlx_model:build'",
    "name_parts": "name_keys=(...) with labels={key: short}",
    "report_params": "report_keys=(...)",
}
_warned: set[str] = set()


@dataclass(frozen=True, eq=False)  # eq=False: a record is its own identity (and `labels` is a dict)
class Family:
    """One model family. `name`, `monitor` and `monitor_mode`, then the four targets (`model_config`, `datamodule`,
    `task`, and `model` for export and resume); every other field has a default that works.

    Builders receive the config groups as plain dicts (Hydra's composed values, interpolations resolved) and raise
    `ConfigError(key, problem)` for a bad value, which sweeplab prints as one line before any job trains.
    """

    name: str
    monitor: str  # the validation metric the best checkpoint and a sweeper optimise ("val/loss")
    monitor_mode: Literal["max", "min"]
    # how much worse than the baseline's final `monitor` still keeps quality in a study (metric units), when the
    # sweep's report.quality_tolerance is null; None: derived from the replicates' spread (the standard deviation of
    # the baseline's final metric: docs/verdict.md)
    quality_tolerance: float | None = None
    # the values `monitor` can take, (low, high) (a cosine: (-1, 1)); a report.target outside is refused before
    # training, as no job could reach it. None: any value
    monitor_range: tuple[float, float] | None = None
    # --- what the family is made of ("module:Name" targets) ---------------------------------------------------
    model_config: Target | None = None  # a dataclass; the `model` group builds it from a named size plus its keys
    model: Target | None = None  # the plain-torch nn.Module, built as Model(model_config)
    datamodule: Target | None = None  # a LightningDataModule (families.contract.FamilyDataModule), from the `data` group
    task: Target | None = None  # a SweepTask, built as Task(model_config, loss, optim)
    loss: Target | None = None  # a dataclass the `loss` group builds (checked at plan time); None: the loss takes no settings
    model_keys_for_data: tuple[str, ...] = ()  # model config fields the data module takes too: ("max_len",)
    sizes: Target | None = None  # {size: {field: value}}, `tiny` among them; None: SIZES in model_config's module
    default_size: str = "default"  # the size a `model` group without a `size` key gets
    # (`data` group, composed config) -> the data group as the job records and builds it (a setting that follows an
    # engine setting: TextBridge's pad_to=auto from cuda_graph); None: as composed
    resolve_data: Target | None = None
    # after the data is set up: fill in what the data decides (vocabulary, output size); gets the model keys as the
    # user wrote them, so it can tell "unset" from a value to check
    fit_model_to_data: Target = field(default=_model_fits_any_data, repr=False)
    # model config fields fit_model_to_data fills when the config leaves them null. Not read any more (a resume
    # compares a checkpoint with the model as fit_model_to_data completes it: engine.job.resolve_model); kept so
    # records that set it still load
    data_keys: tuple[str, ...] = ("vocab_size",)
    # --- how runs, the report and the UI show it -----------------------------------------------------------------
    labels: Mapping[str, str] = field(default_factory=dict)  # short labels of its keys: {"loss.alpha": "α"}
    name_keys: tuple[str, ...] | Target = ()  # keys every run name shows (a swept key is named anyway); or cfg -> keys
    report_keys: tuple[str, ...] = ()  # keys the report's table shows for this family (after the batch size)
    # deprecated, ignored: the report judges, plots and tabulates one metric, the one the jobs monitor (`monitor`);
    # kept so that a record written for sweeplab 0.1 still loads
    report_metric: tuple[str, str] | None = None
    # --- optional parts ------------------------------------------------------------------------------------------
    export: ExportSpec | None = None  # the Core ML export; None: export=coreml is refused at plan time
    config_searchpath: str | None = None  # where Hydra finds its configs ("pkg://my_package.conf"); None: sweeplab's conf/
    mlx_model: Target | None = None  # model config -> the MLX port of `model` (backend=mlx); None: no MLX port
    # (data group, n_samples, out_dir) -> data keys to set for the bench's rows (`bench.data_samples`); None: as is
    bench_data: Target | None = None
    # --- a 0.1 record's hand-written builders (deprecated): derived from the targets above when not given ---------
    build_model_config: Callable[[Mapping[str, Any]], Any] | None = field(default=None, repr=False)
    build_datamodule: Callable[[Mapping[str, Any], Any], L.LightningDataModule] | None = field(default=None, repr=False)
    build_task: Callable[[Any, Mapping[str, Any], OptimConfig], SweepTask] | None = field(default=None, repr=False)
    check_loss: Callable[[Mapping[str, Any]], Any] | None = field(default=None, repr=False)
    model_config_from_dict: Callable[[Mapping[str, Any]], Any] | None = field(default=None, repr=False)
    build_model: Callable[[Any], Any] | None = field(default=None, repr=False)
    build_mlx_model: Callable[[Any], Any] | None = field(default=None, repr=False)
    name_parts: Callable[[Any], dict[str, str]] | None = field(default=None, repr=False)
    report_params: tuple[str, ...] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.monitor_mode not in ("max", "min"):
            raise ValueError(f"family {self.name}: monitor_mode must be 'max' or 'min', got {self.monitor_mode!r}")
        if self.quality_tolerance is not None and not (self.quality_tolerance >= 0 and math.isfinite(self.quality_tolerance)):
            raise ValueError(f"family {self.name}: quality_tolerance must be a finite number >= 0 (metric units) or "
                             f"None, got {self.quality_tolerance!r}")
        derived = {
            "build_model_config": _model_config if self.model_config is not None else None,
            "build_datamodule": _datamodule if self.datamodule is not None else None,
            "build_task": _task if self.task is not None else None,
            "check_loss": _loss_config,
            "model_config_from_dict": _model_config_from_dict if self.model_config is not None else None,
            "build_model": _model if self.model is not None else None,
            "build_mlx_model": _mlx_model if self.mlx_model is not None else None,
            "name_parts": _name_parts,
        }
        for name, builder in derived.items():
            if getattr(self, name) is None or isinstance(getattr(self, name), _Derived):
                object.__setattr__(self, name, _Derived(builder, self) if builder is not None else None)
        if self.report_params is not None and not self.report_keys:
            object.__setattr__(self, "report_keys", tuple(self.report_params))
        fit = self.fit_model_to_data
        fit = fit.args[1] if isinstance(fit, _Derived) else fit
        if isinstance(fit, str):  # a target: imported when the engine first calls it
            object.__setattr__(self, "fit_model_to_data", _Derived(_fit_model_to_data, self, fit))

    @property
    def legacy_fields(self) -> list[str]:
        """The 0.1 fields this record sets by hand."""
        return [name for name in LEGACY_FIELDS if getattr(self, name) is not None and not isinstance(getattr(self, name), _Derived)]

    def warn_if_legacy(self) -> None:
        """One deprecation line per family and process for a record written against sweeplab 0.1's `Family`."""
        legacy = self.legacy_fields
        if not legacy or self.name in _warned:
            return
        _warned.add(self.name)
        log.warning(
            "family %s: its record sets %s, deprecated (removed in the next release); write %s instead "
            "(docs/families.md)", self.name, ", ".join(legacy), "; ".join(dict.fromkeys(_LEGACY_HINTS[f] for f in legacy)),
        )

    def target(self, field_name: str) -> Any:
        """A target field's object, imported on first use."""
        return resolve(getattr(self, field_name), f"family {self.name}", field_name)

    def label(self, key: str, whole_key: bool = False) -> str:
        """A config key's short label: this family's, else the engine's (sweeplab.core.labels)."""
        return label(key, self.labels, whole_key)

    def data_group(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """The composed config's `data` group as the job records and builds it (`resolve_data`)."""
        data = dict(config.get("data") or {})
        return self.target("resolve_data")(data, config) if self.resolve_data is not None else data

    def make_task(self, model_config: Any, loss_config: Any, loss_values: Mapping[str, Any], optim: OptimConfig) -> Any:
        """The family's task from the loss config plan() built; a 0.1 record's own build_task gets the values."""
        if isinstance(self.build_task, _Derived):
            return _task(self, model_config, loss_config, optim)
        return self.build_task(model_config, loss_values, optim)

    def model_sizes(self) -> Mapping[str, Mapping[str, Any]]:
        """The family's named model sizes: `sizes`, else SIZES in the module of `model_config`."""
        if self.sizes is not None:
            return self.target("sizes")
        config_class = self.target("model_config")
        sizes = getattr(importlib.import_module(config_class.__module__), "SIZES", None)
        if not isinstance(sizes, Mapping):
            raise UserError(f"family {self.name}: {config_class.__module__} has no SIZES dict beside {config_class.__name__}; "
                            "define SIZES = {'tiny': {...}, ...} there or set the record's `sizes`")
        return sizes


# --- the builders a record gets from its targets -------------------------------------------------------------------
def _model_config(family: Family, values: Mapping[str, Any]) -> Any:
    return build_sized(family.target("model_config"), family.model_sizes(), {"size": family.default_size, **values}, "model")


def _datamodule(family: Family, values: Mapping[str, Any], model_config: Any) -> Any:
    from_model = {key: getattr(model_config, key) for key in family.model_keys_for_data}
    return build(family.target("datamodule"), {**values, **from_model}, "data")


def _loss_config(family: Family, values: Mapping[str, Any]) -> Any:
    """The `loss` group built into the family's loss config; None for a family whose loss takes no settings."""
    if family.loss is None:
        if values:
            raise ConfigError(f"loss.{next(iter(values))}", f"the {family.name} family's loss takes no settings (it has no `loss` config)")
        return None
    loss = family.target("loss")
    return build(loss, values, "loss") if inspect.isclass(loss) else loss(values)


def _task(family: Family, model_config: Any, loss: Any, optim: OptimConfig) -> Any:
    """`loss`: the loss config check_loss built at plan time (built once), or the `loss` group's values."""
    loss_config = family.check_loss(loss) if isinstance(loss, Mapping) else loss
    task = family.target("task")(model_config, loss_config, optim)
    if getattr(task, "family", None) == "":  # the SweepTask default: the record names the family
        task.family = family.name
        if "family" in getattr(task, "hparams", {}):
            task.hparams["family"] = family.name
    return task


def _model_config_from_dict(family: Family, values: Mapping[str, Any]) -> Any:
    return family.target("model_config")(**values)


def _model(family: Family, model_config: Any) -> Any:
    return family.target("model")(model_config)


def _mlx_model(family: Family, model_config: Any) -> Any:
    return family.target("mlx_model")(model_config)


def _fit_model_to_data(family: Family, target: str, model_config: Any, datamodule: Any, model_values: Mapping[str, Any]) -> Any:
    return resolve(target, f"family {family.name}", "fit_model_to_data")(model_config, datamodule, model_values)


def _name_parts(family: Family, cfg: Any) -> dict[str, str]:
    """{key: "label=value"} of the keys the family's run names always show (a key set to null shows nothing)."""
    keys = family.name_keys if isinstance(family.name_keys, tuple) else resolve(family.name_keys, f"family {family.name}", "name_keys")(cfg)
    parts = {}
    for key in keys:
        value = OmegaConf.select(cfg, key, default=None)
        if value is not None:
            parts[key] = f"{family.label(key)}={name_value(value)}"
    return parts


__all__ = ["LEGACY_FIELDS", "ExportSpec", "Family", "Target", "resolve"]
