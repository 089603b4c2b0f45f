#!/usr/bin/env bash
# Issue 33 (points 3-4): training samples/s with `--table` — two tables beside the default
# one, one of another dim (`--model mlp`, one input vector) — on the multi-hot set, at 1 and
# 2 ranks, `--device cpu` and `--device host`, this build against BASE_BIN (an older build,
# e.g. main's, whose `--table` gathered and pooled on the host) in the same rounds. Each
# line: the load average before it, samples/s, params_fnv (the same model both ways: the
# gathering's values and sums are the same) and rank 0's phase seconds. The ratio is
# this build's samples/s over the base's, per (device, ranks), the median over RUNS rounds.
# The set is scripts/bench/multihot.sh's (run it once first); STEPS steps per run, no
# held-out rows (the figure is the training steps'; samples_per_sec counts them alone).
#   BASE_BIN=/path/to/old/ringrec RUNS=3 [DEVICES="cpu host"] scripts/bench/table_speed.sh [OUT]
#   (OUT: docs/bench/table-speed.txt)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
bin=${RINGREC_BIN:-$root/${CARGO_TARGET_DIR:-target}/release/ringrec}
base=${BASE_BIN:?set BASE_BIN to the ringrec binary to compare with}
dir=$root/${CARGO_TARGET_DIR:-target}/bench-data/multihot-${ROWS:-500000}
whole=$dir/whole.parquet
out=${1:-docs/bench/table-speed.txt}
for f in "$bin" "$base" "$whole"; do [ -e "$f" ] || { echo "$f is missing (the set: run scripts/bench/multihot.sh first)" >&2; exit 1; }; done
mpi=(mpirun --oversubscribe)
[ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
sparse=c0,c1,c2,c3,c4,c5,c6,c7,c8,c9,l0,l1,l2,l3,l4,l5
flags=(--sparse-columns "$sparse" --data-dir "$dir/ringrec" --model mlp --dim 16 --hidden 256,128
  --dense-optimizer adam --lr 0.001 --sparse-optimizer sgd --sparse-lr 0.05 --batch 1024 --test-fraction 0
  --epochs 1 --max-steps "${STEPS:-150}" --table-capacity 2097152 --no-progress --json --threads 1
  --table c3,l0=items --table c1,c2,l5=more:dim=8)
field() { python3 -c "import json,sys; d=json.loads([l for l in sys.stdin if l.startswith('{')][-1]); print(' '.join(f'{k}={json.dumps(d[k], separators=(\",\", \":\"))}' for k in sys.argv[1:]))" "$@"; }
load() { cut -d' ' -f1-3 /proc/loadavg; }
# One run: its summary's fields and cpu_s, the CPU seconds of every rank (user + system, from
# mpirun's waited children): on a machine shared with other jobs, samples per CPU second is
# the steadier figure.
run() {
  local b=$1 np=$2 dev=$3 t; t=$(mktemp)
  /usr/bin/time -f "%U %S" -o "$t" "${mpi[@]}" -np "$np" "$b" train --data "$whole" "${flags[@]}" --device "$dev" | field samples_per_sec params_fnv phase_seconds | tr '\n' ' '
  awk '{printf "cpu_s=%.2f\n", $1 + $2}' "$t"; rm -f "$t"
}
{
  echo "# $(date -u +%FT%TZ) $(nproc) cores (shared with other jobs: see each line's load); ringrec $(git rev-parse --short HEAD), base $base; $whole, global batch 1024, ${STEPS:-150} steps; ${flags[*]: -4}"
  for r in $(seq "${RUNS:-3}"); do
    for dev in ${DEVICES:-cpu host}; do
      for np in 1 2; do
        echo "run $r, $dev np $np, load $(load): base: $(run "$base" "$np" "$dev")"
        echo "run $r, $dev np $np, load $(load): this: $(run "$bin" "$np" "$dev")"
      done
    done
  done
} 2>&1 | tee "$out"
# The ratios (median over the rounds of this / base, per device and ranks): samples/s, and
# samples per CPU second (the same samples both ways: the inverse ratio of cpu_s).
python3 - "$out" <<'EOF' | tee -a "$out"
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    m = re.match(r"run (\d+), (\w+) np (\d), load [^:]*: (base|this): samples_per_sec=([0-9.e+]+) params_fnv=(\S+) .*cpu_s=([0-9.]+)", line)
    if m:
        r, dev, np, who, sps, fnv, cpu = m.groups()
        runs.setdefault((dev, np), {}).setdefault(r, {})[who] = (float(sps), fnv, float(cpu))
med = lambda xs: f"{statistics.median(xs):.2f}x (each: {', '.join(f'{x:.2f}' for x in xs)})"
for (dev, np), rounds in sorted(runs.items()):
    pairs = [v for v in rounds.values() if "this" in v and "base" in v]
    if pairs:
        same = all(v["this"][1] == v["base"][1] for v in pairs)
        print(f"--device {dev}, {np} rank(s), this / base over {len(pairs)} rounds: samples/s {med([v['this'][0] / v['base'][0] for v in pairs])}; "
              f"samples per CPU second {med([v['base'][2] / v['this'][2] for v in pairs])}; params_fnv {'the same' if same else 'DIFFERENT'}")
EOF
