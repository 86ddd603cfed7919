"""The verdict's pictures, written beside report.md from the sweep's summary (sweeplab.study.verdict.SweepSummary).

- speed_quality.png, the speed-quality plane: one point per configuration at (median time to target, median final
  metric), or (median samples/s, median final metric) when no configuration's median reaches the target, with the
  95 % intervals of both medians as bars. A bar whose interval goes beyond the plotted range, or has no bound on a
  side (a replicate that never reached the target, too few replicates), runs to the plot's edge and ends in an
  arrowhead there; a configuration whose median never reached the target sits at the right edge, hollow. The Pareto
  front (point estimates: no other configuration is at least as fast and at least as good, and better in one of the
  two) is joined by a dashed line; the verdict's fastest configuration (or its tie) is ringed; the baseline is named.
- curves.png: the monitored metric against training time (a validation's samples seen ÷ its job's samples/s: the
  clock of time to target, validation and checkpoint pauses excluded). Each replicate is a thin line over its own
  span (linear between its validations, a dot at each); each configuration's median over its replicates is the
  thick line, on a common grid over the times at least half of its replicates cover, with a band from the lowest to
  the highest replicate present there (a new piece where a replicate starts or ends, not a vertical jump). A short study (two validations per job, replicates at different speeds on a
  loaded host) shares little or no time between all its replicates: the curves stay readable whatever it covers.
  The target is a dashed horizontal line; the x axis spans the validations (not from 0).

Configurations are named by their swept values with short labels (`bs=64 α=0.7`, as run names are). With one
replicate per configuration, or no summary, there are no pictures. Matplotlib's object API with the Agg canvas: no
pyplot, no display, nothing global changes.
"""

from __future__ import annotations

import logging
import math
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from sweeplab.core.errors import UserError
from sweeplab.families import get_family
from sweeplab.report import plots
from sweeplab.report.plots import _figure, save_figure
from sweeplab.study.sweep import Sweep
from sweeplab.study.verdict import ConfigSummary, Estimate, Job, SweepSummary, pareto_front
from sweeplab.tracking import naming

log = logging.getLogger(__name__)

SPEED_QUALITY, CURVES = "speed_quality.png", "curves.png"
GRID_POINTS = 200
POINT_LABEL_CHARS = 22  # beyond this a point's label is cut (the legend has the whole name)
EDGE_ROOM = 0.06  # share of an axis left free beyond the outermost point or bound
REACH = 2.0  # interval bounds further than this many point spans from the points are drawn as going beyond the plot


def family_labels(sweep: Sweep) -> dict[str, str]:
    """The short labels of the config keys of the families the sweep's jobs trained (sweeplab.core.labels)."""
    labels: dict[str, str] = {}
    for name in sorted(set(sweep.families) - {""}):
        try:
            labels.update({k: v for k, v in get_family(name).labels.items() if k not in labels})
        except UserError:  # the family is not installed where the report runs: the keys' last parts
            continue
    return labels


def write_figures(summary: SweepSummary | None, out_dir: Path, labels: Mapping[str, str] | None = None) -> list[Path]:
    """speed_quality.png and curves.png in `out_dir`; none with one replicate or no summary. A figure that cannot be
    drawn is left out with a warning: the tables are the report."""
    if summary is None or max(c.jobs for c in summary.configs) <= 1:
        return []
    names = naming.configuration_run_names([c.config for c in summary.configs], labels)
    files = []
    for draw, file_name in ((speed_quality_plot, SPEED_QUALITY), (curves_plot, CURVES)):
        try:
            files.append(draw(summary, names, out_dir / file_name))
        except Exception as exc:  # a picture is a convenience
            log.warning("%s skipped: %s", file_name, exc)
    return files


# --- the speed-quality plane ---------------------------------------------------------------------------------------


def speed_figure(summary: SweepSummary) -> str:
    """"time_to_target" when some configuration's median reaches the target, else "samples_per_sec"."""
    reached = any(math.isfinite(c.time_to_target.point) for c in summary.configs)
    return "time_to_target" if reached else "samples_per_sec"


def _colors(count: int) -> list:
    return plots.colors(count)


def _limits(points: Sequence[float], bounds: Sequence[float], log_scale: bool) -> tuple[float, float]:
    """The plotted range: every finite point, and the finite bounds within REACH spans of them, with a little room;
    on a log axis in log space (non-positive values left out). The span: the points' spread, or the median width
    of their intervals where that is larger (points alike, intervals wide), or 5 % of the value (all exact)."""
    to_axis = np.log10 if log_scale else (lambda v: v)
    usable = [v for v in points if math.isfinite(v) and (v > 0 or not log_scale)]
    if not usable:
        return (1.0, 10.0) if log_scale else (0.0, 1.0)
    values = np.asarray(to_axis(np.asarray(usable, dtype=float)))
    low, high = float(values.min()), float(values.max())
    near = [float(to_axis(b)) for b in bounds if math.isfinite(b) and (b > 0 or not log_scale)]
    widths = [abs(b - float(np.median(values))) for b in near]
    span = max(high - low, float(np.median(widths)) if widths else 0.0, 0.05 * abs(high), 1e-6)
    near = [b for b in near if low - REACH * span <= b <= high + REACH * span]
    low, high = min([low, *near]), max([high, *near])
    room = EDGE_ROOM * max(high - low, span)
    low, high = low - room, high + room
    return (10.0**low, 10.0**high) if log_scale else (low, high)


CAP_POINTS = 8  # an interval bar's end mark, in points (its arrowhead: one less)
LABEL_GAP_POINTS = 4  # between a bar's end mark and a point's label


def _bar(ax, fixed: float, estimate: Estimate, limits: tuple[float, float], vertical: bool, color) -> None:
    """The interval of `estimate` along one axis at `fixed` on the other; a side beyond `limits` (or unbounded)
    ends at the edge in an arrowhead."""
    low, high = estimate.interval.low, estimate.interval.high
    if math.isnan(low) or math.isnan(high):
        return
    start, end = max(low, limits[0]), min(high, limits[1])
    line = ([fixed, fixed], [start, end]) if vertical else ([start, end], [fixed, fixed])
    ax.plot(*line, color=color, linewidth=1.4, alpha=0.8, zorder=2)
    for value, clipped, heads in ((start, low < limits[0], "v<"), (end, high > limits[1], "^>")):
        xy = (fixed, value) if vertical else (value, fixed)
        if clipped:
            ax.plot(*xy, marker=heads[0] if vertical else heads[1], color=color, markersize=CAP_POINTS - 1, zorder=3,
                    clip_on=False)
        else:
            ax.plot(*xy, marker="_" if vertical else "|", color=color, markersize=CAP_POINTS, zorder=3)


def _point_label(name: str) -> str:
    return name if len(name) <= POINT_LABEL_CHARS else name[: POINT_LABEL_CHARS - 1] + "…"


def _x_scale(speed: Mapping[str, Estimate]) -> bool:
    """A log speed axis when the points span more than a factor of 10 (ratios then read evenly), else linear."""
    values = [e.point for e in speed.values() if 0 < e.point < math.inf]
    return bool(values) and max(values) / min(values) > 10


def speed_quality_plot(summary: SweepSummary, names: Mapping[str, str], out: Path) -> Path:
    """The speed-quality plane (see the module's docstring)."""
    from matplotlib.ticker import LogLocator, NullFormatter, StrMethodFormatter

    by_time = speed_figure(summary) == "time_to_target"
    speed = {c.config: c.time_to_target if by_time else c.samples_per_sec for c in summary.configs}
    quality = {c.config: c.final_metric for c in summary.configs}
    log_x = _x_scale(speed)
    reached = [e for e in speed.values() if math.isfinite(e.point)]  # the others get no speed bar
    xlim = _limits([e.point for e in reached], [b for e in reached for b in (e.interval.low, e.interval.high)],
                   log_scale=log_x)
    ylim = _limits([e.point for e in quality.values()],
                   [b for e in quality.values() for b in (e.interval.low, e.interval.high)], log_scale=False)
    fig = _figure(9.5, 5.8)
    ax = fig.add_subplot()
    if log_x:
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    _plane_front(ax, summary, speed, quality, by_time, xlim)
    for index, (config, color) in enumerate(zip(summary.configs, _colors(len(summary.configs)))):
        _plane_point(ax, config, (speed[config.config], quality[config.config]), names[config.config], color,
                     (xlim, ylim), summary.baseline, below=index % 2 == 1)
    _plane_verdict(ax, summary, speed, quality, xlim)
    metric, sign = summary.metric_name, "≥" if summary.mode == "max" else "≤"
    ax.set_xlabel("time to target (s of training: samples to target ÷ samples/s); faster ←" if by_time else
                  "samples/s (no configuration's median reaches the target); faster →")
    ax.set_ylabel(f"final {metric} ({'higher' if summary.mode == 'max' else 'lower'} is better)")
    ax.set_title(f"Speed and quality per configuration: medians with 95 % intervals over the replicates "
                 f"(target {metric} {sign} {summary.target:.4g})", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.supxlabel("\n".join(textwrap.wrap(PLANE_CAPTION, 150)), fontsize=7)
    save_figure(fig, out)
    return out


PLANE_CAPTION = (
    "Bars: 95 % t intervals of the medians. An arrowhead at an edge: the interval goes on beyond the plot, or has no "
    "bound on that side (a replicate never reached the target, or too few replicates). ▷ at the right edge: the "
    "median never reached the target. Pareto front (grey squares, dashed): on the point estimates, no other "
    "configuration is at least as fast and at least as good, and better in one of the two."
)


def _plane_point(ax, config: ConfigSummary, estimates: tuple[Estimate, Estimate], name: str, color,
                 limits: tuple[tuple[float, float], tuple[float, float]], baseline: str, below: bool) -> None:
    """One configuration: its point, its two interval bars and its short name (above the point, or `below` it:
    every other one, so neighbours' names do not overprint); a median that never reached the target is a hollow ▷
    at the right edge, without a speed bar (its interval has no upper bound)."""
    (speed, quality), (xlim, ylim) = estimates, limits
    reached = math.isfinite(speed.point)
    x = speed.point if reached else xlim[1]
    y = quality.point if math.isfinite(quality.point) else sum(ylim) / 2
    if reached:
        _bar(ax, y, speed, xlim, vertical=False, color=color)
    _bar(ax, x, quality, ylim, vertical=True, color=color)
    shown = f"{name} (n={config.jobs})" + (", baseline" if config.config == baseline else "")
    ax.scatter([x], [y], s=60 if reached else 80, marker="o" if reached else ">", color=color if reached else "white",
               edgecolors=color, linewidths=1.8, zorder=4, label=shown, clip_on=False)
    right_side = ax.transAxes.inverted().transform(ax.transData.transform((x, y)))[0] > 0.7  # text to the left
    text = _point_label(name) + (" (baseline)" if config.config == baseline else "")
    # In the quadrant beside the point, clear of both bars and their end marks (half a cap: CAP_POINTS / 2): the
    # text's box, descenders included, starts LABEL_GAP_POINTS beyond them on both axes.
    gap = CAP_POINTS / 2 + LABEL_GAP_POINTS
    ax.annotate(text, (x, y), xytext=(-gap if right_side else gap, -gap if below else gap), textcoords="offset points",
                fontsize=7, color="0.15", ha="right" if right_side else "left", va="top" if below else "bottom")


def _plane_front(ax, summary: SweepSummary, speed: Mapping[str, Estimate], quality: Mapping[str, Estimate],
                 by_time: bool, xlim: tuple[float, float]) -> None:
    """The Pareto front: grey squares behind its points, joined by a dashed line in order of speed."""
    points = {name: (speed[name].point, quality[name].point) for name in speed}
    front = pareto_front(points, lower_speed_is_better=by_time, higher_quality_is_better=summary.mode == "max")
    placed = sorted((min(points[n][0], xlim[1]), points[n][1]) for n in front)
    if placed:
        ax.plot(*zip(*placed), linestyle="--", color="0.45", linewidth=1.0, marker="s", markersize=14,
                markerfacecolor="0.85", markeredgecolor="0.55", zorder=1, label="Pareto front (point estimates)")


def _plane_verdict(ax, summary: SweepSummary, speed: Mapping[str, Estimate], quality: Mapping[str, Estimate],
                   xlim: tuple[float, float]) -> None:
    """The verdict's fastest configuration, or its tie, ringed."""
    verdict = summary.verdict
    if verdict.fastest:
        ringed = [(min(speed[n].point, xlim[1]), quality[n].point) for n in verdict.fastest]
        label = "verdict: fastest" if verdict.kind == "fastest" else "verdict: tied for fastest (not ranked)"
        ax.scatter(*zip(*ringed), s=240, facecolors="none", edgecolors="black", linewidths=1.6, zorder=5, label=label,
                   clip_on=False)


# --- the metric against training time -----------------------------------------------------------------------------


def replicate_curves(jobs: Sequence[Job]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each job's (training times, metric values) at its validations, in order: samples seen ÷ the job's samples/s.
    A job without a validation (or without a throughput) has none."""
    curves = []
    for job in jobs:
        validations = job.validation_points()
        if validations and job.samples_per_sec > 0:
            curves.append((np.array([p.samples_seen / job.samples_per_sec for p in validations], dtype=float),
                           np.array([p.value for p in validations], dtype=float)))
    return curves


def replicate_band(jobs: Sequence[Job], points: int = GRID_POINTS) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                            np.ndarray] | None:
    """(time grid, median, lowest, highest) of the jobs' metric against training time, each job linear between its
    validations and present from its first to its last. The grid spans every job's times (and holds each
    validation's time); at a time fewer than half of the jobs cover (ceil(n / 2)) the three are NaN, elsewhere they
    are over the jobs present there. Where the jobs present change (one starts or ends), a NaN point is inserted
    (at the next time): a median of other jobs is drawn as a new piece, not joined to the last by a vertical jump.
    None when no job has a validation."""
    curves = replicate_curves(jobs)
    if not curves:
        return None
    start, end = min(t[0] for t, _ in curves), max(t[-1] for t, _ in curves)
    grid = np.unique(np.concatenate([np.linspace(start, end, points), *(t for t, _ in curves)]))
    values = np.vstack([np.where((grid >= t[0]) & (grid <= t[-1]), np.interp(grid, t, v), np.nan) for t, v in curves])
    present = np.isfinite(values).sum(axis=0)
    enough = present >= math.ceil(len(curves) / 2)
    shown = values[:, enough]
    median, low, high = (np.full(grid.shape, np.nan) for _ in range(3))
    median[enough] = np.nanmedian(shown, axis=0)
    low[enough], high[enough] = np.nanmin(shown, axis=0), np.nanmax(shown, axis=0)
    covered = np.isfinite(values)
    changes = np.flatnonzero(enough[1:] & enough[:-1] & np.any(covered[:, 1:] != covered[:, :-1], axis=0)) + 1
    return (np.insert(grid, changes, grid[changes]),
            *(np.insert(a, changes, np.nan) for a in (median, low, high)))


def curves_plot(summary: SweepSummary, names: Mapping[str, str], out: Path) -> Path:
    """The monitored metric against training time per configuration (see the module's docstring)."""
    jobs: dict[str, list[Job]] = {c.config: [] for c in summary.configs}
    for at_target in summary.jobs_at_target:
        jobs[at_target.job.config].append(at_target.job)
    fig = _figure(9.5, 5.2)
    ax = fig.add_subplot()
    for config, color in zip(summary.configs, _colors(len(summary.configs))):
        curves = replicate_curves(jobs[config.config])
        if not curves:
            continue
        label = f"{names[config.config]} (n={len(jobs[config.config])})"
        if config.config == summary.baseline:
            label += ", baseline"
        for times, values in curves:
            ax.plot(times, values, color=color, linewidth=0.8, alpha=0.55, marker=".", markersize=4)
        grid, median, low, high = replicate_band(jobs[config.config])
        drawn = np.isfinite(median)
        ax.fill_between(grid, low, high, where=drawn, color=color, alpha=0.15, linewidth=0)
        # a median present at isolated grid times only (no two neighbours) would draw nothing: a marker shows it
        ax.plot(grid, median, color=color, linewidth=2.0, label=label,
                marker="o" if not np.any(drawn[1:] & drawn[:-1]) else None)
    ax.plot([], [], color="0.4", linewidth=0.8, alpha=0.55, marker=".", markersize=4, label="one replicate (thin)")
    sign = "≥" if summary.mode == "max" else "≤"
    ax.axhline(summary.target, linestyle="--", color=plots.TARGET_COLOR, linewidth=1.0,
               label=f"target {summary.metric_name} {sign} {summary.target:.4g}")
    ax.set_xlabel("training time (s): samples seen ÷ the job's samples/s (validation and checkpoint pauses excluded)")
    ax.set_ylabel(summary.metric_name)
    ax.set_title(f"{summary.metric_name} against training time: replicates thin, their median thick, band from the "
                 "lowest to the highest", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.supxlabel("Each replicate linear between its validations (dots), over its own span. The median and the band: "
                  "over the replicates present at each time, where at least half of them are.", fontsize=7)
    save_figure(fig, out)
    return out
