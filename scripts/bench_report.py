"""The end-of-study report's wall time: `python -m sweeplab.report` on a synthetic default study (4 configurations ×
5 replicates, validations every 10 steps to step 100), this checkout against a baseline commit, interleaved.

    python scripts/bench_report.py                      # this checkout against main, 3 rounds (make bench-report)
    python scripts/bench_report.py --baseline HEAD~3 --rounds 5

Each round runs every source tree once (the order alternates between rounds) on its own copy of one store, so both
see the same runs, in two ways: `cli`, `python -m sweeplab.report` in a new process (MLflow's import and the store's
opening included), and `in-sweep`, the report as the sweep callback's on_multirun_end makes it (tables.sweep_report
and the files logged to the sweep run) in a process that has MLflow imported and the store open already, as the
sweep's has. It prints the wall time, the CPU time (user + system: what a busy machine changes least) and the
1-minute load average before each run, then the medians. The reports' report.md and report.csv must be
byte-identical across the trees (a difference is printed and the exit status is 1).
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = [(32, "1.0"), (32, "0.7"), (64, "1.0"), (64, "0.7")]
REPLICATES = 5


def make_store(uri: str) -> str:
    """A default-study store as the jobs record one; the sweep's parent run id. Runs in a child with this tree's src."""
    from mlflow.tracking import MlflowClient

    from sweeplab.tracking import mlflow_store

    experiment = mlflow_store.init_store(uri, "sweeplab")
    client = MlflowClient(uri)
    parent = client.create_run(experiment, tags={
        "sweeplab.role": "sweep", "sweep_id": "2026-11-27/12-00-00", "sweep_dir": "/nonexistent",
        "report.quality_tolerance": "0.01", "sweep_overrides": "sweep=default backend=cpu"}).info.run_id
    rng = random.Random(7)
    for replicate in range(REPLICATES):
        for index, (batch, alpha) in enumerate(CONFIGS):
            tags = {"mlflow.parentRunId": parent, "mlflow.runName": f"bs={batch} α={alpha} rep={replicate} textbridge small",
                    "family": "textbridge", "backend": "cpu", "device": "AMD EPYC", "precision": "32-true",
                    "compile": "off", "config": f"data.batch_size={batch} loss.alpha={alpha}",
                    "config_index": str(index), "replicate": str(replicate), "round": str(replicate), "host": "h",
                    "seed": str(replicate), "objective": "val/cos", "objective_mode": "max",
                    "hydra_job": str(replicate * len(CONFIGS) + index)}
            run = client.create_run(experiment, tags=tags).info.run_id
            mlflow_store.log_params(client, run, {"data.batch_size": batch, "loss.alpha": alpha, "loss.beta": "0.7",
                                                  "model.size": "small", "trainer.max_steps": 100,
                                                  "trainer.accumulate_grad_batches": 1, "trainer.devices": 1})
            rate = (400 if batch == 32 else 520) * rng.uniform(0.9, 1.1)
            for key, value in {"summary/samples_per_sec": rate, "summary/step_time_s_median": batch / rate,
                               "summary/step_time_spread": 0.05, "summary/batch_shapes": 1.0,
                               "summary/host_cpus": 2.0, "summary/load_avg_start": 0.5, "objective": 0.55}.items():
                client.log_metric(run, key, value)
            for step in range(9, 100, 10):
                seen = (step + 1) * batch / (1200 + 300 * (batch == 64))
                client.log_metric(run, "val/cos", 0.56 - 0.26 * 2.718 ** -seen + rng.uniform(-0.005, 0.005), step=step)
            client.set_terminated(run, "FINISHED")
    return parent


def source_tree(ref: str, into: Path) -> Path:
    """`ref`'s src/ unpacked under `into` (git archive: the checkout's work tree is left alone)."""
    archive = into / "src.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), ref, "src"], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / ref.replace("/", "_"), filter="data")
    return into / ref.replace("/", "_") / "src"


def in_sweep(uri: str, parent: str, out: str) -> None:
    """The callback's report in this process, after what the sweep's process has done already; prints wall and CPU."""
    from sweeplab.report import tables
    from sweeplab.tracking import mlflow_store

    client = mlflow_store.client(uri)
    tags = client.get_run(parent).data.tags
    # what the sweep was run with (the callback reads it from the config; the CLI from its run's record)
    asked = argparse.Namespace(target=None, quality_tolerance=None, baseline=None, indifference=None)
    if hasattr(tables, "asked_of_the_sweep"):  # a tree from before the CLI read the sweep run's typed record
        options = tables.asked_of_the_sweep(asked, tags)
    else:
        from sweeplab.report.__main__ import asked_of_the_sweep
        from sweeplab.study.sweep import read_sweep

        options = asked_of_the_sweep(asked, read_sweep(uri, parent).run)
    wall, cpu = time.perf_counter(), time.process_time()
    report = tables.sweep_report(uri, parent, Path(out), options=options)
    for path in report.files:
        client.log_artifact(parent, str(path), "report")
    print(f"{time.perf_counter() - wall} {time.process_time() - cpu}")


def run_report(mode: str, src: Path, store: Path, parent: str, out: Path) -> tuple[float, float, float]:
    """(wall s, CPU s, load before) of one report run on `store`."""
    load = os.getloadavg()[0]
    env = {**os.environ, "PYTHONPATH": str(src), "MLFLOW_TRACKING_URI": f"sqlite:///{store}"}
    command = ([sys.executable, "-m", "sweeplab.report", "--sweep", parent, "--out", str(out)] if mode == "cli" else
               [sys.executable, __file__, "--in-sweep", f"sqlite:///{store}", parent, str(out)])
    start = time.perf_counter()
    child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = child.communicate()
    wall = time.perf_counter() - start
    if child.returncode not in (0, 1):  # 1: the report says a job failed, still a report
        raise SystemExit(f"report failed ({child.returncode}) with {src}: {stderr[-2000:]}")
    if mode == "cli":
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # cumulative: the difference is this child's
        cpu = usage.ru_utime + usage.ru_stime - run_report.children_cpu
        run_report.children_cpu += cpu
        return wall, cpu, load
    run_report.children_cpu = sum(resource.getrusage(resource.RUSAGE_CHILDREN)[:2])
    wall, cpu = map(float, stdout.split()[-2:])
    return wall, cpu, load


run_report.children_cpu = 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="main", help="git ref to compare with (default: main)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keep", default=None, help="keep the stores and reports in this folder")
    args = parser.parse_args()
    work = Path(args.keep or tempfile.mkdtemp(prefix="bench_report_"))
    work.mkdir(parents=True, exist_ok=True)
    trees = {"baseline " + args.baseline: source_tree(args.baseline, work), "this checkout": ROOT / "src"}
    pristine = work / "study.db"
    pristine.unlink(missing_ok=True)
    made = subprocess.run([sys.executable, __file__, "--make-store", str(pristine)], env={
        **os.environ, "PYTHONPATH": str(ROOT / "src")}, check=True, capture_output=True, text=True)
    parent = made.stdout.strip().splitlines()[-1]
    run_report.children_cpu = sum(resource.getrusage(resource.RUSAGE_CHILDREN)[:2])
    times: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    for round_ in range(args.rounds):
        order = [(mode, name) for mode in ("cli", "in-sweep") for name in trees]
        for mode, name in order if round_ % 2 == 0 else reversed(order):
            tag = f"{mode}-{name.split()[0]}"
            store = work / f"r{round_}-{tag}.db"
            shutil.copy(pristine, store)
            row = run_report(mode, trees[name], store, parent, work / f"out-{tag}")
            times.setdefault((mode, name), []).append(row)
            print(f"round {round_} {mode:8s} {name:24s} wall {row[0]:6.2f} s  CPU {row[1]:5.2f} s  load {row[2]:.1f}",
                  flush=True)
    print(f"\n{'how':8s} {'tree':24s} {'median wall s':>14s} {'median CPU s':>13s}  loads before (1 min)")
    for (mode, name), rows in times.items():
        print(f"{mode:8s} {name:24s} {statistics.median(r[0] for r in rows):14.2f} "
              f"{statistics.median(r[1] for r in rows):13.2f}  {', '.join(f'{r[2]:.1f}' for r in rows)}")
    # each way against itself: the CLI, asked while the sweep's run is RUNNING, says so instead of a verdict
    differ = []
    for mode in ("cli", "in-sweep"):
        first, *others = [work / f"out-{mode}-{name.split()[0]}" for name in trees]
        differ += [f"{o.name}/{f}" for o in others for f in ("report.md", "report.csv")
                   if (first / f).read_bytes() != (o / f).read_bytes()]
    print("report.md, report.csv: " + (f"DIFFER: {', '.join(differ)}" if differ else "identical"))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if differ else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--make-store":
        print(make_store(f"sqlite:///{sys.argv[2]}"))
        raise SystemExit(0)
    if len(sys.argv) == 5 and sys.argv[1] == "--in-sweep":
        in_sweep(*sys.argv[2:])
        raise SystemExit(0)
    raise SystemExit(main())
