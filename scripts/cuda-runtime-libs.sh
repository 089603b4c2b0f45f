#!/usr/bin/env bash
# In an NVIDIA CUDA image (the Dockerfile's stages): installs the runtime packages of the
# CUDA libraries ringrec loads that the image lacks — NVRTC (cuda-nvrtc-X-Y), cuBLAS with
# cublasLt (libcublas-X-Y), NCCL (libnccl2) — runtime sonames only, no -dev packages. The
# nvidia/cuda runtime and devel images have them all (then nothing is installed); the base
# image has none. The driver (libcuda.so.1) is not installed: `docker run --gpus` mounts the
# host's.
set -euo pipefail
cuda=${CUDA_VERSION:?CUDA_VERSION is set by the nvidia/cuda images}
v=$(echo "$cuda" | cut -d. -f1,2 | tr . -)
major=${cuda%%.*}
# Present when the soname is in the linker cache or the package is installed (installing a
# package the image holds at its version would fail).
have() { ldconfig -p | grep -q "[[:space:]]$1 " || dpkg-query -W -f='${Status}' "$2" 2>/dev/null | grep -q "install ok installed"; }
need=()
have "libnvrtc.so.$major" "cuda-nvrtc-$v" || need+=("cuda-nvrtc-$v")
have "libcublas.so.$major" "libcublas-$v" || need+=("libcublas-$v")
have "libnccl.so.2" libnccl2 || need+=(libnccl2)
if [ ${#need[@]} -eq 0 ]; then
  echo "cuda-runtime-libs: NVRTC, cuBLAS and NCCL of CUDA $cuda present"
  exit 0
fi
echo "cuda-runtime-libs: installing ${need[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
