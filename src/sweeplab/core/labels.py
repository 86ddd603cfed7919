"""Short labels for config keys: one table, read by run names (tracking/naming), the report's columns and the bench.

The engine's own keys are here; a family adds its own through `Family.labels` ({"loss.alpha": "α"}). A key without
a label shows its last part in a run name (`model.hidden` -> `hidden`) and the whole key in the report's header (a
table has room, and two groups' `seed` stay apart). One spelling per key everywhere: a run named
`α=0.7 β=0.5 ...` has the report columns `α` and `β`. Run names are not ASCII-only on purpose: MLflow stores them
as UTF-8 text, no file or directory is named after a run, and a run is picked on the command line by its id or its
row number (`report --baseline`) as well as by a part of its name.
"""

from __future__ import annotations

from collections.abc import Mapping

from sweeplab.core.records import JOB

ENGINE_LABELS: Mapping[str, str] = {  # by config key: a job's params are its flattened config, keys and all
    JOB.batch_size: "bs",  # every family's data group has one: the batch-size search and the report's first column
    JOB.max_steps: "steps",
    "optim.lr": "lr",
}


def label(key: str, family_labels: Mapping[str, str] | None = None, whole_key: bool = False) -> str:
    """The short label of a dotted config key: the family's, else the engine's, else the key's last part (the whole
    key with `whole_key`, as the report's header shows an unlabelled key)."""
    if family_labels and key in family_labels:
        return family_labels[key]
    if key in ENGINE_LABELS:
        return ENGINE_LABELS[key]
    return key if whole_key else key.rsplit(".", 1)[-1].replace("/", ".")


__all__ = ["ENGINE_LABELS", "label"]
