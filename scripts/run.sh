#!/usr/bin/env bash
# The main job: builds ringrec (release) and trains the CTR model on NP ranks (default 2,
# one per core here) with `ringrec train` and no arguments: a synthetic Criteo-format data
# set is generated once (under ~/.cache/ringrec, or RINGREC_DATA_DIR) and trained on.
# It runs through `ringrec launch` (mpirun with the right binding, every RINGREC_* variable
# exported, Ctrl-C/SIGTERM turned into a graceful stop with a checkpoint when
# --checkpoint-dir is given; RESTARTS=K relaunches a failed job from its newest checkpoint).
#   scripts/run.sh                         # 2 ranks
#   NP=4 RINGREC_RANKS_PER_HOST=2 scripts/run.sh   # 4 ranks as 2 simulated hosts
#   scripts/run.sh --epochs 2 --json       # any `ringrec train` flags
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh          # only what building and training need (the tests' extras: scripts/test.sh)
# A toolchain that setup.sh just installed with rustup is not on PATH yet.
if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then . "$HOME/.cargo/env"; fi
cargo build --release --locked
exec target/release/ringrec launch -np "${NP:-2}" --restarts "${RESTARTS:-0}" -- train "$@"
