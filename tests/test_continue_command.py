"""The continue command a sweep prints round-trips its overrides: pasted into bash, it gives Hydra the very strings
the sweep was given (spaces, quotes), and the sweep accepts it as the same study."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from sweeplab.core import channels
from sweeplab.sweep import study
from sweeplab.tracking import mlflow_store, naming

# what Hydra receives (argv) for `+label='a b c'` and for `'+label="it'"'"'s \"q\""'` (a Hydra-quoted value)
ODD = ["+label=a b c", '+label2="it\'s \\"q\\""', "data.batch_size=8,16"]


def test_the_continue_command_pasted_into_bash_gives_back_every_override_and_is_the_same_study(mlflow_uri, tmp_path):
    command = naming.continue_command(ODD, tmp_path / "my sweep")
    argv = subprocess.run(["bash", "-c", 'printf "%s\\0" ' + command.partition(" ")[2]], capture_output=True,
                          text=True, check=True).stdout.split("\0")[:-1]
    assert argv == ["-m", "sweeplab.train", "-m", *sorted(ODD), f"hydra.sweep.dir='{tmp_path / 'my sweep'}'",
                    "resume=true"]  # quoted for Hydra too: a space would end the override

    client = MlflowClient(mlflow_uri)
    experiment = mlflow_store.init_store(mlflow_uri, "odd")
    parent = client.create_run(experiment, tags={"sweep_overrides": naming.overrides_tag(ODD)}).info.run_id
    client.set_terminated(parent, "KILLED")
    (tmp_path / channels.PARENT_RUN_FILE).write_text(parent)
    task = [a for a in argv[3:] if not a.startswith("hydra.")]  # what Hydra's hydra.overrides.task holds
    assert study.reopen_sweep(mlflow_uri, tmp_path, task) == parent  # accepted: the same overrides
    assert naming.recorded_overrides(naming.overrides_tag(ODD)) == ODD
    assert naming.recorded_overrides("data.batch_size=8,16 replicates=2") == ["data.batch_size=8,16", "replicates=2"]


@pytest.mark.slow  # two sweeps in child processes
def test_a_sweep_with_quoted_overrides_interrupted_continues_with_the_command_it_printed(demo_dir, mlflow_uri, tmp_path):
    overrides = ["debug=smoke", f"data.path={demo_dir}", "model.out_dim=64", "data.batch_size=8,16",
                 "trainer.max_steps=200", "+label=a b c", '+label2="it\'s \\"q\\""', "logger.system_metrics_after_s=null",
                 f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    log = (tmp_path / "first.log").open("w")  # files, not pipes: a long job's output never blocks it
    first = subprocess.Popen([sys.executable, "-m", "sweeplab.train", "-m", *overrides], cwd=tmp_path,
                             stdout=log, stderr=subprocess.STDOUT, text=True)
    client, deadline = MlflowClient(mlflow_uri), time.monotonic() + 300
    while time.monotonic() < deadline and not [r for r in client.search_runs(["1"], "attributes.status = 'RUNNING'")
                                               if r.data.tags.get("sweeplab.role") != "sweep"]:
        time.sleep(0.5)
    first.send_signal(signal.SIGINT)
    first.wait(timeout=120)
    err = (tmp_path / "first.log").read_text()
    assert first.returncode == 130, err[-3000:]
    (line,) = [li for li in err.splitlines() if "Continue it with: " in li]
    pasted = line.partition("Continue it with: ")[2].replace("python", shlex.quote(sys.executable), 1)
    second = subprocess.run(["bash", "-c", pasted],
                            cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert not client.search_runs(["1"], "attributes.status = 'RUNNING'")


@pytest.mark.slow  # a sweep in a child process
def test_a_sweep_interrupted_in_its_report_says_how_to_continue_it(demo_dir, mlflow_uri, tmp_path):
    paused = tmp_path / "paused"
    sweep = subprocess.Popen(
        [sys.executable, "-m", "sweeplab.train", "-m", "debug=smoke", f"data.path={demo_dir}", "model.out_dim=64",
         "data.batch_size=16", "trainer.max_steps=3", "+label=a b c", "logger.system_metrics_after_s=null",
         f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "SWEEPLAB_FAULT_PAUSE_IN": "report", "SWEEPLAB_FAULT_PAUSE_S": "60",
             "SWEEPLAB_FAULT_PAUSED_FILE": str(paused)})
    deadline = time.monotonic() + 300
    while not paused.exists() and time.monotonic() < deadline and sweep.poll() is None:
        time.sleep(0.2)
    sweep.send_signal(signal.SIGINT)
    _, err = sweep.communicate(timeout=120)
    assert sweep.returncode == 130, err[-3000:]
    (line,) = [li for li in err.splitlines() if "Continue it with: " in li]
    assert "'+label=a b c'" in line and "resume=true" in line
    assert not MlflowClient(mlflow_uri).search_runs(["1"], "attributes.status = 'RUNNING'")


def test_a_continued_sweep_run_moves_what_its_last_attempt_said_to_its_history(mlflow_uri, tmp_path):
    client = MlflowClient(mlflow_uri)
    experiment = mlflow_store.init_store(mlflow_uri, "history")
    said = {"error": "Interrupted: interrupted by SIGTERM", "lost_jobs": "job 2 (scheduler job 41_2): CANCELLED",
            "left_jobs": "job 0: 41_0 (recorded in submitted_jobs.jsonl)", "failed_jobs": "1"}
    parent = client.create_run(experiment, tags={"sweep_overrides": naming.overrides_tag(ODD), **said}).info.run_id
    client.set_terminated(parent, "FAILED")
    (tmp_path / channels.PARENT_RUN_FILE).write_text(parent)
    study.reopen_sweep(mlflow_uri, tmp_path, ODD)
    tags = client.get_run(parent).data.tags
    assert not set(said) & set(tags)  # no longer true of the continued study
    assert tags["earlier"] == "; ".join(f"{key}: {value}" for key, value in said.items())

    client.set_tag(parent, "error", "RuntimeError: again")  # continued once more: the history grows, oldest first
    study.reopen_sweep(mlflow_uri, tmp_path, ODD)
    tags = client.get_run(parent).data.tags
    assert "error" not in tags and tags["earlier"].endswith("failed_jobs: 1; error: RuntimeError: again")
