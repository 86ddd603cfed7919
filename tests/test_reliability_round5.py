"""Issue 50 (reliability round 5), the training side: every setting that cannot mean anything is refused in one line
before the heavy imports (measured in CPU-seconds of a real `python -m sweeplab.train`), the host probe honours a
stop request (a real SIGTERM), a continued study is held by one process (two real processes), the printed continue
command works for a folder with a space and a quote, and a finished job keeps only the files something reads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from test_bad_inputs_round4 import _one_line

PY = sys.executable
PROBES = Path(__file__).parent / "probes"  # sitecustomize.py: the child's modules at exit
HEAVY = ("torch", "lightning")  # what a refusal must come before (their import costs 9-15 CPU-s here)


def _train(args: list[str], cwd, env=None, timeout=120) -> tuple[subprocess.CompletedProcess, set[str]]:
    """`python -m sweeplab.train ARGS` in a child process: its result and the modules it had imported when it exited.

    The cost a user sees (under 3 CPU-s on the 2-core development machine) is measured by `make bench-refusal`
    (scripts/refusal_cost.py), on a quiet machine; here the test asserts what makes it cheap: the answer comes before
    torch and Lightning are imported."""
    modules = Path(cwd) / ".modules-at-exit"
    path = os.pathsep.join([str(PROBES), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    result = subprocess.run([PY, "-m", "sweeplab.train", *args], cwd=cwd, capture_output=True, text=True,
                            timeout=timeout, env={**os.environ, **(env or {}), "PYTHONPATH": path,
                                                  "SWEEPLAB_TEST_MODULES_AT_EXIT": str(modules)})
    imported = set(modules.read_text().split()) if modules.exists() else set()  # none after a kill -9
    modules.unlink(missing_ok=True)
    return result, imported


def _heavy(imported: set[str]) -> list[str]:
    """The torch and Lightning modules among those a child imported (it must have written its list)."""
    assert imported, "the child wrote no module list: tests/probes/sitecustomize.py did not run"
    return sorted(m for m in imported if m.split(".")[0] in HEAVY)


# --- a wrong value answers at once --------------------------------------------------------------------------------


WRONG_VALUES = [
    # (overrides, what the line names); -m: a sweep refuses before its parent run exists
    (["report.target=nan"], "report.target: expected a finite number, got nan"),
    (["report.target=inf"], "report.target: expected a finite number"),
    (["report.target=1.5"], "report.target: 1.5 is outside the values val/cos can take ([-1, 1])"),
    (["report.quality_tolerance=-1"], "report.quality_tolerance: must be >= 0"),
    (["report.target=high"], "report.target: expected a number, got 'high'"),
    (["replicates=sometimes"], "replicates: expected an integer in [1, 1000] or auto, got 'sometimes'"),
    (["timing.host_probe_s=1e9"], "timing.host_probe_s: must be in [0, 60]"),
    (["compile_scope=regions"], "compile_scope: regions does nothing with compile=off"),
    (["compile_cache=shared"], "compile_cache: shared does nothing with compile=off"),
    (["data.batch_size=abc"], "data.batch_size: expected int, got 'abc'"),
    (["trainer.max_steps=abc"], "trainer.max_steps: expected int, got 'abc'"),
    (["export=coreml", "export.batch_size=100000000"], "export.batch_size: must be in [1, 4096]"),
    (["-m", "replicates=-1"], "replicates: expected an integer in [1, 1000] or auto, got -1"),
    (["-m", "report.target=nan"], "report.target: expected a finite number, got nan"),
]


@pytest.mark.parametrize(("overrides", "message"), WRONG_VALUES, ids=[" ".join(o) for o, _ in WRONG_VALUES])
def test_a_wrong_value_is_one_line_before_torch_and_nothing_is_written(overrides, message, demo_dir, mlflow_uri,
                                                                      tmp_path):
    result, imported = _train([*overrides, f"data.path={demo_dir}", "model.out_dim=64", "debug=smoke",
                            f"hydra.sweep.dir={tmp_path / 'sweep'}", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    _one_line(result.stderr, message)
    assert result.stderr.count(message) == 1, result.stderr  # printed once (replicates=-1 was printed twice)
    assert not _heavy(imported), _heavy(imported)[:5]
    experiment = MlflowClient(mlflow_uri).get_experiment_by_name("sweeplab")
    assert experiment is None or not MlflowClient(mlflow_uri).search_runs([experiment.experiment_id])
    assert not (tmp_path / "sweep" / "mlflow_parent_run_id").exists()


def test_every_group_the_early_check_reads_names_the_class_plan_builds():
    """The early check reads each group's class from its source by name: a renamed or moved class must break this
    test, not silently turn the early check off."""
    from sweeplab.core.config import _accepted, source_accepted
    from sweeplab.engine import settings
    from sweeplab.families import get_family
    from sweeplab.families.record import resolve

    targets = list(settings.GROUP_TARGETS.values())
    for name in ("textbridge", "pagating_lm", "textbridge_decoder"):
        family = get_family(name)
        targets += [getattr(family, field) for field, _ in settings.FAMILY_GROUPS.values()
                    if isinstance(getattr(family, field), str)]
    for target in targets:
        read = source_accepted(target)
        assert read, target
        assert set(read) == set(_accepted(resolve(target, "test", "target"))), target


# --- the host probe honours a stop request ------------------------------------------------------------------------


@pytest.mark.slow  # ~12 s: a real job signalled in its host probe
def test_sigterm_while_the_host_probe_runs_stops_the_job_killed_at_once(demo_dir, mlflow_uri, tmp_path):
    """timing.host_probe_s=60: the probe runs when training starts; a SIGTERM then ends the job KILLED within seconds
    (it waited for the whole probe: 120 s later the job had not stopped)."""
    log = (tmp_path / "job.log").open("w")
    job = subprocess.Popen([PY, "-m", "sweeplab.train", "debug=smoke", f"data.path={demo_dir}", "model.out_dim=64",
                            "timing.host_probe_s=60", "trainer.max_steps=4", "logger.system_metrics_after_s=null",
                            f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    client, deadline = MlflowClient(mlflow_uri), time.monotonic() + 120
    try:
        while time.monotonic() < deadline and job.poll() is None:
            experiment = client.get_experiment_by_name("sweeplab")
            if experiment and client.search_runs([experiment.experiment_id], "attributes.status = 'RUNNING'"):
                break
            time.sleep(0.2)
        time.sleep(4)  # the data is set up in about a second; the probe runs for 60
        job.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        job.wait(timeout=60)
        took = time.monotonic() - sent
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    text = (tmp_path / "job.log").read_text()
    assert job.returncode == 128 + signal.SIGTERM, text[-3000:]
    assert took < 10, f"stopped {took:.1f} s after SIGTERM"
    assert "Traceback" not in text, text[-3000:]
    (run,) = client.search_runs([client.get_experiment_by_name("sweeplab").experiment_id])
    assert run.info.status == "KILLED"


# --- a continued study: one process, its printed command, its jobs once ---------------------------------------------


def test_a_study_continued_twice_at_once_is_refused_naming_the_pid_and_ends_with_exactly_its_jobs(
    demo_dir, mlflow_uri, tmp_path
):
    """The folder holds a space and a quote; the continue command the interrupted sweep printed is pasted into bash
    as printed (it was shell-quoted but not quoted for Hydra: refused). While that continuation holds the study, the
    same command again is refused in one line naming its pid; the study then ends with each of its jobs once."""
    sweep_dir = tmp_path / "my sweep's dir"
    paused = tmp_path / "paused"
    pause = {"SWEEPLAB_FAULT_PAUSE_IN": "setup", "SWEEPLAB_FAULT_PAUSE_S": "120",
             "SWEEPLAB_FAULT_PAUSED_FILE": str(paused)}
    study = ["debug=smoke", f"data.path={demo_dir}", "model.out_dim=64", "data.batch_size=8,16",
             "trainer.max_steps=3", "logger.system_metrics_after_s=null"]

    def start(argv, env, log):
        return subprocess.Popen(argv, cwd=tmp_path, stdout=(tmp_path / log).open("w"), stderr=subprocess.STDOUT,
                                env={**os.environ, **env})

    def wait_paused(process):
        deadline = time.monotonic() + 120
        while not paused.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert paused.exists(), "the job never reached its setup"

    from sweeplab.tracking.naming import hydra_quote

    first = start([PY, "-m", "sweeplab.train", "-m", *study, f"hydra.sweep.dir={hydra_quote(str(sweep_dir))}"], pause,
                  "first.log")
    wait_paused(first)
    first.send_signal(signal.SIGINT)
    first.wait(timeout=120)
    text = (tmp_path / "first.log").read_text()
    assert first.returncode == 130, text[-3000:]
    (line,) = [li for li in text.splitlines() if "Continue it with: " in li]
    pasted = line.partition("Continue it with: ")[2].replace("python", PY, 1)
    paused.unlink()

    continuing = start(["bash", "-c", pasted], pause, "second.log")
    try:
        wait_paused(continuing)
        again = subprocess.run(["bash", "-c", pasted], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert again.returncode == 2, again.stderr[-3000:]
        _one_line(again.stderr, f"sweep {sweep_dir}", "by another process", f"pid {continuing.pid} ")
        paused.unlink()  # the continuation goes on
        continuing.wait(timeout=300)
    finally:
        if continuing.poll() is None:
            continuing.kill()
            continuing.wait()
    text = (tmp_path / "second.log").read_text()
    assert continuing.returncode == 0, text[-3000:]
    assert "the 3rd of" not in text and "(the 1st of 2" in text and "(the 2nd of 2" in text, text[-3000:]
    client = MlflowClient(mlflow_uri)
    runs = client.search_runs([client.get_experiment_by_name("sweeplab").experiment_id])
    assert not [r for r in runs if r.info.status == "RUNNING"]
    jobs = sorted(r.data.tags.get("config_index") for r in runs
                  if r.data.tags.get("sweeplab.role") != "sweep" and r.info.status == "FINISHED")
    assert jobs == ["0", "1"], jobs  # each configuration's job once
    (parent,) = [r for r in runs if r.data.tags.get("sweeplab.role") == "sweep"]
    assert parent.info.status == "FINISHED"


# --- what a finished job keeps; the export from a job's folder ------------------------------------------------------


@pytest.mark.slow  # ~28 s: a job, an export from its folder
def test_a_finished_job_keeps_only_what_is_read_and_still_exports_from_its_folder(demo_dir, mlflow_uri, tmp_path):
    """checkpoint.keep_last=false (the default; debug=smoke keeps it for the tests that read it): the finished job's
    last.ckpt (optimizer state) is gone once its run is FINISHED, its best checkpoint stays; `export ckpt_path=<the
    job's folder>` exports that best checkpoint (it said "no such file" for a folder that exists); extending the run
    says in one line why it cannot and what keeps it possible."""
    run_dir = tmp_path / "run"
    trained, _ = _train(["debug=smoke", f"data.path={demo_dir}", "model.out_dim=64", "trainer.max_steps=4",
                         "trainer.val_check_interval=2", "checkpoint.keep_last=false", "logger.system_metrics_after_s=null",
                         f"hydra.run.dir={run_dir}"], tmp_path, timeout=300)
    assert trained.returncode == 0, trained.stderr[-3000:]
    (best,) = (run_dir / "checkpoints").iterdir()
    assert best.name.startswith("best-step"), best
    client = MlflowClient(mlflow_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("sweeplab").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["checkpoint"] == str(best)

    extended, _ = _train(["debug=smoke", f"data.path={demo_dir}", "model.out_dim=64", "trainer.max_steps=8",
                          f"resume={run_dir}", f"hydra.run.dir={tmp_path / 'more'}"], tmp_path)
    assert extended.returncode == 2, extended.stderr[-3000:]
    _one_line(extended.stderr, f"resume={run_dir}", "checkpoint.keep_last=true", str(best))

    empty = tmp_path / "empty"
    empty.mkdir()
    refused = subprocess.run([PY, "-m", "sweeplab.export", f"ckpt_path={empty}"], cwd=tmp_path, capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode == 2, refused.stderr[-3000:]
    _one_line(refused.stderr, f"ckpt_path={empty} is a folder without a best checkpoint")

    exported = subprocess.run([PY, "-m", "sweeplab.export", f"ckpt_path={run_dir}", f"out={tmp_path / 'out'}",
                               "export.verify=false"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if "report" in p.name) == [
        "textbridge-standard-fp16.coreml.report.json", "textbridge-standard-fp16.coreml.report.md"]


def test_core_ml_and_core_ai_reports_of_one_model_in_one_folder_are_named_apart(tmp_path):
    from sweeplab.export.pipeline import report_paths

    coreml, coreai = report_paths(tmp_path / "m.mlpackage"), report_paths(tmp_path / "m.aimodel")
    assert [p.name for p in coreml + coreai] == ["m.coreml.report.json", "m.coreml.report.md",
                                                 "m.coreai.report.json", "m.coreai.report.md"]
