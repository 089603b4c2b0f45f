#!/usr/bin/env bash
# Lazy synchronisation figure (issue 17 part 1): 4 ranks as 2 simulated hosts
# (RINGREC_RANKS_PER_HOST=2) on one machine, `--sync-every 1` (the synchronous reference)
# vs `--sync-every 4` with `--sync-scope rank` and `host` (and `--sync-every 8`, scope rank,
# to show the trend; and k=4 with --sparse-compression 1bit-l1 or bf16, the deltas packed), on two data sets, several seeds
# each, every configuration of a seed run back to back in the same script:
#   synth : the default synthetic set (200,000 rows, 10% held out), --batch 1024, 1 epoch;
#   criteo: the real Criteo sample (../shared/data, 10,000 rows, last 10% held out),
#           --batch 256, 3 epochs (105 steps; at the default --batch 1024 an epoch is 9 steps).
# Per run the summary JSON is kept under docs/bench/i17/raw/; the report (markdown tables:
# test AUC mean and spread over the seeds, cross-host bytes per sample, the zero-filtered
# sparse deltas as a fraction of the parameter volume) goes to stdout and
# docs/bench/i17/sync-report.md.
#   scripts/bench/sync_every.sh
#   SEEDS="1 2" SETS=synth scripts/bench/sync_every.sh
# Knobs: SEEDS (default 1 2 3 4 5), SETS (synth criteo), CONFIGS, SKIP_BUILD=1, DATA.
set -euo pipefail
cd "$(dirname "$0")/../.."
SEEDS=${SEEDS:-1 2 3 4 5}
SETS=${SETS:-synth criteo}
DATA=${DATA:-../shared/data/criteo_1tb_day0_10000.txt}
RAW=docs/bench/i17/raw
mkdir -p "$RAW"
if [ "${SKIP_BUILD:-0}" != 1 ]; then cargo build --release --locked; fi
export RINGREC_RANKS_PER_HOST=2
DD=$(mktemp -d)
trap 'rm -rf "$DD"' EXIT
declare -A CFG=([k1]="" [k4-rank]="--sync-every 4" [k4-host]="--sync-every 4 --sync-scope host" [k8-rank]="--sync-every 8" [k4-rank-sparse1bit]="--sync-every 4 --sparse-compression 1bit-l1" [k4-rank-sparsebf16]="--sync-every 4 --sparse-compression bf16")
CONFIGS=${CONFIGS:-k1 k4-rank k4-host k8-rank k4-rank-sparse1bit k4-rank-sparsebf16}
for set in $SETS; do
  case $set in
    synth) set_args=(--batch 1024) ;;
    criteo)
      if [ ! -s "$DATA" ]; then echo "sync_every.sh: $DATA is absent; skipping the Criteo runs" >&2; continue; fi
      set_args=(--data "$DATA" --batch 256 --epochs 3) ;;
    *) echo "sync_every.sh: unknown set $set (synth, criteo)" >&2; exit 2 ;;
  esac
  for seed in $SEEDS; do
    for c in $CONFIGS; do
      # shellcheck disable=SC2086
      scripts/mpirun.sh -np 4 target/release/ringrec train --json --no-progress --data-dir "$DD" \
        --seed "$seed" "${set_args[@]}" ${CFG[$c]} 2> "$RAW/$set-$c-seed$seed.log" | tail -1 > "$RAW/$set-$c-seed$seed.json"
      [ -s "$RAW/$set-$c-seed$seed.log" ] || rm -f "$RAW/$set-$c-seed$seed.log"
      echo "$set $c seed $seed: $(grep -o '"test_auc":[0-9.]*' "$RAW/$set-$c-seed$seed.json")" >&2
    done
  done
done
python3 - "$RAW" "$SETS" "$CONFIGS" <<'EOF' | tee docs/bench/i17/sync-report.md
import json, os, statistics, sys
raw, sets, configs = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()

def load(set_, cfg):
    runs = []
    for f in sorted(os.listdir(raw)):
        if f.startswith(f"{set_}-{cfg}-seed") and f.endswith(".json"):
            with open(os.path.join(raw, f)) as fh:
                runs.append(json.load(fh))
    return runs

def cross_per_sample(s):
    """Cross-host bytes sent by all ranks per sample, and where the dense half came from."""
    if "cross_host_bytes_per_sample" in s:
        return s["cross_host_bytes_per_sample"], "summary"
    # Model of the dense allreduce's cross-host bytes: the hier backend reduces inside each
    # host, then each local rank runs a ring allreduce of 1/local_size of the tensor among
    # the hosts: 2 (h-1)/h of the tensor per host and allreduce, h = hosts.
    h = s["hosts"]
    tensor = s["dense_param_bytes"] + 4  # the gradient and the loss (k=1) / the skip count (k>1)
    dense = s["dense_world_allreduces"] * h * 2 * (h - 1) / h * tensor
    return s["sparse_cross_host_bytes_per_sample"] + dense / s["samples"], "model"

def mean_spread(xs):
    m = statistics.mean(xs)
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return m, sd, min(xs), max(xs)

print("| set | config | seeds | test AUC mean | sd | min..max | AUC - k1 | cross-host B/sample (dense+sparse) | sparse only | ratio to k1 | dense source |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
fractions = []
for set_ in sets:
    base = None
    for cfg in configs:
        runs = [r for r in load(set_, cfg) if r.get("test_auc") is not None]
        if not runs:
            continue
        m, sd, lo, hi = mean_spread([r["test_auc"] for r in runs])
        cross = [cross_per_sample(r) for r in runs]
        c = statistics.mean(x for x, _ in cross)
        sp = statistics.mean(r["sparse_cross_host_bytes_per_sample"] for r in runs)
        if cfg == "k1":
            base = (m, c)
        d_auc = f"{m - base[0]:+.4f}" if base else "-"
        ratio = f"{c / base[1]:.3f}" if base else "-"
        print(f"| {set_} | {cfg} | {len(runs)} | {m:.4f} | {sd:.4f} | {lo:.4f}..{hi:.4f} | {d_auc} | {c:.0f} | {sp:.0f} | {ratio} | {cross[0][1]} |")
        for r in runs:
            if r["sync_every"] > 1 and r["syncs"] > 0:
                fractions.append((set_, cfg, r))
print()
print("Zero-filtered sparse deltas (k > 1): per sync and host, bytes sent to the other host (node->server)")
print("and received from it (back), against the parameter volume touched since the last sync and the")
print("whole model (table rows x dim x 4 + dense bytes). Seed 000: 0.87% sent, 2.83% back (of the whole model).")
print()
print("| set | config | rows touched / sync / host | changed (sent) | sent / touched volume | sent / whole model | received / whole model |")
print("|---|---|---|---|---|---|---|")
groups = {}
for set_, cfg, r in fractions:
    groups.setdefault((set_, cfg), []).append(r)
for (set_, cfg), runs in groups.items():
    rows = []
    for r in runs:
        per = r["syncs"] * r["hosts"]
        touched = r["sync_touched_rows"] / per
        changed = r["sync_delta_rows"] / per
        sent = r["sync_delta_cross_bytes_sent"] / per / (r["hosts"] - 1)
        recv = r["sync_delta_cross_bytes_received"] / per / (r["hosts"] - 1)
        model = r["table_rows"] * 64 + r["dense_param_bytes"]
        rows.append((touched, changed, sent / max(touched * 64, 1), sent / model, recv / model))
    t, ch, ft, fm, fr = (statistics.mean(x[i] for x in rows) for i in range(5))
    print(f"| {set_} | {cfg} | {t:.0f} | {ch:.0f} | {100 * ft:.1f}% | {100 * fm:.2f}% | {100 * fr:.2f}% |")
EOF
