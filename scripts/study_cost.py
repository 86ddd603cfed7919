"""What a study spent, per sweep: its jobs, the sum of their timed training seconds and of their wall breakdown
(`summary/wall_breakdown/*`), the training samples, the verdict's lines, their set-up's segments
(`summary/setup_split/*`: the sum over jobs and the largest in one job), and on a GPU sweep where each configuration
ran (issues 36 and 37: a stopped against an unstopped study; one GPU against several).

    python scripts/study_cost.py [--target T] [--wall S1,S2,...] SWEEP_DIR [SWEEP_DIR ...]

MLFLOW_TRACKING_URI names the store. --target re-reads every sweep at that target (the verdict's, for studies run
without one); --wall gives each sweep's process wall time (in the order of the folders) for the steps' share, else
the sweep's own `sweep/process_wall_s` (its process's start to its report) is used.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from sweeplab.core import channels, wall
from sweeplab.study.record import VerdictOptions, sweep_verdict
from sweeplab.study.sweep import read_sweep
from sweeplab.tracking import mlflow_store

PARTS = wall.PARTS


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=float, default=None)
    parser.add_argument("--wall", type=lambda v: [float(x) for x in v.split(",")], default=[],
                        help="each sweep's process wall time in seconds, comma-separated, in the folders' order")
    parser.add_argument("dirs", nargs="+")
    args = parser.parse_args(argv)
    uri = mlflow_store.resolve_uri()
    rows, details = [], []
    for i, folder in enumerate(args.dirs):
        parent = (Path(folder) / channels.PARENT_RUN_FILE).read_text().strip()
        sweep = read_sweep(uri, parent)
        # the verdict of the sweep already read (sweep_report would read it again and write its verdict back), asked
        # what the sweep asked (its target, tolerance, indifference and replicates=auto's looks) unless --target
        found = sweep_verdict(sweep, VerdictOptions.of_sweep(sweep.run, target=args.target))
        seconds = sum(j.run.timed_seconds or 0.0 for j in sweep.jobs)
        samples = sum((j.stop_step or j.max_steps or 0) * (j.samples_per_step or 0) for j in sweep.jobs)
        stopped = sum(1 for j in sweep.jobs if j.stop_reason)
        parts = {p: sum((j.run.wall_breakdown or {}).get(p, 0.0) for j in sweep.jobs) for p in PARTS}
        # the process's whole wall time when given, else what the sweep recorded (its start to its report)
        wall = args.wall[i] if i < len(args.wall) else sweep.run.process_wall_s
        share = f"{parts['steps'] / wall:.0%}" if wall else ""
        rows.append(f"| {folder} | {len(sweep.jobs)} | {stopped} | {seconds:.1f} | {samples:,} | "
                    f"{round(wall, 1) if wall else ''} | " + " | ".join(f"{parts[p]:.1f}" for p in PARTS) + f" | {share} |")
        lines = [f"{folder}:", *(f"    {line}" for line in found.lines)]
        if split := _setup_split(sweep.jobs):
            lines.append("    set-up split, s (sum over jobs / max over jobs): "
                         + ", ".join(f"{label} {total:.1f} / {most:.1f}" for label, (total, most) in split.items()))
        gpus: dict[str, set[str]] = defaultdict(set)
        for job in sweep.jobs:
            if job.run.gpu is not None:
                gpus[job.config or job.name].add(job.run.gpu)
        for config, used in gpus.items():
            lines.append(f"    GPUs of {config}: {', '.join(sorted(used))}"
                         + ("  <- one GPU in every round" if len(used) == 1 else ""))
        details.append(lines)
    # each sweep's verdict and details first, the table last: where only the tail of the output comes back (a
    # device call's), it holds the whole table
    for lines in details:
        print("\n".join(lines))
    print("| sweep | jobs | stopped | training s (sum of jobs) | samples trained | wall s | "
          + " | ".join(PARTS) + " | steps ÷ wall |")
    print("|---|---|---|---|---|---|" + "---|" * len(PARTS) + "---|")
    print("\n".join(rows))


def _setup_split(jobs) -> dict[str, tuple[float, float]]:
    """{segment: (its sum over the jobs, its largest value in one job)} of `summary/setup_split/*` (sweeplab.core.wall),
    for the segments some job recorded."""
    split = {}
    for label in wall.SETUP_SEGMENTS:
        values = [j.run.setup_split[label] for j in jobs if label in (j.run.setup_split or {})]
        if values:
            split[label] = (sum(values), max(values))
    return split


if __name__ == "__main__":
    main()
