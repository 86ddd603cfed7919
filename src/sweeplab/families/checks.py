"""The family contract, checked before any job trains: each failure is one line naming the family and the missing piece.

- `check_contract(family, container)`: at plan time, from the record and the composed config alone (imports the
  family's classes, builds nothing): the targets a job needs, a `tiny` size, the task's class, the monitor, an
  export spec when `export=coreml` asks for one, an MLX port when `backend=mlx` does;
- `check_task(family, task)`: right after the task is built, before any step: it is a SweepTask of this family and
  keeps the model config in `hparams["model"]` (resume and `families.loading.load_model` rebuild the model from it).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

from sweeplab.core.errors import ConfigError, UserError
from sweeplab.families.record import Family

# the record fields a job builds from, and what to write when one is missing
_REQUIRED = {
    "model_config": "model_config='pkg.model:Config' (a dataclass, SIZES beside it)",
    "datamodule": "datamodule='pkg.data:DataModule'",
    "task": "task='pkg.task:Task' (a SweepTask)",
}


def check_contract(family: Family, container: Mapping[str, Any]) -> None:
    """Everything the record must hold for the job `container` (the composed config, resolved) describes."""
    where = f"family {family.name}"
    for field_name, hint in _REQUIRED.items():
        if getattr(family, field_name) is None:
            raise UserError(f"{where}: its record has no {field_name}; set {hint}")
    if not isinstance(family.monitor, str) or "/" not in family.monitor:
        raise UserError(f"{where}: monitor={family.monitor!r} names no logged metric; set monitor='val/<metric>' "
                        "(what the task logs in validation)")
    _check_sizes(family)
    _check_task_class(family)
    _check_loss_config(family)
    export = container.get("export") or {}
    if export.get("format", "none") != "none":
        _check_export(family, export)
    if (container.get("backend") or {}).get("name") == "mlx" and family.mlx_model is None:
        raise ConfigError("backend", f"the {family.name} family has no MLX port (its record sets no mlx_model); use a PyTorch backend")


def _check_sizes(family: Family) -> None:
    config_class = family.target("model_config")
    if not dataclasses.is_dataclass(config_class):
        raise UserError(f"family {family.name}: model_config {config_class!r} is not a dataclass; "
                        "make it a @dataclass (the `model` group is checked against its fields)")
    sizes = family.model_sizes()
    if "tiny" not in sizes:
        raise UserError(f"family {family.name}: its sizes ({', '.join(sizes)}) have no 'tiny', which debug=smoke and "
                        "quick checks ask for; add SIZES['tiny'], a model that trains in seconds on a CPU")


def _check_task_class(family: Family) -> None:
    # deferred: tasks.base imports Lightning, which a record's plan-time check needs only here
    from sweeplab.tasks.base import SweepTask

    task_class = family.target("task")
    if not (inspect.isclass(task_class) and issubclass(task_class, SweepTask)):
        raise UserError(f"family {family.name}: task {task_class!r} is not a subclass of sweeplab.tasks.base.SweepTask; "
                        "derive it from SweepTask (it trains, checkpoints and times the family's steps)")
    if task_class.family not in ("", family.name):
        raise UserError(f"family {family.name}: its task {task_class.__name__} says family={task_class.family!r}; "
                        f"set it to {family.name!r} or leave it unset (checkpoints name their family by it)")


def _check_loss_config(family: Family) -> None:
    if family.loss is not None and not callable(family.target("loss")):
        raise UserError(f"family {family.name}: loss={family.loss!r} is not a class; name the loss config dataclass")


def _check_export(family: Family, export: Mapping[str, Any]) -> None:
    if family.export is None:
        raise ConfigError("export", f"the {family.name} family has no Core ML export (its record sets no `export` "
                          "ExportSpec); use export=none")
    if family.model is None:
        raise UserError(f"family {family.name}: export=coreml rebuilds the model from its checkpoint, and the record "
                        "sets no model; set model='pkg.model:Model'")
    if export.get("layout", "standard") == "ane" and family.export.ane_layout is None:
        raise ConfigError("export.layout", f"the {family.name} family has no Neural-Engine layout (its ExportSpec sets "
                          "no ane_layout); use export.layout=standard")


def check_task(family: Family, task: Any) -> None:
    """The task a family's builder returned, checked against what checkpoints, resume and the timer rely on."""
    # deferred: tasks.base imports Lightning; this module is imported with the records, which stay light
    from sweeplab.tasks.base import SweepTask

    where = f"family {family.name}"
    if not isinstance(task, SweepTask):
        raise UserError(f"{where}: its task ({family.task!r}) built a {type(task).__name__}, not a sweeplab SweepTask; derive the task from SweepTask")
    if task.family != family.name:
        raise UserError(f"{where}: its task {type(task).__name__} says family={task.family!r}; set it "
                        f"to {family.name!r} (checkpoints name their family by it)")
    model_values = task.hparams.get("model")
    if not isinstance(model_values, Mapping):
        raise UserError(f"{where}: its task {type(task).__name__} keeps no model config in hparams['model'] (resume and "
                        "load_model rebuild the model from it); give the model a dataclass `config` or pass hparams={'model': asdict(config)}")
    if family.model_config is not None:
        try:
            family.rebuild_model_config(dict(model_values))
        except (TypeError, ValueError, ConfigError) as exc:
            raise UserError(f"{where}: hparams['model'] of its task does not rebuild the model config ({exc}); "
                            "store asdict(model_config) there") from None
