#!/usr/bin/env bash
# Issue 17's time-decay figure: a drifting synthetic stream (zipf_tail_tsv.py --drift: each
# day a share of the planted value effects is redrawn; --duplicates: repeated rows), DAYS day
# files trained in order by 4 ranks as 2 simulated hosts, unweighted vs
# `--decay-base 2 --merge-duplicates`, evaluated on held-out rows of the LAST day
# (--eval-data: the last day's model, other rows), over 3 seeds.
#   scripts/bench/decay.sh            (DAYS=12 ROWS=20000 EVAL=20000 DRIFT=0.3 DUP=0.2 SEEDS="1 2 3"
#                                      BATCH=1024 EXTRA= MODES="unweighted weighted")
# MODES: unweighted (no flag), weighted (--decay-base 2 --merge-duplicates), decay
# (--decay-base 2 alone), merge (--merge-duplicates alone), reweigh (--decay-base 2
# --min-sample-weight 0: weights without dropping old days), weighted-rows and decay-rows
# (the same with --loss-normalize rows: a batch's loss divided by its rows, not its weight
# sum). EXTRA: flags for every run.
# Writes OUT (default docs/bench/i17/decay.jsonl, one record per run) and the table beside it (.txt).
set -uo pipefail
cd "$(dirname "$0")/../.."
R=target/release/ringrec
O=docs/bench/i17
DAYS=${DAYS:-12} ROWS=${ROWS:-20000} EVAL=${EVAL:-20000} DRIFT=${DRIFT:-0.3} DUP=${DUP:-0.2} SEEDS=${SEEDS:-1 2 3}
BATCH=${BATCH:-1024}
EXTRA=${EXTRA:-}
MODES=${MODES:-unweighted weighted}
D=target/bench-data/i17-decay
mkdir -p "$O" "$D"
PY=$(scripts/bench/venv.sh) || { echo "decay.sh: no Python venv" >&2; exit 1; }
[ -x "$R" ] || cargo build --release --locked
OUT=${OUT:-$O/decay.jsonl}
: > "$OUT"
for s in $SEEDS; do
  dir="$D/m$s-d$DRIFT-u$DUP-r$ROWS"
  mkdir -p "$dir"
  last=$((DAYS - 1))
  for d in $(seq 0 "$last"); do
    [ -s "$dir/day_$d.tsv" ] || "$PY" scripts/bench/zipf_tail_tsv.py --rows "$ROWS" --max-vocab 100000 --model-seed "$s" \
      --drift "$DRIFT" --day "$d" --duplicates "$DUP" --seed $((1000 * s + d)) --out "$dir/day_$d.tsv" 2>/dev/null
  done
  [ -s "$dir/eval_$last.tsv" ] || "$PY" scripts/bench/zipf_tail_tsv.py --rows "$EVAL" --max-vocab 100000 --model-seed "$s" \
    --drift "$DRIFT" --day "$last" --seed $((1000 * s + 999)) --out "$dir/eval_$last.tsv" 2>/dev/null
  for mode in $MODES; do
    case $mode in
      unweighted) flags=() ;;
      weighted) flags=(--decay-base 2 --merge-duplicates) ;;
      decay) flags=(--decay-base 2) ;;
      merge) flags=(--merge-duplicates) ;;
      reweigh) flags=(--decay-base 2 --min-sample-weight 0) ;;
      weighted-rows) flags=(--decay-base 2 --merge-duplicates --loss-normalize rows) ;;
      decay-rows) flags=(--decay-base 2 --loss-normalize rows) ;;
      *) echo "decay.sh: unknown mode $mode" >&2; exit 2 ;;
    esac
    # shellcheck disable=SC2086
    "$PY" scripts/bench/json_run.py --out "$OUT" --label "$mode seed $s" --set mode="$mode" --set seed="$s" -- \
      env RINGREC_RANKS_PER_HOST=2 scripts/mpirun.sh -np 4 "$R" train --data "$dir/day_[0-9]*.tsv" --eval-data "$dir/eval_$last.tsv" \
      --batch "$BATCH" --seed "$s" --json --no-progress ${flags[@]+"${flags[@]}"} $EXTRA
  done
done
"$PY" - "$OUT" <<'PYEOF' | tee "${OUT%.jsonl}.txt"
import json, sys, statistics as st
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {}
for r in rows:
    if r.get("test_auc") is None:
        print("failed:", r.get("label"), r.get("error", "")[:300]); continue
    by.setdefault(r["mode"], []).append(r)
print("| mode | seeds | last-day AUC mean | spread (min..max) | train rows | merged | dropped | steps |")
print("|---|---|---|---|---|---|---|---|")
for m in ("unweighted", "weighted", "decay", "merge", "reweigh", "weighted-rows", "decay-rows"):
    rs = by.get(m, [])
    if not rs: continue
    a = [r["test_auc"] for r in rs]
    print(f"| {m} | {len(rs)} | {st.mean(a):.4f} | {min(a):.4f}..{max(a):.4f} | {st.mean(r['train_rows'] for r in rs):.0f} | {st.mean(r['samples_merged'] for r in rs):.0f} | {st.mean(r['samples_dropped_by_weight'] for r in rs):.0f} | {st.mean(r['steps'] for r in rs):.0f} |")
u = {r["seed"]: r["test_auc"] for r in by.get("unweighted", [])}
for m in ("weighted", "decay", "merge", "reweigh", "weighted-rows", "decay-rows"):
    d = [r["test_auc"] - u[r["seed"]] for r in by.get(m, []) if r["seed"] in u]
    if d:
        print(f"\n{m} - unweighted AUC per seed: {', '.join(f'{x:+.4f}' for x in d)}; mean {st.mean(d):+.4f}")
PYEOF
