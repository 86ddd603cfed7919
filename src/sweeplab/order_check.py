"""Does a job's speed depend on its place in the sweep? Runs a sweep's jobs in their order and again reversed and
compares each configuration's samples/s.

    python -m sweeplab.order_check sweep=default backend=cuda
    python -m sweeplab.order_check model=pagating_lm sweep=pagating_batch backend=cuda
    python -m sweeplab.order_check debug=smoke data.batch_size=8,16 loss.beta=0.5,0.7   # any sweep of `train -m`

Each order is one `python -m sweeplab.train -m` process running the jobs one after another (Hydra's basic launcher:
each job in the same process as its neighbours, as a plain sweep runs them), so every configuration runs once early
in a process (the first job pays whatever a process pays first) and once late. Hydra runs the product of the swept
values in order; reversing every value list reverses the job order. Prints and writes order_check.md: per
configuration, its place and samples/s in each order, the ratio, and whether the two agree within
`stability.ORDER_TOLERANCE` (±5 %). Exit status 0 when every configuration agrees, 1 when one does not or a job
failed, 2 for bad arguments.

`--rounds N` runs each order N times, counterbalanced (forward, reversed, reversed, forward, ...: a drift of the
machine over the check's minutes weighs on both orders alike), compares each configuration's median samples/s over
its runs in each order, and adds the run-to-run spread: how far the same configuration moved between runs of the
same order, the noise the order ratio is to be read against (a host-bound job on a shared VM moved 12-20 % from
one process to the next, BENCHMARKS.md). A ratio outside ±5 % yet inside that spread still fails the check, and its
verdict says it is inside the spread.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

from sweeplab.core import channels, cli, interrupts, stability
from sweeplab.core.errors import UserError, report_user_error
from sweeplab.core.files import write_text_atomic
from sweeplab.core.records import JobRun
from sweeplab.families import missing_config_hint
from sweeplab.report.tables import format_number, to_markdown
from sweeplab.tracking import mlflow_store, runs

ORDERS = ("forward", "reversed")
_LAUNCHER_KEYS = ("hydra/launcher=", "hydra.launcher.", "hydra.sweep.dir=")  # the check sets these itself


def _compose(overrides: list[str], with_hydra: bool = False):
    """The training config; a mistake in `overrides` raises a one-line UserError."""
    return cli.compose("train", overrides, return_hydra_config=with_hydra, hint=missing_config_hint)


def swept_values(overrides: list[str]) -> tuple[OrderedDict[str, list[str]], list[str]]:
    """({swept key: its values in Hydra's order}, the overrides that sweep nothing). Keys come from the sweep
    preset's `hydra.sweeper.params` first, then the command line (a key given there replaces the preset's values
    in the preset's place), as Hydra's basic sweeper orders them."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    overrides = [o for o in overrides if not o.startswith(_LAUNCHER_KEYS)]
    parser = OverridesParser.create()
    try:
        parsed = parser.parse_overrides(overrides)
    except Exception as exc:  # a syntax error: one line
        raise cli.hydra_error(exc) if cli.is_hydra_error(exc) else exc from None
    fixed = [text for text, o in zip(overrides, parsed) if not o.is_sweep_override()]
    cfg = _compose(fixed, with_hydra=True)
    params = OmegaConf.select(cfg, "hydra.sweeper.params")
    preset = OmegaConf.to_container(params, resolve=False) if params else {}
    swept: OrderedDict[str, list[str]] = OrderedDict()
    for o in [*parser.parse_overrides([f"{k}={v}" for k, v in preset.items()]), *parsed]:
        if not o.is_sweep_override():
            continue
        if not o.is_discrete_sweep():
            raise UserError(f"{o.input_line}: the order check runs discrete sweeps only (a,b,c or range)")
        swept[o.get_key_element()] = list(o.sweep_string_iterator())
    return swept, fixed


def check_swept_values(swept: OrderedDict[str, list[str]], fixed: list[str]) -> None:
    """Compose every swept value once (the others at their first), so that a misspelt swept key or option fails here
    in one line, before any sweep starts, rather than in both child sweeps."""
    first = {key: values[0] for key, values in swept.items()}
    for key, values in swept.items():
        for value in values:
            _compose([*fixed, *(f"{k}={value if k == key else v}" for k, v in first.items())])


def pass_overrides(swept: OrderedDict[str, list[str]], fixed: list[str], order: str, sweep_dir: Path) -> list[str]:
    """The `train -m` arguments of one order: one sequential process, every swept list in that order."""
    lists = [f"{key}={','.join(values[::-1] if order == 'reversed' else values)}" for key, values in swept.items()]
    return [*fixed, *lists, "hydra/launcher=basic", f"hydra.sweep.dir={sweep_dir}"]


def passes(rounds: int) -> list[tuple[str, int]]:
    """(order, round) of each process, counterbalanced: F R, then R F, then F R, ... (ABBA)."""
    out = []
    for r in range(1, rounds + 1):
        out += [(order, r) for order in (ORDERS if r % 2 else ORDERS[::-1])]
    return out


def run_order(overrides: list[str], log_path: Path) -> int:
    """One order's sweep as a child process; a signal to this process is passed on to it (interrupts.run_child)."""
    # replicates=1 after the user's overrides: the check compares one job per configuration and order (its own
    # --rounds are its replicates), whatever a preset such as sweep=default asks for
    with open(log_path, "w", encoding="utf-8") as log:
        return interrupts.run_child([sys.executable, "-m", "sweeplab.train", "-m", *overrides, "replicates=1"],
                                    "sweep", stdout=log, stderr=subprocess.STDOUT)


def results(uri: str, sweep_dir: Path, keys: list[str]) -> dict[tuple, dict]:
    """Configuration (the swept keys' values) -> {position, rate, problems, status} of a finished order."""
    marker = sweep_dir / channels.PARENT_RUN_FILE
    if not marker.exists():
        return {}
    out = {}
    jobs = runs.job_runs(uri, marker.read_text().strip())
    for position, run in enumerate(jobs, start=1):
        record = JobRun.from_run(run)
        config = tuple((record.config_params or {}).get(key, "?") for key in keys)
        out[config] = {
            "position": position,
            "rate": record.samples_per_sec,
            "problems": stability.problems(run.metrics),
            "status": run.status,
        }
    return out


def _merge(runs: list[dict]) -> dict:
    """One configuration's runs in one order -> its position, median rate, run-to-run spread, problems, status."""
    rates = [r["rate"] for r in runs if r.get("rate")]
    merged = {
        "position": runs[0].get("position", "") if runs else "",
        "rate": statistics.median(rates) if rates and len(rates) == len(runs) else None,
        "rates": rates,
        "spread": max(rates) / min(rates) - 1 if len(rates) > 1 else None,
        "problems": sorted({p for r in runs for p in r.get("problems", [])}),
        "status": next((r["status"] for r in runs if not r.get("rate")), "missing") if runs else "missing",
    }
    return merged


def table(keys: list[str], by_pass: dict[tuple[str, int], dict[tuple, dict]]) -> tuple[list[dict[str, str]], int]:
    """Rows in the forward order's job order, and how many configurations disagree between the orders or failed.
    `by_pass`: (order, round) -> configuration -> that run's result; an order's rounds are merged by the median."""
    rounds = max(r for _, r in by_pass)
    merged = {
        order: {
            config: _merge([by_pass[(order, r)].get(config, {}) for r in range(1, rounds + 1) if (order, r) in by_pass])
            for config in set().union(*by_pass.values())
        }
        for order in ORDERS
    }
    forward, backward = merged["forward"], merged["reversed"]
    configs = sorted(forward, key=lambda c: forward[c]["position"] or 10**9)
    rows, bad = [], 0
    for config in configs:
        a, b = forward[config], backward[config]
        row = {"configuration": " ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in zip(keys, config))}
        for name, r in (("forward", a), ("reversed", b)):
            row[f"{name} job"] = str(r["position"])
            row[f"{name} samples/s"] = format_number(r["rate"]) if r["rate"] else r["status"]
        notes = [f"{name}: {'; '.join(r['problems'])}" for name, r in (("forward", a), ("reversed", b)) if r["problems"]]
        row["stability"] = " / ".join(notes) or "ok"
        spreads = [r["spread"] for r in (a, b) if r["spread"] is not None]
        if rounds > 1:
            row["runs (forward; reversed)"] = "; ".join(" ".join(format_number(x) for x in r["rates"]) for r in (a, b))
            row["run to run"] = f"{max(spreads):.1%}" if spreads else ""
        if a["rate"] and b["rate"]:
            ratio = b["rate"] / a["rate"]
            agree = abs(ratio - 1) <= stability.ORDER_TOLERANCE
            row["reversed / forward"] = f"{ratio:.3f}"
            row["verdict"] = "ok" if agree else f"differs by more than ±{stability.ORDER_TOLERANCE:.0%}"
            if not agree and notes:  # a loaded or noisy run can differ without any order effect: say so
                row["verdict"] += " (unreliable runs: see stability)"
            if not agree and spreads and abs(ratio - 1) <= max(spreads):  # as far apart as two runs of one order
                row["verdict"] += f" (inside the run-to-run spread of {max(spreads):.0%})"
        else:
            agree = False
            row["verdict"] = "no throughput: job failed or missing"
        bad += not agree
        rows.append(row)
    return rows, bad


COLUMNS = ["configuration", "forward job", "forward samples/s", "reversed job", "reversed samples/s",
           "reversed / forward", "verdict", "stability"]
ROUNDS_COLUMNS = ["runs (forward; reversed)", "run to run"]  # --rounds N > 1: before "verdict"


def main(argv: list[str] | None = None) -> int:
    parser = cli.ArgumentParser(prog="python -m sweeplab.order_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="what `python -m sweeplab.train -m` takes: sweep=..., a,b values")
    parser.add_argument("--out", default=None, help="output directory (default: multirun/order_check/<time>)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run each order this many times, counterbalanced (F R R F ...); medians are compared")
    args = parser.parse_args(argv)
    interrupts.install()  # a signal while a sweep runs is passed on to it (run_order); otherwise it stops here
    try:
        swept, fixed, uri, out = _setup(args)
        by_pass, failed_passes = _run_passes(args, swept, fixed, uri, out)
        return _write(args, list(swept), by_pass, failed_passes, out, _job_count(swept))
    except interrupts.Interrupted as exc:
        print(f"error: order check {exc}; a sweep it ran was stopped (its MLflow runs end KILLED)", file=sys.stderr)
        return exc.exit_status
    except Exception as exc:
        return report_user_error(exc)


def _job_count(swept: OrderedDict[str, list[str]]) -> int:
    n_jobs = 1
    for values in swept.values():
        n_jobs *= len(values)
    return n_jobs


def _setup(args: argparse.Namespace) -> tuple[OrderedDict[str, list[str]], list[str], str, Path]:
    """Everything checked before the first sweep starts: the arguments, the overrides, the output directory."""
    if args.rounds < 1:
        raise UserError(f"--rounds must be at least 1, got {args.rounds}")
    swept, fixed = swept_values(args.overrides)
    if not swept:
        raise UserError("nothing is swept: give a sweep preset (sweep=default) or comma-separated values "
                        "(data.batch_size=8,16)")
    check_swept_values(swept, fixed)
    uri = mlflow_store.resolve_uri(_compose(fixed).logger.tracking_uri)
    out = cli.check_writable(args.out or Path("multirun") / "order_check" / dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S"))
    return swept, fixed, uri, out


def _run_passes(args, swept, fixed, uri: str, out: Path) -> tuple[dict, list[str]]:
    """Each (order, round) as one `train -m` process; (order, round) -> configuration -> result, and the failed."""
    keys, n_jobs = list(swept), _job_count(swept)
    by_pass, failed_passes = {}, []
    for order, round_ in passes(args.rounds):
        name = f"{order}_{round_}" if args.rounds > 1 else order
        sweep_dir = out / name
        overrides = pass_overrides(swept, fixed, order, sweep_dir)
        print(f"order check: {order} order{f' (round {round_} of {args.rounds})' if args.rounds > 1 else ''}, "
              f"{n_jobs} jobs in one process: python -m sweeplab.train -m {' '.join(overrides)}", flush=True)
        log_path = out / f"{name}.log"
        if run_order(overrides, log_path) != 0:
            failed_passes.append(name)
            print(f"order check: the {name} sweep exited non-zero; its log: {log_path}", file=sys.stderr)
        by_pass[(order, round_)] = results(uri, sweep_dir, keys)
    return by_pass, failed_passes


def _write(args, keys: list[str], by_pass: dict, failed_passes: list[str], out: Path, n_jobs: int) -> int:
    """order_check.md: the table and the verdict; the exit status."""
    rows, bad = table(keys, by_pass)
    command = "python -m sweeplab.order_check " + " ".join(args.overrides) + (f" --rounds {args.rounds}" if args.rounds > 1 else "")
    if not rows:  # not a single job ran in any order: there is nothing to compare, so no verdict
        verdict = (f"no configuration ran: all {n_jobs} jobs of every order failed or never started; "
                   f"see {', '.join(str(out / f'{name}.log') for name in failed_passes) or 'the sweeps logs'}")
    elif not bad:
        verdict = f"every configuration within ±{stability.ORDER_TOLERANCE:.0%} in both orders"
    else:
        verdict = f"{bad} of {len(rows)} configurations differ by more than ±{stability.ORDER_TOLERANCE:.0%} or failed"
    if rows and len(rows) < n_jobs:
        verdict += f"; {n_jobs - len(rows)} of {n_jobs} configurations ran in no order"
    columns = COLUMNS if args.rounds == 1 else [*COLUMNS[:6], *ROUNDS_COLUMNS, *COLUMNS[6:]]
    rounds_note = (f"; each order {args.rounds} times (F R R F ...), samples/s is the median of its runs, run to run "
                   f"the largest spread between runs of one order") if args.rounds > 1 else ""
    markdown = (
        f"## order check\n\n`{command}`\n\nsamples/s (at the median window step time) of each configuration, run in "
        f"the sweep's order and reversed, each order one process{rounds_note}.\n\n{to_markdown(rows, columns)}"
        f"\n\n{verdict}\n"
    )
    write_text_atomic(out / "order_check.md", markdown)
    print(markdown)
    print(f"written: {out / 'order_check.md'}")
    if not rows:
        print(f"error: order check: {verdict}", file=sys.stderr)
    return 1 if bad or failed_passes or not rows or len(rows) < n_jobs else 0


if __name__ == "__main__":
    sys.exit(main())
