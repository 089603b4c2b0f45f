#!/usr/bin/env bash
# `ringrec bench step` against the code as it was when issue 13 was filed (commit 8fd7d85,
# with the same command ported onto it: scripts/bench/step-8fd7d85.patch), on the same data,
# runs alternating old/new. Then the new command's scaling: 1, 2 and 4 ranks per host, and
# 4 ranks as 2 simulated hosts. Writes docs/bench/step.txt and docs/bench/step.jsonl.
#   scripts/bench/step_compare.sh                  # 2 ranks, batches 4096..65536, 3 repeats
#   REPEATS=5 BATCH=16384 scripts/bench/step_compare.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
REPEATS=${REPEATS:-3}
BATCH=${BATCH:-4096,16384,65536}
ROWS=${ROWS:-1000000}
OLD=8fd7d85
mkdir -p docs/bench target/bench
cargo build --release --locked
NEW=target/release/ringrec
# The old tree with the command ported onto it, built once.
WT=target/bench/old-$OLD
if [ ! -x "$WT-target/release/ringrec" ]; then
  rm -rf "$WT"; git worktree prune
  git worktree add --detach "$WT" "$OLD" >&2
  git -C "$WT" apply "$PWD/scripts/bench/step-8fd7d85.patch"
  (cd "$WT" && CARGO_TARGET_DIR="$PWD-target" cargo build --release --locked >&2)
fi
OLDBIN="$PWD/$WT-target/release/ringrec"
# The same TSV for both (each side prepares its own cache of it).
DATA=target/bench-data/synth-$((ROWS / 1000))k.tsv
mkdir -p target/bench-data
[ -s "$DATA" ] || "$NEW" data synth --rows "$ROWS" --out "$DATA" --seed 1
out=docs/bench/step.jsonl
: > "$out"
run() { # label np env... -- cmd...
  local label=$1 np=$2; shift 2
  local envs=(); while [ "$1" != "--" ]; do envs+=(-x "$1"); shift; done; shift
  env RINGREC_JOB_ID="step-$$-$RANDOM" scripts/mpirun.sh "${envs[@]}" -x RINGREC_JOB_ID -np "$np" "$@" \
    | python3 -c 'import json,sys; d=json.load(sys.stdin); d["label"]=sys.argv[1]; print(json.dumps(d))' "$label" >> "$out"
}
for rep in $(seq "$REPEATS"); do
  run "old np=2" 2 -- "$OLDBIN" bench step --data "$DATA" --data-dir target/bench/old-data --batch "$BATCH" --json
  run "new np=2" 2 -- "$NEW" bench step --data "$DATA" --data-dir target/bench/new-data --batch "$BATCH" --json
done
for np in 1 4; do
  run "new np=$np" "$np" -- "$NEW" bench step --data "$DATA" --data-dir target/bench/new-data --batch "$BATCH" --json
done
RINGREC_RANKS_PER_HOST=2 run "new np=4 (2 hosts)" 4 RINGREC_RANKS_PER_HOST -- "$NEW" bench step --data "$DATA" --data-dir target/bench/new-data --batch "$BATCH" --json
python3 scripts/bench/step_report.py "$out" | tee docs/bench/step.txt
