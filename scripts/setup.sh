#!/usr/bin/env bash
# Installs the system packages ringrec needs on Debian/Ubuntu, only when missing.
# Idempotent: a second run installs nothing and exits 0.
#   scripts/setup.sh           what building and running ringrec needs (scripts/run.sh):
#     Open MPI (mpirun + headers + pkg-config file) -- the launcher and the `mpi` crate's C side
#     libclang + clang headers                    -- bindgen, used by mpi-sys to read mpi.h
#     pkg-config, build-essential                -- locating and compiling the MPI shim
#     Rust (rustup, with clippy)                 -- when there is no cargo
#   scripts/setup.sh --tests   the above, and what only the test suite needs (scripts/test.sh):
#     g++                                        -- the CUDA kernels compiled as host C++
#                                                   (HostKernels, `--device host`)
#     python3 + venv                             -- scripts/cuda-wheels.sh (CI: NVIDIA's CUDA
#                                                   libraries from PyPI for the library probe test),
#                                                   scripts/test-venv.sh (numpy, onnx, onnxruntime
#                                                   for tests/onnx.rs)
#     python3-numpy                              -- scripts/bundle_predict.py (tests/predict.rs)
#     slurm-wlm, munge                           -- tests/serve.rs: a real single-node Slurm
#                                                   (scripts/slurm/cluster.sh) for `ringrec serve`
#     chromium, chromium-driver                  -- tests/serve.rs: the dashboard in headless
#                                                   Chromium (WebDriver)
#     prometheus                                 -- tests/prometheus.rs: a real Prometheus
#                                                   scrapes `ringrec serve` and `serve-model`
# Slurm, Chromium and Prometheus are installed apart and best effort: where the distribution lacks them
# (Ubuntu ships Chromium only as a snap), or without root, those tests print `skipped: <reason>`.
set -euo pipefail

tests=0
case "${1:-}" in
  "") ;;
  --tests) tests=1 ;;
  *) echo "usage: scripts/setup.sh [--tests]" >&2; exit 2 ;;
esac

need=()
have_cmd() { command -v "$1" >/dev/null 2>&1; }
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

have_cmd mpirun || need+=(openmpi-bin)
have_pkg libopenmpi-dev || need+=(libopenmpi-dev)
have_pkg libclang-dev || need+=(libclang-dev)
have_pkg clang || need+=(clang)
have_cmd pkg-config || need+=(pkg-config)
have_cmd cc || need+=(build-essential)

serve_need=()
if [ "$tests" = 1 ]; then
  have_cmd c++ || need+=(g++)
  have_cmd python3 || need+=(python3)
  python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)
  # numpy for scripts/bundle_predict.py (the independent reader of export bundles; its test
  # skips without it): the distribution's, for the system python3.
  python3 -c 'import numpy' >/dev/null 2>&1 || /usr/bin/python3 -c 'import numpy' >/dev/null 2>&1 || need+=(python3-numpy)
  { have_cmd slurmctld || [ -x /usr/sbin/slurmctld ]; } && have_cmd sbatch || serve_need+=(slurm-wlm)
  have_cmd munged || [ -x /usr/sbin/munged ] || serve_need+=(munge)
  [ -x /usr/bin/chromium ] || serve_need+=(chromium)
  [ -x /usr/bin/chromedriver ] || serve_need+=(chromium-driver)
  have_cmd prometheus || [ -x /usr/bin/prometheus ] || serve_need+=(prometheus)
fi

install_serve() {
  [ ${#serve_need[@]} -eq 0 ] && return
  echo "setup: installing ${serve_need[*]} (ringrec serve's tests: Slurm, headless Chromium, Prometheus)"
  if ! DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${serve_need[@]}" >/dev/null; then
    echo "setup: warning: could not install ${serve_need[*]}; the Slurm, browser and Prometheus tests (tests/serve.rs, tests/prometheus.rs) will print skipped" >&2
  fi
}

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
  elif [ ${#serve_need[@]} -gt 0 ]; then
    echo "setup: warning: not root: not installing ${serve_need[*]} (the Slurm, browser and Prometheus tests will print skipped)" >&2
    serve_need=()
  fi
fi

present="Open MPI, libclang, pkg-config, cc"
[ "$tests" = 0 ] || present="$present, c++, python3 with venv and numpy"
if [ ${#need[@]} -eq 0 ]; then
  echo "setup: system packages present ($present)"
  [ ${#serve_need[@]} -eq 0 ] || $SUDO apt-get update -qq || true
  install_serve
  install_rust
  exit 0
fi

echo "setup: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
install_serve
install_rust
echo "setup: done"
