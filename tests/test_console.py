"""What a sweep prints is sweeplab's own (tests/console_formats.py holds the formats), and it names each thing one
way: a job by Hydra's number (counted from 0: its `#N` line, its folder, the `hydra_job` tag, the `best: job N`
line), the sweep by one id (run name, `sweep_id` tag, the report's heading)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from console_formats import foreign_lines

FAST = ("debug=smoke", "model.out_dim=64", "trainer.max_steps=4", "trainer.val_check_interval=2",
        "trainer.limit_val_batches=1", "timing.warmup_steps=1", "timing.window=2", "optim.warmup_steps=1",
        "logger.log_checkpoint=false", "logger.log_dataset=false")


def test_a_smoke_sweep_prints_only_sweeplabs_lines_and_one_name_for_each_thing(demo_dir, mlflow_uri, tmp_path):
    """On a host with SLURM's `srun` on PATH too (a cluster's login node: Lightning hinted at srun for every job)."""
    sweep_dir = tmp_path / "multirun" / "2026-01-02" / "03-04-05"
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "srun").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "bin" / "srun").chmod(0o755)
    env = {**os.environ, "SWEEPLAB_UI_URL": "http://127.0.0.1:5123", "MPLCONFIGDIR": str(tmp_path / "mpl"),
           "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(
        [sys.executable, "-m", "sweeplab.train", "-m", *FAST, f"data.path={demo_dir}", "data.batch_size=8,16",
         f"hydra.sweep.dir={sweep_dir}"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = (sweep_dir / "report.md").read_text()
    output = result.stdout + result.stderr
    assert foreign_lines(output, report) == [], output[-4000:]

    lines = output.splitlines()
    assert any(line.endswith("sweep: job 0 (the 1st of 2)") for line in lines), output[-3000:]
    assert any(re.search(r"sweep: job 1 \(the 2nd of 2; sweep started .+ ago, about .+ left\)$", line) for line in lines)
    assert "\t#1 : " in output and (sweep_dir / "1").is_dir()  # Hydra's job 1, in folder 1
    assert "hydra.job.env_set" not in output  # the sweeper's bookkeeping stays out of Hydra's launch lines
    done = [line for line in lines if "done: " in line]
    assert len(done) == 2 and all("http://127.0.0.1:5123/#/experiments/" in line for line in done), done

    client = MlflowClient(mlflow_uri)
    runs = client.search_runs([client.get_experiment_by_name("sweeplab").experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("sweeplab.role") == "sweep"]
    jobs = [r for r in runs if r is not parent]
    assert {r.data.tags["sweep_id"] for r in runs} == {"2026-01-02/03-04-05"}
    assert parent.info.run_name == "sweep 2026-01-02/03-04-05" and "## sweep 2026-01-02/03-04-05\n" in report
    # where the two jobs' time went, from their wall breakdowns (sweeplab.report.cost)
    assert "\n### where the jobs' time went\n\n2 jobs, " in report and "| training steps |" in report, report
    wall = parent.data.metrics["sweep/process_wall_s"]  # the process's start to its report, also in report.md
    assert 1.0 < wall < 600 and f"the sweep's process: {wall:.1f} s from its start to this report" in report
    (best,) = [line for line in lines if line.startswith("best: job ")]
    number, name = re.match(r"best: job (\d+) \((.+?)\)", best).groups()
    assert [r.data.tags["hydra_job"] for r in jobs if r.info.run_name == name] == [number]
    assert result.stdout.splitlines()[-1] == f"report: {(sweep_dir / 'report.html').resolve()}"  # the page's path last


def test_the_progress_line_counts_jobs_from_zero_and_names_configuration_and_replicate():
    from sweeplab.sweep.progress import progress_line

    assert progress_line(0, "1000 8", 1000.0) == "sweep: job 0 (the 1st of 8)"
    line = progress_line(4, "1000 8", 1076.0, "configuration 2, replicate 1")
    assert line == "sweep: job 4 (the 5th of 8; configuration 2, replicate 1; sweep started 76 s ago, about 76 s left)"
    assert progress_line(11, "1000 20", 1100.0).startswith("sweep: job 11 (the 12th of 20; ")


def test_a_replicates_run_name_says_which_replicate_it_is(demo_dir):
    from conftest import smoke_config
    from sweeplab.engine.plan import plan
    from sweeplab.tracking.naming import run_name

    replicated = smoke_config(demo_dir, "replicates=3")
    assert " rep=2 " in f" {run_name(plan(replicated), replicated, 2)} "
    assert " rep=0 " in f" {run_name(plan(replicated), replicated, 0)} "  # replicate 0 is a replicate too
    single = smoke_config(demo_dir)
    assert "rep=" not in run_name(plan(single), single, 2)


def test_coremltools_int64_note_is_dropped_and_its_other_warnings_stay(caplog):
    """coremltools' 'int64 dtype input ... down casted to int32.' (twice per export) says nothing a user can act on."""
    import logging

    from sweeplab.core.console import quiet_libraries

    quiet_libraries()
    logger = logging.getLogger("coremltools")
    with caplog.at_level(logging.WARNING, logger="coremltools"):
        logger.warning("int64 dtype input input_ids down casted to int32.")
        logger.warning("something else from coremltools")
    assert [r.getMessage() for r in caplog.records] == ["something else from coremltools"]


def test_the_import_notes_of_torchao_and_torch_are_dropped_and_other_warnings_stay(caplog):
    """`make data`'s teacher imports torchao: on a CPU wheel its CUDA libraries fail to load, and torch notes that
    its enums need no pytree registration; neither is the user's to act on."""
    import enum
    import logging

    import torch.utils._pytree as pytree

    from sweeplab.core.console import quiet_libraries

    quiet_libraries()

    class Kind(enum.Enum):  # what torchao registers: an Enum with an __eq__ of its own
        A = 1

        def __eq__(self, other):
            return self is other

        __hash__ = enum.Enum.__hash__

    class Kept(logging.Handler):  # torch's loggers do not propagate to caplog's: listen on the logger itself
        def __init__(self):
            super().__init__(logging.WARNING)
            self.lines = []

        def emit(self, record):
            self.lines.append(record.getMessage())

    kept = Kept()
    torch_logger = logging.getLogger("torch.utils._pytree")
    torch_logger.addHandler(kept)
    try:
        with caplog.at_level(logging.WARNING):
            pytree.register_constant(Kind)  # torch's own warning, from its own logger
            torch_logger.warning("something else from torch")
            logging.getLogger("torchao").warning("Failed to load /x/_C_cutlass_90a.abi3.so: Could not load it")
            logging.getLogger("torchao").warning("something else from torchao")
    finally:
        torch_logger.removeHandler(kept)
    assert kept.lines == ["something else from torch"]
    assert [r.getMessage() for r in caplog.records if r.name == "torchao"] == ["something else from torchao"]


def test_make_data_prints_no_progress_bar_of_transformers(tmp_path):
    """The teacher's weights load without transformers' "Loading weights" bar (make data printed it)."""
    from importlib import metadata

    from sweeplab.families.textbridge import minilm

    try:
        metadata.distribution(minilm.MINILM_WHEEL)
    except metadata.PackageNotFoundError:
        pytest.skip(f"{minilm.MINILM_WHEEL} is not installed (make install installs it)")
    result = subprocess.run(
        [sys.executable, "-m", "sweeplab.families.textbridge.prepare", "--teacher", "minilm", "--out",
         str(tmp_path / "data"), "--n-sentences", "16"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"}, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    output = result.stdout + result.stderr
    assert "Loading weights" not in output and "it/s" not in output, output
    assert [line for line in output.splitlines() if not line.startswith(("teacher: ", "wrote "))] == [], output


def test_progress_into_a_file_is_plain_lines_at_every_tenth(tmp_path):
    """Not tqdm's carriage-return refreshes, which a log file or a pipe keeps as one endless line."""
    from sweeplab.core.console import progress

    with open(tmp_path / "log.txt", "w") as log:  # a file: not a terminal
        assert list(progress(range(20), "teacher", "batch", stream=log)) == list(range(20))
    text = (tmp_path / "log.txt").read_text()
    assert "\r" not in text
    assert text.splitlines() == [f"teacher: {n}/20 batch" for n in range(2, 21, 2)]


def test_the_done_line_names_the_best_checkpoint_and_the_runs_address():
    from types import SimpleNamespace

    from console_formats import _DONE
    from sweeplab.engine.job import final_line

    run = SimpleNamespace(uri="http://127.0.0.1:5000", experiment_id="1", run_id="a" * 32, run_name="bs=16 tiny")
    line = final_line(run, "val/cos", 0.61, {"summary/samples_per_sec": 1234.0}, checkpoint="outputs/ckpt/best.ckpt")
    assert line == ("done: bs=16 tiny: best val/cos 0.61, 1,234 samples/s; best checkpoint outputs/ckpt/best.ckpt; "
                    f"http://127.0.0.1:5000/#/experiments/1/runs/{'a' * 32}?workflowType=machine_learning")
    assert re.fullmatch(_DONE, line)
    assert final_line(None, "val/cos", None, {}) == "done (not tracked): val/cos n/a"
    stopped = final_line(run, "val/cos", 0.53, {"summary/samples_per_sec": 1234.0}, stopped=(80, 100))
    assert stopped.startswith("done: bs=16 tiny: best val/cos 0.53, stopped at step 80 of 100, 1,234 samples/s; ")
    assert re.fullmatch(_DONE, stopped)
