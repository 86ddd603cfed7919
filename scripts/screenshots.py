"""Screenshots of the MLflow UI on a sweep's store, for docs/ (run by hand, not by CI).

    make sweep                                   # or any store with a sweep in it
    .venv/bin/python scripts/screenshots.py [--tracking-uri sqlite:///mlflow.db] [--out docs] [--sweep RUN_ID]

Starts `mlflow ui` on a free local port for the store, and takes one headless-Chromium screenshot per view, each
opened by its URL alone (no clicks): the latest sweep's runs table, one job's run page, the compare view of all its
jobs, and the charts of training samples/s and validation cosine of every job. Needs Chromium (Debian:
`apt-get install -y chromium`; or --chromium PATH). Chromium's own `--screenshot` does the work: no browser driver.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.parse import quote

from sweeplab.tracking import mlflow_store
from sweeplab.tracking.ui import latest_sweep_url

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
    "--hide-scrollbars", "--disable-dev-shm-usage",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ui(uri: str, port: int) -> subprocess.Popen:
    mlflow = shutil.which("mlflow", path=os.path.dirname(sys.executable)) or "mlflow"
    server = subprocess.Popen(
        [mlflow, "ui", "--backend-store-uri", uri, "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,  # its workers stop with it
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return server
        except OSError:
            time.sleep(0.5)
    stop_ui(server)
    raise SystemExit(f"error: `mlflow ui` did not answer on port {port} within 120 s")


def stop_ui(server: subprocess.Popen) -> None:
    os.killpg(server.pid, signal.SIGTERM)
    server.wait(timeout=30)


def screenshot(chromium: str, url: str, out: Path, size: tuple[int, int], wait_ms: int) -> None:
    """One page, rendered by headless Chromium after `wait_ms` of (virtual) time, in a fresh profile: what a first
    visit shows."""
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}",
             f"--virtual-time-budget={wait_ms}", f"--screenshot={out}", url],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=180,
        )
    print(f"{out}: {url}", flush=True)


def views(uri: str, base: str, experiment_id: str, parent_id: str, jobs) -> dict[str, str]:
    """docs/ file name -> the UI URL that shows it."""
    ml = mlflow_store.UI_WORKFLOW_QUERY
    run_ids = json.dumps([r.info.run_id for r in jobs])
    experiments = json.dumps([experiment_id])
    best = max(jobs, key=lambda r: r.data.metrics.get("val/cos", float("-inf")))

    def metric_page(key: str, x_axis: str) -> str:
        metric = quote(json.dumps(key))
        return (f"{base}/#/metric?runs={run_ids}&metric={metric}&experiments={experiments}"
                f"&plot_metric_keys={quote(json.dumps([key]))}&plot_layout={{}}&x_axis={x_axis}&y_axis_scale=linear"
                f"&line_smoothness=1&show_point=true&deselected_curves=[]&last_linear_y_axis_range=[]&{ml}")

    return {
        "ui-runs.png": latest_sweep_url(uri, base) if parent_id == mlflow_store.latest_sweep(uri) else mlflow_store.runs_url(
            base, experiment_id, f"tags.mlflow.parentRunId = '{parent_id}'", order_by_metric="objective"
        ),
        "ui-run.png": mlflow_store.run_url(base, experiment_id, best.info.run_id),
        "ui-compare.png": f"{base}/#/compare-runs?runs={run_ids}&experiments={experiments}&{ml}",
        "ui-samples-per-sec.png": metric_page("train/samples_per_sec", "step"),
        "ui-val-cos.png": metric_page("val/cos", "relative"),
        "ui-report.png": f"{base}/#/experiments/{experiment_id}/runs/{parent_id}/artifacts/report/report.md?{ml}",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db")
    parser.add_argument("--sweep", default=None, help="the sweep's parent run id (default: the latest sweep)")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "docs"))
    parser.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser") or "chromium")
    parser.add_argument("--size", default="1920x1080", help="window size, WIDTHxHEIGHT")
    parser.add_argument("--wait-ms", type=int, default=20000, help="time the page gets to load before the shot")
    args = parser.parse_args(argv)
    uri = mlflow_store.resolve_uri(args.tracking_uri)
    parent_id = args.sweep or mlflow_store.latest_sweep(uri)
    if parent_id is None:
        print(f"error: no sweep in {uri}; run `make sweep` first", file=sys.stderr)
        return 2
    jobs = [r for r in mlflow_store.sweep_jobs(uri, parent_id) if r.info.status == "FINISHED"]
    if not jobs:
        print(f"error: sweep {parent_id} has no finished job", file=sys.stderr)
        return 2
    experiment_id = jobs[0].info.experiment_id
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    width, height = (int(v) for v in args.size.split("x"))
    port = free_port()
    server = start_ui(uri, port)
    try:
        for name, url in views(uri, f"http://127.0.0.1:{port}", experiment_id, parent_id, jobs).items():
            screenshot(args.chromium, url, out / name, (width, height), args.wait_ms)
    finally:
        stop_ui(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
