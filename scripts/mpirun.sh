#!/usr/bin/env bash
# mpirun with what one machine needs: --oversubscribe (more ranks than cores is fine for
# tests and demos), --allow-run-as-root when run as root (containers, CI), and
# --bind-to none: ringrec sizes its own thread pool (cores / ranks per host), which Open
# MPI's default binding of each rank to one core would defeat (Horovod asks for the same).
#   scripts/mpirun.sh -np 4 target/release/ringrec demo
set -euo pipefail
args=(--oversubscribe --bind-to none)
if [ "$(id -u)" -eq 0 ]; then args+=(--allow-run-as-root); fi
exec mpirun "${args[@]}" "$@"
