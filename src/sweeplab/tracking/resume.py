"""Resuming a run: find the interrupted run of the same configuration and the checkpoint it left, and check a
checkpoint against the configuration and the run it continues before anything is touched.

What a resume may change (everything else must equal the run's params, or the checkpoint's model):
- `resume` itself;
- `trainer.max_steps`, to extend (or shorten) a run, and the keys that follow it by interpolation (the LM's
  `model.unit_options.schedule_steps`): the LR and α schedules are recomputed for the new length from the
  checkpoint's step on. MLflow params cannot change, so the run keeps the values it started with as params and
  gets a `changed_on_resume.<key>` tag (`old -> new (from step N)`) per changed key, its `config.yaml` replaced by
  the new configuration and its config hash updated. `resume=true` finds the run by its configuration with these
  keys left out (`resumable_hash`), so a changed `trainer.max_steps` finds it too; a run of exactly this
  configuration (`config_hash`) is preferred.
A run a kill -9 left RUNNING without a checkpoint is closed KILLED by the `resume=true` that finds it
(`close_abandoned_runs`: its folder's run lock is free), and that command says so in one line.
A FINISHED run is resumed only to train it longer (a larger `trainer.max_steps`), and then into a new run tagged
`extends` (its id): MLflow cannot take metric points back, so a finished run is never written to again, and an
extension that fails (a damaged checkpoint's weights diverging, a kill, a full disk) leaves it as it was.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweeplab.core.errors import UserError
from sweeplab.core.files import run_lock_is_free
from sweeplab.core.records import JOB, JobRun
from sweeplab.tracking import mlflow_store

log = logging.getLogger(__name__)

IGNORED_KEYS = ("resume",)
MAY_CHANGE = (JOB.max_steps,)  # the config key trainer.max_steps, and the keys that follow it (`may_change`)


def config_hash(container: Mapping[str, Any]) -> str:
    """A stable hash of what the job trains (the resume setting itself excluded)."""
    relevant = {k: v for k, v in container.items() if k not in IGNORED_KEYS}
    return hashlib.sha256(json.dumps(relevant, sort_keys=True, default=str).encode()).hexdigest()[:16]


def resumable_hash(container: Mapping[str, Any], may_differ: set[str] | frozenset[str]) -> str:
    """config_hash without the flattened keys of `may_differ` (`may_change`): what a resume must keep."""
    def without(node: Mapping[str, Any], prefix: str) -> dict[str, Any]:
        return {k: without(v, f"{prefix}{k}.") if isinstance(v, Mapping) else v
                for k, v in node.items() if f"{prefix}{k}" not in may_differ}

    return config_hash(without(container, ""))


def find_interrupted_run(uri: str, experiment_name: str, cfg_hash: str, resumable: str | None = None) -> tuple[str, Path]:
    """(run id, last checkpoint) of the newest unfinished run with this configuration (`cfg_hash`), else with this
    configuration but for the keys a resume may change (`resumable`: resumable_hash). Finding none, the runs of
    either a kill -9 left RUNNING before their first checkpoint are closed KILLED and named."""
    client = mlflow_store.client(uri)
    experiment = client.get_experiment_by_name(experiment_name)
    seen = []
    for tag, value in ((JOB.config_hash, cfg_hash), (JOB.resumable_hash, resumable)):
        if experiment is None or value is None:
            continue
        runs = client.search_runs(
            [experiment.experiment_id],
            filter_string=f"tags.`{tag}` = '{value}' and attributes.status != 'FINISHED'",
            order_by=["attributes.start_time DESC"],
            max_results=20,
        )
        for run in map(mlflow_store.record_of, runs):
            ckpt = Path(run.tags.get(JOB.output_dir, "")) / "checkpoints" / "last.ckpt"
            if ckpt.is_file():
                return run.run_id, ckpt
        seen += [run for run in runs if run.info.run_id not in {r.info.run_id for r in seen}]
    if closed := close_abandoned_runs(client, seen):
        raise UserError(
            f"resume=true: run {', '.join(closed)} of this configuration was killed before its first checkpoint, so "
            "nothing can be resumed (it is marked KILLED now); drop resume=true to train it afresh"
        )
    raise UserError(
        f"resume=true: no interrupted run with this configuration and a last checkpoint in {uri} "
        f"(experiment {experiment_name!r}); pass resume=PATH/TO/last.ckpt, or drop resume to start afresh"
    )


def close_abandoned_runs(store, runs) -> list[str]:
    """Mark KILLED those of `runs` (RunRecords or MLflow's runs) still RUNNING whose job is gone: a job killed with -9
    (or by the OOM killer, a power cut) cannot close its own run, so whatever continues after it does. A run is gone
    when its output folder's run lock is free; one whose folder is on another host is left as it is. `store`: the
    tracking URI (or a client). Returns the closed run ids."""
    client = mlflow_store.client(store) if isinstance(store, str) else store
    closed = []
    for run in (r if isinstance(r, mlflow_store.RunRecord) else mlflow_store.record_of(r) for r in runs):
        folder = run.tags.get(JOB.output_dir)
        if run.status == "RUNNING" and folder and run_lock_is_free(Path(folder)):
            mlflow_store.write(client, run.run_id, JobRun(
                error="Killed: its process ended without closing the run (kill -9, the OOM killer, a power cut)"))
            client.set_terminated(run.run_id, "KILLED")
            closed.append(run.run_id)
    if closed:
        log.info("closed %d run(s) left RUNNING by a killed process: %s", len(closed), ", ".join(closed))
    return closed


@dataclass
class ResumePoint:
    checkpoint: Path
    step: int  # the checkpoint's optimizer step
    run_id: str | None  # the MLflow run it continues; None: a new run
    output_dir: Path  # where the job writes its checkpoints from now on
    changes: dict[str, tuple[str, str]]  # param -> (the run's value, this config's); only keys that may change
    extends: str | None = None  # a FINISHED run this job extends into a new run (tagged `extends`)
    run_folder: Path | None = None  # the continued run's output folder as recorded: where its trainer holds the lock


def may_change(raw_config: Mapping[str, Any]) -> set[str]:
    """MAY_CHANGE and the flattened keys whose value is an interpolation of one of them; `raw_config` is the
    config container before resolution."""
    keys = set(MAY_CHANGE)
    for key, value in mlflow_store.flatten(raw_config).items():
        if any(value == f"${{{allowed}}}" for allowed in MAY_CHANGE):
            keys.add(key)
    return keys


def check_model(checkpoint: Mapping[str, Any], path: Path, family: str, model_config: Any, may_differ: set[str]) -> None:
    """The checkpoint holds this family's model with this config's hyperparameters; `model_config`: the config as
    the job resolves it (the data's values filled in: engine.job.resolve_model)."""
    hparams = checkpoint.get("hyper_parameters") or {}
    if hparams.get("family") != family:
        raise UserError(f"resume: checkpoint {path} holds a {hparams.get('family')} model; this config trains {family}")
    saved = mlflow_store.flatten(hparams.get("model") or {}, "model.")
    configured = mlflow_store.flatten(dataclasses.asdict(model_config), "model.")
    differing = sorted(k for k in saved.keys() | configured.keys() if k not in may_differ and saved.get(k) != configured.get(k))
    if differing:
        raise UserError(
            f"resume: checkpoint {path} holds another model than this config: "
            + ", ".join(f"{k} (checkpoint {saved.get(k, '-')}, config {configured.get(k, '-')})" for k in differing)
        )


def check_backend(checkpoint: Mapping[str, Any], path: Path, backend: str) -> None:
    """The checkpoint was written by this kind of loop: the MLX loop's (`mlx`: its optimizer state and data position)
    for backend=mlx, Lightning's for the others; neither reads the other's training state."""
    written = "backend=mlx" if "mlx" in checkpoint else "a PyTorch backend (Lightning)"
    if ("mlx" in checkpoint) != (backend == "mlx"):
        raise UserError(f"resume: checkpoint {path} was written by {written}, and this job trains with backend={backend}; "
                        "resume it with the backend that wrote it")


def check_training_state(checkpoint: Mapping[str, Any], path: Path) -> None:
    """The checkpoint holds the optimizer's state, which resuming restores: a best checkpoint written with
    `checkpoint.best=weights` (the default) holds the weights only, and Lightning's restore failed on it with a
    traceback."""
    if "optimizer_states" not in checkpoint:
        raise UserError(f"resume: checkpoint {path} holds the model's weights only (a best checkpoint, "
                        "checkpoint.best=weights), not the optimizer state training continues from; resume from "
                        "the job's folder or its checkpoints/last.ckpt")


def find_run(uri: str, run_id: str) -> mlflow_store.RunRecord | None:
    """The run with this id in this store, or None (another store's run, or deleted)."""
    from mlflow.exceptions import MlflowException

    if uri.startswith(("http://", "https://")):
        mlflow_store.check_server(uri)
    try:
        run = mlflow_store.client(uri).get_run(run_id)
    except MlflowException:
        return None
    return None if run.info.lifecycle_stage == "deleted" else mlflow_store.record_of(run)


def param_changes(run: mlflow_store.RunRecord, params: Mapping[str, str], may_differ: set[str], path: Path) -> dict[str, tuple[str, str]]:
    """{key: (old, new)} for the params of `run` this config changes; refuses any change outside `may_differ`."""
    old = run.params
    differing = sorted(k for k in old.keys() | params.keys() if k not in IGNORED_KEYS and old.get(k) != params.get(k))
    refused = [k for k in differing if k not in may_differ]
    if refused:
        raise UserError(
            f"resume: checkpoint {path} continues run {run.run_id}, whose settings differ from this config: "
            + ", ".join(f"{k} (run {old.get(k, '-')}, config {params.get(k, '-')})" for k in refused)
            + f"; a resume may change only {', '.join(MAY_CHANGE)}"
        )
    return {k: (old.get(k, "-"), params.get(k, "-")) for k in differing}
