"""Text: the table's cells and header, numbers and intervals as a person reads them."""

from __future__ import annotations

import math
from collections.abc import Mapping

from sweeplab.study.verdict.records import FIGURES, ConfigSummary, Estimate, SweepSummary


def table_header(summary: SweepSummary, with_target: bool = True, names: Mapping[str, str] | None = None) -> str:
    """The line above the per-configuration table: the target (unless the page says it already: the verdict's
    `target:` line), the baseline and the intervals' levels."""
    target = (f"target: {summary.metric_name} {'≥' if summary.mode == 'max' else '≤'} {summary.target:.4g} "
              f"({summary.target_source}); ") if with_target else ""
    return (f"{target}comparisons with {_namer(names)(summary.baseline)} (the baseline): {summary.comparisons}, "
            f"speed intervals {speed_levels_text(summary)}, quality intervals at {summary.quality_level:.2%}")


def speed_levels_text(summary: SweepSummary) -> str:
    """The levels of the speed columns' intervals: each is the level the verdict's decision used for that
    configuration's pair with the baseline at this look (several when the pairs' rounds differ)."""
    levels = sorted({round(c.speedup_to_target.interval.level, 6) for c in summary.configs
                     if c.config != summary.baseline})
    decided = " (the verdict's own)" if summary.selection is not None else ""
    if len(levels) > 1:
        return f"at {levels[0]:.2%}-{levels[-1]:.2%}{decided}"
    return f"each at {(levels[0] if levels else summary.speed_level):.2%}{decided}"


def render_table(summary: SweepSummary) -> str:
    """The per-configuration table as text: medians with their 95 % intervals, comparisons with their simultaneous
    ones (the header says the level)."""
    header = table_header(summary)
    columns = ("config", "n", *(f.named(f.csv, summary.metric_name) for f in FIGURES), "quality")
    rows = [columns] + [table_cells(c) for c in summary.configs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    return "\n".join([header, *lines])


def table_cells(config: ConfigSummary) -> list[str]:
    """One configuration's row of the per-configuration table (this text table and the report's): its name, its
    replicates, a cell per FIGURES entry (empty where it has none; samples to target with how many reached it) and
    its quality."""
    cells = []
    for figure in FIGURES:
        estimate = figure.of(config)
        cell = "" if estimate is None else estimate_text(estimate, figure.number)
        cells.append(cell + (f" [{config.reached_target}/{config.jobs}]" if figure.metric == "samples_to_target" else ""))
    return [config.config, str(config.jobs), *cells, config.quality]


# An interval of a positive figure (a speedup, a time) whose bounds lie more than this factor from its point says
# nothing a person can use: "not measured (n = 2)" says what it means.
SANE_SPAN = 1e4


def not_measured(estimate: Estimate) -> bool:
    """The interval of a positive figure spans more than SANE_SPAN from its low to its high bound, or its low bound
    lies that far below its point (a 2-replicate t interval, at a simultaneous level or not: every such column of a
    row reads alike, not a speedup "not measured" beside a time of 0.019–2.4e+05). An open high side (∞: a job that
    never reached the target) is a bound, not this."""
    point, low, high = estimate.point, estimate.interval.low, estimate.interval.high
    if not (math.isfinite(point) and point > 0 and low >= 0):
        return False
    return (math.isfinite(high) and high > low * SANE_SPAN) or low < point / SANE_SPAN


def interval_text(estimate: Estimate, show) -> str:
    """`(low–high)` with `show` for each bound, or `(not measured, n = N)`."""
    if not_measured(estimate):
        return f"(not measured, n = {estimate.n})"
    return f"({show(estimate.interval.low)}–{show(estimate.interval.high)})"


def estimate_text(estimate: Estimate, number: str) -> str:
    def show(value: float) -> str:
        if math.isinf(value):
            return "∞" if value > 0 else "-∞"
        shown = number.format(value)
        # a fixed-point format of a huge bound (a 2-replicate interval's t quantile) would print dozens of digits
        return shown if len(shown) <= 9 else f"{value:.3g}"

    return f"{show(estimate.point)} {interval_text(estimate, show)}"


def _namer(names: Mapping[str, str] | None):
    names = names or {}
    return lambda config: names.get(config, config)


def _difference_text(config: ConfigSummary) -> str:
    difference = config.quality_difference
    return f"(Δ {difference.point:+.3g}, {difference.interval.low:+.3g} to {difference.interval.high:+.3g})"


def _speedup_text(config: ConfigSummary, baseline: str) -> str:
    if config.config == baseline:
        return "the baseline"
    estimate = config.speedup_to_target
    if estimate.bounded:
        return (f"at most {format_ratio(estimate.point)} the baseline's speed to the target (upper bound "
                f"{format_ratio(estimate.interval.high)}: its jobs were stopped behind, so its time is only bounded)")
    if not_measured(estimate):
        return (f"{format_ratio(estimate.point)} the baseline's speed to the target (interval not measured, "
                f"n = {estimate.n})")
    return (f"{format_ratio(estimate.point)} the baseline's speed to the target "
            f"({format_ratio(estimate.interval.low)}–{format_ratio(estimate.interval.high)}, "
            f"{estimate.interval.level:.1%} simultaneous interval, {estimate.n} pairs)")


def format_ratio(value: float) -> str:
    if math.isinf(value):
        return "∞"
    return f"{value:.2f}×" if value >= 0.01 else f"{value:.2g}×"
