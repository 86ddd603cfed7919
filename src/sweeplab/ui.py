"""`make ui`: print where the latest sweep's runs are in the MLflow UI, then serve the UI for the local store.

    python -m sweeplab.ui [--host 127.0.0.1] [--port 5000] [--no-serve]

The address: --host/--port, else $SWEEPLAB_UI_URL (e.g. http://127.0.0.1:5001), which the jobs' closing lines read
too, so the link each job prints opens here; else 127.0.0.1:5000.

The printed URL opens the sweep's comparison: for a replicated sweep the saved view of its configuration runs (one
row per configuration with its figures and intervals, by verdict group, then label: sweeplab.report.saved_view, under
the MLflow sweeplab pins; a filter-and-sort address under another), for a sweep without replicates its jobs, in
MLflow's "machine learning" view (MLflow 3.17 opens experiments in its GenAI view unless told otherwise). With an http(s)
tracking URI the UI is the tracking server's own: only the URL is printed.

The server is started first and the address printed only once it answers `GET /health` (a line says it is starting
meanwhile: on a busy 2-core machine that took over a minute), so the address works the moment it appears. Its size
fits the machine: one worker per two cores (1 to 4), and none of MLflow's job runner and consumers (GenAI jobs:
judges, prompt optimisation; nothing sweeplab uses) unless MLFLOW_SERVER_ENABLE_JOB_EXECUTION says otherwise.

The server is `mlflow server --app-name sweeplab` (MLflow's server plugin, sweeplab.tracking.ui_server): MLflow's own
app, whose index page makes the training mode the browser's default, stored as if the user had set the sidebar's
switch to "Model training", only where the browser holds no choice (a user who picked GenAI keeps it). So MLflow's
own links, which drop the address's `workflowType` (a run in the table, a run's parent), open training pages too.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

from sweeplab.core import cli
from sweeplab.core.errors import UserError, report_user_error
from sweeplab.report.ui_links import latest_sweep_url
from sweeplab.tracking import mlflow_store

APP_NAME = "sweeplab"  # pyproject.toml's entry point in group "mlflow.app": sweeplab.tracking.ui_server:create_app

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
    serving = not args.no_serve and not uri.startswith(("http://", "https://"))
    server = start_server(uri, args.host, args.port) if serving else None
    if server is not None and not wait_until_answering(server, base):
        return 1
    try:
        url = latest_sweep_url(uri, base)
    except Exception as exc:  # an empty or unreadable store still gets a UI
        url = None
        print(f"(could not read {uri}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__})", flush=True)
    if url:
        print(f"latest sweep's runs: {url}", flush=True)
    else:
        print(f"no sweep in {uri} yet (`make sweep` makes one); experiments: {base}/#/experiments?{mlflow_store.UI_WORKFLOW_QUERY}", flush=True)
    if server is None:
        return 0
    if not app_installed():
        print(f"(sweeplab's MLflow app {APP_NAME!r} is not installed in {sys.prefix}: MLflow's own links open in its "
              "GenAI mode until `make install` registers it)", flush=True)
    return serve_until_stopped(server)


def server_workers(cores: int | None = None) -> int:
    """Request workers for this machine: one per two cores, 1 to 4 (MLflow's default is 4 on any machine)."""
    cores = cores or os.cpu_count() or 1
    return max(1, min(4, cores // 2))


def start_server(uri: str, host: str, port: int, output: int | None = None) -> subprocess.Popen:
    """`mlflow server --app-name sweeplab` (sweeplab.tracking.ui_server: the training mode as the browser's default)
    for the local store, sized for this machine, in its own process group (stopped as one). output: where the
    server's log goes (this terminal when None; e.g. subprocess.DEVNULL)."""
    mlflow = shutil.which("mlflow", path=os.path.dirname(sys.executable)) or "mlflow"
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}
    command = [mlflow, "server", "--backend-store-uri", uri, "--host", host, "--port", str(port),
               "--workers", str(server_workers())]
    if app_installed():
        command += ["--app-name", APP_NAME]
    return subprocess.Popen(command, env=env, stdout=output, stderr=output, start_new_session=True)


def app_installed() -> bool:
    """Whether the installed sweeplab declares its MLflow app (an install older than the entry point does not)."""
    return bool(importlib.metadata.entry_points(group="mlflow.app", name=APP_NAME))


def wait_until_answering(server: subprocess.Popen, base: str, timeout_s: float = 600.0,
                         say_every_s: float = 30.0) -> bool:
    """Poll `GET /health` until it answers 200; a line first and every `say_every_s` while it does not. False (and
    one line) when the server exited or never answered."""
    started = time.monotonic()
    print(f"starting the MLflow UI on {base} (the address follows once it answers)...", flush=True)
    said = started
    while time.monotonic() - started < timeout_s:
        if server.poll() is not None:
            print(f"the MLflow UI did not start (mlflow server exited with status {server.returncode}: is port "
                  f"{base.rsplit(':', 1)[-1]} taken? --port picks another)", file=sys.stderr, flush=True)
            return False
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as response:
                if response.status == 200:
                    return True
        except OSError:
            pass
        if time.monotonic() - said >= say_every_s:
            said = time.monotonic()
            print(f"still starting ({said - started:.0f} s)...", flush=True)
        time.sleep(0.2)
    print(f"the MLflow UI did not answer on {base}/health within {timeout_s:.0f} s", file=sys.stderr, flush=True)
    _stop(server)
    return False


def serve_until_stopped(server: subprocess.Popen) -> int:
    """Wait on the server; Ctrl-C or SIGTERM stops its whole process group (workers included)."""
    signal.signal(signal.SIGTERM, lambda *_: (_stop(server), sys.exit(0)))
    try:
        return server.wait()
    except KeyboardInterrupt:
        _stop(server)
        return 0


def _stop(server: subprocess.Popen) -> None:
    if server.poll() is not None:
        return
    try:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
