"""Several jobs side by side on one GPU (issue 62): lanes_per_gpu checked and chosen from the probe, the choice's line,
what each packed job is told, and the lanes launcher running N lanes on each pretend GPU (CUDA_VISIBLE_DEVICES + a
lock folder, real processes, real locks) in round-major order with no barrier between rounds."""

from __future__ import annotations

import json
import multiprocessing
import os
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


def test_auto_runs_no_probe_where_the_study_is_too_short_for_one_to_pay_and_caps_it_by_the_studys_steps():
    """A probe's steps per configuration: at most PROBE_SHARE of what the study plans for it (the numbers of
    BENCHMARKS.md's studies); where even MIN_PROBE_STEPS would be over that share, auto packs nothing."""
    assert packing.probe_steps(100, 1000, 5) == 100  # the 1,000-step study: 2 % of its steps, as before
    assert packing.probe_steps(100, 100, 5) == 50  # the 100-step default study: was 100, a fifth of its steps
    assert packing.probe_steps(100, 300, 3) == 90  # paGating small, 3 x 300 steps
    assert packing.probe_steps(100, 100, 2) == packing.MIN_PROBE_STEPS  # never cut under a measurement's least
    assert packing.probe_steps(100, 10, 20) == 10 and packing.probe_steps(7, None, 1) == 7  # a job's; epochs
    assert packing.probe_pays(100, 2) and not packing.probe_pays(100, 1) and packing.probe_pays(None, 1)

    probed = []

    def probe(grid, order, steps, config):
        probed.append(steps)
        return Probe({0: 0.01}, 2000.0, 0.2, H200_MB)

    def config(lanes, replicates, max_steps, auto_first=3):
        return OmegaConf.create({"backend": {"name": "cuda"}, "replicates": replicates, "trainer": {
            "max_steps": max_steps}, "replicates_auto": {"first": auto_first, "most": 12},
            "hydra": {"launcher": {"lanes_per_gpu": lanes, "probe_steps": 100}}})

    short = packing.plan_lanes(config("auto", 1, 100), GRID, 4, 1, probe)
    assert short.lanes_per_gpu == 1 and probed == []
    assert short.line() == ("1 job at a time on each of 1 GPU: too short for a probe to pay (1 x 100 steps a "
                            "configuration: 20 steps of probe would be over 10% of it)")
    assert packing.plan_lanes(config(2, 1, 100), GRID, 4, 1, probe).lanes_per_gpu == 2  # a fixed N: its check
    assert packing.plan_lanes(config("auto", 5, 100), GRID, 20, 1, probe).lanes_per_gpu == 4
    assert packing.plan_lanes(config("auto", "auto", 100, auto_first=2), GRID, 4, 1, probe).lanes_per_gpu == 4
    swept = [[*overrides, f"trainer.max_steps={steps}"] for overrides, steps in zip(GRID, (1000, 300, 500, 400))]
    packing.plan_lanes(config("auto", 5, 100), swept, 20, 1, probe)  # the grid's own steps, the fewest of them
    assert probed == [20, 50, 20, 100]


def test_a_jobs_memory_reads_the_one_that_holds_most_not_the_probe_processs_history():
    """The 1,000-step study's probe read 21.3 GB (nvidia-smi over one process that ran every configuration: the
    caching allocator's blocks of the ones before, cuDNN's workspace) and was capped at 3 lanes on an 80 GB card;
    with what one job holds in its own process the busy share decides."""
    h100 = 81559.0
    assert packing.choose(Probe({}, 21_300.0, 0.16, h100), 1, 20).lanes_per_gpu == 3
    choice = packing.choose(Probe({}, 2_600.0, 0.16, h100, context_mb=520.0), 1, 20)
    assert choice.lanes_per_gpu == 5 and "(as many as the busy share allow)" in choice.line()
    assert Probe.from_json(choice.probe.to_json()) == choice.probe


class PretendCuda:
    """torch.cuda's memory calls over a pretend caching allocator that keeps what it reserved until emptied and
    never carves a configuration's tensors from another's cached blocks (the worst case of a real one)."""

    def __init__(self):
        self.started, self.reserved, self.peak = False, 0.0, 0.0

    def is_initialized(self):
        return self.started

    def empty_cache(self):
        self.reserved = 0.0  # the fit ended: nothing is live, every cached block goes back

    def reset_peak_memory_stats(self):
        self.peak = self.reserved

    def max_memory_reserved(self):
        return self.peak * 2**20

    def memory_reserved(self):
        return self.reserved * 2**20

    def fit(self, need_mb: float):
        self.started = True
        self.reserved += need_mb
        self.peak = max(self.peak, self.reserved)


def _pretend_probe(monkeypatch, tmp_path, need_mb, busy, base_mb=600.0, context=520.0, cuda=None):
    """probe_configurations over pretend fits: each configuration reserves need_mb[i] on a PretendCuda while the
    GPU is `busy` (its samples land inside the fit's timed steps) and nvidia-smi reads base + context + reserve."""
    from sweeplab.core.records import JOB
    from sweeplab.sweep import probe

    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi: the real sampler, fed by the pretend fits
    sampler = probe.GpuSampler("0")
    sampler.total_mb = 81559.0
    cuda = cuda if cuda is not None else PretendCuda()
    fitted = []

    def fit(index):
        start = time.perf_counter()
        cuda.fit(need_mb[index])
        fitted.append(index)
        sampler.samples.extend((start + 1e-4 * (i + 1), busy, base_mb + context + cuda.reserved) for i in range(6))
        time.sleep(0.01)
        return {JOB.step_time_median: 0.01 * (index + 1)}, {"setup": 0.0, "warmup": 0.0, "steps": 0.005}, start

    measured = probe.probe_configurations(list(need_mb), fit, sampler, probe.CudaMemory(cuda), packing.ALONE_BUSY,
                                          base_mb)
    return measured, fitted


def test_the_probe_counts_a_jobs_peak_reserve_alone_plus_the_cuda_context(monkeypatch, tmp_path):
    measured, fitted = _pretend_probe(monkeypatch, tmp_path, {2: 3000.0, 0: 2000.0, 1: 2500.0}, busy=0.16)
    assert fitted == [2, 0, 1] and sorted(measured.step_time_s) == [0, 1, 2]
    assert measured.context_mb == pytest.approx(520.0)  # nvidia-smi above the start, less torch's reserve
    # the largest one job reserves, plus the context; without the cache emptied between them: 7500 + 520
    assert measured.memory_mb == pytest.approx(3000.0 + 520.0)
    assert measured.busy == pytest.approx(0.16) and measured.gpu_memory_mb == 81559.0


def test_the_probe_stops_after_the_first_configuration_where_it_fills_the_gpu_as_pagating_small_did(monkeypatch,
                                                                                                    tmp_path):
    """paGating small (BENCHMARKS.md): 'probe 9.6 GB, GPU busy 100%: one job fills it'; bs=16 first, bs=8 never."""
    measured, fitted = _pretend_probe(monkeypatch, tmp_path, {1: 9000.0, 0: 5000.0}, busy=1.0)
    assert fitted == [1] and list(measured.step_time_s) == [1]
    choice = packing.choose(measured, 1, 6)
    assert choice.lanes_per_gpu == 1 and "one job fills it" in choice.line()


def test_the_probe_reads_no_memory_where_cuda_never_started(monkeypatch, tmp_path):
    class NeverStarted(PretendCuda):
        def fit(self, need_mb):
            pass

    measured, _ = _pretend_probe(monkeypatch, tmp_path, {0: 1000.0}, busy=0.2, cuda=NeverStarted())
    assert measured.memory_mb is None and measured.context_mb is None and measured.busy == pytest.approx(0.2)


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
case "$*" in *-lms=*) ;; *) echo 1000; exit 0;; esac
memory=1000
while true; do echo "$FAKE_GPU_BUSY, $memory, 81559"; memory=$((memory + 50)); sleep 0.1; done
"""


def _probe(monkeypatch, tmp_path, demo_dir, busy: int, steps: int = 4) -> Probe:
    """The probe in its own process, as the sweep runs it (started, then sent its request), on a pretend GPU."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_GPU_BUSY", str(busy))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.chdir(tmp_path)
    grid = [["debug=smoke", f"data.path={demo_dir}", "model.out_dim=64", f"data.batch_size={b}"] for b in (4, 8)]
    (tmp_path / "sweep").mkdir()
    probe = packing.ProbeProcess().run(grid, packing.largest_first(grid), steps, tmp_path / "sweep")
    assert probe.step_time_s, "the probe failed: see the warning logged"
    return probe


@pytest.mark.slow  # ~30 s on 2 cores: its sibling below runs the same probe process over both configurations
def test_the_probe_stops_after_the_largest_configuration_where_it_fills_the_gpu(monkeypatch, tmp_path, demo_dir):
    probe = _probe(monkeypatch, tmp_path, demo_dir, busy=95)
    assert list(probe.step_time_s) == [1]  # batch 8 first, and only: the study is not packed
    assert probe.busy == pytest.approx(0.95) and probe.gpu_memory_mb == 81559.0
    assert probe.memory_mb is None and probe.context_mb is None  # a job's memory is torch's: no CUDA, no reading
    assert packing.choose(probe, 1, 4).lanes_per_gpu == 1


@pytest.mark.slow  # ~15-75 s: two real smoke fits in the probe (fast siblings: the probe's unit tests with a fake allocator)
def test_the_probe_measures_every_configuration_alone_where_the_gpu_stays_idle(monkeypatch, tmp_path, demo_dir):
    probe = _probe(monkeypatch, tmp_path, demo_dir, busy=20)
    assert sorted(probe.step_time_s) == [0, 1] and all(t > 0 for t in probe.step_time_s.values())
    assert probe.busy == pytest.approx(0.2)
    assert packing.choose(probe, 1, 4).lanes_per_gpu == 4


def test_the_probes_process_starts_with_the_sweep_and_ends_unasked_where_the_sweep_probes_nothing(monkeypatch):
    """Started by the lanes' warm-up callback, so that its imports run beside the main's start-up; a round that fits
    the GPU slots runs no probe, and the waiting process is ended then, not left behind."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setattr(packing, "_early_probe", None)
    config = OmegaConf.create({"backend": {"name": "cuda"}, "replicates": 5, "trainer": {"max_steps": 100},
                               "hydra": {"launcher": {"lanes_per_gpu": "auto", "probe_steps": 100},
                                         "sweeper": {"_target_": "hydra_plugins.sweeplab_sweeper.grid.SweeplabSweeper"}}})
    assert packing.start_probe_early(OmegaConf.merge(config, {"backend": {"name": "cpu"}})) is None
    search = {"hydra": {"sweeper": {"_target_": "hydra_plugins.sweeplab_sweeper.search.OptunaSearch"}}}
    assert packing.start_probe_early(OmegaConf.merge(config, search)) is None  # it runs no probe
    assert packing.start_probe_early(OmegaConf.merge(config, {"replicates": 1})) is None  # too short to pay
    early = packing.start_probe_early(config)
    assert early is not None and packing.start_probe_early(config) is early
    assert early.process.poll() is None  # waiting for its request
    choice = packing.plan_lanes(config, GRID, launch_size=1, gpus=1)
    assert choice.lanes_per_gpu == 1 and early.process.poll() is not None and packing._early_probe is None


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
    assert "the lanes' probe process started with the sweep" in out  # its imports beside the main's start-up
    (parent,), _ = store_runs(mlflow_uri)
    children = mlflow_store.sweep_jobs(mlflow_uri, parent.info.run_id)
    assert len(children) == 4
    assert {r.data.tags[JOB.lanes_per_gpu] for r in children} == {"2"}
    assert all(float(r.data.tags[JOB.solo_step_time_s]) > 0 for r in children)
    assert {r.data.tags[JOB.gpu] for r in children} == {"0"} and len({r.data.tags[JOB.lane] for r in children}) == 2
    assert "packing check (2 jobs side by side on each GPU)" in out
    assert list((tmp_path / "sweep").rglob("lanes.png"))
    assert not list((tmp_path / "sweep").glob(".probe-*"))  # the probe's folder is gone
