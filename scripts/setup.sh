#!/usr/bin/env bash
# Installs the system packages ringrec needs on Debian/Ubuntu, only when missing.
# Idempotent: a second run installs nothing and exits 0.
#   Open MPI (mpirun + headers + pkg-config file) -- the launcher and the `mpi` crate's C side
#   libclang + clang headers                    -- bindgen, used by mpi-sys to read mpi.h
#   pkg-config, build-essential                -- locating and compiling the MPI shim
#   python3 + venv                             -- scripts/cuda-wheels.sh (CI: NVIDIA's CUDA
#                                                 libraries from PyPI for the library probe test)
#   python3-numpy                              -- scripts/bundle_predict.py (tests/predict.rs)
set -euo pipefail

need=()
have_cmd() { command -v "$1" >/dev/null 2>&1; }
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

have_cmd mpirun || need+=(openmpi-bin)
have_pkg libopenmpi-dev || need+=(libopenmpi-dev)
have_pkg libclang-dev || need+=(libclang-dev)
have_pkg clang || need+=(clang)
have_cmd pkg-config || need+=(pkg-config)
have_cmd cc || need+=(build-essential)
have_cmd c++ || need+=(g++)
have_cmd python3 || need+=(python3)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)
# numpy for scripts/bundle_predict.py (the independent reader of export bundles; its test
# skips without it): the distribution's, for the system python3.
python3 -c 'import numpy' >/dev/null 2>&1 || /usr/bin/python3 -c 'import numpy' >/dev/null 2>&1 || need+=(python3-numpy)

install_rust() {
  # Rust toolchain (rustup), when the machine has none.
  if command -v cargo >/dev/null 2>&1 || [ -x "$HOME/.cargo/bin/cargo" ]; then
    if ! cargo clippy --version >/dev/null 2>&1 && command -v rustup >/dev/null 2>&1; then
      rustup component add clippy
    fi
    return
  fi
  echo "setup: installing the Rust toolchain with rustup"
  have_cmd curl || { $SUDO apt-get update -qq; $SUDO apt-get install -y -qq curl ca-certificates; }
  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --component clippy
  echo "setup: Rust installed; run: . \"\$HOME/.cargo/env\" (or open a new shell)"
}

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if have_cmd sudo; then SUDO="sudo"; elif [ ${#need[@]} -gt 0 ]; then
    echo "setup: need root (or sudo) to install: ${need[*]}" >&2; exit 1
  fi
fi

if [ ${#need[@]} -eq 0 ]; then
  echo "setup: system packages present (Open MPI, libclang, pkg-config, cc, python3 with venv)"
  install_rust
  exit 0
fi

echo "setup: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
install_rust
echo "setup: done"
