#!/bin/bash
# `make test-cluster`: the cluster tests (pytest -m cluster, tests/cluster/) against a real one-host SLURM with
# accounting and an MLflow server on PostgreSQL (scripts/cluster/start.sh installs and starts them), then stops
# everything it started, whatever happens (trap on exit). Needs root. LIMIT_S caps the whole run (default 25 min).
set -euo pipefail
cd "$(dirname "$0")/.."
export CLUSTER_DIR=${CLUSTER_DIR:-/tmp/sweeplab-cluster}
trap 'scripts/cluster/stop.sh' EXIT
started=$(date +%s)
scripts/cluster/start.sh
# shellcheck disable=SC1091
source "$CLUSTER_DIR/env"
echo "cluster: up in $(( $(date +%s) - started )) s"
# -s: the tests print what they measured (time to notice a cancel, time to exit after submitting)
timeout "${LIMIT_S:-1500}" .venv/bin/python -m pytest -q -s -m cluster tests/cluster ${ARGS:-}
echo "cluster: tests done in $(( $(date +%s) - started )) s"
