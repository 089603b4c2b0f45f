#!/usr/bin/env bash
# The whole test suite (what CI runs through .ci/run):
#   1. installs the system packages a fresh Debian/Ubuntu machine lacks (scripts/setup.sh),
#   2. builds and lints the CUDA feature, which must compile on machines without CUDA,
#   3. runs every unit and multi-process (real mpirun) test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# A toolchain that setup.sh just installed with rustup is not on PATH yet.
if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then . "$HOME/.cargo/env"; fi
echo "== cargo build --features cuda (type-checks the GPU path without CUDA)"
cargo build --locked --features cuda
echo "== cargo clippy --all-targets --features cuda"
cargo clippy --locked --all-targets --features cuda -- -D warnings
echo "== cargo test"
cargo test --locked
