#!/usr/bin/env bash
# Prepares .gpu/ (git-ignored through .git/info/exclude) for a GPU machine that has CUDA,
# NCCL and PyTorch but no Rust and no MPI (the workplace's lent H100/H200 machines): the
# release binary and the test binaries built here with --features cuda (stripped), Open MPI
# 4.1.4 as this Debian machine has it (files of its packages, relocated there by
# scripts/device/ompi-env.sh through OPAL_PREFIX), and the check script. Then, on that
# machine, from the repository root: `OUT=<dir> bash .gpu/run.sh` (scripts/device/run.sh).
#   scripts/device/bundle.sh [TEST ...]     default tests: device train cli checkpoint predict
set -euo pipefail
cd "$(dirname "$0")/../.."
tests=("$@"); [ ${#tests[@]} -gt 0 ] || tests=(device train cli checkpoint predict)
mkdir -p .git/info; grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo /.gpu/ >> .git/info/exclude
rm -rf .gpu; mkdir -p .gpu/bin .gpu/root
args=(); for t in "${tests[@]}"; do args+=(--test "$t"); done
cargo test --release --locked --features cuda --no-run "${args[@]}" 2>&1 | tee /tmp/ringrec-bundle.log | grep Executable
for t in "${tests[@]}"; do
  exe=$(grep -o "Executable tests/$t.rs ([^)]*)" /tmp/ringrec-bundle.log | sed 's/.*(\(.*\))/\1/')
  strip -o ".gpu/bin/$t" "$exe"
done
strip -o .gpu/bin/ringrec target/release/ringrec
pkgs=(openmpi-bin libopenmpi3 openmpi-common libpmix2 libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7
      libevent-2.1-7 libfabric1 libucx0 libibverbs1 librdmacm1 libpsm2-2 libpsm-infinipath1 libnl-3-200 libnl-route-3-200)
for p in "${pkgs[@]}"; do dpkg -L "$p" 2>/dev/null || true; done | while read -r f; do
  [ -f "$f" ] || continue
  case $f in */doc/*|*/man/*|*/include/*|*lintian*) continue ;; esac
  cp -a --parents "$f" .gpu/root/ 2>/dev/null || true
done
for f in /lib/x86_64-linux-gnu/libnuma.so.1* /lib/x86_64-linux-gnu/libmunge.so.2* /lib/x86_64-linux-gnu/libefa.so.1* /lib/x86_64-linux-gnu/libatomic.so.1*; do
  [ -e "$f" ] && cp -a --parents "$f" .gpu/root/
done
ln -sf orterun .gpu/root/usr/bin/mpirun
cp scripts/device/ompi-env.sh scripts/device/run.sh .gpu/
du -sh .gpu
