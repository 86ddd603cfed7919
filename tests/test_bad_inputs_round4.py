"""Issue 41's expected conditions, each one line and a non-zero exit with no traceback, nothing RUNNING and nothing
half-written: a run lock that is a folder, the report's --out under a file, a deleted experiment's sweep, a store that
is not a database, the export of a damaged or hand-made checkpoint and with two sources, the round trip's bad
arguments and data, and SIGINT in the data preparation, the report and the round trip (real processes)."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from sweeplab.core.errors import UserError
from sweeplab.families import get_family
from sweeplab.tracking import mlflow_store

PY = sys.executable


def _one_line(err: str, *fragments: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert "Traceback" not in err, err[-3000:]
    assert lines and lines[-1].startswith("error: "), err[-3000:]
    for fragment in fragments:
        assert fragment in lines[-1], lines[-1]
    return lines[-1]


# --- the run lock --------------------------------------------------------------------------------------------------


def test_a_run_lock_that_is_a_folder_is_one_line_before_any_run(demo_dir, mlflow_uri, tmp_path):
    from conftest import smoke_config
    from sweeplab.engine.training import train

    (tmp_path / "job" / ".sweeplab.lock").mkdir(parents=True)
    with pytest.raises(UserError, match=r"\.sweeplab\.lock: cannot open the run lock of .*Is a directory"):
        train(smoke_config(demo_dir, "trainer.max_steps=2"), output_dir=tmp_path / "job")
    experiment = MlflowClient(mlflow_uri).get_experiment_by_name("sweeplab")
    assert experiment is None or not MlflowClient(mlflow_uri).search_runs([experiment.experiment_id])


# --- the report ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("under", ["itself", "a parent"])
def test_the_reports_out_on_or_under_a_file_is_one_line(tmp_path, capsys, under):
    from sweeplab.report.__main__ import main

    (tmp_path / "taken").write_text("a file")
    out = tmp_path / "taken" if under == "itself" else tmp_path / "taken" / "deeper" / "report"
    assert main(["--experiment", "x", "--out", str(out), "--tracking-uri", f"sqlite:///{tmp_path / 'none.db'}"]) == 2
    _one_line(capsys.readouterr().err, f"--out {out}", "not a folder")
    assert (tmp_path / "taken").read_text() == "a file" and not (tmp_path / "none.db").exists()


def test_the_report_of_a_deleted_experiments_sweep_is_one_line_and_changes_nothing(mlflow_uri, tmp_path, capsys):
    from sweeplab.report.__main__ import main

    client = MlflowClient(mlflow_uri)
    experiment = mlflow_store.init_store(mlflow_uri, "gone")
    parent = client.create_run(experiment, tags={"sweeplab.role": "sweep", "sweep_dir": str(tmp_path)}).info.run_id
    client.set_terminated(client.create_run(experiment, tags={"mlflow.parentRunId": parent}).info.run_id)
    client.set_terminated(parent)
    client.delete_experiment(experiment)
    assert main(["--sweep", parent, "--out", str(tmp_path / "out")]) == 2
    _one_line(capsys.readouterr().err, f"--sweep={parent}", "deleted")
    assert not (tmp_path / "out").exists()


def test_a_store_that_is_not_a_database_is_one_line_for_the_report_and_the_ui(tmp_path, capsys, monkeypatch):
    from sweeplab import ui
    from sweeplab.report.__main__ import main

    store = tmp_path / "mlflow.db"
    store.write_text("this is not a database\n")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    monkeypatch.setattr(os, "execv", lambda *a: pytest.fail("the UI server was started on a broken store"))
    assert ui.main(["--port", "5999"]) == 2
    _one_line(capsys.readouterr().err, str(store), "not an SQLite database")
    assert main(["--experiment", "x", "--out", str(tmp_path / "out")]) == 2
    _one_line(capsys.readouterr().err, "not an SQLite database")
    assert store.read_text() == "this is not a database\n"


# --- the export and the model loader -------------------------------------------------------------------------------


def _handmade_checkpoint(path: Path, family: str = "textbridge", edit=None, **model) -> Path:
    """A checkpoint as training writes its model part, `edit`ed, then checksummed (consistent, but wrong)."""
    from sweeplab.tasks.checkpoint import CHECKSUM_ALGORITHM, CHECKSUM_KEY, content_checksum

    record = get_family(family)
    model = model or {"vocab_size": 64, "out_dim": 8}
    config = record.make_model_config({"family": family, "size": "tiny", **model})
    state = {f"model.{k}": v for k, v in record.make_model(config).state_dict().items()}
    checkpoint = {"state_dict": state, "hyper_parameters": {"family": family, "model": dataclasses.asdict(config)}}
    if edit is not None:
        edit(checkpoint)
    checkpoint[CHECKSUM_KEY] = {"algorithm": CHECKSUM_ALGORITHM, "digest": content_checksum(checkpoint)}
    torch.save(checkpoint, path)
    return path


def _wrong_shape(checkpoint):
    name = next(k for k, v in checkpoint["state_dict"].items() if v.dim() == 2)
    checkpoint["state_dict"][name] = torch.zeros(3, 5)


def _huge(checkpoint):
    checkpoint["hyper_parameters"]["model"]["vocab_size"] = 10**12  # 64 TB of embedding, were it built


@pytest.mark.parametrize(("edit", "message"), [
    (_wrong_shape, "has shape (3, 5), the model its hyperparameters describe needs"),
    (_huge, "the model its hyperparameters describe needs (1000000000000,"),
    (lambda c: c["hyper_parameters"].pop("model"), "holds no model hyperparameters"),
], ids=["wrong-shape", "huge-dimension", "no-hyperparameters"])
def test_a_damaged_or_handmade_checkpoint_is_one_line_for_the_export(tmp_path, capsys, monkeypatch, edit, message):
    from sweeplab.export.__main__ import main

    ckpt = _handmade_checkpoint(tmp_path / "model.ckpt", edit=edit)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["sweeplab.export", f"ckpt_path={ckpt}", f"out={tmp_path / 'out'}"])
    with pytest.raises(SystemExit) as info:
        main()
    assert info.value.code == 2
    _one_line(capsys.readouterr().err, f"checkpoint {ckpt}", message)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_two_sources_of_the_checkpoint_are_refused_and_no_run_is_tagged(mlflow_uri, tmp_path, capsys, monkeypatch):
    from sweeplab.export.__main__ import main

    client = MlflowClient(mlflow_uri)
    run = client.create_run(mlflow_store.init_store(mlflow_uri, "other")).info.run_id
    client.set_terminated(run)
    ckpt = _handmade_checkpoint(tmp_path / "model.ckpt")
    monkeypatch.setattr(sys, "argv", ["sweeplab.export", f"ckpt_path={ckpt}", f"run_id={run}", f"out={tmp_path / 'out'}"])
    with pytest.raises(SystemExit) as info:
        main()
    assert info.value.code == 2
    _one_line(capsys.readouterr().err, f"ckpt_path={ckpt} and run_id={run} name two checkpoints", "give one")
    assert not [k for k in client.get_run(run).data.tags if not k.startswith("mlflow.")]


# --- the round trip ------------------------------------------------------------------------------------------------


def _roundtrip(capsys, *args) -> tuple[int, str]:
    from sweeplab.families.textbridge_decoder.roundtrip import main

    with pytest.raises(SystemExit) as info:
        main(list(args))
    return info.value.code, capsys.readouterr().err


@pytest.mark.parametrize(("args", "message"), [
    (["--limit", "0"], "--limit must be at least 1"),
    (["--out", "{tmp}/missing/out.json"], "the folder {tmp}/missing does not exist"),
    (["--out", "{tmp}"], "is a folder"),
], ids=["limit-0", "missing-folder", "out-is-a-folder"])
def test_the_round_trips_bad_arguments_are_one_line_before_anything_loads(tmp_path, capsys, args, message):
    args = [a.format(tmp=tmp_path) for a in args]
    code, err = _roundtrip(capsys, "--encoder", str(tmp_path / "none.ckpt"), "--decoder", str(tmp_path / "none.ckpt"),
                           *args)
    assert code == 2
    _one_line(err, message.format(tmp=tmp_path))


def test_the_round_trip_on_data_the_checkpoints_were_not_trained_on_is_one_line(demo_dir, tmp_path, capsys):
    def decoder_edit(checkpoint):  # a decoder of 8-d cubes; the demo data holds 64-d embeddings
        record = get_family("textbridge_decoder")
        config = record.make_model_config({"family": "textbridge_decoder", "size": "tiny", "vocab_size": 64,
                                            "embed_dim": 8, "bos_id": 1, "eos_id": 2})
        checkpoint["state_dict"] = {f"model.{k}": v for k, v in record.make_model(config).state_dict().items()}
        checkpoint["hyper_parameters"] = {"family": "textbridge_decoder", "model": dataclasses.asdict(config)}

    encoder = _handmade_checkpoint(tmp_path / "encoder.ckpt")
    decoder = _handmade_checkpoint(tmp_path / "decoder.ckpt", edit=decoder_edit)
    code, err = _roundtrip(capsys, "--encoder", str(encoder), "--decoder", str(decoder), "--data", str(demo_dir),
                           "--out", str(tmp_path / "out.json"))
    assert code == 2
    _one_line(err, f"--data {demo_dir}", "64-d teacher embeddings, the decoder reads 8-d")
    assert not (tmp_path / "out.json").exists()


DEMO_DECODER = {"vocab_size": 500, "embed_dim": 64, "max_len": 64, "bos_id": 1, "eos_id": 2}  # conftest's demo_dir


def test_a_decoder_checkpoint_with_a_huge_n_prefix_is_one_line_for_the_round_trip(demo_dir, tmp_path, capsys):
    def huge(checkpoint):
        checkpoint["hyper_parameters"]["model"]["n_prefix"] = 10**9

    encoder = _handmade_checkpoint(tmp_path / "encoder.ckpt", vocab_size=500, out_dim=64, max_len=64)
    decoder = _handmade_checkpoint(tmp_path / "decoder.ckpt", "textbridge_decoder", huge, **DEMO_DECODER)
    code, err = _roundtrip(capsys, "--encoder", str(encoder), "--decoder", str(decoder), "--data", str(demo_dir))
    assert code == 2
    _one_line(err, f"checkpoint {decoder}", "the model its hyperparameters describe needs")


def test_sigint_during_the_round_trip_is_one_line_exit_130_and_writes_no_output(demo_dir, tmp_path):
    encoder = _handmade_checkpoint(tmp_path / "encoder.ckpt", vocab_size=500, out_dim=64, max_len=64)
    decoder = _handmade_checkpoint(tmp_path / "decoder.ckpt", "textbridge_decoder", **DEMO_DECODER)
    started = time.monotonic()
    ended = _interrupt_after([PY, "-m", "sweeplab.families.textbridge_decoder.roundtrip", "--encoder", str(encoder),
                              "--decoder", str(decoder), "--data", str(demo_dir), "--split", "all", "--teacher", "none",
                              "--out", str(tmp_path / "out.json")], lambda: time.monotonic() - started > 1.0, tmp_path)
    assert ended.returncode == 130, ended.stderr[-3000:]
    _one_line(ended.stderr, "interrupted by SIGINT")
    assert not (tmp_path / "out.json").exists() and not list(tmp_path.glob(".*.tmp"))


# --- SIGINT in the entry points without a run ----------------------------------------------------------------------


def _interrupt_after(command: list[str], cue, cwd: Path, timeout_s: float = 240.0) -> subprocess.CompletedProcess:
    """Start `command`, send SIGINT once `cue()` holds (or after the timeout), return how it ended."""
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None and not cue():
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    return subprocess.CompletedProcess(command, process.returncode, out, err)


@pytest.mark.parametrize(("corpus", "after_s"), [
    ("reference", 1.0),  # while torch and the rest are imported (a library there swallows KeyboardInterrupt)
    ("stdlib", 5.0),  # while its ten times larger corpus is tokenised and embedded (the reference one can be done)
])
def test_sigint_during_prepare_is_one_line_exit_130_and_leaves_no_half_written_file(tmp_path, corpus, after_s):
    out = tmp_path / "demo"
    started = time.monotonic()
    ended = _interrupt_after([PY, "-m", "sweeplab.families.textbridge.prepare", "--out", str(out), "--corpus", corpus,
                              "--teacher", "random", "--teacher-layers", "1", "--no-progress"],
                             lambda: time.monotonic() - started > after_s, tmp_path)
    assert ended.returncode == 130, ended.stderr[-3000:]
    _one_line(ended.stderr, "prepare: interrupted by SIGINT")
    assert not list(tmp_path.rglob("*.tmp")) and not (out / "manifest.json").exists()


def test_sigint_in_the_first_seconds_of_the_report_is_one_line_exit_130(tmp_path):
    started = time.monotonic()
    (tmp_path / "mlflow.db").write_bytes(b"")  # an empty store: the report has something to open
    ended = _interrupt_after([PY, "-m", "sweeplab.report", "--experiment", "x"],
                             lambda: time.monotonic() - started > 0.5, tmp_path)  # its imports take longer
    assert ended.returncode == 130, ended.stderr[-3000:]
    _one_line(ended.stderr, "report: interrupted by SIGINT")
