"""The MLflow store: where it is, initialising it once, and one run per job with its params, tags and fate.

Default store: `sqlite:///mlflow.db` in the working directory (MLflow >= 3.13 refuses a plain ./mlruns file store).
`MLFLOW_TRACKING_URI` overrides the config. A run's status is always set on the way out: FINISHED, FAILED (with
the reason as the `error` tag and an `error.txt` artifact) or KILLED, so no run is ever left RUNNING.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sweeplab.errors import UserError

DEFAULT_URI = "sqlite:///mlflow.db"
PARENT_RUN_ENV = "SWEEPLAB_PARENT_RUN_ID"
MAX_PARAM_CHARS = 6000


def resolve_uri(configured: str | None = None) -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or configured or DEFAULT_URI


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def init_store(uri: str, experiment_name: str) -> str:
    """Create the store's schema and the experiment if missing; return the experiment id.

    Call once before parallel jobs start: several processes creating a fresh sqlite schema at once fail.
    An unreachable tracking server fails here, fast, with the URI in the message.
    """
    if uri.startswith(("http://", "https://")):
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    client = _client(uri)
    try:
        experiment = client.get_experiment_by_name(experiment_name)
        if experiment is None:
            try:
                return client.create_experiment(experiment_name)
            except Exception:  # another process created it between our two calls
                experiment = client.get_experiment_by_name(experiment_name)
                if experiment is None:
                    raise
        if experiment.lifecycle_stage == "deleted":
            client.restore_experiment(experiment.experiment_id)
        return experiment.experiment_id
    except UserError:
        raise
    except Exception as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"MLflow tracking store {uri} is not usable: {first_line}") from None


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested mapping -> {"a.b.c": "value"}; lists stay as their string form."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = str(value)[:MAX_PARAM_CHARS]
    return flat


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        )
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except Exception:
        return "unknown"


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:500]


class JobRun:
    """One MLflow run for one training job; use as a context manager."""

    def __init__(
        self,
        uri: str,
        experiment_name: str,
        run_name: str,
        tags: Mapping[str, str],
        params: Mapping[str, Any],
        parent_run_id: str | None = None,
        run_id: str | None = None,
    ):
        self.uri = uri
        self.client = _client(uri)
        self.experiment_id = init_store(uri, experiment_name)
        self.experiment_name = experiment_name
        if run_id is not None:  # resuming: reopen the run the checkpoint names
            self.run_id = run_id
            self.client.update_run(run_id, status="RUNNING")
            return
        all_tags = {"mlflow.runName": run_name, **tags}
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = parent_run_id
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags=all_tags)
        self.run_id = run.info.run_id
        self.log_params(params)

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:MAX_PARAM_CHARS]) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=items[i : i + 100])

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step or 0) for k, v in metrics.items()]
        if items:
            self.client.log_batch(self.run_id, metrics=items)

    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, text, artifact_file)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    def set_tag(self, key: str, value: str) -> None:
        self.client.set_tag(self.run_id, key, value)

    def __enter__(self) -> JobRun:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None:
            self.client.set_terminated(self.run_id, "FINISHED")
            return False
        status = "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"
        with contextlib.suppress(Exception):
            exc.sweeplab_run_id = self.run_id  # tells the sweep's failure handling this job is recorded
        with contextlib.suppress(Exception):
            self.client.set_tag(self.run_id, "error", _one_line(exc))
            self.client.log_text(self.run_id, "".join(traceback.format_exception(exc)), "error.txt")
        self.client.set_terminated(self.run_id, status)
        return False


def read_parent_run_id(sweep_dir: str | None) -> str | None:
    """The sweep's parent run: from the environment, or the file the Hydra callback wrote in the sweep dir."""
    if os.environ.get(PARENT_RUN_ENV):
        return os.environ[PARENT_RUN_ENV]
    if sweep_dir:
        marker = Path(sweep_dir) / "mlflow_parent_run_id"
        if marker.exists():
            return marker.read_text().strip() or None
    return None


def write_text_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
        f.write(text)
        tmp = f.name
    os.replace(tmp, path)
