#!/usr/bin/env bash
# 1-bit compression (issue 17, design 001) on 4 ranks as 2 simulated hosts: each dense form
# (1bit = L2 scale, 1bit lambda 0.5, 1bit-l1) and the sparse rows' forms against no
# compression, in the same script, on the default synthetic set and on the real Criteo
# sample (../shared/data, skipped with a note when absent), several seeds each. Reports test
# AUC (mean, spread, difference to none; target within 0.01), the dense bytes on the wire
# per step against the float32 bytes (target 1/32 plus the scales) and the cross-host bytes
# per sample (dense + sparse). Each dense form also with --compression-warmup $WARMUP (20)
# exact steps first. Criteo: --batch 256 (108 steps; the default 1024 gives 27 steps and an
# underfit reference). Writes docs/bench/compression.{jsonl,txt,log}.
#   scripts/bench/compression.sh
#   SEEDS="1 2 3 4 5" SKIP_BUILD=1 scripts/bench/compression.sh
#   NAME=compression-half MODES="none sparse-fp16 sparse-bf16" scripts/bench/compression.sh   (a subset, by label)
set -uo pipefail
cd "$(dirname "$0")/../.."
SEEDS=${SEEDS:-1 2 3}
CRITEO=${CRITEO:-../shared/data/criteo_1tb_day0_10000.txt}
NAME=${NAME:-compression}
OUT=docs/bench/$NAME.jsonl
LOG=docs/bench/$NAME.log
mkdir -p docs/bench
PY=$(scripts/bench/venv.sh) || { echo "compression.sh: no Python venv" >&2; exit 1; }
if [ "${SKIP_BUILD:-0}" != 1 ]; then cargo build --release --locked || exit 1; fi
RINGREC=target/release/ringrec
: > "$OUT"
: > "$LOG"
record() { "$PY" scripts/bench/json_run.py --out "$OUT" --log "$LOG" "$@" > /dev/null; }
sets=(synthetic)
if [ -s "$CRITEO" ]; then sets+=(criteo); else echo "compression.sh: $CRITEO is absent: the Criteo half is skipped" >&2; fi
W=${WARMUP:-20}
modes=("none|" "1bit|--compression 1bit" "1bit-lambda0.5|--compression 1bit --onebit-lambda 0.5" "1bit-l1|--compression 1bit-l1"
       "1bit+warmup$W|--compression 1bit --compression-warmup $W" "1bit-lambda0.5+warmup$W|--compression 1bit --onebit-lambda 0.5 --compression-warmup $W"
       "1bit-l1+warmup$W|--compression 1bit-l1 --compression-warmup $W"
       "sparse-1bit-l1|--sparse-compression 1bit-l1" "sparse-1bit-lambda0.5|--sparse-compression 1bit --onebit-lambda 0.5"
       "sparse-fp16|--sparse-compression fp16" "sparse-bf16|--sparse-compression bf16")
for set in "${sets[@]}"; do
  case $set in
    synthetic) data=() ;;
    criteo) data=(--data "$CRITEO" --test-fraction 0.1 --epochs 3 --batch 256 --hidden 256,128 --lr 0.001 --sparse-lr 0.05 --sparse-optimizer sgd) ;;
  esac
  for seed in $SEEDS; do
    for m in "${modes[@]}"; do
      label=${m%%|*}
      if [ -n "${MODES:-}" ] && [[ " $MODES " != *" $label "* ]]; then continue; fi
      read -r -a flags <<< "${m#*|}"
      record --label "$set $label" --set set="$set" --set mode="$label" --set seed="$seed" -- \
        env RINGREC_RANKS_PER_HOST=2 scripts/mpirun.sh -x RINGREC_RANKS_PER_HOST -np 4 "$RINGREC" train \
          "${data[@]}" --seed "$seed" --json --no-progress "${flags[@]}"
      echo "$set seed $seed $label: $(tail -c 300 "$OUT" | grep -o '"test_auc":[^,]*' | tail -1)" >&2
    done
  done
done
{
  echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) 4 ranks as 2 simulated hosts (RINGREC_RANKS_PER_HOST=2), seeds $SEEDS, $(nproc) cores"
  "$PY" - "$OUT" <<'PY'
import json, sys, statistics as st
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
bad = [r for r in rows if "error" in r]
for r in bad:
    print("FAILED:", r.get("label"), r.get("error", "")[:200])
ok = [r for r in rows if "error" not in r and r.get("test_auc") is not None]
for s in dict.fromkeys(r["set"] for r in ok):
    base = [r["test_auc"] for r in ok if r["set"] == s and r["mode"] == "none"]
    print(f"\n## {s}\n")
    print("| mode | test AUC mean (min..max) | AUC - none | per seed | dense wire / f32 bytes | dense wire bytes per step | cross-host bytes per sample (dense + sparse) | sparse cross-host bytes per sample |")
    print("|---|---|---|---|---|---|---|---|")
    for m in dict.fromkeys(r["mode"] for r in ok if r["set"] == s):
        rs = [r for r in ok if r["set"] == s and r["mode"] == m]
        auc = [r["test_auc"] for r in rs]
        wire = st.mean(r["dense_wire_bytes_per_step"] / r["dense_bytes_per_step"] for r in rs)
        wps = st.mean(r["dense_wire_bytes_per_step"] for r in rs)
        cross = st.mean(r["cross_host_bytes_per_sample"] for r in rs)
        sparse = st.mean(r["sparse_cross_host_bytes_per_sample"] for r in rs)
        diff = st.mean(auc) - st.mean(base) if base else float("nan")
        by_seed = {r["seed"]: r["test_auc"] for r in ok if r["set"] == s and r["mode"] == "none"}
        paired = " ".join(f"{r['test_auc'] - by_seed[r['seed']]:+.4f}" for r in rs if r["seed"] in by_seed)
        print(f"| {m} | {st.mean(auc):.5f} ({min(auc):.5f}..{max(auc):.5f}) | {diff:+.5f} | {paired} | 1/{1 / wire:.1f} | {wps:,.0f} | {cross:,.0f} | {sparse:,.0f} |")
PY
} | tee docs/bench/$NAME.txt
