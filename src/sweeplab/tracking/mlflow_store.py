"""The MLflow store: where it is, initialising it once, and one run per job with its params, tags and fate.

Default store: `sqlite:///mlflow.db` in the working directory (MLflow >= 3.13 refuses a plain ./mlruns file store).
`MLFLOW_TRACKING_URI` overrides the config; an `http(s)://` URI is an MLflow tracking server (`mlflow server`), and
an unreachable one fails at once with the URI in the message. A relative sqlite path is made absolute, so jobs that
run elsewhere (joblib workers, submitit jobs, DDP ranks) write to the same store. A run's status is always set on the
way out: FINISHED, FAILED (with the reason as the `error` tag and an `error.txt` artifact) or KILLED, so no run is
ever left RUNNING.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import subprocess
import threading
import time
import traceback
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweeplab.core import channels, errors, interrupts, records, wall
from sweeplab.core.channels import PARENT_RUN_ENV, PARENT_RUN_FILE, TRACKING_URI_ENV, UI_URL_ENV
from sweeplab.core.errors import UserError, environment_error, exception_chain
from sweeplab.core.interrupts import is_interrupt
from sweeplab.core.records import CONFIGURATION_ROLE, JOB, SWEEP, SWEEP_ROLE, TARGET_ROLE

log = logging.getLogger(__name__)

DEFAULT_URI = "sqlite:///mlflow.db"
MAX_PARAM_CHARS = 6000
# MLflow's experiment kind: "custom_model_development" is the UI's "Machine learning" (runs, charts, compare);
# without it an experiment may open in the GenAI view (traces, no runs)
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
# MLflow 3.17.2's UI picks its view from a workflow switch, not from the experiment's kind tag (issue 38, read in its
# bundle server/js/build/static/js/main.*.js: the experiment kind comes from the tag only when the switch's feature
# flag is off, and that flag is hard-wired on, `R=()=>!0`): the `workflowType` URL parameter wins over the switch's
# value remembered in the browser's localStorage (`mlflow.workflowType`), whose default is "genai". No server setting
# or run tag changes that default; every address sweeplab prints carries the parameter, and a click on "Machine
# learning" in the UI's switch is remembered by that browser from then on (docs/mlflow.md). The experiment tag is
# kept for an MLflow whose UI reads it.
UI_WORKFLOW_QUERY = "workflowType=machine_learning"


SERVER_PROBE_TIMEOUT_S = 5.0
STORE_LOCK_TIMEOUT_S = 300.0  # creating a fresh store's schema takes seconds; minutes mean a stuck process


def resolve_uri(configured: str | None = None) -> str:
    uri = os.environ.get(TRACKING_URI_ENV) or configured or DEFAULT_URI
    if uri.startswith("sqlite:///"):
        path, sep, query = uri[len("sqlite:///") :].partition("?")
        if path and path != ":memory:" and not os.path.isabs(path):
            uri = f"sqlite:///{os.path.abspath(path)}{sep}{query}"
    return uri


def check_server(uri: str, timeout_s: float = SERVER_PROBE_TIMEOUT_S) -> None:
    """An http(s) tracking URI must answer MLflow's /health now: fail in seconds, not after minutes of retries."""
    import requests

    try:
        response = requests.get(f"{uri.rstrip('/')}/health", timeout=timeout_s)
    except requests.RequestException as exc:
        raise UserError(
            f"MLflow tracking server {uri} is not reachable ({type(exc).__name__}); start it (`mlflow server`) "
            "or point MLFLOW_TRACKING_URI elsewhere"
        ) from None
    if response.status_code != 200:
        raise UserError(
            f"MLflow tracking server {uri} answered /health with HTTP {response.status_code}; is it an MLflow server?"
        )


def sqlite_path(uri: str) -> Path | None:
    """The database file of a `sqlite:///` URI; None for other stores (and in-memory sqlite)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///") :].partition("?")[0]
    return Path(path) if path and path != ":memory:" else None


_store_locks: dict[Path, Any] = {}  # one FileLock per database in this process: re-entered, never self-deadlocked
_opened_stores: set[str] = set()  # sqlite URIs this process has opened (schema checked or created) already


@contextlib.contextmanager
def store_lock(uri: str):
    """Hold `<database>.lock` while a sqlite store is created, migrated or given an experiment.

    MLflow creates a new database's schema (and runs its migrations) the first time a process opens it, with no
    lock of its own: two processes doing that at once leave a half-migrated file that every later run fails on.
    Other stores (a tracking server) need nothing here. A directory where the lock file cannot be created cannot
    hold a new database either; the store's own error says so later.
    """
    from filelock import FileLock, Timeout

    path = sqlite_path(uri)
    if path is None:
        yield
        return
    lock = _store_locks.setdefault(path, FileLock(f"{path}.lock", timeout=STORE_LOCK_TIMEOUT_S))
    acquired = False
    try:
        lock.acquire()
        acquired = True
    except Timeout:
        raise UserError(
            f"MLflow tracking store {uri}: {lock.lock_file} is held by another process for over "
            f"{STORE_LOCK_TIMEOUT_S:.0f} s; is a process stuck creating the store?"
        ) from None
    except OSError:
        pass
    try:
        yield
    finally:
        if acquired:
            lock.release()


def client(uri: str):
    """The MlflowClient of the store at `uri` (resolved: `resolve_uri`); the only way sweeplab gets one.

    A sqlite store is opened the first time under `store_lock`, as that may create its schema; a store that cannot
    be opened (locked, unreadable) is one UserError line naming it. Read-only entry points that must not create a
    store use `open_existing_store` first.
    """
    MlflowClient = _uncut_client()
    if (db := sqlite_path(uri)) is not None:
        errors.note_sqlite_store(db)  # a full disk under it is named with its path (errors.environment_error)
    try:
        if uri in _opened_stores or sqlite_path(uri) is None:
            return MlflowClient(tracking_uri=uri)  # opens a sqlite store: a locked or unreadable file fails here
        # MLflow's sqlite store module and its imports (1.3 s of the 1.4 s an existing store took to open here) load
        # before the lock, which then holds for the schema check alone (0.04 s): the lanes of a multi-GPU study
        # opening one store no longer import one after the other. (On the 2-core machine four processes take as
        # long either way, their imports being CPU-bound; the lanes' hosts have 16-64 cores. Not measured there.)
        import mlflow.store.tracking.sqlalchemy_store  # noqa: F401

        with store_lock(uri):
            client = MlflowClient(tracking_uri=uri)  # opens (and caches) the store: a new file gets its schema here
    except UserError:
        raise
    except Exception as exc:
        raise UserError(f"MLflow tracking store {uri} is not usable: {store_problem(exc)}") from exc
    _opened_stores.add(uri)
    return client


CLIENT_WRITES = ("create_run", "log_batch", "log_metric", "log_param", "set_tag", "delete_tag", "set_terminated",
                 "update_run", "delete_run", "restore_run", "log_text", "log_dict", "log_artifact", "log_artifacts",
                 "log_inputs", "set_experiment_tag")


@functools.cache
def _uncut_client() -> type:
    """MlflowClient whose writes a signal never cuts in the middle (interrupts.uncut): SIGTERM raised inside sqlite's
    write left the connection holding the store's write lock, and closing the run then failed with `database is
    locked` every 20 s; the signal is acted on right after the write instead. Each write looks MlflowClient's
    method up when it is called, not when this class is made: a method patched on MlflowClient later (a test's spy
    counting log_batch calls) is the one that runs."""
    from mlflow.tracking import MlflowClient

    def uncut(name):
        @functools.wraps(getattr(MlflowClient, name))
        def write(self, *args, **kwargs):
            with interrupts.uncut():
                return getattr(MlflowClient, name)(self, *args, **kwargs)
        return write

    return type("MlflowClient", (MlflowClient,), {name: uncut(name) for name in CLIENT_WRITES
                                                   if hasattr(MlflowClient, name)})


def create_store(uri: str) -> None:
    """Open the store at `uri`, creating a new sqlite file's schema (under `store_lock`)."""
    client(uri)


def open_existing_store(uri: str, writes: bool = True) -> None:
    """Open a store that must exist already (entry points that read it: the report, export by run id, the UI).

    A tracking server must answer now (MLflow would retry for minutes); a sqlite path must name a database file, not
    be created empty on the spot (a mistyped path would otherwise report "no runs" and leave a stray mlflow.db).
    writes: the caller logs to it (the report, export): a copied or moved store is refused (refuse_moved_store).
    """
    if uri.startswith(("http://", "https://")):
        check_server(uri)
    path = sqlite_path(uri)
    if path is not None and not path.is_file():
        raise UserError(f"no MLflow store at {uri} ({path} does not exist); set --tracking-uri or MLFLOW_TRACKING_URI")
    check_sqlite_file(uri)
    client(uri)
    if writes:
        refuse_moved_store(uri)


def moved_from(uri: str) -> tuple[str, Path, Path] | None:
    """(experiment name, its artifact folder, the folder the store was copied or moved from) when a sqlite store's
    experiment keeps its artifacts in another tree that has the layout the store's own folder has (`cp -a project
    copy`: the copy's experiment still names project/mlruns/1, and the copy holds copy/mlruns/1); None otherwise.
    MLflow records an experiment's artifact folder as an absolute path when the experiment is made, and every run's
    artifacts (a checkpoint's export included) go there."""
    path = sqlite_path(uri)
    if path is None or not path.is_file():
        return None
    from mlflow.entities import ViewType
    from mlflow.utils.file_utils import local_file_uri_to_path

    home = path.resolve().parent
    for experiment in client(uri).search_experiments(view_type=ViewType.ALL):
        location = experiment.artifact_location or ""
        if not location.startswith(("file:", "/")):
            continue  # an artifact server or a cloud bucket: no tree of this machine
        folder = Path(local_file_uri_to_path(location) if location.startswith("file:") else location)
        if not folder.is_absolute() or folder.is_relative_to(home):
            continue
        for parent in folder.parents:
            if parent == Path(parent.anchor):
                break
            if (home / folder.relative_to(parent)).is_dir():
                return experiment.name, folder, parent
    return None


def refuse_moved_store(uri: str) -> None:
    """One UserError line naming the original tree when the store is a copied or moved one (moved_from): writing
    runs or artifacts through it would write into that other tree."""
    if (moved := moved_from(uri)) is not None:
        name, folder, original = moved
        raise UserError(f"the MLflow store {sqlite_path(uri)} was copied or moved from {original}: its experiment "
                        f"{name!r} keeps its artifacts in {folder}, so runs logged here would write into {original}; "
                        f"work in {original}, or give this copy a new store (MLFLOW_TRACKING_URI=sqlite:///"
                        f"{sqlite_path(uri).parent / 'copy.db'})")


SQLITE_HEADER = b"SQLite format 3\x00"


def check_sqlite_file(uri: str) -> None:
    """A sqlite store's path, where it exists, holds an SQLite database (an empty file is one too): one line
    otherwise, before MLflow's migrations fail on it with a traceback (or the UI server with one per request)."""
    path = sqlite_path(uri)
    if path is None or not path.exists():
        return
    if not path.is_file():  # a FIFO would block the read below for ever; a folder, a device: no store either
        raise UserError(f"{path}: not a regular file, so not an MLflow store; point MLFLOW_TRACKING_URI (or "
                        "--tracking-uri) at an SQLite file, or move it away")
    try:
        with open(path, "rb") as f:
            header = f.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise UserError(f"{path}: cannot read the MLflow store of {uri} ({exc.strerror})") from None
    if header and header != SQLITE_HEADER:
        raise UserError(f"{path} is not an SQLite database, so not an MLflow store; point MLFLOW_TRACKING_URI "
                        "(or --tracking-uri) at one, or move the file away")


def get_run(uri: str, run_id: str, what: str = "run_id"):
    """The run `run_id`, or one UserError line naming `what` (the option that gave the id) when the store has no
    such run."""
    from mlflow.exceptions import MlflowException

    store = client(uri)
    try:
        run = store.get_run(run_id)
        experiment = store.get_experiment(run.info.experiment_id)
    except MlflowException as exc:
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"{what}={run_id}: not found in {uri}: {first_line[:200]}") from None
    # a deleted run (or one of a deleted experiment) can be read but not written: refused before any work
    if run.info.lifecycle_stage == "deleted" or experiment.lifecycle_stage == "deleted":
        gone = "the run" if run.info.lifecycle_stage == "deleted" else f"its experiment {experiment.name!r}"
        raise UserError(f"{what}={run_id}: {gone} is deleted in {uri}; restore it (`mlflow experiments restore` / "
                        "`mlflow runs restore`) or pass another")
    return run


@dataclass(frozen=True)
class RunRecord:
    """A run as sweeplab reads it: MLflow's run object is read here and in `record_of` only (tests/test_layers.py
    counts the modules that read `run.data`)."""

    run_id: str
    experiment_id: str
    status: str
    start_ms: int | None
    end_ms: int | None
    lifecycle_stage: str
    params: Mapping[str, str]
    tags: Mapping[str, str]
    metrics: Mapping[str, float]

    @property
    def name(self) -> str:
        return self.tags.get(JOB.name, self.run_id[:8])


def record_of(run) -> RunRecord:
    return RunRecord(run.info.run_id, run.info.experiment_id, run.info.status, run.info.start_time,
                     run.info.end_time, run.info.lifecycle_stage, dict(run.data.params), dict(run.data.tags), dict(run.data.metrics))


def read_run(uri: str, run_id: str, what: str = "run_id") -> RunRecord:
    """get_run's run as a RunRecord."""
    return record_of(get_run(uri, run_id, what))


# "sweep": a sweep's parent run; "configuration": one configuration's aggregates; "target": the chart's target line;
# jobs: none
ROLE_TAG = SWEEP.role


def role_filter(role: str) -> str:
    """A search filter for the runs of a role (`records.SWEEP_ROLE`, `records.CONFIGURATION_ROLE`)."""
    return f"tags.`{ROLE_TAG}` = '{role}'"


def children_filter(parent_run_id: str, role: str | None = None) -> str:
    """The search filter of a run's children (of one role): MLflow's search and the UI's searchFilter take it."""
    return f"tags.{JOB.parent_run_id} = '{parent_run_id}'" + (f" and {role_filter(role)}" if role else "")


def compared_filter(parent_run_id: str) -> str:
    """The search filter of the sweep's runs its saved view shows: its children that have a role (its configuration
    runs and its target line; its jobs have none). MLflow's search has no OR, nor IN for tags."""
    return f"tags.{JOB.parent_run_id} = '{parent_run_id}' and tags.`{ROLE_TAG}` LIKE '%'"


def spread_filter(parent_run_id: str) -> str:
    """The search filter of the runs the sweep's spread view shows: its jobs and its target line, the children a
    replicated sweep's report gave a spread line (records.JobRun.spread_line; its configuration runs have none)."""
    return f"tags.{JOB.parent_run_id} = '{parent_run_id}' and tags.`{JOB.spread_line}` LIKE '%'"


def is_job_run(run) -> bool:
    """A training job's run (a RunRecord or MLflow's run): not a sweep's parent run, not a configuration's run nor
    the target line's (sweeplab.report.config_runs)."""
    tags = run.tags if isinstance(run, RunRecord) else run.data.tags
    return tags.get(ROLE_TAG) not in (SWEEP_ROLE, CONFIGURATION_ROLE, TARGET_ROLE)


def sweep_jobs(uri: str, parent_run_id: str, store=None, experiment_id: str | None = None):
    """The runs of a sweep's jobs (the children of its parent run but its configuration runs), in the order they
    started. `store` (a client) and the sweep's `experiment_id`, where the caller has them, save a look-up."""
    store = store or client(uri)
    if experiment_id is None:
        experiment_id = store.get_run(parent_run_id).info.experiment_id
    children = store.search_runs(
        [experiment_id],
        filter_string=children_filter(parent_run_id),
        max_results=10000,
        order_by=["attributes.start_time ASC"],
    )
    return [run for run in children if is_job_run(run)]


def latest_sweep(uri: str, experiment_name: str | None = None) -> str | None:
    """The latest finished sweep's parent run id (its run FINISHED: its jobs ended and its report written), in one
    experiment or (None) in any: each study has its own experiment. A sweep started later that failed, was stopped
    or still runs is not the latest (`--sweep` names it); where none finished, the newest sweep of any status."""
    store = client(uri)
    if experiment_name is None:
        experiment_ids = [e.experiment_id for e in store.search_experiments()]
    else:
        experiment = store.get_experiment_by_name(experiment_name)
        experiment_ids = [experiment.experiment_id] if experiment is not None else []
    if not experiment_ids:
        return None
    for status in (" and attributes.status = 'FINISHED'", ""):
        runs = store.search_runs(experiment_ids, filter_string=role_filter(SWEEP_ROLE) + status, max_results=1,
                                 order_by=["attributes.start_time DESC"])
        if runs:
            return runs[0].info.run_id
    return None


def sweep_named(uri: str, name: str, what: str = "--sweep") -> str:
    """The parent run id of the sweep `name` names: its sweep run's id, its folder (multirun/<date>/<time>, which
    holds channels.PARENT_RUN_FILE) or its sweep id (`<date>/<time>`, the folder's last two parts); one UserError
    line naming `what` when it names none."""
    folder = Path(name).expanduser()
    if folder.is_dir():
        marker = folder / PARENT_RUN_FILE
        run_id = marker.read_text().strip() if marker.is_file() else ""
        if not run_id:
            raise UserError(f"{what} {name}: {marker} not found or empty: not a sweeplab sweep folder")
        name = run_id
    store = client(uri)
    found = store.search_runs([e.experiment_id for e in store.search_experiments()],
                              filter_string=role_filter(SWEEP_ROLE) + f" and tags.`{SWEEP.sweep_id}` = '{name}'",
                              max_results=1, order_by=["attributes.start_time DESC"]) if "'" not in name else []
    if found:
        return found[0].info.run_id
    run = read_run(uri, name, what)
    if run.tags.get(SWEEP.role) != SWEEP_ROLE:
        raise UserError(f"{what} {name}: run {run.name!r} is not a sweep's run (pass the sweep run's id, its folder "
                        "or its sweep id)")
    return run.run_id


def init_store(uri: str, experiment_name: str) -> str:
    """Create the store's schema and the experiment if missing; return the experiment id.

    Safe from several processes at once (`store_lock`). An unreachable tracking server fails here, fast, with the
    URI in the message.
    """
    if uri.startswith(("http://", "https://")):
        check_server(uri)
    try:
        with store_lock(uri):
            store = client(uri)
            refuse_moved_store(uri)  # a copied project's store: its runs' artifacts would go to the original's tree
            experiment = store.get_experiment_by_name(experiment_name)
            if experiment is None:
                try:
                    return store.create_experiment(experiment_name, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
                except Exception:  # another process created it between our two calls (a tracking server)
                    experiment = store.get_experiment_by_name(experiment_name)
                    if experiment is None:
                        raise
            if experiment.lifecycle_stage == "deleted":
                store.restore_experiment(experiment.experiment_id)
            if EXPERIMENT_KIND_TAG not in experiment.tags:  # made by an older sweeplab or by MLflow itself
                store.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
            return experiment.experiment_id
    except UserError:
        raise
    except Exception as exc:
        raise UserError(f"MLflow tracking store {uri} is not usable: {store_problem(exc)}") from None


def store_problem(exc: BaseException) -> str:
    """What the store said, in one line: the database driver's own error (a read-only or locked sqlite file, a full
    disk) where MLflow wrapped one, else the first line of the message."""
    for link in exception_chain(exc):
        driver_error = getattr(link, "orig", None)  # SQLAlchemy's DBAPIError keeps the driver's exception here
        if isinstance(driver_error, Exception) and str(driver_error).strip():
            return str(driver_error).strip().splitlines()[0]
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


UI_DEFAULT = ("127.0.0.1", 5000)  # where `make ui` serves when UI_URL_ENV is unset


def ui_address() -> tuple[str, int]:
    """(host, port) `make ui` serves on: $SWEEPLAB_UI_URL's (port 5000 when it names none), else UI_DEFAULT. A value
    that is no `http(s)://host[:port]` address is one UserError line, not ignored."""
    from urllib.parse import urlsplit

    text = os.environ.get(UI_URL_ENV, "").strip()
    if not text:
        return UI_DEFAULT
    url = urlsplit(text)
    try:
        port = url.port
    except ValueError:  # a port past 65535, or not a number
        port = -1
    if url.scheme not in ("http", "https") or not url.hostname or port == -1 or port == 0 or url.path.strip("/"):
        raise UserError(f"{UI_URL_ENV}={text!r} is not an address like http://127.0.0.1:5000 (http, a host, a port "
                        "from 1 to 65535); fix or unset it")
    return url.hostname, port or UI_DEFAULT[1]


def ui_base(uri: str, host: str | None = None, port: int | None = None) -> str | None:
    """Where the UI of this store is served, when that is known: the tracking server itself (an http(s) URI), the
    address `make ui` was given, else $SWEEPLAB_UI_URL; None for a local store whose UI address nobody gave (a
    closing line then names the run instead of a link that may point at another port or another store)."""
    if uri.startswith(("http://", "https://")):
        return uri.rstrip("/")
    if host is not None and port is not None:
        return f"http://{host}:{port}"
    return os.environ.get(UI_URL_ENV, "").rstrip("/") or None


def runs_url(
    base: str, experiment_id: str, search_filter: str | None = None, order_by_metric: str | None = None,
    ascending: bool = False,
) -> str:
    """The UI's runs table of an experiment (the machine-learning view), optionally filtered and sorted by a metric.
    Sorted by anything but start time, the UI lists the matching runs flat instead of folding them under their
    parent run (collapsed: a sweep would show as one row)."""
    from urllib.parse import quote

    query = UI_WORKFLOW_QUERY + (f"&searchFilter={quote(search_filter)}" if search_filter else "")
    if order_by_metric:
        query += f"&orderByKey={quote(f'metrics.`{order_by_metric}`')}&orderByAsc={str(ascending).lower()}"
    return f"{base}/#/experiments/{experiment_id}/runs?{query}"


def run_url(base: str, experiment_id: str, run_id: str) -> str:
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}?{UI_WORKFLOW_QUERY}"


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


def context_tags(tags: Mapping[str, str]) -> dict[str, str]:
    """`tags` plus what MLflow fills in for its own fluent runs: user, source name and type, git commit."""
    try:
        from mlflow.tracking.context.registry import resolve_tags

        return resolve_tags(dict(tags))
    except Exception:  # context is a courtesy: never worth a run
        return dict(tags)


def log_params(client, run_id: str, params: Mapping[str, Any]) -> None:
    from mlflow.entities import Param

    items = [Param(k, str(v)[:MAX_PARAM_CHARS]) for k, v in params.items()]
    for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
        client.log_batch(run_id, params=items[i : i + 100])


BATCH_LIMITS = {"metrics": 1000, "params": 100, "tags": 100}  # MLflow's most per log_batch (1000 entries in all)


def write(store, run_id: str, record, step: int = 0, tags: bool = True) -> None:
    """Log a run record (sweeplab.core.records: its fields that are not None) to the run `run_id` in one log_batch;
    metrics at `step`; `tags=False`: its params and metrics only (the tags went in with the run's creation). `store`
    is a tracking URI or a client. A record past MLflow's limits per batch (100 params or tags, 1000 metrics) goes in
    as few batches as those allow."""
    from mlflow.entities import Metric, Param, RunTag

    logged = record.to_mlflow()
    now = int(time.time() * 1000)
    entries = {
        "metrics": [Metric(k, v, now, step) for k, v in logged.metrics.items()],
        "params": [Param(k, v[:MAX_PARAM_CHARS]) for k, v in logged.params.items()],
        "tags": [RunTag(k, v) for k, v in logged.tags.items()] if tags else [],
    }
    if not any(entries.values()):
        return
    store = client(store) if isinstance(store, str) else store
    while any(entries.values()):
        batch, room = {}, 1000
        for kind, items in entries.items():
            batch[kind], entries[kind] = items[:min(BATCH_LIMITS[kind], room)], items[min(BATCH_LIMITS[kind], room):]
            room -= len(batch[kind])
        store.log_batch(run_id, **batch)


class JobRun:
    """One MLflow run for one training job; use as a context manager."""

    def __init__(
        self,
        uri: str,
        experiment_name: str,
        record,
        run_id: str | None = None,
    ):
        """A new run holding `record` (sweeplab.core.records.JobRun: its name, parent run, tags and the flattened
        config as params), or, with `run_id`, that run reopened as it is (a resumed job)."""
        self.uri = uri
        self.client = client(uri)
        self._monitor = None
        self._monitor_timer = None
        self._monitor_lock = threading.Lock()
        self.experiment_id = init_store(uri, experiment_name)
        self.experiment_name = experiment_name
        self.run_name = record.name
        self.run_id = None
        try:
            if run_id is not None:  # resuming: reopen the run the checkpoint names
                self.run_id = run_id  # training._resume_target checked the checkpoint and the run first
                channels.job_run_id = run_id
                self._clear_previous_failure()
                self.client.update_run(run_id, status="RUNNING")
                return
            run = self.client.create_run(self.experiment_id, run_name=record.name,
                                         tags=context_tags(record.to_mlflow().tags))
            self.run_id = run.info.run_id
            channels.job_run_id = self.run_id
            self.write(record, tags=False)
        except Exception as exc:  # a read-only, locked or full store: one line naming it, no run left RUNNING
            if self.run_id is not None:
                with contextlib.suppress(Exception):
                    self.client.set_terminated(self.run_id, "FAILED")
            raise UserError(f"MLflow tracking store {uri} cannot record the run: {store_problem(exc)}") from exc
        except BaseException as exc:  # Ctrl-C/SIGTERM while the run is being set up: it still ends (KILLED)
            if self.run_id is not None:
                self.fail(exc)
            raise

    def _clear_previous_failure(self) -> None:
        """A resumed run is no longer failed: its `error` and `slurm_end` tags and error.txt go (the reason stays
        readable as the `previous_error` tag), so a run that then finishes does not read as failed or ended by the
        scheduler. A new failure writes them again."""
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

        run = self.client.get_run(self.run_id)
        error, slurm_end = run.data.tags.get(JOB.error), run.data.tags.get(JOB.slurm_end)
        if error is None and slurm_end is None:
            return
        self.write(records.JobRun(previous_error=error if error is not None and slurm_end in (None, error)
                                  else slurm_end if error is None else f"{error} (scheduler: {slurm_end})"))
        for key in (JOB.error, JOB.slurm_end):
            if run.data.tags.get(key) is not None:
                self.client.delete_tag(self.run_id, key)
        if error is None:
            return
        try:
            get_artifact_repository(run.info.artifact_uri).delete_artifacts("error.txt")
        except Exception as exc:  # a store that cannot delete: the file stays, the tag says it is past
            log.warning("could not delete error.txt of resumed run %s: %s", self.run_id, _one_line(exc))

    @wall.charged_to("mlflow")
    def write(self, record, step: int = 0, tags: bool = True) -> None:
        """Log a run record (sweeplab.core.records.JobRun: the fields a writer knows) to this run (`write`)."""
        write(self.client, self.run_id, record, step, tags)

    @wall.charged_to("mlflow")
    def log_params(self, params: Mapping[str, Any]) -> None:
        log_params(self.client, self.run_id, params)

    @wall.charged_to("mlflow")
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step or 0) for k, v in metrics.items()]
        if items:
            self.client.log_batch(self.run_id, metrics=items)

    @wall.charged_to("mlflow")
    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, text, artifact_file)

    @wall.charged_to("mlflow")
    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    @wall.charged_to("mlflow")
    def set_tag(self, key: str, value: str) -> None:
        self.client.set_tag(self.run_id, key, value)

    def log_artifact_capped(self, path: str | Path, artifact_path: str | None, max_mb: float) -> bool:
        """Log a file unless it is larger than `max_mb` (named in one warning); False when skipped or failed."""
        size_mb = Path(path).stat().st_size / 2**20
        if size_mb > max_mb:
            log.warning("%s (%.0f MB) not logged to MLflow: over logger.max_artifact_mb=%g", path, size_mb, max_mb)
            return False
        try:
            self.log_artifact(path, artifact_path)
        except Exception as exc:  # an artifact is a convenience: never worth a run that trained
            log.warning("could not log %s to MLflow: %s", path, _one_line(exc))
            return False
        return True

    @wall.charged_to("mlflow")
    def log_training_data(self, path: str | Path, name: str) -> None:
        """The training data as the run's MLflow dataset input (the UI's Datasets column), with a digest that
        changes when the files do."""
        try:
            from mlflow.data.dataset_source_registry import resolve_dataset_source
            from mlflow.data.meta_dataset import MetaDataset
            from mlflow.entities import DatasetInput, InputTag

            with warnings.catch_warnings():  # a local path "can be interpreted in multiple ways": all of them local
                warnings.simplefilter("ignore", UserWarning)
                source = resolve_dataset_source(str(Path(path).resolve()))
            dataset = MetaDataset(source, name=name, digest=data_digest(path))
            context = InputTag(key="mlflow.data.context", value="training")
            self.client.log_inputs(self.run_id, datasets=[DatasetInput(dataset._to_mlflow_entity(), tags=[context])])
        except Exception as exc:
            log.warning("could not log the training data %s to MLflow: %s", path, _one_line(exc))

    def monitor_system(self, after_s: float, sampling_interval_s: float = 10.0) -> None:
        """MLflow's own system-metrics sampler (CPU, memory, disk, network, GPU: `system/*`), started once the job
        has run `after_s` seconds: a short run would get a point or two, and the sampler costs a store read and
        write every interval."""

        def start() -> None:
            with self._monitor_lock:
                if self._monitor_timer is None:  # the job ended meanwhile
                    return
                try:
                    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

                    logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)  # start/stop lines
                    monitor = SystemMetricsMonitor(
                        self.run_id, sampling_interval=sampling_interval_s, resume_logging=True, tracking_uri=self.uri
                    )
                    monitor.start()
                    self._monitor = monitor
                except Exception as exc:  # psutil missing, or a platform without its counters
                    log.warning("MLflow system metrics are off for this run: %s", _one_line(exc))

        self._monitor_timer = threading.Timer(after_s, start)
        self._monitor_timer.daemon = True
        self._monitor_timer.start()

    def _stop_monitor(self) -> None:
        with self._monitor_lock:
            timer, self._monitor_timer = self._monitor_timer, None
            if timer is not None:
                timer.cancel()
            monitor, self._monitor = self._monitor, None
        if monitor is not None:
            with contextlib.suppress(Exception):
                monitor.finish()

    def __enter__(self) -> JobRun:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        # set_terminated first drains MLflow's asynchronous queue (the Lightning logger's metrics, logger.async_logging):
        # the run ends only once everything it logged is stored. A signal is recorded, not raised, while the run is
        # closed (interrupts.deferred: one raised inside sqlite's write leaves its lock held); the job's entry point
        # acts on it once the run is closed.
        with interrupts.deferred():
            self._stop_monitor()
            if exc is None:
                self.client.set_terminated(self.run_id, "FINISHED")
            else:
                self.fail(exc)
        return False

    def fail(self, exc: BaseException) -> None:
        """End the run FAILED (KILLED for Ctrl-C, SIGTERM and exits) with the reason as its `error` tag and the
        traceback as error.txt."""
        self._stop_monitor()
        status = "KILLED" if is_interrupt(exc) else "FAILED"
        with contextlib.suppress(Exception):
            exc.sweeplab_run_id = self.run_id  # tells the sweep's failure handling this job is recorded
        with contextlib.suppress(Exception):
            self.write(records.JobRun(error=_one_line(exc)))
            self.client.log_text(self.run_id, "".join(traceback.format_exception(exc)), "error.txt")
        try:
            self.client.set_terminated(self.run_id, status)
        except Exception as again:
            if environment_error(again) is None:
                raise
            # the store's own disk is full (or read-only): the run cannot be closed now; the reason that ended the
            # job is what the user reads, and resume=true closes the run once the store can be written again
            log.warning("run %s could not be closed %s: %s", self.run_id, status, errors.user_message(again))


DIGEST_SAMPLE_BYTES = 4 * 2**20


def data_digest(path: str | Path) -> str:
    """A dataset's digest: every file's name and size and its first and last 4 MiB. Like MLflow's own dataset
    digests it samples rather than reads everything, so a file larger than memory costs milliseconds."""
    path = Path(path)
    files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
    digest = hashlib.sha256()
    for file in files:
        size = file.stat().st_size
        digest.update(f"{file.relative_to(path) if path.is_dir() else file.name}\x1f{size}\x1f".encode())
        with open(file, "rb") as f:
            digest.update(f.read(DIGEST_SAMPLE_BYTES))
            if size > 2 * DIGEST_SAMPLE_BYTES:
                f.seek(size - DIGEST_SAMPLE_BYTES)
                digest.update(f.read())
    return digest.hexdigest()[:16]


def read_parent_run_id(sweep_dir: str | None) -> str | None:
    """The parent run of a sweep job; None for a single run (no sweep dir).

    The file the sweep callback wrote in the sweep dir names this very sweep, so it wins; the environment variable
    (inherited by joblib workers and submitit jobs) covers a job that cannot see the sweep dir.
    """
    if not sweep_dir:
        return None
    marker = Path(sweep_dir) / PARENT_RUN_FILE
    if marker.exists():
        return marker.read_text().strip() or None
    return os.environ.get(PARENT_RUN_ENV) or None


def current_run_id() -> str | None:
    """The run of the job this process ran last (None when it created none: logger off, or a DDP rank > 0)."""
    return channels.job_run_id


def forget_current_run() -> None:
    channels.job_run_id = None
