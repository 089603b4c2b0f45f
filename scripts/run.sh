#!/usr/bin/env bash
# The main job: builds ringrec (release) and trains the CTR model on NP ranks (default 2,
# one per core here) with `ringrec train` and no arguments: a synthetic Criteo-format data
# set is generated once (under ~/.cache/ringrec, or RINGREC_DATA_DIR) and trained on.
#   scripts/run.sh                         # 2 ranks
#   NP=4 RINGREC_RANKS_PER_HOST=2 scripts/run.sh   # 4 ranks as 2 simulated hosts
#   scripts/run.sh --epochs 2 --json       # any `ringrec train` flags
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# A toolchain that setup.sh just installed with rustup is not on PATH yet.
if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then . "$HOME/.cargo/env"; fi
cargo build --release --locked
env_args=()
for v in $(env | grep -o '^RINGREC_[A-Z_]*' || true); do env_args+=(-x "$v"); done
exec scripts/mpirun.sh "${env_args[@]}" -np "${NP:-2}" target/release/ringrec train "$@"
