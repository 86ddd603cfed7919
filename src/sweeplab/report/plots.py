"""Sweep plots: the objective of every trial with the best so far (the sweep callback, for searches), and a metric's
curves for every job against samples seen and wall time (the report's validation.png). Matplotlib's object API (no pyplot): nothing global changes."""

from __future__ import annotations

from pathlib import Path

from sweeplab.core.files import atomic_write

MAX_CURVES = 24  # beyond this a legend stops being readable
# one colour per configuration, told apart with every common colour-vision deficiency: Okabe and Ito's palette
# (black left out: the target's line is dark), yellow last (faint on white); beyond it tab20's
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442")
TARGET_COLOR = "#404040"  # the target's line, in the report's curves and in MLflow's chart view


def colors(count: int) -> list[str]:
    """`count` distinct colours as `#rrggbb` (matplotlib and MLflow's `mlflow.runColor` tag read them), colour-blind-
    safe while they fit OKABE_ITO."""
    if count <= len(OKABE_ITO):
        return list(OKABE_ITO[:count])
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    cmap = colormaps["tab20"]
    return [to_hex(cmap(i % cmap.N)) for i in range(count)]


def save_figure(fig, out: Path) -> None:
    """A figure written whole or not at all (core.files.atomic_write): a full disk left 0-byte PNGs behind."""
    with atomic_write(out) as f:
        fig.savefig(f, format=Path(out).suffix.lstrip(".") or "png")


def _figure(width: float = 7.0, height: float = 4.0):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=110, layout="constrained")


def objective_plot(jobs: list[tuple[int, float]], metric: str, mode: str, out: Path) -> Path:
    """`jobs`: (job number, objective) in launch order; the line is the best value reached so far."""
    fig = _figure()
    ax = fig.add_subplot()
    numbers = [n for n, _ in jobs]
    values = [v for _, v in jobs]
    best, best_so_far = None, []
    for value in values:
        best = value if best is None else (max(best, value) if mode == "max" else min(best, value))
        best_so_far.append(best)
    ax.scatter(numbers, values, label="job", zorder=3)
    ax.step(numbers, best_so_far, where="post", color="tab:red", label=f"best so far ({mode})")
    ax.set_xlabel("job number")
    ax.set_ylabel(metric or "objective")
    ax.set_title(f"sweep objective: {metric or 'return value'} per job")
    ax.grid(alpha=0.3)
    ax.legend()
    save_figure(fig, out)
    return out


def curves_plot(curves: dict[str, dict[str, list[tuple[float, float]]]], metric: str, out: Path,
                groups: dict[str, str] | None = None) -> Path:
    save_figure(curves_figure(curves, metric, groups), out)
    return out


def curves_figure(curves: dict[str, dict[str, list[tuple[float, float]]]], metric: str,
                  groups: dict[str, str] | None = None):
    """`curves`: run label -> {"samples": [(samples seen, value)], "seconds": [(wall seconds, value)]}: two panels,
    the metric against the training data seen and against wall time, one line per run. groups: run label -> its
    configuration: one colour per configuration (its replicates alike), else one per run. The legend goes below
    the panels with every name whole (cut names read as other values: `steps=1` for `steps=100`)."""
    shown = list(curves.items())[:MAX_CURVES]
    groups = groups or {label: label for label, _ in shown}
    keys = list(dict.fromkeys(groups.get(label, label) for label, _ in shown))
    color_of = dict(zip(keys, colors(len(keys))))
    columns = 2 if max((len(label) for label, _ in shown), default=0) > 40 else 3
    rows = -(-len(shown) // columns)
    fig = _figure(11.0, 4.5 + 0.17 * rows)
    by_samples, by_time = fig.subplots(1, 2, sharey=True)
    for label, points in shown:
        color = color_of[groups.get(label, label)]
        if points["samples"]:
            by_samples.plot(*zip(*points["samples"]), marker=".", label=label, color=color, linewidth=1.0)
        if points["seconds"]:
            by_time.plot(*zip(*points["seconds"]), marker=".", color=color, linewidth=1.0)
    by_samples.set_xlabel("training samples seen")
    by_time.set_xlabel("wall time since the run started (s)")
    by_samples.set_ylabel(metric)
    fig.suptitle(f"{metric} of every job" + (" (one colour per configuration)" if len(keys) < len(shown) else ""))
    for ax in (by_samples, by_time):
        ax.grid(alpha=0.3)
    if shown:
        fig.legend(fontsize=7, loc="outside lower center", ncols=columns)
    return fig


def lanes_plot(lanes: dict[str, list[tuple[float, float, str]]], idle_share: float | None, out: Path) -> Path:
    """`lanes`: lane -> [(start s, end s since the study's first job started, configuration)]: one row per lane
    of the GPU lanes launcher, a bar per job, coloured by configuration; the title gives the GPUs' idle share."""
    fig = _figure(9.0, 0.6 * len(lanes) + 1.6)
    ax = fig.add_subplot()
    configs = sorted({config for jobs in lanes.values() for _, _, config in jobs})
    colours = dict(zip(configs, colors(len(configs)), strict=True))
    for row, (_lane, jobs) in enumerate(sorted(lanes.items())):
        ax.broken_barh([(start, end - start) for start, end, _ in jobs], (row - 0.4, 0.8),
                       facecolors=[colours[config] for _, _, config in jobs], edgecolor="white")
    ax.set_yticks(range(len(lanes)), [lane for lane in sorted(lanes)], fontsize=7)
    ax.set_ylabel("lane (GPU slot:worker)")
    ax.set_xlabel("seconds since the study's first job started")
    idle = f"; the GPUs idle {idle_share:.0%} of the time" if idle_share is not None else ""
    ax.set_title(f"each job's start and end per lane{idle}")
    for config in configs[:MAX_CURVES]:
        ax.plot([], [], color=colours[config], linewidth=6, label=config[:48])
    if configs:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(alpha=0.3, axis="x")
    save_figure(fig, out)
    return out
