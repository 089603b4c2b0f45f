#!/usr/bin/env bash
# Checkpoint overhead (issue 34 item 5): training samples/s with `--checkpoint-every 100`
# against the same run without checkpoints, in the same script, back to back, REPEATS runs
# each (interleaved): 2 ranks, the default model and table (2^21 slots: a 151 MB table
# file), the default synthetic set, 3 epochs = 528 steps, `--no-eval`. Three variants:
#   none       no --checkpoint-dir (the reference)
#   background --checkpoint-every 100 (6 checkpoints: steps 100..500 and the last, 528),
#              written by a background thread from a snapshot (the default)
#   sync       the same with RINGREC_CHECKPOINT_BACKGROUND=0 (each written as the step's
#              last act, as before)
# Per run: samples/s and train_seconds of the summary, and the wall time of the whole
# command (start-up, the final checkpoint's wait, exit). Raw summaries and logs go to
# docs/bench/ckpt/raw/, the report to stdout and docs/bench/ckpt/report.md.
#   scripts/bench/checkpoint_overhead.sh
#   REPEATS=5 SKIP_BUILD=1 scripts/bench/checkpoint_overhead.sh
#   NP=1 SKIP_BUILD=1 scripts/bench/checkpoint_overhead.sh   # 1 rank: a core left for the writer
set -euo pipefail
cd "$(dirname "$0")/../.."
REPEATS=${REPEATS:-3}
RAW=docs/bench/ckpt/raw
mkdir -p "$RAW"
if [ "${SKIP_BUILD:-0}" != 1 ]; then cargo build --release --locked --features cuda; fi
DD=$(mktemp -d)
CK=$(mktemp -d -p "${CKPT_PARENT:-$PWD/target}" ckpt-bench.XXXXXX)
trap 'rm -rf "$DD" "$CK"' EXIT
run() { # variant repeat
  local v=$1 r=$2 args=() bg=1
  case $v in
    none) ;;
    background) args=(--checkpoint-dir "$CK/$v-$r" --checkpoint-every 100) ;;
    sync) args=(--checkpoint-dir "$CK/$v-$r" --checkpoint-every 100); bg=0 ;;
  esac
  local t0 t1
  t0=$(date +%s.%N)
  RINGREC_CHECKPOINT_BACKGROUND=$bg scripts/mpirun.sh -np "${NP:-2}" -x RINGREC_CHECKPOINT_BACKGROUND target/release/ringrec train --json --no-progress --no-eval \
    --data-dir "$DD" --epochs 3 "${args[@]}" 2> "$RAW/$v-$r.log" | tail -1 > "$RAW/$v-$r.json"
  t1=$(date +%s.%N)
  python3 -c "import json,sys; p='$RAW/$v-$r.json'; s=json.load(open(p)); s['wall_seconds']=$t1-$t0; s['load_average']=open('/proc/loadavg').read().split()[0]; json.dump(s, open(p,'w'))"
  rm -rf "${CK:?}/$v-$r"
  echo "$v run $r: $(grep -o '"samples_per_sec":[0-9.]*' "$RAW/$v-$r.json")" >&2
}
# The data set is made (and cached) once, outside the timed runs.
scripts/mpirun.sh -np 2 target/release/ringrec train --no-progress --no-eval --data-dir "$DD" --max-steps 1 > /dev/null 2>&1
for r in $(seq 1 "$REPEATS"); do
  for v in none background sync; do run "$v" "$r"; done
done
python3 - "$RAW" "$REPEATS" <<'PY' | tee docs/bench/ckpt/report.md
import json, statistics, sys
raw, n = sys.argv[1], int(sys.argv[2])
rows = {}
for v in ["none", "background", "sync"]:
    rows[v] = [json.load(open(f"{raw}/{v}-{r}.json")) for r in range(1, n + 1)]
ref = statistics.median(s["samples_per_sec"] for s in rows["none"])
ref_wall = statistics.median(s["wall_seconds"] for s in rows["none"])
print("| variant | samples/s (each run) | median | vs none | train s (median) | wall s (median) | wall vs none | checkpoints | params_fnv |")
print("|---|---|---:|---:|---:|---:|---:|---:|---|")
for v, ss in rows.items():
    sps = [s["samples_per_sec"] for s in ss]
    med = statistics.median(sps)
    wall = statistics.median(s["wall_seconds"] for s in ss)
    fnv = sorted({s["params_fnv"] for s in ss})
    print(f"| {v} | {', '.join(f'{x:,.0f}' for x in sps)} | {med:,.0f} | **{100 * med / ref:.1f}%** | {statistics.median(s['train_seconds'] for s in ss):.2f} | {wall:.2f} | {100 * ref_wall / wall:.1f}% | {ss[0].get('checkpoints_written', 0)} | {' '.join(fnv)} |")
print()
print("load average (1 min) at each run's end: " + ", ".join(f"{v} {' '.join(s['load_average'] for s in ss)}" for v, ss in rows.items()))
PY
