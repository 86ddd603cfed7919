"""`make ui-check`: the address `make ui` prints, opened in headless Chromium at 1600x1000, shows the comparison.

    .venv/bin/python scripts/ui_check.py [--tracking-uri URI] [--chromium PATH] [--chromedriver PATH]

Without --tracking-uri it runs a smoke sweep of the default study (4 configurations x 2 replicates, debug=smoke)
into a temporary store; with it, it checks that store's latest sweep. It serves the store with `mlflow ui` on a free
local port, takes the address exactly as `make ui` prints it (sweeplab.report.ui_links.latest_sweep_url), and checks in
the rendered page that every configuration's row shows its name, its samples/s and its final validation metric
inside the 1600x1000 viewport, unscrolled and uncovered. Then the sweep's `report.html`, opened from disk and in
MLflow's artifact view of the sweep run, must show its verdict (`#verdict`) and its table (`#configurations`)
without scrolling. Any failure: one `error:` line, exit status 1.

Needs Debian's Chromium and its driver (`apt-get install chromium chromium-driver`), driven through Selenium
(W3C WebDriver: the driver comes with the browser, so their versions match); installs nothing itself.
"""

from __future__ import annotations

import argparse
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

ROOT = Path(__file__).resolve().parents[1]
VIEWPORT = (1600, 1000)
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
APT_LINE = "apt-get install chromium chromium-driver"
# a cell counts as seen when the point at its centre belongs to it: inside the viewport, not scrolled away, not
# covered by another panel
SEEN_JS = """
const [el] = arguments; const r = el.getBoundingClientRect();
if (r.width === 0 || r.height === 0) return false;
const x = r.left + Math.min(r.width / 2, 20), y = r.top + r.height / 2;
if (x < 0 || y < 0 || x >= window.innerWidth || y >= window.innerHeight) return false;
const hit = document.elementFromPoint(x, y);
return hit !== null && (el === hit || el.contains(hit));
"""


class CheckFailed(Exception):
    """One failed check: its message is the `error:` line."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ui(uri: str, port: int) -> subprocess.Popen:
    """`mlflow ui` for the store on 127.0.0.1:port, once it answers."""
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
    raise CheckFailed(f"`mlflow ui` did not answer on port {port} within 120 s")


def stop_ui(server: subprocess.Popen) -> None:
    os.killpg(server.pid, signal.SIGTERM)
    server.wait(timeout=30)


def check_browser(chromium: str, chromedriver: str) -> None:
    for path in (chromium, chromedriver):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise CheckFailed(f"{path} not found: this check needs Debian's Chromium and its driver ({APT_LINE})")
    try:
        import selenium  # noqa: F401
    except ImportError:
        raise CheckFailed("selenium is not installed: `make install` (sweeplab's dev extras) installs it") from None


def browser(chromium: str, chromedriver: str):
    """Headless Chromium in a fresh profile (a first visit) with a 1600x1000 viewport."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
                 "--no-first-run", "--disable-background-networking", "--allow-file-access-from-files",
                 f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": VIEWPORT[0], "height": VIEWPORT[1], "deviceScaleFactor": 1, "mobile": False})
    return driver


def wait_for(driver, condition, timeout_s: float, what: str):
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, timeout_s, poll_frequency=0.5).until(lambda d: condition(d))
    except TimeoutException:
        raise CheckFailed(f"{what}: not there after {timeout_s:.0f} s ({driver.current_url})") from None


def smoke_sweep(workdir: Path) -> str:
    """The default study as a smoke sweep (4 configurations x 2 replicates) into a store under workdir; its URI."""
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    command = [sys.executable, "-m", "sweeplab.train", "-m", "sweep=default", "backend=cpu", "debug=smoke",
               "replicates=2", f"hydra.sweep.dir={workdir / 'sweep'}"]
    print(f"smoke sweep: {' '.join(command[1:])}", flush=True)
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    result = subprocess.run(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise CheckFailed(f"the smoke sweep failed (exit {result.returncode}): {last}")
    return uri


def configuration_rows(uri: str, parent_id: str) -> list[dict[str, str]]:
    """What each configuration's row must show: its name, samples/s and final validation metric, as the
    configuration run holds them."""
    from sweeplab.report import config_runs

    rows = []
    for run in config_runs.configuration_runs(uri, parent_id):
        metric = run.tags.get("objective", "")
        names = config_runs.figure_tag_names(metric)
        rows.append({"name": run.name, "samples/s": run.tags.get(names[0], ""),
                     f"final {metric}": run.tags.get(names[1], "")})
    return rows


def check_runs_table(driver, url: str, rows: list[dict[str, str]]) -> None:
    """Every configuration's name, samples/s and validation metric seen in the table, unscrolled."""
    if not rows:
        raise CheckFailed("the sweep has no configuration runs: nothing to compare")
    driver.get(url)

    def row_of(d, name):
        for link in d.find_elements("css selector", ".ag-row a"):
            if link.text.strip() == name:
                return link
        return None

    wait_for(driver, lambda d: all(row_of(d, r["name"]) is not None for r in rows), 90, "the configurations' rows")
    for row in rows:
        link = row_of(driver, row["name"])
        if not driver.execute_script(SEEN_JS, link):
            raise CheckFailed(f"configuration {row['name']!r}: its name is outside the 1600x1000 viewport")
        index = driver.execute_script("return arguments[0].closest('.ag-row').getAttribute('row-index');", link)
        for column, expected in row.items():
            if column == "name":
                continue
            if not expected:
                raise CheckFailed(f"configuration {row['name']!r}: its run has no {column!r} tag")
            cells = driver.find_elements(
                "css selector", f".ag-center-cols-container .ag-row[row-index='{index}'] [col-id='tags.`{column}`']")
            if not cells or cells[0].text.strip() != expected:
                shown = cells[0].text.strip() if cells else "no such cell"
                raise CheckFailed(f"configuration {row['name']!r}: {column} should read {expected!r}, the page "
                                  f"shows {shown!r} ({url})")
            if not driver.execute_script(SEEN_JS, cells[0]):
                raise CheckFailed(f"configuration {row['name']!r}: its {column} is outside the 1600x1000 viewport")
        print(f"ok: {row['name']}: " + ", ".join(f"{k} {v}" for k, v in row.items() if k != "name"), flush=True)


def check_report(driver, where: str, frame_css: str | None = None) -> None:
    """`#verdict` and `#configurations` seen without scrolling (inside the artifact view's frame when frame_css)."""
    offset = (0.0, 0.0)
    if frame_css is not None:
        frame = wait_for(driver, lambda d: d.find_elements("css selector", frame_css), 60, f"{where}: the report's frame")[0]
        if not driver.execute_script(SEEN_JS, frame):
            raise CheckFailed(f"{where}: the report's frame is outside the viewport")
        rect = frame.rect
        offset = (rect["x"], rect["y"])
        driver.switch_to.frame(frame)
    try:
        for element_id in ("verdict", "configurations"):
            found = wait_for(driver, lambda d, i=element_id: d.find_elements("id", i), 30, f"{where}: #{element_id}")[0]
            left, top, right, bottom, width, height = driver.execute_script(
                "const r = arguments[0].getBoundingClientRect(); "
                "return [r.left, r.top, r.right, r.bottom, window.innerWidth, window.innerHeight];", found)
            # whole: every column and row inside the page's (or the frame's) window and the 1600x1000 screen
            inside = left >= 0 and top >= 0 and right <= width + 1 and bottom <= height + 1
            if not inside or bottom + offset[1] > VIEWPORT[1] + 1 or not driver.execute_script(SEEN_JS, found):
                raise CheckFailed(f"{where}: #{element_id} is not wholly visible without scrolling at 1600x1000 (its box "
                                  f"{left:.0f},{top + offset[1]:.0f} to {right:.0f},{bottom + offset[1]:.0f} px; the "
                                  f"window {width}x{height})")
        print(f"ok: {where}: #verdict and #configurations wholly visible without scrolling", flush=True)
    finally:
        driver.switch_to.default_content()


def run_checks(uri: str, chromium: str, chromedriver: str) -> None:
    from sweeplab.report import ui_links
    from sweeplab.tracking import mlflow_store

    parent_id = mlflow_store.latest_sweep(uri)
    if parent_id is None:
        raise CheckFailed(f"no sweep in {uri}")
    parent = mlflow_store.client(uri).get_run(parent_id)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    url = ui_links.latest_sweep_url(uri, base)  # what `make ui --port PORT` prints
    print(f"make ui's address: {url}", flush=True)
    rows = configuration_rows(uri, parent_id)
    server = start_ui(uri, port)
    driver = browser(chromium, chromedriver)
    try:
        check_runs_table(driver, url, rows)
        report = Path(parent.data.tags.get("sweep_dir", "")) / "report.html"
        if not report.is_file():
            raise CheckFailed(f"{report} not found: the sweep's report does not write report.html")
        driver.get(report.as_uri())
        check_report(driver, f"report.html from disk ({report})")
        driver.get(f"{base}/#/experiments/{parent.info.experiment_id}/runs/{parent_id}/artifacts/report/report.html"
                   f"?{mlflow_store.UI_WORKFLOW_QUERY}")
        check_report(driver, "report.html in MLflow's artifact view", "iframe")
    finally:
        driver.quit()
        stop_ui(server)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tracking-uri", default=None, help="check this store's latest sweep (default: a new smoke sweep)")
    parser.add_argument("--chromium", default=CHROMIUM)
    parser.add_argument("--chromedriver", default=CHROMEDRIVER)
    args = parser.parse_args(argv)
    try:
        check_browser(args.chromium, args.chromedriver)
        if args.tracking_uri is not None:
            run_checks(args.tracking_uri, args.chromium, args.chromedriver)
        else:
            with tempfile.TemporaryDirectory(prefix="sweeplab-ui-check-") as workdir:
                run_checks(smoke_sweep(Path(workdir)), args.chromium, args.chromedriver)
    except CheckFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print("ui-check: passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
