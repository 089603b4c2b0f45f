#!/usr/bin/env bash
# Issue 30 point 2's figure: the host work of a step with the GPU hot-row cache in the
# trainer's write-back (`bench step --write-back`: `--gpu-cache-mode write-back`'s host path,
# EmbeddingStage::exchange_and_apply_held) beside write-through and no cache, in the same
# run: 1 rank, batch 8192, a 1 GiB cache, the Zipf s=1.05 set of 11M distinct keys.
# Writes docs/bench/step-write-back.txt (the tables) and .jsonl (one JSON report per run).
#   scripts/bench/step_write_back.sh
#   REPEATS=1 scripts/bench/step_write_back.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
REPEATS=${REPEATS:-3}
STEPS=${STEPS:-20}
cargo build --release --locked --features cuda >&2
R=target/release/ringrec
mkdir -p docs/bench target/bench-data
ZIPF=target/bench-data/zipf-x300-s1.05-6000k.tsv
[ -s "$ZIPF" ] || "$R" data synth --rows 6000000 --vocab-scale 300 --zipf 1.05 --seed 1 --out "$ZIPF" >&2
txt=docs/bench/step-write-back.txt; jsonl=docs/bench/step-write-back.jsonl
: > "$txt"; : > "$jsonl"
. scripts/bench/step_bench.sh
for rep in $(seq 1 "$REPEATS"); do
  step_bench "run $rep" "$R" stepwb
done
