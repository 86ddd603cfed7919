"""kill -9 in the middle of a run, `resume=true`, and the run ends exactly as if nothing had happened."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
from mlflow.tracking import MlflowClient

from conftest import compose_train
from sweeplab.core.records import JobRun
from sweeplab.tracking import mlflow_store
from sweeplab.tracking.run_logger import MetricsStoredAtCheckpoint, ResumingMLFlowLogger, logged_steps


def _train(args, env=None, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "sweeplab.train", *args], capture_output=True, text=True, timeout=300,
        env={**os.environ, **(env or {})}, cwd=cwd,
    )


def _runs(uri, experiment):
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return client, client.search_runs([exp.experiment_id])


# The default demo data (MiniLM teacher: 384-d targets, a 30522-token vocabulary), nothing set by hand that the job
# takes from the data: the resume must compare the checkpoint with the model as the data completes it.
BIT_IDENTICAL = {
    "textbridge": ([], "val/cos"),
    "textbridge_decoder": (["model=textbridge_decoder"], "val/loss"),
    "pagating_lm": (["model=pagating_lm"], "val/ppl"),
}


@pytest.mark.parametrize("family", [
    "textbridge",
    pytest.param("textbridge_decoder", marks=pytest.mark.slow),
    pytest.param("pagating_lm", marks=pytest.mark.slow),
])
def test_killed_run_resumes_bit_identical_in_the_same_mlflow_run(family, minilm_demo_dir, mlflow_uri, tmp_path):
    overrides, monitor = BIT_IDENTICAL[family]
    data = [] if family == "pagating_lm" else [f"data.path={minilm_demo_dir}"]  # the LM's default: the CPython text
    common = [
        "debug=smoke", *overrides, *data, "data.batch_size=16", "trainer.max_steps=12",
        "trainer.val_check_interval=4", "trainer.log_every_n_steps=1", "checkpoint.every_n_steps=3",
    ]
    env = {"SWEEPLAB_DATA_DIR": str(tmp_path / "data")}  # the LM's token cache
    reference = _train([*common, "logger.experiment_name=reference", f"hydra.run.dir={tmp_path / 'a'}"], env=env)
    assert reference.returncode == 0, reference.stderr[-2000:]

    killed = _train([*common, "logger.experiment_name=resumed", f"hydra.run.dir={tmp_path / 'b'}"],
                    env={**env, "SWEEPLAB_FAULT_KILL_AT_STEP": "8"})
    assert killed.returncode == -signal.SIGKILL
    client, (run,) = _runs(mlflow_uri, "resumed")
    assert run.info.status == "RUNNING"  # nothing can mark a run killed by SIGKILL; resuming finishes it
    assert (tmp_path / "b" / "checkpoints" / "last.ckpt").exists()

    resumed = _train([*common, "logger.experiment_name=resumed", "resume=true", f"hydra.run.dir={tmp_path / 'c'}"],
                     env=env)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    client, runs = _runs(mlflow_uri, "resumed")
    assert len(runs) == 1 and runs[0].info.run_id == run.info.run_id and runs[0].info.status == "FINISHED"

    _, (ref_run,) = _runs(mlflow_uri, "reference")
    for key in ("train/loss", "lr", monitor):
        got = [(m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)]
        want = [(m.step, m.value) for m in sorted(client.get_metric_history(ref_run.info.run_id, key), key=lambda m: m.step)]
        assert got and got == want, key  # every step once, none missing, same values

    final = torch.load(tmp_path / "b" / "checkpoints" / "last.ckpt", weights_only=True)
    expected = torch.load(tmp_path / "a" / "checkpoints" / "last.ckpt", weights_only=True)
    assert final["global_step"] == expected["global_step"] == 12
    for name, tensor in expected["state_dict"].items():
        assert torch.equal(final["state_dict"][name], tensor), name


@pytest.mark.slow  # two jobs in child processes on the default data
def test_a_run_stopped_by_sigterm_on_the_default_data_resumes_into_its_run(minilm_demo_dir, mlflow_uri, tmp_path):
    common = ["debug=smoke", f"data.path={minilm_demo_dir}", "data.batch_size=16", "trainer.max_steps=12",
              "trainer.val_check_interval=4", "checkpoint.every_n_steps=3", f"hydra.run.dir={tmp_path / 'run'}"]
    paused = tmp_path / "paused"
    first = subprocess.Popen([sys.executable, "-m", "sweeplab.train", *common], cwd=tmp_path, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             env={**os.environ, "SWEEPLAB_FAULT_PAUSE_AT_STEP": "7",
                                  "SWEEPLAB_FAULT_PAUSED_FILE": str(paused)})
    deadline = time.monotonic() + 300
    while not paused.exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    first.send_signal(signal.SIGTERM)
    output, _ = first.communicate(timeout=240)
    assert first.returncode == 128 + signal.SIGTERM, output[-3000:]
    client, (run,) = _runs(mlflow_uri, "sweeplab")
    assert run.info.status == "KILLED"

    resumed = _train([*common, "resume=true"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    client, (again,) = _runs(mlflow_uri, "sweeplab")
    assert again.info.run_id == run.info.run_id and again.info.status == "FINISHED"
    assert torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 12


def _resume_in_process(*overrides: str) -> float | None:
    """`resume=true` in this process, so the objective `train` hands to a sweeper can be read."""
    from omegaconf import open_dict

    from sweeplab.engine.training import train

    cfg = compose_train([*overrides, "resume=true"])
    with open_dict(cfg):
        cfg.trainer.enable_progress_bar = False
    return train(cfg)


def _best_checkpoint_is_the_best_of_the_whole_run(client, run_id, checkpoints, monitor, mode, objective):
    """The `checkpoint` tag, the only best-*.ckpt on disk and the objective all name the best validation score
    in the run's whole history."""
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, monitor))
    best_value = (max if mode == "max" else min)(value for _, value in history)
    assert sorted(checkpoints.glob("best-*.ckpt")) == [checkpoints / Path(run.data.tags["checkpoint"]).name]
    saved = torch.load(run.data.tags["checkpoint"], weights_only=True)
    (state,) = [v for k, v in saved["callbacks"].items() if k.startswith("ModelCheckpoint{'monitor': '" + monitor)]
    assert float(state["best_model_score"]) == pytest.approx(best_value, rel=1e-6), (history, run.data.tags["checkpoint"])
    assert objective == pytest.approx(best_value, rel=1e-6)
    return history


# A learning rate far too high: the best validation comes early (TextBridge: step 4, LM: step 2) and is never beaten.
# The kill follows that validation, whose step also wrote last.ckpt: the resumed run must still know its score.
BEST_EARLY = {
    "textbridge": (["optim.lr=3.0"], 5, "val/cos", "max"),
    "pagating_lm": (["model=pagating_lm", "optim.lr=2.0"], 3, "val/ppl", "min"),
}


@pytest.mark.slow  # ~12 s a family: a run trained past its best, resumed
@pytest.mark.parametrize("family", ["textbridge", "pagating_lm"])
def test_a_run_resumed_after_its_best_validation_names_that_checkpoint(family, demo_dir, mlflow_uri, tmp_path, monkeypatch):
    monkeypatch.setenv("SWEEPLAB_DATA_DIR", str(tmp_path / "data"))  # the LM's token cache
    overrides, kill_at, monitor, mode = BEST_EARLY[family]
    common = [
        "debug=smoke", *overrides, "trainer.max_steps=10", "trainer.val_check_interval=2", "checkpoint.every_n_steps=2",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    if family == "textbridge":
        common += [f"data.path={demo_dir}", "model.out_dim=64", "data.batch_size=16"]
    killed = _train(common, env={"SWEEPLAB_FAULT_KILL_AT_STEP": str(kill_at)})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]

    objective = _resume_in_process(*[o for o in common if not o.startswith("hydra.")])
    client, (run,) = _runs(mlflow_uri, "sweeplab")
    history = _best_checkpoint_is_the_best_of_the_whole_run(
        client, run.info.run_id, tmp_path / "run" / "checkpoints", monitor, mode, objective
    )
    assert len(history) == 5  # every validation once
    best_step = (max if mode == "max" else min)(history, key=lambda sv: sv[1])[0]
    assert best_step < kill_at - 1 < history[-1][0]  # the premise: the best validation came before the kill


@pytest.mark.parametrize("fault", [
    {"SWEEPLAB_FAULT_KILL_IN_VALIDATION_AT_STEP": "11"},  # the last step's validation
    # every checkpoint written; the summary, tags and export not yet (~11 s)
    pytest.param({"SWEEPLAB_FAULT_KILL_AFTER_FIT": "1"}, marks=pytest.mark.slow),
])
def test_a_run_killed_after_its_last_periodic_checkpoint_resumes_to_the_end(fault, demo_dir, mlflow_uri, tmp_path):
    # 11 steps, validation and last.ckpt every 2: the last step's validation follows the last periodic checkpoint,
    # and with the default learning rate each validation beats the one before (the best file changes every time)
    common = [
        "debug=smoke", f"data.path={demo_dir}", "model.out_dim=64", "data.batch_size=16", "trainer.max_steps=11",
        "trainer.val_check_interval=2", "checkpoint.every_n_steps=2", f"hydra.run.dir={tmp_path / 'run'}",
    ]
    killed = _train(common, env=fault)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]

    objective = _resume_in_process(*common[:-1])
    client, (run,) = _runs(mlflow_uri, "sweeplab")
    history = _best_checkpoint_is_the_best_of_the_whole_run(
        client, run.info.run_id, tmp_path / "run" / "checkpoints", "val/cos", "max", objective
    )
    assert len(history) == 6  # steps 2, 4, ..., 10 and the last one, each once
    assert torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 11
    assert "summary/num_parameters" in run.data.metrics  # the summary was written


@pytest.mark.slow  # the default suite's time budget; `make test-all` runs it
def test_resume_without_an_interrupted_run_or_with_a_bad_checkpoint_fails_clearly(demo_dir, mlflow_uri, tmp_path):
    common = ["debug=smoke", f"data.path={demo_dir}", "model.out_dim=64"]
    nothing = _train([*common, "resume=true"])
    assert nothing.returncode == 2 and "resume=true: no interrupted run" in nothing.stderr
    truncated = tmp_path / "last.ckpt"
    truncated.write_bytes(b"PK\x03\x04 not really a checkpoint")
    bad = _train([*common, f"resume={truncated}"])
    assert bad.returncode == 2 and f"checkpoint {truncated}: not a readable PyTorch checkpoint" in bad.stderr
    missing = _train([*common, f"resume={tmp_path / 'nope.ckpt'}"])
    assert missing.returncode == 2 and "no such file" in missing.stderr
    assert "Traceback" not in bad.stderr + missing.stderr + nothing.stderr
    client = MlflowClient(mlflow_uri)
    exp = client.get_experiment_by_name("sweeplab")
    if exp is not None:
        assert all(r.info.status != "RUNNING" for r in client.search_runs([exp.experiment_id]))


@pytest.mark.slow  # three jobs in child processes (23 s); beside its sibling above
def test_resuming_from_a_weights_only_best_checkpoint_names_the_file_and_the_fix(demo_dir, mlflow_uri, tmp_path):
    """checkpoint.best=weights (the default) writes best files without the optimizer state: resume=<that file> is one
    line naming it and what to pass instead (it was Lightning's KeyError traceback), and the run it came from stays
    as it was."""
    common = ["debug=smoke", f"data.path={demo_dir}", "model.out_dim=64"]
    done = _train([*common, f"hydra.run.dir={tmp_path / 'job'}"])
    assert done.returncode == 0, done.stderr[-2000:]
    best = next((tmp_path / "job" / "checkpoints").glob("best-step*.ckpt"))
    refused = _train([*common, f"resume={best}", "trainer.max_steps=40", f"hydra.run.dir={tmp_path / 'again'}"])
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert f"checkpoint {best} holds the model's weights only" in refused.stderr
    assert "last.ckpt" in refused.stderr and "Traceback" not in refused.stderr
    _, runs = _runs(mlflow_uri, "sweeplab")
    assert [r.info.status for r in runs] == ["FINISHED"]
    # the job's folder (what the message says to pass) resumes
    extended = _train([*common, f"resume={tmp_path / 'job'}", "trainer.max_steps=40", f"hydra.run.dir={tmp_path / 'again'}"])
    assert extended.returncode == 0, extended.stderr[-2000:]


class _LossModel(BoringModel):
    def training_step(self, batch, batch_idx):
        out = super().training_step(batch, batch_idx)
        self.log("loss", out["loss"])
        return out


def test_a_checkpoint_is_saved_only_after_the_metrics_it_covers_are_in_the_store(mlflow_uri, tmp_path, monkeypatch):
    # MLflow's asynchronous queue, made slow: without the flush the store lags several steps behind the trainer
    real_log_batch = SqlAlchemyStore.log_batch

    def slow_log_batch(self, *args, **kwargs):
        time.sleep(0.05)
        return real_log_batch(self, *args, **kwargs)

    monkeypatch.setattr(SqlAlchemyStore, "log_batch", slow_log_batch)
    stored_at_save, asked = {}, []

    class Recording(ResumingMLFlowLogger):
        def log_metrics(self, metrics, step=None):
            asked.append(step)
            super().log_metrics(metrics, step)

    class LookAtTheStore(Callback):  # runs after MetricsStoredAtCheckpoint, before the file is written
        def on_save_checkpoint(self, trainer, pl_module, checkpoint):
            history = MlflowClient(mlflow_uri).get_metric_history(job.run_id, "loss")
            stored_at_save[trainer.global_step] = (sorted(m.step for m in history), list(asked))

    with mlflow_store.JobRun(mlflow_uri, "flush", JobRun(name="a job", config_params={})) as job:
        logger = Recording(experiment_name="flush", tracking_uri=mlflow_uri, run_id=job.run_id, synchronous=False)
        last = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=4, save_top_k=0, save_last=True)
        trainer = L.Trainer(
            max_steps=12, limit_val_batches=0, logger=logger, log_every_n_steps=1, accelerator="cpu",
            callbacks=[MetricsStoredAtCheckpoint(), LookAtTheStore(), last],
            enable_progress_bar=False, enable_model_summary=False,
        )
        trainer.fit(_LossModel())
    assert sorted(stored_at_save) == [4, 8, 12]
    for step, (stored, asked_so_far) in stored_at_save.items():
        assert len(asked_so_far) >= step - 1 and stored == sorted(asked_so_far), step


def test_a_resumed_run_skips_exactly_the_steps_already_stored(mlflow_uri):
    with mlflow_store.JobRun(mlflow_uri, "skip", JobRun(name="a job", config_params={})) as job:
        job.log_metrics({"loss": 1.0}, step=0)
        job.log_metrics({"loss": 3.0}, step=2)  # a killed asynchronous attempt stored step 2 but lost step 1
        already = logged_steps(mlflow_uri, job.run_id)
        assert already == {"loss": {0, 2}}
        logger = ResumingMLFlowLogger(experiment_name="skip", tracking_uri=mlflow_uri, run_id=job.run_id,
                                      already_logged=already)
        for step in range(4):
            logger.log_metrics({"loss": 10.0 + step}, step=step)
        logger.finalize()  # Lightning's end of fit: the held points are sent
    history = MlflowClient(mlflow_uri).get_metric_history(job.run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(0, 1.0), (1, 11.0), (2, 3.0), (3, 13.0)]


def test_a_failed_metric_write_is_named_in_a_warning_and_training_goes_on(mlflow_uri, monkeypatch, caplog):
    def refuse(self, run_id, metrics=(), *args, **kwargs):
        if metrics:
            raise RuntimeError("database is locked")
        return real_log_batch(self, run_id, metrics, *args, **kwargs)

    real_log_batch = SqlAlchemyStore.log_batch
    monkeypatch.setattr(SqlAlchemyStore, "log_batch", refuse)
    with mlflow_store.JobRun(mlflow_uri, "refused", JobRun(name="a job", config_params={})) as job:
        logger = ResumingMLFlowLogger(experiment_name="refused", tracking_uri=mlflow_uri, run_id=job.run_id,
                                      synchronous=False)
        for step in range(3):
            logger.log_metrics({"loss": 1.0}, step=step)
        with caplog.at_level("WARNING", logger="sweeplab.tracking.run_logger"):
            logger.wait_for_writes()
    assert "could not store" in caplog.text and "database is locked" in caplog.text
    assert MlflowClient(mlflow_uri).get_run(job.run_id).info.status == "FINISHED"


def _snapshot(client, run_id):
    run = client.get_run(run_id)
    artifacts = sorted(a.path for a in client.list_artifacts(run_id))
    return run.info.status, run.info.end_time, dict(run.data.tags), dict(run.data.params), dict(run.data.metrics), artifacts


def test_a_resume_that_does_not_fit_the_checkpoint_or_its_run_is_refused_before_anything_is_touched(
    demo_dir, mlflow_uri, tmp_path
):
    from conftest import smoke_config
    from sweeplab.core.errors import UserError
    from sweeplab.engine.training import train

    base = ["trainer.max_steps=10", "trainer.val_check_interval=5", "checkpoint.every_n_steps=5"]
    train(smoke_config(demo_dir, *base))
    client, (run,) = _runs(mlflow_uri, "sweeplab")
    ckpt = tmp_path / "outputs" / "checkpoints" / "last.ckpt"
    files = sorted(p.name for p in ckpt.parent.iterdir())
    before = _snapshot(client, run.info.run_id)

    other_size = _train(["debug=smoke", f"data.path={demo_dir}", "model.out_dim=64", "data.batch_size=16", *base,
                         "model.size=small", f"resume={ckpt}"])
    assert other_size.returncode == 2 and "Traceback" not in other_size.stderr
    (line,) = [line for line in other_size.stderr.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: resume: checkpoint {ckpt} holds another model than this config: model.d_hidden")
    refused = {
        (): f"run {run.info.run_id} of checkpoint {ckpt} is FINISHED; resuming it only trains it longer",
        ("optim.lr=0.01",): r"settings differ from this config: optim.lr \(run 0.0003, config 0.01\); a resume may change only",
        ("trainer.max_steps=5",): f"trainer.max_steps: 5 is below the step of checkpoint {ckpt} \\(10\\)",
    }
    for overrides, message in refused.items():
        with pytest.raises(UserError, match=message):
            train(smoke_config(demo_dir, *base, *overrides, f"resume={ckpt}"))
    with pytest.raises(UserError, match="holds a textbridge model; this config trains pagating_lm"):
        train(compose_train(["model=pagating_lm", "debug=smoke", f"resume={ckpt}"]))
    assert _snapshot(client, run.info.run_id) == before
    assert len(_runs(mlflow_uri, "sweeplab")[1]) == 1 and sorted(p.name for p in ckpt.parent.iterdir()) == files


def test_extending_a_finished_run_trains_a_new_run_linked_to_it_and_leaves_the_finished_one_as_it_was(
    demo_dir, mlflow_uri, tmp_path
):
    from conftest import smoke_config
    from sweeplab.core.errors import UserError
    from sweeplab.engine.training import train

    base = ["trainer.val_check_interval=5", "checkpoint.every_n_steps=5", "trainer.log_every_n_steps=1"]
    train(smoke_config(demo_dir, *base, "trainer.max_steps=10"))
    client, (finished,) = _runs(mlflow_uri, "sweeplab")
    before = _snapshot(client, finished.info.run_id)
    ckpt = tmp_path / "outputs" / "checkpoints" / "last.ckpt"
    with pytest.raises(UserError, match=r"is FINISHED and its extension is a new run, which needs a folder of its own"):
        train(smoke_config(demo_dir, *base, "trainer.max_steps=15", f"resume={ckpt}"))  # into the finished run's folder
    objective = train(smoke_config(demo_dir, *base, "trainer.max_steps=15", f"resume={ckpt}"), output_dir=tmp_path / "longer")
    client, runs = _runs(mlflow_uri, "sweeplab")
    (longer,) = [r for r in runs if r.info.run_id != finished.info.run_id]
    assert _snapshot(client, finished.info.run_id) == before  # never written to again
    assert longer.info.status == "FINISHED" and longer.data.tags["extends"] == finished.info.run_id
    assert longer.data.params["trainer.max_steps"] == "15" and longer.data.tags["resumed_from"] == str(ckpt)
    assert not any(k.startswith("changed_on_resume.") for k in longer.data.tags)  # its params are its own
    assert [m.step for m in client.get_metric_history(longer.info.run_id, "train/loss")] == list(range(10, 15))
    scores = [m.value for r in (finished, longer) for m in client.get_metric_history(r.info.run_id, "val/cos")]
    assert objective == max(scores)  # the best of the whole history: the finished run's best came along


@pytest.mark.slow  # ~19 s: two real runs
def test_a_copied_checkpoint_resumes_into_the_jobs_own_directory_and_the_run_sheds_its_error(
    demo_dir, mlflow_uri, tmp_path
):
    common = [
        "debug=smoke", f"data.path={demo_dir}", "model.out_dim=64", "data.batch_size=16", "trainer.max_steps=12",
        "trainer.val_check_interval=4", "checkpoint.every_n_steps=4",
    ]
    failed = _train([*common, f"hydra.run.dir={tmp_path / 'first'}"], env={"SWEEPLAB_FAULT_RAISE_AT_STEP": "9"})
    assert failed.returncode != 0
    client, (run,) = _runs(mlflow_uri, "sweeplab")
    assert run.info.status == "FAILED" and "error" in run.data.tags
    copied = tmp_path / "copy" / "last.ckpt"
    copied.parent.mkdir()
    copied.write_bytes((tmp_path / "first" / "checkpoints" / "last.ckpt").read_bytes())

    resumed = _train([*common, f"resume={copied}", f"hydra.run.dir={tmp_path / 'second'}"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    new_dir = tmp_path / "second" / "checkpoints"
    assert f"checkpoints go to {new_dir}" in resumed.stdout + resumed.stderr
    assert not (tmp_path / "checkpoints").exists()  # two folders above the copied file: not where a job writes
    assert torch.load(new_dir / "last.ckpt", weights_only=True)["global_step"] == 12
    client, (run,) = _runs(mlflow_uri, "sweeplab")
    assert run.info.status == "FINISHED" and run.data.tags["output_dir"] == str(tmp_path / "second")
    assert "error" not in run.data.tags and run.data.tags["previous_error"].startswith("RuntimeError: injected failure")
    assert "error.txt" not in {a.path for a in client.list_artifacts(run.info.run_id)}
    # the best so far came along into the new directory; the run's best is the best of its whole history
    best = max(m.value for m in client.get_metric_history(run.info.run_id, "val/cos"))
    assert sorted(new_dir.glob("best-*.ckpt")) == [Path(run.data.tags["checkpoint"])]
    saved = torch.load(run.data.tags["checkpoint"], weights_only=True)
    (state,) = [v for k, v in saved["callbacks"].items() if k.startswith("ModelCheckpoint{'monitor': 'val/cos'")]
    assert float(state["best_model_score"]) == pytest.approx(best, rel=1e-6)


def test_a_checkpoint_whose_run_is_not_in_this_store_continues_as_a_new_run(demo_dir, mlflow_uri, tmp_path, monkeypatch, caplog):
    from conftest import smoke_config
    from sweeplab.engine.training import train

    base = ["trainer.val_check_interval=5", "checkpoint.every_n_steps=5", "trainer.log_every_n_steps=1"]
    train(smoke_config(demo_dir, *base, "trainer.max_steps=10"))
    (_, (original,)) = _runs(mlflow_uri, "sweeplab")
    other = f"sqlite:///{tmp_path / 'other.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", other)
    ckpt = tmp_path / "outputs" / "checkpoints" / "last.ckpt"
    with caplog.at_level("WARNING", logger="sweeplab.engine.training"):
        train(smoke_config(demo_dir, *base, "trainer.max_steps=15", f"resume={ckpt}"))
    assert f"the run of checkpoint {ckpt} ({original.info.run_id}) is not in {other}" in caplog.text
    client, (run,) = _runs(other, "sweeplab")
    assert run.info.run_id != original.info.run_id and run.info.status == "FINISHED"
    assert run.data.params["trainer.max_steps"] == "15" and run.data.tags["resumed_from"] == str(ckpt)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")] == list(range(10, 15))
