#!/usr/bin/env bash
# The whole test suite (what CI runs through .ci/run):
#   1. installs the system packages a fresh Debian/Ubuntu machine lacks, the tests' extras
#      included (scripts/setup.sh --tests: Python, numpy, Slurm, Chromium),
#   2. builds and lints the CUDA feature, which must compile on machines without CUDA, and
#      lints the build without it, and the Python module (python/, its own Cargo.lock) both
#      ways; builds the library alone (--no-default-features: no
#      clap, tokio, axum, rusqlite, anyhow, indicatif or sha2, checked with cargo tree),
#   3. installs NVIDIA's CUDA runtime libraries from PyPI, only when missing (NVRTC, cuBLAS,
#      NCCL; no GPU or driver needed) and shows what `ringrec info` finds of them; makes the
#      tests' Python venv (scripts/test-venv.sh: numpy, onnx, onnxruntime from PyPI, only
#      when missing), named to the tests by RINGREC_TEST_PYTHON (tests/onnx.rs fails in CI
#      without it); the Python module's venv (scripts/python-venv.sh: numpy, torch, maturin,
#      made once under ~/.cache/ringrec and reused by later runs) and this checkout's
#      extension built by maturin, named by RINGREC_TEST_PYTHON_MODULE (tests/python.rs
#      fails in CI without it),
#   4. runs every unit and multi-process (real mpirun) test with the CUDA feature (GPU tests
#      print `skipped: <reason>` without a GPU; tests/cuda_libs.rs finds the wheels and
#      compiles every kernel to SASS with their NVRTC), then the tests whose behaviour
#      differs without it (unit tests, the command line),
#   5. lists what `ringrec info` finds in the Docker image's stages (scripts/docker-libs.sh;
#      skipped, with the reason, without a Docker engine or RINGREC_DOCKER_CHECK=1).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --tests
# A toolchain that setup.sh just installed with rustup is not on PATH yet.
if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then . "$HOME/.cargo/env"; fi
target=${CARGO_TARGET_DIR:-target}
case $target in /*) ;; *) target="$PWD/$target" ;; esac
t0=$(date +%s)
step() { echo "== $* ($(( $(date +%s) - t0 )) s)"; }
# A clean checkout gains nothing from incremental compilation's caches (GBs on disk).
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
# Free space where the build and the tests write, printed at each stage: a full disk shows
# in the log as itself, not as a test's I/O error.
mkdir -p "$target"
disk() {
  local d
  for d in "$target" "${TMPDIR:-/tmp}"; do
    echo "   disk: $(df -Pk "$d" | awk 'NR==2 {printf "%.1f GB free", $4/1048576}') in $d"
  done
}
disk
step "cargo build --features cuda (type-checks the GPU path without CUDA)"
cargo build --locked --features cuda
step "cargo clippy --all-targets --features cuda"
cargo clippy --locked --all-targets --features cuda -- -D warnings
step "cargo clippy --all-targets (without the cuda feature)"
cargo clippy --locked --all-targets -- -D warnings
step "cargo clippy of the Python module (python/, its own Cargo.lock), with and without --features cuda"
CARGO_TARGET_DIR=$target cargo clippy --locked --manifest-path python/Cargo.toml --all-targets --features cuda -- -D warnings
CARGO_TARGET_DIR=$target cargo clippy --locked --manifest-path python/Cargo.toml --all-targets -- -D warnings
step "cargo build --lib --no-default-features (the library without the binary's crates)"
cargo build --locked --lib --no-default-features
tree=$(cargo tree --locked -e normal --no-default-features -p ringrec --prefix none)
cli_only=$(printf '%s\n' "$tree" | sed 's/ .*//' | grep -xE 'clap|anyhow|indicatif|tokio|axum|rusqlite|sha2' | sort -u | tr '\n' ' ' || true)
if [ -n "$cli_only" ]; then
  echo "error: the library without feature cli depends on ${cli_only}(cargo tree -e normal --no-default-features -p ringrec -i <crate> shows why); they belong to the binary: make them optional and part of feature cli in Cargo.toml" >&2
  exit 1
fi
step "CUDA libraries from PyPI (scripts/cuda-wheels.sh)"
scripts/cuda-wheels.sh "$target/cuda-wheels"
if [ -f "$target/cuda-wheels/.ringrec-wheels" ]; then
  step "ringrec info --compile-kernels sm_80,sm_90 with the wheels' venv"
  env -u RINGREC_CUDA_LIB_DIR VIRTUAL_ENV="$target/cuda-wheels" "$target/debug/ringrec" info --compile-kernels sm_80,sm_90
fi
step "the tests' Python venv (scripts/test-venv.sh)"
RINGREC_TEST_PYTHON=$(scripts/test-venv.sh)
export RINGREC_TEST_PYTHON
step "the Python module's venv and extension (scripts/python-venv.sh: numpy, torch, maturin in ~/.cache/ringrec, once)"
RINGREC_TEST_PYTHON_MODULE=$(scripts/python-venv.sh)
export RINGREC_TEST_PYTHON_MODULE
step "cargo test --features cuda"
disk
RINGREC_CUDA_WHEELS="$target/cuda-wheels" cargo test --locked --features cuda
step "cargo test --lib --bins --test cli (without the cuda feature)"
disk
cargo test --locked --lib --bins --test cli
step "scripts/docker-libs.sh (the Docker image's libraries, where a Docker engine exists)"
scripts/docker-libs.sh
step "done"
disk
