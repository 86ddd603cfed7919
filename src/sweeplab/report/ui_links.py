"""Where a sweep's comparison is in the MLflow UI: the address `make ui` prints and the sweep's closing line."""

from __future__ import annotations

from sweeplab.core.records import CONFIGURATION_ROLE, JOB, SweepRun
from sweeplab.report import config_runs, saved_view
from sweeplab.tracking import mlflow_store


def latest_sweep_url(uri: str, base: str) -> str | None:
    """The runs-table URL of the newest sweep in any experiment of the store (sweep_url); None when there is none."""
    parent_id = mlflow_store.latest_sweep(uri)
    return sweep_url(uri, base, parent_id) if parent_id is not None else None


def sweep_url(uri: str, base: str, parent_id: str, mode: str = "TABLE") -> str:
    """Where a sweep's comparison is in the UI. A replicated sweep: its saved comparison view (sweeplab.report.
    saved_view: its configuration runs by verdict group, then label, the figures as columns, the curve as its chart;
    written when its report was, and here again for a sweep reported before views existed), or, under an MLflow whose
    UI sweeplab has not checked, a filter on its configuration runs and a sort. Without replicates: its jobs, best
    first.
    mode: TABLE, or CHART for the view's charts."""
    parent = mlflow_store.read_run(uri, parent_id, "sweep")
    experiment_id = parent.experiment_id
    if config_runs.configuration_runs(uri, parent_id):
        key = saved_view.view_id(parent_id)
        if saved_view.view_supported() and (saved_view.read_view(uri, experiment_id, key) is not None
                                         or config_runs.comparison_view(uri, parent_id) is not None):
            return saved_view.view_url(base, experiment_id, key, mode)
        return mlflow_store.runs_url(
            base, experiment_id, mlflow_store.children_filter(parent_id, CONFIGURATION_ROLE),
            order_by_metric="speedup_to_target",
        )
    return mlflow_store.runs_url(
        base, experiment_id, mlflow_store.children_filter(parent_id),
        order_by_metric=JOB.objective,  # every job's return value (val/cos, val/ppl): the best job first
        ascending=SweepRun.from_run(parent).objective_mode == "min",
    )


def spread_url(uri: str, base: str, parent_id: str) -> str | None:
    """Where every replicate's curve of a replicated sweep is (its spread view, in chart mode: sweeplab.report.
    saved_view.spread_state); None for a sweep whose report wrote none (no replicates, an older report, another
    MLflow)."""
    parent = mlflow_store.read_run(uri, parent_id, "sweep")
    key = saved_view.spread_view_id(parent_id)
    if not saved_view.view_supported() or saved_view.read_view(uri, parent.experiment_id, key) is None:
        return None
    return saved_view.view_url(base, parent.experiment_id, key, "CHART")


def sweep_line(uri: str, parent_id: str) -> str:
    """The sweep's closing line: where its comparison is in the UI (where the UI's address is known; its spread view's
    address on a second line where its report wrote one), else how to get that address."""
    base = mlflow_store.ui_base(uri)
    fallback = f"the comparison in the MLflow UI: `make ui` prints its address (sweep run {parent_id})"
    if base is None:
        return fallback
    try:
        line = f"the comparison in the MLflow UI: {sweep_url(uri, base, parent_id)}"
        spread = spread_url(uri, base, parent_id)
        return line + (f"\nevery replicate's curve (the spread): {spread}" if spread else "")
    except Exception:  # a line of the sweep's closing output: never the reason it fails
        return fallback
