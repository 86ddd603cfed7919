#!/bin/bash
# `make test-cluster`: the cluster tests (pytest -m cluster, tests/cluster/) against a real one-host SLURM with
# accounting and an MLflow server on PostgreSQL (scripts/cluster/start.sh installs and starts them), then stops
# everything it started, whatever ends it (its end, a failure, SIGTERM, Ctrl-C, its time limit): the tests and every
# process carrying this run's mark (SWEEPLAB_CLUSTER_RUN), the SLURM jobs they submitted (each works under
# $CLUSTER_DIR/tests, pytest's --basetemp), then the daemons (scripts/cluster/stop.sh). Needs root. LIMIT_S caps
# the tests (default 25 min).
set -euo pipefail
cd "$(dirname "$0")/.."
export CLUSTER_DIR=${CLUSTER_DIR:-/tmp/sweeplab-cluster}
trap 'trap - EXIT; trap "" TERM INT HUP; scripts/cluster/stop.sh' EXIT  # waited for, whatever signal comes next
trap 'exit 143' TERM
trap 'exit 130' INT
trap 'exit 129' HUP
started=$(date +%s)
scripts/cluster/start.sh
# shellcheck disable=SC1091
source "$CLUSTER_DIR/env"
echo "cluster: up in $(( $(date +%s) - started )) s"
SWEEPLAB_CLUSTER_RUN=${SWEEPLAB_CLUSTER_RUN:-$(date +%s)-$$-$RANDOM}
export SWEEPLAB_CLUSTER_RUN
# -s: the tests print what they measured (time to notice a cancel, time to exit after submitting); in the
# background, waited for, so that a signal stops the run at once; `timeout` leads the tests' process group
# shellcheck disable=SC2086
timeout "${LIMIT_S:-1500}" .venv/bin/python -m pytest -q -s -m cluster --durations=0 --basetemp "$CLUSTER_DIR/tests" \
  -p no:cacheprovider tests/cluster ${ARGS:-} &
echo "tests $!" >> "$CLUSTER_DIR/started-pids"
wait $!
echo "cluster: tests done in $(( $(date +%s) - started )) s"
