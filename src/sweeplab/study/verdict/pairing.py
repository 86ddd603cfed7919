"""Pairing: a configuration's jobs against the baseline's by round (or host), and each configuration's times to the
target per pair key as the selection compares them."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np

from sweeplab.study.verdict.records import Job, PairBy


def _pair_key(job: Job, pair_by: PairBy) -> tuple:
    return (job.host,) if pair_by == "host" else (job.host, job.round)


def _by_pair_key(items: Iterable[tuple[Job, float]], pair_by: PairBy) -> dict[tuple, float]:
    """One value per pair key: the mean of the values of a configuration's jobs that share it (several only with
    pair_by="host", or a round run twice)."""
    grouped: dict[tuple, list[float]] = defaultdict(list)
    for job, value in items:
        grouped[_pair_key(job, pair_by)].append(value)
    return {key: math.fsum(values) / len(values) for key, values in grouped.items()}


def paired_values(
    ours: Iterable[tuple[Job, float]], theirs: Iterable[tuple[Job, float]], pair_by: PairBy
) -> list[tuple[float, float]]:
    """(our value, their value) for every pair key both sides have, values combined within a key first
    (see _by_pair_key). A key one side lacks (a missing round) gives no pair."""
    ours_by_key, theirs_by_key = _by_pair_key(ours, pair_by), _by_pair_key(theirs, pair_by)
    return [(ours_by_key[key], theirs_by_key[key]) for key in sorted(ours_by_key.keys() & theirs_by_key.keys(), key=repr)]


def _log_ratios(pairs: Sequence[tuple[float, float]]) -> np.ndarray:
    """log(numerator) − log(denominator) per pair: inf − inf (both never reached) is NaN, dropped later."""
    return np.array(
        [math.log(a) - math.log(b) if math.isfinite(a) and math.isfinite(b) else _infinite_log_ratio(a, b)
         for a, b in pairs],
        dtype=float,
    )


def _infinite_log_ratio(numerator: float, denominator: float) -> float:
    if math.isinf(numerator) and math.isinf(denominator):
        return math.nan
    return math.inf if math.isinf(numerator) else -math.inf
