"""The sweeplab sweeper's SLURM path without a cluster (tests/cluster has the real one): what a job SLURM runs again
resumes, which overrides the continue command keeps, and that what submitit pickles can be pickled mid-sweep."""

from __future__ import annotations

import cloudpickle

from conftest import compose_train
from sweeplab.core.files import hold_run_lock
from sweeplab.sweep.callback import MLflowSweepCallback
from sweeplab.sweep.slurm import resumed_overrides
from sweeplab.sweep.study import Study
from sweeplab.tracking import naming


def test_a_job_run_again_resumes_its_own_folder_only_when_it_holds_a_last_checkpoint(tmp_path):
    job = ["data.batch_size=8", "seed=1", "resume=false"]
    assert resumed_overrides(job, tmp_path) == job  # requeued before its first checkpoint: starts afresh
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"x")
    assert resumed_overrides(job, tmp_path) == ["data.batch_size=8", "seed=1", f"resume={tmp_path}"]
    continued = ["data.batch_size=8", "resume=true"]  # a continued study's job finds its interrupted run itself
    assert resumed_overrides(continued, tmp_path) == continued


def test_the_continue_command_keeps_the_launcher_and_its_settings_and_nothing_of_hydras_own(tmp_path):
    hydra = ["hydra.mode=MULTIRUN", "hydra/launcher=slurm", "hydra.launcher.partition=gpu",
             "hydra.launcher.timeout_min=60", f"hydra.sweep.dir={tmp_path}", "hydra.verbose=true",
             "hydra.sweeper.leave=true"]  # the continue command of a study left running watches it: it stays
    kept = naming.launcher_overrides(hydra)
    assert kept == ["hydra/launcher=slurm", "hydra.launcher.partition=gpu", "hydra.launcher.timeout_min=60"]
    command = naming.continue_command(["data.batch_size=8,16"], tmp_path, kept)
    assert command.split()[3:7] == ["-m", *kept] and command.endswith("resume=true")


def test_a_study_pickles_while_it_holds_the_sweep_folder(tmp_path):
    """submitit pickles the launcher with Hydra's context, callbacks (and the study one opened) included, at every
    submission; the sweep folder's lock stays with the process holding it."""
    study = Study(compose_train([f"hydra.sweep.dir={tmp_path}"], return_hydra_config=True))
    study.continue_command = "python -m sweeplab.train -m resume=true"
    callback = MLflowSweepCallback()
    callback.study = study
    with hold_run_lock(tmp_path, "sweep", "run"):
        (tmp_path / "held").mkdir()
        study._held.enter_context(hold_run_lock(tmp_path / "held", "sweep", "run"))
        copy = cloudpickle.loads(cloudpickle.dumps(callback))
        study._held.close()
    assert copy.study.continue_command == study.continue_command


def test_a_job_read_as_ended_but_queued_again_is_still_watched(tmp_path):
    """submitit's requeue at a job's time limit: its step reads FAILED (srun exit 255) while SLURM queues the same id
    PENDING again; the watch read that FAILED as the job's end and lost a job that went on to run (the cluster suite's
    time-limit case). Still queued: watched on; COMPLETING: its end read once it has left the queue."""
    from types import SimpleNamespace

    from sweeplab.sweep import slurm

    class SlurmJob:  # the watch tells submitit's SLURM jobs by their class name
        def __init__(self, job_id, state):
            self.job_id, self.state = job_id, state
            self.paths = SimpleNamespace(result_pickle=tmp_path / f"{job_id}_result.pkl")
            self.watcher = SimpleNamespace(_finished={job_id})
            self.asked = 0

        def done(self, force_check=False):
            self.asked += 1
            return False  # asked afresh: running again

    timed_out = SlurmJob("126", "FAILED")
    assert slurm.requeued(timed_out, {"126": "PENDING"})
    assert slurm.requeued(timed_out, {"126": "RUNNING"})
    assert slurm.requeued(timed_out, {}) and timed_out.asked == 1  # left the queue: its end asked afresh
    assert "126" not in timed_out.watcher._finished
    ending = SlurmJob("127", "CANCELLED")
    assert slurm.requeued(ending, {"127": "COMPLETING"}) and ending.asked == 0
    assert not slurm.requeued(ending, {})  # gone: its end stands
    ran = SlurmJob("128", "COMPLETED")
    ran.paths.result_pickle.write_bytes(b"")
    assert not slurm.requeued(ran, {"128": "COMPLETING"})  # a result: ended
