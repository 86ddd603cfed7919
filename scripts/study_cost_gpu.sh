#!/bin/bash
# Issue 36/37's study-cost measurements on a GPU host, one part per call (each fits a 10-minute device call):
#
#   bash scripts/study_cost_gpu.sh textbridge   # the default study on one GPU and on every visible GPU (joblib_gpus), A B B A
#   bash scripts/study_cost_gpu.sh stopping     # unstopped and stopped default study, order A B B A, one GPU
#   bash scripts/study_cost_gpu.sh pagating     # the paGating study of issue 36 (the LM data cache built first)
#   bash scripts/study_cost_gpu.sh pagating_twice  # the same study twice with compile_cache=shared (the second loads)
#   bash scripts/study_cost_gpu.sh verdict_auto # the default study, replicates=auto and an explicit target, twice
#   bash scripts/study_cost_gpu.sh verdict_default  # the same with the default target, twice
#   bash scripts/study_cost_gpu.sh pagating_long  # the paGating study at 1,000 steps a job (its val/ppl overfits)
#   bash scripts/study_cost_gpu.sh bytecode     # compile sys.path's Python bytecode once, as pip install does
#                                               # (an image with PYTHONDONTWRITEBYTECODE=1 and no .pyc compiles torch's
#                                               # sources in every process: docs/study-cost.md, "Python's bytecode")
#   DRY=1 bash scripts/study_cost_gpu.sh PART   # print the commands only
#   BACKEND=cpu EXTRA="debug=smoke replicates=2" bash scripts/study_cost_gpu.sh stopping   # the plumbing, on a CPU
#
# Each study runs in its own sweep folder under $WORK (default /tmp/study-cost) with one MLflow store; its process
# wall time goes to $WORK/walls.txt, and scripts/study_cost.py prints the wall breakdown, the steps' share, the
# verdict and each configuration's GPUs. Logs go to $OUT when set (the device tool's output folder), else $WORK.
set -u
PART=${1:?textbridge | stopping | verdict_auto | verdict_default | pagating | pagating_twice | pagating_long | bytecode}
WORK=${WORK:-/tmp/study-cost}
LOGS=${OUT:-$WORK}
mkdir -p "$WORK" "$LOGS"
export MLFLOW_TRACKING_URI=${MLFLOW_TRACKING_URI:-sqlite:///$WORK/mlflow.db}

BACKEND=${BACKEND:-cuda}
read -r -a EXTRA_ARGS <<< "${EXTRA:-}"
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
report() {  # [--target T] names...
  [ -n "${DRY:-}" ] && return
  local args=() walls=() dirs=()
  if [ "$1" = "--target" ]; then args=(--target "$2"); shift 2; fi
  for name in "$@"; do walls+=("$(wall "$name")"); dirs+=("$WORK/$name"); done
  python scripts/study_cost.py "${args[@]}" --wall "$(IFS=,; echo "${walls[*]}")" "${dirs[@]}"
}

case $PART in
textbridge)  # A B B A: neither side gets the freshly started machine alone (its cold file cache slows the first start)
  CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} run tb_one_gpu_1 150 sweep=default backend=cuda
  run tb_all_gpus_1 120 sweep=default backend=cuda hydra/launcher=joblib_gpus
  run tb_all_gpus_2 120 sweep=default backend=cuda hydra/launcher=joblib_gpus
  CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} run tb_one_gpu_2 150 sweep=default backend=cuda
  report tb_one_gpu_1 tb_all_gpus_1 tb_all_gpus_2 tb_one_gpu_2
  ;;
stopping)  # A B B A: neither side gets the freshly started machine alone
  STOP=(report.target=0.53 stop.at_target=true stop.behind=2)
  export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
  run unstopped_1 150 sweep=default backend=cuda report.target=0.53
  run stopped_1 150 sweep=default backend=cuda "${STOP[@]}"
  run stopped_2 150 sweep=default backend=cuda "${STOP[@]}"
  run unstopped_2 150 sweep=default backend=cuda report.target=0.53
  report --target 0.53 unstopped_1 stopped_1 stopped_2 unstopped_2
  ;;
verdict_auto)  # the same study twice: its two verdicts must not contradict each other (docs/verdict.md)
  export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
  run auto_1 290 sweep=default backend=cuda replicates=auto report.target=0.53
  run auto_2 290 sweep=default backend=cuda replicates=auto report.target=0.53
  report --target 0.53 auto_1
  report --target 0.53 auto_2
  ;;
verdict_default)  # the same with the default target (the worst best less the tolerance)
  export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
  run auto_default_1 290 sweep=default backend=cuda replicates=auto
  run auto_default_2 290 sweep=default backend=cuda replicates=auto
  report auto_default_1
  report auto_default_2
  ;;
pagating | pagating_twice | pagating_long)
  PG=(model=pagating_lm model.size=small sweep=pagating_batch data.batch_size=8,16 backend=cuda
      trainer.precision=bf16-mixed compile=default optim.implementation=fused replicates=3
      trainer.limit_val_batches=4)
  SHORT=(trainer.max_steps=300 trainer.val_check_interval=100)
  if [ -z "${DRY:-}" ]; then  # the LM data cache (tokenizer, token memmap) is data preparation, not the study's
    timeout 180 python -m sweeplab.train model=pagating_lm model.size=small "backend=$BACKEND" trainer.max_steps=2 \
      trainer.val_check_interval=2 trainer.limit_val_batches=1 logger.experiment_name=study-cost-data \
      "hydra.run.dir=$WORK/data_warmup" > "$LOGS/data_warmup.log" 2>&1 || echo "data warm-up failed: $LOGS/data_warmup.log"
  fi
  if [ "$PART" = pagating_long ]; then  # best val/ppl near step 250, ~5x worse at the end: the target and quality
    run pg_long 560 "${PG[@]}" trainer.max_steps=1000 trainer.val_check_interval=250  # come from each job's best
    report pg_long
  elif [ "$PART" = pagating_twice ]; then  # a study run again with compile_cache=shared: its compiles loaded
    run pg_shared_1 300 "${PG[@]}" "${SHORT[@]}" compile_cache=shared
    run pg_shared_2 240 "${PG[@]}" "${SHORT[@]}" compile_cache=shared
    report pg_shared_1 pg_shared_2
  else
    run pg_study 420 "${PG[@]}" "${SHORT[@]}"
    report pg_study
  fi
  ;;
bytecode)  # every folder on sys.path that holds packages (site-packages, a --target folder, src/), once
  python -c "from sweeplab.core import bytecode as b; print(b.uncached_warning(b.uncached_packages()) or 'bytecode cached')"
  [ -n "${DRY:-}" ] && exit 0
  t0=$(date +%s.%N)
  read -r -a FOLDERS <<< "$(python -c 'import os, sys; print(*(p for p in sys.path if os.path.isdir(p)))')"
  python -m compileall -qq -j 0 "${FOLDERS[@]}"  # errors (a site-packages test file in old syntax) are not ours
  echo "compiled ${FOLDERS[*]}"
  echo "bytecode compiled in $(python -c "print(round($(date +%s.%N) - $t0, 1))") s"
  python -c "from sweeplab.core import bytecode as b; print(b.uncached_warning(b.uncached_packages()) or 'bytecode cached')"
  ;;
*)
  echo "unknown part $PART: textbridge | stopping | verdict_auto | verdict_default | pagating | pagating_twice | pagating_long | bytecode" >&2
  exit 2
  ;;
esac
