"""How often `stop.behind` stops a configuration that is truly as fast as the leader, and what it does to the verdict's
error rates (issue 37). Simulated studies, seeded: three configurations, `a` (the baseline) and `b` truly equal, `slow`
truly 1.3x slower to the target; each job's time to target is lognormal around its configuration's (sigma 0.1 or
0.3), one job per configuration per round, rounds in alternating order, jobs of a round one after the other (the round
board holds the shortest time to target posted so far), validation every 2 % of the baseline's time to target.

With stopping, a job of another configuration than the baseline stops at the first validation past k times the
round's leader time without having reached the target (right-censored); a configuration stopped that way in
`--for-good` rounds gets no further rounds (all three have the same final quality here, so none may be better).
Each study has its own seed and draws the same numbers in every arm, so the arms are paired: the last column counts
the studies whose intervals stopped covering with stopping, of those whose coverage changed either way.

    python scripts/stop_simulation.py [--studies 2000] [--k 2.0 2.5 3.0] [--sigma 0.1 0.3]
"""

from __future__ import annotations

import argparse
import math
import random
from dataclasses import dataclass

from sweeplab.study import verdict

TRUE = {"a": 1.0, "b": 1.0, "slow": 1.3}  # time to target relative to the baseline's
BASE_SAMPLES = 1000.0  # the baseline's median samples to target (at 1 sample/s: its seconds too)
VALIDATE_EVERY = 20.0
MAX_SAMPLES = 4000.0  # every job's last step: about 3x the slow configuration's median time to target
TARGET = 0.9


@dataclass
class Outcome:
    stopped_equal: bool  # `b` (truly equal to the baseline) stopped for good
    any_equal_job_stopped: bool
    false_faster: bool  # one equal configuration named faster than the other, or `slow` named the fastest
    covered: bool  # every interval holds its true ratio (a bounded one: its upper bound at or above it)
    samples: float  # training samples spent
    slow_called_slower: bool  # a verdict that leaves `slow` out of the fastest


def _job(config: str, r: int, samples_to_target: float, rng: random.Random, stop_at: float | None) -> verdict.Job:
    """A job whose metric rises linearly to TARGET at `samples_to_target` and on to 0.95, validated every
    VALIDATE_EVERY samples, until its last step or `stop_at`."""
    end = stop_at if stop_at is not None else MAX_SAMPLES
    points = [(s, min(0.95, TARGET * s / samples_to_target)) for s in _grid(end)]
    noise = rng.gauss(0.0, 0.001)  # drawn either way: a stop leaves the study's later draws as they were (paired arms)
    final = points[-1][1] + (noise if stop_at is None else 0.0)
    return verdict.Job(config, r, r, 1.0, final, points, censored_samples=stop_at)


def _grid(end: float) -> list[float]:
    return [VALIDATE_EVERY * i for i in range(1, int(end / VALIDATE_EVERY) + 1)]


def _first_validation_after(seconds: float) -> float:
    return VALIDATE_EVERY * (math.floor(seconds / VALIDATE_EVERY) + 1)


def study(rng: random.Random, sigma: float, k: float | None, for_good: int = 2, rounds: int = 5) -> Outcome:
    order, jobs, dropped = list(TRUE), [], set()
    behind_rounds = dict.fromkeys(TRUE, 0)
    any_equal = False
    spent = 0.0
    for r in range(rounds):
        leader = None  # the round board: the shortest time to target posted so far in this round
        for config in order if r % 2 == 0 else order[::-1]:
            if config in dropped:
                continue
            needed = BASE_SAMPLES * TRUE[config] * math.exp(rng.gauss(0.0, sigma))
            reached_at = _first_validation_after(needed) if needed < MAX_SAMPLES else None
            stop_at = None
            if k is not None and config != "a" and leader is not None:
                stop_time = _first_validation_after(k * leader)
                if reached_at is None or stop_time < reached_at:
                    stop_at = min(stop_time, MAX_SAMPLES)
            jobs.append(_job(config, r, needed, rng, stop_at))
            spent += stop_at if stop_at is not None else MAX_SAMPLES
            if stop_at is not None:
                behind_rounds[config] += 1
                any_equal |= config == "b"
            elif reached_at is not None:
                leader = reached_at if leader is None else min(leader, reached_at)
        dropped |= {c for c, n in behind_rounds.items() if n >= for_good}
    summary = verdict.summarize(jobs, baseline="a", target=TARGET, quality_tolerance=0.01, metric_name="m")
    fastest = set(summary.verdict.fastest)
    # a false "faster": one of the two equal configurations named faster than the other (fastest alone, or in the
    # tie without the other), or the slow one named the fastest; a tie that holds `slow` is no false claim
    false_faster = len(fastest & {"a", "b"}) == 1 or fastest == {"slow"}
    covered = True
    for config in summary.configs:
        truth = TRUE["a"] / TRUE[config.config]
        estimate = config.speedup_to_target
        if config.config == "a" or estimate.n == 0:
            continue
        covered &= estimate.interval.high >= truth if estimate.bounded else estimate.interval.contains(truth)
    slower = bool(fastest) and "slow" not in fastest
    return Outcome("b" in dropped, any_equal, false_faster, covered, spent, slower)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--studies", type=int, default=2000)
    parser.add_argument("--k", type=float, nargs="+", default=[2.0, 2.5, 3.0])
    parser.add_argument("--sigma", type=float, nargs="+", default=[0.1, 0.3])
    args = parser.parse_args()
    print("| sigma | stop.behind | equal config stopped for good | any equal job stopped | false 'faster' | "
          "all intervals cover | slow called slower | training samples | coverage lost of changed (paired) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for sigma in args.sigma:
        baseline_spent, paired = None, None
        for k in [None, *args.k]:
            # study i draws the same times to target in every arm (its own seed, the same draws whether or not a
            # job stops), so the arms are paired: a difference between them is what stopping changed
            outcomes = [study(random.Random(1234 + i), sigma, k) for i in range(args.studies)]
            paired = paired or outcomes
            flips = sum(o.covered != p.covered for o, p in zip(outcomes, paired))
            worse = sum(p.covered and not o.covered for o, p in zip(outcomes, paired))

            def share(attr: str, outcomes: list[Outcome] = outcomes) -> float:
                return sum(getattr(o, attr) for o in outcomes) / len(outcomes)

            spent = sum(o.samples for o in outcomes)
            baseline_spent = baseline_spent or spent
            print(f"| {sigma} | {'off' if k is None else k} | {share('stopped_equal'):.1%} | "
                  f"{share('any_equal_job_stopped'):.1%} | {share('false_faster'):.1%} | {share('covered'):.1%} | "
                  f"{share('slow_called_slower'):.1%} | {spent / baseline_spent:.0%} | {worse} of {flips} |",
                  flush=True)


if __name__ == "__main__":
    main()
