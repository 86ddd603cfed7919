"""Sweep plots: the objective of every trial with the best so far (the sweep callback, for searches), and a metric's
curves for every job against samples seen and wall time (the report's validation.png). Matplotlib's object API (no pyplot): nothing global changes."""

from __future__ import annotations

from pathlib import Path

from sweeplab.core.files import atomic_write

MAX_CURVES = 24  # beyond this a legend stops being readable


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


def curves_plot(curves: dict[str, dict[str, list[tuple[float, float]]]], metric: str, out: Path) -> Path:
    """`curves`: run label -> {"samples": [(samples seen, value)], "seconds": [(wall seconds, value)]}: two panels,
    the metric against the training data seen and against wall time, one line per run."""
    fig = _figure(11.0, 4.5)
    by_samples, by_time = fig.subplots(1, 2, sharey=True)
    shown = list(curves.items())[:MAX_CURVES]
    for label, points in shown:
        line = by_samples.plot(*zip(*points["samples"]), marker=".", label=label[:48])[0] if points["samples"] else None
        if points["seconds"]:
            by_time.plot(*zip(*points["seconds"]), marker=".", color=line.get_color() if line else None)
    by_samples.set_xlabel("training samples seen")
    by_time.set_xlabel("wall time since the run started (s)")
    by_samples.set_ylabel(metric)
    fig.suptitle(f"{metric} of every job")
    for ax in (by_samples, by_time):
        ax.grid(alpha=0.3)
    if shown:
        by_samples.legend(fontsize=7, loc="best")
    save_figure(fig, out)
    return out
