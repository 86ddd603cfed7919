#!/bin/bash
# Stop what a `make test-cluster` run started, whatever stopped it (its end, an error, SIGTERM, its time limit):
# 1. its tests: the process group of the pytest that scripts/test_cluster.sh recorded as "tests <pgid>" (TERM, then
#    KILL after 10 s: a sweep retrying a tracking server may not end on TERM);
# 2. its SLURM jobs: every job whose working directory is under $CLUSTER_DIR (the tests' --basetemp), cancelled and
#    waited for until squeue no longer lists them;
# 3. any process left that carries the run's mark (SWEEPLAB_CLUSTER_RUN in its environment: the tests, their sweeps,
#    the jobs' processes), TERM then KILL;
# 4. the daemons start.sh started, by the pids it recorded in $CLUSTER_DIR/started-pids (never by name), newest
#    first; anything that was running before start.sh is left running.
# The cleanup finishes whatever signal stopped the run: a make stopped by `timeout` was seen to signal its group
# again while this ran (killing it half-way, every daemon, job and sweep left running).
trap '' TERM INT HUP
CLUSTER_DIR=${CLUSTER_DIR:-/tmp/sweeplab-cluster}
PIDS=$CLUSTER_DIR/started-pids
RUN=${SWEEPLAB_CLUSTER_RUN:-}
[ -f "$PIDS" ] || [ -n "$RUN" ] || exit 0
touch "$PIDS"

stop_pid() {  # TERM, then KILL after 20 s
  kill -0 "$1" 2>/dev/null || return 0
  kill "$1" 2>/dev/null
  for _ in $(seq 1 40); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.5; done
  kill -9 "$1" 2>/dev/null
}
stop_group() {  # the process group $1: TERM, then KILL after ${2:-10} s
  kill -TERM -- -"$1" 2>/dev/null || return 0
  for _ in $(seq 1 $(( ${2:-10} * 2 ))); do kill -0 -- -"$1" 2>/dev/null || return 0; sleep 0.5; done
  kill -KILL -- -"$1" 2>/dev/null
}
parent_of() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f2; }
marked() {  # pids carrying the run's mark, but this script, its callers and its own subshells
  local skip=" $$ " p=$$ d pid
  while [ -n "$p" ] && [ "$p" -gt 1 ]; do p=$(parent_of "$p"); skip+="$p "; done
  for d in /proc/[0-9]*; do
    pid=${d#/proc/}
    case "$skip" in *" $pid "*) continue ;; esac
    [ "$(parent_of "$pid")" = "$$" ] && continue
    tr '\0' '\n' 2>/dev/null < "$d/environ" | grep -qxF "SWEEPLAB_CLUSTER_RUN=$RUN" && echo "$pid"
  done
}
run_jobs() {  # ids of the SLURM jobs working under $CLUSTER_DIR (squeue's %Z: the job's working directory); squeue
  # asked again for up to 30 s while it fails (at load 13-16 a call failed while the controller was busy: read as
  # "no job", the run's jobs were left queued)
  command -v squeue >/dev/null || return 0
  local out="" _
  for _ in $(seq 1 30); do out=$(squeue -h -o "%i %Z" 2>/dev/null) && break; sleep 1; done
  awk -v dir="$CLUSTER_DIR/" 'index($2 "/", dir) == 1 {print $1}' <<<"$out"
}

# 1. the tests
grep '^tests ' "$PIDS" | while read -r _ pgid; do stop_group "$pgid"; done
# 2. their jobs (SLURM sends them SIGTERM, then SIGKILL after KillWait)
jobs=$(run_jobs)
if [ -n "$jobs" ]; then
  echo "cluster: cancelling the run's SLURM jobs: $(echo $jobs)"
  # shellcheck disable=SC2086
  scancel $jobs 2>/dev/null
  for _ in $(seq 1 120); do [ -z "$(run_jobs)" ] && break; sleep 1; done
  [ -z "$(run_jobs)" ] || echo "cluster: still queued after 2 minutes: $(echo $(run_jobs))" >&2
fi
# 3. any process of the run left
if [ -n "$RUN" ]; then
  left=$(marked)
  if [ -n "$left" ]; then
    echo "cluster: ending the run's processes left: $(echo $left)"
    # shellcheck disable=SC2086
    kill -TERM $left 2>/dev/null
    for _ in $(seq 1 20); do [ -z "$(marked)" ] && break; sleep 0.5; done
    left=$(marked)
    # shellcheck disable=SC2086
    [ -z "$left" ] || kill -KILL $left 2>/dev/null
  fi
fi
# 4. the daemons
tac "$PIDS" | while read -r name pid; do
  case "$name" in
    tests) ;;
    mlflow-server) stop_group "$pid" 20 ;;  # its own group (setsid): the server, its workers, their job runners
    postgres-cluster) pg_ctlcluster "${pid%/*}" "${pid#*/}" stop 2>/dev/null ;;
    *) stop_pid "$pid" ;;
  esac
done
rm -f "$PIDS"
