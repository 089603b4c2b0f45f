#!/usr/bin/env bash
# The pipelined step's figure (issue 30, point 3): `ringrec train` samples/s with
# `--pipeline on` vs `--pipeline off`, on `--device cpu` and `--device host`, at 1 and 2
# ranks, on this machine. Each (device, ranks) pair runs off and on back to back, REPS
# times, alternating, so both see the same load; the table gives the median samples/s of
# each, their ratio (on / off, the figure), the device's wait for the host per step
# (`gpu_wait` of phase_seconds), the batches read ahead, and whether both ended with the
# same params_fnv (the correctness column: the pipeline changes no bit).
#   scripts/bench/pipeline.sh                 # release build, then the runs
#   REPS=5 DEVICES=cpu NPS=1 scripts/bench/pipeline.sh
# Knobs: REPS (5), DEVICES (cpu host), NPS (1 2), SKIP_BUILD=1, OUT (docs/bench/pipeline).
# Per run the summary JSON goes to $OUT/raw.jsonl; the table to stdout and $OUT/report.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
REPS=${REPS:-5}
DEVICES=${DEVICES:-cpu host}
NPS=${NPS:-1 2}
OUT=${OUT:-docs/bench/pipeline}
mkdir -p "$OUT"
if [ "${SKIP_BUILD:-0}" != 1 ]; then cargo build --release --locked --features cuda; fi
DD=$(mktemp -d)
trap 'rm -rf "$DD"' EXIT
: > "$OUT/raw.jsonl"
# The CPU device trains the default model at the default batch; the host device (the GPU
# path's kernels compiled for the CPU, one kernel thread at a time) a small MLP.
args_for() {
  case $1 in
    cpu) echo "--synth-rows 100000 --batch 1024 --max-steps 200 --epochs 3" ;;
    host) echo "--synth-rows 100000 --batch 1024 --hidden 32,16 --max-steps 60" ;;
    *) echo "pipeline.sh: unknown device $1 (cpu, host)" >&2; exit 2 ;;
  esac
}
for dev in $DEVICES; do
  for np in $NPS; do
    for rep in $(seq "$REPS"); do
      for mode in off on; do
        # shellcheck disable=SC2046
        line=$(scripts/mpirun.sh -np "$np" target/release/ringrec train --json --no-progress --no-eval \
          --data-dir "$DD" --device "$dev" --pipeline "$mode" $(args_for "$dev") 2>/dev/null | tail -1)
        echo "$line" | python3 -c "
import json, sys
s = json.loads(sys.stdin.read())
s.update(bench_device='$dev', bench_ranks=$np, bench_mode='$mode', bench_rep=$rep)
print(json.dumps(s))" >> "$OUT/raw.jsonl"
        echo "$dev np=$np $mode rep $rep: $(tail -1 "$OUT/raw.jsonl" | grep -o '"samples_per_sec": [0-9.]*')" >&2
      done
    done
  done
done
python3 - "$OUT/raw.jsonl" "$REPS" <<'EOF' | tee "$OUT/report.md"
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(f"`scripts/bench/pipeline.sh` (REPS={sys.argv[2]}; medians; the machine's {runs[0]['threads_per_rank'] * runs[0]['ranks']} threads shared with other work)\n")
print("| device | ranks | off samples/s | on samples/s | on / off | gpu_wait ms/step off | on | read ahead (on) | params_fnv equal |")
print("|---|---|---|---|---|---|---|---|---|")
keys = sorted({(r["bench_device"], r["bench_ranks"]) for r in runs}, key=lambda k: (k[0] != "cpu", k[0], k[1]))
for dev, np in keys:
    sel = {m: [r for r in runs if (r["bench_device"], r["bench_ranks"], r["bench_mode"]) == (dev, np, m)] for m in ("off", "on")}
    rate = {m: statistics.median(r["samples_per_sec"] for r in sel[m]) for m in sel}
    wait = {m: statistics.median(1e3 * r["phase_seconds"].get("gpu_wait", 0) / max(r["steps"], 1) for r in sel[m]) for m in sel}
    fnvs = {r["params_fnv"] for m in sel for r in sel[m]}
    ahead = f"{sel['on'][0]['prefetched_batches']}/{sel['on'][0]['steps']}"
    print(f"| {dev} | {np} | {rate['off']:,.0f} | {rate['on']:,.0f} | {rate['on'] / rate['off']:.3f} | {wait['off']:.2f} | {wait['on']:.2f} | {ahead} | {'yes' if len(fnvs) == 1 else 'NO: ' + ' '.join(sorted(fnvs))} |")
EOF
