"""The verdict reads as it decides (issue 59): every printed interval is the one the decision used at its look, each
pair's share of α comes from its own rounds, no claim outside the guarantee (only one keeps quality, a stopped
configuration's bounds), the caveat and the undetermined configurations carried wherever a winner is named."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from sweeplab.report import config_runs
from sweeplab.study import caveats, selection
from sweeplab.study.sweep import JobRecord
from sweeplab.study.verdict import Estimate, Interval, Job, render_table, summarize
from sweeplab.study.verdict.text import not_measured

LOOKS = selection.Looks(3, 12)


def job(config: str, r: int, seconds_to_target: float, *, final: float = 1.0, stopped_at_s: float | None = None,
        never: bool = False) -> Job:
    """A job at 100 samples/s whose metric rises linearly to `final` and crosses 0.5 (the target) after
    `seconds_to_target` s; stopped behind at `stopped_at_s` (its time only bounded), or never reaching it."""
    rate = 100.0
    reach = seconds_to_target * rate  # samples at 0.5
    end = stopped_at_s * rate if stopped_at_s is not None else 4.0 * reach
    points = [(s, 0.4 if never else min(final, 0.5 * s / reach)) for s in [end * i / 40 for i in range(1, 41)]]
    return Job(config, r, r, rate, points[-1][1], points, censored_samples=end if stopped_at_s is not None else None,
               best_metric=max(v for _, v in points))


def three_configs(rounds: int, b_over_a: list[float]) -> list[Job]:
    jobs = []
    for r in range(rounds):
        jobs += [job("A", r, 10.0), job("B", r, 10.0 / b_over_a[r]), job("C", r, 10.0 * (1.0 + 0.01 * (-1) ** r))]
    return jobs


def test_every_printed_speed_interval_is_the_decisions_at_its_look():
    """At replicates=auto's first look B's fixed-size interval would exclude 1 while the look's stricter level ties
    all three: the table, the tie's lines and the summary now print the look's interval, and it includes 1."""
    jobs = three_configs(3, [1.45, 1.35, 1.40])
    summary = summarize(jobs, baseline="A", target=0.5, metric_name="m", quality_tolerance=0.01, looks=LOOKS)
    assert summary.verdict.kind == "tie" and set(summary.verdict.fastest) == {"A", "B", "C"}
    pair = summary.selection.comparison("B", "A")
    shown = summary.config("B").speedup_to_target
    assert shown.interval.low == pytest.approx(math.exp(pair.low)) and shown.interval.high == pytest.approx(
        math.exp(pair.high))
    assert shown.interval.level == pytest.approx(2 * pair.level - 1) and shown.interval.contains(1.0)
    assert shown.interval.level > 0.999  # the look's share, not the fixed-size 99.17 %
    assert summary.config("B").speedup.interval.level == pytest.approx(shown.interval.level)
    b_line = next(line for line in summary.verdict.lines if line.startswith("  B:"))
    assert f"{shown.interval.level:.1%} simultaneous interval" in b_line
    assert f"{shown.interval.low:.2f}×–{shown.interval.high:.2f}×" in b_line
    assert f"{shown.interval.level:.2%}" in render_table(summary).splitlines()[0]
    # the same jobs as a fixed-size study: its own (wider-level) decision, still the interval printed
    fixed = summarize(jobs, baseline="A", target=0.5, metric_name="m", quality_tolerance=0.01)
    fixed_pair = fixed.selection.comparison("B", "A")
    assert fixed.config("B").speedup_to_target.interval.low == pytest.approx(math.exp(fixed_pair.low))
    for c in fixed.configs:  # no interval that excludes 1 beside a tie that holds both
        if c.config in fixed.verdict.fastest and fixed.verdict.kind == "tie":
            assert c.speedup_to_target.interval.contains(1.0)


def test_a_frozen_pair_keeps_the_share_of_its_own_rounds():
    """C dropped after 3 rounds keeps its pairs' look-1 interval at look 10: the later look's larger share of α is
    for pairs that got its rounds."""
    jobs = three_configs(3, [3.0, 3.0, 3.0])
    for r in range(3, 10):
        jobs += [job("A", r, 10.0 * (1 + 0.02 * (-1) ** r)), job("B", r, 3.4)]
    times = {}
    for name in "ABC":
        times[name] = {(None, j.round): selection.TimeAtTarget(math.log(_seconds(j)))
                       for j in jobs if j.config == name}
    early = selection.select({k: {key: t for key, t in v.items() if key[1] < 3} for k, v in times.items()},
                             looks=LOOKS)
    late = selection.select(times, looks=LOOKS)
    assert late.comparison("A", "C").n == 3 and late.comparison("A", "B").n == 10
    assert late.comparison("A", "C").low == pytest.approx(early.comparison("A", "C").low)
    assert late.comparison("A", "C").level == pytest.approx(early.comparison("A", "C").level)
    assert late.comparison("A", "B").level < late.comparison("A", "C").level  # it spends its own larger share
    assert "by its own rounds" in late.level_text()


def _seconds(j: Job) -> float:
    return next(s for s, v in j.curve if v >= 0.5) / j.samples_per_sec


def test_a_stopped_configuration_is_never_called_faster_on_its_bound():
    """C was stopped behind in one round just past A's time (its time there only bounded: it may be far slower) and
    ran ahead in the others: its bound, taken as a value, made C "faster" on the t interval; the side of a claim
    for C is the sign test's, which that round counts against."""
    jobs = []
    for r, c_seconds in enumerate([5.0, 4.9, 5.1, 5.05]):
        jobs += [job("A", r, 10.0), job("C", r, c_seconds)]
    jobs += [job("A", 4, 10.0), job("C", 4, 50.0, stopped_at_s=10.5)]
    summary = summarize(jobs, baseline="A", target=0.5, metric_name="m", quality_tolerance=0.01)
    pair = summary.selection.comparison("C", "A")
    assert pair.low <= 0 < pair.high and summary.verdict.kind == "tie"
    assert not summary.config("C").speedup_to_target.interval.low > 1.0
    # a claim against it keeps its bound: A faster than a C stopped in every round
    slow = [job("A", r, 10.0 * (1 + 0.01 * r)) for r in range(5)] + [
        job("C", r, 90.0, stopped_at_s=25.0 + r) for r in range(5)]
    against = summarize(slow, baseline="A", target=0.5, metric_name="m", quality_tolerance=0.01)
    assert against.selection.beaten_by.get("C") == ("A",)


def test_only_one_keeps_quality_only_when_every_other_loses_it():
    """B loses quality; C's quality is unknown (no kept metric), not lost: A is not "the only configuration that
    keeps quality" while C, faster in every round, was never compared."""
    jobs = []
    for r in range(3):
        jobs += [job("A", r, 10.0), job("B", r, 10.0, final=0.6 + 0.001 * r), job("C", r, 2.0)]
    jobs = [j if j.config != "C" else Job(j.config, j.replicate, j.round, j.samples_per_sec, None, j.curve)
            for j in jobs]
    summary = summarize(jobs, baseline="A", target=0.5, metric_name="m", quality_tolerance=0.01)
    assert summary.config("B").quality == "loses" and summary.config("C").quality == "unknown"
    assert summary.verdict.kind != "fastest"
    assert not any("the only configuration that keeps quality" in line for line in summary.verdict.lines)
    # with C's quality lost too, A is the one that keeps it
    lost = [j if j.config != "C" else job("C", j.round, 2.0, final=0.6) for j in jobs]
    alone = summarize(lost, baseline="A", target=0.5, metric_name="m", quality_tolerance=0.01)
    assert alone.verdict.kind == "fastest" and "the only configuration that keeps quality" in alone.verdict.headline


def test_the_caveat_goes_wherever_a_winner_is_named():
    """Two replicates: the verdict cannot carry an answer; the `best:` line, the sweep's best_verdict words and the
    configuration run's verdict tag say so (they dropped it before)."""
    jobs = []
    for r in range(2):
        jobs += [job("A", r, 10.0 * (1 + 0.01 * r)), job("B", r, 2.0 * (1 + 0.01 * r))]
    verdict = summarize(jobs, baseline="A", target=0.5, metric_name="m", quality_tolerance=0.01).verdict
    assert verdict.kind == "fastest" and verdict.caveat
    assert verdict.best_line.startswith("not an answer (2 replicates") and "fastest" in verdict.best_line
    assert verdict.qualified(verdict.kind) == "fastest (not an answer)"
    assert config_runs.verdict_standing("B", verdict) == (1, "no answer: fastest")  # the view's narrow column


def test_no_unqualified_fastest_while_a_configuration_is_undetermined():
    """D shared one round with the baseline (10x faster in it): never compared, it could be the fastest. The
    headline, the `best:` line and the tags say the fastest is among those compared."""
    jobs = []
    for r in range(4):
        jobs += [job("A", r, 10.0 * (1 + 0.01 * r)), job("B", r, 4.0 * (1 + 0.01 * (-1) ** r))]
    jobs.append(job("D", 0, 1.0))
    verdict = summarize(jobs, baseline="A", target=0.5, metric_name="m", quality_tolerance=0.01).verdict
    assert verdict.kind == "fastest" and verdict.fastest == ("B",) and verdict.undetermined == ("D",)
    assert "of those compared (D undetermined" in verdict.headline
    assert "of those compared" in verdict.best_line
    assert verdict.qualified(verdict.kind) == "fastest (of those compared; 1 undetermined)"
    assert config_runs.verdict_standing("B", verdict)[1] == "fastest (of those compared; 1 undetermined)"


def test_left_out_says_against_whom():
    """A row whose interval against the baseline includes 1 reads "slower than B" (left out against the
    fastest, which the row's interval does not show), not a bare "left out"."""
    jobs = []
    for r in range(6):
        jobs += [job("A", r, 10.0 * (1 + 0.05 * (-1) ** r)), job("B", r, 2.0 * (1 + 0.01 * r)),
                 job("C", r, 10.5 * (1 + 0.05 * (-1) ** (r + 1)))]
    verdict = summarize(jobs, baseline="A", target=0.5, metric_name="m", quality_tolerance=0.01).verdict
    assert verdict.fastest == ("B",)
    assert config_runs.verdict_standing("C", verdict) == (2, "slower than B")


def test_a_row_reads_not_measured_alike_in_every_column():
    """A 2-replicate time interval of 0.019–2.4e+05 is not a measurement any more than the speedup beside it."""
    assert not_measured(Estimate(67.0, Interval(0.01896, 2.358e5, 0.95), 2))
    assert not not_measured(Estimate(67.0, Interval(40.0, 110.0, 0.95), 3))
    assert not not_measured(Estimate(1.2, Interval(0.9, math.inf, 0.99), 5))  # an open side is a bound


def test_an_unsteady_host_reads_as_english():
    metrics = {"summary/batch_shapes": 1.0, "summary/host_speed_spread": 0.8, "summary/step_time_spread": 0.07}
    record = JobRecord("run0", "job0", "FINISHED", 0, {}, {}, metrics, "textbridge", "c", 0, 0, 0, None, 1, "32", 32,
                       100.0)
    line = caveats.study_caveats([record], None)[0].line
    assert line.startswith("caveat: every job ran on an unsteady host: their speeds moved"), line


def test_a_replicate_count_is_printed_only_where_a_difference_is_measured():
    """Equal configurations (A/A) printed "about 18 replicates" from the noise; a count is now printed only where the
    pair's own 95 % interval is clear of 0 on at least 5 pairs, for a fixed-size study of that many replicates."""
    wobble = [1.0, 1.06, 0.95, 1.03, 0.97, 1.02]
    jobs = []
    for r, w in enumerate(wobble):
        jobs += [job("A", r, 10.0), job("B", r, 10.0 * w), job("C", r, 10.0 / w)]
    equal = summarize(jobs, baseline="A", target=0.5, metric_name="m", quality_tolerance=0.01)
    assert equal.verdict.kind == "tie" and equal.verdict.to_decide
    assert all(n is None for n in equal.verdict.to_decide.values())
    assert any("no difference measured to plan replicates from" in line for line in equal.verdict.lines)
    # B measurably ahead of A (its own 95 % interval clear of 0) but not decided at the simultaneous level
    ahead = [1.02, 1.30, 1.0, 1.25, 1.05, 1.30]
    jobs = []
    for r, w in enumerate(ahead):
        jobs += [job("A", r, 10.0), job("B", r, 10.0 / w), job("C", r, 10.0 * (1 + 0.01 * (-1) ** r))]
    summary = summarize(jobs, baseline="A", target=0.5, metric_name="m", quality_tolerance=0.01)
    pair = summary.selection.comparison("B", "A")
    assert summary.verdict.kind == "tie" and selection.difference_measured(pair) and not pair.low > 0
    count = summary.verdict.to_decide["B vs A"]
    assert count is not None and count.reached and count.replicates > pair.n
    line = next(line for line in summary.verdict.lines if line.startswith("to decide B against A"))
    assert f"about {count.replicates} replicates would decide it in 95 % of studies, over the differences and noise " \
        f"its 6 pairs leave possible (measured {math.exp(pair.mean):.2f}×" in line, line
    # three pairs are too few to plan from, whatever they show
    few = summarize([j for j in jobs if j.round < 3], baseline="A", target=0.5, metric_name="m",
                    quality_tolerance=0.01)
    assert all(n is None for n in few.verdict.to_decide.values())


def _decided_share(effects: np.ndarray, spreads: np.ndarray, replicates: int, level: float, rng) -> float:
    """Fixed-size studies of `replicates` normal pairs, one true difference and spread each: the share whose one-sided
    t bound at `level` clears 0 (what a re-run of the printed count would do)."""
    pairs = effects[:, None] + spreads[:, None] * rng.standard_normal((spreads.size, replicates))
    bound = pairs.mean(axis=1) - stats.t.ppf(level, replicates - 1) * pairs.std(axis=1, ddof=1) / math.sqrt(replicates)
    return float(np.mean(bound > 0))


def test_the_printed_count_decides_at_its_stated_power_over_what_its_pairs_leave_possible():
    """"about N replicates would decide it in 95 % of studies, over the differences and noise its 5 pairs leave
    possible": drawing the true difference and spread from what 5 pairs of mean 0.19 and spread 0.12 allow (the
    spread a scaled inverse chi-square, the difference normal around 0.19 given it) and re-running N pairs by
    simulation decides in the stated share, and N − 1 falls short. With the spread and difference known (very many
    measured pairs) the same computation is the plain power, checked against simulation too; it needs far fewer."""
    rng = np.random.default_rng(59)
    level = selection.pair_level(0.95, 3)
    measured = selection.Comparison("B", "A", 5, 0.19, 0.12, -math.inf, math.inf, 0)
    count = selection.printed_count(measured, 0.95, 3)
    assert count is not None and count.reached and count.power == pytest.approx(selection.ASSURANCE, abs=0.005)
    draws = 100_000
    spreads = 0.12 * np.sqrt(4 / rng.chisquare(4, draws))
    effects = 0.19 + spreads / math.sqrt(5) * rng.standard_normal(draws)
    assert _decided_share(effects, spreads, count.replicates, level, rng) == pytest.approx(count.power, abs=0.01)
    assert selection.assurance(0.19, 0.12, 5, count.replicates - 1, level) < selection.ASSURANCE
    known = np.full(draws, 0.12)
    for n in (6, 9):
        assert _decided_share(np.full(draws, 0.19), known, n, level, rng) == pytest.approx(
            selection.assurance(0.19, 0.12, 10**7, n, level), abs=0.01)
    assert selection.assurance(0.19, 0.12, 10**7, 12, level) > 0.95 and count.replicates > 3 * 12


def test_a_count_that_cannot_reach_the_stated_power_says_what_the_most_reach():
    """B ahead of A by a difference just clear of the noise on 50 pairs (t = 2.1, undecided at the simultaneous
    level): so small a true difference stays possible that even 1,000 replicates decide it in only 93 % of studies,
    and the line says so rather than 95 %."""
    ratios = [math.exp(0.03 + 0.1 * (-1) ** r) for r in range(50)]
    summary = summarize(three_configs(50, ratios), baseline="A", target=0.5, metric_name="m", quality_tolerance=0.01)
    count = summary.verdict.to_decide["B vs A"]
    assert summary.verdict.kind == "tie" and count is not None and not count.reached
    assert count.replicates == selection.MOST_REPLICATES_SUGGESTED and 0.85 < count.power < selection.ASSURANCE
    line = next(line for line in summary.verdict.lines if line.startswith("to decide B against A"))
    assert line.startswith(f"to decide B against A: even 1000 replicates would decide it in only "
                           f"{math.floor(count.power * 100)} % of studies, over the differences and noise its 50 pairs "
                           f"leave possible (measured 1.03×"), line


def test_a_pair_on_the_sign_test_plans_its_rounds_by_the_sign_test():
    """The baseline never reached an explicit target; B reached it in every round. The pair is on the sign test, which
    at K = 2 over looks 3-12 first claims at 9 rounds of one sign: the plan says so (a t formula on the clumped
    bounds said a few rounds, or "about 57", and replicates=auto stopped for futility before the sign test could)."""
    from sweeplab.study.verdict import plan_replicates

    jobs = []
    for r in range(6):
        jobs += [job("A", r, 10.0, never=True), job("B", r, 5.0 * (1 + 0.01 * r))]
    summary = summarize(jobs, baseline="A", target=0.5, metric_name="m", quality_tolerance=0.01, looks=LOOKS)
    pair = summary.selection.comparison("B", "A")
    assert pair.sign_test and pair.wins == 6 and summary.verdict.kind == "tie"
    assert plan_replicates(summary).rounds_needed == 9
    nine = [j for r in range(9) for j in (job("A", r, 10.0, never=True), job("B", r, 5.0 * (1 + 0.01 * r)))]
    decided = summarize(nine, baseline="A", target=0.5, metric_name="m", quality_tolerance=0.01, looks=LOOKS)
    assert decided.verdict.kind == "fastest" and decided.verdict.fastest == ("B",)
