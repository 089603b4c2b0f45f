#!/usr/bin/env bash
# Issue 30, the GPU cache's upload bytes per sample (branch `csr`): `bench step` before and
# after (two release binaries, run in turn on the same data), 1 rank, batch 8192, cache 0 and
# 1 GiB (write-through as the trainer, write-back beside it), on the Zipf set of 11M distinct
# keys; then the trainer's own count on `--device host` (the kernels compiled for the CPU),
# first steps of an epoch from an empty table, where most misses are keys the table does not
# hold yet (their rows made on the device after this branch).
# Writes docs/bench/step-csr.txt and docs/bench/step-csr.jsonl (one JSON report per run);
# PARTS=train appends the trainer's part alone.
#   BEFORE=target/ringrec-before AFTER=target/release/ringrec scripts/bench/step_csr.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
BEFORE=${BEFORE:?the binary before the change}
AFTER=${AFTER:-target/release/ringrec}
REPEATS=${REPEATS:-2}
PARTS=${PARTS:-bench,train}
STEPS=${STEPS:-20}
ZIPF=target/bench-data/zipf-x300-s1.05-6000k.tsv
[ -s "$ZIPF" ] || "$AFTER" data synth --rows 6000000 --vocab-scale 300 --zipf 1.05 --seed 1 --out "$ZIPF" >&2
mkdir -p docs/bench
txt=docs/bench/step-csr.txt; jsonl=docs/bench/step-csr.jsonl
[[ $PARTS == *bench* ]] && { : > "$txt"; : > "$jsonl"; }
. scripts/bench/step_bench.sh
for rep in $(seq 1 "$REPEATS"); do
  [[ $PARTS == *bench* ]] || break
  step_bench "before-$rep" "$BEFORE" stepcsr
  step_bench "after-$rep" "$AFTER" stepcsr
done
train() { # label binary cache-mib
  local label=$1 R=$2 mib=$3
  echo "## $label: $R train --data $ZIPF --test-fraction 0.0001 --device host --batch 1024 --max-steps 30 --gpu-cache-mib $mib" | tee -a "$txt"
  env RINGREC_JOB_ID="stepcsr-$$-$RANDOM" RINGREC_DATA_DIR=target/bench/step-cache-data "$R" train --data "$ZIPF" --test-fraction 0.0001 --device host --batch 1024 \
    --max-steps 30 --gpu-cache-mib "$mib" --table-capacity 4194304 --no-progress --json 2>/dev/null \
    | grep '^{' | tail -1 \
    | python3 -c 'import json,sys; d=json.load(sys.stdin); g=d["gpu_cache"]; print(json.dumps({"label": sys.argv[1], "params_fnv": d["params_fnv"], "gpu_cache": g})); print("   params_fnv %s  hit %.1f%%  up %.1f B/sample  down %.1f B/sample" % (d["params_fnv"], 100 * g.get("hit_rate", 0), g.get("bytes_uploaded_per_sample", 0), g.get("bytes_downloaded_per_sample", 0)), file=sys.stderr)' "$label" 2>>"$txt" | tee -a "$jsonl"
  tail -1 "$txt"
}
for mib in 0 1024; do
  [[ $PARTS == *train* ]] || break
  train "train before, cache $mib" "$BEFORE" "$mib"
  train "train after, cache $mib" "$AFTER" "$mib"
done
