"""Sweep plots: the objective of every job with the best so far (the sweep callback), and a metric's curve for every
job (the report's validation.png). Matplotlib's object API (no pyplot): nothing global changes."""

from __future__ import annotations

from pathlib import Path

MAX_CURVES = 24  # beyond this a legend stops being readable


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
    fig.savefig(out)
    return out


def curves_plot(curves: dict[str, list[tuple[int, float]]], metric: str, out: Path) -> Path:
    """`curves`: run label -> [(step, value)] of `metric`."""
    fig = _figure(8.0, 4.5)
    ax = fig.add_subplot()
    for label, points in list(curves.items())[:MAX_CURVES]:
        if points:
            ax.plot([s for s, _ in points], [v for _, v in points], marker=".", label=label[:48])
    ax.set_xlabel("step")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} of every job")
    ax.grid(alpha=0.3)
    if curves:
        ax.legend(fontsize=7, loc="best")
    fig.savefig(out)
    return out
