"""The verdict: the fastest configuration, the tie, or why there is none, read from the selection; its lines."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence

from sweeplab.study import selection as mcb
from sweeplab.study.verdict.records import ConfigSummary, SweepSummary, Verdict, VerdictKind
from sweeplab.study.verdict.text import _difference_text, _namer, _speedup_text, format_ratio

ONE_REPLICATE = (
    "one replicate: no verdict (an interval needs at least two replicates of a configuration, and one run per "
    "configuration cannot tell a setup's effect from run-to-run noise, which moved one job 10-37 % between processes on GPU VMs and a 2-core CPU; "
    "run replicates=3 or more)"
)


def decide(configs: Sequence[ConfigSummary], baseline: str, target_text: str, target_source: str = "", *,
           tolerance_text: str = "", smoke_budget: bool = False, names: Mapping[str, str] | None = None,
           selection: mcb.Selection | None = None, undetermined: Sequence[str] = ()) -> Verdict:
    """The fastest configuration to the target among those that could keep quality, read from `selection` (the
    multiple comparisons with the best over them: sweeplab.study.selection), or the configurations that could be the
    fastest (a tie, not ranked), or why there is no verdict. `names`: configuration -> the short label the lines use.

    Candidates: every configuration whose quality is not shown to be lost ("keeps", "unclear", "at target" or the
    baseline) with at least two replicates paired with the baseline (configurations with fewer are named as
    undetermined: `summarize` says which). A time to target that is only bounded (a job that never reached the target, or was stopped
    behind) enters the comparisons as a bound, so no configuration needs most of its jobs to reach the target to be
    compared, and none is left out on a count. On the event that the best's comparisons hold (at least 95 %), the
    fastest named is the fastest (or within the indifference zone of it), the truly fastest is in a tie, and every
    configuration called slower is. Speed and quality are separate statements: a quality not yet certain is said
    beside the speed answer. Every configuration left out is named with its reason."""
    show = _namer(names)
    if max(c.jobs for c in configs) <= 1:
        return Verdict("no verdict", (), {}, tuple(c.config for c in configs), ONE_REPLICATE, (ONE_REPLICATE,))
    caveat = cannot_carry_a_verdict(configs, smoke_budget)
    head = [caveat] if caveat else []
    context = ([f"target: {target_text}, {target_source}"] if target_source else []) + (
        [tolerance_text] if tolerance_text else [])
    by_name = {c.config: c for c in configs}
    undetermined = tuple(undetermined)
    left_out: dict[str, tuple[str, str]] = {}  # configuration -> (why, in a group's words; its own figures)
    for config in configs:
        compared = selection is not None and config.config in selection.configs
        reason = _left_out_reason(config) if config.config not in undetermined and not compared else None
        if reason is not None:
            left_out[config.config] = reason
    if selection is None:
        keeper = [c for c in configs if c.config not in left_out and c.config not in undetermined]
        if len(keeper) == 1 and all(c.quality == "loses" for c in configs if c is not keeper[0]):
            # the answer without a speed comparison: every other configuration lost quality beyond its interval
            line = f"fastest to {target_text}: {show(keeper[0].config)}, the only configuration that keeps quality"
            return Verdict("fastest", (keeper[0].config,), {keeper[0].config: keeper[0].speedup_to_target}, (), "",
                           (*head, line, *context, *_exclusion_lines(left_out, undetermined, show)), caveat,
                           left_out=_left_out_words(left_out))
        reason = (f"no verdict: fewer than two configurations could keep quality and be compared on their time to "
                  f"{target_text} (two rounds in common with the baseline at least)")
        return Verdict("no verdict", (), {}, undetermined, reason,
                       (*head, reason, *context, *_exclusion_lines(left_out, undetermined, show)), caveat,
                       left_out=_left_out_words(left_out))
    slower_than = {config: f"slower than {', '.join(show(c) for c in faster)}"
                   for config, faster in selection.beaten_by.items()}
    for config, faster in selection.beaten_by.items():
        left_out[config] = (f"slower to the target than {', '.join(show(c) for c in faster)} (beyond the noise)", "")
    could_be = [by_name[c] for c in mcb.sorted_by_speed(selection, selection.could_be_fastest)]
    named = selection.named
    level = f"{selection.confidence_text()}, {selection.level_text()}"
    if named is not None:
        kind: VerdictKind = "fastest"
        tied = [by_name[named]]
        lines = [*head, _named_headline(by_name[named], baseline, target_text, selection, show, undetermined)]
        if selection.fastest is not None and selection.margin(named) > 1:
            lines.append(f"  at least {format_ratio(selection.margin(named))} as fast as every other configuration "
                         f"compared (every pair compared, {level})")
        elif selection.within is not None:
            rest = [c for c in could_be if c.config != named]
            lines.append(f"  {', '.join(show(c.config) for c in rest)} could be faster, by at most "
                         f"{format_ratio(selection.indifference)} (every pair compared, {level})")
    else:
        kind = "tie"
        tied = could_be
        lines = [*head, _headline(kind, tied, selection.configs, target_text, show, undetermined)]
        lines += [f"  {show(c.config)}: {_speedup_text(c, baseline)}" for c in tied]
        lines.append(f"  (every pair compared, {level})")
    lines += context
    unclear = [c for c in tied if c.quality == "unclear"]
    if unclear:
        lines.append("quality within tolerance of the baseline not yet certain (interval straddles it): "
                     + ", ".join(f"{show(c.config)} {_difference_text(c)}" for c in unclear))
    to_decide = mcb.printed_counts(selection)
    lines += [_to_decide_line(selection.comparison(*pair), n, show) for pair, n in to_decide.items()]
    lines += _exclusion_lines(left_out, undetermined, show)
    return Verdict(kind, tuple(c.config for c in tied), {c.config: c.speedup_to_target for c in tied}, undetermined,
                   "", tuple(lines), caveat, within=selection.indifference if selection.within else 1.0,
                   to_decide={f"{a} vs {b}": n for (a, b), n in to_decide.items()},
                   left_out={**_left_out_words(left_out), **slower_than})


def _to_decide_line(comparison: mcb.Comparison, count: mcb.PrintedCount | None, show) -> str:
    first, second = show(comparison.first), show(comparison.second)
    if count is None:
        return (f"to decide {first} against {second}: no difference measured to plan replicates from (its own 95 % "
                f"interval includes none, or it has fewer than {mcb.FEWEST_PAIRS_TO_PLAN} pairs or a censored time)")
    # the power stated is an assurance (over the differences the pairs leave possible), not the power at the measured
    # difference: a difference just clear of the noise on few pairs reads the same at a true 1.1x and 1.3x, and a
    # count planned at it decided a re-run on a true 1.1x in 24 % of studies for a stated 80 % (docs/verdict.md)
    possible = f"over the differences and noise its {comparison.n} pairs leave possible"
    if count.reached:
        head = (f"about {count.replicates} replicates would decide it in {mcb.ASSURANCE * 100:.0f} % of studies, "
                f"{possible}")
    else:
        head = (f"even {count.replicates} replicates would decide it in only {math.floor(count.power * 100)} % of "
                f"studies, {possible}")
    return (f"to decide {first} against {second}: {head} (measured {format_ratio(math.exp(abs(comparison.mean)))}; "
            f"docs/verdict.md; replicates={count.replicates})")


FEWEST_REPLICATES = 3


def cannot_carry_a_verdict(configs: Sequence[ConfigSummary], smoke_budget: bool) -> str:
    """The verdict's first line when the study is too small to carry one: fewer than 3 replicates (a t interval on
    2 values is 12.7 standard errors wide at 95 %, more with the simultaneous level), or a debug=smoke budget (a few
    steps: the quality is near chance and says nothing about the setups). "" when neither."""
    replicates = max(c.jobs for c in configs)
    why = []
    if replicates < FEWEST_REPLICATES:
        why.append(f"{replicates} replicates ({FEWEST_REPLICATES} or more are needed)")
    if smoke_budget:
        why.append("a debug=smoke budget (too few steps for the quality to mean anything)")
    if not why:
        return ""
    return (f"this study cannot carry a verdict: {' and '.join(why)}; what follows checks that the study runs, it "
            "is not an answer")


def _left_out_reason(config: ConfigSummary) -> tuple[str, str] | None:
    """Why `config` cannot be a candidate (a group's words, its own figures), or None."""
    if config.quality == "loses":
        return "best metric worse than the baseline's beyond the tolerance", _difference_text(config)
    if config.quality == "unknown":
        return "no best metric paired with the baseline's (quality unknown)", ""
    return None


def _named_headline(config: ConfigSummary, baseline: str, target_text: str, selection: mcb.Selection, show,
                    undetermined: Sequence[str] = ()) -> str:
    zone = "" if selection.fastest else f", or within {format_ratio(selection.indifference)} of the fastest"
    # an undetermined configuration was never compared: it could be faster, so the answer is among the compared
    compared = (f" of those compared ({', '.join(show(c) for c in undetermined)} undetermined: could be faster)"
                if undetermined else "")
    return f"fastest to {target_text}{compared}{zone}: {show(config.config)}, {_speedup_text(config, baseline)}"


def _left_out_words(left_out: Mapping[str, tuple[str, str]]) -> dict[str, str]:
    """Why each configuration is left out, in a few words for a tag (`Verdict.left_out`)."""
    words = {"best metric worse than the baseline's beyond the tolerance": "quality lost beyond the tolerance",
             "no best metric paired with the baseline's (quality unknown)": "quality unknown"}
    return {config: words.get(reason, reason) for config, (reason, _) in left_out.items()}


def _headline(kind: VerdictKind, tied: Sequence[ConfigSummary], compared: Sequence[str], target_text: str,
              show, undetermined: Sequence[str] = ()) -> str:
    names = ", ".join(show(c.config) for c in tied)
    among = (f" of those compared ({', '.join(show(c) for c in undetermined)} undetermined: could be faster)"
             if undetermined else "")
    if len(tied) == len(compared):
        return f"tie for fastest to {target_text}{among}: all of {names} (the noise cannot order them: not ranked)"
    return (f"tie for fastest to {target_text}{among}: {names} (the noise cannot order them: not ranked; the rest "
            "are slower)")


def _exclusion_lines(left_out: Mapping[str, tuple[str, str]], undetermined: Sequence[str], show) -> list[str]:
    """One line per reason, naming every configuration left out for it (with its own figures where they help)."""
    by_reason: dict[str, list[str]] = defaultdict(list)
    for config, (reason, figures) in left_out.items():
        by_reason[reason].append(f"{show(config)} {figures}".rstrip())
    lines = [f"left out, {reason}: {', '.join(named)}" for reason, named in by_reason.items()]
    if undetermined:
        lines.append("undetermined (not compared), fewer than two rounds in common with the baseline: "
                     + ", ".join(show(c) for c in undetermined))
    return lines


def pareto_front(points: Mapping[str, tuple[float, float]], lower_speed_is_better: bool,
                 higher_quality_is_better: bool) -> set[str]:
    """The configurations no other dominates: none is at least as good on both (speed, quality) and better on one.
    `points`: name -> (speed figure, quality figure), point estimates; a NaN on either is on no front. A speed of inf
    (time to target never reached) is the slowest there is."""
    oriented = {
        name: (-speed if lower_speed_is_better else speed, quality if higher_quality_is_better else -quality)
        for name, (speed, quality) in points.items() if not (math.isnan(speed) or math.isnan(quality))
    }

    def dominated(name: str) -> bool:
        s, q = oriented[name]
        return any(s2 >= s and q2 >= q and (s2 > s or q2 > q) for other, (s2, q2) in oriented.items() if other != name)

    return {name for name in oriented if not dominated(name)}


def speed_quality_front(summary: SweepSummary) -> list[str]:
    """The configurations on the Pareto front of speedup to target and final metric (point estimates), fastest
    first: none of them is both slower and no better in quality than another."""
    points = {c.config: (c.speedup_to_target.point, c.final_metric.point) for c in summary.configs}
    front = pareto_front(points, lower_speed_is_better=False, higher_quality_is_better=summary.mode == "max")
    return sorted(front, key=lambda name: -points[name][0])
