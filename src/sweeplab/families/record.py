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
The engine builds through the record's methods (`make_model_config`, `make_datamodule`, `make_loss_config`,
`make_task`, `make_model`, `make_mlx_model`, `rebuild_model_config`, `fitted_model_config`, `run_name_parts`).

A record that passes a field sweeplab 0.1 had (a hand-written builder such as `build_task`) is refused when it is
constructed, in one line naming the field and what to write instead.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
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


# the fields sweeplab 0.1's record had and this one does not, with what a record does instead
_REMOVED_FIELDS = {
    "build_model_config": "write model_config='pkg.model:Config'",
    "build_datamodule": "write datamodule='pkg.data:DataModule' (+ model_keys_for_data)",
    "build_task": "write task='pkg.task:Task' (built as Task(model_config, loss, optim))",
    "check_loss": "write loss='pkg.task:LossConfig'",
    "model_config_from_dict": "write model_config='pkg.model:Config'",
    "build_model": "write model='pkg.model:Model'",
    "build_mlx_model": "write mlx_model='pkg.mlx_model:build'",
    "name_parts": "write name_keys=(...) with labels={key: short}",
    "report_params": "write report_keys=(...)",
    "report_metric": "drop it (the report judges, plots and tabulates the record's `monitor`)",
    "data_keys": "drop it (resume compares a checkpoint with the model as fit_model_to_data completes it)",
}


def _refuse_unknown_fields(args: tuple, kwargs: Mapping[str, Any]) -> None:
    """One line for a keyword `Family` does not take, not the dataclass's TypeError: a removed 0.1 field with what to
    do instead, any other with the nearest field."""
    accepted = [f.name for f in fields(Family)]
    unknown = [key for key in kwargs if key not in accepted]
    if not unknown:
        return
    where = f"family {kwargs.get('name', args[0] if args else '?')}: its record passes"
    removed = [key for key in unknown if key in _REMOVED_FIELDS]
    if len(removed) == 1:
        raise UserError(f"{where} {removed[0]}, a field removed after sweeplab 0.1; {_REMOVED_FIELDS[removed[0]]} "
                        "(docs/families.md)")
    if removed:
        fixes = "; ".join(f"{key}: {_REMOVED_FIELDS[key]}" for key in removed)
        raise UserError(f"{where} {', '.join(removed)}, fields removed after sweeplab 0.1; {fixes} (docs/families.md)")
    close = difflib.get_close_matches(unknown[0], accepted, n=1)
    hint = f"did you mean {close[0]}?" if close else "docs/families.md lists the fields"
    raise UserError(f"{where} {unknown[0]}, which is not a field of Family; {hint}")


@dataclass(frozen=True, eq=False)  # eq=False: a record is its own identity (and `labels` is a dict)
class Family:
    """One model family. `name`, `monitor` and `monitor_mode`, then the four targets (`model_config`, `datamodule`,
    `task`, and `model` for export and resume); every other field has a default that works.

    The targets are built from the config groups as plain dicts (Hydra's composed values, interpolations resolved) by
    the `make_*` methods below, and raise `ConfigError(key, problem)` for a bad value, which sweeplab prints as one
    line before any job trains.
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
    # --- how runs, the report and the UI show it -----------------------------------------------------------------
    labels: Mapping[str, str] = field(default_factory=dict)  # short labels of its keys: {"loss.alpha": "α"}
    name_keys: tuple[str, ...] | Target = ()  # keys every run name shows (a swept key is named anyway); or cfg -> keys
    report_keys: tuple[str, ...] = ()  # keys the report's table shows for this family (after the batch size)
    # --- optional parts ------------------------------------------------------------------------------------------
    export: ExportSpec | None = None  # the Core ML export; None: export=coreml is refused at plan time
    config_searchpath: str | None = None  # where Hydra finds its configs ("pkg://my_package.conf"); None: sweeplab's conf/
    mlx_model: Target | None = None  # model config -> the MLX port of `model` (backend=mlx); None: no MLX port
    # (data group, n_samples, out_dir) -> data keys to set for the bench's rows (`bench.data_samples`); None: as is
    bench_data: Target | None = None

    def __new__(cls, *args: Any, **kwargs: Any) -> Family:
        _refuse_unknown_fields(args, kwargs)  # before the dataclass's __init__ raises its TypeError
        return super().__new__(cls)

    def __post_init__(self) -> None:
        if self.monitor_mode not in ("max", "min"):
            raise ValueError(f"family {self.name}: monitor_mode must be 'max' or 'min', got {self.monitor_mode!r}")
        if self.quality_tolerance is not None and not (self.quality_tolerance >= 0 and math.isfinite(self.quality_tolerance)):
            raise ValueError(f"family {self.name}: quality_tolerance must be a finite number >= 0 (metric units) or "
                             f"None, got {self.quality_tolerance!r}")

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

    # --- what the engine builds from the targets ---------------------------------------------------------------------
    def make_model_config(self, values: Mapping[str, Any]) -> Any:
        """The `model` group built: the named `size` (else `default_size`), then the group's non-null keys."""
        return build_sized(self.target("model_config"), self.model_sizes(), {"size": self.default_size, **values}, "model")

    def rebuild_model_config(self, values: Mapping[str, Any]) -> Any:
        """The model config from every one of its fields (a checkpoint's hparams["model"])."""
        return self.target("model_config")(**values)

    def fitted_model_config(self, model_config: Any, datamodule: Any, model_values: Mapping[str, Any]) -> Any:
        """`model_config` with what the data (set up) decides filled in (`fit_model_to_data`)."""
        return self.target("fit_model_to_data")(model_config, datamodule, model_values)

    def make_datamodule(self, values: Mapping[str, Any], model_config: Any) -> L.LightningDataModule:
        """The `data` group built, plus the model config's `model_keys_for_data`."""
        from_model = {key: getattr(model_config, key) for key in self.model_keys_for_data}
        return build(self.target("datamodule"), {**values, **from_model}, "data")

    def make_loss_config(self, values: Mapping[str, Any]) -> Any:
        """The `loss` group built into the family's loss config; None for a family whose loss takes no settings."""
        if self.loss is None:
            if values:
                raise ConfigError(f"loss.{next(iter(values))}", f"the {self.name} family's loss takes no settings (it has no `loss` config)")
            return None
        loss = self.target("loss")
        return build(loss, values, "loss") if inspect.isclass(loss) else loss(values)

    def make_task(self, model_config: Any, loss: Any, optim: OptimConfig) -> SweepTask:
        """Task(model_config, loss config, optim), named for this family. `loss`: the loss config the plan built once,
        or the `loss` group's values (built here)."""
        loss_config = self.make_loss_config(loss) if isinstance(loss, Mapping) else loss
        task = self.target("task")(model_config, loss_config, optim)
        if getattr(task, "family", None) == "":  # the SweepTask default: the record names the family
            task.family = self.name
            if "family" in getattr(task, "hparams", {}):
                task.hparams["family"] = self.name
        return task

    def make_model(self, model_config: Any) -> Any:
        """The plain-torch model, Model(model_config): export, resume, load_model."""
        return self.target("model")(model_config)

    def make_mlx_model(self, model_config: Any) -> Any:
        """The MLX port of the model (backend=mlx)."""
        return self.target("mlx_model")(model_config)

    def run_name_parts(self, cfg: Any) -> dict[str, str]:
        """{key: "label=value"} of the keys the family's run names always show (a key set to null shows nothing)."""
        keys = self.name_keys if isinstance(self.name_keys, tuple) else self.target("name_keys")(cfg)
        parts = {}
        for key in keys:
            value = OmegaConf.select(cfg, key, default=None)
            if value is not None:
                parts[key] = f"{self.label(key)}={name_value(value)}"
        return parts


__all__ = ["ExportSpec", "Family", "Target", "resolve"]
