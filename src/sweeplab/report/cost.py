"""Where a study's jobs spent their time: the sums over its jobs of `summary/wall_breakdown/<part>_s` (each job's
wall time in disjoint parts, sweeplab.core.wall) and of the set-up's segments (`summary/setup_split/<segment>_s`),
as a table for report.md and report.html, so a reader sees what the study paid besides its training steps
(docs/study-cost.md). Read from the sweep's record; nothing is measured here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from sweeplab.core import wall
from sweeplab.core.records import JobRun
from sweeplab.report import html as report_html
from sweeplab.study.sweep import JobRecord

TITLE = "where the jobs' time went"
PART_NAMES = {  # the parts as a reader names them
    "setup": "set-up", "warmup": "warm-up (untimed steps, compilation)", "steps": "training steps", "validation": "validation",
    "checkpoints": "checkpoints", "mlflow": "MLflow writes", "teardown": "teardown",
}
SHOWN_SEGMENTS = 3  # the set-up's largest segments named below the table


def _sums(jobs: Sequence[JobRecord], recorded: Callable[[JobRun], Mapping[str, float] | None],
          names: Sequence[str]) -> tuple[dict[str, float], dict[str, float]]:
    """(sum over jobs, largest in one job) of each name's value in a mapping field of the job's record (`recorded`:
    its wall breakdown, its set-up's split); names no job recorded are left out."""
    total: dict[str, float] = {}
    largest: dict[str, float] = {}
    for job in jobs:
        values = recorded(job.run) or {}
        for name in names:
            value = values.get(name)
            if value is not None:
                total[name] = total.get(name, 0.0) + value
                largest[name] = max(largest.get(name, 0.0), value)
    return total, largest


def cost_table(jobs: Sequence[JobRecord], process_wall_s: float | None = None,
               uncached_bytecode: str | None = None, process_start_ms: float | None = None) -> report_html.Table | None:
    """The parts' seconds over the jobs that recorded a breakdown (None when none did: an older or untracked sweep);
    `process_wall_s`: the sweep process's seconds from its start to its report (the parent run's
    `sweep/process_wall_s`), which the training steps are also set against; `uncached_bytecode`: the packages whose
    sources the sweep's Python compiled at its start (the parent run's `sweep/uncached_bytecode`);
    `process_start_ms`: when that process started. A continued sweep's process ran only the jobs that ended after
    its start: its training steps are set against its wall, not those of every session's jobs (that read "184 %")."""
    recorded = [job for job in jobs if "steps" in (job.run.wall_breakdown or {})]
    if not recorded:
        return None
    total, largest = _sums(recorded, lambda run: run.wall_breakdown, wall.PARTS)
    whole = sum(total.values())
    rows = [{"part": PART_NAMES[part], "s (all jobs)": f"{total[part]:.1f}",
             "share": f"{100 * total[part] / whole:.0f} %" if whole > 0 else "",
             "s (largest job)": f"{largest[part]:.1f}"} for part in wall.PARTS if part in total]
    above = (f"{len(recorded)} jobs, {whole:.1f} s of job time in all, {total.get('steps', 0.0):.1f} s of it in training "
             f"steps ({100 * total.get('steps', 0.0) / whole:.0f} %)" if whole > 0 else f"{len(recorded)} jobs",)
    if process_wall_s:
        session = [job for job in recorded if process_start_ms is None or (job.end_ms or math.inf) >= process_start_ms]
        steps = sum(job.run.wall_breakdown["steps"] for job in session)
        whose = ("the jobs' training steps" if len(session) == len(recorded) else
                 f"the training steps of the {len(session)} job{'s' if len(session) != 1 else ''} it ran (a continued "
                 f"sweep: the other {len(recorded) - len(session)} ran in an earlier process)")
        above += (f"the sweep's process: {process_wall_s:.1f} s from its start to this report; {whose} are "
                  f"{100 * steps / process_wall_s:.0f} % of it",)
    below = ["each job's wall time from its start (a process's first job: from the process's start, imports "
             "included) to its record, in parts that add up to it (summary/wall_breakdown/*); jobs that ran side by "
             "side add up to more than the study's wall time"]
    segments, _ = _sums(recorded, lambda run: run.setup_split, wall.SETUP_SEGMENTS)
    top = [name for name in sorted(segments, key=segments.get, reverse=True)[:SHOWN_SEGMENTS] if segments[name] >= 0.05]
    if top:
        below.append("set-up's largest segments (summary/setup_split/*): "
                     + ", ".join(f"{name} {segments[name]:.1f} s" for name in top))
    if uncached_bytecode:
        below.append(f"this Python compiled {uncached_bytecode}'s sources at its start (no cached bytecode, none "
                     "written): process_start and each worker's start are seconds longer than they need be; "
                     "`python -m compileall` once fixes it (docs/study-cost.md, \"Python's bytecode\")")
    return report_html.Table(("part", "s (all jobs)", "share", "s (largest job)"), rows, "part", above=above,
                             below=tuple(below))
