#!/usr/bin/env bash
# Counted vs modelled dense traffic (issue 17 part 6): one training run per backend, 4 ranks
# as 2 simulated hosts (RINGREC_RANKS_PER_HOST=2) on one machine, the default synthetic
# set, --max-steps 50. Per run the JSON summary goes to docs/bench/i17/raw/traffic-NAME.json;
# the table (each rank's dense bytes by direction: counted by the backend, and the stated
# model of src/comm/traffic.rs) to stdout and docs/bench/i17/traffic-table.md. The
# `one-host-*` runs are 3 ranks on one host instead (`shm` needs one host).
#   scripts/bench/traffic.sh            (SKIP_BUILD=1 to use the release binary as it is)
set -euo pipefail
cd "$(dirname "$0")/../.."
RAW=docs/bench/i17/raw
mkdir -p "$RAW"
if [ "${SKIP_BUILD:-0}" != 1 ]; then cargo build --release --locked; fi
declare -A CFG=([ring]="--backend ring" [hier]="--backend hier" [mpi]="--backend mpi"
  [ring-fp16]="--backend ring --compression fp16" [hier-k4-host]="--backend hier --sync-every 4 --sync-scope host"
  [one-host-shm]="--backend shm" [one-host-ring]="--backend ring")
NAMES=${NAMES:-ring hier mpi ring-fp16 hier-k4-host one-host-shm one-host-ring}
for n in $NAMES; do
  case $n in one-host-*) np=3 ;; *) np=4 ;; esac
  export RINGREC_RANKS_PER_HOST=$((np == 4 ? 2 : 3))
  # shellcheck disable=SC2086
  cmd="scripts/mpirun.sh -np $np -x RINGREC_RANKS_PER_HOST target/release/ringrec train --json --no-progress --max-steps 50 ${CFG[$n]}"
  echo "+ RINGREC_RANKS_PER_HOST=$RINGREC_RANKS_PER_HOST $cmd" >&2
  $cmd 2>"$RAW/traffic-$n.log" | grep '^{' > "$RAW/traffic-$n.json"
  [ -s "$RAW/traffic-$n.log" ] || rm -f "$RAW/traffic-$n.log"
done
python3 - "$RAW" $NAMES <<'PY' | tee docs/bench/i17/traffic-table.md
import json, sys
raw, names = sys.argv[1], sys.argv[2:]
dirs = ["intra_host_sent", "intra_host_received", "cross_host_sent", "cross_host_received"]
print("| run | source | model of | collectives | rank | intra sent | intra received | cross sent | cross received | model: intra sent | intra received | cross sent | cross received | max abs(counted - model) |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for n in names:
    s = json.load(open(f"{raw}/traffic-{n}.json"))
    for c, m in zip(s["dense_traffic_per_rank"], s["dense_traffic_model_per_rank"]):
        diff = max(abs(c[d] - m[d]) for d in dirs)
        print(f"| {n} | {s['dense_traffic_source']} | {s['dense_traffic_model']} | {s['dense_collectives']} | {c['rank']} (host {c['host']}) | "
              + " | ".join(f"{c[d]:,}" for d in dirs) + " | " + " | ".join(f"{m[d]:,}" for d in dirs) + f" | {diff} |")
    tot = lambda key, d: sum(t[d] for t in s[key])
    print(f"| {n} | sums | | | all | " + " | ".join(f"{tot('dense_traffic_per_rank', d):,}" for d in dirs) + " | "
          + " | ".join(f"{tot('dense_traffic_model_per_rank', d):,}" for d in dirs)
          + f" | cross bytes/sample {s['cross_host_bytes_per_sample']:.1f} |")
PY
