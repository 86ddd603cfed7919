"""Which configuration reaches the target fastest, chosen with a guarantee: simultaneous intervals for every pair.

The verdict's claims are orderings: "B is the fastest", "A is slower than B", "these could be the fastest" (which
says the others are slower). Each is read from one family of intervals, one per pair of configurations, for the
mean log advantage of one over the other (log of the ratio of their times to the target, paired by round), all of
them simultaneous: each at the two-sided level 1 − α/(K(K − 1)/2) (Bonferroni over the pairs). On the event that
every one of them holds (probability at least 1 − α), every claim read from them is true, whatever the truth is:

- `beaten_by[i]`: the configurations faster than i (the pair's interval above 0); i is slower than them.
- `could_be_fastest` (G): the configurations no other beats; the truly fastest is among them.
- `fastest`: the one configuration that beats every other.
- `within`: with an indifference zone δ ≥ 1 (`report.indifference`), a member of G whose advantage over every other
  is above −log δ: it is the fastest, or at most δ× slower than the fastest.

Why every pair and not Hsu's multiple comparisons with the best (MCB; Hsu 1984), which needs only K − 1 one-sided
comparisons: MCB's guarantee is about `log speed_i − max_{j≠i} log speed_j`, and its "not the best" for i is the
non-strict "i is not faster than every other". Among equal configurations that is true of every one of them, so MCB
may leave equal configurations out of the tie while keeping its guarantee: on simulated A/A studies of 5
configurations × 5 replicates it left one out in 7.5 % of them. A user reads "left out: slower" as strict, and the
study's promise is that no ordering is said between configurations that are equal (at most 5 % of A/A studies), so
the claims need the strict family: every pair (measured in docs/verdict.md).

Pairs are rounds (or hosts): in each, `advantage` = log(their time to target) − log(ours), so the round's drift and
the seed's effect on learning (shared by a round's configurations) cancel. A time that is only bounded (a job that
never reached the target is censored at its training time; one stopped behind its round's leader at its stop)
bounds the round's advantage on one side only (`advantage_bounds`); each side of the interval is read from the
rounds' bounds on that side (`interval`): a t bound where every round bounds it, the sign test's where one leaves
it open, so a censored round never speaks for the censored configuration.

replicates=auto looks again after every round; a fixed-size interval read at every look does not keep its error
rate (optional stopping). Its looks are planned (rounds `first` to `most`, L of them), so the error α is spent
over them (Bonferroni over the looks, `Looks.share`): look k of L (k = 1 at round `first`) gets α·2k/(L(L + 1)),
less at the early looks, where a few replicates could decide little anyway, more at the late ones. A pair's look is
that of its own rounds (`looked_level`): a pair frozen at n rounds keeps its look's interval at every later look.
A pair's shares add up to at most α, so the guarantee holds at every look, whenever the study stops.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

# Power for "would likely decide it": the replicates at which an effect of the measured size clears the interval
# in 80 % of studies.
POWER = 0.80
MOST_REPLICATES_SUGGESTED = 1000


@dataclass(frozen=True)
class TimeAtTarget:
    """One configuration's time to the target in one pair key (round or host): log seconds, or a lower bound of
    them when `censored`: "stopped" (stopped behind its round's leader: it was at least k times the leader's time)
    or "never" (it never reached the target in its training: its time may be infinite)."""

    log_seconds: float
    censored: str = ""


def advantage(ours: TimeAtTarget, theirs: TimeAtTarget) -> float:
    """How much faster we were in one round, in log time (positive: faster). A censored side counts only where its
    bound fixes the sign (then by the bound: at least that much slower); otherwise the round says nothing (0)."""
    if not ours.censored and not theirs.censored:
        return theirs.log_seconds - ours.log_seconds
    if ours.censored and not theirs.censored and ours.log_seconds >= theirs.log_seconds:
        return theirs.log_seconds - ours.log_seconds
    if theirs.censored and not ours.censored and theirs.log_seconds >= ours.log_seconds:
        return theirs.log_seconds - ours.log_seconds
    return 0.0


@dataclass(frozen=True)
class Looks:
    """The looks replicates=auto takes at the verdict: after rounds `first`, `first` + 1, ..., `most`."""

    first: int
    most: int

    @property
    def count(self) -> int:
        return self.most - self.first + 1

    def share(self, rounds: int) -> float:
        """The part of the error α the look after `rounds` rounds may spend (they add up to 1 over the looks)."""
        k = min(max(rounds - self.first, 0), self.count - 1) + 1
        return 2.0 * k / (self.count * (self.count + 1))


@dataclass(frozen=True)
class Comparison:
    """`first` against `second` over their common pair keys: the mean log advantage of `first` (positive:
    faster), its standard deviation over the pairs, and the bounds [low, high] of its interval, each side at
    `level` (one-sided; unbounded with fewer than two pairs). `censored`: pairs where a side's time was only
    bounded; a side of the interval that such a pair leaves open is the sign test's (`interval`), and `center`, the
    figure printed between the bounds, is then the median advantage instead of the mean."""

    first: str
    second: str
    n: int
    mean: float
    sd: float
    low: float
    high: float
    censored: int
    level: float = math.nan
    center: float = math.nan
    # the rounds that are surely for `first` (their lower bound above 0) and surely for `second`, and whether a side
    # took the sign test (then these counts, not the mean and sd, say how many rounds would decide it)
    wins: int = 0
    losses: int = 0
    sign_test: bool = False

    def reversed(self) -> Comparison:
        return Comparison(self.second, self.first, self.n, -self.mean, self.sd, -self.high, -self.low, self.censored,
                          self.level, -self.center, self.losses, self.wins, self.sign_test)


@dataclass(frozen=True)
class Selection:
    """The answer over `configs` (docstring of the module). `level`: each side of the interval of the pair with the
    most rounds (each pair's own is `Comparison.level`: its share of α comes from its own rounds); `looks`: how
    many looks it is valid over (None: a fixed-size study); `share`: the part of α that pair's look spends;
    `indifference`: δ (1: none). `lower`: the lowest bound of a configuration's log advantage over any other (its
    worst case against the rest)."""

    configs: tuple[str, ...]
    confidence: float
    level: float
    looks: Looks | None
    share: float
    indifference: float
    could_be_fastest: tuple[str, ...]
    fastest: str | None
    within: str | None
    beaten_by: Mapping[str, tuple[str, ...]]
    lower: Mapping[str, float]
    comparisons: Mapping[tuple[str, str], Comparison]

    def confidence_text(self) -> str:
        looks = f" over its {self.looks.count} looks" if self.looks is not None else ""
        return f"{self.confidence:.0%} simultaneous{looks}"

    def level_text(self) -> str:
        """"each pair's interval at 99.76%", or the range when the pairs' rounds (and so their levels) differ."""
        levels = sorted({round(2 * c.level - 1, 6) for c in self.comparisons.values() if math.isfinite(c.level)})
        if not levels:
            return "no pair compared"
        if len(levels) == 1:
            return f"each pair's interval at {levels[0]:.2%}"
        return f"each pair's interval at {levels[0]:.2%}-{levels[-1]:.2%} (by its own rounds)"

    @property
    def named(self) -> str | None:
        """The configuration the verdict names: the fastest, else the one within the indifference zone."""
        return self.fastest or self.within

    def comparison(self, first: str, second: str) -> Comparison:
        return self.comparisons[(first, second)]

    def slower(self) -> tuple[str, ...]:
        return tuple(c for c in self.configs if c not in self.could_be_fastest)

    def margin(self, config: str) -> float:
        """It is at least this many times as fast as every other configuration (above 1 only for the fastest)."""
        return math.exp(self.lower[config])


def _stats():
    """scipy.stats, imported at its first use: its import costs about a CPU-second, which the training app's
    refusals (a wrong setting, an absent device) would pay before their one line."""
    from scipy import stats

    return stats


@lru_cache(maxsize=1 << 16)
def t_quantile(p: float, df: float) -> float:
    """Student's t quantile (scipy.stats; cached: a sweep asks for few distinct ones, a simulation for many)."""
    return float(_stats().t.ppf(p, df))


def pair_level(confidence: float, configs: int, share: float = 1.0) -> float:
    """Each side of each pair's interval: K(K − 1) one-sided bounds (both sides of K(K − 1)/2 pairs) sharing this
    look's part of the error (Bonferroni)."""
    return 1.0 - (1.0 - confidence) * share / max(configs * (configs - 1), 1)


def half_width(sd: float, n: int, level: float) -> float:
    """One-sided t half-width of a mean of n paired values at `level` (inf below two)."""
    if n < 2:
        return math.inf
    return t_quantile(level, n - 1) * sd / math.sqrt(n)


def looked_level(confidence: float, configs: int, looks: Looks | None, rounds: int) -> float:
    """Each side of the interval of a pair with `rounds` rounds in common: its look is that of its own rounds, not
    the study's, so a pair frozen at n rounds (a configuration dropped as slower) keeps the interval of its look and
    is never re-tested at a later look's larger share (the shares of one pair's looks add up to at most 1)."""
    return pair_level(confidence, configs, looks.share(rounds) if looks is not None else 1.0)


def compare(first: str, second: str, ours: Mapping[Hashable, TimeAtTarget],
            theirs: Mapping[Hashable, TimeAtTarget], level: float) -> Comparison:
    keys = sorted(ours.keys() & theirs.keys(), key=repr)
    if not keys:
        return Comparison(first, second, 0, math.nan, math.nan, -math.inf, math.inf, 0, level, math.nan)
    values = np.array([advantage(ours[k], theirs[k]) for k in keys], dtype=float)
    bounds = np.array([advantage_bounds(ours[k], theirs[k]) for k in keys], dtype=float)
    censored = sum(bool(ours[k].censored or theirs[k].censored) for k in keys)
    never = any("never" in (ours[k].censored, theirs[k].censored) for k in keys)
    sd = float(values.std(ddof=1)) if values.size > 1 else math.nan
    low, high = interval(bounds[:, 0], bounds[:, 1], level, sign_test=never)
    center = float(np.median(values)) if censored else float(values.mean())
    sign_test = never or not (np.all(np.isfinite(bounds[:, 0])) and np.all(np.isfinite(bounds[:, 1])))
    return Comparison(first, second, int(values.size), float(values.mean()), sd, low, high, censored, level,
                      min(max(center, low), high), int(np.sum(bounds[:, 0] > 0)), int(np.sum(bounds[:, 1] < 0)),
                      bool(sign_test))


def advantage_bounds(ours: TimeAtTarget, theirs: TimeAtTarget) -> tuple[float, float]:
    """What one round says of our advantage (their log time − ours) when a time is only bounded: [low, high]. A
    censored time is at least its bound and may be far longer (never: infinite), so our advantage is at most
    theirs − our bound when ours is censored (no lower limit), at least their bound − ours when theirs is."""
    low = theirs.log_seconds - ours.log_seconds if not ours.censored else -math.inf
    high = theirs.log_seconds - ours.log_seconds if not theirs.censored else math.inf
    return low, high


def interval(lows: np.ndarray, highs: np.ndarray, level: float, sign_test: bool) -> tuple[float, float]:
    """Each side at one-sided `level`, from each round's bounds of the advantage (equal where both times were
    measured). A side every round bounds (low: no censored time of ours) is the t bound of the mean of those
    bounds: their mean is at most (at least) the true one, so the bound keeps its level. A side some round leaves
    open (a time of that side only bounded: a job stopped behind may be far slower than its stop), or any side of a
    pair where a job never reached the target (`sign_test`), is the sign test's bound of the median (order
    statistics of the rounds' bounds), exact whatever the values' shape: a stopped round counts against a claim for
    the stopped configuration, never for it (its bound, as a value, would pull its mean up: issue 59).

    Why never-reached pairs take the sign test on both sides: their rounds' values are bounds (one side reached the
    target early, the other never did) or open, clumps of one size that a t interval took for a difference when
    three fell on one side: 5.6-7.3 % of A/A studies ordered two configurations at K = 4-8, n = 3, with an explicit
    target half the jobs reached; a time that may be infinite has no mean."""
    n = lows.size
    k = sign_test_rank(n, 1.0 - level)
    if sign_test or not np.all(np.isfinite(lows)):
        low = float(np.sort(lows)[k - 1]) if k > 0 else -math.inf
    else:
        low = float(lows.mean()) - half_width(float(lows.std(ddof=1)) if n > 1 else math.nan, n, level)
    if sign_test or not np.all(np.isfinite(highs)):
        high = float(np.sort(highs)[-k]) if k > 0 else math.inf
    else:
        high = float(highs.mean()) + half_width(float(highs.std(ddof=1)) if n > 1 else math.nan, n, level)
    return low, high


def sign_test_rank(n: int, alpha: float) -> int:
    """The largest k with P(Binomial(n, 1/2) ≤ k − 1) ≤ alpha: the k-th smallest of n values is then a lower
    confidence bound of their median at 1 − alpha (0: none is)."""
    if n < 1:
        return 0
    binom = _stats().binom
    q = int(binom.ppf(alpha, n, 0.5))  # the smallest q with P(B <= q) >= alpha
    return q + 1 if binom.cdf(q, n, 0.5) <= alpha else q


def select(times: Mapping[str, Mapping[Hashable, TimeAtTarget]], *, confidence: float = 0.95,
           looks: Looks | None = None, indifference: float = 1.0) -> Selection:
    """MCB over the configurations of `times` (configuration -> pair key -> its time to target there)."""
    configs = tuple(times)
    comparisons: dict[tuple[str, str], Comparison] = {}
    for i, first in enumerate(configs):
        for second in configs[i + 1:]:
            rounds = len(times[first].keys() & times[second].keys())
            forward = compare(first, second, times[first], times[second],
                              looked_level(confidence, len(configs), looks, rounds))
            comparisons[(first, second)] = forward
            comparisons[(second, first)] = forward.reversed()
    most = max((c.n for c in comparisons.values()), default=0)
    share = looks.share(most) if looks is not None else 1.0
    level = pair_level(confidence, len(configs), share)

    def others(config: str) -> list[str]:
        return [c for c in configs if c != config]

    beaten_by = {c: tuple(o for o in others(c) if comparisons[(o, c)].low > 0) for c in configs}
    could_be = tuple(c for c in configs if not beaten_by[c])
    lower = {c: min((_nan_low(comparisons[(c, o)]) for o in others(c)), default=0.0) for c in configs}
    fastest = could_be[0] if len(could_be) == 1 else None  # the truly fastest is never beaten: it is this one
    within = None
    if fastest is None and indifference > 1.0:
        zone = [c for c in could_be if lower[c] > -math.log(indifference)]
        within = max(zone, key=lambda c: lower[c]) if zone else None
    beaten_by = {c: faster for c, faster in beaten_by.items() if faster}
    return Selection(configs, confidence, level, looks, share, indifference, could_be, fastest, within, beaten_by, lower,
                     comparisons)


def _nan_low(comparison: Comparison) -> float:
    return -math.inf if math.isnan(comparison.low) else comparison.low


# The printed "about N replicates" is counted only from this many pairs, and only where a difference is measured (the
# pair's own 95 % interval, unadjusted, clear of 0): on 3 pairs a measured difference is mostly noise, and one
# selected for being large (an undecided pair that still "shows" a difference) overstates the truth: re-run with
# the count planned from 3 pairs, a true 1.3x decided in 36-49 % of studies, not 80 % (docs/verdict.md).
FEWEST_PAIRS_TO_PLAN = 5


def replicates_to_decide(comparison: Comparison, confidence: float, configs: int, indifference: float = 1.0,
                         looks: Looks | None = None) -> int | None:
    """About how many pairs would decide this comparison (its interval clear of 0, or within the indifference zone
    for the leader) in 80 % of studies over the study's looks, were the difference one standard error larger than
    measured and the spread as measured: replicates=auto's futility rule, which should not give up on a real effect
    its first rounds drew small. None when that is more than MOST_REPLICATES_SUGGESTED or nothing was measured."""
    if comparison.sign_test and comparison.n >= 1:
        return _rounds_for_the_sign_test(comparison, confidence, configs, looks)
    if not (comparison.n >= 2 and math.isfinite(comparison.sd)):
        return None
    effect = (abs(comparison.mean) + comparison.sd / math.sqrt(comparison.n)
              + (math.log(indifference) if indifference > 1.0 else 0.0))
    if not effect > 0:
        return None
    if comparison.sd == 0:
        return max(comparison.n, 2)

    def level(n: int) -> float:
        return pair_level(confidence, configs, looks.share(n) if looks is not None else 1.0)

    power = float(_stats().norm.ppf(POWER))
    return _fewest(lambda n: effect * math.sqrt(n) / comparison.sd >= t_quantile(level(n), n - 1) + power,
                   max(2, comparison.n))


# The printed count's power is an assurance, not a power at the measured difference: a count is printed only for a
# pair just clear of the noise, so the difference it was read from sits in the same narrow band of standard errors
# whatever the truth (a true 1.1x read as 1.21x on 5 pairs, a true 1.3x as 1.33x), and a count planned for 80 % at
# the measured difference decided a re-run on a true 1.1x in 24 % of studies, on a true 1.3x in 89-100 %. Averaged
# over the differences the pairs leave possible, 95 % is where a re-run on the same truth delivered within 10 points
# of it at both (90-100 %; at 90 % a true 1.1x from 5 pairs decided in 45 %): docs/verdict.md, "about N replicates",
# re-run. Near 100 % the power cannot overshoot by much, which is why a high target holds at both truths.
ASSURANCE = 0.95


@dataclass(frozen=True)
class PrintedCount:
    """The printed "about N replicates": `replicates`, the fewest whose assurance reaches ASSURANCE (or
    MOST_REPLICATES_SUGGESTED where none does), and `power`, their assurance."""

    replicates: int
    power: float

    @property
    def reached(self) -> bool:
        return self.power >= ASSURANCE


# The printed count's uncertainty, at midpoint quantiles: its pairs' spread is itself an estimate (on 5 pairs its
# standard deviation is a third of it; a count read at the measured spread alone decided 68 %, not 80 %, at the
# measured difference), and so is their mean difference.
_QUANTILES = (np.arange(32) + 0.5) / 32


@lru_cache(maxsize=256)
def _possible(measured_pairs: int) -> tuple[np.ndarray, np.ndarray]:
    """What `measured_pairs` pairs leave possible, in units of their measurement: the true spread over the measured
    one (a column: the scaled inverse chi-square's quantiles) and the true difference's offset from the measured one
    in true spreads (a row: the normal's quantiles over √n)."""
    df = measured_pairs - 1
    return (np.sqrt(df / _stats().chi2.ppf(_QUANTILES, df))[:, None],
            _stats().norm.ppf(_QUANTILES)[None, :] / math.sqrt(measured_pairs))


def _noncentralities(effect: float, sd: float, measured_pairs: int, replicates: int) -> np.ndarray:
    spread, offset = _possible(measured_pairs)
    return (effect / (sd * spread) + offset) * math.sqrt(replicates)


def assurance(effect: float, sd: float, measured_pairs: int, replicates: int, level: float) -> float:
    """The share of fixed-size studies of `replicates` pairs whose one-sided t bound at `level` clears 0, averaged
    over the true differences and spreads that `measured_pairs` pairs of mean `effect` and spread `sd` leave
    possible (flat priors on the difference and on the spread's log: the spread a scaled inverse chi-square with
    n − 1 degrees of freedom, the difference given it normal around `effect`): the noncentral t's power over them.
    With very many measured pairs, the power at `effect` and `sd`."""
    critical = t_quantile(level, replicates - 1)
    return float(np.mean(_stats().nct.sf(critical, replicates - 1,
                                         _noncentralities(effect, sd, measured_pairs, replicates))))


def _near_assurance(effect: float, sd: float, measured_pairs: int, replicates: int, level: float) -> float:
    """`assurance` with the noncentral t's power in its normal approximation: within a replicate of it from about
    20 replicates, and hundreds of times cheaper (the count's search starts from it)."""
    critical = t_quantile(level, replicates - 1)
    noncentralities = _noncentralities(effect, sd, measured_pairs, replicates)
    return float(np.mean(_stats().norm.cdf((noncentralities - critical)
                                           / math.sqrt(1 + critical**2 / (2 * (replicates - 1))))))


def printed_count(comparison: Comparison, confidence: float, configs: int,
                  indifference: float = 1.0) -> PrintedCount | None:
    """The count the verdict prints for an open pair with a difference measured (difference_measured), for a
    fixed-size study at its own level (no looks): the fewest replicates whose assurance reaches ASSURANCE (found
    with its normal approximation, then stepped to the exact one). None unless a difference is measured."""
    if not difference_measured(comparison):
        return None
    effect = abs(comparison.mean) + (math.log(indifference) if indifference > 1.0 else 0.0)
    level = pair_level(confidence, configs)
    fewest = max(2, comparison.n)
    powers: dict[int, float] = {}

    def power(n: int) -> float:
        if n not in powers:
            powers[n] = assurance(effect, comparison.sd, comparison.n, n, level)
        return powers[n]

    replicates = _fewest(lambda n: _near_assurance(effect, comparison.sd, comparison.n, n, level) >= ASSURANCE,
                         fewest) or MOST_REPLICATES_SUGGESTED
    while replicates < MOST_REPLICATES_SUGGESTED and power(replicates) < ASSURANCE:
        replicates += 1
    while replicates > fewest and power(replicates - 1) >= ASSURANCE:
        replicates -= 1
    return PrintedCount(replicates, power(replicates))


def _fewest(decides, low: int) -> int | None:
    """The fewest replicates from `low` to MOST_REPLICATES_SUGGESTED that `decides` (which grows with them), by
    bisection; None where even the most do not."""
    high = MOST_REPLICATES_SUGGESTED
    if not decides(high):
        return None
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if decides(middle) else (middle + 1, high)
    return low


def _rounds_for_the_sign_test(comparison: Comparison, confidence: float, configs: int,
                              looks: Looks | None) -> int | None:
    """A pair on the sign test: the first number of rounds at which its k-th smallest bound clears 0 in 80 % of
    studies, were each round surely for the side ahead with one standard error more than the measured share of
    such rounds (as for the t). A t formula on such a pair's clumped values said "about 57 rounds" of a
    pair the sign test decides at 10 when every round falls one way (issue 59)."""
    ahead = max(comparison.wins, comparison.losses)
    share = ahead / comparison.n
    share = min(1.0, share + math.sqrt(share * (1 - share) / comparison.n))
    if share <= 0.5:
        return None
    binom = _stats().binom
    for n in range(max(2, comparison.n), MOST_REPLICATES_SUGGESTED + 1):
        level = pair_level(confidence, configs, looks.share(n) if looks is not None else 1.0)
        k = sign_test_rank(n, 1.0 - level)
        if k > 0 and binom.sf(n - k, n, share) >= POWER:
            return n
    return None


def difference_measured(comparison: Comparison, confidence: float = 0.95) -> bool:
    """The pair's own interval (at `confidence`, not adjusted for the other pairs or the looks) is clear of 0, on
    at least FEWEST_PAIRS_TO_PLAN pairs with no censored time: a difference to plan more replicates from."""
    if comparison.n < FEWEST_PAIRS_TO_PLAN or comparison.censored or not comparison.sd > 0:
        return False
    return abs(comparison.mean) > t_quantile(0.5 + confidence / 2, comparison.n - 1) * comparison.sd / math.sqrt(
        comparison.n)


def printed_counts(selection: Selection) -> dict[tuple[str, str], PrintedCount | None]:
    """(leader, other) -> the printed count of each comparison that keeps the verdict open (open_pairs): the
    replicates a fixed-size study would need to decide it, with their assurance (printed_count)."""
    return {(c.first, c.second): printed_count(c, selection.confidence, len(selection.configs), selection.indifference)
            for c in open_pairs(selection)}


def replicates_to_decide_open(selection: Selection, looks: Looks | None = None) -> dict[tuple[str, str], int | None]:
    """(leader, other) -> about how many pairs would decide each comparison that keeps the verdict open (open_pairs),
    over a study's planned looks (replicates=auto's futility rule, optimistic by a standard error)."""
    return {(c.first, c.second): replicates_to_decide(c, selection.confidence, len(selection.configs),
                                                      selection.indifference, looks)
            for c in open_pairs(selection)}


def open_pairs(selection: Selection) -> list[Comparison]:
    """The comparisons that keep the verdict open: with no configuration named, the leader (the member of G with the
    highest lower bound) against each other member of G."""
    if selection.named is not None or len(selection.could_be_fastest) < 2:
        return []
    leader = max(selection.could_be_fastest, key=lambda c: (selection.lower[c], _mean_advantage(selection, c)))
    return [selection.comparison(leader, other) for other in selection.could_be_fastest if other != leader]


def _mean_advantage(selection: Selection, config: str) -> float:
    means = [selection.comparison(config, o).mean for o in selection.configs if o != config]
    means = [m for m in means if math.isfinite(m)]
    return min(means) if means else -math.inf


def sorted_by_speed(selection: Selection, configs: Sequence[str]) -> list[str]:
    """`configs` fastest first by their worst mean advantage over the others (for reading; not a ranking claim)."""
    return sorted(configs, key=lambda c: -_mean_advantage(selection, c))
