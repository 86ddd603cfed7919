#!/bin/bash
# A one-host SLURM 22.05 with accounting (munge, MariaDB, slurmdbd, slurmctld, slurmd) and an MLflow tracking server
# on PostgreSQL, from Debian bookworm's packages, as root, on 127.0.0.1: what `make test-cluster` runs its tests on.
# Installs the packages when missing (idempotent), starts only what is not running yet, and records what it started
# as "name pid" lines in $CLUSTER_DIR/started-pids (stop.sh stops those, by pid, and nothing else). The tracking
# server gets a fresh database each start. Prints the variables the tests read (sourced by scripts/test_cluster.sh).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CLUSTER_DIR=${CLUSTER_DIR:-/tmp/sweeplab-cluster}
PIDS=$CLUSTER_DIR/started-pids
MLFLOW_PORT=${MLFLOW_PORT:-5055}
PG_DB=${PG_DB:-sweeplab_cluster}
PY=${PY:-$ROOT/.venv/bin/python}
mkdir -p "$CLUSTER_DIR" && touch "$PIDS"
[ "$(id -u)" = 0 ] || { echo "error: scripts/cluster/start.sh needs root (it starts SLURM's daemons and PostgreSQL)" >&2; exit 2; }

PACKAGES="slurmctld slurmd slurm-client munge slurmdbd mariadb-server postgresql"
# shellcheck disable=SC2086
"$HERE/install.sh" $PACKAGES | tee "$CLUSTER_DIR/install.log"  # waits for another apt-get or dpkg to finish
installed=$(grep -q "^cluster: installing" "$CLUSTER_DIR/install.log" && echo 1 || true)

started() { echo "$1 $2" >> "$PIDS"; }
host=$(hostname -s)
cpus=$(nproc)
mem_mb=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
# written beside it and renamed: every squeue and sbatch reads it, and a run nested in another's tests (their daemons
# running) starts here; written in place, a squeue at that moment failed on an empty file, and a kill then left it so
sed "s/@HOST@/$host/g; s/@CPUS@/$cpus/; s/@MEM_MB@/$mem_mb/" "$HERE/slurm.conf.in" > /etc/slurm/.slurm.conf.new
mv -f /etc/slurm/.slurm.conf.new /etc/slurm/slurm.conf
install -m 600 "$HERE/slurmdbd.conf" /etc/slurm/slurmdbd.conf
mkdir -p /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge /var/lib/munge /var/log/munge

# munge (the Debian package made /etc/munge/munge.key)
chown munge:munge /run/munge /var/lib/munge /var/log/munge /etc/munge/munge.key
# (a daemon the package installation above started, as munge's does, is one this script started)
if [ -n "$installed" ]; then for pid in $(pgrep -x munged); do started munged "$pid"; done; fi
if ! pgrep -x munged >/dev/null; then runuser -u munge -- /usr/sbin/munged; sleep 1; started munged "$(pgrep -n -x munged)"; fi
# MariaDB for slurmdbd, on 127.0.0.1 only
if ! pgrep -x mariadbd >/dev/null; then
  mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
  (runuser -u mysql -- /usr/sbin/mariadbd --bind-address=127.0.0.1 --skip-networking=0 >/var/log/slurm/mariadb.log 2>&1 &)
  for _ in $(seq 1 30); do mysqladmin ping >/dev/null 2>&1 && break; sleep 1; done
  started mariadbd "$(pgrep -x mariadbd)"
fi
mysql -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurmpw'; CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurmpw'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
# the SLURM daemons: accounting first (submitit reads job states with sacct), then the controller and the node
if ! pgrep -x slurmdbd >/dev/null; then
  /usr/sbin/slurmdbd
  for _ in $(seq 1 30); do sacctmgr -n show cluster >/dev/null 2>&1 && break; sleep 1; done
  started slurmdbd "$(cat /run/slurmdbd.pid)"
fi
sacctmgr -i add cluster onehost >/dev/null 2>&1 || true
if ! pgrep -x slurmctld >/dev/null; then /usr/sbin/slurmctld; sleep 2; started slurmctld "$(cat /run/slurmctld.pid)"; fi
if ! pgrep -x slurmd >/dev/null; then /usr/sbin/slurmd; sleep 2; started slurmd "$(cat /run/slurmd.pid)"; fi
scontrol update nodename="$host" state=resume 2>/dev/null || true
for _ in $(seq 1 30); do sinfo -h -o %t | grep -q -E "^(idle|mix|alloc)" && break; sleep 1; done
sinfo
timeout 60 srun -N1 -n1 hostname >/dev/null

# PostgreSQL and the tracking server on it (a fresh database each start); CLUSTER_REUSE_TRACKING=1: the one this
# environment names already (SWEEPLAB_CLUSTER_TRACKING_URI, ..._POSTGRES_URI: a run nested in another's tests)
if [ -n "${CLUSTER_REUSE_TRACKING:-}" ]; then
  echo "cluster: SLURM on $host, MLflow at $SWEEPLAB_CLUSTER_TRACKING_URI (reused)"
  cat > "$CLUSTER_DIR/env" <<ENV
export SWEEPLAB_CLUSTER_TRACKING_URI=$SWEEPLAB_CLUSTER_TRACKING_URI
export SWEEPLAB_CLUSTER_POSTGRES_URI=${SWEEPLAB_CLUSTER_POSTGRES_URI:-}
export SWEEPLAB_CLUSTER_PARTITION=debug
ENV
  exit 0
fi
if ! pg_ctlcluster 15 main status >/dev/null 2>&1; then pg_ctlcluster 15 main start; started postgres-cluster 15/main; fi
runuser -u postgres -- psql -q -tc "SELECT 1 FROM pg_roles WHERE rolname='mlflow'" | grep -q 1 || \
  runuser -u postgres -- psql -q -c "CREATE USER mlflow WITH PASSWORD 'mlflowpw';"
runuser -u postgres -- psql -q -c "DROP DATABASE IF EXISTS $PG_DB;" -c "CREATE DATABASE $PG_DB OWNER mlflow;"
PG_URI="postgresql://mlflow:mlflowpw@127.0.0.1:5432/$PG_DB"
if curl -s -o /dev/null "http://127.0.0.1:$MLFLOW_PORT/"; then
  echo "error: port $MLFLOW_PORT is taken (another MLflow server? scripts/cluster/stop.sh stops the one this started); set MLFLOW_PORT" >&2
  exit 1
fi
rm -rf "$CLUSTER_DIR/artifacts"
# the server as users run it: `postgresql://` as written (psycopg 3, installed with sweeplab's dev extra); uvicorn's
# supervisor kills a worker that does not answer its health check in 5 s, which at load 16 on 2 cores restarted them
# for minutes (the server took 4 minutes to answer): 120 s
setsid "$(dirname "$PY")/mlflow" server --host 127.0.0.1 --port "$MLFLOW_PORT" --workers 2 \
  --uvicorn-opts "--timeout-worker-healthcheck 120" \
  --backend-store-uri "$PG_URI" --serve-artifacts --artifacts-destination "$CLUSTER_DIR/artifacts" \
  >"$CLUSTER_DIR/mlflow-server.log" 2>&1 &
started mlflow-server $!
for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$MLFLOW_PORT/health" >/dev/null && break; sleep 1; done
curl -sf "http://127.0.0.1:$MLFLOW_PORT/health" >/dev/null || { echo "error: the MLflow server did not start; see $CLUSTER_DIR/mlflow-server.log" >&2; tail -20 "$CLUSTER_DIR/mlflow-server.log" >&2; exit 1; }
echo "cluster: SLURM on $host, MLflow at http://127.0.0.1:$MLFLOW_PORT on $PG_URI"
cat > "$CLUSTER_DIR/env" <<ENV
export SWEEPLAB_CLUSTER_TRACKING_URI=http://127.0.0.1:$MLFLOW_PORT
export SWEEPLAB_CLUSTER_POSTGRES_URI=$PG_URI
export SWEEPLAB_CLUSTER_PARTITION=debug
ENV
