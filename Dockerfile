# ringrec with the GPU path (feature `cuda`) on an NVIDIA CUDA image, with NCCL and Open MPI.
#   docker build -t ringrec .
#   docker run --gpus all --rm ringrec info
#   docker run --gpus all --rm --shm-size=8g --entrypoint mpirun ringrec \
#       --allow-run-as-root -np 4 ringrec train --device cuda
# The build runs the test suite with the CUDA feature, like CI does (scripts/test.sh; the GPU
# tests skip: a build has no GPU), compiles every kernel to SASS with the image's NVRTC, and
# fails unless the runtime image finds NVRTC, cuBLAS and NCCL under their runtime sonames
# (the driver, libcuda.so.1, comes with `docker run --gpus`). scripts/docker-libs.sh builds
# both stages and lists what `ringrec info` finds in each.
ARG CUDA_VERSION=12.8.1
ARG UBUNTU=ubuntu24.04

FROM nvidia/cuda:${CUDA_VERSION}-devel-${UBUNTU} AS build
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /src
# The same set-up script CI runs (--tests: the build runs the test suite): Open MPI,
# libclang, pkg-config, a C compiler, Python, Rust;
# then the CUDA runtime libraries ringrec loads, where the image lacks them.
COPY scripts/setup.sh scripts/cuda-runtime-libs.sh scripts/
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends curl ca-certificates \
    && scripts/setup.sh --tests && scripts/cuda-runtime-libs.sh && rm -rf /var/lib/apt/lists/*
ENV PATH=/root/.cargo/bin:${PATH}
COPY . .
RUN cargo build --release --locked --features cuda \
    && RINGREC_SHM_DIR=/tmp cargo test --release --locked --features cuda \
    && install -m 0755 target/release/ringrec /usr/local/bin/ringrec \
    && ringrec info --libs --require nvrtc,cublas,nccl --compile-kernels sm_80,sm_90

FROM nvidia/cuda:${CUDA_VERSION}-runtime-${UBUNTU} AS runtime
ENV DEBIAN_FRONTEND=noninteractive
COPY scripts/cuda-runtime-libs.sh /tmp/
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends openmpi-bin \
    && /tmp/cuda-runtime-libs.sh && rm -rf /var/lib/apt/lists/* /tmp/cuda-runtime-libs.sh
COPY --from=build /usr/local/bin/ringrec /usr/local/bin/ringrec
# Every CUDA library but the driver is found here, or the build fails.
RUN ringrec info --libs --require nvrtc,cublas,nccl
ENTRYPOINT ["ringrec"]
CMD ["--help"]
