#!/usr/bin/env bash
# The GPU hot-row cache's host work on the multi-hot set (branch cachemh): `ringrec bench
# step` on `data synth --multi-hot` (6 list fields of mean length 20; its 10 integer columns
# read as dense features, bench step having no --sparse-columns), 1 rank, batch 4096 and
# 8192, cache 0 / 4 / 16 / 64 MiB (write-through and write-back). The hit rate and the bytes
# per sample are counts (any build, any load); the times want the release build on a quiet
# machine. Output: docs/bench/step-multihot.txt. The data lives in a temporary directory,
# removed at the end.
#   RINGREC=target/release/ringrec ROWS=100000 STEPS=6 scripts/bench/step_multihot.sh
set -euo pipefail
R=${RINGREC:-target/release/ringrec}
ROWS=${ROWS:-100000}
STEPS=${STEPS:-6}
out=docs/bench/step-multihot.txt
d=$(mktemp -d "${TMPDIR:-/tmp}/ringrec-step-multihot.XXXXXX")
trap 'rm -rf "$d"' EXIT
"$R" data synth --rows "$ROWS" --format parquet --multi-hot --out "$d/mh.parquet" >/dev/null
{
  echo "## $R bench step --data mh.parquet (data synth --rows $ROWS --format parquet --multi-hot) --batch 4096,8192 --gpu-cache-mib 0,4,16,64 --write-back --steps $STEPS --warmup 1 --cache-warmup 8 --gpu-cache-refresh 4 --table-capacity 4194304"
  echo "## $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores, $(git rev-parse --short HEAD)"
  RINGREC_JOB_ID="step-multihot-$$" "$R" bench step --data "$d/mh.parquet" --data-dir "$d/prepared" --batch 4096,8192 \
    --gpu-cache-mib 0,4,16,64 --write-back --steps "$STEPS" --warmup 1 --cache-warmup 8 --gpu-cache-refresh 4 --table-capacity 4194304
} 2>&1 | tee "$out"
