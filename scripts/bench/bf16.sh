#!/usr/bin/env bash
# bf16 mixed precision (issue 31 item 5): `ringrec train --dense-precision bf16` against
# ringrec f32, PyTorch f32 and PyTorch under torch.autocast("cpu", dtype=torch.bfloat16)
# (scripts/bench/torch_ctr.py --autocast bf16), 1 rank / 1 process, the default model
# (dim 16, MLP 429-256-128-1, dense Adam, embedding SGD, global batch 1024) on the same
# 200k-row synthetic Criteo TSV as scripts/bench/train.sh.
# PyTorch at its best: each precision at 1, 2 and nproc threads (TORCH_THREADS), every run
# its own row; the reference is the fastest PyTorch row of either precision.
# Figures (printed, and into docs/bench/bf16.txt): samples/s of each row (best of REPEATS),
# ringrec bf16 / best PyTorch (target >= 1.5x), ringrec bf16 / ringrec f32, the test AUC
# difference ringrec bf16 - ringrec f32 (target |diff| <= 0.002), and where ringrec's time
# goes (phase_seconds, the MLP's GFLOP/s). Raw runs: docs/bench/bf16.jsonl, stderr in
# docs/bench/bf16.log. Not used by CI.
#   scripts/bench/bf16.sh
#   REPEATS=3 scripts/bench/bf16.sh
# Knobs: SKIP_BUILD=1 (the existing target/release/ringrec), ROWS, DATA, TORCH_THREADS,
# THREADS (ringrec's threads per rank; default nproc), MPI_ARGS.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROWS=${ROWS:-200000}
REPEATS=${REPEATS:-1}
DATA=${DATA:-target/bench-data/synth-$((ROWS / 1000))k.tsv}
OUT=docs/bench/bf16.jsonl
LOG=docs/bench/bf16.log
mkdir -p docs/bench target/bench-data
CORES=$(nproc)
THREADS=${THREADS:-$CORES}
uniq_words() { tr ' ' '\n' <<< "$*" | awk 'NF && $1 > 0 && !seen[$1]++' | paste -sd' ' -; }
TORCH_THREADS=$(uniq_words "${TORCH_THREADS:-1 2 $CORES}")

PY=$(WITH_TORCH=1 scripts/bench/venv.sh) || { echo "bf16.sh: no Python venv" >&2; exit 1; }
if [ "${SKIP_BUILD:-0}" = 1 ]; then
  echo "SKIP_BUILD=1: using the existing target/release/ringrec" >&2
elif ! cargo build --release --locked --features cuda; then
  echo "bf16.sh: cargo build --release failed; ringrec runs will be recorded as failures" >&2
fi
RINGREC=target/release/ringrec
if [ ! -s "$DATA" ]; then
  "$RINGREC" data synth --rows "$ROWS" --out "$DATA" --seed 1 || "$PY" scripts/bench/synth_tsv.py --rows "$ROWS" --out "$DATA" --seed 1 || exit 1
fi
echo "data: $DATA ($(wc -l < "$DATA") rows)" >&2

: > "$OUT"
: > "$LOG"
read -r -a mpi_extra <<< "${MPI_ARGS:-}"
record() { "$PY" scripts/bench/json_run.py --out "$OUT" --log "$LOG" "$@" > /dev/null; }
common=(--data "$DATA" --batch 1024 --dim 16 --epochs 1 --json)
for rep in $(seq "$REPEATS"); do
  for p in f32 bf16; do
    record --label "ringrec $p" --set impl=ringrec --set precision="$p" --set repeat="$rep" -- \
      scripts/mpirun.sh "${mpi_extra[@]}" -np 1 "$RINGREC" train "${common[@]}" --no-progress \
      --threads "$THREADS" --dense-precision "$p"
  done
  for p in none bf16; do
    name=$([ "$p" = none ] && echo f32 || echo "autocast-bf16")
    for t in $TORCH_THREADS; do
      record --label "pytorch $name threads=$t" --set impl=pytorch --set precision="$name" \
        --set threads="$t" --set repeat="$rep" -- \
        "$PY" scripts/bench/torch_ctr.py "${common[@]}" --embedding-grad sparse --threads "$t" \
        --autocast "$p" --progress-every 0
    done
  done
done

{
  echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), load average $(cut -d' ' -f1-3 /proc/loadavg), data $DATA, best of $REPEATS"
  "$PY" - "$OUT" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
best = {}
for r in rows:
    if "error" in r or not r.get("samples_per_sec"):
        print(f"FAILED {r.get('label')}: {r.get('error', 'no samples/s')}")
        continue
    if r["label"] not in best or r["samples_per_sec"] > best[r["label"]]["samples_per_sec"]:
        best[r["label"]] = r
print(f"{'run':34} {'samples/s':>10} {'train loss':>10} {'test AUC':>9}")
for label, r in best.items():
    print(f"{label:34} {r['samples_per_sec']:>10,.0f} {r['train_loss']:>10.5f} {r['test_auc']:>9.5f}")
torch = [r for r in best.values() if r.get("impl") == "pytorch"]
r16, r32 = best.get("ringrec bf16"), best.get("ringrec f32")
if torch and r16:
    ref = max(torch, key=lambda r: r["samples_per_sec"])
    ratio = r16["samples_per_sec"] / ref["samples_per_sec"]
    print(f"\nringrec bf16 / PyTorch best ({ref['label']})   {ratio:.2f}x  "
          f"({r16['samples_per_sec']:,.0f} / {ref['samples_per_sec']:,.0f} samples/s)  "
          f"target >= 1.5x: {'met' if ratio >= 1.5 else 'NOT met'}")
if r16 and r32:
    print(f"ringrec bf16 / ringrec f32                      {r16['samples_per_sec'] / r32['samples_per_sec']:.2f}x")
    d = r16["test_auc"] - r32["test_auc"]
    print(f"test AUC ringrec bf16 - f32                    {d:+.5f}  ({r16['test_auc']:.5f} - {r32['test_auc']:.5f})  "
          f"target |diff| <= 0.002: {'met' if abs(d) <= 0.002 else 'NOT met'}")
    for r in (r32, r16):
        ph = ", ".join(f"{k} {v:.3f}" for k, v in sorted(r.get("phase_seconds", {}).items(), key=lambda kv: -kv[1]) if v >= 0.005)
        print(f"{r['label']:12} train {r['train_seconds']:.2f} s, MLP {r.get('mlp_gflops', 0):.0f} GFLOP/s; phases (s): {ph}")
t16 = [r for r in torch if r.get("precision") == "autocast-bf16"]
t32 = [r for r in torch if r.get("precision") == "f32"]
if t16 and t32:
    a, b = max(t16, key=lambda r: r["samples_per_sec"]), max(t32, key=lambda r: r["samples_per_sec"])
    print(f"PyTorch autocast bf16 / f32 (best of each)      {a['samples_per_sec'] / b['samples_per_sec']:.2f}x, "
          f"test AUC {a['test_auc'] - b['test_auc']:+.5f}")
EOF
} | tee docs/bench/bf16.txt
