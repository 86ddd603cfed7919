#!/bin/bash
# Stop what start.sh started, by the pids it recorded in $CLUSTER_DIR/started-pids (never by name), newest first;
# anything that was running before start.sh is left running.
CLUSTER_DIR=${CLUSTER_DIR:-/tmp/sweeplab-cluster}
PIDS=$CLUSTER_DIR/started-pids
[ -f "$PIDS" ] || exit 0
stop_pid() {  # TERM, then KILL after 20 s
  kill -0 "$1" 2>/dev/null || return 0
  kill "$1" 2>/dev/null
  for _ in $(seq 1 40); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.5; done
  kill -9 "$1" 2>/dev/null
}
tac "$PIDS" | while read -r name pid; do
  case "$name" in
    mlflow-server) kill -TERM -- -"$pid" 2>/dev/null; stop_pid "$pid" ;;
    postgres-cluster) pg_ctlcluster ${pid%/*} ${pid#*/} stop 2>/dev/null ;;
    *) stop_pid "$pid" ;;
  esac
done
rm -f "$PIDS"
