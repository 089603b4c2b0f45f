#!/usr/bin/env bash
# Allreduce benchmark on this machine: NP ranks (default 2), every CPU backend, mpi as the
# reference in the same run. Writes docs/bench/allreduce-np$NP.{txt,json} and the busbw plot
# docs/allreduce_busbw.png.
#   scripts/bench/allreduce.sh            # 2 ranks, 8 B .. 256 MiB
#   NP=4 RINGREC_RANKS_PER_HOST=2 scripts/bench/allreduce.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
NP=${NP:-2}
cargo build --release --locked
mkdir -p docs/bench
env_args=()
for v in $(env | grep -o '^RINGREC_[A-Z_]*' || true); do env_args+=(-x "$v"); done
run() { scripts/mpirun.sh "${env_args[@]}" -np "$NP" target/release/ringrec bench allreduce "$@"; }
run -b 8 -e 256M "$@" --json > "docs/bench/allreduce-np$NP.json"
"$(scripts/bench/venv.sh)" scripts/bench/plot_allreduce.py "docs/bench/allreduce-np$NP.json" docs/allreduce_busbw.png
# The human table, same flags, a second run (the JSON run is the one plotted).
run -b 8 -e 256M "$@" | tee "docs/bench/allreduce-np$NP.txt"
