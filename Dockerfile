# ringrec with the GPU path (feature `cuda`) on an NVIDIA CUDA image, with NCCL and Open MPI.
#   docker build -t ringrec .
#   docker run --gpus all --rm ringrec info
#   docker run --gpus all --rm --shm-size=8g --entrypoint mpirun ringrec \
#       --allow-run-as-root -np 4 ringrec train --device cuda
# The build runs the test suite that needs no GPU, like CI does (scripts/test.sh).
ARG CUDA_VERSION=12.8.1
ARG UBUNTU=ubuntu24.04

FROM nvidia/cuda:${CUDA_VERSION}-devel-${UBUNTU} AS build
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends curl ca-certificates libnccl2 libnccl-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# The same set-up script CI runs: Open MPI, libclang, pkg-config, a C compiler, Rust.
COPY scripts/setup.sh scripts/setup.sh
RUN scripts/setup.sh
ENV PATH=/root/.cargo/bin:${PATH}
COPY . .
RUN cargo build --release --locked --features cuda \
    && RINGREC_SHM_DIR=/tmp cargo test --release --locked \
    && install -m 0755 target/release/ringrec /usr/local/bin/ringrec

FROM nvidia/cuda:${CUDA_VERSION}-runtime-${UBUNTU}
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends openmpi-bin libnccl2 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /usr/local/bin/ringrec /usr/local/bin/ringrec
ENTRYPOINT ["ringrec"]
CMD ["--help"]
