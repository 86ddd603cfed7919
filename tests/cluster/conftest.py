"""The cluster tests' world: a real one-host SLURM with accounting and an MLflow server on PostgreSQL, started by
scripts/cluster/start.sh (`make test-cluster`), which exports where they are. Every study here is tiny (debug=smoke
on the session's small demo data, one CPU per job: the node runs two at once) and is judged from the MLflow store."""

from __future__ import annotations

import os
import socket
import uuid

import pytest

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
