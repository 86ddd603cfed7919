"""What a study spent on training: per sweep, its jobs, the sum of their timed training seconds, the training
samples they trained, and the verdict's first line (issue 37's comparison of a stopped and an unstopped study).

    python scripts/study_cost.py SWEEP_DIR [SWEEP_DIR ...]      (MLFLOW_TRACKING_URI names the store)
"""

from __future__ import annotations

import sys
from pathlib import Path

from sweeplab.core import channels, schema
from sweeplab.report.tables import sweep_report
from sweeplab.study.record import VerdictOptions
from sweeplab.study.sweep import read_sweep
from sweeplab.tracking import mlflow_store


def main(dirs: list[str]) -> None:
    uri = mlflow_store.resolve_uri()
    print("| sweep | jobs | stopped | training s (sum of jobs) | samples trained | verdict |")
    print("|---|---|---|---|---|---|")
    for folder in dirs:
        parent = (Path(folder) / channels.PARENT_RUN_FILE).read_text().strip()
        sweep = read_sweep(uri, parent)
        target, tolerance = sweep.parent.tags.get(schema.TARGET_TAG), sweep.parent.tags.get(schema.TOLERANCE_TAG, "0")
        found = sweep_report(uri, parent, None, options=VerdictOptions(float(target) if target else None,
                                                                       float(tolerance)))
        seconds = sum(j.metrics.get("summary/timed_seconds", 0.0) for j in sweep.jobs)
        samples = sum((j.stop_step or j.max_steps or 0) * (j.samples_per_step or 0) for j in sweep.jobs)
        stopped = sum(1 for j in sweep.jobs if j.stop_reason)
        print(f"| {folder} | {len(sweep.jobs)} | {stopped} | {seconds:.1f} | {samples:,} | {found.verdict.lines[0]} |")
        for line in found.verdict.lines[1:]:
            print(f"|   | | | | | {line} |")


if __name__ == "__main__":
    main(sys.argv[1:])
