"""Model families: what sweeplab needs to know about a model to plan, train, report, bench and export it.

A family is one `Family` record (families/record.py), mostly lazy "module:Name" targets of its classes.
`model.family=<name>` in a config picks it; training, the sweep callback, the report, the bench and the export ask
the record, never a table of their own. The built-in families live in `families/textbridge/`,
`families/pagating_lm/` and `families/textbridge_decoder/`, each with its task, data module, record (`FAMILY` in the package's `__init__`) and its
family-only code (Neural-Engine layout, on-device batches, bench data).

A family from outside sweeplab registers the same way, through a Python entry point in its own package's
metadata (why an entry point and not a `_target_` in the model config: the report, the export and `resume` meet a
family by its name alone, in a run's tags or a checkpoint, long after the config that trained it is gone):

    [project.entry-points."sweeplab.families"]
    my_family = "my_package:FAMILY"

Its configs (`model/<name>.yaml`, `data/<name>.yaml`, `loss/<name>.yaml` when its loss has settings, any sweeps)
join sweeplab's through `Family.config_searchpath` (e.g. "pkg://my_package.conf"), which sweeplab's Hydra
search-path plugin (`hydra_plugins/sweeplab_families`) adds for every registered family. The checkout's
`examples/` holds a complete one; docs/families.md is the author's guide.

The contract a family's objects keep is checked before any job trains (`families.checks.check_contract`, called by
the plan; `check_task`, called right after the task is built), each failure one line naming the missing piece;
the optional hooks of a data module and a task are declared, with their meaning, in `families/contract.py`.
"""

from __future__ import annotations

import importlib
import logging
import re
from functools import cache
from importlib.metadata import entry_points
from typing import Any

from sweeplab.core.errors import ConfigError, UserError
from sweeplab.families.checks import check_contract, check_task
from sweeplab.families.record import ExportSpec, Family, Target, resolve

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "sweeplab.families"
# the built-in families, by the module holding their record (imported only when asked for)
BUILTIN = {
    "textbridge": "sweeplab.families.textbridge",
    "pagating_lm": "sweeplab.families.pagating_lm",
    "textbridge_decoder": "sweeplab.families.textbridge_decoder",
}


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
    except UserError:  # the record's own line (a field it passes that Family does not take, and what to write)
        raise
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


def missing_config_hint(message: str) -> str | None:
    """What to change when Hydra could not find a registered family's config (`Could not find 'model/cnn1d'`): the
    record sets no `config_searchpath`, or the package holding it ships no such file; None for any other message."""
    found = re.search(r"Could not (?:find|load) '(\w+)/([\w.-]+)'", message)
    if found is None or found.group(2) not in _entry_points():
        return None
    group, name = found.groups()
    try:
        family = get_family(name)
    except UserError as exc:
        return str(exc)
    if family.config_searchpath is None:
        return (f"family {name} sets no config_searchpath, so Hydra looks for {group}/{name}.yaml in sweeplab's conf/ only; "
                f"set config_searchpath='pkg://<its package>.conf' in its record")
    return f"family {name}: {family.config_searchpath} has no {group}/{name}.yaml; ship it as package data of the family's package"


__all__ = [
    "BUILTIN", "ENTRY_POINT_GROUP", "ExportSpec", "Family", "Target", "check_contract", "check_task",
    "config_searchpaths", "get_family", "missing_config_hint", "names", "resolve",
]
