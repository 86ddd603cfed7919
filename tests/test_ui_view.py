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

from sweeplab.report import config_runs, plots, saved_view, ui_links
from sweeplab.report.plots import OKABE_ITO
from sweeplab.tracking import mlflow_store
from sweeplab.tracking import runs as runs_module

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


def _state(**kwargs):
    texts = ["speedup to target", "time to target (s)", "final val/cos", "samples/s"]
    metric_keys = ["speedup_to_target", "speedup_to_target_low", "samples_per_sec", "target", "median val/cos",
                   "training seconds", "jobs"]
    return saved_view.comparison_state(["data.batch_size", "loss.alpha"], texts, "final_val_cos", "val/cos",
                                       "tags.x = 'y'", "val/cos ≥ 0.5364", metric_keys, **kwargs)


def test_the_views_first_columns_are_label_speedup_interval_verdict_target_and_caveat_then_the_figures():
    state = _state()
    assert state["searchFilter"] == "tags.x = 'y'"
    columns = state["selectedColumns"]
    # the run's name (the short label) is the table's own first column; then the answer, in the order
    assert state["columnOrder"][0] == saved_view.RUN_NAME_COLUMN
    assert columns[:7] == ["tags.`speedup to target`", "tags.`verdict`", "tags.`target`", "tags.`caveat`",
                           "tags.`time to target (s)`", "tags.`final val/cos`", "tags.`samples/s`"]
    assert state["columnOrder"][2:9] == columns[:7]
    # the numbers stay real metrics (they sort as numbers), after the text, each with its bounds
    metric_columns = [c for c in columns if c.startswith("metrics.")]
    assert metric_columns[:3] == ["metrics.`speedup_to_target`", "metrics.`speedup_to_target_low`",
                                  "metrics.`speedup_to_target_high`"]
    assert columns.index(metric_columns[0]) > columns.index("tags.`samples/s`")
    assert "params.`data.batch_size`" in columns


def test_the_view_hides_what_a_study_does_not_need_and_narrows_what_mlflow_will_not_hide():
    state = _state()
    columns = state["selectedColumns"]
    # selectedColumns is the list of shown hideable columns: MLflow's User, Source, Version, Models, Dataset and
    # Description columns and every other tag, param or metric stay hidden
    assert not [c for c in columns if c.startswith("attributes.")]
    assert "tags.`sweeplab.verdict_order`" not in columns and "metrics.`jobs`" not in columns
    # Created and Duration cannot be hidden in MLflow 3.17: Created is narrowed to its status icon, Duration last
    assert state["columnOrder"][1] == saved_view.CREATED_COLUMN and state["columnOrder"][-1] == "duration"
    assert state["columnWidths"][saved_view.CREATED_COLUMN] <= 40
    # the five columns that must be on a laptop's first screen, with the label, fit 1280 px beside MLflow's sidebar
    # (its Assistant panel closed on a first visit by sweeplab's server)
    first = [saved_view.RUN_NAME_COLUMN, saved_view.CREATED_COLUMN, *columns[:4]]
    assert sum(state["columnWidths"][c] for c in first) <= 950  # 1028 px of table there, the checkbox column too


def test_the_view_sorts_by_verdict_group_then_label_never_by_a_figure():
    state = _state()
    assert state["orderByKey"] == "tags.`sweeplab.verdict_order`" and state["orderByAsc"] is True
    from sweeplab.study.verdict import Verdict

    tie = Verdict("tie", ("a", "b"), {}, ("d",), "", ("tie",))
    assert config_runs.verdict_standing("a", tie) == (1, "tied for fastest (of those compared; 1 undetermined)")
    assert config_runs.verdict_standing("c", tie) == (2, "left out")
    assert config_runs.verdict_standing("d", tie) == (3, "undetermined")
    one = Verdict("fastest", ("a",), {}, (), "", ("fastest",))
    assert config_runs.verdict_standing("a", one) == (1, "fastest")
    zone = Verdict("fastest", ("b",), {}, (), "", ("fastest",), within=1.1)
    assert config_runs.verdict_standing("b", zone) == (1, "fastest (or within 1.1x)")
    assert config_runs.verdict_standing("a", zone) == (2, "left out")
    assert config_runs.verdict_standing("a", Verdict("no verdict", (), {}, (), "", ("x",))) == (3, "no verdict")


def test_the_views_name_holds_the_target():
    assert saved_view.view_name("2026-11-27/10-00-00", "val/cos ≥ 0.5364") == \
        "sweep 2026-11-27/10-00-00: time to val/cos ≥ 0.5364"


def test_the_chart_view_opens_on_the_curve_with_its_target_and_no_bar_without_an_interval():
    state = _state()
    shown = [c for c in state["compareRunCharts"] if not c["deleted"]]
    assert len(shown) == 1
    curve = shown[0]
    # the curve's key alone: MLflow lists every selected key of every run in the legend (the target: a run of its own)
    assert curve["type"] == "LINE" and curve["selectedMetricKeys"] == ["median val/cos"]
    assert curve["xAxisKey"] == "metric" and curve["selectedXAxisMetricKey"] == "training seconds"
    # MLflow 3.17 adds a chart (bars of medians) for every logged metric no card names: each has a deleted card
    hidden = {c["metricKey"] for c in state["compareRunCharts"] if c["deleted"]}
    assert hidden == {"speedup_to_target", "speedup_to_target_low", "samples_per_sec", "target",
                      "training seconds", "jobs"}
    assert all(not c["isGenerated"] for c in state["compareRunCharts"])
    (section,) = state["compareRunSections"]
    assert {c["metricSectionId"] for c in state["compareRunCharts"]} == {section["uuid"]}
    assert "report.html" in section["name"] and section["columns"] == 1
    assert state["runListHidden"] is True  # chart mode only: the curve gets the page's width, its legend names runs


def _reported_sweep(mlflow_uri: str) -> tuple[str, MlflowClient, str]:
    """A recorded replicated sweep reported with an explicit target: (its run id, a client, its experiment id)."""
    from sweeplab.report import tables as report
    from sweeplab.study.record import VerdictOptions
    from test_report_figures import recorded_sweep, synthetic_jobs

    parent = recorded_sweep(mlflow_uri, synthetic_jobs())
    report.sweep_report(mlflow_uri, parent, None, options=VerdictOptions(target=0.8))
    client = MlflowClient(mlflow_uri)
    return parent, client, client.get_run(parent).info.experiment_id


def test_make_ui_opens_the_sweeps_saved_view_written_with_its_configuration_runs(mlflow_uri):
    parent, client, experiment_id = _reported_sweep(mlflow_uri)
    name, state = saved_view.read_view(mlflow_uri, experiment_id, saved_view.view_id(parent))
    assert name.endswith(": time to val/cos ≥ 0.8")
    assert state["searchFilter"] == mlflow_store.compared_filter(parent)  # what it finds: below
    assert state["selectedColumns"][:4] == ["tags.`speedup to target`", "tags.`verdict`", "tags.`target`",
                                            "tags.`caveat`"]
    url = ui_links.latest_sweep_url(mlflow_uri, "http://ui")
    assert url == f"http://ui/#/experiments/{experiment_id}/runs?workflowType=machine_learning&viewStateShareKey=sweeplab-{parent}"
    assert "searchFilter" not in url  # the UI ignores a view whose address carries its own search
    fast = next(r for r in config_runs.configuration_runs(mlflow_uri, parent)
                if r.tags["config"] == "data.batch_size=64 loss.alpha=0.7")
    assert fast.tags["samples/s"].count("(") == 1 and "–" in fast.tags["samples/s"]
    assert "stability" not in fast.tags  # synthetic jobs record no stability figures (test below)
    runs = config_runs.configuration_runs(mlflow_uri, parent)
    assert {r.tags["target"] for r in runs} == {"val/cos ≥ 0.8"} and all(r.tags["verdict"] for r in runs)
    assert all(r.tags["sweeplab.verdict_order"].endswith(" " + r.name) for r in runs)
    # one colour per configuration in MLflow's charts (the UI reads mlflow.runColor), colour-blind-safe, as the report's
    colors = [r.tags["mlflow.runColor"] for r in runs]
    assert len(set(colors)) == len(runs) and set(colors) <= set(OKABE_ITO)
    curve = client.get_metric_history(fast.run_id, "median val/cos")
    times = client.get_metric_history(fast.run_id, "training seconds")
    assert len(curve) == len(times) > 1 and {m.step for m in curve} == {m.step for m in times}
    # one target line, one legend entry: a run of its own (role target) under the curves' key, from the first
    # validation to the last, its row last in the view (the view's filter takes it), no job of the sweep
    (target,) = runs_module.children(mlflow_uri, parent, None, "target")
    assert target.name == "target" and target.tags["target"] == "val/cos ≥ 0.8"
    assert target.tags["mlflow.runColor"] == plots.TARGET_COLOR
    line = client.get_metric_history(target.run_id, "median val/cos")
    assert {m.value for m in line} == {0.8}
    line_x = sorted(m.value for m in client.get_metric_history(target.run_id, "training seconds"))
    spans = [[m.value for m in client.get_metric_history(r.run_id, "training seconds")] for r in runs]
    assert line_x == [min(min(s) for s in spans), max(max(s) for s in spans)]
    assert target.tags["sweeplab.verdict_order"] > max(r.tags["sweeplab.verdict_order"] for r in runs)
    shown = client.search_runs([experiment_id], state["searchFilter"])
    assert {r.info.run_id for r in shown} == {r.run_id for r in runs} | {target.run_id}
    assert target.run_id not in {r.info.run_id for r in mlflow_store.sweep_jobs(mlflow_uri, parent)}
    (baseline,) = [r for r in runs if r.tags["baseline"] == "true"]
    assert baseline.tags["speedup to target"] == "1 (the baseline)"
    # a view deleted (or a sweep reported before views existed) is written again by make ui
    client.delete_experiment_tag(experiment_id, saved_view.VIEW_TAG_PREFIX + saved_view.view_id(parent))
    assert ui_links.latest_sweep_url(mlflow_uri, "http://ui") == url
    assert saved_view.read_view(mlflow_uri, experiment_id, saved_view.view_id(parent)) is not None
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


def test_labels_sort_in_natural_order_in_the_view():
    labels = ["bs=16 α=1", "bs=4 α=1", "bs=4 α=0.7", "bs=128 α=0.25", "lr=3e-4", "lr=1e-3"]
    assert sorted(labels, key=config_runs.natural_key) == [
        "bs=4 α=0.7", "bs=4 α=1", "bs=16 α=1", "bs=128 α=0.25", "lr=3e-4", "lr=1e-3"]


def test_the_order_tag_puts_bs_4_above_bs_16_and_every_run_carries_the_caveat(mlflow_uri):
    import dataclasses

    from sweeplab.report import tables as report
    from sweeplab.study.record import VerdictOptions
    from test_report_figures import recorded_sweep, synthetic_jobs

    jobs = [dataclasses.replace(job, config=job.config.replace("=64", "=4").replace("=32", "=16"))
            for job in synthetic_jobs()]
    parent = recorded_sweep(mlflow_uri, jobs)
    report.sweep_report(mlflow_uri, parent, None, options=VerdictOptions(target=0.8))
    runs = config_runs.configuration_runs(mlflow_uri, parent)
    ordered = [r.name for r in sorted(runs, key=lambda r: r.tags["sweeplab.verdict_order"])]
    groups = {r.name: r.tags["sweeplab.verdict_order"].split()[0] for r in runs}
    for group in set(groups.values()):
        names = [n for n in ordered if groups[n] == group]
        assert names == sorted(names, key=config_runs.natural_key), names
    assert len({r.tags["caveat"] for r in runs}) == 1
    parent_tags = MlflowClient(mlflow_uri).get_run(parent).data.tags
    assert parent_tags["caveats"] == runs[0].tags["caveat"] or runs[0].tags["caveat"] == "none"


def test_bounds_too_wide_to_mean_anything_are_not_logged_as_metrics():
    from sweeplab.study.verdict import Estimate, Interval

    wide = Estimate(1.14, Interval(1e-20, 6.12e24, 0.99), 2)
    sane = Estimate(1.14, Interval(0.9, 1.4, 0.99), 3)
    assert config_runs._bounds("speedup", wide) == {"speedup": 1.14}
    assert config_runs._bounds("speedup", sane) == {"speedup": 1.14, "speedup_low": 0.9, "speedup_high": 1.4}


def test_the_spread_view_draws_every_replicate_by_step_and_hides_every_other_metric():
    state = saved_view.spread_state("tags.x = 'y'", "val/cos", ["val/cos", "train/loss", "summary/samples_per_sec"])
    (line,) = [c for c in state["compareRunCharts"] if not c["deleted"]]
    assert line["type"] == "LINE" and line["selectedMetricKeys"] == ["val/cos"] and line["xAxisKey"] == "step"
    assert {c["metricKey"] for c in state["compareRunCharts"] if c["deleted"]} == {"train/loss",
                                                                                   "summary/samples_per_sec"}
    # every replicate drawn (MLflow shows the first 10 rows' runs unless told), no group (its band's colour would be
    # MLflow's hash of the group's name, not the configuration's)
    assert state["runsHiddenMode"] == "SHOW_ALL" and "groupBy" not in state
    assert state["searchFilter"] == "tags.x = 'y'" and state["runListHidden"] is True
    assert saved_view.spread_view_id("abc") == "sweeplab-abc-spread" != saved_view.view_id("abc")


def test_the_spread_view_shows_each_job_in_its_configurations_colour_and_the_target_once(mlflow_uri, monkeypatch):
    parent, client, experiment_id = _reported_sweep(mlflow_uri)
    name, state = saved_view.read_view(mlflow_uri, experiment_id, saved_view.spread_view_id(parent))
    assert name.endswith(": val/cos of every replicate")
    # MLflow adds a chart for every metric its runs log that no card names: the target's median-curve keys too
    hidden = {c["metricKey"] for c in state["compareRunCharts"] if c["deleted"]}
    assert {"median val/cos", "training seconds"} <= hidden and "val/cos" not in hidden
    configurations = {r.tags["config"]: r for r in config_runs.configuration_runs(mlflow_uri, parent)}
    jobs = mlflow_store.sweep_jobs(mlflow_uri, parent)
    (target,) = runs_module.children(mlflow_uri, parent, None, "target")
    shown = client.search_runs([experiment_id], state["searchFilter"])
    # the view's filter finds the jobs and the target's line, not the configuration runs (no second legend entry)
    assert {r.info.run_id for r in shown} == {j.info.run_id for j in jobs} | {target.run_id}
    for job in jobs:
        configuration = configurations[job.data.tags["config"]]
        assert job.data.tags["mlflow.runColor"] == configuration.tags["mlflow.runColor"]
        assert job.data.tags["sweeplab.spread_line"] == configuration.name
    assert len({configurations[j.data.tags["config"]].tags["mlflow.runColor"] for j in jobs}) == len(configurations)
    # the target under the jobs' own metric, from their first validation step to their last
    job_steps = {m.step for j in jobs for m in client.get_metric_history(j.info.run_id, "val/cos")}
    line = client.get_metric_history(target.run_id, "val/cos")
    assert {m.value for m in line} == {0.8}
    assert sorted(m.step for m in line) == [min(job_steps), max(job_steps)]
    url = ui_links.spread_url(mlflow_uri, "http://ui", parent)
    assert url == (f"http://ui/#/experiments/{experiment_id}/runs?workflowType=machine_learning&viewStateShareKey="
                   f"sweeplab-{parent}-spread&compareRunsMode=CHART")
    from sweeplab import ui  # make ui prints it under the comparison's address

    found = ui.find_url(mlflow_uri, "http://ui", parent)
    assert found[2] == url and ui.sweep_line(mlflow_uri, "http://ui", found).splitlines()[-1].endswith(url)
    monkeypatch.setenv("SWEEPLAB_UI_URL", "http://ui")  # the sweep's closing lines, where the UI's address is known
    assert ui_links.sweep_line(mlflow_uri, parent).splitlines() == [
        f"the comparison in the MLflow UI: {ui_links.sweep_url(mlflow_uri, 'http://ui', parent)}",
        f"every replicate's curve (the spread): {url}"]
