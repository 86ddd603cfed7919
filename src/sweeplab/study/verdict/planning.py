"""replicates=auto: where another round would decide something, and how many rounds that would take."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sweeplab.study import selection as mcb
from sweeplab.study.verdict.records import SweepSummary
from sweeplab.study.verdict.text import _namer


@dataclass(frozen=True)
class ReplicatePlan:
    """Where another round of replicates would decide something.

    more: the configurations to run again (the baseline is among them whenever another is: the pairs need it).
    dominated: slower to the target than the fastest beyond the noise (the selection's intervals hold at every look,
        so dropping them is safe): no more replicates.
    decided: nothing about them is open (e.g. quality lost beyond the interval; the named fastest).
    open_decisions: in words, what the `more` ones would settle; when the budget is spent, these stayed open.
    rounds_needed: about how many rounds in all would decide every open comparison at the measured difference and
        noise (80 % power, the study's looks counted); None when no difference was measured that any number would
        likely separate. 0 when nothing is open.
    """

    more: tuple[str, ...]
    dominated: tuple[str, ...]
    decided: tuple[str, ...]
    open_decisions: tuple[str, ...]
    rounds_needed: int | None = 0


def plan_replicates(summary: SweepSummary) -> ReplicatePlan:
    """Which configurations still straddle a decision (could be the fastest while none is named, the named one's
    quality not yet certain, too few pairs), which are slower beyond the noise, and which are decided. The caller
    runs `more` until it is empty, `rounds_needed` is beyond its budget, or the budget is spent."""
    show = _namer(summary.names)
    selection = summary.selection
    open_by_config: dict[str, list[str]] = {}
    for name in summary.verdict.undetermined:
        open_by_config[name] = ["fewer than two replicates paired with the baseline"]
    if summary.verdict.kind == "tie":
        for name in summary.verdict.fastest:
            others = ", ".join(show(o) for o in summary.verdict.fastest if o != name)
            open_by_config.setdefault(name, []).append(f"could be the fastest, with {others}")
    for name in summary.verdict.fastest:
        config = summary.config(name)
        if config.quality == "unclear":
            difference = config.quality_difference
            open_by_config.setdefault(name, []).append(
                f"keeps quality? difference {difference.point:+.4g} ({difference.interval.low:+.4g} to "
                f"{difference.interval.high:+.4g}) against tolerance {summary.quality_tolerance:g}")
    dominated = list(selection.slower()) if selection is not None else []
    more = [c.config for c in summary.configs if c.config in open_by_config]
    if more and summary.baseline not in more:
        more.insert(0, summary.baseline)
    decided = [c.config for c in summary.configs if c.config not in more and c.config not in dominated]
    open_decisions = tuple(f"{show(name)}: {reason}" for name, reasons in open_by_config.items() for reason in reasons)
    return ReplicatePlan(tuple(more), tuple(dominated), tuple(decided), open_decisions,
                         _rounds_needed(summary, open_by_config))


def _rounds_needed(summary: SweepSummary, open_by_config: Mapping[str, list[str]]) -> int | None:
    """The most rounds any open speed comparison would need (mcb.replicates_to_decide at the study's looks)."""
    selection = summary.selection
    if not open_by_config:
        return 0
    if selection is None or summary.verdict.kind != "tie":
        return max((c.jobs for c in summary.configs), default=0) + 1  # quality or pairs: one more round to see
    needed = list(mcb.replicates_to_decide_open(selection, summary.looks).values())
    if not needed or any(n is None for n in needed):
        return None
    return max(needed)
