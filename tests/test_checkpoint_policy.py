"""The study's checkpoint policy (docs/study-cost.md): background writes that land whole and in order, a job killed
while one is in flight resumes from the last complete checkpoint; the job's wall breakdown adds up to its wall time;
the jobs of a study share the compiler's caches."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient
from omegaconf import open_dict

from conftest import smoke_config
from sweeplab.callbacks import faults
from sweeplab.core import wall
from sweeplab.core.records import JOB, key_of
from sweeplab.core.wall import PARTS, SETUP_SEGMENTS
from sweeplab.tasks.checkpoint import AtomicCheckpointIO, check_integrity, read_checkpoint


def _checkpoint(step: int, weight: torch.Tensor) -> dict:
    return {"global_step": step, "state_dict": {"w": weight}, "hyper_parameters": {"family": "textbridge"}}


def _wait_for(path: Path, process: subprocess.Popen | None = None, within_s: float = 300.0) -> None:
    deadline = time.monotonic() + within_s  # start-up on a busy machine: generous
    while not path.exists():
        if (process is not None and process.poll() is not None) or time.monotonic() > deadline:
            raise AssertionError(f"{path} never appeared" + (f" (exit {process.poll()})" if process else ""))
        time.sleep(0.05)


def _hold_the_next_write(monkeypatch, tmp_path) -> Path:
    """The next write pauses once its bytes are in the temporary file (faults.pause_in's `checkpoint-written`
    stage) until the returned file is removed: a write held in flight."""
    monkeypatch.setattr(faults, "_paused_in", set())  # the hook pauses once per process; this test's own once
    monkeypatch.setattr(faults, "_stage_runs", {})
    paused = tmp_path / "paused"
    monkeypatch.setenv("SWEEPLAB_FAULT_PAUSE_IN", "checkpoint-written")
    monkeypatch.setenv("SWEEPLAB_FAULT_PAUSE_S", "60")
    monkeypatch.setenv("SWEEPLAB_FAULT_PAUSED_FILE", str(paused))
    return paused


def test_a_background_write_is_a_snapshot_that_lands_whole_and_in_order(tmp_path, monkeypatch):
    io = AtomicCheckpointIO(background=True)
    path, old_best = tmp_path / "last.ckpt", tmp_path / "best-step1.ckpt"
    old_best.write_bytes(b"the previous best")
    weight = torch.zeros(1000)
    io.save_checkpoint(_checkpoint(1, weight.clone()), path)
    io.wait()
    assert read_checkpoint(path)["global_step"] == 1

    paused = _hold_the_next_write(monkeypatch, tmp_path)
    io.save_checkpoint(_checkpoint(2, weight), path)
    io.remove_checkpoint(old_best)  # queued behind the write, as Lightning asks after saving the new best
    weight += 7.0  # the next optimizer step changes the weights in place: the write holds the snapshot
    _wait_for(paused)
    assert read_checkpoint(path)["global_step"] == 1  # in flight: the file is still the previous, whole checkpoint
    assert list(tmp_path.glob(".last.ckpt.*.tmp")) and old_best.exists()
    paused.unlink()
    io.wait()
    saved = read_checkpoint(path)
    assert saved["global_step"] == 2 and torch.equal(saved["state_dict"]["w"], torch.zeros(1000))
    assert not old_best.exists() and not list(tmp_path.glob(".*.tmp"))
    io.teardown()


def test_a_failed_background_write_is_raised_on_the_training_thread(tmp_path):
    io = AtomicCheckpointIO(background=True)
    (tmp_path / "a-file").write_text("not a folder")
    io.save_checkpoint(_checkpoint(1, torch.zeros(3)), tmp_path / "a-file" / "last.ckpt")
    with pytest.raises(OSError):
        io.teardown()  # Lightning's end of fit (also after an exception): the writer's error is the job's


def test_a_snapshot_checksum_matches_the_file(tmp_path):
    io = AtomicCheckpointIO(background=True)
    io.save_checkpoint(_checkpoint(3, torch.arange(10.0)), tmp_path / "x.ckpt")
    io.teardown()
    loaded = torch.load(tmp_path / "x.ckpt", weights_only=True)
    check_integrity(loaded, tmp_path / "x.ckpt")


def test_the_optimizer_state_is_dropped_at_the_end_of_training_after_the_last_checkpoint_took_it(tmp_path):
    """The task drops the optimizer's state and the gradients when training ends (Lightning's teardown would copy
    them to the CPU); the last.ckpt written at that end (a stop before max_steps: Lightning's on_train_end save)
    still holds the state a resume needs."""
    import lightning as L
    from torch.utils.data import DataLoader

    from sweeplab.callbacks.checkpoints import LastCheckpoint
    from sweeplab.families import get_family
    from sweeplab.models.gpt import GPTConfig
    from sweeplab.policies.checkpoints import CheckpointPolicy
    from sweeplab.tasks.optim import OptimConfig

    class StopAtStep3(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            trainer.should_stop = trainer.global_step >= 3

    g = torch.Generator().manual_seed(0)
    batches = [{"input_ids": (ids := torch.randint(0, 64, (2, 16), generator=g)), "labels": ids.roll(-1, 1)}
               for _ in range(10)]
    config = GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, d_model=16, d_ff=32)
    task = get_family("pagating_lm").make_task(config, {}, OptimConfig(lr=1e-3, warmup_steps=1))
    trainer = L.Trainer(
        accelerator="cpu", max_steps=10, logger=False, enable_progress_bar=False, enable_model_summary=False,
        limit_val_batches=0, default_root_dir=str(tmp_path), plugins=[AtomicCheckpointIO(background=True)],
        callbacks=[LastCheckpoint(tmp_path, CheckpointPolicy()), StopAtStep3()],
    )
    trainer.fit(task, train_dataloaders=DataLoader(batches, batch_size=None))
    assert trainer.global_step == 3
    assert trainer.optimizers[0].state == {} and all(p.grad is None for p in task.parameters())
    saved = read_checkpoint(tmp_path / "last.ckpt")
    assert saved["global_step"] == 3
    state = saved["optimizer_states"][0]["state"]
    assert len(state) == len(list(task.parameters())) and all("exp_avg" in s for s in state.values())


def _train(args, env=None, **kwargs):
    return subprocess.Popen(
        [sys.executable, "-m", "sweeplab.train", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **(env or {})}, **kwargs,
    )


@pytest.mark.slow  # two real jobs in processes (~1 min on the 2-core machine)
def test_a_job_killed_while_a_background_write_is_in_flight_resumes_from_the_last_complete_checkpoint(
    demo_dir, mlflow_uri, tmp_path
):
    # writes, in order: last.ckpt at 5, best at 10, last.ckpt at 10 (the third: held in flight), last.ckpt at 15
    # (waits for the third: one write in flight)
    common = [
        "debug=smoke", f"data.path={demo_dir}", "model.out_dim=64", "data.batch_size=16", "trainer.max_steps=30",
        "trainer.val_check_interval=10", "trainer.log_every_n_steps=1", "checkpoint.every_n_steps=5",
        "checkpoint.every_n_seconds=null", "checkpoint.background=true",
    ]
    paused = tmp_path / "paused"
    job = _train([*common, f"hydra.run.dir={tmp_path / 'run'}"],
                 env={"SWEEPLAB_FAULT_PAUSE_IN": "checkpoint-written@3", "SWEEPLAB_FAULT_PAUSE_S": "600",
                      "SWEEPLAB_FAULT_PAUSED_FILE": str(paused)})
    _wait_for(paused, job)
    checkpoints = tmp_path / "run" / "checkpoints"
    in_flight = list(checkpoints.glob(".last.ckpt.*.tmp"))
    assert in_flight and in_flight[0].stat().st_size > 0  # the bytes are written, the rename not done
    job.send_signal(signal.SIGKILL)
    job.communicate(timeout=60)
    assert job.returncode == -signal.SIGKILL

    complete = read_checkpoint(checkpoints / "last.ckpt")  # whole: its checksum holds
    assert complete["global_step"] == 5
    resumed = _train([*common, "resume=true", f"hydra.run.dir={tmp_path / 'other'}"])
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err[-3000:]
    assert f"from {checkpoints / 'last.ckpt'} (step 5)" in err + out
    client = MlflowClient(mlflow_uri)
    (run,) = client.search_runs(["1"])
    assert run.info.status == "FINISHED"
    steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "train/loss"))
    assert steps == list(range(30))  # every step once
    assert read_checkpoint(checkpoints / "last.ckpt")["global_step"] == 30
    assert not list(checkpoints.glob(".*.tmp"))  # the killed write's leftover went when the resumed job started


def test_the_wall_breakdown_adds_up_to_the_jobs_wall_time(demo_dir, mlflow_uri, tmp_path):
    from sweeplab.engine.training import train

    cfg = smoke_config(demo_dir, "trainer.max_steps=10", "trainer.val_check_interval=5", "checkpoint.every_n_steps=5")
    with open_dict(cfg):
        cfg.logger.system_metrics_after_s = None
    started = time.time()
    train(cfg, output_dir=tmp_path / "job")
    (run,) = MlflowClient(mlflow_uri).search_runs(["1"])
    # the job's wall time up to the moment its run was ended (MLflow's end time): ending the run, a sqlite write that
    # takes a second on a loaded host, comes after the record by design and is left out of both
    wall_s = run.info.end_time / 1000 - started
    parts = {part: run.data.metrics[key_of(JOB.wall_breakdown, part)] for part in PARTS}
    assert all(seconds >= 0 for seconds in parts.values()), parts
    assert parts["steps"] > 0 and parts["setup"] > 0 and parts["validation"] > 0 and parts["checkpoints"] > 0, parts
    # the parts are charged up to the record; ending the run after it is the only time outside them
    assert abs(sum(parts.values()) - wall_s) <= 0.05 * wall_s, (parts, wall_s)
    # the set-up in segments, one per mark and the rest to the first batch, adding up to the set-up part
    split = {label: run.data.metrics[key_of(JOB.setup_split, label)] for label in SETUP_SEGMENTS}
    assert all(seconds >= 0 for seconds in split.values()), split
    assert abs(sum(split.values()) - parts["setup"]) <= max(1e-6 * parts["setup"], 1e-3), (split, parts["setup"])


def _frozen_time(monkeypatch) -> list[float]:
    """The clock's time is the returned list's one value: moved by hand, so durations are exact."""
    now = [100.0]
    monkeypatch.setattr(wall.time, "perf_counter", lambda: now[0])
    return now


def test_the_setup_split_adds_up_to_the_setup_part_without_the_mlflow_writes_in_it(monkeypatch, caplog):
    from console_formats import MESSAGES

    now = _frozen_time(monkeypatch)
    clock = wall.WallClock(started=90.0)  # the process started 10 s before the job: interpreter and imports
    clock.mark("process_start")
    now[0] += 1.0
    clock.mark("plan")
    now[0] += 2.0
    with clock.within("mlflow"):  # an MLflow write in the set-up: in the mlflow part, in no segment
        now[0] += 5.0
        clock.mark("inside_mlflow")  # not the set-up part: ignored
    now[0] += 3.0
    clock.mark("data")
    now[0] += 4.0
    with caplog.at_level("INFO", logger="sweeplab.core.wall"):
        clock.end_setup("warmup")
    now[0] += 7.0
    clock.mark("after_setup")  # ignored: the set-up is over
    split = clock.setup_split()
    assert split == {"process_start": 10.0, "plan": 1.0, "data": 5.0, "fit_start": 4.0}
    totals = clock.totals()
    assert totals["setup"] == sum(split.values()) == 20.0
    assert (totals["mlflow"], totals["warmup"]) == (5.0, 7.0)
    (line,) = [r.getMessage() for r in caplog.records if r.name == "sweeplab.core.wall"]
    assert line == "set-up 20.0 s: process_start 10.0, plan 1.0, data 5.0, fit_start 4.0 (MLflow 5.0 s besides)"
    assert any(re.fullmatch(f, line) for f in MESSAGES["sweeplab.core.wall"])  # a line the console tests accept


def test_a_later_jobs_setup_starts_at_the_job_and_wall_mark_marks_its_clock(monkeypatch):
    now = _frozen_time(monkeypatch)
    clock = wall.start_job()  # not counted from the process's start (tests): process_start is 0
    now[0] += 2.5
    wall.mark("plan")
    now[0] += 0.5
    assert clock.setup_split() == {"process_start": 0.0, "plan": 2.5, "fit_start": 0.5}
    clock.switch("teardown")  # a job that never trained a batch: the rest of its set-up still has a name
    now[0] += 1.0
    assert clock.setup_split() == {"process_start": 0.0, "plan": 2.5, "fit_start": 0.5}


@pytest.mark.slow  # one cold compilation of the smoke model (~1 min on the 2-core machine)
def test_the_second_job_of_a_study_loads_its_compiled_code_from_the_studys_cache(demo_dir, mlflow_uri, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    sweep = _train(["-m", "debug=smoke", f"data.path={demo_dir}", "model.out_dim=64", "data.batch_size=16",
                    "compile=default", "trainer.max_steps=6", "trainer.val_check_interval=3",
                    "+label=a,b",  # two configurations of one graph, same seed: the same shapes in the same order
                    f"hydra.sweep.dir={tmp_path / 'sweep'}"], env=env)
    out, err = sweep.communicate(timeout=900)
    assert sweep.returncode == 0, err[-3000:]
    assert any((tmp_path / "sweep" / "compile_cache").rglob("*")), "the study's cache folder is empty"
    runs = [r for r in MlflowClient(mlflow_uri).search_runs(["1"], order_by=["attributes.start_time ASC"])
            if "config" in r.data.tags]
    first, second = (r.data.metrics for r in runs)
    hit, miss = key_of(JOB.compile_cache, "fxgraph_cache_hit"), key_of(JOB.compile_cache, "fxgraph_cache_miss")
    assert second[hit] > 0 and second[miss] == 0, second  # the second compiled nothing: every graph from the cache
    assert first[miss] > 0 or first[hit] > 0, first


@pytest.mark.slow  # two cold compilations of the smoke model (~1 min on the 2-core machine)
def test_compile_cache_shared_lets_a_later_study_load_what_an_earlier_one_compiled(demo_dir, mlflow_uri, tmp_path):
    """compile_cache=shared leaves inductor's caches in torch's own folder (its default, under TMPDIR: here the
    test's): the second study's job compiles nothing; compile_cache=study gives a study its own empty cache."""
    (tmp_path / "tmp").mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "SWEEPLAB_FAULT")}
    env["TMPDIR"] = str(tmp_path / "tmp")  # torch's default folder: <TMPDIR>/torchinductor_<user>
    common = ["debug=smoke", f"data.path={demo_dir}", "model.out_dim=64", "data.batch_size=16", "compile=default",
              "trainer.max_steps=6", "trainer.val_check_interval=3"]
    for name, cache in (("first", "shared"), ("second", "shared"), ("own", "study")):
        # not _train: its environment is this process's plus changes, and torch's import here set the variable
        study = subprocess.run([sys.executable, "-m", "sweeplab.train", "-m", *common, f"compile_cache={cache}",
                                f"hydra.sweep.dir={tmp_path / name}"], env=env, capture_output=True, text=True,
                               timeout=900)
        assert study.returncode == 0, study.stderr[-3000:]
    assert not (tmp_path / "first" / "compile_cache").exists()
    assert any(p.name.startswith("torchinductor_") for p in (tmp_path / "tmp").iterdir())
    runs = [r for r in MlflowClient(mlflow_uri).search_runs(["1"], order_by=["attributes.start_time ASC"])
            if "config" in r.data.tags]
    first, second, own = (r.data.metrics for r in runs)
    hit, miss = key_of(JOB.compile_cache, "fxgraph_cache_hit"), key_of(JOB.compile_cache, "fxgraph_cache_miss")
    assert first[miss] > 0, first  # a fresh folder: compiled
    assert second[hit] > 0 and second[miss] == 0, second  # another study, the same graph: loaded
    assert own[miss] > 0, own  # compile_cache=study: its own empty folder under the sweep
    assert any((tmp_path / "own" / "compile_cache").rglob("*"))


def test_compile_cache_is_study_or_shared_and_says_so_in_one_line(tmp_path, monkeypatch):
    from conftest import compose_train
    from sweeplab.core.errors import ConfigError
    from sweeplab.engine.plan import plan
    from sweeplab.engine.training import COMPILE_CACHE_DIR_ENV, share_compile_cache

    with pytest.raises(ConfigError) as err:
        plan(compose_train(["debug=smoke", "compile_cache=host"]))
    assert str(err.value) == "config error: compile_cache: 'host' is not one of study, shared"
    assert plan(compose_train(["debug=smoke", "compile=default", "compile_cache=shared"])).compile_cache == "shared"
    monkeypatch.delenv(COMPILE_CACHE_DIR_ENV, raising=False)
    share_compile_cache(str(tmp_path), "shared")
    assert COMPILE_CACHE_DIR_ENV not in os.environ  # torch's own folder
    share_compile_cache(str(tmp_path), "study")
    assert os.environ[COMPILE_CACHE_DIR_ENV] == str(tmp_path.resolve() / "compile_cache")
