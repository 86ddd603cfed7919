"""The cluster path run locally: Hydra's submitit launcher (`submitit_local`) runs each job as its own process, the
way `hydra/launcher=slurm` does on a cluster; the jobs find the sweep's parent run and the store."""

from __future__ import annotations

import pytest

from test_sweeps_parallel import assert_one_sweep, smoke, sweep


@pytest.mark.slow  # the default suite's time budget; `make test-all` runs it
def test_submitit_local_sweep_nests_every_job_under_one_parent(demo_dir, mlflow_uri, tmp_path):
    result = sweep(
        tmp_path, "-m", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10",
        *smoke(demo_dir, "data.batch_size=8,16", "trainer.max_steps=6", "trainer.val_check_interval=3"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    parent, children = assert_one_sweep(mlflow_uri, 2)
    assert parent.data.tags["launcher"] == "submitit_local"
    assert all("objective" in r.data.metrics for r in children)  # on_job_end ran in the submitit job's process
    (sweep_dir,) = (tmp_path / "multirun").glob("*/*")
    assert len(list((sweep_dir / ".submitit").glob("*/*_result.pkl"))) == 2
