#!/usr/bin/env bash
# Issue 16's figures (the daily CTR job), each as a ratio or an equality in one run:
#   growth    `ringrec bench growth`: 50M distinct Zipf keys through a table of 1M slots;
#             each growth's pause against the step time (amortised over the steps since the
#             previous one; target <= 1.5 steps)
#   stream    `ringrec train` over 17 day files (zipf_tail_tsv.py, 1.5M rows each, one planted
#             model, a Zipf tail of new keys every day: about 50M distinct keys) + day_17 as
#             --eval-data, from --table-capacity 1048576:
#             the job finishes; growths, their time and the step time from the summary
#   prepare   `ringrec data prepare --threads 1` vs all threads on day_0.tsv (MB/s, 3 runs
#             each, interleaved; target >= 1.7x on 2 cores)
#   admission --admit-after 2 vs none on tail-1m.tsv (seeds 1-3): table rows, AUC (target
#             |diff| <= 0.002); admission-memory: the same from 262144 slots (tables grown to
#             what their rows need): bytes and the count-min sketch's
#   dtype     --table-dtype f32|f16|bf16 on tail-1m.tsv and the default set: bytes, AUC
#   predict   train -> predict (same ranks and batch): AUC/logloss equal to the last bit;
#             export -> scripts/bundle_predict.py: max |score diff| (target <= 1e-6)
#   warm      N steps, then M with --init-from (checkpoint: Adam; bundle: Adam and SGD) vs
#             N+M uninterrupted: params_fnv
# Writes docs/bench/daily/<part>.{txt,jsonl}. PART=growth,stream,... picks parts (default all).
#   scripts/bench/daily.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
R=target/release/ringrec
O=docs/bench/daily
D=target/bench-data/i16
mkdir -p "$O" "$D/days"
PART=${PART:-growth,stream,prepare,admission,admission-memory,dtype,predict,warm}
on() { [[ ",$PART," == *",$1,"* ]]; }
PY=$(scripts/bench/venv.sh) || { echo "daily.sh: no Python venv" >&2; exit 1; }
MPI=(scripts/mpirun.sh)
last_json() { grep -h '^{' "$1" | tail -n 1; }
[ -x "$R" ] || cargo build --release --locked
gen_days() {
  # 18 days of one planted model (--model-seed), each with its own rows (--seed), two at a time.
  for d in $(seq 0 17); do
    [ -s "$D/days/day_$d.tsv" ] || "$PY" scripts/bench/zipf_tail_tsv.py --rows 1500000 --out "$D/days/day_$d.tsv" --max-vocab 1000000000 --zipf 1.01 --seed $((101 + d)) --model-seed 7 &
    [ $((d % 2)) -eq 1 ] && wait
  done
  wait
  [ -s "$D/tail-1m.tsv" ] || "$PY" scripts/bench/zipf_tail_tsv.py --rows 1000000 --out "$D/tail-1m.tsv" --seed 1
}
gen_days

if on growth; then
  echo "== growth" >&2
  "$R" bench growth --keys 50000000 | tee "$O/growth.txt"
fi

if on stream; then
  echo "== stream" >&2
  rm -f "$O/stream-metrics.jsonl"
  "${MPI[@]}" -np 2 "$R" train --data "$D/days/day_[0-9].tsv" --data "$D/days/day_1[0-6].tsv" --eval-data "$D/days/day_17.tsv" \
    --table-capacity 1048576 --eval-every 5000 --metrics-out "$O/stream-metrics.jsonl" --json --no-progress \
    > "$O/stream.out" 2> "$O/stream.err"
  echo "exit $?" >> "$O/stream.err"
  last_json "$O/stream.out" > "$O/stream.jsonl"
  tail -n 3 "$O/stream.err" >&2
fi

if on prepare; then
  echo "== prepare" >&2
  : > "$O/prepare.txt"
  cat "$D/days/day_0.tsv" "$D/days/day_1.tsv" "$D/days/day_2.tsv" > /tmp/ringrec-3days.tsv
  for f in "$D/days/day_0.tsv" /tmp/ringrec-3days.tsv; do
    cat "$f" > /dev/null  # in the page cache for both
    for rep in 1 2 3 4 5; do
      for t in 1 $(nproc); do
        # ringrec's own figure: TSV bytes over the time from opening the TSV to the cache's rename.
        "$R" data prepare --threads "$t" "$f" /tmp/ringrec-prep.rrdata 2>&1 | grep -o "in [0-9.]*s (.*threads)" | sed "s|^|$(basename "$f") run $rep: |" | tee -a "$O/prepare.txt"
        rm -f /tmp/ringrec-prep.rrdata
      done
    done
  done
  rm -f /tmp/ringrec-3days.tsv
  "$PY" - "$O/prepare.txt" <<'PYX' | tee -a "$O/prepare.txt"
import re, statistics, sys
by = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\S+) run \d+: .*?([0-9.]+) MB/s of TSV, (\d+) threads", line)
    if m:
        by.setdefault((m.group(1), int(m.group(3))), []).append(float(m.group(2)))
for f in sorted({k[0] for k in by}):
    one, all_ = by[(f, 1)], by[(f, max(t for g, t in by if g == f))]
    print(f"{f}: 1 thread median {statistics.median(one):.1f} MB/s, all threads median {statistics.median(all_):.1f} MB/s: {statistics.median(all_) / statistics.median(one):.2f}x")
PYX
fi

train_json() { # label, np, args... -> one JSON line with the label into $OUTF
  local label=$1 np=$2; shift 2
  "${MPI[@]}" -np "$np" "$R" train --json --no-progress "$@" > /tmp/ringrec-daily.out 2> /tmp/ringrec-daily.err
  local rc=$? line; line=$(last_json /tmp/ringrec-daily.out)
  [ -n "$line" ] || line='{}'
  echo "$line" | "$PY" -c 'import json,sys; d=json.loads(sys.stdin.read()); d["label"]=sys.argv[1]; d["rc"]=int(sys.argv[2]); print(json.dumps(d))' "$label" "$rc" >> "$OUTF"
  [ $rc -eq 0 ] || tail -n 3 /tmp/ringrec-daily.err >&2
}

if on admission; then
  echo "== admission" >&2
  OUTF="$O/admission.jsonl"; : > "$OUTF"
  for seed in 1 2 3; do
    train_json "none seed=$seed" 2 --data "$D/tail-1m.tsv" --seed "$seed"
    train_json "admit-after 2 seed=$seed" 2 --data "$D/tail-1m.tsv" --seed "$seed" --admit-after 2
  done
fi
if on admission-memory; then
  # Memory: tables that start small and grow to what their rows need.
  echo "== admission-memory" >&2
  OUTF="$O/admission-memory.jsonl"; : > "$OUTF"
  train_json "none, from 262144 slots" 2 --data "$D/tail-1m.tsv" --table-capacity 262144
  train_json "admit-after 2, from 262144 slots" 2 --data "$D/tail-1m.tsv" --table-capacity 262144 --admit-after 2
  train_json "admit-after 2 --admit-sketch-mib 4, from 262144 slots" 2 --data "$D/tail-1m.tsv" --table-capacity 262144 --admit-after 2 --admit-sketch-mib 4
fi

if on dtype; then
  echo "== dtype" >&2
  OUTF="$O/dtype.jsonl"; : > "$OUTF"
  for dt in f32 f16 bf16; do
    train_json "tail-1m $dt" 2 --data "$D/tail-1m.tsv" --table-dtype "$dt"
    train_json "default $dt" 2 --table-dtype "$dt"
  done
fi

if on predict; then
  echo "== predict" >&2
  OUTF="$O/predict.jsonl"; : > "$OUTF"
  P=/tmp/ringrec-daily-predict; rm -rf "$P"; mkdir -p "$P"
  "$R" data synth --rows 200000 --out "$P/d.tsv" --seed 1 > /dev/null 2>&1
  train_json "train" 2 --data "$P/d.tsv" --checkpoint-dir "$P/ck" --sparse-optimizer adagrad
  "${MPI[@]}" -np 2 "$R" predict --model "$P/ck" --data "$P/d.tsv" --test-fraction 0.1 --out "$P/scores.tsv" --json 2>/dev/null | grep '^{' | sed 's/^{/{"label":"predict",/' >> "$OUTF"
  "$R" export --model "$P/ck" --out "$P/bundle" --json > /dev/null
  "$PY" scripts/bundle_predict.py "$P/bundle" "$P/d.tsv" --test-fraction 0.1 --compare "$P/scores.tsv" 2>&1 | tee "$O/predict.txt"
  "$PY" - "$OUTF" <<'PYX' | tee -a "$O/predict.txt"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
t = next(r for r in rows if r["label"] == "train"); p = next(r for r in rows if r["label"] == "predict")
print(f"train eval: AUC {t['test_auc']!r} logloss {t['test_logloss']!r}")
print(f"predict   : AUC {p['auc']!r} logloss {p['logloss']!r}")
print("bit-identical" if (t["test_auc"], t["test_logloss"]) == (p["auc"], p["logloss"]) else "DIFFERENT")
PYX
  rm -rf "$P"
fi

if on warm; then
  echo "== warm" >&2
  OUTF="$O/warm.jsonl"; : > "$OUTF"
  W=/tmp/ringrec-daily-warm; rm -rf "$W"; mkdir -p "$W"
  "$R" data synth --rows 200000 --out "$W/ab.tsv" --seed 1 > /dev/null 2>&1
  head -n 100000 "$W/ab.tsv" > "$W/a.tsv"; tail -n +100001 "$W/ab.tsv" > "$W/b.tsv"
  for opt in adam sgd; do
    c=(--test-fraction 0 --batch 1000 --dense-optimizer "$opt")
    [ "$opt" = sgd ] && c+=(--lr 0.05)
    train_json "$opt N=100 (a.tsv)" 2 --data "$W/a.tsv" --checkpoint-dir "$W/ckA-$opt" "${c[@]}"
    "$R" export --model "$W/ckA-$opt" --out "$W/bundle-$opt" --json > /dev/null
    train_json "$opt N+M=200 uninterrupted (ab.tsv)" 2 --data "$W/ab.tsv" "${c[@]}"
    train_json "$opt M=100 from checkpoint (b.tsv)" 2 --data "$W/b.tsv" --init-from "$W/ckA-$opt" "${c[@]}"
    grep -h "warm start" /tmp/ringrec-daily.err | tee -a "$O/warm.txt"
    train_json "$opt M=100 from export bundle (b.tsv)" 2 --data "$W/b.tsv" --init-from "$W/bundle-$opt" "${c[@]}"
    grep -h "warm start" /tmp/ringrec-daily.err | tee -a "$O/warm.txt"
  done
  rm -rf "$W"
fi
echo "daily.sh: outputs in $O" >&2
