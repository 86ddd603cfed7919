"""The sweep's comparison as a saved view of MLflow's runs table: the address `make ui` prints opens on it.

MLflow 3.17's UI keeps a saved (shareable) runs view as the experiment tag `mlflow.sharedViewState.<id>`, whose value
is a JSON envelope `{"name", "createdAt", "updatedAt", "state"}`; `state` is the page's state as JSON, stored
deflated and base64-encoded behind a `deflate;` prefix. The page opens a view from the address's
`viewStateShareKey=<id>` (and only when the address carries no search or sort of its own). The state holds the
search facets (`searchFilter`, `orderByKey`, `orderByAsc`, ...) and the table's and charts' settings
(`selectedColumns`, `columnOrder`, `compareRunCharts`, `compareRunSections`, ...), column keys written as
`metrics.`name``, `params.`name``, `tags.`name``.

This format is the UI's own, not a documented API: sweeplab writes it only under the MLflow it pins (PINNED_MLFLOW,
checked by tests/test_ui_view.py and by `make ui-check` against that version's UI). Under another MLflow,
`view_supported()` is False and `make ui` prints a filter-and-sort address instead (sweeplab.ui).

The view of a replicated sweep: its configuration runs (sweeplab.report.config_runs), fastest to the target
first; columns: the swept keys, samples/s, the final validation metric, time to target and speedup to target, each
as `median (low–high)`, then the verdict, the stability of the speed and the quality; charts: one bar per
configuration for each of those figures, and the validation metric against training time (the configuration's
median curve, `curve/<metric>` against `curve/train_seconds`).
"""

from __future__ import annotations

import base64
import json
import time
import uuid
import zlib
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from sweeplab.tracking import mlflow_store

PINNED_MLFLOW = "3.17"  # major.minor of the MLflow whose UI reads this state (pyproject pins mlflow==3.17.x)
VIEW_TAG_PREFIX = "mlflow.sharedViewState."
SHARE_KEY_PARAM = "viewStateShareKey"
MODE_PARAM = "compareRunsMode"  # TABLE (the default) or CHART
DEFLATE_PREFIX = "deflate;"
# the validation curve of a configuration run: the median over its replicates at shared training times
CURVE_PREFIX = "curve/"
CURVE_TIME = f"{CURVE_PREFIX}train_seconds"
# the figures of a configuration run shown as columns and charts, each with `_low` and `_high` bounds
SPEED, TIME_TO_TARGET, SPEEDUP_TO_TARGET = "samples_per_sec", "time_to_target_s", "speedup_to_target"
TAG_COLUMNS = ("verdict", "stability", "quality")
RUN_NAME_COLUMN, CREATED_COLUMN = "attributes.`Run Name`", "runDateAndNestInfo"  # the table's own columns


def view_supported(version: str | None = None) -> bool:
    """True under the MLflow whose UI this module's state format was checked against."""
    if version is None:
        import mlflow

        version = mlflow.__version__
    return ".".join(version.split(".")[:2]) == PINNED_MLFLOW


def encode_state(state: dict[str, Any]) -> str:
    """The page state as the UI stores it: `deflate;` + base64 of the zlib-deflated compact JSON."""
    raw = json.dumps(state, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return DEFLATE_PREFIX + base64.b64encode(zlib.compress(raw)).decode("ascii")


def decode_state(text: str) -> dict[str, Any]:
    """The inverse of encode_state; a plain JSON state (the UI writes those too) is read as it is."""
    if text.startswith(DEFLATE_PREFIX):
        text = zlib.decompress(base64.b64decode(text[len(DEFLATE_PREFIX):])).decode("utf-8")
    return json.loads(text)


def envelope(name: str, state: dict[str, Any], now_ms: int) -> str:
    """The experiment tag's value: the view's name (listed in the UI's saved views), times and encoded state."""
    return json.dumps({"name": name, "createdAt": now_ms, "updatedAt": now_ms, "state": encode_state(state)},
                      separators=(",", ":"), ensure_ascii=False)


def view_id(parent_run_id: str) -> str:
    """One view per sweep, replaced when its report is written again."""
    return f"sweeplab-{parent_run_id}"


def column(kind: str, name: str) -> str:
    """A runs-table column key: kind is `metrics`, `params`, `tags` or `attributes`."""
    return f"{kind}.`{name}`"


def with_bounds(name: str) -> list[str]:
    return [name, f"{name}_low", f"{name}_high"]


def compared_metrics(final_metric: str) -> list[str]:
    """The configuration run's figures on screen, in order (the bar charts and the metric columns)."""
    return [SPEED, TIME_TO_TARGET, final_metric, SPEEDUP_TO_TARGET]


def _uuid(seed: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"sweeplab:{seed}"))


def _chart(kind: str, section: str, metric: str, **fields: Any) -> dict[str, Any]:
    card = {"uuid": _uuid(f"chart:{section}:{metric}"), "type": kind, "runsCountToCompare": 100,
            "metricSectionId": section, "deleted": False, "isGenerated": False, "metricKey": metric,
            "displayName": fields.pop("displayName", metric), "selectedMetricKeys": [metric]}
    return {**card, **fields}


def chart_state(final_metric: str, monitored: str) -> dict[str, Any]:
    """The chart view: one section with a bar per configuration for each compared figure and its bounds, and the
    monitored metric's median curve against training time; MLflow's own sections (every other metric) follow,
    collapsed. Section names sort the comparison first."""
    section = _uuid("section:comparison")
    charts = [_chart("LINE", section, f"{CURVE_PREFIX}{monitored}",
                     displayName=f"{monitored} (median over replicates) against training time (s)",
                     xAxisKey="metric", selectedXAxisMetricKey=CURVE_TIME, useGlobalXaxisKey=False,
                     lineSmoothness=0, scaleType="linear", xAxisScaleType="linear", yAxisKey="metric",
                     yAxisExpressions=[], range={}, ignoreOutliers=False, useGlobalLineSmoothing=False,
                     displayPoints=True)]
    charts += [_chart("BAR", section, name) for name in compared_metrics(final_metric)]
    sections = [{"uuid": section, "name": "Comparison", "display": True, "isReordered": True,
                 "deleted": False, "isGenerated": False}]
    return {"compareRunCharts": charts, "compareRunSections": sections, "isAccordionReordered": True,
            "hideEmptyCharts": True}


def comparison_state(swept_keys: Sequence[str], text_columns: Sequence[str], final_metric: str,
                     monitored: str, search_filter: str) -> dict[str, Any]:
    """The page state of a sweep's comparison: the search facets (its configuration runs, fastest to the target
    first) and the table's and charts' settings. Columns: the swept keys, then `text_columns` (tags holding each
    figure as `median (low–high)`), the verdict, stability and quality tags, the figures' metrics with their bounds;
    the creation time last."""
    columns = [column("params", key) for key in swept_keys]
    columns += [column("tags", name) for name in [*text_columns, *TAG_COLUMNS]]
    columns += [column("metrics", m) for name in compared_metrics(final_metric) for m in with_bounds(name)]
    # narrow enough that the swept keys and three figures fit beside MLflow's Assistant panel at 1600 px
    widths = {c: 70 for c in columns[: len(swept_keys)]}
    widths.update({column("tags", name): 165 if name.startswith("final ") else 150 for name in text_columns})
    widths.update({column("tags", "verdict"): 130, column("tags", "stability"): 220, column("tags", "quality"): 90})
    return {
        "searchFilter": search_filter,
        "orderByKey": column("metrics", SPEEDUP_TO_TARGET),
        "orderByAsc": False,
        "lifecycleFilter": "Active",
        "modelVersionFilter": "All Runs",
        "datasetsFilter": [],
        "selectedColumns": columns,
        "columnOrder": [RUN_NAME_COLUMN, *columns, CREATED_COLUMN],
        "columnWidths": {RUN_NAME_COLUMN: 130, **widths},
        "runListHidden": False,
        **chart_state(final_metric, monitored),
    }


def write_comparison_view(client, experiment_id: str, parent_run_id: str, name: str, state: dict[str, Any]) -> str:
    """Set the sweep's saved view on its experiment (replacing an earlier one of the same sweep); its id."""
    key = view_id(parent_run_id)
    client.set_experiment_tag(experiment_id, VIEW_TAG_PREFIX + key, envelope(name, state, int(time.time() * 1000)))
    return key


def read_view(client, experiment_id: str, key: str) -> tuple[str, dict[str, Any]] | None:
    """(name, state) of a saved view, None when the experiment has none of that id."""
    value = client.get_experiment(experiment_id).tags.get(VIEW_TAG_PREFIX + key)
    if value is None:
        return None
    data = json.loads(value)
    return data["name"], decode_state(data["state"])


def view_url(base: str, experiment_id: str, key: str, mode: str = "TABLE") -> str:
    """The address that opens the view (no search or sort of its own: the UI would ignore the view then)."""
    query = f"{mlflow_store.UI_WORKFLOW_QUERY}&{SHARE_KEY_PARAM}={quote(key)}"
    if mode != "TABLE":
        query += f"&{MODE_PARAM}={mode}"
    return f"{base}/#/experiments/{experiment_id}/runs?{query}"
