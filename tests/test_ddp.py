"""Lightning DDP under Hydra: ranks > 0 re-create their one job (not the whole sweep), only rank 0 records it.

On the CPU with gloo: `backend=cpu trainer.devices=2` starts a second process per job.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict

from conftest import compose_train
from sweeplab.core.errors import UserError
from sweeplab.runtime import distributed
from test_sweeps_parallel import assert_one_sweep, smoke, store_runs, sweep

DDP = ["trainer.devices=2", "trainer.max_steps=6", "trainer.val_check_interval=3"]


# --- rank 0 and the job's throughput ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("env", "zero"),
    [({}, True), ({"LOCAL_RANK": "0", "NODE_RANK": "0"}, True), ({"LOCAL_RANK": "1"}, False), ({"RANK": "3"}, False),
     ({"SLURM_PROCID": "1"}, False), ({"NODE_RANK": "1", "LOCAL_RANK": "0"}, False)],
)
def test_rank_zero_is_known_from_the_environment_before_any_trainer(monkeypatch, env, zero):
    for key in distributed.RANK_ENV_VARS:
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert distributed.is_global_zero() is zero


def test_job_throughput_is_rank_zeros_times_the_world_size():
    summary = {"summary/tokens_per_sec": 100.0, "summary/samples_per_sec": 4.0, "summary/step_time_s_median": 0.5}
    out = distributed.job_summary(summary, 2)
    assert out["summary/tokens_per_sec"] == 200.0 and out["summary/tokens_per_sec_per_device"] == 100.0
    assert out["summary/samples_per_sec"] == 8.0 and out["summary/step_time_s_median"] == 0.5
    assert out["summary/world_size"] == 2.0
    assert distributed.job_summary(summary, 1) == {**summary, "summary/world_size": 1.0}


# --- the relaunch command -------------------------------------------------------------------------------
@pytest.fixture
def as_sweep_job(tmp_path):
    """Pretend to be inside job 3 of a joblib sweep (HydraConfig is process-global: reset afterwards)."""
    yield lambda overrides: _as_sweep_job(tmp_path, overrides)
    HydraConfig.instance().cfg = None


def _as_sweep_job(tmp_path: Path, overrides: list[str]):
    cfg = compose_train(overrides, return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(tmp_path / "multirun" / "day" / "time" / "3")
        cfg.hydra.runtime.cwd = str(tmp_path)
        cfg.hydra.job.name = "train"
        cfg.hydra.overrides.hydra = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "hydra.job.chdir=false"]
    HydraConfig.instance().set_config(cfg)
    return cfg


def test_a_child_rank_is_started_as_its_own_job_not_the_sweep(as_sweep_job, tmp_path):
    as_sweep_job(["data.batch_size=8", "trainer.devices=2", "backend=cpu"])
    command, cwd = distributed.relaunch_command(local_rank=1)
    assert command[:3] == [sys.executable, "-m", "sweeplab.train"] and "-m" not in command[3:]
    assert {"data.batch_size=8", "trainer.devices=2", "backend=cpu"} <= set(command)  # this job's overrides
    assert f"hydra.run.dir={tmp_path}/multirun/day/time/3" in command  # the job's own dir: no ${now:} re-resolved
    assert "hydra.mode=RUN" in command and "hydra.output_subdir=null" in command
    assert "hydra.job.chdir=false" in command  # the job's own Hydra settings travel
    assert not any("launcher" in part for part in command)  # the sweep's do not
    assert cwd == str(tmp_path)


def test_lightning_uses_the_job_command(as_sweep_job):
    from lightning.fabric.strategies.launchers import subprocess_script as fabric_launcher
    from lightning.pytorch.strategies.launchers import subprocess_script as trainer_launcher

    as_sweep_job(["data.batch_size=8"])
    options = distributed.trainer_options(2)
    assert options["use_distributed_sampler"] is False and type(options["strategy"]).__name__ == "CurrentStreamDDP"
    assert distributed.trainer_options(1)["strategy"] == "auto"
    for launcher in (fabric_launcher, trainer_launcher):  # private API: lightning is pinned; this guards it
        command, _ = launcher._hydra_subprocess_cmd(local_rank=1)
        assert "hydra.mode=RUN" in command and "data.batch_size=8" in command


def test_a_job_leaves_no_rendezvous_behind_for_the_next_one(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    before = distributed.launch_env()
    monkeypatch.setenv("LOCAL_RANK", "0")  # what Lightning's launcher sets in the main process
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    distributed.end_job(before)
    assert "LOCAL_RANK" not in os.environ and os.environ["MASTER_ADDR"] == "10.0.0.1"


# --- one GPU per parallel job ---------------------------------------------------------------------------
CLAIM = """
import sys, time
from pathlib import Path
from sweeplab.runtime import distributed
print(",".join(distributed.claim_gpus(int(sys.argv[2]), Path(sys.argv[1]), wait_s=float(sys.argv[3]), poll_s=0.1)), flush=True)
time.sleep(float(sys.argv[4]))
"""


def test_parallel_jobs_take_different_gpus_and_wait_when_none_is_free(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0,1"}
    locks = str(tmp_path / "locks")

    def claim(count, wait_s, hold_s):
        return subprocess.Popen([sys.executable, "-c", CLAIM, locks, str(count), str(wait_s), str(hold_s)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    first, second = claim(1, 30, 3), claim(1, 30, 3)
    ids = {first.stdout.readline().strip(), second.stdout.readline().strip()}
    assert ids == {"0", "1"}
    late = claim(2, 30, 0)  # both GPUs: waits until the first two jobs end
    assert late.wait(timeout=60) == 0 and late.stdout.read().strip() == "0,1"
    busy = claim(1, 0.5, 0)
    first.wait(timeout=30), second.wait(timeout=30)
    assert busy.wait(timeout=30) == 0  # freed meanwhile
    too_many = subprocess.run([sys.executable, "-c", CLAIM, locks, "3", "1", "0"], capture_output=True, text=True, env=env)
    assert too_many.returncode != 0 and "trainer.devices" in too_many.stderr


def test_claiming_more_gpus_than_visible_is_a_user_error(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setattr(distributed, "_claim", None)
    with pytest.raises(UserError, match="needs 2 GPU"):
        distributed.claim_gpus(2, tmp_path)


# --- end to end on the CPU (gloo) --------------------------------------------------------------------------
@pytest.mark.slow  # ~20 s; the unit tests above cover the DDP plumbing
def test_ddp_multirun_records_one_run_per_job_and_one_sweep(demo_dir, mlflow_uri, tmp_path):
    result = sweep(tmp_path, "-m", "backend=cpu", *smoke(demo_dir, "data.batch_size=8,16", *DDP))
    assert result.returncode == 0, result.stderr[-3000:]
    parent, children = assert_one_sweep(mlflow_uri, 2)  # not one per rank, not a second sweep per child
    assert all(r.data.metrics["summary/world_size"] == 2 for r in children)
    (sweep_dir,) = (tmp_path / "multirun").glob("*/*")  # the children did not start sweeps of their own
    assert not (tmp_path / "outputs").exists()  # nor single runs elsewhere
    for job in ("0", "1"):
        assert (sweep_dir / job / "train_rank1.log").exists()  # rank 1 ran inside its job's dir
        assert (sweep_dir / job / "checkpoints" / "last.ckpt").exists()


@pytest.mark.slow
def test_ddp_single_run_records_one_run_without_parent(demo_dir, mlflow_uri, tmp_path):
    result = sweep(tmp_path, "backend=cpu", *smoke(demo_dir, "data.batch_size=8", *DDP))
    assert result.returncode == 0, result.stderr[-3000:]
    parents, (run,) = store_runs(mlflow_uri)
    assert parents == [] and "mlflow.parentRunId" not in run.data.tags
    assert run.info.status == "FINISHED" and run.data.metrics["summary/world_size"] == 2
    (run_dir,) = (tmp_path / "outputs").glob("*/*")
    assert (run_dir / "train_rank1.log").exists() and not (tmp_path / "multirun").exists()


# --- the resumable sampler under DDP ----------------------------------------------------------------------
@pytest.mark.parametrize(("num_samples", "drop_last"), [(40, True), (41, True), (5, False)])
def test_ranks_split_every_global_batch_and_share_the_sampler_state(monkeypatch, num_samples, drop_last):
    from sweeplab.data.sampling import ResumableShuffleBatchSampler as Sampler

    single = list(Sampler(num_samples, 8, seed=1, drop_last=drop_last))
    ranks = []
    for rank in (0, 1):
        monkeypatch.setattr(Sampler, "shard", staticmethod(lambda rank=rank: (2, rank)))
        sampler = Sampler(num_samples, 4, seed=1, drop_last=drop_last)  # 4 per device: the same global batch of 8
        ranks.append((list(sampler), sampler.state_dict()))
    (batches_0, state_0), (batches_1, state_1) = ranks
    assert len(batches_0) == len(batches_1) == len(single) and state_0 == state_1  # lock step, one state
    for b0, b1, whole in zip(batches_0, batches_1, single):
        assert b0 and b1  # no rank ever gets an empty batch
        if len(whole) >= 2:
            assert sorted(b0 + b1) == sorted(whole) and not set(b0) & set(b1)
