#!/usr/bin/env bash
# Installs NVIDIA's CUDA runtime libraries from PyPI into a venv, only when missing: NVRTC,
# cuBLAS (+ cublasLt) and NCCL, as `pip install` gives them to users
# (site-packages/nvidia/<package>/lib/lib*.so.<soname>). No GPU or driver is needed: the
# library probe test (tests/cuda_libs.rs) finds them there, reads their versions and
# compiles every kernel to SASS with this NVRTC.
#   scripts/cuda-wheels.sh [DIR]      default DIR: ${CARGO_TARGET_DIR:-target}/cuda-wheels
# About 1 GB to download (cuBLAS is 594 MB), 1.4 GB installed. RINGREC_SKIP_CUDA_WHEELS=1
# skips it (the test then says it was skipped and why).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-${CARGO_TARGET_DIR:-target}/cuda-wheels}
# Pinned: CUDA 12.8, as the Dockerfile's image and cudarc's bindings (cuda-12080); NCCL as
# cudarc's bindings (nccl-02030).
pins=(nvidia-cuda-nvrtc-cu12==12.8.93 nvidia-cublas-cu12==12.8.4.1 nvidia-nccl-cu12==2.30.7)
stamp="$dir/.ringrec-wheels"
if [ "${RINGREC_SKIP_CUDA_WHEELS:-0}" = 1 ]; then
  echo "cuda-wheels: skipped (RINGREC_SKIP_CUDA_WHEELS=1)"
  exit 0
fi
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "${pins[*]}" ]; then
  echo "cuda-wheels: present in $dir (${pins[*]})"
  exit 0
fi
start=$(date +%s)
trap 'echo "cuda-wheels: FAILED (PyPI unreachable? RINGREC_SKIP_CUDA_WHEELS=1 runs the tests without the wheels)" >&2' ERR
echo "cuda-wheels: creating a venv in $dir and installing ${pins[*]} from PyPI"
rm -rf "$dir"
python3 -m venv --without-pip "$dir"
# Into the venv's site-packages, with the system pip when there is one (else the venv's
# own); --no-deps: the three wheels need nothing else.
site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if python3 -m pip --version >/dev/null 2>&1; then
  pip=(python3 -m pip)
else
  "$dir/bin/python" -m ensurepip -q
  pip=("$dir/bin/python" -m pip)
fi
PIP_ROOT_USER_ACTION=ignore "${pip[@]}" install --disable-pip-version-check --no-deps --no-compile --target "$site" "${pins[@]}"
echo "${pins[*]}" > "$stamp"
echo "cuda-wheels: installed in $(( $(date +%s) - start )) s; $(du -sh "$dir" | cut -f1) in $site"
find "$site/nvidia" -name 'lib*.so*' -printf '  %p\n' | sort
