"""What a study's answer must be read with, gathered in one place: the caveats every place that shows the verdict
shows beside it (report.md, report.html and the console above the verdict's lines; the sweep run's description and
its `caveats` tag; every configuration run's `caveat` tag, a column of the MLflow view beside its verdict).

- Too small to carry a verdict (fewer than 3 replicates, a debug=smoke budget): the verdict's own `Verdict.caveat`
  (sweeplab.study.verdict decides it; its words are kept).
- Loaded or unsteady hosts: jobs that shared their host with other work (load over stability.LOADED_HOST per CPU)
  or whose host's own speed wavered (stability.unsteady_host), as each job's stability figures say: their speeds,
  and every speedup read from them, moved with that other work.
- Jobs stopped by rule (stop.at_target, stop.behind: policies/stopping.py): a stopped job's time to the target is
  measured or bounded at the stop, and its final metric is its value there, not after its planned steps.
- Packing that moved the speeds (several jobs side by side on a GPU: sweeplab.sweep.packing): each packed job's
  step time against its configuration's step time alone (the launcher's probe); where one configuration was slowed
  more than another past PACKING_TOLERANCE and past its replicates' spread, the ratio the verdict reads is partly
  packing's, and the advice is `hydra.launcher.lanes_per_gpu=1`.

Each caveat has a line (`caveat: ...`, for the pages and the console) and a few words for a table cell (`short`:
`not an answer: 2 replicates, smoke; loaded host (8/8)`).
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from sweeplab.core import stability
from sweeplab.core.records import JobRun
from sweeplab.study.record import VerdictReport
from sweeplab.study.sweep import JobRecord
from sweeplab.study.verdict import SweepSummary

PREFIX = "caveat: "
HOST_PROBLEMS = ("loaded host", "unsteady host")  # stability.problems' words for a host that moved the speed
RULES = {"behind": "stop.behind", "target": "stop.at_target"}
# Packing may slow every configuration alike (that costs time, not the answer); it moved the verdict's ratio where
# one configuration's slowdown exceeds another's by more than this and their replicates' slowdowns do not overlap
PACKING_TOLERANCE = 0.10


@dataclass(frozen=True)
class Caveat:
    """line: the sentence, `caveat: ...`; short: a few words for a table cell (`2 replicates, smoke budget`)."""

    line: str
    short: str


def study_caveats(jobs: Sequence[JobRecord], summary: SweepSummary | None) -> tuple[Caveat, ...]:
    """The caveats of a study from its jobs (as read from MLflow) and its summary (None: no verdict to qualify)."""
    found = []
    if summary is not None and summary.verdict.caveat:
        found.append(Caveat(PREFIX + summary.verdict.caveat, "not an answer: " + _too_small(summary.verdict.caveat)))
    if host := _host_caveat(jobs):
        found.append(host)
    if stopped := _stopped_caveat(jobs):
        found.append(stopped)
    if packed := _packing_caveat(jobs):
        found.append(packed)
    return tuple(found)


def short_text(caveats: Sequence[Caveat]) -> str:
    """The caveats as one table cell: their short words joined by '; ' ("" when none)."""
    return "; ".join(c.short for c in caveats)


def with_caveats(found: VerdictReport, caveats: Sequence[Caveat]) -> VerdictReport:
    """The verdict's lines with the caveats first (the verdict's own caveat line said once, as a caveat)."""
    own = found.summary.verdict.caveat if found.summary is not None else ""
    lines = [line for line in found.lines if not (own and line == own)]
    return VerdictReport(found.summary, (*(c.line for c in caveats), *lines))


def _too_small(text: str) -> str:
    """`2 replicates and a debug=smoke budget` from the verdict's caveat, without its parentheses."""
    why = text.split(": ", 1)[-1].split(";", 1)[0]
    why = re.sub(r"\s*\([^)]*\)", "", why).replace("a debug=smoke budget", "smoke")
    return why.replace(" and ", ", ")


def _host_caveat(jobs: Sequence[JobRecord]) -> Caveat | None:
    measured = [j for j in jobs if stability.has_stability_data(j.metrics)]
    troubled = {j.run_id: [p for p in stability.problems(j.metrics, j.tags) if p.startswith(HOST_PROBLEMS)]
                for j in measured}
    hit = [j for j in measured if troubled[j.run_id]]
    if not hit:
        return None
    loads = [max(j.run.load_avg_start or 0.0, j.run.load_avg_end or 0.0) for j in hit]
    cpus = {j.run.host_cpus for j in hit} - {None}
    kinds = sorted({p.split(" (")[0] for j in hit for p in troubled[j.run_id]})
    where = (f" (load {min(loads):.1f}-{max(loads):.1f} on {'/'.join(f'{c:g}' for c in sorted(cpus))} CPUs)"
             if "loaded host" in kinds and cpus else "")
    who = "every job" if len(hit) == len(measured) else f"{len(hit)} of {len(measured)} jobs"
    host = " or ".join(k.removesuffix(" host") for k in kinds) + " host"
    article = "an" if host[0] in "aeiou" else "a"
    return Caveat(f"{PREFIX}{who} ran on {article} {host}{where}: their speeds moved with the host's other "
                  "work, and so may every speedup here; run the study on a quiet host to trust them",
                  f"{kinds[0] if len(kinds) == 1 else 'loaded host'} ({len(hit)}/{len(measured)})")


def _stopped_caveat(jobs: Sequence[JobRecord]) -> Caveat | None:
    rules = Counter(RULES.get(j.stop_reason, j.stop_reason) for j in jobs if j.stop_reason)
    if not rules:
        return None
    stopped = sum(rules.values())
    which = ", ".join(f"{rule}: {count}" for rule, count in sorted(rules.items()))
    return Caveat(f"{PREFIX}{stopped} of {len(jobs)} jobs were stopped by rule ({which}): a stopped job's time to the "
                  "target is measured or bounded at its stop, and its final metric is its value there",
                  f"{stopped}/{len(jobs)} stopped by rule")


def packing_slowdowns(jobs: Sequence[JobRecord]) -> dict[str, list[float]]:
    """Each packed job's step time over its configuration's step time alone, by configuration (jobs run more than
    one to a GPU with both figures recorded; empty for a study that was not packed)."""
    found: dict[str, list[float]] = {}
    for j in jobs:
        record = j.run
        packed = record.step_time_median
        if (record.lanes_per_gpu or 1) > 1 and record.solo_step_time_s and packed and j.config is not None:
            found.setdefault(j.config, []).append(packed / record.solo_step_time_s)
    return found


def packing_line(jobs: Sequence[JobRecord]) -> str | None:
    """The packing check in one line (None: not packed): each configuration's packed step time against alone."""
    slowdowns = packing_slowdowns(jobs)
    if not slowdowns:
        return None
    lanes = max((JobRun.from_run(j).lanes_per_gpu or 1) for j in jobs)
    each = ", ".join(f"{config} {statistics.median(v):.2f}x" for config, v in sorted(slowdowns.items()))
    return f"packing check ({lanes} jobs side by side on each GPU): step time packed against alone: {each}"


def _packing_caveat(jobs: Sequence[JobRecord]) -> Caveat | None:
    slowdowns = packing_slowdowns(jobs)
    if len(slowdowns) < 2:
        return None
    medians = {config: statistics.median(v) for config, v in slowdowns.items()}
    most, least = max(medians, key=medians.get), min(medians, key=medians.get)
    moved = medians[most] / medians[least]
    if moved <= 1 + PACKING_TOLERANCE or min(slowdowns[most]) <= max(slowdowns[least]):
        return None
    return Caveat(f"{PREFIX}packing moved the configurations' speeds unequally: {most} ran {medians[most]:.2f}x its "
                  f"step time alone, {least} {medians[least]:.2f}x: part of the ratio between them is the packing's; "
                  "run the study again with hydra.launcher.lanes_per_gpu=1 to compare them alone",
                  f"packing moved speeds ({moved:.2f}x)")
