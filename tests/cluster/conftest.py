"""The cluster tests' world: a real one-host SLURM with accounting and an MLflow server on PostgreSQL, started by
scripts/cluster/start.sh (`make test-cluster`), which exports where they are. Every study here is tiny (debug=smoke
on the session's small demo data, one CPU per job: the node runs two at once) and is judged from the MLflow store."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import uuid

import pytest

from cluster import cluster_helpers

TRACKING_ENV = "SWEEPLAB_CLUSTER_TRACKING_URI"


@pytest.fixture(scope="session")
def cluster() -> dict[str, str]:
    if not os.environ.get(TRACKING_ENV):
        pytest.skip("needs the one-host SLURM and tracking server: run `make test-cluster` (as root)")
    return {"uri": os.environ[TRACKING_ENV], "partition": os.environ.get("SWEEPLAB_CLUSTER_PARTITION", "debug"),
            "postgres": os.environ.get("SWEEPLAB_CLUSTER_POSTGRES_URI", ""),
            "node": socket.gethostname().split(".")[0]}  # the one node (start.sh names it `hostname -s`)


@pytest.fixture
def experiment() -> str:
    """An experiment of the test's own on the shared server."""
    return f"cluster-{uuid.uuid4().hex[:8]}"


@pytest.fixture(autouse=True)
def nothing_left(tmp_path):
    """A test that fails half-way leaves no sweep running and no job of it queued for the next test."""
    yield
    for process in cluster_helpers.started:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
    cluster_helpers.started.clear()
    left = cluster_helpers.jobs_under(tmp_path) if shutil.which("squeue") else []
    if left:
        subprocess.run(["scancel", *left], capture_output=True)
