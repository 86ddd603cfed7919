"""The sweep's saved view of MLflow's runs table (sweeplab.report.saved_view) and `make ui-check`'s failure line.

The view's format is MLflow 3.17's UI's own: these tests pin what that UI reads (checked against its bundle:
the `mlflow.sharedViewState.` tag prefix, the `viewStateShareKey` address parameter, the `deflate;` state and its
envelope); `make ui-check` checks it in the real UI with Chromium.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import zlib
from pathlib import Path

import mlflow
from mlflow import MlflowClient

from sweeplab.report import config_runs, saved_view, ui_links
from sweeplab.tracking import mlflow_store

ROOT = Path(__file__).resolve().parents[1]


def test_the_state_round_trips_through_the_encoding_mlflows_ui_reads():
    state = {"searchFilter": "tags.`sweeplab.role` = 'configuration'", "selectedColumns": ["tags.`samples/s`"],
             "label": "bs=32 α=0.7"}
    encoded = saved_view.encode_state(state)
    assert encoded.startswith("deflate;")
    # what the UI does: strip the prefix, base64, inflate (zlib), JSON
    assert json.loads(zlib.decompress(base64.b64decode(encoded[len("deflate;"):])).decode()) == state
    assert saved_view.decode_state(encoded) == state
    assert saved_view.decode_state(json.dumps(state)) == state  # an uncompressed state, as the UI also writes
    envelope = json.loads(saved_view.envelope("sweep x: comparison", state, 1234))
    assert envelope["name"] == "sweep x: comparison" and envelope["createdAt"] == envelope["updatedAt"] == 1234
    assert saved_view.decode_state(envelope["state"]) == state


def test_views_are_written_only_under_the_pinned_mlflow():
    assert saved_view.view_supported(mlflow.__version__)  # pyproject pins the version this format was checked on
    assert saved_view.view_supported("3.17.9")
    assert not saved_view.view_supported("3.18.0") and not saved_view.view_supported("3.1.7")


def test_the_comparison_state_selects_the_figures_sorts_by_the_verdict_and_charts_them():
    state = saved_view.comparison_state(["data.batch_size", "loss.alpha"], ["samples/s", "final val/cos"],
                                     "final_val_cos", "val/cos", "tags.x = 'y'")
    assert state["searchFilter"] == "tags.x = 'y'"
    assert state["orderByKey"] == "metrics.`speedup_to_target`" and state["orderByAsc"] is False
    columns = state["selectedColumns"]
    assert columns[:4] == ["params.`data.batch_size`", "params.`loss.alpha`", "tags.`samples/s`", "tags.`final val/cos`"]
    assert "metrics.`final_val_cos_low`" in columns and "tags.`verdict`" in columns
    charts = state["compareRunCharts"]
    line = charts[0]
    assert line["type"] == "LINE" and line["metricKey"] == "curve/val/cos"
    assert line["xAxisKey"] == "metric" and line["selectedXAxisMetricKey"] == "curve/train_seconds"
    assert [c["metricKey"] for c in charts[1:]] == ["samples_per_sec", "time_to_target_s", "final_val_cos",
                                                   "speedup_to_target"]
    assert {c["metricSectionId"] for c in charts} == {s["uuid"] for s in state["compareRunSections"]}


def test_make_ui_opens_the_sweeps_saved_view_written_with_its_configuration_runs(mlflow_uri):
    from sweeplab.report import tables as report
    from sweeplab.study.record import VerdictOptions
    from test_report_figures import recorded_sweep, synthetic_jobs

    parent = recorded_sweep(mlflow_uri, synthetic_jobs())
    report.sweep_report(mlflow_uri, parent, None, options=VerdictOptions(target=0.8))
    client = MlflowClient(mlflow_uri)
    experiment_id = client.get_run(parent).info.experiment_id
    name, state = saved_view.read_view(client, experiment_id, saved_view.view_id(parent))
    assert name.endswith(": comparison")
    assert parent in state["searchFilter"] and "configuration" in state["searchFilter"]
    assert state["selectedColumns"][:2] == ["params.`data.batch_size`", "params.`loss.alpha`"]
    url = ui_links.latest_sweep_url(mlflow_uri, "http://ui")
    assert url == f"http://ui/#/experiments/{experiment_id}/runs?workflowType=machine_learning&viewStateShareKey=sweeplab-{parent}"
    assert "searchFilter" not in url  # the UI ignores a view whose address carries its own search
    fast = next(r for r in config_runs.configuration_runs(mlflow_uri, parent)
                if r.tags["config"] == "data.batch_size=64 loss.alpha=0.7")
    assert fast.tags["samples/s"].count("(") == 1 and "–" in fast.tags["samples/s"]
    assert "stability" not in fast.tags  # synthetic jobs record no stability figures (test below)
    curve = client.get_metric_history(fast.run_id, "curve/val/cos")
    times = client.get_metric_history(fast.run_id, "curve/train_seconds")
    assert len(curve) == len(times) > 1 and {m.step for m in curve} == {m.step for m in times}
    # a view deleted (or a sweep reported before views existed) is written again by make ui
    client.delete_experiment_tag(experiment_id, saved_view.VIEW_TAG_PREFIX + saved_view.view_id(parent))
    assert ui_links.latest_sweep_url(mlflow_uri, "http://ui") == url
    assert saved_view.read_view(client, experiment_id, saved_view.view_id(parent)) is not None
    assert mlflow_store.latest_sweep(mlflow_uri) == parent


def test_ui_check_fails_in_one_line_naming_the_apt_package_when_chromium_is_absent(tmp_path):
    missing = tmp_path / "no-chromium"
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "ui_check.py"), "--chromium", str(missing)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(missing) in lines[0]
    assert "apt-get install chromium" in lines[0]


def test_a_configurations_stability_counts_its_unreliable_jobs_and_names_why():
    from types import SimpleNamespace

    def job(spread: float):
        metrics = {"summary/batch_shapes": 1.0, "summary/step_time_spread": spread, "summary/host_cpus": 2.0,
                   "summary/load_avg_start": 0.5}
        return SimpleNamespace(metrics=metrics, tags={})

    assert config_runs.stability_text([job(0.02), job(0.03)]) == "ok"
    assert config_runs.stability_text([job(0.02), job(0.3)]) == "1/2 jobs: noisy"
    assert config_runs.stability_text([SimpleNamespace(metrics={}, tags={})]) == ""
