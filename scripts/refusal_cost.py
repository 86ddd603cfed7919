"""What a wrong setting costs before its one-line answer: CPU-seconds (user + system) of a real `python -m sweeplab.train`,
for settings refused in a single job, anywhere in a `-m` grid, and `backend=cuda` on a machine without a GPU.

    python scripts/refusal_cost.py [--repeats 5] [--only NAME ...]      (make bench-refusal)

Each case runs `--repeats` times in turn; the table gives the median and the largest CPU-s and the goal (3 CPU-s for a
wrong value, 2 for a device refusal, on the 2-core development machine), and the script exits 1 when a median is over
its goal or a case did not answer with exit 2 and one `error:` line. Measure on a quiet machine: the CPU-seconds of a
process barely move with load, but a busy disk or page cache does show.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data" / "textbridge_demo"
COMMON = ["model.out_dim=64", "debug=smoke"]

# (name, overrides, goal in CPU-s)
CASES = [
    ("report.target=nan", ["report.target=nan"], 3.0),
    ("replicates=sometimes", ["replicates=sometimes"], 3.0),
    ("compile_scope=regions", ["compile_scope=regions"], 3.0),
    ("stop.confirm=-1", ["stop.confirm=-1", "report.target=0.5"], 3.0),
    ("trainer.precision=fp8", ["trainer.precision=fp8"], 3.0),
    ("data.val_fraction=1.5", ["data.val_fraction=1.5"], 3.0),
    ("export.precision=fp8", ["export=coreml", "export.precision=fp8"], 3.0),
    ("loss.beta=-1", ["loss.beta=-1"], 3.0),
    ("grid loss.alpha=0.5,nan", ["-m", "loss.alpha=0.5,nan"], 3.0),
    ("grid data.batch_size=8,-16", ["-m", "data.batch_size=8,-16"], 3.0),
    ("grid checkpoint.every_n_steps=2,0", ["-m", "hydra/sweeper=sweeplab", "replicates=2",
                                           "checkpoint.every_n_steps=2,0"], 3.0),
    ("backend=cuda without a GPU", ["backend=cuda"], 2.0),
]


def measure(overrides: list[str], data: Path, work: Path) -> tuple[float, subprocess.CompletedProcess]:
    """One `python -m sweeplab.train` in `work`: its CPU-seconds and its result."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run([sys.executable, "-m", "sweeplab.train", *overrides, f"data.path={data}", *COMMON,
                             f"hydra.sweep.dir={work / 'sweep'}", f"hydra.run.dir={work / 'run'}"],
                            cwd=work, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "MLFLOW_TRACKING_URI": (work / "mlruns").as_uri()})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), result


def answered(result: subprocess.CompletedProcess) -> bool:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    return result.returncode == 2 and bool(lines) and lines[-1].startswith("error: ") and "Traceback" not in result.stderr


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", nargs="*", help="case names (the table's first column) to run; default: all")
    parser.add_argument("--data", type=Path, default=DATA, help="the prepared demo data (make data)")
    args = parser.parse_args(argv)
    if not (args.data / "manifest.json").exists():
        print(f"error: --data {args.data}: no prepared demo data there (make data)", file=sys.stderr)
        return 2
    cases = [case for case in CASES if not args.only or case[0] in args.only]
    if shutil.which("nvidia-smi"):  # with a GPU, backend=cuda trains instead of refusing
        cases = [case for case in cases if "backend=cuda" not in case[1]]
    rows, over = [], []
    with tempfile.TemporaryDirectory(prefix="refusal-cost-") as tmp:
        for name, overrides, goal in cases:
            costs = []
            for repeat in range(args.repeats):
                work = Path(tmp) / f"{len(rows)}-{repeat}"
                work.mkdir()
                cost, result = measure(overrides, args.data, work)
                if not answered(result):
                    tail = result.stderr.strip().splitlines()[-1:] or ["(nothing on stderr)"]
                    print(f"error: {name}: exit {result.returncode}, not a one-line refusal: {tail[0]}",
                          file=sys.stderr)
                    return 1
                costs.append(cost)
            median = statistics.median(costs)
            rows.append((name, median, max(costs), goal))
            if median >= goal:
                over.append(name)
            print(f"{name}: median {median:.2f} CPU-s over {len(costs)}", file=sys.stderr, flush=True)
    print(f"\n{args.repeats} runs each; load average (1 min) at the end: {os.getloadavg()[0]:.1f}\n")
    print("| setting | median CPU-s | largest | goal |\n|---|---|---|---|")
    for name, median, largest, goal in rows:
        print(f"| {name} | {median:.2f} | {largest:.2f} | < {goal:g} |")
    if over:
        print(f"over the goal: {', '.join(over)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
