#!/usr/bin/env bash
# Issue 31's models: ringrec (`ringrec train --model M`, 1 and 2 ranks, release build) beside
# the independent PyTorch references (scripts/bench/torch_ctr.py --model M, models in
# torch_models.py) on the same files and split, for every model in MODELS and every data set:
#   interactions  `ringrec data synth --interactions` (ROWS rows, seed 1): labels from a planted
#                 factorisation machine + deep part, so interaction models have something to find
#   criteo        ../shared/data/criteo_1tb_day0_10000.txt (skipped, with the reason, when absent)
# Per (set, model, seed in SEEDS): ringrec np=1, ringrec np=2 and PyTorch single-process at
# the default thread count (nproc) give the paired test AUCs. For the first seed only, the
# throughput sweep adds PyTorch single at TORCH_THREADS and DDP 2 (gloo, sparse gradients) at
# TORCH_DDP_THREADS; the report takes the best of each as the reference.
# Writes docs/bench/$NAME.jsonl (one line per run; a failed run is recorded with its error
# and the script goes on), docs/bench/$NAME.log, and docs/bench/$NAME.txt (models_report.py:
# the table with the targets and met / NOT met). Not used by CI.
#   scripts/bench/models.sh                                   # everything (~25 min on 2 cores)
#   MODELS=mlp SEEDS="1 2" SETS=interactions scripts/bench/models.sh
# Sparse optimizer: Adagrad (SPARSE_OPT=adagrad, --sparse-lr 0.05) on both sides: with plain
# SGD at 0.05 the table barely moves in one epoch (a row's step is lr x its share of the
# batch mean) and no model learns the planted interactions (PyTorch, 400k rows: mlp 0.652,
# dlrm 0.615, deepfm 0.588 with SGD; 0.707, 0.716, 0.697 with Adagrad).
# Sizes (the defaults fit ~25 minutes on the 2-core machine when it is quiet): interactions
# 200,000 rows (180,000 train / 20,000 test), criteo 10,000 rows, 1 epoch, 5 seeds, 5 models.
# Knobs: MODELS SEEDS SETS ROWS EPOCHS BATCH DIM HIDDEN LR SPARSE_LR SPARSE_OPT TEST_FRACTION
#   TORCH_THREADS TORCH_DDP_THREADS SKIP_BUILD=1 NAME (default models), CRITEO (the sample),
#   RINGREC_ARGS / TORCH_ARGS (extra flags for one side), MODEL_ARGS_<model> (shape flags given
#   to both sides, e.g. MODEL_ARGS_dcn="--cross-rank 64"), and RINGREC_* variables (every rank).
# Until `ringrec train --model` exists, ringrec's mlp runs go without the flag (mlp is the
# default, bit for bit) and its other models' runs are recorded as failures.
set -uo pipefail
cd "$(dirname "$0")/../.."
MODELS=${MODELS:-mlp dlrm dcn deepfm wide-deep}
SEEDS=${SEEDS:-1 2 3 4 5}
SETS=${SETS:-interactions criteo}
ROWS=${ROWS:-200000}
EPOCHS=${EPOCHS:-1}
BATCH=${BATCH:-1024}
DIM=${DIM:-16}
HIDDEN=${HIDDEN:-256,128}
LR=${LR:-0.001}
SPARSE_LR=${SPARSE_LR:-0.05}
SPARSE_OPT=${SPARSE_OPT:-adagrad}
TEST_FRACTION=${TEST_FRACTION:-0.1}
CRITEO=${CRITEO:-../shared/data/criteo_1tb_day0_10000.txt}
NAME=${NAME:-models}
CORES=$(nproc)
TORCH_THREADS=${TORCH_THREADS:-1 $CORES}
TORCH_DDP_THREADS=${TORCH_DDP_THREADS:-1 $(( CORES / 2 > 1 ? CORES / 2 : 2 ))}
OUT=docs/bench/$NAME.jsonl
LOG=docs/bench/$NAME.log
mkdir -p docs/bench target/bench-data

PY=$(WITH_TORCH=1 scripts/bench/venv.sh) || { echo "models.sh: no Python venv" >&2; exit 1; }
if [ "${SKIP_BUILD:-0}" = 1 ]; then
  echo "SKIP_BUILD=1: using the existing target/release/ringrec" >&2
elif ! cargo build --release --locked; then
  echo "models.sh: cargo build --release failed; ringrec runs will be recorded as failures" >&2
fi
RINGREC=target/release/ringrec

# The data sets: name -> file.
declare -A FILE
for set in $SETS; do
  case "$set" in
    interactions)
      f=target/bench-data/interactions-$((ROWS / 1000))k-s1.tsv
      if [ ! -s "$f" ]; then
        "$RINGREC" data synth --interactions --rows "$ROWS" --seed 1 --out "$f" >&2 || {
          echo "models.sh: 'ringrec data synth --interactions' failed: skipping the interactions set" >&2
          continue; }
      fi
      FILE[$set]=$f ;;
    criteo)
      if [ ! -s "$CRITEO" ]; then
        echo "models.sh: skipping the criteo set: $CRITEO is absent (the real Criteo sample is not in the repository)" >&2
        continue
      fi
      FILE[$set]=$CRITEO ;;
    *) echo "models.sh: unknown set '$set' (interactions, criteo)" >&2; exit 2 ;;
  esac
done

: > "$OUT"
: > "$LOG"
env_args=()
for v in $(env | grep -o '^RINGREC_[A-Z_]*' || true); do env_args+=(-x "$v"); done
read -r -a ring_extra <<< "${RINGREC_ARGS:-}"
read -r -a torch_extra <<< "${TORCH_ARGS:-}"
record() { "$PY" scripts/bench/json_run.py --out "$OUT" --log "$LOG" "$@" > /dev/null; }
port=29617  # gloo rendezvous port; a fresh one for every DDP run
first_seed=${SEEDS%% *}
for set in $SETS; do
  [ -n "${FILE[$set]:-}" ] || continue
  data=${FILE[$set]}
  for model in $MODELS; do
    shape_var=MODEL_ARGS_${model//-/_}
    read -r -a shape <<< "${!shape_var:-}"
    # ringrec's default model is mlp: no flag, so the run works before --model exists.
    ring_model=()
    [ "$model" = mlp ] || ring_model=(--model "$model")
    for seed in $SEEDS; do
      hp=(--data "$data" --test-fraction "$TEST_FRACTION" --epochs "$EPOCHS" --batch "$BATCH"
          --dim "$DIM" --hidden "$HIDDEN" --lr "$LR" --sparse-lr "$SPARSE_LR"
          --sparse-optimizer "$SPARSE_OPT" --seed "$seed" --json "${shape[@]}")
      tags=(--set set="$set" --set model="$model" --set seed="$seed")
      for np in 1 2; do
        record --label "ringrec np=$np" "${tags[@]}" --set impl=ringrec --set procs="$np" -- \
          scripts/mpirun.sh "${env_args[@]}" -np "$np" "$RINGREC" train "${ring_model[@]}" "${hp[@]}" \
          --no-progress "${ring_extra[@]}"
      done
      threads=$CORES
      [ "$seed" = "$first_seed" ] && threads="$CORES $TORCH_THREADS"
      for t in $(tr ' ' '\n' <<< "$threads" | awk 'NF && !seen[$1]++'); do
        record --label "pytorch threads=$t" "${tags[@]}" --set impl=pytorch --set procs=1 \
          --set threads="$t" --set embedding_grad=sparse -- \
          "$PY" scripts/bench/torch_ctr.py --model "$model" "${hp[@]}" --embedding-grad sparse \
          --threads "$t" --progress-every 0 "${torch_extra[@]}"
      done
      [ "$seed" = "$first_seed" ] || continue
      for t in $TORCH_DDP_THREADS; do
        port=$((port + 1))
        record --label "pytorch-ddp np=2 threads=$t" "${tags[@]}" --set impl=pytorch-ddp --set procs=2 \
          --set threads="$t" --set embedding_grad=sparse -- \
          "$PY" scripts/bench/torch_ctr.py --model "$model" "${hp[@]}" --embedding-grad sparse \
          --ddp 2 --threads "$t" --port "$port" --progress-every 0 "${torch_extra[@]}"
      done
    done
  done
done

echo
{
  echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $CORES cores, load average $(cut -d' ' -f1-3 /proc/loadavg);" \
       "sets: $(for s in $SETS; do [ -n "${FILE[$s]:-}" ] && printf '%s=%s ' "$s" "${FILE[$s]}"; done)"
  echo "# models $MODELS; seeds $SEEDS; epochs $EPOCHS batch $BATCH dim $DIM hidden $HIDDEN lr $LR" \
       "sparse-lr $SPARSE_LR sparse-optimizer $SPARSE_OPT test-fraction $TEST_FRACTION"
  "$PY" scripts/bench/models_report.py "$OUT"
} | tee docs/bench/$NAME.txt
