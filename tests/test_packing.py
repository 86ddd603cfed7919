"""Several jobs side by side on one GPU (issue 62): lanes_per_gpu checked and chosen from the probe, the choice's line,
what each packed job is told, and the lanes launcher running N lanes on each pretend GPU (CUDA_VISIBLE_DEVICES + a
lock folder, real processes, real locks) in round-major order with no barrier between rounds."""

from __future__ import annotations

import json
import multiprocessing
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from sweeplab.core import channels
from sweeplab.core.errors import ConfigError
from sweeplab.study import replicates
from sweeplab.sweep import launchers, packing
from sweeplab.sweep.lanes import run_lane, slot_of
from sweeplab.sweep.packing import LanesChoice, Probe

GRID = [[f"data.batch_size={b}", f"loss.alpha={a}"] for b in (32, 64) for a in (1.0, 0.7)]
H200_MB = 143_771.0


def test_a_small_job_is_packed_as_far_as_the_gpu_stays_under_its_busy_budget_and_the_jobs_go():
    choice = packing.choose(Probe({0: 0.012}, 2100.0, 0.18, H200_MB), gpus=1, launch_size=20)
    assert choice.lanes_per_gpu == 4
    assert choice.line() == ("4 jobs side by side on each of 1 GPU: probe 2.1 GB, GPU busy 18% (as many as the "
                             "busy share allow)")
    assert packing.choose(Probe({}, 2100.0, 0.30, H200_MB), 1, 20).lanes_per_gpu == 2
    assert packing.choose(Probe({}, 2100.0, 0.05, H200_MB), 1, 20).lanes_per_gpu == packing.MOST_LANES
    assert packing.choose(Probe({}, 2100.0, 0.05, H200_MB), 1, 3).lanes_per_gpu == 3  # a launch of 3 jobs
    assert packing.choose(Probe({}, 2100.0, 0.05, H200_MB), 4, 20).lanes_per_gpu == 5  # 20 jobs over 4 GPUs


def test_a_job_that_fills_the_gpu_or_its_memory_is_not_packed():
    pagating = packing.choose(Probe({0: 0.09}, 2700.0, 0.93, H200_MB), gpus=1, launch_size=6)  # 42 % MFU
    assert pagating.lanes_per_gpu == 1 and "one job fills it" in pagating.line()
    assert pagating.line().startswith("1 job at a time on each of 1 GPU: probe 2.7 GB, GPU busy 93%")
    memory_bound = packing.choose(Probe({}, 40_000.0, 0.10, 80_000.0), 1, 8)
    assert memory_bound.lanes_per_gpu == 1 and "the GPU's memory" in memory_bound.line()
    unknown = packing.choose(Probe({}, 2100.0, None, H200_MB), 1, 4)
    assert unknown.lanes_per_gpu == 1 and "GPU busy unknown" in unknown.line()


def test_a_cuda_study_runs_in_the_gpu_lanes_packed_by_auto_unless_another_launcher_is_named():
    import sweeplab.sweep.callback  # noqa: F401  (registers the ${sweeplab_gpu_slots:} resolver)
    from conftest import compose_train

    cuda = compose_train(["backend=cuda"], return_hydra_config=True).hydra
    assert cuda.launcher._target_.endswith("GpuLanesJoblibLauncher") and cuda.launcher.lanes_per_gpu == "auto"
    assert cuda.callbacks.mlflow_sweep.assign_gpus is True and "lanes_warm_up" in cuda.callbacks
    basic = compose_train(["backend=cuda", "hydra/launcher=basic"], return_hydra_config=True).hydra
    assert basic.launcher._target_.endswith("BasicLauncher") and "lanes_warm_up" not in basic.callbacks
    assert compose_train([], return_hydra_config=True).hydra.launcher._target_.endswith("BasicLauncher")  # CPU


@pytest.mark.parametrize("value", [0, 9, "four", 2.5, True])
def test_lanes_per_gpu_is_auto_or_a_count(value):
    with pytest.raises(ConfigError, match="hydra.launcher.lanes_per_gpu"):
        packing.setting(value)
    assert packing.setting("auto") == "auto" and packing.setting(3) == 3


def test_the_probe_measures_the_largest_configuration_first():
    assert packing.largest_first(GRID) == [2, 0, 1, 3]
    assert packing.largest_first([["loss.alpha=1.0"], ["loss.alpha=0.7"]]) == [0, 1]


def _config(lanes, backend="cuda"):
    return OmegaConf.create({"backend": {"name": backend}, "hydra": {"launcher": {"lanes_per_gpu": lanes,
                                                                                  "probe_steps": 7}}})


def test_auto_probes_only_a_cuda_study_with_more_jobs_in_a_round_than_gpus():
    probed = []

    def probe(grid, order, steps, config):
        probed.append((order, steps))
        return Probe({0: 0.01, 1: 0.011}, 2000.0, 0.2, H200_MB)

    assert packing.plan_lanes(_config("auto", "cpu"), GRID, 4, 1, probe).lanes_per_gpu == 1
    assert packing.plan_lanes(_config("auto"), GRID, 4, 4, probe).lanes_per_gpu == 1
    assert packing.plan_lanes(_config(1), GRID, 4, 1, probe).lanes_per_gpu == 1
    assert probed == []
    assert packing.plan_lanes(_config("auto"), GRID, 4, 1, probe).lanes_per_gpu == 4
    fixed = packing.plan_lanes(_config(2), GRID, 4, 1, probe)  # a fixed count still measures alone (the check)
    assert fixed.lanes_per_gpu == 2 and probed == [([2, 0, 1, 3], 7)] * 2
    assert packing.plan_lanes(OmegaConf.create({"hydra": {"launcher": {"n_jobs": 2}}}), GRID, 4, 1, probe) is None


def test_a_packed_job_is_told_its_lanes_and_its_configurations_step_time_alone():
    choice = LanesChoice(4, 1, "probe", Probe({0: 0.0123}))
    assert choice.job_overrides(0) == (f"hydra.job.env_set.{channels.LANES_PER_GPU_ENV}=4",
                                       f"hydra.job.env_set.{channels.SOLO_STEP_TIME_ENV}=0.0123")
    assert choice.job_overrides(1) == (f"hydra.job.env_set.{channels.LANES_PER_GPU_ENV}=4",)
    assert launchers.concurrent_jobs({"_target_": "hydra_plugins.sweeplab_sweeper.lanes.GpuLanesJoblibLauncher", "n_jobs": 1}, 4, 4) == 4
    assert launchers.concurrent_jobs({"_target_": "hydra_plugins.sweeplab_sweeper.lanes.GpuLanesJoblibLauncher", "n_jobs": 2}, 4, 4) == 4


# --- the lanes launcher with several lanes per pretend GPU --------------------------------------------------------
def _launch_list(configurations: int, rounds: int, slots: int, lanes: int) -> list[tuple[int, list[str], int]]:
    planned = replicates.rounds(GRID[:configurations], rounds, seed=0)
    batch = [[*job.overrides, *replicates.job_environment(job, slots * lanes, slots)] for r in planned for job in r]
    return [(number, overrides, slot_of(overrides, number, slots)) for number, overrides in enumerate(batch)]


def _record_job(number, overrides, log_dir, seconds):
    import os

    start = time.monotonic()
    time.sleep(seconds.get(number, 0.3))
    with open(Path(log_dir) / f"{number}.json", "w") as f:
        json.dump({"number": number, "gpu": os.environ["CUDA_VISIBLE_DEVICES"], "lane": os.environ[channels.LANE_ENV],
                   "start": start, "end": time.monotonic()}, f)
    return number


def _run_lanes(tmp_path, jobs, seconds, slots, lanes_per_gpu) -> dict[int, dict]:
    taken, logs = tmp_path / "taken", tmp_path / "logs"
    taken.mkdir()
    logs.mkdir()
    context = multiprocessing.get_context("fork")
    args = (jobs, str(taken), 1, slots, _record_job, (str(logs), seconds), None, lanes_per_gpu)
    workers = [context.Process(target=run_lane, args=args) for _ in range(slots * lanes_per_gpu)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
        assert worker.exitcode == 0
    return {job["number"]: job for job in (json.loads(p.read_text()) for p in logs.glob("*.json"))}


def test_four_lanes_on_one_gpu_run_a_rounds_jobs_side_by_side_and_take_the_next_with_no_barrier(monkeypatch,
                                                                                                tmp_path):
    """One pretend GPU, four lanes, four configurations x three rounds; round 0's first job is slow. Each round's
    four jobs start together (in round-major order), and the three other lanes go on with the next rounds meanwhile."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv(channels.GPU_LOCK_DIR_ENV, str(tmp_path / "locks"))
    jobs = _launch_list(4, rounds=3, slots=1, lanes=4)
    ran = _run_lanes(tmp_path, jobs, {0: 4.0}, slots=1, lanes_per_gpu=4)
    assert sorted(ran) == [n for n, _, _ in jobs]
    assert {job["gpu"] for job in ran.values()} == {"0"}
    assert len({job["lane"] for job in ran.values()}) == 4  # four workers shared the one GPU
    assert sorted(ran, key=lambda n: ran[n]["start"])[:4] == [0, 1, 2, 3]  # round 0 first, side by side
    assert max(ran[n]["start"] for n in range(4)) < min(ran[n]["end"] for n in range(4))
    meanwhile = [n for n in ran if n and ran[n]["start"] < ran[0]["end"]]
    assert sorted(meanwhile) == list(range(1, 12))  # rounds 1 and 2 ran while round 0's slow job did
    assert sorted((tmp_path / "locks").iterdir()) == sorted(
        tmp_path / "locks" / name for name in ("gpu0.lock", "gpu0.lane1.lock", "gpu0.lane2.lock", "gpu0.lane3.lock"))


def test_two_lanes_on_each_of_two_gpus_spread_over_both_and_rotate_the_configurations(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv(channels.GPU_LOCK_DIR_ENV, str(tmp_path / "locks"))
    jobs = _launch_list(4, rounds=2, slots=2, lanes=2)
    ran = _run_lanes(tmp_path, jobs, {}, slots=2, lanes_per_gpu=2)
    assert sorted(ran) == [n for n, _, _ in jobs]
    lanes_of_gpu: dict[str, set[str]] = {}
    for job in ran.values():
        lanes_of_gpu.setdefault(job["gpu"], set()).add(job["lane"])
    assert {gpu: len(lanes) for gpu, lanes in lanes_of_gpu.items()} == {"0": 2, "1": 2}


# --- the report: each job's start and end per lane, the GPUs' idle share -----------------------------------------
def _ran(number: int, lane: str, gpu: str, start_s: float, end_s: float, config: str):
    from sweeplab.study.sweep import JobRecord

    return JobRecord(f"run{number}", f"job{number}", "FINISHED", int(start_s * 1000), {}, {"lane": lane, "gpu": gpu},
                     {}, "mlp_regressor", config, 0, number, number, None, 2, "32", 32, 100.0,
                     end_ms=int(end_s * 1000))


def test_the_report_draws_each_lanes_jobs_and_the_share_of_the_study_a_gpu_ran_nothing(tmp_path):
    from sweeplab.report import tables

    jobs = [_ran(0, "0:11", "0", 10, 14, "a"), _ran(1, "0:12", "0", 10, 12, "b"), _ran(2, "0:12", "0", 12, 13, "a"),
            _ran(3, "1:13", "1", 10, 11, "b"), _ran(4, "1:13", "1", 13, 14, "a")]
    lanes = tables.lanes_timeline(jobs)
    assert lanes == {"0:11": [(0.0, 4.0, "a")], "0:12": [(0.0, 2.0, "b"), (2.0, 3.0, "a")],
                     "1:13": [(0.0, 1.0, "b"), (3.0, 4.0, "a")]}
    assert tables.gpu_idle_share(jobs) == pytest.approx(0.25)  # GPU 0 busy throughout, GPU 1 half the span
    assert tables.lanes_timeline([_ran(0, "", "0", 1, 2, "a")]) == {}  # not the lanes launcher's: no figure
    out = tables.write_plots(type("Sweep", (), {"jobs": jobs, "metric": "val/loss"})(), tmp_path)
    assert tmp_path / "lanes.png" in out and (tmp_path / "lanes.png").stat().st_size > 0


# --- the probe process, with a pretend nvidia-smi ------------------------------------------------------------------
FAKE_NVIDIA_SMI = """#!/bin/bash
memory=1000
while true; do echo "$FAKE_GPU_BUSY, $memory, 81559"; memory=$((memory + 50)); sleep 0.1; done
"""


def _probe(tmp_path, demo_dir, busy: int, steps: int = 4) -> Probe:
    import os
    import subprocess
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    grid = [["debug=smoke", f"data.path={demo_dir}", "model.out_dim=64", f"data.batch_size={b}"] for b in (4, 8)]
    out = tmp_path / "probe.json"
    request = json.dumps({"grid": grid, "order": packing.largest_first(grid), "alone_busy": packing.ALONE_BUSY})
    done = subprocess.run([sys.executable, "-m", "sweeplab.sweep.probe", str(out), str(steps), str(tmp_path / "sweep"),
                           request], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_GPU_BUSY": str(busy),
                               "CUDA_VISIBLE_DEVICES": "0"})
    assert done.returncode == 0, done.stderr[-3000:]
    return Probe.from_json(out.read_text())


@pytest.mark.slow  # ~30 s on 2 cores: its sibling below runs the same probe process over both configurations
def test_the_probe_stops_after_the_largest_configuration_where_it_fills_the_gpu(tmp_path, demo_dir):
    probe = _probe(tmp_path, demo_dir, busy=95)
    assert list(probe.step_time_s) == [1]  # batch 8 first, and only: the study is not packed
    assert probe.busy == pytest.approx(0.95) and probe.gpu_memory_mb == 81559.0
    assert probe.memory_mb is not None and probe.memory_mb > 0  # what the GPU held above its start
    assert packing.choose(probe, 1, 4).lanes_per_gpu == 1


def test_the_probe_measures_every_configuration_alone_where_the_gpu_stays_idle(tmp_path, demo_dir):
    probe = _probe(tmp_path, demo_dir, busy=20)
    assert sorted(probe.step_time_s) == [0, 1] and all(t > 0 for t in probe.step_time_s.values())
    assert probe.busy == pytest.approx(0.2)
    assert packing.choose(probe, 1, 4).lanes_per_gpu == 4


@pytest.mark.slow  # ~3 min on 2 cores: a probe and 4 smoke jobs in two lanes on one pretend GPU
def test_a_packed_sweep_records_its_lanes_its_solo_step_times_and_draws_its_timeline(demo_dir, mlflow_uri, tmp_path):
    from sweeplab.core.records import JOB
    from sweeplab.tracking import mlflow_store
    from test_sweeps_parallel import smoke, store_runs, sweep

    result = sweep(
        tmp_path, "-m", "hydra/launcher=joblib_gpus", "hydra.launcher.lanes_per_gpu=2", "hydra.launcher.probe_steps=4",
        *smoke(demo_dir, "data.batch_size=4,8"), "replicates=2", "trainer.max_steps=4", "trainer.val_check_interval=2",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        env={"CUDA_VISIBLE_DEVICES": "0", channels.GPU_LOCK_DIR_ENV: str(tmp_path / "gpu_locks")},
    )
    out = result.stderr + result.stdout
    assert result.returncode == 0, out[-3000:]
    assert "sweep: 2 jobs side by side on each of 1 GPU: lanes_per_gpu=2; probe memory unknown" in out
    (parent,), _ = store_runs(mlflow_uri)
    children = mlflow_store.sweep_jobs(mlflow_uri, parent.info.run_id)
    assert len(children) == 4
    assert {r.data.tags[JOB.lanes_per_gpu] for r in children} == {"2"}
    assert all(float(r.data.tags[JOB.solo_step_time_s]) > 0 for r in children)
    assert {r.data.tags[JOB.gpu] for r in children} == {"0"} and len({r.data.tags[JOB.lane] for r in children}) == 2
    assert "packing check (2 jobs side by side on each GPU)" in out
    assert list((tmp_path / "sweep").rglob("lanes.png"))
    assert not list((tmp_path / "sweep").glob(".probe-*"))  # the probe's folder is gone
