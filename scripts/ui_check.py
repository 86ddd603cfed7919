"""`make ui-check`: the address `make ui` prints, opened in headless Chromium at 1280x800 and 1600x1000, answers.

    .venv/bin/python scripts/ui_check.py [--tracking-uri URI | --smoke-sweep] [--chromium PATH] [--chromedriver PATH]

First, in a second: every sweeplab name this script reads exists (check_names: a rename fails here, naming it).
Without --tracking-uri it checks a small recorded study in a temporary store: the default study's four
configurations (batch size 4/16 x α 1.0/0.7) at debug=smoke, 2 replicates each, on a loaded 2-CPU host, recorded
through sweeplab's store as its jobs record one and reported by `python -m sweeplab.report` (recorded_study: a
study with every caveat sweeplab.study.caveats knows but stopped jobs; about 4 minutes in all on the busy 2-core
development machine at load 9-14, browser included). --smoke-sweep runs a real smoke sweep of that study on a host kept loaded
meanwhile instead (minutes per job there); --tracking-uri checks that store's latest sweep. It serves the store as `make ui` does
(sweeplab.ui.start_server: `mlflow server --app-name sweeplab`) on a free local port, takes the address exactly as
`make ui` prints it (sweeplab.report.ui_links.latest_sweep_url), and, at each size in a fresh profile (MLflow's
shared-view banner in its first-visit state: open; its Assistant panel closed, as sweeplab's server makes a first
visit: sweeplab.tracking.ui_server):

- the table: every configuration's label, its speedup to target `median (low–high)` (the baseline's naming it the
  baseline), its verdict, the target and the study's caveats (a 2-replicate smoke study: `not an answer: 2
  replicates, smoke`; a loaded host: `loaded host (n/N)`), wholly on screen without scrolling (inside the viewport,
  uncovered, not cut), the rows in the view's order (verdict group, then label in natural order: `bs=4` above
  `bs=16`; a tie is not shown as a ranking); no interval bound beyond 1e6 printed in the table, in the configuration
  runs' metrics, in the sweep's verdict lines or in report.html;
- the training mode: a click on a configuration run in MLflow's table, and from there on its parent run (the sweep),
  MLflow's own links, which drop `workflowType`, and the same two runs at the addresses sweeplab prints
  (`?workflowType=machine_learning`), show no GenAI navigation (Judges, Sessions, Evaluation runs, ...): the
  server's index page stores the training mode as the browser's choice when it holds none
  (sweeplab.tracking.ui_server);
- the chart view: no bar at all (MLflow 3.17 draws bars without intervals), the validation curves and one target
  line (a run of its own draws it), a legend naming every configuration's curve and the target once, the section's
  pointer to report.html wholly shown;
- the spread view (`make ui`'s second address, every replicate): one line per job in its configuration's colour (as
  many colours as configurations, read from the drawn lines) and one target line, a legend naming every job and the
  target once, its section's title wholly shown.

Then (at 1600x1000) the sweep's `report.html`, from disk and in MLflow's artifact view of the sweep run, must show
its verdict (`#verdict`) and its table (`#configurations`) without scrolling, and a browser that chose GenAI (stored
`"genai"`) keeps it: the same click in the table lands in the GenAI mode. Any failure: one `error:` line, exit
status 1.

Needs Debian's Chromium and its driver, driven through Selenium (W3C WebDriver: the driver comes with the browser,
so their versions match); as root it installs them when missing (`apt-get install chromium chromium-driver`, as
`make test-cluster` installs SLURM), otherwise it says how.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VIEWPORTS = ((1280, 800), (1600, 1000))
VIEWPORT = VIEWPORTS[-1]  # the report's checks and the screenshots
# the flags headless Chromium needs on a closed network (no background connections, no first-run pages)
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
         "--hide-scrollbars", "--allow-file-access-from-files")
# MLflow 3.17's navigation in its GenAI mode (none of these is in its training mode's)
GENAI_NAV = ("Judges", "Sessions", "Evaluation runs", "Observability", "Prompts & versions")
# a figure's cell: what a configuration's row must show wholly (tags of its configuration run)
ROW_TAGS = ("speedup to target", "verdict", "target", "caveat")
MAX_BOUND = 1e6  # an interval bound past this is no measurement: `not measured (n = 2)` instead
# `(low–high)` in any text: its two bounds (a ratio's `×`, thousands separators allowed)
INTERVAL = re.compile(r"\(([-+]?[\d.,]+(?:e[-+]?\d+)?)×?\s*[–-]\s*([-+]?[\d.,]+(?:e[-+]?\d+)?)×?", re.IGNORECASE)
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


# an element counts as wholly on screen when its box lies inside the viewport, the points across its middle belong to
# it (nothing covers it), and neither it nor what it holds is cut (text clipped by its box): "" or why not
WHOLE_JS = """
const [el] = arguments; const r = el.getBoundingClientRect();
if (r.width === 0 || r.height === 0) return 'not rendered';
if (r.left < 0 || r.top < 0 || r.right > window.innerWidth + 0.5 || r.bottom > window.innerHeight + 0.5)
  return `outside the ${window.innerWidth}x${window.innerHeight} viewport`
    + ` (box ${Math.round(r.left)},${Math.round(r.top)} to ${Math.round(r.right)},${Math.round(r.bottom)})`;
const y = r.top + r.height / 2;
for (const x of [r.left + 2, r.left + r.width / 2, r.right - 2]) {
  const hit = document.elementFromPoint(x, y);
  if (hit === null || !(el === hit || el.contains(hit) || hit.contains(el)))
    return `covered at ${Math.round(x)},${Math.round(y)} by ${hit ? hit.tagName + '.' + hit.className : 'nothing'}`;
}
for (const e of [el, ...el.querySelectorAll('*')]) {
  if (getComputedStyle(e).overflowX !== 'visible' && e.scrollWidth > e.clientWidth + 1)
    return `cut: ${e.scrollWidth} px of text in ${e.clientWidth} px`;
}
return '';
"""
# visible elements whose own text is one of the given labels
LABELS_SHOWN_JS = """
const [names] = arguments; const found = new Set();
for (const el of document.querySelectorAll('a, span, div, button, li, p')) {
  if (el.children.length) continue;
  const t = el.textContent.trim(); const r = el.getBoundingClientRect();
  if (names.includes(t) && r.width > 0 && r.height > 0) found.add(t);
}
return [...found];
"""


# the chart's lines that hold points, told apart by their path (MLflow draws each series twice: its line and, under
# it, the unsmoothed one)
LINES_JS = """
const paths = new Set();
for (const path of document.querySelectorAll('.js-plotly-plot .scatterlayer .trace path.js-line')) {
  const d = path.getAttribute('d') || '';
  if (d.length > 1) paths.add(d);
}
return paths.size;
"""
# the colour (`rgb(r, g, b)`) of each line that holds points, by its path (as LINES_JS tells them apart)
LINE_COLORS_JS = """
const colors = {};
for (const path of document.querySelectorAll('.js-plotly-plot .scatterlayer .trace path.js-line')) {
  const d = path.getAttribute('d') || '';
  if (d.length > 1) colors[d] = path.style.stroke;
}
return Object.values(colors);
"""
# the texts of the elements that hold only text and end with the given suffix (legend entries of one key)
ENDING_WITH_JS = """
const [suffix] = arguments; const found = [];
for (const el of document.querySelectorAll('span, div, p, li')) {
  if (el.children.length) continue;
  const t = el.textContent.trim(); const r = el.getBoundingClientRect();
  if (t.endsWith(suffix) && r.width > 0 && r.height > 0) found.push(t);
}
return found;
"""


class CheckFailed(Exception):
    """One failed check: its message is the `error:` line."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ui(uri: str, port: int) -> subprocess.Popen:
    """The server `make ui` runs (sweeplab.ui.start_server: `mlflow server --app-name sweeplab`) for the store on
    127.0.0.1:port, once it answers."""
    return wait_for_ui(launch_ui(uri, port), port)


def launch_ui(uri: str, port: int) -> subprocess.Popen:
    """start_ui's server, started and not waited for (it starts while the study is reported)."""
    from sweeplab import ui

    if not ui.app_installed():
        raise CheckFailed(f"sweeplab's MLflow app {ui.APP_NAME!r} is not installed in {sys.prefix} (entry point group "
                          "mlflow.app): `make install` registers it")
    return ui.start_server(uri, "127.0.0.1", port, output=subprocess.DEVNULL)  # its own group: workers stop with it


def wait_for_ui(server: subprocess.Popen, port: int) -> subprocess.Popen:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return server
        except OSError:
            time.sleep(0.5)
    stop_ui(server)
    raise CheckFailed(f"`mlflow server` did not answer on port {port} within 120 s")


def stop_ui(server: subprocess.Popen) -> None:
    """The server's whole process group stopped (once: a second call does nothing)."""
    if server.returncode is not None:
        return
    try:
        os.killpg(server.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    server.wait(timeout=30)


def install_browser(chromium: str, chromedriver: str) -> None:
    """As root, Debian's Chromium and its driver when the default paths lack them (apt-get waits up to 5 minutes
    for another apt's lock); otherwise nothing (check_browser then says how)."""
    wanted = (chromium, chromedriver) == (CHROMIUM, CHROMEDRIVER)
    if not wanted or all(os.path.isfile(p) for p in (chromium, chromedriver)) or os.geteuid() != 0:
        return
    print(f"installing Debian's chromium and chromium-driver (missing from {chromium}, {chromedriver})", flush=True)
    apt = ["apt-get", "-o", "DPkg::Lock::Timeout=300"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [*apt, "install", "-y", "-q", "chromium", "chromium-driver"]
    if subprocess.run(install, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode != 0:
        subprocess.run([*apt, "update", "-q"], env=env, stdout=subprocess.DEVNULL, check=False)
        result = subprocess.run(install, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise CheckFailed(f"`{APT_LINE}` failed (exit {result.returncode}): {last}")


def check_browser(chromium: str, chromedriver: str) -> None:
    for path in (chromium, chromedriver):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise CheckFailed(f"{path} not found: this check needs Debian's Chromium and its driver ({APT_LINE})")
    try:
        import selenium  # noqa: F401
    except ImportError:
        raise CheckFailed("selenium is not installed: `make install` (sweeplab's dev extras) installs it") from None


def browser(chromium: str, chromedriver: str, viewport: tuple[int, int] = VIEWPORT, profile: str | None = None):
    """Headless Chromium in a fresh profile (a first visit: MLflow's panels as a newcomer sees them) with the given
    viewport. profile: the user-data-dir to use (a new temporary one when None; the caller removes it)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    profile = profile or tempfile.mkdtemp(prefix="sweeplab-chromium-")
    for flag in (*FLAGS, f"--user-data-dir={profile}", f"--window-size={viewport[0]},{viewport[1]}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": viewport[0], "height": viewport[1], "deviceScaleFactor": 1, "mobile": False})
    return driver


def wait_for(driver, condition, timeout_s: float, what: str):
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, timeout_s, poll_frequency=0.5).until(lambda d: condition(d))
    except TimeoutException:
        raise CheckFailed(f"{what}: not there after {timeout_s:.0f} s ({driver.current_url})") from None


def sweeplab_names(source: str) -> list[str]:
    """Every sweeplab name this script reads, as a dotted path: the names its functions import from sweeplab
    (`from sweeplab.report import saved_view`) and the attributes it reads of them, however deep
    (`saved_view.SECTION_NAME`, `CONFIGURATION.verdict_order`)."""
    import ast

    tree = ast.parse(source)
    imported: dict[str, str] = {}  # local name -> dotted path
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sweeplab":
            for alias in node.names:
                imported[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    found = set(imported.values())
    for node in ast.walk(tree):
        chain = []
        while isinstance(node, ast.Attribute):
            chain.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id in imported and chain:
            found.add(".".join([imported[node.id], *reversed(chain)]))
    return sorted(found)


def resolve(dotted: str) -> object:
    """The object a dotted sweeplab path names (a module, or an attribute of one, however deep); AttributeError or
    ImportError naming what is missing."""
    import importlib

    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):  # the longest importable module prefix, then attributes
        try:
            found = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            if split == 1:
                raise
            continue
        for attr in parts[split:]:
            found = getattr(found, attr)
        return found
    raise ImportError(dotted)


def check_names() -> None:
    """Before any store or browser: every sweeplab name this script reads exists (a rename fails here, in a second,
    naming it, not after the study is made and the browser started)."""
    missing = []
    for dotted in sweeplab_names(Path(__file__).read_text(encoding="utf-8")):
        try:
            resolve(dotted)
        except (AttributeError, ImportError) as exc:
            missing.append(f"{dotted} ({exc})")
    if missing:
        raise CheckFailed(f"{Path(__file__).name} reads names sweeplab no longer has: {'; '.join(missing)}")
    print(f"ok: the {len(sweeplab_names(Path(__file__).read_text(encoding='utf-8')))} sweeplab names this check "
          "reads exist", flush=True)


# the recorded study: the default study's four configurations (batch size x α) at debug=smoke, 2 replicates each,
# on a loaded 2-CPU host: every caveat sweeplab.study.caveats knows but stopped jobs
RECORDED_CONFIGS = ((4, "1.0"), (4, "0.7"), (16, "1.0"), (16, "0.7"))
RECORDED_REPLICATES = 2
RECORDED_STEPS = 20


def recorded_study(workdir: Path) -> str:
    """A small study as its jobs record one (sweeplab.tracking's store, a run per job under a sweep run, the metrics
    the jobs log); its store's URI. report_study reports it. Seconds, not a sweep's minutes."""
    import random

    from sweeplab.core import channels
    from sweeplab.tracking import mlflow_store

    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    sweep_dir = workdir / "sweep"
    sweep_dir.mkdir()
    experiment = mlflow_store.init_store(uri, "ui-check")
    client = mlflow_store.client(uri)
    parent = client.create_run(experiment, run_name="ui-check", tags={
        "sweeplab.role": "sweep", "sweep_id": "ui-check", "sweep_dir": str(sweep_dir),
        "sweep_overrides": "sweep=default backend=cpu debug=smoke replicates=2 data.batch_size=4,16"}).info.run_id
    (sweep_dir / channels.PARENT_RUN_FILE).write_text(parent)
    rng = random.Random(61)
    for replicate in range(RECORDED_REPLICATES):
        for index, (batch, alpha) in enumerate(RECORDED_CONFIGS):
            tags = {"mlflow.parentRunId": parent, "mlflow.runName": f"bs={batch} α={alpha} rep={replicate}",
                    "family": "textbridge", "backend": "cpu", "device": "cpu", "precision": "32-true",
                    "compile": "off", "config": f"data.batch_size={batch} loss.alpha={alpha}",
                    "config_index": str(index), "replicate": str(replicate), "round": str(replicate), "host": "h",
                    "seed": str(replicate), "objective": "val/cos", "objective_mode": "max", "preset.debug": "smoke",
                    "hydra_job": str(replicate * len(RECORDED_CONFIGS) + index)}
            run = client.create_run(experiment, tags=tags).info.run_id
            mlflow_store.log_params(client, run, {"data.batch_size": batch, "loss.alpha": alpha, "loss.beta": "0.7",
                                                  "model.size": "tiny", "trainer.max_steps": RECORDED_STEPS,
                                                  "trainer.accumulate_grad_batches": 1, "trainer.devices": 1})
            rate = (150 if batch == 4 else 400) * rng.uniform(0.85, 1.15)
            for key, value in {"summary/samples_per_sec": rate, "summary/step_time_s_median": batch / rate,
                               "summary/step_time_spread": 0.05, "summary/batch_shapes": 1.0,
                               "summary/host_cpus": 2.0, "summary/load_avg_start": 4.0, "objective": 0.3}.items():
                client.log_metric(run, key, value)
            for step in range(4, RECORDED_STEPS, 5):
                seen = (step + 1) * batch / (60 + 40 * (alpha == "0.7"))
                client.log_metric(run, "val/cos", 0.35 - 0.25 * 2.718 ** -seen + rng.uniform(-0.005, 0.005),
                                  step=step)
            client.set_terminated(run, "FINISHED")
    client.set_terminated(parent, "FINISHED")
    return uri


def report_study(workdir: Path, uri: str) -> None:
    """recorded_study's study reported by `python -m sweeplab.report --multirun-dir` as the sweep's end reports it:
    its configuration runs, saved view and report.html."""
    sweep_dir = workdir / "sweep"
    report = subprocess.run([sys.executable, "-m", "sweeplab.report", "--multirun-dir", str(sweep_dir),
                             "--tracking-uri", uri], cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    if report.returncode != 0:
        last = (report.stderr.strip().splitlines() or ["no output"])[-1]
        raise CheckFailed(f"the recorded study's report failed (exit {report.returncode}): {last}")
    print(f"recorded study: {len(RECORDED_CONFIGS)} configurations x {RECORDED_REPLICATES} replicates, reported in "
          f"{sweep_dir}", flush=True)


LOADER = "import os; os.nice(19)\nwhile True: pass"  # runnable, so counted in the load, yet yields to all work


def smoke_sweep(workdir: Path) -> str:
    """The default study as a smoke sweep at batch sizes 4 and 16 (4 configurations x 2 replicates) into a store
    under workdir, on a host loaded by idle-priority busy processes (one per CPU); its URI."""
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    command = [sys.executable, "-m", "sweeplab.train", "-m", "sweep=default", "backend=cpu", "debug=smoke",
               "replicates=2", "data.batch_size=4,16", f"hydra.sweep.dir={workdir / 'sweep'}"]
    print(f"smoke sweep on a loaded host: {' '.join(command[1:])}", flush=True)
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    loaders = [subprocess.Popen([sys.executable, "-c", LOADER]) for _ in range(os.cpu_count() or 1)]
    try:
        result = subprocess.run(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)
    finally:
        for loader in loaders:
            loader.kill()
            loader.wait()
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise CheckFailed(f"the smoke sweep failed (exit {result.returncode}): {last}")
    return uri


def configuration_rows(uri: str, parent_id: str) -> list[dict[str, str]]:
    """What each configuration's row must show, in the view's order: its label (the run's name) and its speedup to
    target, verdict and target, as its configuration run holds them."""
    from sweeplab.core.records import ConfigurationRun
    from sweeplab.report import config_runs

    runs = sorted(((run, ConfigurationRun.from_run(run)) for run in config_runs.configuration_runs(uri, parent_id)),
                  key=lambda found: found[1].verdict_order or "")
    return [{"label": run.name, "run_id": run.run_id, "baseline": "true" if record.baseline else "",
             **dict(zip(ROW_TAGS, ((record.figure_texts or {}).get(ROW_TAGS[0], ""), record.verdict or "",
                                   record.target_text or "", record.caveat or "")))} for run, record in runs]


def check_rows(rows: list[dict[str, str]]) -> None:
    """What the rows must say before any browser: the baseline named on its row, the caveats of a too-small study
    and of a loaded host, labels in natural order within a verdict group."""
    from sweeplab.report.config_runs import natural_key

    (baseline,) = [r for r in rows if r["baseline"] == "true"]
    if "baseline" not in baseline["speedup to target"]:
        raise CheckFailed(f"the baseline's row ({baseline['label']}) does not say it is the baseline: "
                          f"{baseline['speedup to target']!r}")
    for row in rows:
        if not (row["caveat"].startswith("not an answer: 2 replicates") and "smoke" in row["caveat"]):
            raise CheckFailed(f"{row['label']}: the caveat of a 2-replicate smoke study is missing: {row['caveat']!r}")
        if not re.search(r"(loaded|unsteady) host \(\d+/\d+\)", row["caveat"]):
            raise CheckFailed(f"{row['label']}: the caveat of a loaded host is missing: {row['caveat']!r}")
    for group in {r["verdict"] for r in rows}:
        labels = [r["label"] for r in rows if r["verdict"] == group]
        if labels != sorted(labels, key=natural_key):
            raise CheckFailed(f"the rows of verdict {group!r} are not in natural order: {labels}")
    print(f"ok: the rows name the baseline ({baseline['label']}: {baseline['speedup to target']}), carry the caveat "
          f"{rows[0]['caveat']!r}, and read in natural order", flush=True)


def huge_bounds(text: str) -> list[str]:
    """The intervals in `text` with a bound beyond MAX_BOUND."""
    found = []
    for match in INTERVAL.finditer(text):
        try:
            bounds = [abs(float(b.replace(",", ""))) for b in match.groups()]
        except ValueError:
            continue
        if max(bounds) > MAX_BOUND:
            found.append(match.group(0))
    return found


def check_no_huge_bound(text: str, where: str) -> None:
    if found := huge_bounds(text):
        raise CheckFailed(f"{where}: interval bounds beyond {MAX_BOUND:g} printed: {found[:3]}")


def check_recorded_bounds(uri: str, parent_id: str, rows: list[dict[str, str]]) -> None:
    """No bound beyond MAX_BOUND in what the UI prints from the store: the configuration runs' `_low`/`_high`
    metrics, their tags, and the sweep run's verdict (its description)."""
    from sweeplab.core.records import SweepRun
    from sweeplab.tracking import mlflow_store

    for row in rows:
        run = mlflow_store.read_run(uri, row["run_id"])
        big = {k: v for k, v in run.metrics.items() if k.endswith(("_low", "_high")) and abs(v) > MAX_BOUND}
        if big:
            raise CheckFailed(f"configuration run {row['label']}: bounds beyond {MAX_BOUND:g} logged: {big}")
        check_no_huge_bound(" ".join(run.tags.values()), f"configuration run {row['label']}'s tags")
    parent = mlflow_store.read_run(uri, parent_id)
    check_no_huge_bound(SweepRun.from_run(parent).description or "", "the sweep run's verdict (its description)")
    print(f"ok: no interval bound beyond {MAX_BOUND:g} in the configuration runs or the sweep's verdict", flush=True)


def whole(driver, element) -> str:
    return driver.execute_script(WHOLE_JS, element)


def row_link(driver, label: str):
    for link in driver.find_elements("css selector", ".ag-row a"):
        if link.text.strip() == label:
            return link
    return None


def check_runs_table(driver, url: str, rows: list[dict[str, str]], size: str) -> None:
    """Every configuration's label, speedup to target, verdict and target wholly on screen, unscrolled, in order."""
    if not rows:
        raise CheckFailed("the sweep has no configuration runs: nothing to compare")
    driver.get(url)
    wait_for(driver, lambda d: all(row_link(d, r["label"]) is not None for r in rows), 90,
             f"{size}: the configurations' rows")
    time.sleep(1.0)  # column widths and order are applied after the rows arrive
    order = []
    for row in rows:
        label = row["label"]
        link = row_link(driver, label)
        if why := whole(driver, link):
            raise CheckFailed(f"{size}: configuration {label!r}: its label is not wholly on screen: {why}")
        index = driver.execute_script("return arguments[0].closest('.ag-row').getAttribute('row-index');", link)
        order.append((int(index), label))
        for tag in ROW_TAGS:
            expected = row[tag]
            if not expected:
                raise CheckFailed(f"configuration {label!r}: its run has no {tag!r} tag")
            cells = driver.find_elements(
                "css selector", f".ag-center-cols-container .ag-row[row-index='{index}'] [col-id='tags.`{tag}`']")
            if not cells or cells[0].text.strip() != expected:
                shown = cells[0].text.strip() if cells else "no such cell"
                raise CheckFailed(f"{size}: configuration {label!r}: {tag} should read {expected!r}, the page "
                                  f"shows {shown!r} ({url})")
            if why := whole(driver, cells[0]):
                raise CheckFailed(f"{size}: configuration {label!r}: its {tag} {expected!r} is not wholly on "
                                  f"screen: {why}")
        print(f"ok: {size}: {label}: " + ", ".join(f"{t} {row[t]}" for t in ROW_TAGS), flush=True)
    check_no_huge_bound(driver.find_element("css selector", ".ag-root").text, f"{size}: the runs table")
    shown = [label for _, label in sorted(order)]
    if shown != [r["label"] for r in rows]:
        raise CheckFailed(f"{size}: the rows read {shown}, not the view's order (verdict group, then label): "
                          f"{[r['label'] for r in rows]}")


def genai_navigation(driver, run_name: str, what: str) -> list[str]:
    """The GenAI navigation labels shown on a run page (once the page shows the run's name)."""
    wait_for(driver, lambda d: run_name in d.find_element("css selector", "body").text, 60, f"{what}: the run page")
    time.sleep(1.0)
    return sorted(driver.execute_script(LABELS_SHOWN_JS, list(GENAI_NAV)))


def click_through(driver, parent_id: str, sweep_name: str, first: dict[str, str],
                  size: str) -> tuple[list[str], list[str]]:
    """From the runs table, a click on the configuration run's link, then on its parent run's (the sweep): the GenAI
    navigation each page shows (MLflow's own links, which carry no `workflowType`)."""
    row_link(driver, first["label"]).click()
    wait_for(driver, lambda d: f"/runs/{first['run_id']}" in d.current_url, 30,
             f"{size}: the click on {first['label']!r}")
    clicked = genai_navigation(driver, first["label"], f"{size}: {first['label']!r} clicked")
    parents = wait_for(driver, lambda d: [a for a in d.find_elements("css selector", f"a[href*='/runs/{parent_id}']")
                                          if a.is_displayed()], 30, f"{size}: the link to the parent run")
    parents[0].click()
    wait_for(driver, lambda d: d.current_url.rstrip("/").split("?")[0].endswith(f"/runs/{parent_id}"), 30,
             f"{size}: the click on the parent run")
    return clicked, genai_navigation(driver, sweep_name, f"{size}: the sweep run clicked")


def check_training_mode(driver, base: str, experiment_id: str, parent_id: str, sweep_name: str,
                        rows: list[dict[str, str]], size: str) -> None:
    """In a fresh profile, MLflow's own links (a configuration run in the table, then its parent, the sweep run) and
    sweeplab's addresses of both land in the training mode: no GenAI navigation. Starts on the table of
    check_runs_table."""
    from sweeplab.tracking import mlflow_store, ui_server

    stored = driver.execute_script(f"return window.localStorage.getItem('{ui_server.STORAGE_KEY}');")
    first = rows[0]
    clicked, parent_clicked = click_through(driver, parent_id, sweep_name, first, size)
    for labels, what in ((clicked, f"a click on configuration {first['label']!r} in MLflow's table"),
                         (parent_clicked, "from there, a click on its parent run (the sweep)")):
        if labels:
            raise CheckFailed(f"{size}: {what} lands in MLflow's GenAI mode (shows {', '.join(labels)}; stored "
                              f"{ui_server.STORAGE_KEY}: {stored})")
    print(f"ok: {size}: MLflow's own links, fresh profile (stored {ui_server.STORAGE_KEY}: {stored}): a click on "
          f"configuration {first['label']!r} in the table, then on its parent run, land in the training mode",
          flush=True)
    for run_id, name, what in ((first["run_id"], first["label"], f"configuration run {first['label']!r}"),
                               (parent_id, sweep_name, "the sweep run")):
        url = mlflow_store.run_url(base, experiment_id, run_id)
        driver.get(url)
        if labels := genai_navigation(driver, name, f"{size}: {what}"):
            raise CheckFailed(f"{size}: {what} at sweeplab's address {url} opens in MLflow's GenAI mode (shows "
                              f"{', '.join(labels)})")
        print(f"ok: {size}: {what} at sweeplab's address opens in the training mode (no GenAI navigation)", flush=True)


def check_genai_choice_kept(driver, url: str, parent_id: str, sweep_name: str, rows: list[dict[str, str]],
                            size: str) -> None:
    """A browser whose user chose GenAI (the sidebar's switch: stored `"genai"`) keeps it: the same click from the
    table lands in the GenAI mode (which also shows that the check above can see that mode)."""
    from sweeplab.tracking import ui_server

    genai = '"genai"'
    driver.execute_script(f"window.localStorage.setItem('{ui_server.STORAGE_KEY}', '{genai}');")
    driver.get(url)
    driver.refresh()  # a new page load: the UI reads the stored mode when it starts, and the address changed its hash
    wait_for(driver, lambda d: row_link(d, rows[0]["label"]) is not None, 90, f"{size}: the table, GenAI chosen")
    clicked, _ = click_through(driver, parent_id, sweep_name, rows[0], size)
    stored = driver.execute_script(f"return window.localStorage.getItem('{ui_server.STORAGE_KEY}');")
    if not clicked or stored != genai:
        raise CheckFailed(f"{size}: a browser that chose GenAI does not keep it: a click in the table shows "
                          f"{clicked or 'no GenAI navigation'}, stored {ui_server.STORAGE_KEY}: {stored}")
    print(f"ok: {size}: a browser that chose GenAI keeps it (a click in the table shows {', '.join(clicked)})",
          flush=True)


def check_charts(driver, url: str, rows: list[dict[str, str]], monitored: str, size: str) -> None:
    """The chart view: no bar (MLflow 3.17 draws none with its interval), the curves and one target line, a legend
    naming every configuration's curve and the target once, uncut, and the section's pointer to report.html wholly
    shown."""
    from sweeplab.core.records import CONFIGURATION, key_of
    from sweeplab.report import config_runs, saved_view

    driver.get(url)
    curve = key_of(CONFIGURATION.curve, monitored)
    target = f"{config_runs.TARGET_RUN_NAME} ({curve})"
    wanted = [f"{r['label']} ({curve})" for r in rows] + [target]
    wait_for(driver, lambda d: driver.execute_script(LABELS_SHOWN_JS, wanted) and
             d.find_elements("css selector", ".js-plotly-plot .scatterlayer .trace"), 90, f"{size}: the curve")
    time.sleep(2.0)  # MLflow adds generated charts once the runs' metrics are in
    bars = driver.execute_script("return document.querySelectorAll('.trace.bars g.point, .barlayer .point').length;")
    if bars:
        raise CheckFailed(f"{size}: the chart view shows {bars} bars, without their intervals ({url})")
    lines = driver.execute_script(LINES_JS)
    if lines != len(rows) + 1:
        raise CheckFailed(f"{size}: the chart view draws {lines} lines, not {len(rows)} curves and one target ({url})")
    entries = driver.execute_script(ENDING_WITH_JS, f"({curve})")
    if sorted(entries) != sorted(wanted):
        raise CheckFailed(f"{size}: the legend reads {sorted(entries)}, not {sorted(wanted)}: one entry per "
                          f"configuration and one for the target ({url})")
    shown = set(driver.execute_script(LABELS_SHOWN_JS, wanted))
    if missing := [w for w in wanted if w not in shown]:
        raise CheckFailed(f"{size}: the curve's legend lacks {missing} ({url})")
    for label in wanted:
        element = driver.find_element("xpath", f"//*[normalize-space(text())={json_literal(label)}]")
        if driver.execute_script("return arguments[0].scrollWidth > arguments[0].clientWidth + 1;", element):
            raise CheckFailed(f"{size}: the curve's legend cuts {label!r} ({url})")
    sections = driver.find_elements("xpath", f"//*[normalize-space(text())={json_literal(saved_view.SECTION_NAME)}]")
    if not sections:
        raise CheckFailed(f"{size}: the chart view has no section {saved_view.SECTION_NAME!r} ({url})")
    if why := whole(driver, sections[0]):
        raise CheckFailed(f"{size}: the chart section's title {saved_view.SECTION_NAME!r} is not wholly shown: {why}")
    print(f"ok: {size}: the chart view: the curves and one target line, {len(wanted)} legend entries, no bar, "
          f"section {saved_view.SECTION_NAME!r}", flush=True)


def rgb(color: str) -> str:
    """`#rrggbb` as the browser writes a computed colour: `rgb(r, g, b)`."""
    return "rgb({}, {}, {})".format(*(int(color[i:i + 2], 16) for i in (1, 3, 5)))


def check_spread(driver, url: str, uri: str, parent_id: str, rows: list[dict[str, str]], monitored: str,
                 size: str) -> None:
    """The spread view (every replicate): one line per job and one target line, each job in its configuration's
    colour (as many colours as configurations, and the target's), a legend naming every job and the target once,
    its section's title wholly shown."""
    from sweeplab.core.records import ConfigurationRun
    from sweeplab.report import config_runs, plots, saved_view
    from sweeplab.tracking import mlflow_store

    jobs = mlflow_store.sweep_jobs(uri, parent_id)
    suffix = f"({monitored})"
    wanted = [f"{job.info.run_name} {suffix}" for job in jobs] + [f"{config_runs.TARGET_RUN_NAME} {suffix}"]
    driver.get(url)
    wait_for(driver, lambda d: d.execute_script(LINES_JS) >= len(wanted), 90, f"{size}: the spread view's lines")
    time.sleep(2.0)  # MLflow adds generated charts once the runs' metrics are in
    lines = driver.execute_script(LINES_JS)
    if lines != len(wanted):
        raise CheckFailed(f"{size}: the spread view draws {lines} lines, not {len(jobs)} jobs and one target ({url})")
    entries = driver.execute_script(ENDING_WITH_JS, suffix)
    if sorted(entries) != sorted(wanted):
        raise CheckFailed(f"{size}: the spread view's legend reads {sorted(entries)}, not {sorted(wanted)} ({url})")
    colors = sorted(set(driver.execute_script(LINE_COLORS_JS)))
    expected = sorted({rgb(ConfigurationRun.from_run(mlflow_store.read_run(uri, row["run_id"])).color or "")
                       for row in rows} | {rgb(plots.TARGET_COLOR)})
    if colors != expected or len(expected) != len(rows) + 1:
        raise CheckFailed(f"{size}: the spread view draws in {colors}, not one colour per configuration and the "
                          f"target's {expected} ({url})")
    sections = driver.find_elements("xpath", f"//*[normalize-space(text())={json_literal(saved_view.SPREAD_SECTION_NAME)}]")
    if not sections or (why := whole(driver, sections[0])):
        raise CheckFailed(f"{size}: the spread view's section {saved_view.SPREAD_SECTION_NAME!r} is not wholly "
                          f"shown: {why if sections else 'absent'} ({url})")
    print(f"ok: {size}: the spread view: {len(jobs)} jobs' lines in {len(rows)} colours and one target line, "
          f"{len(wanted)} legend entries", flush=True)


def json_literal(text: str) -> str:
    """An XPath string literal for text (which holds no double quote)."""
    return f'"{text}"'


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


def run_checks(uri: str, chromium: str, chromedriver: str, meanwhile=None) -> None:
    """Every check on the store's latest sweep; meanwhile: what to do while the UI server starts (the report)."""
    port = free_port()
    server = launch_ui(uri, port)
    try:
        if meanwhile is not None:
            meanwhile()
        wait_for_ui(server, port)
        checks_on_a_served_store(uri, port, chromium, chromedriver)
    finally:
        stop_ui(server)


def checks_on_a_served_store(uri: str, port: int, chromium: str, chromedriver: str) -> None:
    from sweeplab.core.records import ConfigurationRun
    from sweeplab.report import ui_links
    from sweeplab.tracking import mlflow_store

    parent_id = mlflow_store.latest_sweep(uri)
    if parent_id is None:
        raise CheckFailed(f"no sweep in {uri}")
    parent = mlflow_store.read_run(uri, parent_id, "sweep")
    base = f"http://127.0.0.1:{port}"
    url = ui_links.latest_sweep_url(uri, base)  # what `make ui --port PORT` prints
    charts = ui_links.sweep_url(uri, base, parent_id, mode="CHART")
    spread = ui_links.spread_url(uri, base, parent_id)  # what `make ui` prints beside its address
    if spread is None:
        raise CheckFailed("the sweep's report wrote no spread view (every replicate's curve)")
    print(f"make ui's address: {url}", flush=True)
    rows = configuration_rows(uri, parent_id)
    if not rows:
        raise CheckFailed("the sweep has no configuration runs: nothing to compare")
    check_rows(rows)
    check_recorded_bounds(uri, parent_id, rows)
    monitored = ConfigurationRun.from_run(mlflow_store.read_run(uri, rows[0]["run_id"])).objective_metric or ""
    for width, height in VIEWPORTS:
        size = f"{width}x{height}"
        with tempfile.TemporaryDirectory(prefix="sweeplab-chromium-") as profile:
            driver = browser(chromium, chromedriver, (width, height), profile)
            try:
                check_runs_table(driver, url, rows, size)
                check_training_mode(driver, base, parent.experiment_id, parent_id, parent.name, rows, size)
                check_charts(driver, charts, rows, monitored, size)
                check_spread(driver, spread, uri, parent_id, rows, monitored, size)
                if (width, height) == VIEWPORT:
                    check_reports(driver, base, parent)
                    check_genai_choice_kept(driver, url, parent_id, parent.name, rows, size)
            finally:
                driver.quit()


def check_reports(driver, base: str, parent) -> None:
    from sweeplab.core.records import SweepRun
    from sweeplab.tracking import mlflow_store

    report = Path(SweepRun.from_run(parent).sweep_dir or "") / "report.html"
    if not report.is_file():
        raise CheckFailed(f"{report} not found: the sweep's report does not write report.html")
    check_no_huge_bound(report.read_text(), f"report.html ({report})")
    driver.get(report.as_uri())
    check_report(driver, f"report.html from disk ({report})")
    driver.get(f"{base}/#/experiments/{parent.experiment_id}/runs/{parent.run_id}/artifacts/report/report.html"
               f"?{mlflow_store.UI_WORKFLOW_QUERY}")
    check_report(driver, "report.html in MLflow's artifact view", "iframe")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tracking-uri", default=None,
                        help="check this store's latest sweep (default: a small recorded study in a temporary store)")
    parser.add_argument("--smoke-sweep", action="store_true",
                        help="check a new smoke sweep on a loaded host instead (minutes: a real sweep's jobs)")
    parser.add_argument("--chromium", default=CHROMIUM)
    parser.add_argument("--chromedriver", default=CHROMEDRIVER)
    args = parser.parse_args(argv)
    try:
        check_names()
        install_browser(args.chromium, args.chromedriver)
        check_browser(args.chromium, args.chromedriver)
        if args.tracking_uri is not None:
            run_checks(args.tracking_uri, args.chromium, args.chromedriver)
        else:
            with tempfile.TemporaryDirectory(prefix="sweeplab-ui-check-") as workdir:
                folder = Path(workdir)
                if args.smoke_sweep:
                    run_checks(smoke_sweep(folder), args.chromium, args.chromedriver)
                else:  # the server starts while the recorded study is reported
                    uri = recorded_study(folder)
                    run_checks(uri, args.chromium, args.chromedriver, lambda: report_study(folder, uri))
    except CheckFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print("ui-check: passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
