#!/usr/bin/env bash
# Issue 33's speed figure alone, repeated: samples/s of the multi-hot set at 2 ranks, the
# commands of scripts/bench/multihot.sh's part 3 (ringrec `mpirun -np 2 --device cpu
# --threads 1` vs torch DDP gloo `EmbeddingBag(sparse=True)` at 1 and 2 OMP threads a rank),
# run RUNS times alternately, each line with the load average before it, and each ringrec
# run's `phase_seconds` (rank 0's wall time per phase of the step). BASE_BIN, when given,
# is a second ringrec binary (an older build) run beside this one in every round, so a
# change is measured against the same torch runs; EXTRA_FLAGS, when given, adds a run of
# this binary with those flags (e.g. `--pipeline on`) to every round.
# The release build and the set are scripts/bench/multihot.sh's (run it once first).
#   RUNS=3 scripts/bench/multihot_speed.sh [OUT]   (OUT: docs/bench/multihot-speed.txt)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
bin=${RINGREC_BIN:-$root/${CARGO_TARGET_DIR:-target}/release/ringrec}
dir=$root/${CARGO_TARGET_DIR:-target}/bench-data/multihot-${ROWS:-500000}
whole=$dir/whole.parquet
py=${PYTHON:-$(WITH_TORCH=1 scripts/bench/venv.sh)}
out=${1:-docs/bench/multihot-speed.txt}
for f in "$bin" "$whole"; do [ -e "$f" ] || { echo "$f is missing: run scripts/bench/multihot.sh first" >&2; exit 1; }; done
mpi=(mpirun --oversubscribe)
[ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
sparse=c0,c1,c2,c3,c4,c5,c6,c7,c8,c9,l0,l1,l2,l3,l4,l5
flags=(--sparse-columns "$sparse" --data-dir "$dir/ringrec" --device cpu --model mlp --dim 16 --hidden 256,128
  --dense-optimizer adam --lr 0.001 --sparse-optimizer sgd --sparse-lr 0.05 --batch 1024 --test-fraction 0.1
  --epochs 1 --table-capacity 4194304 --no-progress --json --threads 1)
field() { python3 -c "import json,sys; d=json.loads([l for l in sys.stdin if l.startswith('{')][-1]); print(' '.join(f'{k}={json.dumps(d[k], separators=(\",\", \":\"))}' for k in sys.argv[1:]))" "$@"; }
load() { cut -d' ' -f1-3 /proc/loadavg; }
ringrec() { local b=$1; shift; "${mpi[@]}" -np 2 "$b" train --data "$whole" "${flags[@]}" "$@" | field samples_per_sec params_fnv phase_seconds; }
{
  echo "# $(date -u +%FT%TZ) $(nproc) cores; ringrec $(git rev-parse --short HEAD)${BASE_BIN:+, base $BASE_BIN}; $whole, global batch 1024, 1 epoch"
  for r in $(seq "${RUNS:-3}"); do
    [ -z "${BASE_BIN:-}" ] || echo "run $r, load $(load): ringrec base: $(ringrec "$BASE_BIN")"
    echo "run $r, load $(load): ringrec: $(ringrec "$bin")"
    [ -z "${EXTRA_FLAGS:-}" ] || echo "run $r, load $(load): ringrec $EXTRA_FLAGS: $(ringrec "$bin" $EXTRA_FLAGS)"
    for t in 1 2; do
      echo "run $r, load $(load): torch DDP $t thread(s): $(OMP_NUM_THREADS=$t "$py" scripts/bench/torch_multihot.py --data "$whole" --epochs 1 --ddp 2 --threads $t --json | field samples_per_s)"
    done
  done
} 2>&1 | tee "$out"
