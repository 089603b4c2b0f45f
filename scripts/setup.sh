#!/usr/bin/env bash
# Installs the system packages ringrec needs on Debian/Ubuntu, only when missing.
# Idempotent: a second run installs nothing and exits 0.
#   Open MPI (mpirun + headers + pkg-config file) -- the launcher and the `mpi` crate's C side
#   libclang + clang headers                    -- bindgen, used by mpi-sys to read mpi.h
#   pkg-config, build-essential                -- locating and compiling the MPI shim
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

if [ ${#need[@]} -eq 0 ]; then
  echo "setup: all system packages present"
  exit 0
fi

echo "setup: installing ${need[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if have_cmd sudo; then SUDO="sudo"; else
    echo "setup: need root (or sudo) to install: ${need[*]}" >&2; exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
echo "setup: done"
