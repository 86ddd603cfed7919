"""A sweep job's progress line: where the job stands in its study, how long the study has run and about how long
is left. The launching process hands its start time and job count to the jobs (channels.SWEEP_PROGRESS_ENV)."""

from __future__ import annotations


def progress_line(job_number: int, progress: str | None, now: float, placement: str = "") -> str | None:
    """"sweep: job 3 (the 4th of 8; configuration 1, replicate 1; sweep started 25 s ago, about 42 s left)".

    Job numbers are Hydra's, counted from 0 as its job folders (multirun/<date>/<time>/3), the `hydra_job` tag and
    the sweep's `best: job 3` line count them; `placement` names the job's configuration and replicate in a
    replicated sweep (both counted from 0, as their tags)."""
    try:
        start_text, total_text, *first_text = (progress or "").split()
        start, total, first = float(start_text), int(total_text), int(first_text[0]) if first_text else 0
    except (ValueError, IndexError):
        return None
    done = job_number - first  # a continued sweep's jobs are numbered after its folders; `total` counts its own
    details = [f"the {_ordinal(done + 1)} of {total}"] if 0 <= done < total else []
    if placement:
        details.append(placement)
    elapsed = now - start
    if 0 < done < total:
        left = elapsed / done * (total - done)
        details.append(f"sweep started {_duration(elapsed)} ago, about {_duration(left)} left")
    return f"sweep: job {job_number}" + (f" ({'; '.join(details)})" if details else "")


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"
