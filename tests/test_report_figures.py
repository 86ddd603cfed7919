"""The verdict's pictures (speed-quality plane, metric against training time) and its MLflow view (one run per
configuration under the sweep run, the verdict as the sweep run's description), from synthetic sweeps."""

from __future__ import annotations

import math

import numpy as np
import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from sweeplab.report import config_runs, ui_links
from sweeplab.report import figures as report_figures
from sweeplab.report import tables as report
from sweeplab.study.record import VerdictOptions
from sweeplab.study.sweep import read_experiment
from sweeplab.study.verdict import Job, summarize
from sweeplab.tracking import mlflow_store, naming

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SAMPLES = np.arange(1000, 20_001, 1000)


def curve(scale: float, plateau: float = 0.9) -> list[tuple[float, float]]:
    return list(zip(SAMPLES.tolist(), (plateau * (1 - np.exp(-SAMPLES / scale))).tolist()))


def synthetic_jobs(replicates: int = 3) -> list[Job]:
    """Three configurations: the baseline, one twice as fast at the same curve, one as fast as the baseline that
    needs more samples and ends lower."""
    jobs = []
    for r in range(replicates):
        drift = 1.0 + 0.05 * r
        for name, rate, scale, plateau in (("data.batch_size=32 loss.alpha=0.7", 100.0, 4000.0, 0.9),
                                           ("data.batch_size=64 loss.alpha=0.7", 200.0, 4000.0, 0.9),
                                           ("data.batch_size=32 loss.alpha=0.3", 100.0, 7000.0, 0.85)):
            points = curve(scale * (1 + 0.03 * r), plateau)
            jobs.append(Job(name, r, r, rate * drift * (1 + 0.01 * r), points[-1][1], points))
    return jobs


def test_the_pareto_front_is_the_set_no_other_beats_on_both():
    # time to target (lower is faster) and a metric to maximise
    points = {"a": (10.0, 0.80), "b": (20.0, 0.90), "c": (15.0, 0.70), "d": (30.0, 0.85), "e": (math.inf, 0.95),
              "f": (10.0, 0.80), "g": (12.0, math.nan)}
    assert report_figures.pareto_front(points, True, True) == {"a", "f", "b", "e"}  # a and f alike: both stay
    # the same points read the other way round on both axes (slower and worse preferred): another front
    assert report_figures.pareto_front(points, False, False) == {"c", "d", "e"}
    # samples/s (higher is faster) and a metric to minimise
    rates = {"x": (100.0, 0.30), "y": (200.0, 0.40), "z": (150.0, 0.50), "w": (50.0, 0.29)}
    assert report_figures.pareto_front(rates, False, False) == {"x", "y", "w"}


def test_both_pictures_are_written_from_a_replicated_summary(tmp_path):
    summary = summarize(synthetic_jobs(), baseline="data.batch_size=32 loss.alpha=0.7", target=0.8,
                        metric_name="val/cos")
    assert summary.verdict.fastest == ("data.batch_size=64 loss.alpha=0.7",)
    files = report_figures.write_figures(summary, tmp_path, {"loss.alpha": "α"})
    assert [f.name for f in files] == ["speed_quality.png", "curves.png"]
    for path in files:
        assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 20_000


def test_open_ended_intervals_and_unreached_targets_are_drawn(tmp_path):
    """A configuration that never reaches the target (infinite median and interval), one that reaches it in one
    replicate of three, and one with a single job (no interval on either axis)."""
    jobs = synthetic_jobs()
    jobs += [Job("never", r, r, 120.0, 0.5, curve(4000.0, 0.5)) for r in range(3)]
    jobs += [Job("once", r, r, 90.0, 0.79 + 0.02 * (r == 0), curve(4000.0, 0.79 + 0.02 * (r == 0))) for r in range(3)]
    jobs += [Job("single", 0, 0, 150.0, 0.9, curve(4000.0))]
    summary = summarize(jobs, baseline="data.batch_size=32 loss.alpha=0.7", target=0.8, metric_name="val/cos")
    assert math.isinf(summary.config("never").time_to_target.point)
    assert math.isinf(summary.config("once").time_to_target.interval.high)
    assert math.isinf(summary.config("single").final_metric.interval.high)
    names = naming.configuration_run_names([c.config for c in summary.configs])
    for draw, name in ((report_figures.speed_quality_plot, "plane.png"), (report_figures.curves_plot, "curves.png")):
        assert draw(summary, names, tmp_path / name).stat().st_size > 20_000
    # no configuration reaches the target: the plane falls back to samples/s
    unreachable = summarize(synthetic_jobs(), baseline="data.batch_size=32 loss.alpha=0.7", target=0.99)
    assert report_figures.speed_figure(unreachable) == "samples_per_sec"
    assert report_figures.speed_quality_plot(unreachable, names, tmp_path / "rates.png").stat().st_size > 20_000


def test_one_replicate_or_no_summary_gives_no_pictures(tmp_path):
    one = summarize(synthetic_jobs(replicates=1), baseline="data.batch_size=32 loss.alpha=0.7", target=0.8)
    assert report_figures.write_figures(one, tmp_path) == []
    assert report_figures.write_figures(None, tmp_path) == []
    assert list(tmp_path.iterdir()) == []


def test_the_band_is_median_and_range_over_the_replicates_present_where_half_of_them_are():
    # the same curve in samples, at 100, 200 and 250 samples/s: validations at 10..100 s, 5..50 s and 4..40 s
    points = [(1000.0 * k, 0.1 * k) for k in range(1, 11)]
    slow, fast, faster = (Job("c", r, r, rate, 1.0, points) for r, rate in enumerate((100.0, 200.0, 250.0)))
    grid, median, low, high = report_figures.replicate_band([slow, fast, faster], points=5)
    assert grid[0] == pytest.approx(4.0) and grid[-1] == pytest.approx(100.0)  # every replicate's span
    shown = np.isfinite(median)
    # two of three (at least half) from the second one's first validation to the second fastest's last
    assert grid[shown][0] == pytest.approx(5.0) and grid[shown][-1] == pytest.approx(50.0)
    at_40 = int(np.flatnonzero(np.isclose(grid, 40.0))[0])
    # samples seen by 40 s: 4000, 8000, 10000
    assert (median[at_40], low[at_40], high[at_40]) == pytest.approx((np.median([0.4, 0.8, 1.0]), 0.4, 1.0))
    at_50 = int(np.flatnonzero(np.isclose(grid, 50.0))[0])  # the fastest has stopped: the two present
    assert (median[at_50], low[at_50], high[at_50]) == pytest.approx((0.75, 0.5, 1.0))
    assert not np.isfinite(median[grid > 50.0]).any()  # the slowest alone: its own thin line only
    # past 40 s the fastest has stopped: the median of the other two is a new piece, a gap before it, no jump
    gap = int(np.flatnonzero(np.isnan(median) & (grid > 40.0))[0])
    assert grid[gap] == grid[gap + 1] == pytest.approx(45.0) and median[gap - 1] == median[at_40]
    # replicates that share no time (0.001..0.01 s and 10..100 s): with two, one is half, so the median follows
    # whichever is present, and breaks where neither is
    grid, median, _, _ = report_figures.replicate_band([slow, Job("c", 3, 3, 1e6, 1.0, points)])
    assert np.array_equal(np.isfinite(median), (grid <= 0.01) | (grid >= 10.0))
    assert report_figures.replicate_band([Job("c", 0, 0, 100.0, None, [])]) is None  # no validation at all


def smoke_study_jobs() -> list[Job]:
    """A debug=smoke study as a loaded host runs it: 20 steps, a validation every 10 (two per job), batch sizes 4
    and 16, two replicates each, whose throughput differs by up to 3x between replicates (no time shared by both
    replicates of a configuration)."""
    jobs = []
    for batch_size, rates in ((4, (40.0, 120.0)), (16, (150.0, 60.0))):
        for replicate, rate in enumerate(rates):
            curve = [(10.0 * batch_size, 0.30 + 0.01 * replicate), (20.0 * batch_size, 0.42 + 0.01 * replicate)]
            jobs.append(Job(f"data.batch_size={batch_size}", replicate, replicate, rate, curve[-1][1], curve))
    return jobs


def test_a_short_studys_curves_cover_most_of_the_time_axis(tmp_path, monkeypatch):
    """The curves of a smoke study: each configuration's replicates and its median drawn (lines of two points or
    more, not empty ones), and together they cover most of the x range plotted."""
    from matplotlib.figure import Figure

    saved = []
    real_savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (saved.append(fig), real_savefig(fig, *a, **k))[1])
    summary = summarize(smoke_study_jobs(), baseline="data.batch_size=4", target=0.4, metric_name="val/cos")
    names = naming.configuration_run_names([c.config for c in summary.configs], {"data.batch_size": "bs"})
    report_figures.curves_plot(summary, names, tmp_path / "curves.png")
    ax = saved[0].axes[0]
    drawn = []  # (label, x of the finite points) of every curve that draws something
    for line in ax.get_lines():
        if line.get_label().startswith("target"):  # axhline: its x is in axes units
            continue
        x, y = (np.asarray(a, dtype=float) for a in line.get_data())
        finite = np.isfinite(x) & np.isfinite(y)
        if finite.sum() >= 2 and np.ptp(x[finite]) > 0:
            drawn.append((line.get_label(), x[finite]))
    medians = {label: x for label, x in drawn if label.startswith("bs=")}
    assert set(medians) == {"bs=4 (n=2), baseline", "bs=16 (n=2)"}
    thin = [x for label, x in drawn if label.startswith("_")]  # matplotlib's unlabelled lines: the replicates
    assert len(thin) == 4
    left, right = ax.get_xlim()
    covered = np.zeros(1000, dtype=bool)
    axis = np.linspace(left, right, covered.size)
    for _, x in drawn:
        covered |= (axis >= x.min()) & (axis <= x.max())
    assert covered.mean() >= 0.8, f"lines over {covered.mean():.0%} of the x range"
    for label, x in medians.items():  # each median over the whole span of its replicates (two: one is half)
        config = "data.batch_size=" + label.split()[0].removeprefix("bs=")
        times = [t for job in summary.jobs_at_target if job.job.config == config
                 for t in report_figures.replicate_curves([job.job])[0][0]]
        assert (x.min(), x.max()) == pytest.approx((min(times), max(times)))


def test_configuration_run_names_are_short_and_read_back_to_the_swept_values():
    keys = ["data.batch_size=64 loss.alpha=0.7", "data.batch_size=32 loss.alpha=0.75"]
    assert naming.configuration_run_names(keys, {"loss.alpha": "α"}) == {keys[0]: "bs=64 α=0.7", keys[1]: "bs=32 α=0.75"}
    assert naming.config_values(keys[0]) == {"data.batch_size": "64", "loss.alpha": "0.7"}
    clash = ["model.alpha=1 loss.alpha=2", "model.alpha=1 loss.alpha=2.0"]  # both read alpha=1 alpha=2
    assert naming.configuration_run_names(clash) == {k: k for k in clash}
    assert naming.config_values(naming.NO_SWEPT_KEY) == {}


# --- MLflow --------------------------------------------------------------------------------------------------------


def recorded_sweep(uri: str, jobs: list[Job]) -> str:
    """A sweep's parent run and one finished run per job (as the sweeplab sweeper tags them), no training."""
    experiment_id = mlflow_store.init_store(uri, "sweeplab")
    client = MlflowClient(uri)
    parent = client.create_run(experiment_id, tags={"sweeplab.role": "sweep", "sweep_overrides": "sweep=default",
                                                    "sweep_id": "t"}).info.run_id
    configs = list(dict.fromkeys(j.config for j in jobs))
    for job in jobs:
        tags = {"mlflow.parentRunId": parent, "family": "textbridge", "config": job.config,
                "replicate": str(job.replicate), "round": str(job.round), "config_index": str(configs.index(job.config))}
        run_id = client.create_run(experiment_id, tags=tags).info.run_id
        start = client.get_run(run_id).info.start_time
        metrics = [Metric("summary/samples_per_sec", job.samples_per_sec, start, 0)]
        metrics += [Metric("val/cos", value, start + int(samples), int(samples) // 10 - 1)  # 1 s per 1000 samples
                    for samples, value in job.curve[::4]]
        client.log_batch(run_id, metrics=metrics, params=[Param("data.batch_size", "10")])  # 10 samples a step
        client.set_terminated(run_id, "FINISHED")
    return parent


def test_configuration_runs_hold_the_aggregates_under_the_sweep_run_and_are_replaced_on_a_rerun(mlflow_uri, tmp_path):
    jobs = synthetic_jobs()
    parent = recorded_sweep(mlflow_uri, jobs)
    options = VerdictOptions(target=0.8)
    first = report.sweep_report(mlflow_uri, parent, tmp_path / "out", options=options)
    assert {"speed_quality.png", "curves.png"} <= {p.name for p in first.files}
    runs = {r.tags["config"]: r for r in config_runs.configuration_runs(mlflow_uri, parent)}
    assert set(runs) == {j.config for j in jobs}
    fast = runs["data.batch_size=64 loss.alpha=0.7"]
    assert fast.tags["mlflow.parentRunId"] == parent and fast.tags["sweeplab.role"] == "configuration"
    assert fast.tags["mlflow.runName"] == "bs=64 α=0.7" and fast.tags["verdict"] == "fastest"
    assert fast.params == {"data.batch_size": "64", "loss.alpha": "0.7"}
    summary = first.verdict.summary.config("data.batch_size=64 loss.alpha=0.7")
    metrics = fast.metrics
    assert metrics["speedup"] == pytest.approx(summary.speedup.point)
    assert metrics["speedup_low"] < metrics["speedup"] < metrics["speedup_high"]
    assert metrics["time_to_target_s"] == pytest.approx(summary.time_to_target.point)
    for name in ("samples_per_sec_low", "samples_to_target_high", "speedup_to_target_low", "final_val_cos",
                 "quality_delta_high", "jobs", "target"):
        assert name in metrics, name
    assert runs["data.batch_size=32 loss.alpha=0.7"].tags["baseline"] == "true"
    assert len(fast.tags["job_run_ids"].split(",")) == 3
    # the jobs stay the sweep's jobs: the report, the job counts and best_* read them, not the configuration runs
    job_runs = mlflow_store.sweep_jobs(mlflow_uri, parent)
    assert len(job_runs) == len(jobs) and all("replicate" in r.data.tags for r in job_runs)
    assert len(read_experiment(mlflow_uri, "sweeplab").jobs) == len(jobs)
    url = ui_links.latest_sweep_url(mlflow_uri, "http://ui")  # make ui opens the configuration runs' saved view
    assert f"viewStateShareKey=sweeplab-{parent}" in url  # its filter and sort: tests/test_ui_view.py
    description = MlflowClient(mlflow_uri).get_run(parent).data.tags["mlflow.note.content"]
    assert description.startswith(f"**{first.verdict.lines[0]}**")
    assert description.endswith("`python -m sweeplab.train -m sweep=default`")

    second = report.sweep_report(mlflow_uri, parent, None, options=VerdictOptions(target=0.7))
    again = config_runs.configuration_runs(mlflow_uri, parent)
    assert len(again) == 3 and not {r.run_id for r in again} & {r.run_id for r in runs.values()}
    assert {r.metrics["target"] for r in again} == {0.7}
    assert second.verdict.summary.configs[0].jobs == 3  # the configuration runs did not join the jobs


def test_the_compare_view_of_the_configuration_runs_opens_on_a_figure_that_differs_between_them(mlflow_uri):
    # MLflow's compare view opens its parallel-coordinates plot on the first metric the runs share, in the order the
    # server returns the first run's metrics (the order they were logged in): not the target nor the job count
    parent = recorded_sweep(mlflow_uri, synthetic_jobs())
    report.sweep_report(mlflow_uri, parent, None, options=VerdictOptions(target=0.8))
    client = MlflowClient(mlflow_uri)
    runs = [client.get_run(r.run_id).data.metrics for r in config_runs.configuration_runs(mlflow_uri, parent)]
    opened_on = next(key for key in runs[0] if all(key in metrics for metrics in runs))
    assert opened_on == "speedup_to_target"
    assert len({metrics[opened_on] for metrics in runs}) == len(runs) == 3


def test_a_sweep_with_one_replicate_gets_its_verdict_line_as_description_and_no_configuration_runs(mlflow_uri):
    parent = recorded_sweep(mlflow_uri, synthetic_jobs(replicates=1))
    found = report.sweep_report(mlflow_uri, parent, None)
    assert config_runs.configuration_runs(mlflow_uri, parent) == []
    description = MlflowClient(mlflow_uri).get_run(parent).data.tags["mlflow.note.content"]
    assert description.startswith("**one replicate: no verdict") and found.verdict.lines[0] in description


def test_point_labels_never_overlap_their_own_interval_bars(tmp_path, monkeypatch):
    """Every label of speed_quality.png, drawn, lies clear of its own point's two bars and their end marks."""
    from matplotlib.figure import Figure

    saved = []
    real_savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (saved.append(fig), real_savefig(fig, *a, **k))[1])
    summary = summarize(synthetic_jobs(replicates=4), baseline="data.batch_size=32 loss.alpha=0.7", target=0.8,
                        metric_name="val/cos")
    report_figures.write_figures(summary, tmp_path, {"loss.alpha": "α", "data.batch_size": "bs"})
    fig = saved[0]
    ax = fig.axes[0]
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    labels = [t for t in ax.texts if hasattr(t, "xy")]
    assert len(labels) == len(summary.configs)
    for text in labels:
        x, y = text.xy
        box = text.get_window_extent(renderer)
        own = [line for line in ax.lines if (list(line.get_xdata()) in ([x, x], [x]) or
                                             list(line.get_ydata()) in ([y, y], [y]))]
        assert len(own) >= 2, text.get_text()  # its bars and end marks were found
        for line in own:
            assert not box.overlaps(line.get_window_extent(renderer)), (text.get_text(), line.get_xydata())


def test_a_configuration_run_lasts_as_long_as_its_jobs_together():
    """Not the milliseconds of writing it (MLflow's "Duration 30ms"): from its first job's start, their summed time."""
    from types import SimpleNamespace

    def job(start, end):
        return SimpleNamespace(start_ms=start, end_ms=end)

    assert config_runs.run_span([job(10_000, 70_000), job(200_000, 230_000), job(5_000, None)]) == (10_000, 100_000)
    assert config_runs.run_span([]) == (None, None)
