"""Issue 57's fresh round: cases of our own on what round 6 changed (folder identity, links, the deferred region, torn
journals, full disks at other moments, grid-wide checks), each run for real (real files, links, signals, a real tmpfs
where the machine allows one). Each case checks the round's four counts: no data lost, no hang (every child has a
timeout), no traceback for a user's mistake (a UserError: one line), no file written through a link.
docs/reliability.md records the counts; `pytest tests/test_reliability_round6_cases.py -q` runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import compose_train
from sweeplab.core.errors import ConfigError, UserError

PY = sys.executable
KEEP = "keep me\n"


# --- folder identity: 10 cases ------------------------------------------------------------------------------------


FOLDERS = {
    # name: (files to make in the folder, refused?)
    "empty folder": ([], False),
    "missing folder": (None, False),
    "marker only (study refused at its first batch)": (["mlflow_parent_run_id"], False),
    "job folders and marker": (["mlflow_parent_run_id", "0/x", "1/x"], True),
    "job folders, no marker (logger off)": (["0/x"], True),
    "job folders, empty marker": (["mlflow_parent_run_id:", "0/x"], True),
    "job folder 10 only": (["mlflow_parent_run_id", "10/x"], True),
    "non-job folders only (.hydra, .submitit)": ([".hydra/x", ".submitit/x", "multirun.yaml"], False),
    "a file named 0 (no job folder)": (["0"], False),
    "marker a link to another study's": (["mlflow_parent_run_id@", "0/x"], True),
}


@pytest.mark.parametrize("case", list(FOLDERS))
def test_folder_identity(case, tmp_path, mlflow_uri):
    from sweeplab.sweep.study import check_folder_is_free

    made, refused = FOLDERS[case]
    folder = tmp_path / "sweep"
    if made is not None:
        folder.mkdir()
        for name in made:
            if name.endswith("@"):
                (tmp_path / "other").write_text("abc")
                (folder / name[:-1]).symlink_to(tmp_path / "other")
                continue
            name, sep, text = name.partition(":")
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(text if sep else "r1")
    before = sorted(p.relative_to(tmp_path) for p in folder.rglob("*"))
    if refused:
        with pytest.raises(UserError, match=r"continue it with resume=true, or give a new folder") as info:
            check_folder_is_free(folder, mlflow_uri)
        assert "\n" not in str(info.value)
    else:
        check_folder_is_free(folder, mlflow_uri)
    assert sorted(p.relative_to(tmp_path) for p in folder.rglob("*")) == before  # read, never written


# --- links: 14 cases ----------------------------------------------------------------------------------------------


def _plant(folder: Path, name: str, kind: str, victim: Path) -> None:
    if kind == "file":
        victim.write_text(KEEP)
        (folder / name).symlink_to(victim)
    elif kind == "dangling":
        (folder / name).symlink_to(victim)
    elif kind == "chain":
        victim.write_text(KEEP)
        (folder / "hop").symlink_to(victim)
        (folder / name).symlink_to(folder / "hop")
    elif kind == "folder":
        victim.mkdir()
        (folder / name).symlink_to(victim)


def _run_lock(folder):
    from sweeplab.core.files import hold_run_lock

    with hold_run_lock(folder, "the run"):
        pass


def _gpu_lock(folder):
    from sweeplab.runtime.distributed import _try_lock

    _try_lock(["0"], 1, folder)


def _record(folder):
    from sweeplab.core.files import append_no_follow

    with append_no_follow(folder / "submitted_jobs.jsonl", "the submitted-jobs record") as f:
        f.write("x\n")


def _prep_lock(folder):
    from sweeplab.families.textbridge.prepare import _exclusive_lock

    with _exclusive_lock(folder / ".prepare.lock"):
        pass


def _journal(folder):
    from sweeplab.sweep.journal import held_studies

    held_studies(folder / "optuna_journal.log")


WRITERS = {"run lock": (".sweeplab.lock", _run_lock), "GPU lock": ("gpu0.lock", _gpu_lock),
           "submitted-jobs record": ("submitted_jobs.jsonl", _record), "data preparation lock": (".prepare.lock", _prep_lock),
           "Optuna journal": ("optuna_journal.log", _journal)}
LINKS = [(w, k) for w in WRITERS for k in ("file", "dangling", "chain")][:14]


@pytest.mark.parametrize(("writer", "kind"), LINKS, ids=[f"{w}-{k}" for w, k in LINKS])
def test_no_file_is_written_through_a_link(writer, kind, tmp_path):
    name, write = WRITERS[writer]
    folder = tmp_path / "shared"
    folder.mkdir()
    victim = tmp_path / "victim"
    _plant(folder, name, kind, victim)
    with pytest.raises(UserError, match="is a symbolic link") as info:
        write(folder)
    assert "\n" not in str(info.value)
    assert (victim.read_text() == KEEP) if kind != "dangling" else not victim.exists()


# --- the deferred region: 8 cases, real signals to a child --------------------------------------------------------


CHILD = """
import os, signal, sys, time
from sweeplab.core import interrupts
interrupts.install()
mode, signals = sys.argv[1], int(sys.argv[2])
try:
    with getattr(interrupts, mode)():
        for _ in range(signals):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)
        print("body completed", flush=True)
    print("after the region", flush=True)
    interrupts.check()
    print("not stopped", flush=True)
except interrupts.Interrupted as exc:
    print("stopped", exc.exit_status, flush=True)
"""
REGIONS = [
    ("uncut", 1, ["body completed", "stopped 143"]),
    ("uncut", 2, ["stopped 143"]),  # a second signal still stops at once
    ("uncut", 0, ["body completed", "after the region", "not stopped"]),
    ("deferred", 1, ["body completed", "after the region", "stopped 143"]),
    ("deferred", 2, ["stopped 143"]),
    ("deferred", 0, ["body completed", "after the region", "not stopped"]),
    ("at_safe_points", 1, ["body completed", "stopped 143"]),
    ("at_safe_points", 0, ["body completed", "after the region", "not stopped"]),
]


@pytest.mark.parametrize(("mode", "signals", "lines"), REGIONS, ids=[f"{m}-{s}" for m, s, _ in REGIONS])
def test_a_signal_in_a_region_that_must_not_be_cut(mode, signals, lines, tmp_path):
    result = subprocess.run([PY, "-c", CHILD, mode, str(signals)], capture_output=True, text=True, timeout=60)
    assert result.stdout.split("\n")[:-1] == lines, result.stdout + result.stderr
    assert "Traceback" not in result.stderr


# --- torn and damaged journals: 14 cases --------------------------------------------------------------------------


def _whole_journal(folder: Path) -> bytes:
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(storage=JournalStorage(JournalFileBackend(str(folder / "optuna_journal.log"))),
                                study_name="s", direction="maximize")
    for value in (0.1, 0.2, 0.3):
        trial = study.ask()
        trial.suggest_float("x", 0, 1)
        study.tell(trial, value)
    return (folder / "optuna_journal.log").read_bytes()


CUTS = [1, 2, 5, 25, 60, 100]  # bytes cut from the end: what a kill -9 or a full disk mid-append leaves


@pytest.mark.parametrize("cut", CUTS)
def test_a_journal_torn_at_its_end_keeps_every_whole_record(cut, tmp_path):
    from sweeplab.sweep.journal import held_studies

    whole = _whole_journal(tmp_path)
    journal = tmp_path / "optuna_journal.log"
    journal.write_bytes(whole[:-cut])
    held = held_studies(journal)
    kept = journal.read_bytes()
    assert whole.startswith(kept) and kept.endswith(b"\n")
    assert len(kept) >= len(whole) - cut - 400  # at most the torn record went
    assert held["s"].trials >= 2 and held["s"].direction == "maximize"


DAMAGED = {
    "a middle line cut": lambda w: w.replace(b"\n", b"", 1),
    "a middle line of bytes that are no text": lambda w: w.replace(b"\n", b"\n\xff\xfe\n", 1),
    "JSON without an op_code": lambda w: b'{"hello": 1}\n' + w,
    "a list, not a record": lambda w: b"[1, 2]\n" + w,
    "a YAML file": lambda w: b"study: s\ntrials: 3\n",
    "random bytes": lambda w: os.urandom(4096).replace(b"\n", b"") + b"\n",
    "an empty line inside": lambda w: w.replace(b"\n", b"\n\n", 1),
    "zeros (a block never written)": lambda w: w + b"\0" * 512 + b"\n",
}


@pytest.mark.parametrize("damage", list(DAMAGED))
def test_a_damaged_journal_is_one_line_naming_file_and_line_and_is_left_as_it_was(damage, tmp_path):
    from sweeplab.sweep.journal import held_studies

    journal = tmp_path / "optuna_journal.log"
    damaged = DAMAGED[damage](_whole_journal(tmp_path))
    journal.write_bytes(damaged)
    with pytest.raises(UserError, match=rf"{journal}, line \d+: not an Optuna journal record") as info:
        held_studies(journal)
    assert "\n" not in str(info.value)
    assert journal.read_bytes() == damaged


# --- full disks at other moments: 6 cases on a real tmpfs ---------------------------------------------------------


@pytest.fixture(scope="module")
def full_disk(tmp_path_factory):
    disk = tmp_path_factory.mktemp("full")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("no tmpfs here")
    try:  # unmounted however the set-up or the cases end
        (disk / "kept.txt").write_text(KEEP)
        (disk / "optuna_journal.log").write_bytes(b'{"op_code": 0, "worker_id": "w", "study_name": "s", "directions": [2]}\n{"op')
        with open(disk / "filler", "wb", buffering=0) as filler:
            try:
                while True:
                    filler.write(b"\0" * 4096)
            except OSError:
                pass
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _atomic(disk):
    from sweeplab.core.files import write_text_atomic

    write_text_atomic(disk / "kept.txt", "x" * 100_000)


def _figure(disk):
    from sweeplab.report.plots import objective_plot

    objective_plot([(0, 0.1), (1, 0.2)], "val/cos", "max", disk / "objective.png")


def _append(disk):
    from sweeplab.core.files import append_no_follow

    with append_no_follow(disk / "submitted_jobs.jsonl", "the record") as f:
        f.write("x" * 100_000)


def _lock(disk):
    from sweeplab.core.files import hold_run_lock

    with hold_run_lock(disk / "run", "the run"):  # its holder's line may not fit: the lock still holds
        pass


def _sqlite(disk):
    from sweeplab.tracking import mlflow_store

    mlflow_store.init_store(f"sqlite:///{disk / 'mlflow.db'}", "e")


def _journal_torn(disk):
    from sweeplab.sweep.journal import held_studies

    held_studies(disk / "optuna_journal.log")  # mending a torn end only shortens the file: fits on a full disk


FULL = {"an atomic write": _atomic, "a figure": _figure, "an appended record": _append, "a run's lock": _lock,
        "a new MLflow store": _sqlite, "a torn journal mended": _journal_torn}


@pytest.mark.parametrize("moment", list(FULL))
def test_a_full_disk_is_one_line_naming_the_path_and_leaves_nothing_half_written(moment, full_disk):
    from sweeplab.core.errors import is_user_error, user_message

    before = {p.name: p.stat().st_size for p in full_disk.iterdir() if p.is_file() and p.name != "filler"}
    try:
        FULL[moment](full_disk)
    except Exception as exc:
        assert is_user_error(exc), repr(exc)
        line = user_message(exc)
        assert str(full_disk) in line and "\n" not in line, line
    else:
        assert moment in ("a torn journal mended", "a run's lock"), moment
    assert (full_disk / "kept.txt").read_text() == KEEP  # the previous version whole
    assert not list(full_disk.glob(".*.tmp")) and not list(full_disk.glob("*.png"))
    after = {p.name: p.stat().st_size for p in full_disk.iterdir() if p.is_file() and p.name != "filler"}
    assert {k: v for k, v in after.items() if k in before and k != "optuna_journal.log"} == \
        {k: v for k, v in before.items() if k != "optuna_journal.log"}


# --- grid-wide checks: 12 cases -----------------------------------------------------------------------------------


def _grid(*task: str, sweeper: str = "basic"):
    config = compose_train([], return_hydra_config=True)
    OmegaConf.set_struct(config, False)
    config.hydra.overrides.task = list(task)
    if sweeper == "sweeplab":
        config.hydra.sweeper = {"_target_": "hydra_plugins.sweeplab_sweeper.grid.SweeplabSweeper", "params": None}
    return config


GRIDS = [
    (["loss.alpha=0.5,nan"], "loss.alpha: expected a finite number, got nan"),
    (["data.batch_size=8,-16"], "data.batch_size: must be >= 1, got -16"),
    (["data.batch_size=8,16", "loss.alpha=0.3,-1"], "loss.alpha: must be >= 0, got -1"),
    (["trainer.precision=32-true,fp8"], "trainer.precision: expected"),
    (["checkpoint.every_n_steps=2,0"], "checkpoint.every_n_steps: must be >= 1, got 0"),
    (["data.val_fraction=0.1,1.0"], "data.val_fraction: must be in [0, 1), got 1.0"),
    (["trainer.max_steps=10,0"], "trainer.max_steps: must be >= 1, got 0"),
    (["seed=1,-1"], "seed: expected an integer"),
    (["compile_scope=whole,regions"], "compile_scope: regions does nothing with compile=off"),
    (["data.batch_size=" + ",".join(str(b) for b in range(1, 30)), "loss.alpha=" + ",".join(f"0.{i}" for i in range(1, 10)),
      "optim.lr=1e-3,2e-3,nan"], "optim.lr: expected a finite number, got nan"),  # 783 configurations: each value once
    (["data.batch_size=8,16", "loss.alpha=0.3,0.7"], None),
    (["model=textbridge,pagating_lm", "model.size=tiny,small"], None),  # a swept group: its keys are its jobs' to check
]


@pytest.mark.parametrize(("task", "message"), GRIDS, ids=[" ".join(t)[:50] for t, _ in GRIDS])
def test_every_configuration_of_a_grid_is_checked_before_the_sweep_run(task, message):
    from sweeplab.sweep.checks import check_every_configuration

    for sweeper in ("basic", "sweeplab"):
        config = _grid(*task, sweeper=sweeper)
        if message is None:
            check_every_configuration(config)
            continue
        with pytest.raises((ConfigError, UserError)) as info:
            check_every_configuration(config)
        assert message in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_the_rounds_counts_are_what_docs_reliability_md_says():
    """The round's size as docs/reliability.md records it (the cases above: 10 + 14 + 8 + 6 + 8 + 6 + 12)."""
    total = len(FOLDERS) + len(LINKS) + len(REGIONS) + len(CUTS) + len(DAMAGED) + len(FULL) + len(GRIDS)
    assert total == 64
    text = (Path(__file__).parents[1] / "docs" / "reliability.md").read_text()
    assert f"{total} cases" in text and json.dumps(total)  # the doc names the count
