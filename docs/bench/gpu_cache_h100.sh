#!/usr/bin/env bash
# The GPU hot-row cache on one GPU (issue 30): 60 steps of `ringrec train --device cuda`
# with the cache off, small (0.5 MiB, keys chosen every 3 steps) and at its default size;
# prints each run's params_fnv, samples/s and cache counters and compares the final table
# files. A correctness check, not a speed measurement. Outputs into $OUT.
#   B=target/release/ringrec OUT=/tmp/gc docs/bench/gpu_cache_h100.sh
set -u
B=${B:-target/release/ringrec}
OUT=${OUT:-target/gpu-cache-check}
mkdir -p "$OUT"
export RINGREC_DATA_DIR=${RINGREC_DATA_DIR:-/tmp/rrdata}; mkdir -p "$RINGREC_DATA_DIR"
A="train --synth-rows 200000 --batch 1024 --max-steps 60 --no-progress --json --device cuda"
run() { local tag=$1; shift; rm -rf "/tmp/ck-$tag"; timeout 150 $B $A --checkpoint-dir "/tmp/ck-$tag" "$@" > "$OUT/$tag.json" 2> "$OUT/$tag.err"; echo "$tag rc $?"; }
run off --gpu-cache-mib 0
run on --gpu-cache-mib 0.5 --gpu-cache-refresh 3
run default
for t in off on default; do tail -1 "$OUT/$t.json" | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print('$t', d['params_fnv'], d['samples_per_sec'], d['table_rows_crc_per_host'], d['gpu_cache'])"; done
for t in on default; do f=$(ls -d /tmp/ck-$t/step-*/ | tail -1); o=$(ls -d /tmp/ck-off/step-*/ | tail -1); cmp "$o/table.rrt" "$f/table.rrt" && echo "$t: table file identical to off"; done
