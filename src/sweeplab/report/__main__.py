"""Comparison tables and plots from MLflow: the verdict, one row per configuration, one row per job of a sweep (or
an experiment, or a multirun dir).

    python -m sweeplab.report [--sweep RUN_ID|DIR|SWEEP_ID | --multirun-dir DIR | --experiment NAME] [--baseline RUN]
                              [--target VALUE] [--quality-tolerance VALUE] [--out DIR]

The command line of sweeplab.report.tables (what the report holds is said there): which sweep, experiment or
multirun dir to read, the verdict's flags (else what the sweep ran with: its run's `report.*` tags), where the
files go; report.md is printed, the files are listed and logged to the sweep's run, `report: <report.html>` last.
Expected mistakes print one `error: ...` line and exit with status 2.
"""

from __future__ import annotations

from sweeplab.core.interrupts import exit_on_interrupt

with exit_on_interrupt("report"):  # before the imports: Ctrl-C in their first seconds is one line too
    import argparse
    import logging
    import math
    import sys
    from pathlib import Path

    from sweeplab.core import channels, cli
    from sweeplab.core.console import quiet_libraries
    from sweeplab.core.errors import UserError, report_user_error
    from sweeplab.core.files import check_folder_path
    from sweeplab.core.records import SweepRun
    from sweeplab.report.tables import report_of, still_running, write_report
    from sweeplab.study.record import VerdictOptions
    from sweeplab.study.sweep import read_experiment, read_sweep
    from sweeplab.tracking import mlflow_store, runs

log = logging.getLogger("sweeplab.report.tables")  # the logger these lines always had


def main(argv: list[str] | None = None) -> int:
    parser = cli.ArgumentParser(prog="python -m sweeplab.report", description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--sweep", help="a sweep's run id, folder or sweep id (<date>/<time>; default: the latest "
                                        "finished sweep)")
    source.add_argument("--multirun-dir", help="a multirun/<date>/<time> directory")
    source.add_argument("--experiment", help="every run of an MLflow experiment")
    parser.add_argument("--experiment-name", default=None, help="where to look for the latest sweep (default: every experiment)")
    parser.add_argument("--tracking-uri", default=None)
    parser.add_argument("--baseline", default=None, help="speedup baseline: row number or run-name substring (default: first CPU run)")
    parser.add_argument("--target", type=float, default=None,
                        help="the monitored metric's value to reach (default: the sweep's report.target, else the "
                             "worst final metric of any job of the configurations that keep quality)")
    parser.add_argument("--quality-tolerance", type=float, default=None,
                        help="how much worse than the baseline's final metric still keeps quality (metric units; "
                             "default: the sweep's report.quality_tolerance, else the family's, else the "
                             "baseline's replicate spread)")
    parser.add_argument("--indifference", type=float, default=None,
                        help="a ratio >= 1: the verdict may name the fastest or one within this factor of it "
                             "(default: the sweep's report.indifference, else 1: only the fastest)")
    parser.add_argument("--out", default=None, help="where report.md/.csv/.png go (default: the sweep dir or reports/)")
    args = parser.parse_args(argv)
    quiet_libraries()  # matplotlib's note on building its font cache, on a first run
    try:
        check_arguments(args)
        return _report(args)
    except Exception as exc:  # a wrong URI, sweep id or experiment, an unwritable --out: one line, exit status 2
        return report_user_error(exc)


def check_arguments(args: argparse.Namespace) -> None:
    """Options that conflict or could never apply are refused in one line rather than ignored."""
    picked = [name for name in ("sweep", "multirun_dir", "experiment") if getattr(args, name)]
    if args.experiment_name is not None and picked:
        raise UserError(f"--experiment-name picks the latest sweep; it does nothing with --{picked[0].replace('_', '-')}")
    for name in ("target", "quality_tolerance", "indifference"):  # the flags' own names (argparse's dests)
        value = getattr(args, name)
        if value is not None and not math.isfinite(value):
            raise UserError(f"--{name.replace('_', '-')} must be a finite number, got {value}")
    if args.quality_tolerance is not None and args.quality_tolerance < 0:
        raise UserError(f"--quality-tolerance must be >= 0 (metric units worse than the baseline), got {args.quality_tolerance}")
    if args.out is not None:
        check_folder_path(args.out, "--out")


def asked_of_the_sweep(args: argparse.Namespace, run: SweepRun) -> VerdictOptions:
    """The verdict's target and tolerance: the flags', else what the sweep was run with (its run's record; none for
    an experiment's runs), else the defaults."""
    return VerdictOptions.of_sweep(run, target=args.target, quality_tolerance=args.quality_tolerance,
                                    indifference=args.indifference, baseline_run=args.baseline)


def _report(args: argparse.Namespace) -> int:
    uri = mlflow_store.resolve_uri(args.tracking_uri)
    mlflow_store.open_existing_store(uri)  # read-only: an unreachable server or a missing sqlite file fails now

    if args.experiment:
        out = Path(args.out or Path("reports") / args.experiment)
        sweep = read_experiment(uri, args.experiment)
        sweep.baseline_job(args.baseline)  # a --baseline that names no job, or several configurations: one line now
        report = write_report(sweep, out, args.experiment, args.baseline, asked_of_the_sweep(args, SweepRun()))
    else:
        parent = mlflow_store.sweep_named(uri, args.sweep) if args.sweep else None  # a run id, folder or sweep id
        out = Path(args.out) if args.out else None
        if args.multirun_dir:
            marker = Path(args.multirun_dir) / channels.PARENT_RUN_FILE
            if not marker.exists():
                print(f"error: {marker} not found: is {args.multirun_dir} a sweeplab multirun dir?", file=sys.stderr)
                return 2
            parent = marker.read_text(errors="replace").strip()
            if not parent:  # never the store's latest sweep (another study's) reported into this folder
                print(f"error: {marker} is empty: it should hold the sweep run's id (the study was stopped as it "
                      "opened); pass --sweep <run id>", file=sys.stderr)
                return 2
            out = out or Path(args.multirun_dir)
        parent = parent or mlflow_store.latest_sweep(uri, args.experiment_name)
        if parent is None:
            where = f" (experiment {args.experiment_name!r})" if args.experiment_name else ""
            print(f"error: no sweep found in {uri}{where}; run `make sweep` first", file=sys.stderr)
            return 2
        mlflow_store.get_run(uri, parent, "--sweep")  # an unknown run id: one line naming the flag
        sweep = read_sweep(uri, parent)
        sweep_dir = sweep.run.sweep_dir
        options = asked_of_the_sweep(args, sweep.run)
        sweep.baseline_job(args.baseline)  # a --baseline that names no job, or several configurations: one line now
        if out is None:
            out = Path(sweep_dir) if sweep_dir and Path(sweep_dir).exists() else Path("reports")
        report = report_of(sweep, out, args.baseline, options, still_running(sweep))
        for path in report.files:  # the plots and tables travel with the sweep's parent run too
            try:
                runs.log_artifacts(uri, parent, [path], "report")
            except Exception as exc:
                log.warning("could not log %s to run %s: %s", path, parent, exc)
    print(report.markdown)
    print("written: " + ", ".join(str(p) for p in report.files))
    print(f"report: {report.html}")
    return 1 if report.failed else 0


if __name__ == "__main__":
    with exit_on_interrupt("report"):
        status = main()
    raise SystemExit(status)
