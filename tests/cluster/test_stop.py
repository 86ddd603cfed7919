"""`make test-cluster` stopped in the middle (SIGTERM to it, or to its whole process group as `.ci/run`'s `timeout`
does at its limit, or by its own `LIMIT_S`) leaves nothing behind: no SLURM job of it in `squeue` and no process of
it. A nested `scripts/test_cluster.sh` (what `make test-cluster` runs) with its own folder, on this run's daemons and
tracking server, runs one held study of one job (the test below it, selected by HOLD_ENV), and is stopped once that
job runs, or, at its `LIMIT_S`, with that job queued or running. (That the daemons and the tracking server a run started stop with it, `make test-cluster` itself shows:
the next run's start.sh finds nothing running.)"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from cluster.cluster_helpers import pause, slurm, squeue, start_sweep, tiny, wait_for

pytestmark = pytest.mark.cluster

HOLD_ENV = "SWEEPLAB_CLUSTER_HOLD"  # the job name of the held study: set only inside the nested run
# the nested run's own limit in the LIMIT_S case: its pytest starting, the held sweep starting and submitting its job
# took about 95 s at load 13-16 on this 2-core machine (the tests under nice 10)
NESTED_LIMIT_S = 150
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not os.environ.get(HOLD_ENV), reason="runs inside the nested make test-cluster below")
def test_a_held_study(cluster, experiment, demo_dir, tmp_path):
    sweep = start_sweep(tmp_path, [*slurm(cluster, os.environ[HOLD_ENV]), *tiny(demo_dir, experiment)],
                        cluster["uri"], pause(tmp_path, 1200))
    sweep.wait(1500)


def _marked(run: str) -> list[int]:
    """Processes whose environment carries the run's mark (scripts/test_cluster.sh exports it to its tests)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"SWEEPLAB_CLUSTER_RUN={run}".encode() in environ:
                found.append(int(entry.name))
    return found


@pytest.mark.parametrize("stop", ["SIGTERM to it", "SIGTERM to its process group", "its own LIMIT_S"],
                         ids=["to-it", "to-its-group", "its-limit"])
def test_make_test_cluster_stopped_at_any_moment_leaves_no_job_and_no_process(cluster, tmp_path, stop):
    name, run, nested = f"held-{uuid.uuid4().hex[:8]}", f"nested-{uuid.uuid4().hex[:8]}", tmp_path / "nested"
    # the SLURM daemons and the tracking server are this run's (start.sh starts nothing running already)
    env = {**os.environ, "CLUSTER_DIR": str(nested), "CLUSTER_REUSE_TRACKING": "1", "SWEEPLAB_CLUSTER_RUN": run,
           HOLD_ENV: name, "ARGS": "-k test_a_held_study"}
    if stop == "its own LIMIT_S":
        env["LIMIT_S"] = str(NESTED_LIMIT_S)
    made = subprocess.Popen(["scripts/test_cluster.sh"], cwd=ROOT, env=env, start_new_session=True, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        if stop == "its own LIMIT_S":  # nothing sent: its `timeout` ends the tests, with the held job out
            seen = wait_for(lambda: squeue(name, "PD,R") or made.poll() is not None, NESTED_LIMIT_S + 60,
                            "the held study's job to be queued")
            assert seen is not True, f"the nested run ended before its held job was queued (LIMIT_S={NESTED_LIMIT_S})"
        else:
            wait_for(lambda: squeue(name, "R"), 600, "a job of the nested run to start")
            wait_for(lambda: len(_marked(run)) >= 3, 60, "the job's own processes")  # pytest, the sweep, the job
            if stop == "SIGTERM to it":
                made.send_signal(signal.SIGTERM)
            else:
                os.killpg(made.pid, signal.SIGTERM)
        output, _ = made.communicate(timeout=NESTED_LIMIT_S + 300)
    finally:
        if made.poll() is None:  # failed above: stopped as `timeout` would, its cleanup let finish, its output shown
            os.killpg(made.pid, signal.SIGTERM)
            try:
                print(made.communicate(timeout=300)[0][-3000:])
            finally:
                if made.poll() is None:
                    os.killpg(made.pid, signal.SIGKILL)
    print(f"{stop}: stopped with {made.returncode}")
    if stop == "its own LIMIT_S":
        assert made.returncode == 124 and "cluster: tests done" not in output, output[-3000:]  # timeout's status
    else:
        assert made.returncode != 0, output[-3000:]
    assert "cancelling the run's SLURM jobs" in output, output[-3000:]
    assert squeue(name, "PD,R,CG,CF,S") == [], output[-3000:]
    assert _marked(run) == [], output[-3000:]
    assert not (nested / "started-pids").exists()
