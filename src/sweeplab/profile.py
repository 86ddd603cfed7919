"""`make profile`: where a configuration's training step time goes, as a table, plus a torch.profiler trace.

    python -m sweeplab.profile [--steps N] [train overrides, e.g. model=pagating_lm backend=cuda trainer.precision=bf16-mixed]

One ordinary sweeplab job (MLflow run and all) with `timing=profile`: after warm-up, `--trace-steps` steps are
recorded with torch.profiler (trace.json.gz: open it in https://ui.perfetto.dev or chrome://tracing), then `--steps`
steps are timed phase by phase. Lightning's profiler hooks name the phases (data loading, forward = training_step,
backward, optimizer = step + zero_grad + clipping, the rest is the framework's hooks, callbacks and logging);
`callbacks.profiler.PhaseProfiler` times them with a device sync at every edge, which Lightning's SimpleProfiler
does not do (on a GPU it would time kernel launches), and keeps exclusive times, so nested phases are not counted
twice. The table goes to profile.md beside the trace, to stdout, and with the trace to the run's MLflow artifacts
(`profile/`); the shares are also run metrics (`profile/<phase>_share`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import sys
from pathlib import Path

from omegaconf import open_dict

from sweeplab.core import cli
from sweeplab.core.console import quiet_libraries
from sweeplab.core.errors import exit_on_user_error
from sweeplab.families import missing_config_hint


def main(argv: list[str] | None = None) -> int:
    parser = cli.ArgumentParser(prog="python -m sweeplab.profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="train overrides (model=..., backend=..., data.batch_size=...)")
    parser.add_argument("--steps", type=int, default=30, help="timed, profiled steps (default 30)")
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--trace-steps", type=int, default=3, help="steps in the torch.profiler trace (0: none)")
    parser.add_argument("--out", default=None, help="where profile.md and trace.json.gz go (default reports/profile/<time>)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s] %(message)s")
    quiet_libraries()

    out = Path(args.out or Path("reports") / "profile" / dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S"))
    max_steps = args.warmup_steps + args.trace_steps + args.steps
    try:
        cfg = _config(args, out, max_steps)
        cli.check_writable(out)
    except Exception as exc:
        exit_on_user_error(exc)
    # deferred: training imports torch and Lightning (seconds); --help and mistakes on the command line answer first
    from sweeplab.engine.training import train

    try:
        train(cfg, output_dir=out / "job")  # its own checkpoints, not a shared outputs/checkpoints/
    except Exception as exc:
        exit_on_user_error(exc)
    table = out / "profile.md"
    print(table.read_text(encoding="utf-8"))
    print("written: " + ", ".join(str(p) for p in sorted(out.iterdir())))
    return 0


def _config(args: argparse.Namespace, out: Path, max_steps: int):
    """The profiled job's config: the user's overrides inside the profile's own settings."""
    cfg = cli.compose(
        "train",
        [
            "timing=profile",
            "logger.experiment_name=sweeplab-profile",  # profiled runs stay out of the studies' charts
            "trainer.enable_progress_bar=false",  # the table is the output (trainer.enable_progress_bar=true wins)
            *args.overrides,
            f"timing.warmup_steps={args.warmup_steps}",
            f"timing.trace_steps={args.trace_steps}",
            f"timing.window={max(1, min(20, args.steps))}",
            f"trainer.max_steps={max_steps}",
            f"trainer.val_check_interval={max_steps}",  # one validation, after the profiled steps
            "trainer.limit_val_batches=2",
        ],
        hint=missing_config_hint,
    )
    with open_dict(cfg):
        cfg.timing.profile_dir = str(out.resolve())
        if "checkpoint" in cfg and "every_n_steps" in cfg.checkpoint:
            cfg.checkpoint.every_n_steps = max_steps + 1
            cfg.checkpoint.every_n_seconds = None
    return cfg


if __name__ == "__main__":
    sys.exit(main())
