"""`make screenshots`: docs/ui-*.png, the MLflow UI's views of a default sweep, in one command.

    .venv/bin/python scripts/screenshots.py [--tracking-uri URI] [--out docs]

Without --tracking-uri it runs the default study (`python -m sweeplab.train -m sweep=default backend=cpu`, what
`make sweep` runs) into a temporary store first; with it, it shoots that store's latest sweep. Each view is opened by
its address alone (no clicks) in headless Chromium at 1600x1000, a fresh profile (a first visit): the comparison
`make ui` prints (ui-runs.png), its chart view (ui-charts.png), one job's run page (ui-run.png), the compare view of
the jobs (ui-compare.png) and of the configuration runs (ui-compare-configurations.png), samples/s and val/cos of every job (ui-samples-per-sec.png, ui-val-cos.png) and the
sweep's report in MLflow's artifact view (ui-report.png: report.html, else report.md); the comparison and its charts
again at a laptop's 1280x800, in another fresh profile (ui-runs-1280.png, ui-charts-1280.png); a replicated sweep's
spread view (every replicate's curve) at both sizes (ui-spread.png, ui-spread-1280.png). Needs what
`make ui-check` needs (`apt-get install chromium chromium-driver`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ui_check import (  # noqa: E402
    CHROMEDRIVER,
    CHROMIUM,
    ROOT,
    VIEWPORT,
    CheckFailed,
    browser,
    check_browser,
    free_port,
    start_ui,
    stop_ui,
    wait_for,
)

from sweeplab.core.records import JobRun, SweepRun  # noqa: E402
from sweeplab.report import config_runs, ui_links  # noqa: E402
from sweeplab.tracking import mlflow_store, runs  # noqa: E402


def default_sweep(workdir: Path) -> str:
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    command = [sys.executable, "-m", "sweeplab.train", "-m", "sweep=default", "backend=cpu",
               f"hydra.sweep.dir={workdir / 'sweep'}"]
    print(f"default sweep (minutes): {' '.join(command[1:])}", flush=True)
    result = subprocess.run(command, cwd=ROOT, env={**os.environ, "MLFLOW_TRACKING_URI": uri},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        raise CheckFailed(f"the default sweep failed (exit {result.returncode}): "
                          f"{(result.stderr.strip().splitlines() or ['no output'])[-1]}")
    return uri


def views(uri: str, base: str, parent_id: str) -> dict[str, str]:
    """docs/ file name -> the UI address that shows it."""
    parent = mlflow_store.read_run(uri, parent_id)
    experiment_id = parent.experiment_id
    jobs = [r for r in runs.job_runs(uri, parent_id, experiment_id) if r.status == "FINISHED"]
    ml = mlflow_store.UI_WORKFLOW_QUERY
    run_ids, experiments = json.dumps([r.run_id for r in jobs]), json.dumps([experiment_id])
    objectives = [JobRun.from_run(r).objective for r in jobs]
    best = max(zip(jobs, objectives), key=lambda found: found[1] if found[1] is not None else float("-inf"))[0]

    def metric_page(key: str, x_axis: str) -> str:
        return (f"{base}/#/metric?runs={run_ids}&metric={quote(json.dumps(key))}&experiments={experiments}"
                f"&plot_metric_keys={quote(json.dumps([key]))}&plot_layout={{}}&x_axis={x_axis}&y_axis_scale=linear"
                f"&line_smoothness=1&show_point=true&deselected_curves=[]&last_linear_y_axis_range=[]&{ml}")

    configurations = json.dumps([r.run_id for r in config_runs.configuration_runs(uri, parent_id)])
    sweep_dir = SweepRun.from_run(parent).sweep_dir or ""
    report = "report.html" if Path(sweep_dir, "report.html").is_file() else "report.md"
    spread = ui_links.spread_url(uri, base, parent_id)  # every replicate's curve: a replicated sweep's report's view
    return {
        **({"ui-spread.png": spread} if spread else {}),
        "ui-runs.png": ui_links.sweep_url(uri, base, parent_id),
        "ui-charts.png": ui_links.sweep_url(uri, base, parent_id, mode="CHART"),
        "ui-run.png": mlflow_store.run_url(base, experiment_id, best.run_id),
        "ui-compare.png": f"{base}/#/compare-runs?runs={run_ids}&experiments={experiments}&{ml}",
        "ui-compare-configurations.png": f"{base}/#/compare-runs?runs={configurations}&experiments={experiments}&{ml}",
        "ui-samples-per-sec.png": metric_page("train/samples_per_sec", "step"),
        "ui-val-cos.png": metric_page("val/cos", "relative"),
        "ui-report.png": f"{base}/#/experiments/{experiment_id}/runs/{parent_id}/artifacts/report/{report}?{ml}",
    }


LAPTOP = (1280, 800)
LAPTOP_VIEWS = {"ui-runs.png": "ui-runs-1280.png", "ui-charts.png": "ui-charts-1280.png",
                "ui-spread.png": "ui-spread-1280.png"}


def shoot(uri: str, out: Path, wait_s: float) -> None:
    parent_id = mlflow_store.latest_sweep(uri)
    if parent_id is None:
        raise CheckFailed(f"no sweep in {uri}")
    port = free_port()
    server = start_ui(uri, port)
    addresses = views(uri, f"http://127.0.0.1:{port}", parent_id)
    shots = [(VIEWPORT, addresses), (LAPTOP, {LAPTOP_VIEWS[name]: addresses[name] for name in LAPTOP_VIEWS if name in addresses})]
    try:
        for viewport, pages in shots:
            with tempfile.TemporaryDirectory(prefix="sweeplab-chromium-") as profile:
                driver = browser(CHROMIUM, CHROMEDRIVER, viewport, profile)
                try:
                    for name, url in pages.items():
                        driver.get(url)
                        if "compare-runs" in url:  # from another compare page only the address's hash changed:
                            driver.refresh()  # the page would keep the runs it had
                        if "compareRunsMode=CHART" in url:  # a busy machine draws the chart after a minute or more
                            wait_for(driver, lambda d: d.find_elements(
                                "css selector", ".js-plotly-plot .scatterlayer .trace"), 180, f"{name}: the chart")
                        time.sleep(wait_s)  # the page's own requests and charts settle
                        driver.save_screenshot(str(out / name))
                        print(f"{out / name}: {url}", flush=True)
                finally:
                    driver.quit()
    finally:
        stop_ui(server)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tracking-uri", default=None, help="shoot this store's latest sweep (default: a new default sweep)")
    parser.add_argument("--out", default=str(ROOT / "docs"))
    parser.add_argument("--wait-s", type=float, default=12.0, help="time each page gets to load before the shot")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        check_browser(CHROMIUM, CHROMEDRIVER)
        if args.tracking_uri is not None:
            shoot(args.tracking_uri, out, args.wait_s)
        else:
            with tempfile.TemporaryDirectory(prefix="sweeplab-screenshots-") as workdir:
                shoot(default_sweep(Path(workdir)), out, args.wait_s)
    except CheckFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
