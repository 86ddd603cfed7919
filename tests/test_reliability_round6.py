"""Issue 57 (reliability round 6): a sweep folder belongs to one study, nothing a stop can tear, no file written
through a link, a torn Optuna journal read before anything is written. Real processes, real signals, real links."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from conftest import compose_train
from sweeplab.core.errors import UserError
from test_bad_inputs_round4 import _one_line
from test_reliability_round5 import _train

PY = sys.executable


def _smoke(demo_dir, *more: str) -> list[str]:
    return ["debug=smoke", f"data.path={demo_dir}", "model.out_dim=64", "data.batch_size=16",
            "logger.system_metrics_after_s=null", *more]


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.name.startswith(".")}


# --- 1: a sweep folder belongs to one study -----------------------------------------------------------------------


@pytest.mark.slow  # a study and two refused commands: 1-4 min on the busy 2-core machine (fast sibling: the next test)
def test_a_new_study_in_a_finished_studys_folder_is_refused_and_the_folder_is_left_as_it_was(demo_dir, mlflow_uri,
                                                                                               tmp_path):
    """A second `-m` command into a finished study's folder, without resume=true, replaced every checkpoint, its
    mlflow_parent_run_id and report, and the old runs' `checkpoint` tags then pointed at the other study's weights."""
    sweep_dir = tmp_path / "sweep"
    study = ["-m", *_smoke(demo_dir, "trainer.max_steps=2"), f"hydra.sweep.dir={sweep_dir}"]
    first, _ = _train(study, tmp_path, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    parent = (sweep_dir / "mlflow_parent_run_id").read_text().strip()
    before = _digests(sweep_dir)
    assert any(name.endswith(".ckpt") for name in before)

    for again in (study, [*study, "data.batch_size=8"]):  # the same command, or another study
        second, cpu_s = _train(again, tmp_path)
        assert second.returncode == 2, second.stderr[-3000:]
        _one_line(second.stderr, f"hydra.sweep.dir={sweep_dir} holds sweep run {parent} (FINISHED)",
                  "continue it with resume=true, or give a new folder")
    assert _digests(sweep_dir) == before
    client = MlflowClient(mlflow_uri)
    assert len(client.search_runs(["1"], "tags.`sweeplab.role` = 'sweep'")) == 1  # no second sweep run


def test_a_folder_whose_study_ran_no_job_is_taken_by_a_new_study(tmp_path, mlflow_uri):
    """A study refused at its first batch leaves a marker and no job folder: nothing to lose, a new study takes it."""
    from sweeplab.sweep.study import check_folder_is_free

    (tmp_path / "mlflow_parent_run_id").write_text("0123")
    check_folder_is_free(tmp_path, mlflow_uri)
    (tmp_path / "0").mkdir()
    with pytest.raises(UserError, match=r"holds sweep run 0123 \(not in the store .*\) with job folders 0: continue"):
        check_folder_is_free(tmp_path, mlflow_uri)
    with pytest.raises(UserError, match=r"holds an earlier study's job folders 0: continue it with resume=true"):
        check_folder_is_free(tmp_path, None)


# --- 2: a stop after the job's last line --------------------------------------------------------------------------


@pytest.mark.slow  # a job to its end: ~50 s on the busy machine (fast sibling: the uncut test below)
def test_sigterm_while_the_jobs_closing_writes_wait_on_the_store_ends_killed_at_once(demo_dir, mlflow_uri, tmp_path):
    """SIGTERM right after a job's `done:` line landed inside sqlite's write of the wall breakdown (outside the
    deferred region): the connection kept the write lock and closing the run got `database is locked` every 20 s.
    Here the store's lock is held by the test as the job's closing writes start, the signal comes while they wait on
    it, then the lock is released: the write completes, the run is closed, the process exits 143 at once."""
    db = Path(mlflow_uri.removeprefix("sqlite:///"))
    job = subprocess.Popen([PY, "-m", "sweeplab.train", *_smoke(demo_dir, "trainer.max_steps=2"),
                            f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    output = []
    try:
        for line in job.stdout:
            output.append(line)
            if "done: " in line:
                break
        else:
            raise AssertionError("".join(output)[-3000:])
        holder = sqlite3.connect(db, timeout=30)
        holder.execute("BEGIN EXCLUSIVE")  # the job's next write waits in sqlite's busy handler
        time.sleep(0.5)
        job.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        holder.rollback()
        holder.close()
        rest, _ = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    output.append(rest)
    text = "".join(output)
    assert job.returncode == 128 + signal.SIGTERM, text[-3000:]
    assert "database is locked" not in text and "Traceback" not in text, text[-3000:]
    (run,) = MlflowClient(mlflow_uri).search_runs(["1"])
    assert run.info.status in ("KILLED", "FINISHED"), run.info.status  # never left RUNNING


def test_a_signal_inside_a_store_write_is_acted_on_right_after_it(tmp_path):
    """interrupts.uncut: the write completes, then the stop is raised; a second signal still stops at once."""
    script = tmp_path / "child.py"
    script.write_text(
        "import os, signal, time\n"
        "from sweeplab.core import interrupts\n"
        "interrupts.install()\n"
        "try:\n"
        "    with interrupts.uncut():\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        time.sleep(0.2)\n"
        "        print('write completed', flush=True)\n"
        "    print('not reached', flush=True)\n"
        "except interrupts.Interrupted as exc:\n"
        "    print('stopped', exc.exit_status, flush=True)\n")
    result = subprocess.run([PY, str(script)], capture_output=True, text=True, timeout=60)
    assert result.stdout.split("\n")[:2] == ["write completed", "stopped 143"], result.stdout + result.stderr


# --- 4: no file written through a link ----------------------------------------------------------------------------


@pytest.mark.slow  # a job up to its lock: ~50 s on the busy machine (fast sibling: the next test)
def test_a_run_lock_replaced_by_a_link_is_refused_and_its_target_untouched(demo_dir, mlflow_uri, tmp_path):
    """`.sweeplab.lock` replaced by a symlink to another file: the job truncated the target and wrote `pid N on vm`."""
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / ".sweeplab.lock").symlink_to(victim)
    result, _ = _train([*_smoke(demo_dir), f"hydra.run.dir={run_dir}"], tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    _one_line(result.stderr, f"{run_dir / '.sweeplab.lock'}: is a symbolic link, not a lock file")
    assert victim.read_text() == "keep me\n"


@pytest.mark.parametrize("planted", ["file", "dangling"])
def test_no_lock_or_record_sweeplab_creates_is_written_through_a_link(tmp_path, planted):
    from sweeplab.core.files import append_no_follow, hold_run_lock, run_lock_is_free

    victim = tmp_path / "victim"
    if planted == "file":
        victim.write_text("keep me\n")
    folder = tmp_path / "shared"
    folder.mkdir()
    for name in (".sweeplab.lock", "submitted_jobs.jsonl"):
        (folder / name).symlink_to(victim)
    with pytest.raises(UserError, match="is a symbolic link, not a lock file"):
        with hold_run_lock(folder, "sweep"):
            pass
    with pytest.raises(UserError, match="is a symbolic link, not the record"):
        append_no_follow(folder / "submitted_jobs.jsonl", "the record")
    assert run_lock_is_free(folder) is None  # cannot tell through a link; never reads its target
    assert (victim.read_text() == "keep me\n") if planted == "file" else not victim.exists()


# --- 3 and 10: the Optuna journal, read and checked before anything is written -------------------------------------


def _searcher(sweep_dir: Path, *overrides: str):
    from hydra_plugins.sweeplab_sweeper import optuna_search

    config = compose_train(["hparams_search=optuna_alpha_beta", "hydra/sweeper/sampler=random",
                            f"hydra.sweep.dir={sweep_dir}", *overrides], return_hydra_config=True)
    sweeper = config.hydra.sweeper
    searching = optuna_search.OptunaSearch(sweeper.sampler, sweeper.direction, "s", sweeper.n_trials,
                                           sweeper.n_jobs, sweeper.params)
    searching.config = config
    return searching


def _journal_with_trials(sweep_dir: Path, trials: int = 2) -> Path:
    first = _searcher(sweep_dir)
    plan = first._plan([])
    study = first._open_study(sweep_dir, plan)
    for value in range(trials):
        study.tell(study.ask(plan.space), 0.5 + value)
    return sweep_dir / "optuna_journal.log"


def test_a_torn_last_journal_line_is_dropped_with_a_warning_and_every_finished_trial_kept(tmp_path, caplog):
    """`truncate -s -25` of the journal (what a kill -9 or a full disk mid-append leaves) made every continue fail
    with a JSONDecodeError traceback after the sweep run was reopened."""
    journal = _journal_with_trials(tmp_path)
    lines = journal.read_bytes().split(b"\n")
    with open(journal, "r+b") as f:  # the last record (the second trial's tell) torn
        f.truncate(journal.stat().st_size - 25)
    with caplog.at_level(logging.WARNING):
        plan = _searcher(tmp_path, "resume=true")._plan([])
    assert "dropped its torn last line" in caplog.text
    assert journal.read_bytes().split(b"\n")[:-1] == lines[:-2]  # the torn record gone, the ones before whole
    study = _searcher(tmp_path, "resume=true")._open_study(tmp_path, plan)
    states = [t.state.name for t in study.get_trials()]
    assert states[0] == "COMPLETE" and len(states) == 2, states  # the torn tell: that trial runs again
    study.tell(study.ask(plan.space), 3.0)  # appends cleanly after the mended end
    assert _searcher(tmp_path, "resume=true")._plan([]).continued


@pytest.mark.parametrize(("content", "named"), [
    (b"\x89PNG\r\n\x1a\n\x00\x00garbage\n", "line 1: not an Optuna journal record (byte 1 is not UTF-8 text)"),
    (b"a: yaml file\nnot a journal\n", "line 1: not an Optuna journal record (not JSON"),
    (b'{"op_code": 0, "worker_id": "x", "study_name": "s", "directions": [2]}\n{"half', "line 2"),
])
def test_a_damaged_or_foreign_journal_is_one_line_naming_the_file_and_line(tmp_path, content, named):
    journal = tmp_path / "optuna_journal.log"
    journal.write_bytes(content)
    if named == "line 2":  # a torn last line after a whole record: dropped, not refused
        assert _searcher(tmp_path, "resume=true")._plan([]).continued
        return
    for overrides in ([], ["resume=true"]):
        with pytest.raises(UserError, match=re.escape(f"{journal}, {named}")):
            _searcher(tmp_path, *overrides)._plan([])
    assert journal.read_bytes() == content  # read, never written


def test_a_journal_that_is_a_link_is_refused(tmp_path):
    target = tmp_path / "elsewhere.log"
    target.write_text("")
    folder = tmp_path / "sweep"
    folder.mkdir()
    (folder / "optuna_journal.log").symlink_to(target)
    with pytest.raises(UserError, match="is a symbolic link, not an Optuna journal"):
        _searcher(folder)._plan([])


def test_resuming_a_search_with_the_other_direction_is_refused(tmp_path):
    """The log said "minimize", the study stayed maximize, without a word."""
    _journal_with_trials(tmp_path, 1)
    with pytest.raises(UserError, match=r"resume: the study 's' in .* searches to maximize val/cos, this command to "
                                        r"minimize: give hydra.sweeper.direction=maximize"):
        _searcher(tmp_path, "resume=true", "hydra.sweeper.direction=minimize")._plan([])
    assert _searcher(tmp_path, "resume=true", "hydra.sweeper.direction=maximize")._plan([]).continued
