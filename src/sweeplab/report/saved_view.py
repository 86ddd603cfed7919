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

The view of a replicated sweep (named by its target): its configuration runs (sweeplab.report.config_runs),
sorted by verdict group, then by label in natural order (`bs=4` before `bs=16`; a tie is never shown as a ranking);
columns, so that they fit a laptop's first screen: the configuration's short label (the run's name), speedup to
target as `median (low–high)` (the baseline's: `1 (the baseline)`), the verdict, the study's caveats
(sweeplab.study.caveats: too few replicates, a smoke budget, loaded hosts, jobs stopped by rule), the target, then time to target, the final metric and samples/s, the
stability of the speed and the quality, the swept keys and the figures' metrics with their bounds. Charts: the
validation metric's median curve against training time with the target as a line, alone (no bar without its
interval: MLflow 3.17's bar charts draw none), pointing to report.html for the rest.
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

from sweeplab.core.records import CONFIGURATION, JOB, key_of
from sweeplab.study.verdict import shown_in_the_view
from sweeplab.tracking import mlflow_store, runs

PINNED_MLFLOW = "3.17"  # major.minor of the MLflow whose UI reads this state (pyproject pins mlflow==3.17.x)
VIEW_TAG_PREFIX = "mlflow.sharedViewState."
SHARE_KEY_PARAM = "viewStateShareKey"
MODE_PARAM = "compareRunsMode"  # TABLE (the default) or CHART
DEFLATE_PREFIX = "deflate;"
# the validation curve of a configuration run (records.ConfigurationRun's curve and curve_seconds): the median over
# its replicates at shared training times. MLflow names the x axis by its key: keys that read as words ("median
# val/cos", x "training seconds"); MLflow's names allow letters, digits, / . - _ : space. MLflow 3.17's legend lists
# every selected key for every run (getLineChartLegendData: no check that the run logs that key), and the saved
# state has no field that drops an entry (its line style hook, getCustomLineStyle, is a React context, not state):
# so the chart selects the curve's key alone, and the target's line is a run of its own logging the target under that
# key (sweeplab.report.config_runs, role target, its row last in the table): one legend entry `target (median
# val/cos)`, in the report's target colour. The replicates' spread is not drawn here: 3.17 fills a band only
# between a run group's min and max (groupBy, which would turn the table into groups of jobs), and a metric drawn
# against another is joined in the order of its x values, so one history cannot hold a band's outline; report.html's
# curves.png draws each replicate and their band
# tags of a configuration run (records.ConfigurationRun) the view shows after the figures: its stability and quality
AFTER_FIGURES = (CONFIGURATION.stability, CONFIGURATION.quality)
# the table's own columns: the run's name (the configuration's short label) and its creation time, both pinned
# left by the UI. Created cannot be hidden by a view (3.17's table hides only its User, Source, Version, Models,
# Dataset and Description columns, params, metrics and tags), so the view narrows it to its status icon; Duration
# (not hideable either) goes last.
RUN_NAME_COLUMN, CREATED_COLUMN, DURATION_COLUMN = "attributes.`Run Name`", "runDateAndNestInfo", "duration"
CREATED_WIDTH = 32
# the chart section's layout (3.17 reads `columns` and `cardHeight` of a section): one chart, as wide as the page,
# tall enough for its legend (a run per configuration, and the target)
CHART_COLUMNS, CHART_HEIGHT = 1, 420  # at 1280x800 its legend inside the first screen


def view_supported(version: str | None = None) -> bool:
    """True under the MLflow whose UI this module's state format was checked against."""
    if version is None:
        version = runs.mlflow_version()
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


def compared_metrics(monitored: str) -> list[str]:
    """The configuration run's figures on screen, in order (the metric columns): sweeplab.study.verdict.FIGURES'."""
    return [f.named(f.metric, monitored) for f in shown_in_the_view()]


def _uuid(seed: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"sweeplab:{seed}"))


def _chart(kind: str, section: str, metric: str, **fields: Any) -> dict[str, Any]:
    card = {"uuid": _uuid(f"chart:{section}:{metric}"), "type": kind, "runsCountToCompare": 100,
            "metricSectionId": section, "deleted": False, "isGenerated": False, "metricKey": metric,
            "displayName": fields.pop("displayName", metric), "selectedMetricKeys": [metric]}
    return {**card, **fields}


def _deleted_charts(seed: str, section: str, keys: set[str]) -> list[dict[str, Any]]:
    """A deleted card for each of `keys`: MLflow adds a chart for every metric no card names."""
    return [{"uuid": _uuid(f"{seed}:{key}"), "type": "BAR", "runsCountToCompare": 100, "metricSectionId": section,
             "deleted": True, "isGenerated": False, "metricKey": key, "displayName": key, "selectedMetricKeys": [key]}
            for key in sorted(keys)]


def _section(section: str, name: str) -> dict[str, Any]:
    return {"uuid": section, "name": name, "display": True, "isReordered": True, "deleted": False,
            "isGenerated": False, "columns": CHART_COLUMNS, "cardHeight": CHART_HEIGHT}


SECTION_NAME = "Curve & target; rest: report.html"  # short: wholly shown at 1280 px (252 px there)


def chart_state(final_metric: str, monitored: str, target_text: str = "",
                metric_keys: Sequence[str] = ()) -> dict[str, Any]:
    """The chart view: the monitored metric's median curve against training time with the target as a line (the
    target's own run: one line, one legend entry), alone, wide (the runs list hidden: the legend names the runs), in a section whose name points
    to the sweep's report.html for the rest. MLflow 3.17 draws bars without error bars, and titles a chart of
    several series by their keys (`a_low vs a vs a_high`, its displayName ignored), so figures with intervals stay
    in report.html and the runs table. MLflow also adds a chart for every metric the runs log that no chart names
    (bars of medians without intervals): each of `metric_keys` gets a deleted card, so none is added."""
    section = _uuid("section:comparison")
    curve = key_of(CONFIGURATION.curve, monitored)
    charts = [_chart("LINE", section, curve,
                     displayName=f"{monitored} (median over replicates) against training time (s), "
                                 f"target {target_text}",
                     selectedMetricKeys=[curve],
                     xAxisKey="metric", selectedXAxisMetricKey=CONFIGURATION.curve_seconds, useGlobalXaxisKey=False,
                     lineSmoothness=0, scaleType="linear", xAxisScaleType="linear", yAxisKey="metric",
                     yAxisExpressions=[], range={}, ignoreOutliers=False, useGlobalLineSmoothing=False,
                     displayPoints=True)]
    charts += _deleted_charts("chart:hidden", section, set(metric_keys) - {curve})
    sections = [_section(section, SECTION_NAME)]
    return {"compareRunCharts": charts, "compareRunSections": sections, "isAccordionReordered": True,
            "hideEmptyCharts": True, "runListHidden": True}


SPREAD_SECTION_NAME = "Every replicate; the median: the other view"  # wholly shown at 1280 px
SPREAD_SUFFIX = "-spread"


def spread_view_id(parent_run_id: str) -> str:
    """The sweep's second view, beside its comparison (view_id): every replicate's curve."""
    return view_id(parent_run_id) + SPREAD_SUFFIX


def spread_state(search_filter: str, monitored: str, metric_keys: Sequence[str] = ()) -> dict[str, Any]:
    """The spread view: in chart mode, the monitored metric of every job (a replicate) against its step, each in its
    configuration's colour (the jobs' `mlflow.runColor`, set by the sweep's report), and the target as one line (the
    target's run logs the target under the metric's key), wide, the runs list hidden. The replicates' spread is the
    distance between the lines of one colour. MLflow 3.17 draws a band only for a run group ("Group by", min to
    max), whose colour comes from a hash of the group's name or from the browser's storage, never from the store:
    four configurations drew in four of MLflow's palette colours, not the report's (tried 2026-12-07). Thin lines
    keep the report's colours. Every other metric the jobs log gets a deleted card, as in chart_state."""
    section = _uuid("section:spread")
    charts = [_chart("LINE", section, monitored,
                     displayName=f"{monitored} of every replicate, by step",
                     selectedMetricKeys=[monitored], xAxisKey="step", selectedXAxisMetricKey="",
                     useGlobalXaxisKey=False, lineSmoothness=0, scaleType="linear", xAxisScaleType="linear",
                     yAxisKey="metric", yAxisExpressions=[], range={}, ignoreOutliers=False,
                     useGlobalLineSmoothing=False, displayPoints=False)]
    charts += _deleted_charts("chart:spread-hidden", section, set(metric_keys) - {monitored})
    sections = [_section(section, SPREAD_SECTION_NAME)]
    return {"searchFilter": search_filter, "orderByKey": column("tags", JOB.spread_line),
            "orderByAsc": True, "lifecycleFilter": "Active", "modelVersionFilter": "All Runs", "datasetsFilter": [],
            "runsHiddenMode": "SHOW_ALL",  # every replicate (MLflow shows the first 10 rows' runs by default)
            "compareRunCharts": charts, "compareRunSections": sections, "isAccordionReordered": True,
            "hideEmptyCharts": True, "runListHidden": True}


def spread_view_name(sweep_name: str, monitored: str) -> str:
    return f"sweep {sweep_name}: {monitored} of every replicate"


def view_name(sweep_name: str, target_text: str) -> str:
    """The view's name in the UI's view menu: the sweep and the target its figures are timed to."""
    return f"sweep {sweep_name}: time to {target_text}"


def comparison_state(swept_keys: Sequence[str], text_columns: Sequence[str], final_metric: str,
                     monitored: str, search_filter: str, target_text: str = "",
                     metric_keys: Sequence[str] = ()) -> dict[str, Any]:
    """The page state of a sweep's comparison: the search facets (its configuration runs, by verdict group, then by
    label: never a ranking the verdict does not make) and the table's and charts' settings. Columns, after the run's
    name (the configuration's short label): `text_columns[0]` (speedup to target as `median (low–high)`), the
    verdict, the target, the other text columns (time to target, final metric, samples/s), stability and quality,
    the swept keys, then the figures' metrics with their bounds (numbers that sort); MLflow's Created narrowed,
    Duration last, every other column hidden."""
    first, *rest = text_columns
    tags = [first, CONFIGURATION.verdict, CONFIGURATION.target_text, CONFIGURATION.caveat, *rest, *AFTER_FIGURES]
    columns = [column("tags", name) for name in tags]
    columns += [column("params", key) for key in swept_keys]
    columns += [column("metrics", m) for name in compared_metrics(monitored) for m in with_bounds(name)]
    widths = {column("tags", name): 150 for name in text_columns}
    # wide enough for `1.04 (not measured, n = 2)`, `slower than bs=16 α=0.7`, `val/cos ≥ 0.5364` and the caveat (`not an
    # answer: 2 replicates, smoke; loaded host (8/8)`); with the label and Created they take 1017 of the 1028 px a
    # 1280 px window leaves beside MLflow's sidebar (its Assistant panel closed: sweeplab.tracking.ui_server)
    widths.update({column("tags", first): 185, column("tags", CONFIGURATION.verdict): 160,
                   column("tags", CONFIGURATION.target_text): 115, column("tags", CONFIGURATION.caveat): 320,
                   column("tags", CONFIGURATION.stability): 200, column("tags", CONFIGURATION.quality): 90})
    widths.update({column("params", key): 80 for key in swept_keys})
    return {
        "searchFilter": search_filter,
        "orderByKey": column("tags", CONFIGURATION.verdict_order),
        "orderByAsc": True,
        "lifecycleFilter": "Active",
        "modelVersionFilter": "All Runs",
        "datasetsFilter": [],
        "selectedColumns": columns,
        "columnOrder": [RUN_NAME_COLUMN, CREATED_COLUMN, *columns, DURATION_COLUMN],
        "columnWidths": {RUN_NAME_COLUMN: 120, CREATED_COLUMN: CREATED_WIDTH, **widths},
        **chart_state(final_metric, monitored, target_text, metric_keys),
    }


def write_comparison_view(uri: str, experiment_id: str, parent_run_id: str, name: str, state: dict[str, Any],
                          key: str | None = None) -> str:
    """Set the sweep's saved view (`key`: view_id, or spread_view_id) on its experiment (replacing an earlier one of
    the same sweep); its id."""
    key = key or view_id(parent_run_id)
    runs.set_experiment_tag(uri, experiment_id, VIEW_TAG_PREFIX + key, envelope(name, state, int(time.time() * 1000)))
    return key


def read_view(uri: str, experiment_id: str, key: str) -> tuple[str, dict[str, Any]] | None:
    """(name, state) of a saved view, None when the experiment has none of that id."""
    value = runs.experiment_tag(uri, experiment_id, VIEW_TAG_PREFIX + key)
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
