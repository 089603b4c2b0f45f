#!/usr/bin/env bash
# Model quality on real data: test AUC of ringrec (1 and 2 ranks) vs the PyTorch reference
# on the Criteo sample ../shared/data/criteo_1tb_day0_10000.txt (first 90% of the rows train,
# last 10% test), identical hyperparameters, several seeds each. Writes
# docs/bench/criteo_auc.jsonl (failed runs recorded with their error) and
# docs/bench/criteo_auc.txt (mean AUC per implementation and the differences; target
# |ringrec - PyTorch| <= 0.01). Not used by CI.
#   scripts/bench/criteo_auc.sh
#   SEEDS="1 2 3 4 5" EPOCHS=3 scripts/bench/criteo_auc.sh
# Knobs: SEEDS RANKS EPOCHS BATCH DIM HIDDEN LR SPARSE_LR SPARSE_OPT TEST_FRACTION DATA,
#   SKIP_BUILD=1, NAME (output files docs/bench/$NAME.{jsonl,txt,log}; default criteo_auc).
set -uo pipefail
cd "$(dirname "$0")/../.."
DATA=${DATA:-../shared/data/criteo_1tb_day0_10000.txt}
if [ ! -s "$DATA" ]; then
  echo "criteo_auc.sh: $DATA is absent (the real Criteo sample is not in the repository); nothing to do" >&2
  exit 0
fi
SEEDS=${SEEDS:-1 2 3}
RANKS=${RANKS:-1 2}
EPOCHS=${EPOCHS:-1}
BATCH=${BATCH:-1024}
DIM=${DIM:-16}
HIDDEN=${HIDDEN:-256,128}
LR=${LR:-0.001}
SPARSE_LR=${SPARSE_LR:-0.05}
SPARSE_OPT=${SPARSE_OPT:-sgd}
TEST_FRACTION=${TEST_FRACTION:-0.1}
NAME=${NAME:-criteo_auc}
OUT=docs/bench/$NAME.jsonl
LOG=docs/bench/$NAME.log
mkdir -p docs/bench

PY=$(WITH_TORCH=1 scripts/bench/venv.sh) || { echo "criteo_auc.sh: no Python venv" >&2; exit 1; }
if [ "${SKIP_BUILD:-0}" = 1 ]; then
  echo "SKIP_BUILD=1: using the existing target/release/ringrec" >&2
elif ! cargo build --release --locked; then
  echo "criteo_auc.sh: cargo build --release failed; ringrec runs will be recorded as failures" >&2
fi
RINGREC=target/release/ringrec

: > "$OUT"
: > "$LOG"
env_args=()
for v in $(env | grep -o '^RINGREC_[A-Z_]*' || true); do env_args+=(-x "$v"); done
record() { "$PY" scripts/bench/json_run.py --out "$OUT" --log "$LOG" "$@" > /dev/null; }
for seed in $SEEDS; do
  hp=(--data "$DATA" --test-fraction "$TEST_FRACTION" --epochs "$EPOCHS" --batch "$BATCH"
      --dim "$DIM" --hidden "$HIDDEN" --lr "$LR" --sparse-lr "$SPARSE_LR"
      --sparse-optimizer "$SPARSE_OPT" --seed "$seed" --json)
  for np in $RANKS; do
    record --label "ringrec np=$np" --set impl=ringrec --set procs="$np" --set seed="$seed" -- \
      scripts/mpirun.sh "${env_args[@]}" -np "$np" "$RINGREC" train "${hp[@]}" --no-progress
  done
  record --label "pytorch" --set impl=pytorch --set procs=1 --set seed="$seed" -- \
    "$PY" scripts/bench/torch_ctr.py "${hp[@]}" --progress-every 0
done

echo
{
  echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $DATA, seeds $SEEDS: epochs $EPOCHS batch $BATCH dim $DIM" \
       "hidden $HIDDEN lr $LR sparse-lr $SPARSE_LR sparse-optimizer $SPARSE_OPT test-fraction $TEST_FRACTION"
  "$PY" scripts/bench/bench_report.py auc "$OUT"
} | tee docs/bench/$NAME.txt
