"""Issue 58: a job returns what it did (sweeplab.core.outcome.JobOutcome, through Hydra's JobReturn) and its
sweeper's study learns from it (Study.tell), as Hydra's Optuna sweeper tells Optuna: the rounds, replicates=auto and
the search read no store between rounds, and the sweeper's main process imports no torch or Lightning.

The store's queries are counted by SQLAlchemy's own event hook on every engine (in this process, and in a real
sweep's processes by tests/probes/sitecustomize.py), not by patching sweeplab."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf
from sqlalchemy import event
from sqlalchemy.engine import Engine

from sweeplab.core.outcome import JobOutcome
from sweeplab.core.records import JOB
from sweeplab.engine.outcome import recorded_outcome
from sweeplab.study import rounds
from sweeplab.study.sweep import read_sweep
from sweeplab.sweep.study import Study
from sweeplab.tracking import runs
from test_sweep_record import _replicated_sweep
from test_sweeps_optuna import SEARCH
from test_sweeps_parallel import smoke, store_runs

PROBES = Path(__file__).parent / "probes"
HEAVY = ("torch", "lightning")


@contextlib.contextmanager
def _statements():
    """Every SQL statement any SQLAlchemy engine of this process executes meanwhile."""
    executed: list[str] = []

    def count(conn, cursor, statement, parameters, context, executemany):
        executed.append(statement)

    event.listen(Engine, "before_cursor_execute", count)
    try:
        yield executed
    finally:
        event.remove(Engine, "before_cursor_execute", count)


def _study(tmp_path, parent_run_id: str) -> Study:
    study = Study(OmegaConf.create({"seed": 0, "replicates": 2, "hydra": {"sweep": {"dir": str(tmp_path / "sweep")},
                                                                          "launcher": None}}))
    study.parent_run_id = parent_run_id  # the sweep run _replicated_sweep made
    return study


def test_a_study_told_its_jobs_outcomes_knows_what_the_store_holds_without_reading_it(mlflow_uri, tmp_path):
    """Each job reads its own ended run back (as sweeplab.engine.training.run_job does) and returns it; the study told
    those outcomes derives the same jobs, curves and decisions as a read of the store, with no query."""
    parent = _replicated_sweep(mlflow_uri, tmp_path)
    client = MlflowClient(mlflow_uri)
    job_runs = runs.job_runs(mlflow_uri, parent)
    for run in job_runs:  # configuration 1 stopped behind its round's leader in both rounds, at step 10 of 20
        client.log_param(run.run_id, JOB.max_steps, "20")
        if run.tags[JOB.config_index] == "1":
            client.set_tag(run.run_id, JOB.stop_reason, "behind")
            client.set_tag(run.run_id, JOB.stop_step, "10")
    study = _study(tmp_path, parent)
    for run in job_runs:
        study.tell(recorded_outcome(mlflow_uri, run.run_id, 0.5))
    study.tell(JobOutcome("FAILED"))  # a failed job's outcome carries no run: nothing to learn
    study.tell(0.5)  # another task function's return value: nothing either

    with _statements() as executed:
        known = study.known()
        stopped = rounds.stopped_for_good(known)
        undecided, plan = rounds.undecided_configurations(known, study.options)
        states = study.job_states()
    assert executed == []

    read = read_sweep(mlflow_uri, parent)
    assert known.jobs == read.jobs and (known.metric, known.mode) == (read.metric, read.mode)
    assert all(job.curve for job in known.jobs)  # the inputs of time to target came with the outcomes
    assert stopped == rounds.stopped_for_good(read) == {1}
    read_undecided, read_plan = rounds.undecided_configurations(read, study.options)
    assert undecided == read_undecided and plan == read_plan
    assert states == rounds.job_states(read) == {(c, r): "finished" for c in range(2) for r in range(2)}


def test_a_job_run_again_into_its_run_replaces_what_the_study_was_told(mlflow_uri, tmp_path):
    parent = _replicated_sweep(mlflow_uri, tmp_path)
    first = runs.job_runs(mlflow_uri, parent)[0]
    study = _study(tmp_path, parent)
    study.tell(recorded_outcome(mlflow_uri, first.run_id, 0.4))
    MlflowClient(mlflow_uri).set_tag(first.run_id, JOB.stop_reason, "target")
    study.tell(recorded_outcome(mlflow_uri, first.run_id, 0.5))
    (job,) = study.known().jobs
    assert job.stop_reason == "target"


def test_a_study_without_a_sweep_run_knows_nothing(tmp_path):
    study = Study(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}, "launcher": None}}))
    study.tell(JobOutcome("FINISHED", 0.5))
    assert study.known() is None


@pytest.mark.slow  # 4 jobs in joblib's 2 workers, each starting torch: about a minute on the 2-core machine
def test_a_real_search_reads_no_store_between_its_rounds_and_its_main_imports_no_training_framework(
        demo_dir, mlflow_uri, tmp_path):
    """2 trials x 2 replicates, one trial per launch (2 rounds of 2 jobs), a stop rule on (the search asked the store
    for the stop rules' decisions after every launch before the jobs returned them): between the first launch's last
    job ending and the second's first job starting, the sweeper's process sends the store no query. It queried the
    store before (the sweep run) and after (the report), so the hook sees its queries; and it never imported torch
    or Lightning (the jobs ran in joblib's workers)."""
    queries, sweep_dir = tmp_path / "queries.log", tmp_path / "search"
    path = os.pathsep.join([str(PROBES), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env = {**os.environ, "PYTHONPATH": path, "SWEEPLAB_TEST_QUERIES": str(queries),
           "SWEEPLAB_TEST_MODULES_AT_EXIT": str(tmp_path / "modules-{pid}.txt")}
    process = subprocess.Popen(
        [sys.executable, "-m", "sweeplab.train", "-m", "hparams_search=optuna_alpha_beta", "hydra.sweeper.n_trials=2",
         "hydra.sweeper.n_jobs=1", "replicates=2", "stop.patience=1", "hydra/launcher=joblib",
         "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep_dir}",
         *smoke(demo_dir, "data.batch_size=16", "trainer.max_steps=2", "trainer.val_check_interval=2")],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = process.communicate(timeout=900)
    assert process.returncode == 0, stderr[-3000:]

    _, jobs = store_runs(mlflow_uri, SEARCH)
    by_trial: dict[int, list] = {}
    for run in jobs:
        by_trial.setdefault(int(run.data.tags[JOB.config_index]), []).append(run)
    assert sorted((trial, len(found)) for trial, found in by_trial.items()) == [(0, 2), (1, 2)]
    first_round_ended = max(run.info.end_time for run in by_trial[0]) / 1000
    second_round_started = min(run.info.start_time for run in by_trial[1]) / 1000
    assert first_round_ended < second_round_started

    main = [line.split() for line in queries.read_text().splitlines() if line.split()[0] == str(process.pid)]
    assert main, "the sweeper's process sent no query at all: the probe's hook did not run"
    between = [(float(at), what) for _, at, what in main if first_round_ended < float(at) < second_round_started]
    assert between == []
    assert any(float(at) > second_round_started for _, at, _ in main)  # the report read the store at the end

    imported = set((tmp_path / f"modules-{process.pid}.txt").read_text().split())
    assert imported, "the sweeper's process wrote no module list: tests/probes/sitecustomize.py did not run"
    assert not sorted(m for m in imported if m.split(".")[0] in HEAVY)[:5]


def test_the_studys_checks_import_no_training_framework(demo_dir, tmp_path):
    """The sweeper's main checks the study before its sweep run opens (sweeplab.sweep.checks.check_study: every
    configuration of the grid, the data path): in a fresh process, without importing torch or Lightning (the check
    of data.path imported the engine's plan, and Lightning with it, in every sweep's main)."""
    code = (
        "import sys\n"
        "from hydra import compose, initialize_config_dir\n"
        "from sweeplab import CONF_DIR\n"
        "from sweeplab.sweep.checks import check_study\n"
        "from sweeplab.study.rounds import planned_jobs\n"
        "with initialize_config_dir(config_dir=CONF_DIR, version_base='1.3'):\n"
        f"    config = compose('train', overrides=['sweep=default', 'debug=smoke', 'data.path={demo_dir}',"
        f" 'hydra.sweep.dir={tmp_path / 'sweep'}'], return_hydra_config=True)\n"
        "check_study(config)\n"
        "assert planned_jobs(config) == 20, planned_jobs(config)\n"  # 4 configurations x 5 replicates
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'lightning'))\n"
        "assert not loaded, loaded[:5]\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]


def test_a_study_whose_data_path_is_missing_is_refused_before_its_sweep_run(tmp_path):
    from sweeplab.core.errors import ConfigError
    from sweeplab.engine import settings

    with pytest.raises(ConfigError, match="data.path: .*no-such-data: no such file or directory"):
        settings.check_data_path(tmp_path / "no-such-data")


def test_a_study_pickled_with_a_submitted_job_leaves_what_it_was_told_behind(mlflow_uri, tmp_path):
    import pickle

    parent = _replicated_sweep(mlflow_uri, tmp_path)
    study = _study(tmp_path, parent)
    for run in runs.job_runs(mlflow_uri, parent):
        study.tell(recorded_outcome(mlflow_uri, run.run_id, 0.5))
    copy = pickle.loads(pickle.dumps(study))
    assert len(study.known().jobs) == 4 and copy.known().jobs == ()
