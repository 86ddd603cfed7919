"""The sweep report's Apple additions: the Neural Engine readiness of every run that exported (`export=coreml`).

An export logs its readiness report on the training run (sweeplab/export/pipeline.py): the figures as metrics
`export/<variant>/ane_*` and `fp16_*` (export/readiness.metrics), the verdict line as the tag
`export/<variant>/ane_verdict`, the whole report as an artifact. The report shows them beside each run's speed and
quality, so a sweep weighs the three together: one column in the per-job table (`ane_column`) and one line per
exported run under it (`ane_lines`). docs/export.md explains each figure.
"""

from __future__ import annotations

from collections.abc import Sequence

from sweeplab.core.records import JobRun
from sweeplab.study.sweep import JobRecord

COLUMN = "ANE readiness"
READINESS = ("ane_", "fp16_")  # the readiness report's figures among an export's (export/readiness.metrics)


def readiness_figures(job: JobRecord) -> dict[str, dict[str, float | str]]:
    """{variant: {figure: value, "verdict": line}} of a job's exports; empty for a job that exported nothing."""
    record = JobRun.from_run(job)
    found: dict[str, dict[str, float | str]] = {}
    for (variant, name), value in (record.export_figures or {}).items():
        if name.startswith(READINESS) and "/" not in name:
            found.setdefault(variant, {})[name] = value
    for variant, figures in found.items():
        if verdict := (record.export_verdicts or {}).get(variant):
            figures["verdict"] = verdict
    return found


def _cell(variant: str, figures: dict) -> str:
    """"ane-fp16: 1 blocker, 0.1% of work off the ANE" (the figures behind the verdict, in a table's width)."""
    blockers = int(figures.get("ane_blockers", 0))
    parts = [f"{blockers} blocker{'s' if blockers != 1 else ''}" if blockers else "no known blocker"]
    if (share := figures.get("ane_unready_work_share")) is not None and share > 0:
        parts.append(f"{share:.1%} of work off the ANE")
    if overflows := int(figures.get("fp16_overflow_tensors", 0) + figures.get("fp16_hidden_overflows", 0)):
        parts.append(f"{overflows} fp16 overflow{'s' if overflows != 1 else ''}")
    return f"{variant}: {', '.join(parts)}"


def ane_column(jobs: Sequence[JobRecord], rows: list[dict[str, str]]) -> list[str]:
    """Fill each row's `ANE readiness` cell from its job (rows and jobs in the same order); returns the column to add
    to the table, or none when no job exported."""
    cells = ["; ".join(_cell(v, f) for v, f in sorted(readiness_figures(job).items())) for job in jobs]
    if not any(cells):
        return []
    for row, cell in zip(rows, cells):
        row[COLUMN] = cell
    return [COLUMN]


def ane_lines(jobs: Sequence[JobRecord]) -> str:
    """The readiness verdict of every exported job, one line each, as Markdown ("" when no job exported)."""
    lines = []
    for job in jobs:
        for variant, figures in sorted(readiness_figures(job).items()):
            verdict = figures.get("verdict", "verdict not recorded (an export before sweeplab logged it)")
            lines.append(f"- {job.name}, {variant}: {verdict}")
    if not lines:
        return ""
    return "\n### ANE readiness of the exports\n\n" + "\n".join(lines) + "\n"
