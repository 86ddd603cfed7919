"""`make ui`: print where the latest sweep's runs are in the MLflow UI, then serve the UI for the local store.

    python -m sweeplab.ui [--host 127.0.0.1] [--port 5000] [--no-serve]

The address: --host/--port, else $SWEEPLAB_UI_URL (e.g. http://127.0.0.1:5001), which the jobs' closing lines read
too, so the link each job prints opens here; else 127.0.0.1:5000.

The printed URL opens the sweep's comparison: for a replicated sweep the saved view of its configuration runs (one
row per configuration with its figures and intervals, fastest to the target first: sweeplab.report.saved_view, under
the MLflow sweeplab pins; a filter-and-sort address under another), for a sweep without replicates its jobs, in
MLflow's "machine learning" view (MLflow 3.17 opens experiments in its GenAI view unless told otherwise). With an http(s)
tracking URI the UI is the tracking server's own: only the URL is printed.
"""

from __future__ import annotations

import os
import shutil
import sys

from sweeplab.core import cli
from sweeplab.core.errors import UserError, report_user_error
from sweeplab.report.ui_links import latest_sweep_url
from sweeplab.tracking import mlflow_store


def main(argv: list[str] | None = None) -> int:
    parser = cli.ArgumentParser(prog="python -m sweeplab.ui", description=__doc__.split("\n\n")[0])
    host, port = mlflow_store.ui_address()
    parser.add_argument("--host", default=host, help=f"default: ${mlflow_store.UI_URL_ENV}'s host, else 127.0.0.1")
    parser.add_argument("--port", type=int, default=port, help=f"default: ${mlflow_store.UI_URL_ENV}'s port, else 5000")
    parser.add_argument("--no-serve", action="store_true", help="print the URL only")
    args = parser.parse_args(argv)
    uri = mlflow_store.resolve_uri()
    try:
        mlflow_store.check_sqlite_file(uri)  # the server would start, then fail on every request with a traceback
    except UserError as exc:
        return report_user_error(exc)
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
