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
