#!/usr/bin/env bash
# Where the 2-rank multi-hot step's CPU goes: the samples/s command of
# scripts/bench/multihot.sh for STEPS steps (--max-steps) under `perf record --call-graph
# dwarf` on each rank, then scripts/bench/step_breakdown.py per rank (ms of CPU per step
# by part: batch, lookup, pooling, MLP, exchange, the leader's update, the engine's waits).
#   scripts/bench/multihot_profile.sh [OUT]   (OUT: docs/bench/mhspeed-profile.txt; STEPS=200 HZ=250)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
bin=${RINGREC_BIN:-$root/${CARGO_TARGET_DIR:-target}/release/ringrec}
dir=$root/${CARGO_TARGET_DIR:-target}/bench-data/multihot-${ROWS:-500000}
steps=${STEPS:-200} hz=${HZ:-250}
out=${1:-docs/bench/mhspeed-profile.txt}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpi=(mpirun --oversubscribe)
[ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
cat > "$tmp/wrap.sh" <<WRAP
#!/bin/sh
exec perf record -F $hz --call-graph dwarf,16384 -o "$tmp/perf-\$OMPI_COMM_WORLD_RANK.data" -- "\$@"
WRAP
chmod +x "$tmp/wrap.sh"
"${mpi[@]}" -np 2 "$tmp/wrap.sh" "$bin" train --data "$dir/whole.parquet" --sparse-columns c0,c1,c2,c3,c4,c5,c6,c7,c8,c9,l0,l1,l2,l3,l4,l5 \
  --data-dir "$dir/ringrec" --device cpu --model mlp --dim 16 --hidden 256,128 --dense-optimizer adam --lr 0.001 \
  --sparse-optimizer sgd --sparse-lr 0.05 --batch 1024 --test-fraction 0.1 --epochs 1 --table-capacity 4194304 \
  --no-progress --json --threads 1 --max-steps "$steps" > "$tmp/run.json" 2>&1
{
  echo "# $(date -u +%FT%TZ) $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); ringrec $(git rev-parse --short HEAD); $steps steps, perf at $hz Hz (dwarf)"
  for r in 0 1; do
    perf script -i "$tmp/perf-$r.data" -F comm,ip,sym 2>/dev/null > "$tmp/script-$r.txt"
    echo "== rank $r"
    python3 scripts/bench/step_breakdown.py "$tmp/script-$r.txt" "$steps" "$hz"
  done
} | tee "$out"
