#!/usr/bin/env bash
# Training throughput: ringrec (1, 2, 4 ranks) vs the PyTorch reference
# (scripts/bench/torch_ctr.py: the same model, data split and global batch, sparse embedding
# gradients) on the same 200k-row synthetic Criteo TSV.
# The reference is PyTorch at its best: a sweep of thread settings, each its own labelled row:
#   "pytorch threads=T"              1 process, T in TORCH_THREADS (default: 1, 2 and nproc)
#   "pytorch-ddp np=2 threads=T"     DDP over gloo, 2 processes x T threads each, T in
#                                    TORCH_DDP_THREADS (default: 1, 2 and nproc/2; 2 x 2 on a
#                                    2-core machine is oversubscribed, tried anyway)
# Every process takes its slice of each global batch (per-process batch = 1024 / processes).
# bench_report.py compares ringrec with the best sparse-gradient single-process row and the
# best sparse-gradient DDP-2 row, names them, and prints the headline ratios (targets:
# ringrec 1 rank / PyTorch single (best) >= 1.5x, ringrec 2 ranks / PyTorch DDP 2 (best) >= 2x)
# and the test AUC differences on the same split (target |diff| <= 0.005).
# DENSE=1 adds nn.Embedding without sparse=True ("pytorch dense-grad ...", "pytorch-ddp np=2
# dense-grad ..."): informational rows, labelled as such, never a headline's reference.
# Writes docs/bench/train.jsonl (one JSON line per run; failed runs are recorded with their
# error and the script goes on), docs/bench/train.txt (the table), docs/bench/gemm.txt and
# the plot docs/train_samples_per_sec.png. Not used by CI.
#   scripts/bench/train.sh
#   REPEATS=3 scripts/bench/train.sh              # best of 3 per row (noisy machine)
#   RANKS="1 2" ROWS=50000 scripts/bench/train.sh
# Other knobs: SKIP_BUILD=1 (use the existing binary), DATA (a TSV to use instead of the
# synthetic one), TORCH_THREADS, TORCH_DDP_THREADS, DENSE=1, RINGREC_ARGS, TORCH_ARGS (extra
# flags for one side, e.g. TORCH_ARGS="--interop-threads 1"), and any RINGREC_* environment
# variable, which is passed to every rank. MPI_ARGS: extra mpirun flags, e.g.
# MPI_ARGS="--bind-to none" (by default Open MPI binds each rank to one core when np <= 2).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROWS=${ROWS:-200000}
RANKS=${RANKS:-1 2 4}
REPEATS=${REPEATS:-1}
DATA=${DATA:-target/bench-data/synth-$((ROWS / 1000))k.tsv}
OUT=docs/bench/train.jsonl
LOG=docs/bench/train.log
mkdir -p docs/bench target/bench-data
CORES=$(nproc)
uniq_words() { tr ' ' '\n' <<< "$*" | awk 'NF && $1 > 0 && !seen[$1]++' | paste -sd' ' -; }
TORCH_THREADS=$(uniq_words "${TORCH_THREADS:-1 2 $CORES}")
TORCH_DDP_THREADS=$(uniq_words "${TORCH_DDP_THREADS:-1 2 $((CORES / 2))}")
DENSE=${DENSE:-0}
echo "PyTorch sweep: 1 process x {$TORCH_THREADS} threads; DDP 2 processes x {$TORCH_DDP_THREADS} threads" \
  "$([ "$DENSE" = 1 ] && echo "; dense-grad rows (informational)")" >&2

PY=$(WITH_TORCH=1 scripts/bench/venv.sh) || { echo "train.sh: no Python venv" >&2; exit 1; }

# (a) Build. A failed build is reported; the PyTorch runs still happen.
if [ "${SKIP_BUILD:-0}" = 1 ]; then
  echo "SKIP_BUILD=1: using the existing target/release/ringrec" >&2
elif ! cargo build --release --locked; then
  echo "train.sh: cargo build --release failed; ringrec runs will be recorded as failures" >&2
fi
RINGREC=target/release/ringrec

# (b) The data: ringrec's generator, or the Python one when that is not available.
GEN="existing file"
if [ ! -s "$DATA" ]; then
  GEN="ringrec data synth --seed 1"
  if ! "$RINGREC" data synth --rows "$ROWS" --out "$DATA" --seed 1; then
    echo "train.sh: 'ringrec data synth' failed; generating $DATA with scripts/bench/synth_tsv.py" >&2
    "$PY" scripts/bench/synth_tsv.py --rows "$ROWS" --out "$DATA" --seed 1 || exit 1
    GEN="scripts/bench/synth_tsv.py --seed 1"
  fi
fi
echo "data: $DATA ($(wc -l < "$DATA") rows; $GEN)" >&2

# (c) The runs, each one JSON line into $OUT.
: > "$OUT"
: > "$LOG"
env_args=()
for v in $(env | grep -o '^RINGREC_[A-Z_]*' || true); do env_args+=(-x "$v"); done
read -r -a ring_extra <<< "${RINGREC_ARGS:-}"
read -r -a mpi_extra <<< "${MPI_ARGS:-}"
read -r -a torch_extra <<< "${TORCH_ARGS:-}"
record() { "$PY" scripts/bench/json_run.py --out "$OUT" --log "$LOG" "$@" > /dev/null; }
common=(--data "$DATA" --batch 1024 --dim 16 --epochs 1 --json)
port=29517  # gloo rendezvous port; a fresh one for every DDP run
for rep in $(seq "$REPEATS"); do
  for np in $RANKS; do
    record --label "ringrec np=$np" --set impl=ringrec --set procs="$np" --set repeat="$rep" -- \
      scripts/mpirun.sh "${env_args[@]}" "${mpi_extra[@]}" -np "$np" "$RINGREC" train "${common[@]}" --no-progress \
      "${ring_extra[@]}"
  done
  # The PyTorch reference: sparse embedding gradients, every thread setting of the sweep.
  for t in $TORCH_THREADS; do
    record --label "pytorch threads=$t" --set impl=pytorch --set procs=1 --set threads="$t" \
      --set embedding_grad=sparse --set repeat="$rep" -- \
      "$PY" scripts/bench/torch_ctr.py "${common[@]}" --embedding-grad sparse --threads "$t" \
      --progress-every 0 "${torch_extra[@]}"
  done
  for t in $TORCH_DDP_THREADS; do
    port=$((port + 1))
    record --label "pytorch-ddp np=2 threads=$t" --set impl=pytorch-ddp --set procs=2 --set threads="$t" \
      --set embedding_grad=sparse --set repeat="$rep" -- \
      "$PY" scripts/bench/torch_ctr.py "${common[@]}" --embedding-grad sparse --ddp 2 --threads "$t" \
      --port "$port" --progress-every 0 "${torch_extra[@]}"
  done
  # nn.Embedding without sparse=True: the whole table's gradient every step (and, under DDP,
  # allreduced). Informational only, never a headline's reference.
  if [ "$DENSE" = 1 ]; then
    t=$CORES
    record --label "pytorch dense-grad threads=$t" --set impl=pytorch --set procs=1 --set threads="$t" \
      --set embedding_grad=dense --set repeat="$rep" -- \
      "$PY" scripts/bench/torch_ctr.py "${common[@]}" --embedding-grad dense --threads "$t" \
      --progress-every 0 "${torch_extra[@]}"
    t=$(( CORES / 2 > 0 ? CORES / 2 : 1 ))
    port=$((port + 1))
    record --label "pytorch-ddp np=2 dense-grad threads=$t" --set impl=pytorch-ddp --set procs=2 \
      --set threads="$t" --set embedding_grad=dense --set repeat="$rep" -- \
      "$PY" scripts/bench/torch_ctr.py "${common[@]}" --embedding-grad dense --ddp 2 --threads "$t" \
      --port "$port" --progress-every 0 "${torch_extra[@]}"
  fi
done

# (d) The table and the ratios.
echo
{
  echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), data $DATA ($GEN)"
  "$PY" scripts/bench/bench_report.py train "$OUT"
} | tee docs/bench/train.txt

# (e) The MLP's GEMMs vs plain SGEMM, at 1 thread (a rank of a 2-rank run) and at nproc
# threads (the 1-rank run): the best SGEMM rate the MLP's rate inside training
# (`mlp_gflops` in the JSON lines) is compared with.
echo
: > docs/bench/gemm.txt
for t in 1 "$(nproc)"; do
  if "$RINGREC" bench gemm --threads "$t" >> docs/bench/gemm.txt 2> docs/bench/gemm.err; then
    rm -f docs/bench/gemm.err
  else
    echo "train.sh: 'ringrec bench gemm --threads $t' failed (see docs/bench/gemm.err)" >&2
  fi
done
cat docs/bench/gemm.txt

# (f) The plot.
"$PY" scripts/bench/plot_train.py "$OUT" docs/train_samples_per_sec.png
