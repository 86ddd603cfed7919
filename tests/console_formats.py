"""The lines sweeplab's entry points print, as formats: anything else on a console is a library's (a banner, a tip, a
progress bar, a profiler's trace marks) and fails the tests that run an entry point (tests/test_console.py and the
train, bench and profile smoke runs).

A line is sweeplab's when it is
- a log line of a `sweeplab.*` logger whose message has one of MESSAGES' formats, in the format of a Hydra job's log
  (`[time][logger][LEVEL] - message`) or of the bench's and profile's (`[time][logger] message`);
- a line of the launching process (`[time][HYDRA] ...`): Hydra's launch lines (`Launching N jobs locally`, `#N :
  <overrides>`, the joblib launcher's two) and sweeplab's sweeper's (`sweep: ...`);
- a line of a document sweeplab prints whole (the sweep's report.md, bench.md, profile.md: passed in), or one of
  PRINTED's closing lines.
"""

from __future__ import annotations

import re

_STAMP = r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\]"
_LOG_LINE = re.compile(_STAMP + r"\[(?P<logger>[\w.]+)\](?:\[(?:INFO|WARNING|ERROR)\] -)? (?P<message>.*)")
# the launching process logs every logger's lines as `[time][HYDRA] message`: Hydra's launchers' and sweeplab's
# sweeper and sweep callback ("sweep: 4 configurations x 5 replicates, 5 rounds")
_HYDRA_LAUNCH = re.compile(_STAMP + r"\[HYDRA\] (?:Launching \d+ jobs locally|\t#\d+ : .*"  # basic launcher
                          r"|Joblib\.Parallel\(.*\) is launching \d+ jobs|Launching jobs, sweep output dir : .*"  # joblib
                          r"|sweep: .+)")

_DURATION = r"\d+(?:\.\d)? (?:s|min|h)"
_DONE = (
    r"done(?: \(not tracked\))?: (?:.+: )?(?:best \S+ -?[\d.e+-]+|\S+ n/a)(?:, stopped at step \d+ of \d+)?"
    r"(?:, [\d,]+ samples/s)?(?:, [\d.]+ ms/step)?"
    r"(?:; best checkpoint \S+)?"
    r"(?:; (?:https?://[^/\s]+/#/experiments/\d+/runs/\w+\?\S*|run \w{32} \(`make ui` shows it\)))?"
)
# {logger: [message formats]}
MESSAGES = {
    "sweeplab.sweep.callback": [
        rf"sweep: job \d+ \(the \d+(?:st|nd|rd|th) of \d+(?:; configuration \d+, replicate \d+)?"
        rf"(?:; sweep started {_DURATION} ago, about {_DURATION} left)?\)",
    ],
    "sweeplab.engine.job": [_DONE],
    # the job's set-up in segments, at its first training batch (sweeplab.core.wall)
    "sweeplab.core.wall": [r"set-up [\d.]+ s: \w+ [\d.]+(?:, \w+ [\d.]+)*(?: \(MLflow [\d.]+ s besides\))?"],
    "sweeplab.bench": [r"row .+: .*", r".+ (?:raw loop|sweeplab) \d+: [\d.e+]+ samples/s",
                       r".+: (?:burn-in|pair \d+/\d+): .+ \(\d+ s into the row\)"],
    # a run shorter than its learning-rate warm-up (the bench's rows are, on purpose): said once per process
    "sweeplab.engine.plan": [r"optim\.warmup_steps=\d+ is longer than the run \(trainer\.max_steps=\d+\): .+"],
}
PRINTED = [
    r"best: .+",  # the sweep's closing line after its report
    r"written: .+",  # the files the bench, profile and report wrote
    r"report: /.+/report\.html",  # the sweep's and the report's last line: where its page is
    # the sweep's closing line: where `make ui` opens its comparison, or how to get that address
    r"the comparison in the MLflow UI: (?:https?://\S+|`make ui` prints its address \(sweep run \w{32}\))",
    r"every replicate's curve \(the spread\): https?://\S+",  # its second line, for a replicated sweep
]


def _is_own(line: str) -> bool:
    if not line.strip() or _HYDRA_LAUNCH.fullmatch(line) or any(re.fullmatch(p, line) for p in PRINTED):
        return True
    logged = _LOG_LINE.fullmatch(line)
    return bool(logged) and any(
        re.fullmatch(p, logged["message"]) for p in MESSAGES.get(logged["logger"], ())
    )


def foreign_lines(output: str, *documents: str) -> list[str]:
    """The lines of `output` (a command's stdout and stderr) that are none of sweeplab's; `documents`: the texts the
    command printed whole (its report.md, bench.md, profile.md)."""
    printed = {line for document in documents for line in document.splitlines()}
    return [line for line in output.splitlines() if line not in printed and not _is_own(line)]
