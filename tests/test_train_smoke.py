"""A smoke training run records the named metrics, params, tags and config in a real (temporary) MLflow store."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from conftest import smoke_config
from console_formats import foreign_lines
from sweeplab.engine.training import train

TRAIN_METRICS = {"train/loss", "train/cos", "train/mse", "lr", "train/step_time_s", "train/samples_per_sec", "train/tokens_per_sec"}
VAL_METRICS = {"val/loss", "val/cos", "val/mse", "val/p_at_1", "val/mrr"}
SUMMARY = {"summary/step_time_s_median", "summary/samples_per_sec", "summary/peak_mem_mb"}


def _only_run(uri):
    client = MlflowClient(uri)
    (experiment,) = [e for e in client.search_experiments() if e.name == "sweeplab"]
    (run,) = client.search_runs([experiment.experiment_id])
    return client, run


def test_smoke_run_logs_the_named_metrics(demo_dir, mlflow_uri):
    best = train(smoke_config(demo_dir, "loss.alpha=1.0", "loss.beta=0.5"))
    client, run = _only_run(mlflow_uri)
    assert run.info.status == "FINISHED"
    assert TRAIN_METRICS | VAL_METRICS | SUMMARY <= set(run.data.metrics)
    assert run.data.params["loss.alpha"] == "1.0" and run.data.params["data.batch_size"] == "16"
    # the model as built (size tiny, the data's vocabulary and width), never the group's null keys (issue 38)
    params = run.data.params
    assert (params["model.d_model"], params["model.n_blocks"], params["model.out_dim"]) == ("32", "2", "64")
    assert int(params["model.vocab_size"]) > 0 and params["model.vocab_size"] != "30000"  # the tokenizer's, not a default
    assert not [k for k, v in params.items() if k.startswith("model.") and v == "None"]
    assert run.data.tags["mlflow.runName"] == "textbridge tiny bs=16 α=1 β=0.5 steps=20 cpu"  # smoke: not the defaults
    for tag in ("backend", "device", "torch", "lightning", "git_commit", "sweep_id"):
        assert tag in run.data.tags
    assert best == max(m.value for m in client.get_metric_history(run.info.run_id, "val/cos"))
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")]
    # every logging interval (debug=smoke: 5 steps) once, in order, up to the last step
    assert steps == [4, 9, 14, 19]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert "config.yaml" in artifacts


def test_bad_input_fails_with_one_line_and_no_running_run(demo_dir, mlflow_uri, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "sweeplab.train", "debug=smoke", f"data.path={demo_dir}", "model.out_dim=64", "loss.alpha=0", "loss.beta=0"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode != 0
    assert "loss: alpha and beta are both 0" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_run_stays_running_until_the_whole_job_is_done(demo_dir, mlflow_uri, monkeypatch):
    """Lightning's logger would mark the run FINISHED when fit ends; the final validation, the summary and the
    export still follow, and only the job decides how the run ends."""
    from sweeplab.engine import lightning_fit

    seen = []
    original = lightning_fit._monitored  # the job's last step: after fit, its final validation, summary and export

    def recording(trainer, checkpoint, monitor):
        seen.append(MlflowClient(mlflow_uri).get_run(trainer.lightning_module.mlflow_run_id).info.status)
        return original(trainer, checkpoint, monitor)

    monkeypatch.setattr(lightning_fit, "_monitored", recording)
    train(smoke_config(demo_dir))
    _, run = _only_run(mlflow_uri)
    assert seen == ["RUNNING"] and run.info.status == "FINISHED"


def test_a_run_holds_its_checkpoint_dataset_and_system_metrics(demo_dir, mlflow_uri, monkeypatch):
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.1")  # MLflow's own knob: samples within seconds
    # long enough for the sampler's first point on a loaded machine (its first store read can take a second or two)
    train(smoke_config(demo_dir, "logger.system_metrics_after_s=0", "trainer.max_steps=60"))
    client, run = _only_run(mlflow_uri)
    checkpoints = [a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")]
    assert len(checkpoints) == 1 and checkpoints[0].endswith(".ckpt"), checkpoints
    (dataset_input,) = run.inputs.dataset_inputs
    assert dataset_input.dataset.name == demo_dir.name and len(dataset_input.dataset.digest) == 16
    assert [(t.key, t.value) for t in dataset_input.tags] == [("mlflow.data.context", "training")]
    assert "system/cpu_utilization_percentage" in run.data.metrics


def test_artifacts_over_the_cap_stay_on_disk_and_short_runs_get_no_system_metrics(demo_dir, mlflow_uri):
    train(smoke_config(demo_dir, "logger.max_artifact_mb=0.001", "logger.log_dataset=false"))
    client, run = _only_run(mlflow_uri)
    assert client.list_artifacts(run.info.run_id, "checkpoints") == []
    assert run.data.tags["checkpoint"].endswith(".ckpt")  # still named where it lies
    assert not run.inputs.dataset_inputs
    assert not [k for k in run.data.metrics if k.startswith("system/")]  # the default waits a minute


NOISE = ("GPU available", "TPU available", "Tip:", "litlogger", "LeafSpec", "set_vital", "Warning", "warn(")


COMMON = ("debug=smoke", "model.out_dim=64", "trainer.max_steps=4")


def _assert_clean(result: subprocess.CompletedProcess, *documents: str) -> list[str]:
    """No library noise (every line one of sweeplab's formats: tests/console_formats.py; `documents`: what it printed
    whole); every run ends with one line: its metric, throughput and run. Returns the lines."""
    lines = (result.stdout + result.stderr).splitlines()
    assert result.returncode == 0, lines[-40:]
    assert not [line for line in lines if any(n in line for n in NOISE)], lines
    assert foreign_lines(result.stdout + result.stderr, *documents) == [], lines
    done = [line for line in lines if "done: " in line]
    assert done and all("best val/cos" in line and "samples/s" in line for line in done), done
    return lines


@pytest.mark.slow  # the default suite's time budget; `make test-all` runs it
def test_a_runs_console_shows_its_result_not_library_noise(demo_dir, mlflow_uri):
    env = {k: v for k, v in os.environ.items() if k != "SWEEPLAB_UI_URL"}
    result = subprocess.run(
        [sys.executable, "-m", "sweeplab.train", *COMMON, f"data.path={demo_dir}"], capture_output=True, text=True,
        timeout=300, env=env,
    )
    (done,) = [line for line in _assert_clean(result) if "done: " in line]
    # a local store whose UI address nobody gave: the run, not a link to a port that may serve something else
    assert re.search(r"; run \w{32} \(`make ui` shows it\)$", done), done


@pytest.mark.slow
def test_a_parallel_sweeps_console_shows_progress_and_results_not_worker_noise(demo_dir, mlflow_uri):
    """The jobs run in loky worker processes: the filters must reach them too."""
    result = subprocess.run(
        [sys.executable, "-m", "sweeplab.train", "-m", *COMMON, f"data.path={demo_dir}", "data.batch_size=8,16",
         "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"], capture_output=True, text=True, timeout=300,
    )
    (sweep_dir,) = Path.cwd().glob("multirun/*/*")
    lines = _assert_clean(result, (sweep_dir / "report.md").read_text())
    assert len([line for line in lines if "done: " in line]) == 2
    assert any("sweep: job 0 (the 1st of 2" in line for line in lines) and any("sweep: job 1 (the 2nd of 2" in line for line in lines)


def test_no_metric_write_reaches_the_store_during_the_timed_steps(demo_dir, mlflow_uri, monkeypatch):
    """A write costs the training process host time, so the job's metric points wait in the process while its steps
    are timed and reach the store at the next pause: here, with no validation or checkpoint before the last step,
    none is written between the first timed step and the validation at the last step, and afterwards every logged step
    is stored."""
    import time

    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    from sweeplab.callbacks.timing import ThroughputTimer

    writes, timed = [], {}
    real_log_batch, real_start, real_pause = SqlAlchemyStore.log_batch, ThroughputTimer._start, ThroughputTimer.pause

    def observed_log_batch(self, run_id, metrics=(), *args, **kwargs):  # only watches: the store still writes
        if metrics:
            writes.append(time.monotonic())
        return real_log_batch(self, run_id, metrics, *args, **kwargs)

    def observed_start(self):
        timed.setdefault("start", time.monotonic())
        return real_start(self)

    def observed_pause(self):  # the validation at the last step: the timed steps are over
        timed.setdefault("end", time.monotonic())
        return real_pause(self)

    monkeypatch.setattr(SqlAlchemyStore, "log_batch", observed_log_batch)
    monkeypatch.setattr(ThroughputTimer, "_start", observed_start)
    monkeypatch.setattr(ThroughputTimer, "pause", observed_pause)
    train(smoke_config(demo_dir, "trainer.max_steps=30", "trainer.val_check_interval=30", "trainer.log_every_n_steps=1",
                       "timing.window=5", "checkpoint.every_n_steps=1000"))
    assert timed["start"] < timed["end"]
    assert [t for t in writes if timed["start"] <= t <= timed["end"]] == []
    client, run = _only_run(mlflow_uri)
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "train/loss")) == list(range(30))
    assert len(client.get_metric_history(run.info.run_id, "train/samples_per_sec")) == 5  # 28 timed steps: 5 windows


def test_the_first_batch_logs_in_warm_up_and_no_logger_receives_it(demo_dir, mlflow_uri, monkeypatch):
    """Lightning's first self.log in a process pays a one-off set-up (~10 ms on the CPU); logged at a fit's first
    batch, which is warm-up, it stays out of the first job's timed steps. Those values reach no logger: the store
    holds the logging steps only."""
    import lightning as L

    from sweeplab.families.textbridge.task import TextBridgeTask

    seen = {}

    class FirstBatch(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            seen.setdefault(trainer.global_step, "train/loss" in trainer.callback_metrics)

    monkeypatch.setattr(TextBridgeTask, "extra_callbacks", lambda self: [FirstBatch()])
    train(smoke_config(demo_dir, "trainer.max_steps=30", "trainer.val_check_interval=30", "trainer.log_every_n_steps=10",
                       "timing.warmup_steps=5", "checkpoint.every_n_steps=1000"))
    assert seen[1] is True and seen[2] is True  # logged at the first batch, kept (not written) until step 10
    client, run = _only_run(mlflow_uri)
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "train/loss")) == [9, 19, 29]
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "lr")) == [9, 19, 29]

def test_store_writes_around_periodic_checkpoints_stay_out_of_the_timed_stretches(demo_dir, mlflow_uri, monkeypatch):
    """A periodic checkpoint pauses the clock; the metric points it makes durable, and those Lightning logs for its
    step just after it, are written while the clock stands. Left to MLflow's thread, the second kind was still being
    written when the clock ran again (the next CPU batch took a quarter longer)."""
    import threading
    import time

    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    from sweeplab.callbacks.timing import ThroughputTimer

    writes, stretches, lock = [], [], threading.Lock()
    real_log_batch, real_start, real_end = SqlAlchemyStore.log_batch, ThroughputTimer._start, ThroughputTimer._end_stretch

    def observed_log_batch(self, run_id, metrics=(), *args, **kwargs):  # only watches: the store still writes
        begin = time.monotonic()
        try:
            return real_log_batch(self, run_id, metrics, *args, **kwargs)
        finally:
            if metrics:
                with lock:
                    writes.append((begin, time.monotonic()))

    def observed_start(self):
        stretches.append([time.monotonic(), None])
        return real_start(self)

    def observed_end(self):
        stretches[-1][1] = time.monotonic()
        return real_end(self)

    monkeypatch.setattr(SqlAlchemyStore, "log_batch", observed_log_batch)
    monkeypatch.setattr(ThroughputTimer, "_start", observed_start)
    monkeypatch.setattr(ThroughputTimer, "_end_stretch", observed_end)
    train(smoke_config(demo_dir, "trainer.max_steps=40", "trainer.val_check_interval=40", "trainer.log_every_n_steps=5",
                       "timing.window=5", "checkpoint.every_n_steps=10"))
    assert len(stretches) >= 4 and all(end is not None for _, end in stretches)  # paused at steps 10, 20, 30
    assert len(writes) >= 4
    overlaps = [(w, s) for w in writes for s in stretches if w[0] < s[1] and s[0] < w[1]]
    assert overlaps == []
    client, run = _only_run(mlflow_uri)
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "train/loss")) == list(range(4, 40, 5))
