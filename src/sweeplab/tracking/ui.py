"""`make ui`: print where the latest sweep's runs are in the MLflow UI, then serve the UI for the local store.

    python -m sweeplab.tracking.ui [--host 127.0.0.1] [--port 5000] [--no-serve]

The address: --host/--port, else $SWEEPLAB_UI_URL (e.g. http://127.0.0.1:5001), which the jobs' closing lines read
too, so the link each job prints opens here; else 127.0.0.1:5000.

The printed URL opens the sweep's comparison: for a replicated sweep the saved view of its configuration runs (one
row per configuration with its figures and intervals, fastest to the target first: sweeplab.tracking.ui_view, under
the MLflow sweeplab pins; a filter-and-sort address under another), for a sweep without replicates its jobs, in
MLflow's "machine learning" view (MLflow 3.17 opens experiments in its GenAI view unless told otherwise). With an http(s)
tracking URI the UI is the tracking server's own: only the URL is printed.
"""

from __future__ import annotations

import os
import shutil
import sys

from sweeplab import cli
from sweeplab.tracking import config_runs, mlflow_store, ui_view


def latest_sweep_url(uri: str, base: str) -> str | None:
    """The runs-table URL of the newest sweep in any experiment of the store (sweep_url); None when there is none."""
    parent_id = mlflow_store.latest_sweep(uri)
    return sweep_url(uri, base, parent_id) if parent_id is not None else None


def sweep_url(uri: str, base: str, parent_id: str, mode: str = "TABLE") -> str:
    """Where a sweep's comparison is in the UI. A replicated sweep: its saved comparison view (sweeplab.tracking.
    ui_view: its configuration runs, fastest to the target first, the figures as columns and charts; written when its
    report was, and here again for a sweep reported before views existed), or, under an MLflow whose UI sweeplab has
    not checked, a filter on its configuration runs and a sort. Without replicates: its jobs, best first.
    mode: TABLE, or CHART for the view's charts."""
    client = mlflow_store.client(uri)
    parent = client.get_run(parent_id)
    experiment_id = parent.info.experiment_id
    if config_runs.configuration_runs(uri, parent_id):
        key = ui_view.view_id(parent_id)
        if ui_view.view_supported() and (ui_view.read_view(client, experiment_id, key) is not None
                                         or config_runs.comparison_view(uri, parent_id) is not None):
            return ui_view.view_url(base, experiment_id, key, mode)
        return mlflow_store.runs_url(
            base, experiment_id,
            f"tags.mlflow.parentRunId = '{parent_id}' and tags.`{mlflow_store.ROLE_TAG}` = "
            f"'{mlflow_store.CONFIGURATION_ROLE}'",
            order_by_metric="speedup_to_target",
        )
    return mlflow_store.runs_url(
        base, experiment_id, f"tags.mlflow.parentRunId = '{parent_id}'",
        order_by_metric="objective",  # every job's return value (val/cos, val/ppl): the best job first
        ascending=parent.data.tags.get("objective_mode") == "min",
    )


def sweep_line(uri: str, parent_id: str) -> str:
    """The sweep's closing line: where its comparison is in the UI (where the UI's address is known), else how to
    get that address."""
    base = mlflow_store.ui_base(uri)
    fallback = f"the comparison in the MLflow UI: `make ui` prints its address (sweep run {parent_id})"
    if base is None:
        return fallback
    try:
        return f"the comparison in the MLflow UI: {sweep_url(uri, base, parent_id)}"
    except Exception:  # a line of the sweep's closing output: never the reason it fails
        return fallback


def main(argv: list[str] | None = None) -> int:
    parser = cli.ArgumentParser(prog="python -m sweeplab.tracking.ui", description=__doc__.split("\n\n")[0])
    host, port = mlflow_store.ui_address()
    parser.add_argument("--host", default=host, help=f"default: ${mlflow_store.UI_URL_ENV}'s host, else 127.0.0.1")
    parser.add_argument("--port", type=int, default=port, help=f"default: ${mlflow_store.UI_URL_ENV}'s port, else 5000")
    parser.add_argument("--no-serve", action="store_true", help="print the URL only")
    args = parser.parse_args(argv)
    uri = mlflow_store.resolve_uri()
    base = mlflow_store.ui_base(uri, args.host, args.port)
    try:
        url = latest_sweep_url(uri, base)
    except Exception as exc:  # an empty or unreadable store still gets a UI
        url = None
        print(f"(could not read {uri}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__})", flush=True)
    if url:
        print(f"latest sweep's runs: {url}", flush=True)
    else:
        print(f"no sweep in {uri} yet (`make sweep` makes one); experiments: {base}/#/experiments?{mlflow_store.UI_WORKFLOW_QUERY}", flush=True)
    if args.no_serve or uri.startswith(("http://", "https://")):
        return 0
    mlflow = shutil.which("mlflow", path=os.path.dirname(sys.executable)) or "mlflow"
    os.execv(mlflow, [mlflow, "ui", "--backend-store-uri", uri, "--host", args.host, "--port", str(args.port)])
    return 0  # not reached: the UI server replaced this process


if __name__ == "__main__":
    sys.exit(main())
