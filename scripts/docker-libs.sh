#!/usr/bin/env bash
# Builds the Dockerfile's stages and lists what `ringrec info` finds inside each image: every
# CUDA library, where, and its version (the build itself fails when the runtime image lacks
# NVRTC, cuBLAS or NCCL). With the NVIDIA container runtime it also runs the runtime image
# with --gpus all, where the driver must be found too.
# Without a Docker engine it prints why and exits 0 (CI runs it that way). With one it
# builds only when RINGREC_DOCKER_CHECK=1: the CUDA images are several GB and the build
# compiles ringrec and runs the test suite (tens of minutes on 2 cores).
#   RINGREC_DOCKER_CHECK=1 scripts/docker-libs.sh
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${RINGREC_DOCKER_TAG:-ringrec-libs-check}
skip() { echo "docker-libs: skipped: $*"; exit 0; }
command -v docker >/dev/null 2>&1 || skip "no docker command"
if ! out=$(docker info 2>&1); then
  skip "no Docker engine reachable ($(echo "$out" | grep -m1 -iE 'cannot connect|error|permission denied' || echo 'docker info failed'))"
fi
[ "${RINGREC_DOCKER_CHECK:-0}" = 1 ] || skip "a Docker engine is here, but building the CUDA images runs only with RINGREC_DOCKER_CHECK=1"
echo "docker-libs: docker build --target build -t $tag:build ."
docker build --target build -t "$tag:build" .
echo "docker-libs: docker build -t $tag:runtime ."
docker build -t "$tag:runtime" .
echo "== the build stage (CUDA devel image): ringrec info --libs"
docker run --rm --entrypoint ringrec "$tag:build" info --libs
echo "== the runtime stage (CUDA runtime image): ringrec info --libs --require nvrtc,cublas,nccl"
docker run --rm "$tag:runtime" info --libs --require nvrtc,cublas,nccl
if docker info 2>/dev/null | grep -qiE '^ *Runtimes:.*nvidia'; then
  echo "== the runtime stage with the GPUs (--gpus all): ringrec info --require driver,nvrtc,cublas,nccl"
  docker run --rm --gpus all "$tag:runtime" info --libs --require driver,nvrtc,cublas,nccl
else
  echo "docker-libs: no NVIDIA container runtime: the runtime image was not run with --gpus"
fi
