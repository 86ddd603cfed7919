#!/bin/bash
# Issue 62's measurements on a host with one GPU: a CUDA study's default launcher (hydra/launcher=joblib_gpus with
# lanes_per_gpu=auto: jobs side by side on the GPU, chosen from a probe) against one job at a time
# (hydra/launcher=basic), each pair measured in one call; each part fits a 9-minute device call:
#
#   bash scripts/lanes_gpu.sh 1   # the 1,000-step study (20 jobs) packed then one at a time (goal >= 3x, same
#                                 # verdict); an A/A study packed (two identical configurations x 5: a tie)
#   bash scripts/lanes_gpu.sh 2   # the 100-step default study packed then one at a time (goal >= 2x); the paGating
#                                 # small study with the default launcher (not packed, no slower than 129 s on an
#                                 # H200; PG_BASELINE=1 also runs it one at a time, beside it)
#   DRY=1 bash scripts/lanes_gpu.sh 1   # print the commands only
#   BACKEND=cpu EXTRA="debug=smoke" bash scripts/lanes_gpu.sh 1   # the plumbing on a CPU (no packing there)
#
# Time limits per study add up to 540 s a part (typically: part 1 ~100 + ~270 + ~45 s, part 2 ~40 + ~45 + ~100 +
# ~160 s on an H200); PG_BASELINE=1 adds up to 200 s to part 2, beyond a 9-minute call. The packed side runs first: the freshly started machine's cold file cache slows it, not the baseline. Each study
# runs in its own sweep folder under $WORK (default /tmp/lanes-gpu) with one MLflow store; its process wall time
# goes to $WORK/walls.txt; each part ends with every study's wall time, the lanes choice line and the verdict lines
# (scripts/study_cost.py: the wall breakdown, the steps' share, the verdict). Logs go to $OUT when set (the device
# tool's output folder), else $WORK.
set -u
PART=${1:-${PART:-}}
WORK=${WORK:-/tmp/lanes-gpu}
LOGS=${OUT:-$WORK}
mkdir -p "$WORK" "$LOGS"
export MLFLOW_TRACKING_URI=${MLFLOW_TRACKING_URI:-sqlite:///$WORK/mlflow.db}
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}  # one GPU, whatever the host has

BACKEND=${BACKEND:-cuda}
read -r -a EXTRA_ARGS <<< "${EXTRA:-}"
ONE_AT_A_TIME=(hydra/launcher=basic)
run() {  # name, time limit (s), overrides... (backend=cuda becomes backend=$BACKEND; $EXTRA is appended)
  local name=$1 limit=$2
  shift 2
  set -- "${@/#backend=cuda/backend=$BACKEND}" "${EXTRA_ARGS[@]}"
  if [ -n "${DRY:-}" ]; then
    echo "python -m sweeplab.train -m hydra.sweep.dir=$WORK/$name $*"
    return
  fi
  local t0 t1
  t0=$(date +%s.%N)
  timeout "$limit" python -m sweeplab.train -m "hydra.sweep.dir=$WORK/$name" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  t1=$(date +%s.%N)
  echo "$name rc=$rc wall=$(python -c "print(round($t1 - $t0, 1))")" | tee -a "$WORK/walls.txt"
}
wall() { grep "^$1 " "$WORK/walls.txt" | tail -1 | sed "s/.*wall=//"; }
summary() {  # packed baseline [more...]: walls, the speed-up, the lanes line and the verdict of each study
  [ -n "${DRY:-}" ] && return
  local walls=() dirs=()
  for name in "$@"; do
    walls+=("$(wall "$name")")
    dirs+=("$WORK/$name")
    echo "== $name: wall $(wall "$name") s"
    grep -h -o "sweep: [0-9]* jobs\? \(side by side\|at a time\) on each of .*" "$LOGS/$name.log" | head -1
    local last  # the verdict's lines: from the line after the last log line to the first blank one
    last=$(grep -n "^\[20" "$LOGS/$name.log" | tail -1 | cut -d: -f1)
    tail -n +"$((${last:-0} + 1))" "$LOGS/$name.log" | sed "/^$/q" | head -20
  done
  if [ $# -ge 2 ] && [ -n "$(wall "$1")" ] && [ -n "$(wall "$2")" ]; then
    echo "$2 / $1 = $(python -c "print(round($(wall "$2") / $(wall "$1"), 2))")x"
  fi
  python scripts/study_cost.py --wall "$(IFS=,; echo "${walls[*]}")" "${dirs[@]}"
}

LONG=(sweep=default backend=cuda replicates=5 trainer.max_steps=1000 trainer.val_check_interval=100)
DEFAULT=(sweep=default backend=cuda)
# A/A: two configurations that differ in nothing that runs (a checkpoint timer no 100-step job reaches)
AA=(model.size=small optim.lr=3.0e-3 optim.warmup_steps=10 replicates=5 trainer.max_steps=100
    trainer.val_check_interval=10 trainer.log_every_n_steps=10 trainer.enable_progress_bar=false
    report.quality_tolerance=0.01 data.batch_size=64 backend=cuda checkpoint.every_n_seconds=600,601
    logger.experiment_name=lanes-aa)
PG=(model=pagating_lm model.size=small sweep=pagating_batch data.batch_size=8,16 backend=cuda
    trainer.precision=bf16-mixed compile=default optim.implementation=fused replicates=3
    trainer.limit_val_batches=4 trainer.max_steps=300 trainer.val_check_interval=100)

case $PART in
1)
  run long_packed 170 "${LONG[@]}"
  run long_one_at_a_time 300 "${LONG[@]}" "${ONE_AT_A_TIME[@]}"
  run aa_packed 70 "${AA[@]}"
  summary long_packed long_one_at_a_time
  summary aa_packed
  ;;
2)
  if [ -z "${DRY:-}" ]; then  # the LM data cache (tokenizer, token memmap) is data preparation, not the study's
    timeout 120 python -m sweeplab.train model=pagating_lm model.size=small "backend=$BACKEND" trainer.max_steps=2 \
      trainer.val_check_interval=2 trainer.limit_val_batches=1 logger.experiment_name=lanes-data \
      "hydra.run.dir=$WORK/data_warmup" > "$LOGS/data_warmup.log" 2>&1 || echo "data warm-up failed: $LOGS/data_warmup.log"
  fi
  run default_packed 80 "${DEFAULT[@]}"
  run default_one_at_a_time 140 "${DEFAULT[@]}" "${ONE_AT_A_TIME[@]}"
  run pg_default 200 "${PG[@]}"
  if [ -n "${PG_BASELINE:-}" ]; then
    run pg_one_at_a_time 200 "${PG[@]}" "${ONE_AT_A_TIME[@]}"
  fi
  summary default_packed default_one_at_a_time
  if [ -n "${PG_BASELINE:-}" ]; then summary pg_default pg_one_at_a_time; else summary pg_default; fi
  ;;
*)
  echo "unknown part '$PART': 1 | 2 (bash scripts/lanes_gpu.sh 1)" >&2
  exit 2
  ;;
esac
