#!/usr/bin/env bash
# Issue 17's weight-column figures: what reading a weight column costs.
# 1. `ringrec data prepare` of the same ROWS synthetic rows without a weight column (plain),
#    with the weight last (--weight-column 41) and right after the label (--weight-column 2),
#    THREADS threads, REPS interleaved repetitions each; best and median rows/s.
# 2. `ringrec train` on NP ranks (1 epoch, held-out split): the plain file, the file with
#    every weight 1 (must give the plain run's params_fnv) and with uneven weights
#    (0.5, 0.75, 1, 1.25 in turn): samples/s, test AUC, params_fnv.
#   scripts/bench/weight_column.sh     (ROWS=1000000 REPS=5 THREADS="1 2" NP=2 TRAIN_ROWS=200000)
# Raw outputs under docs/bench/i17/raw/weight-column/.
set -uo pipefail
cd "$(dirname "$0")/../.."
R=target/release/ringrec
ROWS=${ROWS:-1000000} REPS=${REPS:-5} THREADS=${THREADS:-1 2} NP=${NP:-2} TRAIN_ROWS=${TRAIN_ROWS:-200000}
D=target/bench-data/i17-weight-column
O=docs/bench/i17/raw/weight-column
mkdir -p "$D" "$O"
[ -x "$R" ] || cargo build --release --locked
# $1 rows -> plain, ones (weight 1 last), w41 (uneven, last), w2 (uneven, field 2) TSVs under $D/$1.
make_files() {
  local dir="$D/$1"
  mkdir -p "$dir"
  [ -s "$dir/plain.tsv" ] || "$R" data synth --rows "$1" --seed 1 --out "$dir/plain.tsv" >/dev/null
  [ -s "$dir/ones.tsv" ] || awk 'BEGIN{FS=OFS="\t"}{print $0, 1}' "$dir/plain.tsv" > "$dir/ones.tsv"
  [ -s "$dir/w41.tsv" ] || awk 'BEGIN{FS=OFS="\t"}{print $0, (NR%4)*0.25+0.5}' "$dir/plain.tsv" > "$dir/w41.tsv"
  [ -s "$dir/w2.tsv" ] || awk 'BEGIN{FS=OFS="\t"}{l=$1; $1=""; print l "\t" ((NR%4)*0.25+0.5) $0}' "$dir/plain.tsv" > "$dir/w2.tsv"
}
make_files "$ROWS"
P="$O/prepare.txt"
: > "$P"
for t in $THREADS; do
  for r in $(seq 1 "$REPS"); do
    for v in plain w41 w2; do
      case $v in plain) col=() ;; w41) col=(--weight-column 41) ;; w2) col=(--weight-column 2) ;; esac
      echo "$v threads=$t rep=$r: $("$R" data prepare "$D/$ROWS/$v.tsv" "$D/$ROWS/$v.rrdata" --threads "$t" "${col[@]}")" >> "$P"
    done
  done
done
python3 - "$P" <<'EOF'
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\w+) threads=(\d+) rep=\d+: .*\((\d+) rows/s", line)
    if m:
        runs.setdefault((m.group(1), int(m.group(2))), []).append(int(m.group(3)))
print("| file | threads | best rows/s | median rows/s | runs |")
print("|---|---|---|---|---|")
for (v, t), r in sorted(runs.items(), key=lambda kv: (kv[0][1], ["plain", "w41", "w2"].index(kv[0][0]))):
    print(f"| {v} | {t} | {max(r):,} | {int(statistics.median(r)):,} | {len(r)} |")
EOF
make_files "$TRAIN_ROWS"
T="$O/train.jsonl"
: > "$T"
for v in plain ones w41; do
  case $v in plain) col=() ;; *) col=(--weight-column 41) ;; esac
  RINGREC_DATA_DIR="$D/data" scripts/mpirun.sh -np "$NP" -x RINGREC_DATA_DIR "$R" train --json --no-progress \
    --data "$D/$TRAIN_ROWS/$v.tsv" "${col[@]}" 2> "$D/train-$v.log" | tail -1 | sed "s/^{/{\"file\":\"$v\",/" >> "$T"
done
python3 - "$T" <<'EOF'
import json, sys
print("| file | samples/s | test AUC | test logloss | params_fnv |")
print("|---|---|---|---|---|")
for line in open(sys.argv[1]):
    s = json.loads(line)
    print(f"| {s['file']} | {s['samples_per_sec']:,.0f} | {s['test_auc']:.5f} | {s['test_logloss']:.5f} | {s['params_fnv']} |")
EOF
