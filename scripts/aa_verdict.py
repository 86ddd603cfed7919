"""How often the verdict names a configuration fastest when none is (issue 38): seeded A/A sweeps of four identical
configurations, at 3, 5 and 10 replicates, under every family's default quality tolerance (docs/verdict.md).

    python scripts/aa_verdict.py [--sweeps 2000] [--replicates 3 5 10] [--tolerances 0 0.01 derived] [--seed 38]

Without --tolerances: each installed family's default (its record's `quality_tolerance`, else "derived": the
standard deviation of the baseline's final metric over its replicates), plus 0 (the old default) for comparison.
The target is the report's default (the worst final metric of the configurations that could keep quality). Prints
one line per (tolerance, n): the share of sweeps whose verdict is "fastest" (the promise: at most 5 %), "tie",
"undecided" and "no verdict". Noise model of tests/test_verdict.py: lognormal job noise 10 %, a round drift of 20 %
shared by the round, one job in ten slowed 1.5-3x, a seed effect of 10 % on the samples a configuration needs.
"""

from __future__ import annotations

import argparse
import math
import time
from collections import Counter

import numpy as np

from sweeplab.study.verdict import Job, summarize

CURVE_SAMPLES = np.arange(2000, 100_001, 2000)
PLATEAU = 0.95
CONFIGS = 4


def aa_sweep(rng: np.random.Generator, replicates: int) -> list[Job]:
    """Four configurations that differ only in their label: the same speed and the same learning curve."""
    jobs = []
    for round_ in range(replicates):
        drift, seed_effect = rng.normal(0.0, 0.20), rng.normal(0.0, 0.10)
        for index in range(CONFIGS):
            scale = 5000.0 * math.exp(seed_effect + rng.normal(0.0, 0.02))
            values = PLATEAU * (1.0 - np.exp(-CURVE_SAMPLES / scale))
            final = float(values[-1] + rng.normal(0.0, 0.002))
            values[-1] = final
            slowed = rng.random() < 0.10
            noise = rng.normal(0.0, 0.10) - slowed * math.log(rng.uniform(1.5, 3.0))
            speed = 1000.0 * math.exp(drift + noise)
            jobs.append(Job(f"label{index}", round_, round_, speed, final,
                            list(zip(CURVE_SAMPLES.tolist(), values.tolist()))))
    return jobs


def family_tolerances() -> dict[str, float | None]:
    """{family: its default tolerance (None: derived)} of every installed family."""
    from sweeplab.families import get_family, names

    found = {}
    for name in names():
        try:
            found[name] = get_family(name).quality_tolerance
        except Exception as exc:  # a family that does not load here says why and is skipped
            print(f"# {name}: not loaded ({exc})")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweeps", type=int, default=2000)
    parser.add_argument("--replicates", type=int, nargs="+", default=[3, 5, 10])
    parser.add_argument("--tolerances", nargs="+", default=None, help="numbers or 'derived'")
    parser.add_argument("--seed", type=int, default=38)
    args = parser.parse_args()
    if args.tolerances is None:
        defaults = family_tolerances()
        tolerances: dict[str, float | None] = {"0 (the old default)": 0.0}
        for value in dict.fromkeys(defaults.values()):
            users = ", ".join(name for name, v in defaults.items() if v == value)
            tolerances[f"{'derived' if value is None else f'{value:g}'} ({users})"] = value
    else:
        tolerances = {t: (None if t == "derived" else float(t)) for t in args.tolerances}
    print(f"{args.sweeps} seeded A/A sweeps of {CONFIGS} identical configurations (seed {args.seed})")
    for label, tolerance in tolerances.items():
        for replicates in args.replicates:
            rng = np.random.default_rng([args.seed, replicates])
            kinds: Counter[str] = Counter()
            started = time.perf_counter()
            for _ in range(args.sweeps):
                kw = {} if tolerance is None else {"quality_tolerance": tolerance}
                kinds[summarize(aa_sweep(rng, replicates), baseline="label0", metric_name="val/cos", **kw).verdict.kind] += 1
            shares = ", ".join(f"{kind} {kinds[kind] / args.sweeps:.1%}"
                               for kind in ("fastest", "tie", "undecided", "no verdict") if kinds[kind])
            print(f"tolerance {label}, n = {replicates}: names a configuration fastest in "
                  f"{kinds['fastest'] / args.sweeps:.1%} ({shares}; {time.perf_counter() - started:.0f} s)",
                  flush=True)


if __name__ == "__main__":
    main()
