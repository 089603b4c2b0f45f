#!/usr/bin/env bash
# Allreduce benchmark on this machine: NP ranks (default 2), every CPU backend, with two MPI
# references in the same table: ringrec's `mpi` backend (in-place MPI_Allreduce through the
# FFI) and scripts/bench/allreduce_ref.c (in-place MPI_Allreduce in C, built here with mpicc,
# sharing no code with ringrec, same sizes and timing rules). The C reference runs right
# before ringrec, twice with Open MPI's defaults and twice with its shared-memory transport's
# single-copy mechanism off (`--mca btl_vader_single_copy_mechanism none`: on this VM 1.8x
# faster than the default CMA for 1-16 MiB); per size the best run is kept (the peer at its
# best; the JSON row says which setting won). The summary's ratios are against the better
# of the two references at each size.
# Writes docs/bench/allreduce-np$NP.{txt,json}, the C rows docs/bench/allreduce-ref-np$NP.jsonl
# and the busbw plot docs/allreduce_busbw.png.
#   scripts/bench/allreduce.sh            # 2 ranks, 8 B .. 256 MiB
#   NP=4 RINGREC_RANKS_PER_HOST=2 scripts/bench/allreduce.sh
#   RINGREC_MPI_BIND=core scripts/bench/allreduce.sh   # binding for both sides (default: scripts/mpirun.sh's)
set -euo pipefail
cd "$(dirname "$0")/../.."
NP=${NP:-2}
MAX=${MAX:-256M}
cargo build --release --locked
mkdir -p docs/bench target/bench
mpicc -O2 -o target/bench/allreduce_ref scripts/bench/allreduce_ref.c
env_args=()
for v in $(env | grep -o '^RINGREC_[A-Z_]*' || true); do env_args+=(-x "$v"); done
ref="docs/bench/allreduce-ref-np$NP.jsonl"
for run in a b; do
  scripts/mpirun.sh -np "$NP" target/bench/allreduce_ref -b 8 -e "$MAX" > "target/bench/allreduce-ref-default-$run.jsonl"
  scripts/mpirun.sh --mca btl_vader_single_copy_mechanism none -np "$NP" target/bench/allreduce_ref -b 8 -e "$MAX" \
    > "target/bench/allreduce-ref-vader_single_copy_none-$run.jsonl"
done
# Per size, the fastest of the C runs, labelled with its setting.
python3 - target/bench/allreduce-ref-*-[ab].jsonl > "$ref" <<'PY'
import json, os, sys
best = {}
for path in sys.argv[1:]:
    mca = os.path.basename(path)[len("allreduce-ref-"):-len("-a.jsonl")]
    for line in open(path):
        r = json.loads(line)
        r["mca"] = mca
        if r["size"] not in best or r["time_us"] < best[r["size"]]["time_us"]:
            best[r["size"]] = r
for s in sorted(best):
    print(json.dumps(best[s]))
PY
scripts/mpirun.sh "${env_args[@]}" -np "$NP" target/release/ringrec bench allreduce -b 8 -e "$MAX" \
  --reference "$ref" --json-out "docs/bench/allreduce-np$NP.json" | tee "docs/bench/allreduce-np$NP.txt"
"$(scripts/bench/venv.sh)" scripts/bench/plot_allreduce.py "docs/bench/allreduce-np$NP.json" docs/allreduce_busbw.png
