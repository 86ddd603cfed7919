"""The export app: `python -m sweeplab.export ckpt_path=PATH` (or `run_id=ID`) [export.KEY=VALUE ...].

See conf/export_model.yaml and conf/export/coreml.yaml. Expected mistakes print one `error: ...` line to stderr and
exit with status 2; nothing is left at the target.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from sweeplab import CONF_DIR
from sweeplab.core import cli
from sweeplab.core.console import quiet_libraries
from sweeplab.core.errors import ConfigError, UserError, exit_on_user_error
from sweeplab.core.files import BEST_CHECKPOINT_GLOB, best_checkpoint_in
from sweeplab.export.options import ExportOptions, options_from_config

APP_KEYS = ("ckpt_path", "run_id", "tracking_uri", "family", "out", "export")
log = logging.getLogger("sweeplab.export")


def check_override_keys(overrides: list[str]) -> None:
    """Unknown keys fail here as one ConfigError line (Hydra's own message for them spans several lines)."""
    from dataclasses import fields

    options = sorted(f.name for f in fields(ExportOptions))
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if "=" not in override or key.startswith("hydra") or key in APP_KEYS:
            continue
        if key.startswith("export."):
            if key.removeprefix("export.") not in options:
                raise ConfigError(key, f"unknown key; accepted: {', '.join(options)}")
        else:
            raise ConfigError(key, f"unknown key; accepted: {', '.join(APP_KEYS)}, export.<option>")


# (option, what it needs, whether the options have it): an option given without it would select nothing
_NEEDS = (
    ("export.nbits", "export.compression=palettize", lambda o, c: o.compression == "palettize"),
    ("export.palettize_mode", "export.compression=palettize", lambda o, c: o.compression == "palettize"),
    ("export.weight_threshold", "export.compression=int8 or palettize", lambda o, c: o.compression != "none"),
    ("export.n_real", "export.real_data=PATH", lambda o, c: bool(o.real_data)),
    ("export.real_data", "export.verify=true", lambda o, c: o.verify),
    ("export.n_real", "export.verify=true", lambda o, c: o.verify),
    ("export.n_random", "export.verify=true", lambda o, c: o.verify),
    ("export.tolerance", "export.verify=true", lambda o, c: o.verify),
    ("tracking_uri", "run_id=ID (a checkpoint path is read without MLflow)", lambda o, c: bool(c.get("run_id"))),
    # Core AI's minimum OS is 27, and coreai-opt's int8 preset quantizes every linear and convolution weight
    ("export.deployment_target", "export.format=coreml (Core AI's minimum is OS 27)", lambda o, c: o.format != "coreai"),
    ("export.weight_threshold", "export.format=coreml (coreai-opt's int8 takes every weight)", lambda o, c: o.format != "coreai"),
)


def given_keys() -> set[str]:
    """The keys set on the command line (none when not run by Hydra's main)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return set()
    return {o.split("=", 1)[0].lstrip("+~") for o in HydraConfig.get().overrides.task if "=" in o}


def check_conflicts(given: set[str], options: ExportOptions, container: dict) -> None:
    """An option given on the command line that the others make do nothing is refused in one line, not ignored."""
    for key, needs, holds in _NEEDS:
        if key in given and not holds(options, container):
            raise ConfigError(key, f"applies only with {needs}; remove it or add that")


def latest_best_offer(uri: str | None) -> str:
    """`; the latest sweep's best run: make export ARGS="run_id=..." (its name)`: the sweep's best job (its
    `best_run_id`), or the best job of the configuration its verdict names fastest; "" when there is none."""
    from sweeplab.core.records import JobRun, SweepRun
    from sweeplab.tracking import mlflow_store, runs

    try:
        uri = mlflow_store.resolve_uri(uri)
        mlflow_store.open_existing_store(uri, writes=False)  # a hint: read only
        parent_id = mlflow_store.latest_sweep(uri)
        if parent_id is None:
            return ""
        sweep = SweepRun.from_run(mlflow_store.read_run(uri, parent_id))
        best, mode = sweep.best_run_id, sweep.objective_mode or "max"
        if not best and sweep.best_verdict == "fastest":
            jobs = [(run.run_id, JobRun.from_run(run)) for run in runs.job_runs(uri, parent_id) if run.status == "FINISHED"]
            scored = [(run_id, job.objective) for run_id, job in jobs
                      if job.config == sweep.best_config and job.objective is not None]
            pick = max if mode == "max" else min
            best = pick(scored, key=lambda scored_job: scored_job[1])[0] if scored else None
        if not best:
            return ""
        name = mlflow_store.read_run(uri, best).name
    except Exception:  # an offer: never the reason the error line fails
        return ""
    return f'; the latest sweep\'s best run: make export ARGS="run_id={best}" ({name})'


def run(cfg: DictConfig) -> Path:
    container = OmegaConf.to_container(cfg, resolve=True)
    container.pop("hydra", None)
    options = options_from_config(container.get("export"))  # every option checked before any work
    check_conflicts(given_keys(), options, container)
    ckpt_path, run_id = container.get("ckpt_path"), container.get("run_id")
    if not ckpt_path and not run_id:
        raise UserError("nothing to export: give ckpt_path=PATH or run_id=MLFLOW_RUN_ID"
                        + latest_best_offer(container.get("tracking_uri")))
    if ckpt_path and run_id:  # which checkpoint, and whose run gets the export's tags, would be a guess
        raise UserError(f"ckpt_path={ckpt_path} and run_id={run_id} name two checkpoints to export; give one")
    if ckpt_path and Path(str(ckpt_path)).is_dir():  # a job's folder: its best checkpoint, as resume=PATH takes one
        best = best_checkpoint_in(str(ckpt_path))
        if best is None:
            raise UserError(f"ckpt_path={ckpt_path} is a folder without a best checkpoint; pass a job's folder or its "
                            f"checkpoints/{BEST_CHECKPOINT_GLOB}")
        ckpt_path = str(best)
    # deferred: the pipeline imports torch and coremltools (seconds); a wrong option fails above without them
    from sweeplab.export.pipeline import checkpoint_from_run, export_checkpoint

    metrics, uri = None, container.get("tracking_uri")
    if run_id:
        tagged, metrics, uri = checkpoint_from_run(str(run_id), uri)
        ckpt_path = tagged
    result = export_checkpoint(
        ckpt_path,
        options,
        container.get("out"),
        expect_family=container.get("family"),
        run_id=str(run_id) if run_id else None,
        tracking_uri=uri,
        metrics=metrics,
    )
    print(f"report: {result.report_md}", flush=True)  # the pipeline's log line already gave the package and summary
    return result.package


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="export_model")
def main(cfg: DictConfig) -> None:
    quiet_libraries()
    try:
        run(cfg)
    except Exception as exc:
        exit_on_user_error(exc)


if __name__ == "__main__":
    try:
        check_override_keys(sys.argv[1:])
    except UserError as exc:
        exit_on_user_error(exc)
    cli.run_hydra_main(main, "export_model")
