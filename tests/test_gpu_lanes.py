"""Several GPUs of one host (issue 36): the GPU slot rotates per round, a job claims its slot's GPU, the joblib lanes
launcher runs each slot's jobs in a worker of its own with no barrier at the end of a round, and the job's run
records its GPU. Pretend GPUs (CUDA_VISIBLE_DEVICES + a lock folder), real processes, real locks."""

from __future__ import annotations

import fcntl
import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from sweeplab.core import channels
from sweeplab.core.records import JOB
from sweeplab.study import replicates
from sweeplab.sweep import lanes as joblib_lanes
from sweeplab.sweep.lanes import lane_order, run_lane, slot_of

GRID = [[f"data.batch_size={b}"] for b in (16, 32, 64, 128)]


def _launch_list(configurations: int, rounds: int, slots: int) -> list[tuple[int, list[str], int]]:
    """What the lanes launcher reads from the sweeper's one launch: (job number, overrides, slot)."""
    planned = replicates.rounds(GRID[:configurations], rounds, seed=0)
    batch = [[*job.overrides, *replicates.job_environment(job, slots, slots)] for r in planned for job in r]
    return [(number, overrides, slot_of(overrides, number, slots)) for number, overrides in enumerate(batch)]


def _config_and_round(overrides: list[str]) -> tuple[int, int]:
    env = dict(o.removeprefix("hydra.job.env_set.").split("=", 1) for o in overrides if o.startswith("hydra.job"))
    return int(env[channels.CONFIG_INDEX_ENV]), int(env[channels.ROUND_ENV])


@pytest.mark.parametrize(("configurations", "slots"), [(4, 4), (4, 2), (3, 4), (2, 3)])
def test_every_configuration_runs_on_more_than_one_gpu_slot_over_the_rounds(configurations, slots):
    jobs = _launch_list(configurations, rounds=5, slots=slots)
    seen: dict[int, set[int]] = {}
    for _, overrides, slot in jobs:
        config, round_number = _config_and_round(overrides)
        assert slot == replicates.gpu_slot(config, round_number, slots) < slots
        seen.setdefault(config, set()).add(slot)
    assert all(len(slots_seen) == min(slots, 5) for slots_seen in seen.values()), seen
    if configurations == slots:  # a round puts one job on each GPU
        by_round: dict[int, list[int]] = {}
        for _, overrides, slot in jobs:
            by_round.setdefault(_config_and_round(overrides)[1], []).append(slot)
        assert all(sorted(s) == list(range(slots)) for s in by_round.values())


def test_a_lane_runs_its_own_jobs_first_then_the_others_in_launch_order():
    jobs = [(n, [], n % 3) for n in range(7)]
    assert [n for n, _, _ in lane_order(jobs, 1)] == [1, 4, 0, 2, 3, 5, 6]


def _claim_in_child(slot, queue):
    from sweeplab.runtime import distributed

    queue.put((distributed.claim_gpus(1, slot=slot), distributed.claimed_slot(), os.environ["CUDA_VISIBLE_DEVICES"]))


def test_a_job_claims_the_gpu_of_its_slot_and_another_when_that_one_is_held(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    monkeypatch.setenv(channels.GPU_LOCK_DIR_ENV, str(tmp_path))
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    answers = []
    held = os.open(tmp_path / "gpu2.lock", os.O_RDWR | os.O_CREAT, 0o644)
    for hold in (False, True):
        if hold:  # another job holds GPU 2
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        child = context.Process(target=_claim_in_child, args=(2, queue))
        child.start()
        answers.append(queue.get(timeout=60))
        child.join(timeout=60)
    os.close(held)
    assert answers == [(["2"], 2, "2"), (["3"], 3, "3")]


def _record_job(number, overrides, log_dir, seconds):
    start = time.monotonic()
    time.sleep(seconds.get(number, 0.1))
    line = {"number": number, "gpu": os.environ["CUDA_VISIBLE_DEVICES"], "start": start, "end": time.monotonic(),
            "config_round": _config_and_round(overrides)}
    with open(Path(log_dir) / f"{number}.json", "w") as f:
        json.dump(line, f)
    return number


def _run_lanes(tmp_path, jobs, seconds, starts=(0.0, 0.0)) -> dict[int, dict]:
    """The lanes of `jobs` as forked processes (one per start delay, 2 slots, 1 GPU each), every job recorded by
    _record_job sleeping `seconds[number]`; the records by job number."""
    taken, logs = tmp_path / "taken", tmp_path / "logs"
    taken.mkdir()
    logs.mkdir()
    context = multiprocessing.get_context("fork")
    args = (jobs, str(taken), 1, 2, _record_job, (str(logs), seconds))
    lanes = [context.Process(target=_late_lane, args=(delay, *args)) for delay in starts]
    for lane in lanes:
        lane.start()
    for lane in lanes:
        lane.join(timeout=120)
        assert lane.exitcode == 0
    return {job["number"]: job for job in (json.loads(p.read_text()) for p in logs.glob("*.json"))}


def _gpus_of_configurations(ran: dict[int, dict]) -> dict[int, set[str]]:
    gpus_of: dict[int, set[str]] = {}
    for job in ran.values():
        gpus_of.setdefault(job["config_round"][0], set()).add(job["gpu"])
    return gpus_of


def test_lanes_start_the_next_round_without_waiting_for_the_rounds_slowest_job(monkeypatch, tmp_path):
    """Two pretend GPUs, two configurations, three rounds; round 0's job of configuration 0 is slow. The other lane
    goes on with its next rounds' jobs meanwhile (Hydra's per-round launch waited for the slow one first)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv(channels.GPU_LOCK_DIR_ENV, str(tmp_path / "locks"))
    jobs = _launch_list(2, rounds=3, slots=2)
    slow = next(n for n, o, _ in jobs if _config_and_round(o) == (0, 0))
    ran = _run_lanes(tmp_path, jobs, {slow: 3.0})
    assert sorted(ran) == [n for n, _, _ in jobs]  # every job once
    taken = tmp_path / "taken"
    assert sorted(p.name for p in taken.iterdir() if p.name.isdigit()) == sorted(str(n) for n, _, _ in jobs)
    other_lane = [job for n, job in ran.items() if n != slow and job["start"] < ran[slow]["end"]]
    assert len(other_lane) == len(jobs) - 1  # everything else ran while the slow job did: no round barrier
    assert {job["gpu"] for job in other_lane} == {"1"}
    assert ran[slow]["gpu"] == "0"


def test_a_gpu_sweep_job_records_its_gpu(monkeypatch, tmp_path):
    from sweeplab.engine import training
    from sweeplab.runtime import distributed

    monkeypatch.setattr(distributed, "_claim", distributed._Claim(["3"], [], 3))
    monkeypatch.setattr(training.naming, "config_key", lambda: "data.batch_size=16")

    class Plan:
        container = {"seed": 0}
        backend = "cuda"

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert training._replicate_record(Plan(), str(tmp_path)).gpu == "3"
    monkeypatch.setattr(distributed, "_claim", None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")  # SLURM's, or a user's: the launcher chose the GPU
    assert training._replicate_record(Plan(), str(tmp_path)).gpu == "5"
    Plan.backend = "cpu"
    assert training._replicate_record(Plan(), str(tmp_path)).gpu is None


def _late_lane(delay_s, *args):
    time.sleep(delay_s)
    run_lane(*args)


def test_the_first_worker_up_does_not_take_the_jobs_of_a_lane_still_starting(monkeypatch, tmp_path):
    """A worker comes up 2 s after the other (torch's import): the early one waits for it rather than run its jobs,
    so each configuration still runs on both GPUs."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv(channels.GPU_LOCK_DIR_ENV, str(tmp_path / "locks"))
    jobs = _launch_list(2, rounds=3, slots=2)
    ran = _run_lanes(tmp_path, jobs, {n: 1.0 for n, _, _ in jobs}, starts=(0.0, 2.0))
    assert len(ran) == len(jobs)
    assert _gpus_of_configurations(ran) == {0: {"0", "1"}, 1: {"0", "1"}}


@pytest.mark.slow  # ~1 min: 8 smoke jobs in two joblib workers
def test_a_replicated_gpu_sweep_rotates_each_configuration_over_the_gpus(demo_dir, mlflow_uri, tmp_path):
    from sweeplab.tracking import mlflow_store
    from test_sweeps_parallel import smoke, store_runs, sweep

    result = sweep(
        tmp_path, "-m", "hydra/launcher=joblib_gpus", *smoke(demo_dir, "data.batch_size=4,8"), "replicates=4",
        "trainer.max_steps=4", "trainer.val_check_interval=2",
        env={"CUDA_VISIBLE_DEVICES": "0,1", channels.GPU_LOCK_DIR_ENV: str(tmp_path / "gpu_locks")},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 GPU lanes" in result.stderr + result.stdout
    (parent,), _ = store_runs(mlflow_uri)
    children = mlflow_store.sweep_jobs(mlflow_uri, parent.info.run_id)  # the configuration runs left out
    assert len(children) == 8 and all(r.info.status == "FINISHED" for r in children)
    gpus_of: dict[str, set[str]] = {}
    for run in children:
        assert run.data.tags[JOB.gpu] == run.data.tags[JOB.cuda_visible_devices]
        assert run.data.tags[JOB.concurrent_jobs] == "2"
        gpus_of.setdefault(run.data.tags[JOB.config], set()).add(run.data.tags[JOB.gpu])
    assert len(gpus_of) == 2 and all(gpus == {"0", "1"} for gpus in gpus_of.values()), gpus_of
    assert not list(Path(tmp_path).rglob(".lanes-*"))  # the lanes' markers are gone


def test_lanes_on_gpus_past_the_first_still_rotate(monkeypatch, tmp_path):
    """Another sweep holds GPUs 0 and 1 of four: the two lanes get GPUs 2 and 3 and still split the slots."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    monkeypatch.setenv(channels.GPU_LOCK_DIR_ENV, str(tmp_path / "locks"))
    (tmp_path / "locks").mkdir()
    held = [os.open(tmp_path / "locks" / f"gpu{g}.lock", os.O_RDWR | os.O_CREAT, 0o644) for g in (0, 1)]
    for fd in held:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    jobs = _launch_list(2, rounds=2, slots=2)
    ran = _run_lanes(tmp_path, jobs, {n: 1.0 for n, _, _ in jobs})
    for fd in held:
        os.close(fd)
    assert _gpus_of_configurations(ran) == {0: {"2", "3"}, 1: {"2", "3"}}


def _pid_job(number, overrides, fail_number=None):
    if number == fail_number:
        raise ValueError(f"job {number}'s own error")
    time.sleep(0.5)  # each lane runs its own jobs (a lane done with its own would take the other's)
    return number, os.getpid(), os.environ.get("SWEEPLAB_TEST_SET_AFTER_WARM_UP")


@pytest.fixture
def fresh_warm_up(monkeypatch, tmp_path):
    """No warm-up of an earlier test, no pretend GPUs claimed in the test process's lock folder."""
    monkeypatch.setattr(joblib_lanes, "_warm_up", None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv(channels.GPU_LOCK_DIR_ENV, str(tmp_path / "locks"))
    yield
    if joblib_lanes._warm_up is not None:
        joblib_lanes._warm_up.join()


def _lanes(tmp_path, monkeypatch, modules, fail_number=None) -> dict:
    options = {"n_jobs": 2, "idle_worker_timeout": 30}
    joblib_lanes.warm_lanes(options, 1, modules)
    monkeypatch.setenv("SWEEPLAB_TEST_SET_AFTER_WARM_UP", "yes")  # as the sweep callback sets the parent run's id
    jobs = [(n, [], n % 2) for n in range(4)]
    taken = tmp_path / "taken"
    taken.mkdir()
    return joblib_lanes.launch_lanes(joblib_lanes._joblib_options(options), jobs, str(taken), 1, 2, _pid_job,
                                     (fail_number,))


def test_the_lanes_run_on_the_workers_the_warm_up_started(fresh_warm_up, monkeypatch, tmp_path):
    returns = _lanes(tmp_path, monkeypatch, ["json"])
    warmed = joblib_lanes._warm_up.join()
    assert len(set(warmed)) == 2  # one warm-up task per worker
    assert os.getpid() not in warmed
    assert sorted(returns) == [0, 1, 2, 3]
    assert {pid for _, pid, _ in returns.values()} == set(warmed)
    assert {seen for _, _, seen in returns.values()} == {"yes"}  # the main's environment after the workers started


def test_a_failed_warm_up_still_runs_the_jobs_and_a_jobs_error_is_its_own(fresh_warm_up, monkeypatch, tmp_path,
                                                                         caplog):
    returns = _lanes(tmp_path, monkeypatch, ["sweeplab_no_such_module"])
    assert joblib_lanes._warm_up.join() == []
    assert "warm-up failed (ModuleNotFoundError" in caplog.text
    assert sorted(returns) == [0, 1, 2, 3]
    (tmp_path / "taken").rename(tmp_path / "taken_before")
    with pytest.raises(ValueError, match="job 2's own error"):
        _lanes(tmp_path, monkeypatch, ["sweeplab_no_such_module"], fail_number=2)


def test_a_warmed_worker_holds_its_lanes_gpu_before_it_imports_anything(fresh_warm_up, monkeypatch, tmp_path):
    """What the warm-up imports (torch, Lightning) could start CUDA, which reads CUDA_VISIBLE_DEVICES once: each worker
    claims its lane's GPU first, so a module imported in the warm-up already sees one GPU, a different one per lane."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sweeplab_test_probe.py").write_text(
        "import os, pathlib\n"
        "pathlib.Path(os.environ['SWEEPLAB_TEST_PROBE_DIR'], str(os.getpid()))"
        ".write_text(os.environ.get('CUDA_VISIBLE_DEVICES', 'unset'))\n")
    (tmp_path / "seen").mkdir()
    monkeypatch.setenv("SWEEPLAB_TEST_PROBE_DIR", str(tmp_path / "seen"))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))  # loky's workers start with the parent's sys.path
    returns = _lanes(tmp_path, monkeypatch, ["sweeplab_test_probe"])
    warmed = joblib_lanes._warm_up.join()
    seen = {int(f.name): f.read_text() for f in (tmp_path / "seen").iterdir()}
    assert set(seen) == set(warmed) and sorted(seen.values()) == ["0", "1"], seen
    assert {pid for _, pid, _ in returns.values()} == set(warmed)
