#!/usr/bin/env bash
# Issue 30's `bench step` figure: the host work of a step with the GPU hot-row cache (0 =
# today's path, 256 MiB, 1 GiB; write-through as the trainer, and write-back beside it) at
# per-rank batch 8192, 16384 and 65536, 1 rank, on a Zipf set of at least 10M distinct keys
# (`data synth --vocab-scale 300 --zipf 1.05`, 6M rows: a 97M-key space of which the rows
# hold about 10.6M); then batch 8192 again (REPEATS - 1 times) and on the default 1M-row set.
# Writes docs/bench/step-cache.txt (the tables) and docs/bench/step-cache.jsonl (one JSON
# report per run, labelled).
#   scripts/bench/step_cache.sh
#   REPEATS=1 ZROWS=2000000 scripts/bench/step_cache.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
REPEATS=${REPEATS:-2}
BATCH=${BATCH:-8192,16384,65536}
CACHE=${CACHE:-0,256,1024}
ZROWS=${ZROWS:-6000000}
STEPS=${STEPS:-20}
cargo build --release --locked --features cuda >&2
R=target/release/ringrec
mkdir -p docs/bench target/bench-data
ZIPF=target/bench-data/zipf-x300-s1.05-$((ZROWS / 1000))k.tsv
[ -s "$ZIPF" ] || "$R" data synth --rows "$ZROWS" --vocab-scale 300 --zipf 1.05 --seed 1 --out "$ZIPF" >&2
DEF=target/bench-data/synth-1000k.tsv
[ -s "$DEF" ] || "$R" data synth --rows 1000000 --seed 1 --out "$DEF" >&2
txt=docs/bench/step-cache.txt; jsonl=docs/bench/step-cache.jsonl
: > "$txt"; : > "$jsonl"
run() { # label data table-capacity batch
  local label=$1 data=$2 cap=$3 batch=$4
  echo "## $label: $R bench step --data $data --batch $batch --gpu-cache-mib $CACHE --write-back --table-capacity $cap --steps $STEPS" | tee -a "$txt"
  echo "## $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores" | tee -a "$txt"
  env RINGREC_JOB_ID="stepcache-$$-$RANDOM" "$R" bench step --data "$data" --data-dir target/bench/step-cache-data --batch "$batch" \
    --gpu-cache-mib "$CACHE" --write-back --table-capacity "$cap" --steps "$STEPS" --json \
    | python3 -c 'import json,sys; d=json.load(sys.stdin); d["label"]=sys.argv[1]; print(json.dumps(d))' "$label" | tee -a "$jsonl" \
    | python3 -c 'import json,sys; sys.path.insert(0, "scripts/device"); import i30_report; i30_report.bench_table(json.load(sys.stdin))' | tee -a "$txt"
}
run "zipf s=1.05 x300, $((ZROWS / 1000))k rows, run 1" "$ZIPF" 16777216 "$BATCH"
for rep in $(seq 2 "$REPEATS"); do
  run "zipf s=1.05 x300, $((ZROWS / 1000))k rows, run $rep" "$ZIPF" 16777216 8192
done
run "default set, 1M rows" "$DEF" 8388608 8192
