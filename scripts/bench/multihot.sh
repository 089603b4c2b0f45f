#!/usr/bin/env bash
# Issue 33's multi-hot figures, one run (release build; the machine as it is):
#   the multi-hot set (`ringrec data synth --format parquet --multi-hot`: 10 single-hot
#   fields, 6 lists of mean length 20, Zipf-like ids, labels of a planted model over the
#   lists), ROWS rows, the last 10% held out, in file order, EPOCHS epochs:
#   1. test AUC, 1 rank: ringrec (--model mlp, --dim 16, --hidden 256,128, Adam 1e-3,
#      sparse SGD 0.05, batch 1024, lists pooled by their sum) vs
#      scripts/bench/torch_multihot.py (ringrec's very network — the file's 10 single-hot
#      fields and 6 pooled lists, no dense input: 256 inputs — on
#      nn.EmbeddingBag(mode="sum", sparse=True)), on the
#      same file and split, once per seed of SEEDS (--seed on both sides, torch started
#      from the very values ringrec draws for it: --init ringrec);
#   2. the same with every list cut to its first id (ringrec: the file written with
#      `--max-list-len 1`, the same rows and labels; torch: --truncate);
#   3. samples/s at 2 ranks, the same global batch: ringrec (mpirun -np 2, --device cpu,
#      --threads 1) vs torch DDP (gloo, EmbeddingBag sparse) at 1 and 2 OMP threads per
#      rank (the best is the reference).
# Writes docs/bench/multihot.txt.
#   scripts/bench/multihot.sh            (ROWS=500000 EPOCHS=1 SEEDS=1; SKIP_BUILD=1: the release build is there)
set -euo pipefail
cd "$(dirname "$0")/../.."
target=${CARGO_TARGET_DIR:-target}
case $target in /*) ;; *) target="$PWD/$target" ;; esac
py=${PYTHON:-$(WITH_TORCH=1 scripts/bench/venv.sh)}
rows=${ROWS:-500000}
epochs=${EPOCHS:-1}
seeds=${SEEDS:-1}
bin=${RINGREC_BIN:-$target/release/ringrec}
[ "${SKIP_BUILD:-0}" = 1 ] || cargo build --locked --release --features cuda >&2
dir=$target/bench-data/multihot-$rows
mkdir -p "$dir"
whole=$dir/whole.parquet cut=$dir/cut.parquet
[ -f "$whole" ] || "$bin" data synth --format parquet --multi-hot --rows "$rows" --out "$whole" >&2
[ -f "$cut" ] || "$bin" data synth --format parquet --multi-hot --max-list-len 1 --rows "$rows" --out "$cut" >&2
mpi=(mpirun --oversubscribe)
[ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
sparse=c0,c1,c2,c3,c4,c5,c6,c7,c8,c9,l0,l1,l2,l3,l4,l5
flags=(--sparse-columns "$sparse" --data-dir "$dir/ringrec" --device cpu --model mlp --dim 16 --hidden 256,128
  --dense-optimizer adam --lr 0.001 --sparse-optimizer sgd --sparse-lr 0.05 --batch 1024 --test-fraction 0.1
  --epochs "$epochs" --table-capacity 4194304 --no-progress --json)
field() { python3 -c "import json,sys; d=json.loads([l for l in sys.stdin if l.startswith('{')][-1]); print(' '.join(f'{k}={d[k]}' for k in sys.argv[1:]))" "$@"; }
out=docs/bench/multihot.txt
{
  echo "# $(date -u +%FT%TZ) $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) (a shared machine: other jobs were running)"
  echo "# $rows rows ($whole), epochs $epochs, batch 1024, test fraction 0.1; ringrec $(git rev-parse --short HEAD)"
  echo "## AUC, 1 rank (sum pooling), the same network (ringrec's: 256 inputs)"
  for s in $seeds; do
    "${mpi[@]}" -np 1 "$bin" train --data "$whole" "${flags[@]}" --seed "$s" --threads 2 | field test_auc samples_per_sec | sed "s/^/ringrec whole, seed $s: /"
    "$py" scripts/bench/torch_multihot.py --data "$whole" --epochs "$epochs" --seed "$s" --init ringrec --threads 2 --json | field test_auc samples_per_s | sed "s/^/torch   whole, seed $s: /"
  done
  echo "## AUC, 1 rank, every list cut to its first id"
  "${mpi[@]}" -np 1 "$bin" train --data "$cut" "${flags[@]}" --threads 2 | field test_auc samples_per_sec | sed 's/^/ringrec cut:   /'
  "$py" scripts/bench/torch_multihot.py --data "$whole" --truncate --epochs "$epochs" --init ringrec --threads 2 --json | field test_auc samples_per_s | sed 's/^/torch   cut:   /'
  echo "## samples/s, 2 ranks, global batch 1024"
  "${mpi[@]}" -np 2 "$bin" train --data "$whole" "${flags[@]}" --threads 1 | field samples_per_sec test_auc | sed 's/^/ringrec 2 ranks, 1 thread each: /'
  for t in 1 2; do
    OMP_NUM_THREADS=$t "$py" scripts/bench/torch_multihot.py --data "$whole" --epochs "$epochs" --ddp 2 --threads $t --json | field samples_per_s test_auc | sed "s/^/torch DDP 2 ranks, $t thread(s) each: /"
  done
} 2>&1 | tee "$out"
