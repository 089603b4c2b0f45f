#!/usr/bin/env bash
# The main job: builds ringrec (release) and runs it on NP ranks (default 4) on this machine.
# For now the job is the quick-start demo: every rank's topology and an allreduce per backend.
#   scripts/run.sh            # 4 ranks
#   NP=2 scripts/run.sh       # 2 ranks
#   RINGREC_RANKS_PER_HOST=2 scripts/run.sh   # 4 ranks as 2 simulated hosts
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# A toolchain that setup.sh just installed with rustup is not on PATH yet.
if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then . "$HOME/.cargo/env"; fi
cargo build --release --locked
env_args=()
for v in $(env | grep -o '^RINGREC_[A-Z_]*' || true); do env_args+=(-x "$v"); done
exec scripts/mpirun.sh "${env_args[@]}" -np "${NP:-4}" target/release/ringrec demo "$@"
