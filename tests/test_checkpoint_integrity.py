"""A damaged checkpoint never damages a finished run: checksums written at save time and checked at every load,
non-finite weights refused, a finished run extended only into a new run, and two resumes of one run on one lock.

Fast (default suite): the checksum and the refusals on hand-made checkpoints; one finished TextBridge run per
module, then damaged copies of its checkpoint (a flipped bit, a NaN tensor, a truncated file, a text file) given
to resume, export and report, in process; the run reads the same through MlflowClient afterwards.
Slow: the same through the command line (one `error:` line, exit 2) on the example family, an extension that
fails while it trains, and two `resume=PATH` of one unfinished run started together.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from mlflow.tracking import MlflowClient

from conftest import smoke_config
from sweeplab.core.errors import UserError
from sweeplab.tasks.checkpoint import (
    CHECKSUM_ALGORITHM,
    CHECKSUM_KEY,
    LINEAR_ALGORITHM,
    AtomicCheckpointIO,
    content_checksum,
    read_checkpoint,
    with_checksum,
)

DAMAGED = "damaged: its content does not match the checksum written when it was saved"
NONFINITE = "holds non-finite weights"
UNREADABLE = "not a readable PyTorch checkpoint"
EXPECTED = {"bitflip": DAMAGED, "nan": NONFINITE, "truncated": UNREADABLE, "text": UNREADABLE}


# --- damaging a checkpoint -----------------------------------------------------------------------
def _tensor_offsets(path: Path) -> list[tuple[int, int]]:
    """(offset, size) of each stored tensor's bytes in the checkpoint's zip (torch stores them uncompressed)."""
    found = []
    with zipfile.ZipFile(path) as archive, path.open("rb") as f:
        for info in archive.infolist():
            if "/data/" in info.filename and info.file_size >= 8:
                f.seek(info.header_offset + 26)
                name_len, extra_len = struct.unpack("<HH", f.read(4))
                found.append((info.header_offset + 30 + name_len + extra_len, info.file_size))
    return found


def damage(source: Path, kind: str, target: Path) -> Path:
    raw = bytearray(source.read_bytes())
    if kind == "bitflip":  # one bit in the middle of the largest tensor: the file still loads
        offset, size = max(_tensor_offsets(source), key=lambda item: item[1])
        raw[offset + size // 2] ^= 0x10
        target.write_bytes(bytes(raw))
    elif kind == "nan":  # what a run that diverged saves: a valid checksum over NaN weights
        checkpoint = torch.load(source, weights_only=True)
        name = next(k for k, v in checkpoint["state_dict"].items() if v.is_floating_point())
        checkpoint["state_dict"][name].view(-1)[0] = float("nan")
        torch.save(with_checksum(checkpoint), target)
    elif kind == "truncated":
        target.write_bytes(bytes(raw[: len(raw) // 2]))
    else:
        target.write_text("these are not the weights you are looking for\n")
    return target


def snapshot(client: MlflowClient, run_id: str) -> dict:
    """Everything MlflowClient reads of a run: status, times, tags, params, every metric's whole history,
    artifacts (recursively)."""
    run = client.get_run(run_id)

    def artifacts(path=None):
        listed = []
        for item in client.list_artifacts(run_id, path):
            listed += artifacts(item.path) if item.is_dir else [(item.path, item.file_size)]
        return listed

    return {
        "status": run.info.status, "start": run.info.start_time, "end": run.info.end_time,
        "tags": dict(run.data.tags), "params": dict(run.data.params),
        "metrics": {k: [(m.step, m.value, m.timestamp) for m in client.get_metric_history(run_id, k)]
                    for k in sorted(run.data.metrics)},
        "artifacts": sorted(artifacts()),
    }


def folder_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# --- the checksum on hand-made checkpoints (no training) -----------------------------------------
def _sweeplab_like() -> dict:
    return {
        "state_dict": {"model.w": torch.randn(64, 8), "model.b": torch.zeros(8, dtype=torch.bfloat16)},
        "optimizer_states": [{"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.zeros(64, 8)}},
                              "param_groups": [{"lr": 3e-4, "betas": (0.9, 0.999), "params": [0, 1]}]}],
        "callbacks": {"ModelCheckpoint{}": {"kth_value": torch.tensor(float("-inf")), "best_model_path": ""}},
        "hyper_parameters": {"family": "textbridge", "model": {"d_model": 8}},
        "global_step": 3,
    }


def test_a_saved_checkpoint_carries_a_checksum_of_its_content_and_every_damage_is_refused(tmp_path, caplog):
    good = tmp_path / "good.ckpt"
    original = _sweeplab_like()
    AtomicCheckpointIO().save_checkpoint(original, good)
    assert CHECKSUM_KEY not in original  # the caller's dict is left alone
    loaded = read_checkpoint(good)  # a -inf in a callback's state is no weight: accepted
    assert loaded[CHECKSUM_KEY]["algorithm"] == CHECKSUM_ALGORITHM and loaded["global_step"] == 3

    for kind, message in EXPECTED.items():
        with pytest.raises(UserError, match=message) as refused:
            read_checkpoint(damage(good, kind, tmp_path / f"{kind}.ckpt"))
        assert "\n" not in str(refused.value)

    stale = torch.load(good, weights_only=True)  # NaN written into a checkpoint, its checksum kept
    stale["state_dict"]["model.w"][0, 0] = float("nan")
    torch.save(stale, tmp_path / "stale.ckpt")
    with pytest.raises(UserError, match=DAMAGED):
        read_checkpoint(tmp_path / "stale.ckpt")
    edited = torch.load(good, weights_only=True)  # a plain value edited: the step
    edited["global_step"] = 4
    torch.save(edited, tmp_path / "edited.ckpt")
    with pytest.raises(UserError, match=DAMAGED):
        read_checkpoint(tmp_path / "edited.ckpt")

    older = _sweeplab_like()  # written before checksums: accepted, with a warning naming it
    torch.save(older, tmp_path / "older.ckpt")
    with caplog.at_level(logging.WARNING, logger="sweeplab.tasks.checkpoint"):
        assert read_checkpoint(tmp_path / "older.ckpt")["global_step"] == 3
    assert f"checkpoint {tmp_path / 'older.ckpt'} carries no checksum" in caplog.text
    older["optimizer_states"][0]["state"][0]["exp_avg"][1, 1] = float("inf")  # ... but not with non-finite weights
    torch.save(older, tmp_path / "older-inf.ckpt")
    with pytest.raises(UserError, match=r"holds non-finite weights \(optimizer_states\[0\]\.state\.0\.exp_avg: 1 NaN/inf\)"):
        read_checkpoint(tmp_path / "older-inf.ckpt")


# the digest sweeplab wrote for this content before it hashed per tensor (the one-stream sha256 of 169ed9b)
LEGACY_DIGEST = "e274820f4d49a0cba5b7d9baccba3205160d2f2b34fe0294fd0a302537072e3c"


def test_checkpoints_of_the_one_stream_sha256_are_still_read_and_checked(tmp_path):
    """Checkpoints written before the per-tensor checksum carry `sha256` over every byte in one stream (the digest
    the earlier code wrote for this content, a quantized tensor included): still accepted when whole, refused when a
    byte changed."""
    legacy = {
        "state_dict": {"model.w": torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7,
                       "model.q": torch.quantize_per_tensor(torch.linspace(-1, 1, 6), 0.05, 0, torch.qint8)},
        "optimizer_states": [{"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.full((3, 4), 0.25)}},
                              "param_groups": [{"lr": 3e-4, "betas": (0.9, 0.999), "params": [0]}]}],
        "hyper_parameters": {"family": "textbridge", "model": {"d_model": 8}}, "global_step": 3,
    }
    assert content_checksum(legacy, LINEAR_ALGORITHM) == LEGACY_DIGEST
    assert content_checksum(legacy) != LEGACY_DIGEST  # two algorithms, two digests
    legacy[CHECKSUM_KEY] = {"algorithm": LINEAR_ALGORITHM, "digest": LEGACY_DIGEST}
    torch.save(legacy, tmp_path / "legacy.ckpt")
    assert read_checkpoint(tmp_path / "legacy.ckpt")["global_step"] == 3
    legacy["state_dict"]["model.w"][1, 0] += 1.0
    torch.save(legacy, tmp_path / "legacy-edited.ckpt")
    with pytest.raises(UserError, match=DAMAGED):
        read_checkpoint(tmp_path / "legacy-edited.ckpt")


def test_the_per_tensor_checksum_is_the_same_on_one_thread_and_on_several(monkeypatch):
    """The tensors are hashed on up to 8 threads (one core left free): the digest does not depend on how many, and
    any changed element, moved tensor or changed dtype changes it."""
    from sweeplab.tasks import checkpoint

    state = {f"layer{i}": torch.randn(64, 33) for i in range(12)}
    digests = {}
    for cores in (1, 2, 5, 32):
        monkeypatch.setattr(checkpoint, "host_cpus", lambda cores=cores: cores)
        digests[cores] = content_checksum({"state_dict": state})
    assert len(set(digests.values())) == 1
    swapped = dict(state, layer0=state["layer1"], layer1=state["layer0"])
    retyped = dict(state, layer3=state["layer3"].double())
    changed = {k: v.clone() for k, v in state.items()}
    changed["layer11"][63, 32] += 1e-6
    for other in (swapped, retyped, changed):
        assert content_checksum({"state_dict": other}) != digests[1]


# --- one finished run, and damaged copies of its checkpoint given to resume, export and report -----
BASE = ("trainer.val_check_interval=5", "checkpoint.every_n_steps=5", "trainer.log_every_n_steps=1")


@pytest.fixture(scope="module")
def finished(tmp_path_factory, demo_dir, _empty_mlflow_db):
    """A FINISHED TextBridge run of 10 steps, trained with data.batch_size larger than its training split."""
    from sweeplab.engine.training import train

    home = tmp_path_factory.mktemp("finished")
    shutil.copy(_empty_mlflow_db, home / "mlflow.db")
    uri = f"sqlite:///{home / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        mp.chdir(home)
        train(smoke_config(demo_dir, *BASE, "trainer.max_steps=10", "data.batch_size=4096"))
        client = MlflowClient(uri)
        (run,) = client.search_runs(["1"])
        yield SimpleNamespace(home=home, uri=uri, client=client, run=run, folder=home / "outputs",
                              ckpt=home / "outputs" / "checkpoints" / "last.ckpt")


def test_a_damaged_checkpoint_is_refused_by_resume_export_and_report_and_the_finished_run_is_unchanged(
    finished, demo_dir, tmp_path, monkeypatch, capsys
):
    from sweeplab.engine.training import train
    from sweeplab.export.options import options_from_config
    from sweeplab.export.pipeline import export_checkpoint
    from sweeplab.report import __main__ as report

    monkeypatch.setenv("MLFLOW_TRACKING_URI", finished.uri)
    monkeypatch.chdir(tmp_path)
    before, files = snapshot(finished.client, finished.run.info.run_id), folder_digest(finished.folder)
    for kind, message in EXPECTED.items():
        damaged = damage(finished.ckpt, kind, tmp_path / f"{kind}.ckpt")
        with pytest.raises(UserError, match=message):  # extending the finished run from it
            train(smoke_config(demo_dir, *BASE, "trainer.max_steps=20", "data.batch_size=4096", f"resume={damaged}"))
        with pytest.raises(UserError, match=message):
            export_checkpoint(damaged, options_from_config({"format": "coreml"}), tmp_path / "export")
        assert report.main(["--multirun-dir", str(damaged)]) == 2  # the report reads no checkpoint: a path is no sweep
    best = Path(finished.run.data.tags["checkpoint"])  # a good last.ckpt whose best checkpoint is damaged
    shutil.copy(finished.ckpt, tmp_path / "last.ckpt")
    shutil.copy(best, tmp_path / "best.ckpt")
    try:
        damage(tmp_path / "best.ckpt", "bitflip", best)
        with pytest.raises(UserError, match=f"checkpoint {best}: {DAMAGED}"):  # resume brings it along: checked first
            train(smoke_config(demo_dir, *BASE, "trainer.max_steps=20", "data.batch_size=4096", f"resume={tmp_path / 'last.ckpt'}"))
    finally:
        shutil.copy(tmp_path / "best.ckpt", best)
    assert report.main(["--experiment", "sweeplab", "--out", str(tmp_path / "report")]) == 0
    assert capsys.readouterr().err.count("error: ") == len(EXPECTED)
    assert snapshot(finished.client, finished.run.info.run_id) == before
    assert len(finished.client.search_runs(["1"])) == 1 and folder_digest(finished.folder) == files
    assert not (tmp_path / "export").exists() and not (tmp_path / "outputs").exists()


def test_the_recorded_batch_size_is_the_one_used(finished):
    from sweeplab.study.sweep import sweep_from_runs

    run = finished.run
    used = int(run.data.tags["data.batch_size_used"])  # the whole training split: fewer than 4096 samples
    assert 0 < used < 4096 and run.data.params["data.batch_size"] == "4096"  # the param keeps what was given
    (job,) = sweep_from_runs(None, [run]).jobs
    assert job.batch_size == str(used) and job.samples_per_step == used  # what the report and verdict use
    assert float(run.data.metrics["summary/samples_per_sec"]) > 0


def test_two_resumes_by_path_of_one_unfinished_run_take_the_same_lock(finished, demo_dir, tmp_path, monkeypatch):
    """The run's recorded folder is locked (where its trainer holds its lock), not only each job's own folder."""
    from sweeplab.engine import training
    from sweeplab.engine.job import Job
    from sweeplab.engine.plan import plan

    shutil.copy(finished.home / "mlflow.db", tmp_path / "mlflow.db")  # a store where the run was killed
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(uri).set_terminated(finished.run.info.run_id, "KILLED")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    cfg = smoke_config(demo_dir, *BASE, "trainer.max_steps=20", "data.batch_size=4096", f"resume={finished.ckpt}")
    p = plan(cfg)
    jobs, targets = [], []
    for name in ("first", "second"):
        target = training._resume_target(p, cfg, uri, tmp_path / name, tracked=True)
        assert target.run_id == finished.run.info.run_id and target.output_dir == tmp_path / name
        targets.append(target)
        jobs.append(Job(p, target.output_dir, resume_ckpt=target.checkpoint))
    with training._one_process(jobs[0], targets[0], uri):
        with pytest.raises(UserError, match=rf"run {finished.run.info.run_id} \({finished.folder}\) is being trained "
                                            rf"by another process \(pid {os.getpid()} on "):
            with training._one_process(jobs[1], targets[1], uri):
                pass
    MlflowClient(uri).set_terminated(finished.run.info.run_id, "FINISHED")  # finished by the other one meanwhile
    with pytest.raises(UserError, match="was finished or taken over by another process meanwhile"):
        with training._one_process(jobs[1], targets[1], uri):
            pass


# --- through the command line, on the example family (slow) ---------------------------------------
def _cli(site: Path, cwd: Path, uri: str, module: str, *args: str, env: dict | None = None, **popen):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
           "MLFLOW_TRACKING_URI": uri, **(env or {})}
    command = [sys.executable, "-m", module, *args]
    if popen:
        return subprocess.Popen(command, cwd=cwd, env=env, text=True, **popen)
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


# checkpoint.keep_last: these tests damage and resume the finished run's last.ckpt, which a finished job drops otherwise
EXAMPLE = ("model=mlp_regressor", "trainer.val_check_interval=10", "checkpoint.every_n_steps=10",
           "trainer.log_every_n_steps=5", "trainer.enable_progress_bar=false", "optim.warmup_steps=1",
           "checkpoint.keep_last=true")


@pytest.fixture(scope="module")
def finished_example(example_site, tmp_path_factory, _empty_mlflow_db):
    home = tmp_path_factory.mktemp("example-run")
    shutil.copy(_empty_mlflow_db, home / "mlflow.db")
    uri = f"sqlite:///{home / 'mlflow.db'}"
    done = _cli(example_site, home, uri, "sweeplab.train", *EXAMPLE, "trainer.max_steps=20",
                f"hydra.run.dir={home / 'run'}")
    assert done.returncode == 0, done.stderr[-3000:]
    client = MlflowClient(uri)
    (run,) = client.search_runs(["1"])
    return SimpleNamespace(site=example_site, home=home, uri=uri, client=client, run=run, folder=home / "run",
                           ckpt=home / "run" / "checkpoints" / "last.ckpt")


def _one_error_line(done: subprocess.CompletedProcess) -> str:
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(EXPECTED))
def test_a_damaged_checkpoint_given_to_each_entry_point_is_one_line_and_the_finished_run_is_unchanged(
    finished_example, tmp_path, kind
):
    f = finished_example
    before, files = snapshot(f.client, f.run.info.run_id), folder_digest(f.folder)
    damaged = damage(f.ckpt, kind, tmp_path / f"{kind}.ckpt")
    resumed = _cli(f.site, tmp_path, f.uri, "sweeplab.train", *EXAMPLE, "trainer.max_steps=30", f"resume={damaged}",
                   f"hydra.run.dir={tmp_path / 'job'}")
    assert EXPECTED[kind] in _one_error_line(resumed)
    exported = _cli(f.site, tmp_path, f.uri, "sweeplab.export", f"ckpt_path={damaged}", f"out={tmp_path / 'export'}")
    assert EXPECTED[kind] in _one_error_line(exported)
    reported = _cli(f.site, tmp_path, f.uri, "sweeplab.report", "--multirun-dir", str(damaged))
    assert str(damaged) in _one_error_line(reported)
    assert snapshot(f.client, f.run.info.run_id) == before and folder_digest(f.folder) == files
    assert len(f.client.search_runs(["1"])) == 1 and not (tmp_path / "export").exists()


@pytest.mark.slow
def test_an_extension_that_fails_while_it_trains_leaves_the_finished_run_unchanged(finished_example, tmp_path):
    f = finished_example
    before, files = snapshot(f.client, f.run.info.run_id), folder_digest(f.folder)
    failed = _cli(f.site, tmp_path, f.uri, "sweeplab.train", *EXAMPLE, "trainer.max_steps=30", f"resume={f.ckpt}",
                  f"hydra.run.dir={tmp_path / 'job'}", env={"SWEEPLAB_FAULT_RAISE_AT_STEP": "27"})
    assert failed.returncode != 0
    assert snapshot(f.client, f.run.info.run_id) == before and folder_digest(f.folder) == files
    (new,) = [r for r in f.client.search_runs(["1"]) if r.info.run_id != f.run.info.run_id]
    assert new.info.status == "FAILED" and new.data.tags["extends"] == f.run.info.run_id
    assert new.data.params["trainer.max_steps"] == "30"
    steps = sorted(m.step for m in f.client.get_metric_history(new.info.run_id, "train/loss"))
    assert steps and min(steps) >= 20  # the new run holds what it trained, from the checkpoint's step on


@pytest.mark.slow
def test_two_resumes_by_path_of_one_killed_run_started_together_train_it_once(finished_example, tmp_path):
    f = finished_example
    home = tmp_path / "store"
    home.mkdir()
    shutil.copy(f.home / "mlflow.db", home / "mlflow.db")
    uri = f"sqlite:///{home / 'mlflow.db'}"
    MlflowClient(uri).set_terminated(f.run.info.run_id, "KILLED")  # as a kill -9 leaves it, as far as resume cares
    paused = [tmp_path / f"paused-{i}" for i in range(2)]
    resumes = [_cli(f.site, tmp_path, uri, "sweeplab.train", *EXAMPLE, "trainer.max_steps=40", f"resume={f.ckpt}",
                    f"hydra.run.dir={tmp_path / f'r{i}'}", stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    env={"SWEEPLAB_FAULT_PAUSE_AT_STEP": "25", "SWEEPLAB_FAULT_PAUSED_FILE": str(paused[i])})
               for i in range(2)]
    deadline = time.monotonic() + 400
    while not any(p.poll() is not None for p in resumes) and time.monotonic() < deadline:
        time.sleep(0.5)
    (refused,) = [i for i, p in enumerate(resumes) if p.poll() is not None]
    trainer = 1 - refused
    while not paused[trainer].exists() and resumes[trainer].poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    paused[trainer].unlink(missing_ok=True)
    outputs = [p.communicate(timeout=300) for p in resumes]
    assert resumes[trainer].returncode == 0, outputs[trainer][1][-3000:]
    line = _one_error_line(SimpleNamespace(returncode=resumes[refused].returncode, stderr=outputs[refused][1]))
    assert f"run {f.run.info.run_id} ({f.folder}) is being trained by another process (pid {resumes[trainer].pid}" in line
    client = MlflowClient(uri)
    steps = [m.step for m in client.get_metric_history(f.run.info.run_id, "train/loss")]
    assert len(steps) == len(set(steps)) and client.get_run(f.run.info.run_id).info.status == "FINISHED"
