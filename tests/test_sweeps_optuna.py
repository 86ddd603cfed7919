"""The Optuna search (hydra/sweeper=optuna: hydra_plugins/sweeplab_sweeper/optuna_search.py): trials run with
replicates, the study kept in its journal beside the sweep, a search killed mid-trial and continued, and the mistakes
that fail in one line before any job."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from mlflow.tracking import MlflowClient
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from conftest import compose_train
from sweeplab.core.errors import UserError
from sweeplab.core.records import JOB, SWEEP
from sweeplab.study import rounds
from sweeplab.sweep import search as optuna_search
from sweeplab.sweep.search import TrialOutcome, search_space, tell
from sweeplab.tracking import mlflow_store
from test_bad_inputs_round4 import _one_line
from test_sweeps_parallel import assert_one_sweep, smoke, store_runs, sweep

SEARCH = "textbridge-optuna-alpha-beta-lr"  # the preset's MLflow experiment


def _study(sweep_dir: Path) -> optuna.Study:
    storage = JournalStorage(JournalFileBackend(str(sweep_dir / optuna_search.JOURNAL_FILE)))
    return optuna.load_study(study_name=None, storage=storage)


def _finished_jobs(uri: str) -> dict[tuple[int, int], list]:
    """(trial number, replicate) -> the FINISHED job runs of it."""
    jobs: dict[tuple[int, int], list] = {}
    for run in store_runs(uri, SEARCH)[1]:
        if mlflow_store.is_job_run(run) and run.info.status == "FINISHED":
            key = (int(run.data.tags[JOB.config_index]), int(run.data.tags[JOB.replicate]))
            jobs.setdefault(key, []).append(run)
    return jobs


def _assert_each_trial_is_told_its_replicates_median(study: optuna.Study, jobs: dict, replicates: int) -> None:
    for trial in study.trials:
        runs = [jobs[(trial.number, r)][0] for r in range(replicates)]
        objectives = [run.data.metrics[JOB.objective] for run in runs]
        assert trial.value == pytest.approx(statistics.median(objectives))
        assert trial.user_attrs["replicate_values"] == pytest.approx(objectives)
        assert [run.data.params["seed"] for run in runs] == [str(r) for r in range(replicates)]  # seed + r
        for run in runs:  # every replicate trained the trial's sampled values
            for key in ("loss.alpha", "loss.beta"):
                assert float(run.data.params[key]) == pytest.approx(trial.params[key])


# --- a real search, in the default suite -------------------------------------------------------------------------
def test_a_search_of_alpha_and_beta_runs_each_trial_twice_and_tells_optuna_the_replicates_median(
        demo_dir, mlflow_uri, tmp_path):
    """2 trials x 2 replicates, lr pinned on the command line: each trial's value is its jobs' median objective."""
    sweep_dir = tmp_path / "search"
    started = time.monotonic()
    result = sweep(tmp_path, "hparams_search=optuna_alpha_beta", "hydra.sweeper.n_trials=2", "replicates=2",
                   "optim.lr=0.003", f"hydra.sweep.dir={sweep_dir}",
                   *smoke(demo_dir, "data.batch_size=16", "trainer.max_steps=2", "trainer.val_check_interval=2"))
    print(f"search of 2 trials x 2 replicates: {time.monotonic() - started:.1f} s")
    assert result.returncode == 0, result.stderr[-3000:]
    parent, runs = assert_one_sweep(mlflow_uri, 4, SEARCH)
    study = _study(sweep_dir)
    assert [(t.number, t.state.name) for t in study.trials] == [(0, "COMPLETE"), (1, "COMPLETE")]
    assert {run.data.params["optim.lr"] for run in runs} == {"0.003"}  # pinned: not searched
    jobs = _finished_jobs(mlflow_uri)
    assert sorted(jobs) == [(0, 0), (0, 1), (1, 0), (1, 1)] and all(len(v) == 1 for v in jobs.values())
    _assert_each_trial_is_told_its_replicates_median(study, jobs, 2)
    for trial in study.trials:  # the Hydra job (its folder) of each replicate
        assert {r: int(jobs[(trial.number, int(r))][0].data.tags[JOB.hydra_job]) for r in trial.user_attrs["jobs"]} \
            == {r: n for r, n in trial.user_attrs["jobs"].items()}
    results = yaml.safe_load((sweep_dir / optuna_search.RESULTS_FILE).read_text())
    assert results["best_value"] == pytest.approx(study.best_value) == max(t.value for t in study.trials)
    assert results["best_params"] == pytest.approx(study.best_params) and results["trials"]["COMPLETE"] == 2
    reported = {a.path for a in MlflowClient(mlflow_uri).list_artifacts(parent.info.run_id, "report")}
    assert {"report/optimization_results.yaml", "report/objective.png"} <= reported
    assert "search: trial 1 COMPLETE" in result.stdout and "search: best trial" in result.stdout
    # the sweep run names Optuna's best trial (its replicates' median), not the verdict's fastest configuration
    recorded = MlflowClient(mlflow_uri).get_run(parent.info.run_id).data
    assert recorded.metrics["best/objective"] == pytest.approx(study.best_value)
    assert {k: float(recorded.params[f"best.{k}"]) for k in study.best_params} == pytest.approx(study.best_params)
    assert f"best: trial {study.best_trial.number}: val/cos " in result.stdout


# --- killed and continued ---------------------------------------------------------------------------------------
@pytest.mark.slow  # two processes, 6 jobs: 26 s on a quiet 2-core machine, a minute under load
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGINT])  # kill -9; a terminal's Ctrl-C
def test_a_search_interrupted_mid_trial_continues_without_losing_or_repeating_a_trial(
        demo_dir, mlflow_uri, tmp_path, signum):
    """kill -9 (or Ctrl-C) while trial 1's second replicate trains (after its checkpoint at step 2), then the continue
    command the sweep recorded: trials 0..2 each COMPLETE once, trial 1 with its own parameters, its finished
    replicate kept and its interrupted one resumed into its own run."""
    sweep_dir, paused = tmp_path / "search", tmp_path / "paused"
    study_args = ["hparams_search=optuna_alpha_beta", "replicates=2", "optim.lr=0.003", "hydra.sweeper.n_trials=3",
                  f"hydra.sweep.dir={sweep_dir}",
                  *smoke(demo_dir, "data.batch_size=16", "trainer.max_steps=4", "trainer.val_check_interval=2",
                         "checkpoint.every_n_steps=2")]
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "sweeplab.train", *study_args], cwd=tmp_path, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "SWEEPLAB_FAULT_PAUSE_AT_STEP": "3", "SWEEPLAB_FAULT_PAUSED_FILE": str(paused)})
    try:  # every job pauses at step 3: let them go on until job 3 (trial 1, replicate 1) pauses
        while True:
            _wait_for(paused.exists, process)
            if (sweep_dir / "3").is_dir():
                break
            paused.unlink()
        _wait_for((sweep_dir / "3" / "checkpoints" / "last.ckpt").is_file, process)
        before = {t.number: (t.state.name, t.params) for t in _study(sweep_dir).trials}
        kept = _finished_jobs(mlflow_uri)
        (interrupted,) = [r.info.run_id for r in store_runs(mlflow_uri, SEARCH)[1] if r.info.status == "RUNNING"]
        os.killpg(process.pid, signum)
        output = process.communicate(timeout=120)[0]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == (-signal.SIGKILL if signum == signal.SIGKILL else 130), output[-3000:]
    assert {n: (state, params) for n, (state, params) in before.items()} == {
        n: (t.state.name, t.params) for n, t in enumerate(_study(sweep_dir).trials)}  # the interrupt told nothing
    assert {n: state for n, (state, _) in before.items()} == {0: "COMPLETE", 1: "RUNNING"}
    assert sorted(kept) == [(0, 0), (0, 1), (1, 0)]

    parent, *_ = store_runs(mlflow_uri, SEARCH)[0]
    command = shlex.split(parent.data.tags[SWEEP.continue_command])  # what the sweep prints when interrupted
    assert command[:4] == ["python", "-m", "sweeplab.train", "-m"] and "resume=true" in command
    continued = subprocess.run([sys.executable, *command[1:]], cwd=tmp_path, capture_output=True, text=True,
                               timeout=600)
    print(f"{signal.Signals(signum).name} at trial 1 of 3 (x 2 replicates), continued: "
          f"{time.monotonic() - started:.1f} s; before: {before}")
    assert continued.returncode == 0, continued.stderr[-3000:]
    assert "continuing: 1 trials done, 1 interrupted" in continued.stdout

    study = _study(sweep_dir)
    assert [(t.number, t.state.name) for t in study.trials] == [(0, "COMPLETE"), (1, "COMPLETE"), (2, "COMPLETE")]
    assert study.trials[1].params == before[1][1]  # the interrupted trial ran again with its own values
    jobs = _finished_jobs(mlflow_uri)
    assert sorted(jobs) == [(t, r) for t in range(3) for r in range(2)] and all(len(v) == 1 for v in jobs.values())
    for key, runs in kept.items():  # the jobs that finished before the kill were not run again
        assert jobs[key][0].info.run_id == runs[0].info.run_id
    assert jobs[(1, 1)][0].info.run_id == interrupted  # resumed into its own run from its last.ckpt
    assert not [r for r in MlflowClient(mlflow_uri).search_runs(["1"]) if r.info.status == "RUNNING"]
    _assert_each_trial_is_told_its_replicates_median(study, jobs, 2)
    print("after:", [(t.number, t.state.name, round(t.value, 4), t.user_attrs["jobs"]) for t in study.trials])


def _wait_for(condition, process: subprocess.Popen, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"exited with {process.returncode}:\n{process.stdout.read()[-3000:]}")
        assert time.monotonic() < deadline, f"waited {timeout_s} s"
        time.sleep(0.05)


# --- mistakes: one line, before any job ------------------------------------------------------------------------
@pytest.mark.parametrize(("override", "named"), [
    ("hydra/sweeper/sampler=tpee", "hydra/sweeper/sampler"),  # no such sampler config: Hydra's composition
    ("hydra.sweeper.sampler._target_=optuna.samplers.TPESamplr", "hydra.sweeper.sampler: cannot make"),
    ("loss.alpha=interval(0.9, 0.1)", "loss.alpha: interval(0.9, 0.1) needs low < high"),
])
def test_a_wrong_sampler_or_search_space_fails_in_one_line_before_any_job(demo_dir, mlflow_uri, tmp_path, override,
                                                                           named):
    sweep_dir = tmp_path / "search"
    result = sweep(tmp_path, "hparams_search=optuna_alpha_beta", override, f"hydra.sweep.dir={sweep_dir}",
                   *smoke(demo_dir))
    assert result.returncode != 0
    _one_line(result.stderr, named)
    assert not [p for p in sweep_dir.glob("*") if p.name.isdigit()]  # no job folder
    assert not store_runs(mlflow_uri, SEARCH)[1]  # no job run


def test_the_search_space_reads_hydra_optuna_sweepers_syntax_and_the_command_line_pins_a_key():
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    params = {"loss.alpha": "interval(0.05, 1.0)", "optim.lr": "tag(log, interval(1e-4, 3e-3))",
              "model.alpha": "choice(0.0, 0.5, learnable)", "data.batch_size": "range(8, 40, 8)",
              "trainer.max_steps": "range(2, 11)", "loss.beta": "0.5"}
    space, fixed = search_space(params, ["debug=smoke", "loss.alpha=0.7", "+extra=1"])
    assert space == {
        "optim.lr": FloatDistribution(1e-4, 3e-3, log=True),
        "model.alpha": CategoricalDistribution([0.0, 0.5, "learnable"]),
        "data.batch_size": IntDistribution(8, 32, step=8),  # range ends before its stop, as in Hydra's grid
        "trainer.max_steps": IntDistribution(2, 10),
    }
    assert fixed == ["loss.beta=0.5", "debug=smoke", "loss.alpha=0.7", "+extra=1"]  # a plain value pins its key
    assert optuna_search.override_value("a b") == "'a b'" and optuna_search.override_value(True) == "true"


@pytest.mark.parametrize(("params", "named"), [
    ({"loss.alpha": "interval(0.1"}, "hydra.sweeper.params.loss.alpha: cannot read 'interval(0.1'"),
    ({"loss.alpha": "tag(log, interval(0.0, 1.0))"}, "loss.alpha: interval(0.0, 1.0) needs low < high and low > 0"),
    ({"loss.alpha": "tag(fast, interval(0.1, 1.0))"}, "loss.alpha: unknown tag(s) ['fast']"),
])
def test_a_search_space_string_it_cannot_sample_names_its_key_and_the_syntax(params, named):
    with pytest.raises(UserError, match=r"^config error: ") as refused:
        search_space(params, [])
    assert named in str(refused.value) and "write interval(low, high)" in str(refused.value)


def test_what_a_trial_is_told_from_its_replicates():
    """COMPLETE: the median of the values returned; FAIL: none returned; PRUNED: a replicate stopped behind its
    round's leader (its median so far is the intermediate value); at the target: a finished job, COMPLETE."""
    study = optuna.create_study(direction="maximize")
    outcomes = [TrialOutcome({0: 0.5, 1: 0.7, 2: 0.1}, {}), TrialOutcome({0: 0.4, 1: None}, {}),
                TrialOutcome({0: None, 1: None}, {}), TrialOutcome({0: 0.6, 1: 0.2}, {1: "behind"}),
                TrialOutcome({0: 0.6, 1: 0.8}, {0: "target", 1: "no_improvement"})]
    for outcome in outcomes:
        tell(study, study.ask().number, outcome)
    trials = study.trials
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE", "FAIL", "PRUNED", "COMPLETE"]
    assert [t.value for t in trials] == pytest.approx([0.5, 0.4, None, 0.4, 0.7])
    assert trials[1].user_attrs["replicates_failed"] == 1 and trials[3].user_attrs["stop_reasons"] == {"1": "behind"}
    low, high = trials[0].user_attrs["objective_interval"]
    assert low < 0.5 < high  # the 95 % interval of the replicates' mean, as the verdict's


def test_a_sweep_folder_holds_one_search_which_only_resume_continues(tmp_path):
    """Checked before the sweep run opens: a fresh search refuses a folder whose journal holds trials, a continued one
    a journal of another study; a continued one's sampler is seeded seed + trials so far (new draws)."""
    def searcher(*overrides: str, name: str = "s") -> optuna_search.OptunaSearch:
        config = compose_train(["hparams_search=optuna_alpha_beta", "hydra/sweeper/sampler=random",  # any sampler
                                f"hydra.sweep.dir={tmp_path}", *overrides], return_hydra_config=True)
        sweeper = config.hydra.sweeper
        searching = optuna_search.OptunaSearch(sweeper.sampler, sweeper.direction, name, sweeper.n_trials,
                                               sweeper.n_jobs, sweeper.params)
        searching.config = config
        return searching

    first = searcher()
    plan = first._plan([])
    study = first._open_study(tmp_path, plan)
    study.tell(study.ask(plan.space), 0.5)
    with pytest.raises(UserError, match=r"already holds the Optuna study 's' \(1 trials\).*resume=true"):
        searcher()._plan([])
    with pytest.raises(UserError, match=r"holds the study 's', not 'other'"):
        searcher("resume=true", name="other")._plan([])
    plan = searcher("resume=true")._plan([])
    assert plan.continued and plan.study_name == "s"
    seeded = [optuna.samplers.RandomSampler(seed=seed)._rng.rng.uniform() for seed in (0, 1)]
    assert plan.sampler._rng.rng.uniform() == seeded[1] != seeded[0]


@pytest.mark.parametrize("name", sorted(optuna_search.SAMPLERS))
def test_every_sampler_config_makes_its_sampler_seeded_with_the_configs_seed(name, tmp_path):
    config = compose_train(["hydra/sweeper=optuna", f"hydra/sweeper/sampler={name}", "seed=3"], return_hydra_config=True)
    sweeper = config.hydra.sweeper
    searching = optuna_search.OptunaSearch(sweeper.sampler, None, None, 2, 1, None)
    sampler = searching._sampler(trials_so_far=0)
    assert type(sampler).__name__ == sweeper.sampler._target_.rsplit(".", 1)[1] and sweeper.sampler.seed == 3


def test_the_optuna_search_runs_replicates_and_continues_its_sweeps():
    """What the sweep's checks ask of a sweeper before they accept replicates=N or resume=true."""
    config = compose_train(["hparams_search=optuna_alpha_beta", "replicates=3"], return_hydra_config=True)
    assert config.hydra.sweeper._target_.endswith("sweeper.search.OptunaSearch")
    assert rounds.runs_replicates(config)


# --- the presets, slow ---------------------------------------------------------------------------------------------
@pytest.mark.slow  # the default suite's time budget; `make test-all` runs it
def test_optuna_trials_that_differ_in_any_param_have_different_run_names(demo_dir, mlflow_uri, tmp_path):
    """α and β held to one value: only lr differs between the trials, and the names must still tell them apart."""
    result = sweep(
        tmp_path, "hparams_search=optuna_alpha_beta", "hydra.sweeper.n_trials=3", "loss.alpha=choice(0.7)",
        "loss.beta=choice(0.5)", "logger.experiment_name=names",
        *smoke(demo_dir, "data.batch_size=16", "trainer.max_steps=2", "trainer.val_check_interval=2"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    _, trials = assert_one_sweep(mlflow_uri, 3, "names")
    names = {r.info.run_name for r in trials}
    assert len({r.data.params["optim.lr"] for r in trials}) == len(names) == 3, names
    for name in names:  # the swept keys first, where a narrow column still shows them
        assert name.startswith("α=0.7 β=0.5 lr=") and " textbridge tiny bs=16 steps=2 cpu" in name, name


@pytest.mark.slow
def test_optuna_lm_minimises_val_ppl_over_alpha_mode_and_lr(mlflow_uri, tmp_path):
    result = sweep(
        tmp_path, "hparams_search=optuna_lm", "hydra.sweeper.n_trials=3", "debug=smoke", "trainer.max_steps=4",
        "trainer.val_check_interval=2", env={"SWEEPLAB_DATA_DIR": str(tmp_path / "data")},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    parent, trials = assert_one_sweep(mlflow_uri, 3, "pagating-optuna-alpha-lr")
    parent = MlflowClient(mlflow_uri).get_run(parent.info.run_id)
    assert parent.data.tags["objective"] == "val/ppl" and parent.data.tags["objective_mode"] == "min"
    assert parent.data.metrics["best/objective"] == min(r.data.metrics["objective"] for r in trials)
    assert {"best.model.alpha", "best.optim.lr"} <= set(parent.data.params)


@pytest.mark.slow  # joblib's workers start torch each: ~40 s
def test_a_search_through_joblib_launches_a_batch_of_trials_with_their_replicates_together(
        demo_dir, mlflow_uri, tmp_path):
    sweep_dir = tmp_path / "search"
    result = sweep(tmp_path, "hparams_search=optuna_alpha_beta", "hydra.sweeper.n_trials=2", "hydra.sweeper.n_jobs=2",
                   "replicates=2", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep_dir}",
                   *smoke(demo_dir, "data.batch_size=16", "trainer.max_steps=2", "trainer.val_check_interval=2"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert_one_sweep(mlflow_uri, 4, SEARCH)
    study = _study(sweep_dir)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    jobs = _finished_jobs(mlflow_uri)
    _assert_each_trial_is_told_its_replicates_median(study, jobs, 2)
    # one launch, round by round: replicate 0 of trials 0, 1, then replicate 1 in reverse (trial 1, then 0)
    order = sorted(jobs, key=lambda key: int(jobs[key][0].data.tags[JOB.hydra_job]))
    assert order == [(0, 0), (1, 0), (1, 1), (0, 1)]
    assert {run.data.tags[JOB.concurrent_jobs] for runs in jobs.values() for run in runs} == {"2"}


@pytest.mark.slow  # submitit's local executor starts a Python per job: ~50 s
def test_a_search_through_submitit_submits_and_watches_its_jobs_as_the_grid_sweeper_does(
        demo_dir, mlflow_uri, tmp_path):
    sweep_dir = tmp_path / "search"
    result = sweep(tmp_path, "hparams_search=optuna_alpha_beta", "hydra.sweeper.n_trials=1", "replicates=2",
                   "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10", f"hydra.sweep.dir={sweep_dir}",
                   *smoke(demo_dir, "data.batch_size=16", "trainer.max_steps=2", "trainer.val_check_interval=2"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "sweep: submitted jobs 0-1" in result.stdout  # slurm.submit, one array for the trial's replicates
    assert_one_sweep(mlflow_uri, 2, SEARCH)
    study = _study(sweep_dir)
    assert [t.state.name for t in study.trials] == ["COMPLETE"]
    _assert_each_trial_is_told_its_replicates_median(study, _finished_jobs(mlflow_uri), 2)
