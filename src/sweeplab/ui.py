"""`make ui`: print where the latest sweep's runs are in the MLflow UI, then serve the UI for the local store.

    python -m sweeplab.ui [--sweep RUN_ID | FOLDER | SWEEP_ID] [--host 127.0.0.1] [--port 5000] [--no-serve]

The address: --host/--port, else $SWEEPLAB_UI_URL (e.g. http://127.0.0.1:5001), which the jobs' closing lines read
too, so the link each job prints opens here; else 127.0.0.1:5000.

The printed line names the sweep (its sweep id and run id) and its URL opens the sweep's comparison: the latest
finished sweep's (its run FINISHED: a later sweep that failed, was stopped or still runs is not the latest), or the
one --sweep names by its run id, its folder (multirun/<date>/<time>) or its sweep id (<date>/<time>); for a replicated sweep the saved view of its configuration runs (one
row per configuration with its figures and intervals, by verdict group, then label: sweeplab.report.saved_view, under
the MLflow sweeplab pins; a filter-and-sort address under another), for a sweep without replicates its jobs, in
MLflow's "machine learning" view (MLflow 3.17 opens experiments in its GenAI view unless told otherwise). With an http(s)
tracking URI the UI is the tracking server's own: only the URL is printed.

Before any server starts, what cannot work is refused in one `error:` line (exit status 2): a port outside 1-65535,
a host that is no host name or address (or does not resolve), $SWEEPLAB_UI_URL that is no `http://host:port`
address, a port another program listens on, a store in a folder that does not exist (the server would create an
empty store there) or a file that is no SQLite database. The server is started next, and the latest sweep's address
found while it starts; the address is printed the moment the server answers `GET /health` with the token this
command gave it (a line says it is starting meanwhile: on a busy 2-core machine that took over a minute): so the
address works when it appears, and a server of another program on the port is never taken for this one. The
server's own log lines go to a file (named on the starting line), not to the terminal. Ctrl-C, SIGTERM or SIGHUP at
any moment, starting included, stop the server's whole process group: nothing is left serving. Its size
fits the machine: one worker per two cores (1 to 4), and none of MLflow's job runner and consumers (GenAI jobs:
judges, prompt optimisation; nothing sweeplab uses) unless MLFLOW_SERVER_ENABLE_JOB_EXECUTION says otherwise.

The server is `mlflow server --app-name sweeplab` (MLflow's server plugin, sweeplab.tracking.ui_server): MLflow's own
app, whose index page makes the training mode the browser's default, stored as if the user had set the sidebar's
switch to "Model training", only where the browser holds no choice (a user who picked GenAI keeps it). So MLflow's
own links, which drop the address's `workflowType` (a run in the table, a run's parent), open training pages too.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib.metadata
import ipaddress
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from sweeplab.core import channels, cli, orphans
from sweeplab.core.errors import UserError, report_user_error
from sweeplab.report.ui_links import spread_url, sweep_url
from sweeplab.tracking import mlflow_store

APP_NAME = "sweeplab"  # pyproject.toml's entry point in group "mlflow.app": sweeplab.tracking.ui_server:create_app
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def main(argv: list[str] | None = None) -> int:
    parser = cli.ArgumentParser(prog="python -m sweeplab.ui", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default=None, help=f"default: ${mlflow_store.UI_URL_ENV}'s host, else 127.0.0.1")
    parser.add_argument("--port", type=port_number, default=None,
                        help=f"default: ${mlflow_store.UI_URL_ENV}'s port, else 5000")
    parser.add_argument("--no-serve", action="store_true", help="print the URL only")
    parser.add_argument("--sweep", default=None,
                        help="a sweep's run id, folder (multirun/<date>/<time>) or sweep id (default: the latest "
                             "finished sweep)")
    args = parser.parse_args(argv)
    uri = mlflow_store.resolve_uri()
    serving = not args.no_serve and not uri.startswith(("http://", "https://"))
    try:
        host, port = mlflow_store.ui_address()  # a bad $SWEEPLAB_UI_URL is refused here, not ignored
        host, port = check_host(args.host or host), args.port or port
        mlflow_store.check_sqlite_file(uri)  # the server would start, then fail on every request with a traceback
        if serving:
            check_store_folder(uri)
            check_port_free(host, port)
        parent_id = None
        if args.sweep is not None:  # a sweep named that the store lacks: one line, before any server
            mlflow_store.open_existing_store(uri, writes=False)
            parent_id = mlflow_store.sweep_named(uri, args.sweep)
    except UserError as exc:
        return report_user_error(exc)
    base = mlflow_store.ui_base(uri, host, port)
    if not serving:
        print(sweep_line(uri, base, find_url(uri, base, parent_id)), flush=True)
        return 0
    return serve(uri, host, port, base, parent_id)


def port_number(text: str) -> int:
    """--port's type: a TCP port, 1 to 65535 (argparse says the rest in one line)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (1 to 65535)") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number (1 to 65535)")
    return port


def check_host(host: str) -> str:
    """`host` when it is an IP address, or a host name that resolves; else one UserError line."""
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(host)
        return host
    if not host or len(host) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in host.rstrip(".").split(".")):
        raise UserError(f"--host {host!r}: not a host name or an IP address (e.g. 127.0.0.1, localhost)")
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise UserError(f"--host {host!r}: does not resolve ({getattr(exc, 'strerror', None) or exc})") from None
    return host


def check_store_folder(uri: str) -> None:
    """A sqlite store's folder must exist: the server would otherwise create an empty store wherever a path
    points, a mistyped one included."""
    path = mlflow_store.sqlite_path(uri)
    if path is not None and not path.parent.is_dir():
        raise UserError(f"no MLflow store at {uri}: the folder {path.parent} does not exist (a mistyped path?); "
                        "point MLFLOW_TRACKING_URI at an existing store, or create the folder for a new one")


def check_port_free(host: str, port: int) -> None:
    """Bind (host, port) as the server will (SO_REUSEADDR, as uvicorn does: a port in TIME_WAIT is free): one
    UserError line when another program listens there, or the host is not this machine's."""
    try:
        family, kind, protocol, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except OSError as exc:
        raise UserError(f"--host {host!r}: does not resolve ({getattr(exc, 'strerror', None) or exc})") from None
    with socket.socket(family, kind, protocol) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UserError(f"port {port} on {host} is taken by another program (another `make ui`, an mlflow "
                                "server?); pick a free one with --port") from None
            if exc.errno == errno.EADDRNOTAVAIL:
                raise UserError(f"--host {host}: not an address of this machine") from None
            raise UserError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None


class _Stopped(BaseException):
    """Ctrl-C, SIGTERM or SIGHUP (a BaseException: no `except Exception` on the way holds it up)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class _StopSignals:
    """While installed, a stop signal raises _Stopped, except inside `held()`, where it waits until the block ends
    (the server's Popen: its handle must reach the caller, or the server would be left behind)."""

    def __init__(self):
        self.holding = False
        self.pending: int | None = None
        self.previous: dict[int, object] = {}

    def _handler(self, signum, frame):
        if self.holding:
            self.pending = self.pending or signum
            return
        raise _Stopped(signum)

    def __enter__(self):
        for number in STOP_SIGNALS:
            self.previous[number] = signal.signal(number, self._handler)
        return self

    def __exit__(self, *exc):
        for number, handler in self.previous.items():
            signal.signal(number, handler)
        return False

    @contextlib.contextmanager
    def held(self, deliver: bool = True):
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
            if deliver and self.pending is not None:
                raise _Stopped(self.pending)


def serve(uri: str, host: str, port: int, base: str, parent_id: str | None = None) -> int:
    """Start the server, find the sweep's address (parent_id's, else the latest finished sweep's) meanwhile, print it once the server answers, then serve
    until stopped; the server's process group is stopped on every way out."""
    log_path = Path(tempfile.gettempdir()) / f"sweeplab-ui-{port}.log"
    token = secrets.token_hex(16)
    server, answered = None, False
    with _StopSignals() as stops:
        try:
            if mlflow_store.sqlite_path(uri) is not None and not mlflow_store.sqlite_path(uri).exists():
                mlflow_store.create_store(uri)  # its schema, made once, before the server and the look-up open it
            with open(log_path, "wb") as log, stops.held():
                server = start_server(uri, host, port, output=log.fileno(), token=token)
            found: dict[str, tuple[str, str, str | None] | None] = {}
            looking = threading.Thread(target=lambda: found.update(url=find_url(uri, base, parent_id)), daemon=True)
            looking.start()
            print(f"starting the MLflow UI on {base} (its log: {log_path}; the address follows once it answers)...",
                  flush=True)
            if not wait_until_answering(server, base, token=token, log_path=log_path):
                return 1
            answered = True
            if "url" not in found:  # the look-up is slower than the server: the address now, the sweep's after
                print(f"the MLflow UI: {base}/#/experiments?{mlflow_store.UI_WORKFLOW_QUERY} (the latest sweep's "
                      "address follows)", flush=True)
                looking.join()
            print(sweep_line(uri, base, found.get("url")), flush=True)
            if not app_installed():
                print(f"(sweeplab's MLflow app {APP_NAME!r} is not installed in {sys.prefix}: MLflow's own links "
                      "open in its GenAI mode until `make install` registers it)", flush=True)
            return serve_until_stopped(server)
        except _Stopped as stop:
            return 0 if answered else 128 + stop.signum  # stopping a served UI is its normal end
        finally:
            if server is not None:
                with stops.held(deliver=False):  # a second Ctrl-C while it stops does not leave it half stopped
                    _stop(server)


def find_url(uri: str, base: str, parent_id: str | None = None) -> tuple[str, str, str | None] | None:
    """(the sweep's name, its address, its spread view's address or None): parent_id's, else the latest finished
    sweep's; None (with a line) for an empty or unreadable store: it still gets a UI."""
    from sweeplab.core.records import SweepRun

    try:
        which = "sweep"
        if parent_id is None:
            parent_id, which = mlflow_store.latest_sweep(uri), "the latest finished sweep"
        if parent_id is None:
            return None
        parent = mlflow_store.read_run(uri, parent_id, "sweep")
        if which != "sweep" and parent.status != "FINISHED":
            which = f"the latest sweep ({parent.status}: none finished)"
        name = SweepRun.from_run(parent).sweep_id or parent.name
        return f"{which} {name} (run {parent_id})", sweep_url(uri, base, parent_id), spread_url(uri, base, parent_id)
    except Exception as exc:
        print(f"(could not read {uri}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__})", flush=True)
        return None


def sweep_line(uri: str, base: str, found: tuple[str, str, str | None] | None) -> str:
    if found:
        name, url, spread = found
        return f"{name}: {url}" + (f"\n  every replicate's curve (the spread): {spread}" if spread else "")
    return (f"no sweep in {uri} yet (`make sweep` makes one); experiments: "
            f"{base}/#/experiments?{mlflow_store.UI_WORKFLOW_QUERY}")


def server_workers(cores: int | None = None) -> int:
    """Request workers for this machine: one per two cores, 1 to 4 (MLflow's default is 4 on any machine)."""
    cores = cores or os.cpu_count() or 1
    return max(1, min(4, cores // 2))


def start_server(uri: str, host: str, port: int, output: int | None = None, token: str = "") -> subprocess.Popen:
    """`mlflow server --app-name sweeplab` (sweeplab.tracking.ui_server: the training mode as the browser's default;
    `token` as /health's channels.UI_TOKEN_HEADER) for the local store, sized for this machine, in its own process
    group (stopped as one). output: where the server's log goes (this terminal when None; a file, DEVNULL)."""
    mlflow = shutil.which("mlflow", path=os.path.dirname(sys.executable)) or "mlflow"
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ, channels.UI_TOKEN_ENV: token}
    command = [mlflow, "server", "--backend-store-uri", uri, "--host", host, "--port", str(port),
               "--workers", str(server_workers())]
    if app_installed():
        command += ["--app-name", APP_NAME]
    server = subprocess.Popen(command, env=env, stdout=output, stderr=output, start_new_session=True)
    orphans.reap_group_with_this_process(server.pid)  # a kill -9 of this process stops the server's group too
    return server


def app_installed() -> bool:
    """Whether the installed sweeplab declares its MLflow app (an install older than the entry point does not)."""
    return bool(importlib.metadata.entry_points(group="mlflow.app", name=APP_NAME))


def wait_until_answering(server: subprocess.Popen, base: str, timeout_s: float = 600.0, say_every_s: float = 30.0,
                         token: str = "", log_path: Path | None = None) -> bool:
    """Poll `GET /health` until it answers 200 (with `token` as its channels.UI_TOKEN_HEADER where sweeplab's app
    serves: the server started here, not another program on the port); a line every `say_every_s` while it does
    not. False (and one line; the server stopped) when the server exited, another answered or none in time."""
    started = said = time.monotonic()
    port = base.rsplit(":", 1)[-1]
    checked = bool(token) and app_installed()  # without sweeplab's app, /health carries no token
    while time.monotonic() - started < timeout_s:
        if server.poll() is not None:
            print(f"error: the MLflow UI did not start (mlflow server exited with status {server.returncode}"
                  f"{_last_log_line(log_path)})", file=sys.stderr, flush=True)
            return False
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as response:
                answered = response.headers.get(channels.UI_TOKEN_HEADER)
                if response.status == 200 and (not checked or answered == token):
                    return True
                if response.status == 200:
                    print(f"error: port {port} answers, but not from the server this command started: another "
                          "program holds it; pick a free one with --port", file=sys.stderr, flush=True)
                    _stop(server)
                    return False
        except OSError:
            pass
        if time.monotonic() - said >= say_every_s:
            said = time.monotonic()
            print(f"still starting ({said - started:.0f} s)...", flush=True)
        time.sleep(0.2)
    print(f"error: the MLflow UI did not answer on {base}/health within {timeout_s:.0f} s", file=sys.stderr,
          flush=True)
    _stop(server)
    return False


def _last_log_line(log_path: Path | None) -> str:
    """`: <the log's last line>; its log: <path>`, or "" without a log."""
    if log_path is None:
        return ""
    with contextlib.suppress(OSError):
        lines = [ln.strip() for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
        return f": {lines[-1][:200]}; its log: {log_path}" if lines else f"; its log: {log_path}"
    return ""


def serve_until_stopped(server: subprocess.Popen) -> int:
    """Wait on the server (a stop signal ends the wait: sweeplab.ui.serve stops the group)."""
    return server.wait()


def _stop(server: subprocess.Popen) -> None:
    """SIGTERM to the server's whole process group (its workers too), SIGKILL after 20 s."""
    if server.poll() is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(server.pid, signal.SIGKILL)  # workers its exit left behind
        return
    try:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=5)


if __name__ == "__main__":
    sys.exit(main())
