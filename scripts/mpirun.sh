#!/usr/bin/env bash
# mpirun with what one machine needs: --oversubscribe (more ranks than cores is fine for
# tests and demos), --allow-run-as-root when run as root (containers, CI), and a binding
# that fits ringrec's threads (it sizes its pool as cores / ranks per host):
#   fewer ranks than cores -> --bind-to none (each rank runs several threads; Horovod asks
#   for the same), exactly one rank per core -> --bind-to core, more -> none (oversubscribed).
# RINGREC_MPI_BIND=core|none|socket overrides.
#   scripts/mpirun.sh -np 4 target/release/ringrec demo
set -euo pipefail
np=1
prev=""
for a in "$@"; do
  case "$prev" in -np|-n|--np|-c) np="$a" ;; esac
  prev="$a"
done
cores=$(nproc)
if [ -n "${RINGREC_MPI_BIND:-}" ]; then bind="$RINGREC_MPI_BIND"
elif [ "$np" -eq "$cores" ] 2>/dev/null; then bind=core
else bind=none; fi
args=(--oversubscribe --bind-to "$bind")
if [ "$(id -u)" -eq 0 ]; then args+=(--allow-run-as-root); fi
exec mpirun "${args[@]}" "$@"
