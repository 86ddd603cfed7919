"""sweeplab's runs read and written by id: every call to MLflow's client that the study, the report, the bench, the
export and the UI need, behind one function each, so that no module outside tracking/ imports mlflow or holds a
client (tests/test_layers.py).

Runs come back as `mlflow_store.RunRecord`s (plain dicts; `sweeplab.core.records` reads its typed records from them)
and go in as records (`create`, `mlflow_store.write`). Every function takes the store's URI (`mlflow_store.resolve_uri`):
MLflow keeps one store per URI in the process, so a client per call costs nothing worth keeping one for.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweeplab.core.records import CONFIGURATION_ROLE, JOB
from sweeplab.tracking import mlflow_store
from sweeplab.tracking.mlflow_store import RunRecord

MAX_RESULTS = 10000  # runs one search returns: more than any study has
METRICS_PER_BATCH = 1000  # MLflow's limit per log_batch


@dataclass(frozen=True)
class MetricPoint:
    """One logged value of a metric: the step it was logged at, the value, when (ms since the epoch)."""

    step: int
    value: float
    timestamp_ms: int


def fetch(uri: str, run_id: str) -> RunRecord:
    """The run `run_id` as it is now (MLflow's error where the store has none: mlflow_store.read_run names the flag)."""
    return mlflow_store.record_of(mlflow_store.client(uri).get_run(run_id))


def search(uri: str, experiment_ids: Sequence[str], filter_string: str = "", newest_first: bool = False,
           max_results: int = MAX_RESULTS, with_deleted: bool = False) -> list[RunRecord]:
    """Runs of the experiments matching an MLflow search filter, in the order they started (newest first if asked);
    `with_deleted`: the runs deleted in MLflow (its UI's trash, `mlflow runs delete`) too, by their
    `lifecycle_stage`."""
    from mlflow.entities import ViewType

    runs = mlflow_store.client(uri).search_runs(
        list(experiment_ids), filter_string=filter_string, max_results=max_results,
        run_view_type=ViewType.ALL if with_deleted else ViewType.ACTIVE_ONLY,
        order_by=[f"attributes.start_time {'DESC' if newest_first else 'ASC'}"])
    return [mlflow_store.record_of(run) for run in runs]


def children(uri: str, parent_run_id: str, experiment_id: str | None = None, role: str | None = None,
             with_deleted: bool = False) -> list[RunRecord]:
    """The runs nested under `parent_run_id` (those of one role: `records.CONFIGURATION_ROLE`), in the order they
    started; `experiment_id` where the caller has it saves a look-up; `with_deleted`: those deleted in MLflow too."""
    if experiment_id is None:
        experiment_id = fetch(uri, parent_run_id).experiment_id
    return search(uri, [experiment_id], mlflow_store.children_filter(parent_run_id, role), with_deleted=with_deleted)


def job_runs(uri: str, parent_run_id: str, experiment_id: str | None = None,
             with_deleted: bool = False) -> list[RunRecord]:
    """A sweep's job runs (its children but its configuration runs), in the order they started; `with_deleted`:
    those deleted in MLflow too (their `lifecycle_stage` is "deleted")."""
    return [run for run in children(uri, parent_run_id, experiment_id, with_deleted=with_deleted)
            if mlflow_store.is_job_run(run)]


def configuration_runs(uri: str, parent_run_id: str, experiment_id: str | None = None) -> list[RunRecord]:
    return children(uri, parent_run_id, experiment_id, CONFIGURATION_ROLE)


def experiment_id(uri: str, experiment_name: str) -> str | None:
    """The id of the experiment named so; None when the store has none."""
    experiment = mlflow_store.client(uri).get_experiment_by_name(experiment_name)
    return None if experiment is None else experiment.experiment_id


def experiment_runs(uri: str, experiment_name: str) -> list[RunRecord] | None:
    """Every run of an experiment, in the order they started; None when the store has no such experiment."""
    found = experiment_id(uri, experiment_name)
    return None if found is None else search(uri, [found])


def newest_run_since(uri: str, experiment_id: str, since_ms: int) -> RunRecord | None:
    """The newest run of the experiment started at or after `since_ms`."""
    runs = search(uri, [experiment_id], f"attributes.start_time >= {since_ms}", newest_first=True, max_results=1)
    return runs[0] if runs else None


def metric_history(uri: str, run_id: str, key: str) -> list[MetricPoint]:
    """Every value the run logged of the metric `key`, by step then time."""
    history = mlflow_store.client(uri).get_metric_history(run_id, key)
    return sorted((MetricPoint(m.step, m.value, m.timestamp) for m in history),
                  key=lambda p: (p.step, p.timestamp_ms))


def create(uri: str, experiment_id: str, record: Any, start_ms: int | None = None, context: bool = False) -> str:
    """A new run holding `record` (sweeplab.core.records: its tags, its name among them, at creation; its params and
    metrics in one batch after); `context`: with MLflow's own context tags (user, source, git commit) as its fluent
    runs get them. Its id."""
    logged = record.to_mlflow()
    tags = mlflow_store.context_tags(logged.tags) if context else logged.tags
    run = mlflow_store.client(uri).create_run(experiment_id, start_time=start_ms, tags=tags,
                                              run_name=logged.tags.get(JOB.name))
    mlflow_store.write(uri, run.info.run_id, record, tags=False)
    return run.info.run_id


def end(uri: str, run_id: str, status: str, end_ms: int | None = None) -> None:
    """Close the run: FINISHED, FAILED or KILLED (at `end_ms`, else now)."""
    mlflow_store.client(uri).set_terminated(run_id, status, end_time=end_ms)


def reopen(uri: str, run_id: str) -> None:
    """Mark an ended run RUNNING again (a continued sweep's)."""
    mlflow_store.client(uri).update_run(run_id, status="RUNNING")


def delete_tags(uri: str, run_id: str, keys: Iterable[str]) -> None:
    """Remove these tags from the run (what no longer holds, once moved to a history tag)."""
    store = mlflow_store.client(uri)
    for key in keys:
        store.delete_tag(run_id, key)


def delete(uri: str, run_id: str) -> None:
    mlflow_store.client(uri).delete_run(run_id)


def log_history(uri: str, run_id: str, points: Iterable[tuple[str, int, float]]) -> None:
    """Metric points `(key, step, value)` (a curve), in as few batches as MLflow takes."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    metrics = [Metric(key, float(value), now, step) for key, step, value in points]
    store = mlflow_store.client(uri)
    for start in range(0, len(metrics), METRICS_PER_BATCH):
        store.log_batch(run_id, metrics=metrics[start:start + METRICS_PER_BATCH])


def log_artifacts(uri: str, run_id: str, paths: Iterable[str | Path], artifact_path: str | None = None) -> None:
    """Files (or, for a folder, its contents under the folder's name) as the run's artifacts under `artifact_path`."""
    store = mlflow_store.client(uri)
    for path in paths:
        path = Path(path)
        if path.is_dir():
            store.log_artifacts(run_id, str(path), f"{artifact_path}/{path.name}" if artifact_path else path.name)
        else:
            store.log_artifact(run_id, str(path), artifact_path)


def log_dict(uri: str, run_id: str, data: Mapping[str, Any], artifact_file: str) -> None:
    mlflow_store.client(uri).log_dict(run_id, dict(data), artifact_file)


def experiment_tag(uri: str, experiment_id: str, key: str) -> str | None:
    return mlflow_store.client(uri).get_experiment(experiment_id).tags.get(key)


def set_experiment_tag(uri: str, experiment_id: str, key: str, value: str) -> None:
    mlflow_store.client(uri).set_experiment_tag(experiment_id, key, value)


def mlflow_version() -> str:
    import mlflow

    return mlflow.__version__
