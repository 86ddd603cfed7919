"""The training-loss curves of an experiment's runs side by side (a speed switch must not change what is learnt):

    python scripts/loss_curves.py EXPERIMENT [--metric train/loss] [--every N]

MLFLOW_TRACKING_URI names the store. One row per logged step (every Nth), one column per run (its name and its
`compile` param), then each run's last validation metrics.
"""

from __future__ import annotations

import argparse

from sweeplab.core.records import JobRun
from sweeplab.tracking import mlflow_store
from sweeplab.tracking import runs as tracked


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("experiment")
    parser.add_argument("--metric", default="train/loss")
    parser.add_argument("--every", type=int, default=1)
    args = parser.parse_args(argv)
    uri = mlflow_store.resolve_uri()
    runs = tracked.experiment_runs(uri, args.experiment)  # in the order they started
    if runs is None:
        raise SystemExit(f"loss_curves: no experiment {args.experiment!r} in the store")
    curves = {}  # label -> {step: value}; two runs of one name (a seed swept twice) keep apart by their ids
    for run in runs:
        compile_mode = (JobRun.from_run(run).config_params or {}).get("compile", "?")
        label = f"{run.name} [compile={compile_mode}, run {run.run_id[:8]}]"
        curves[label] = {m.step: m.value for m in tracked.metric_history(uri, run.run_id, args.metric)}
    steps = sorted({s for c in curves.values() for s in c})[:: args.every]
    print("| step | " + " | ".join(curves) + " |")
    print("|---|" + "---|" * len(curves))
    for step in steps:
        print(f"| {step} | " + " | ".join(f"{c[step]:.4f}" if step in c else "" for c in curves.values()) + " |")
    for run, label in zip(runs, curves):
        vals = {k: round(v, 4) for k, v in run.metrics.items() if k.startswith("val/")}
        print(f"{label}: {vals}")


if __name__ == "__main__":
    main()
