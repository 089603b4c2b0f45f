#!/usr/bin/env bash
# mpirun with what one machine needs: --oversubscribe (more ranks than cores is fine for
# tests and demos) and --allow-run-as-root when run as root (containers, CI).
#   scripts/mpirun.sh -np 4 target/release/ringrec demo
set -euo pipefail
args=(--oversubscribe)
if [ "$(id -u)" -eq 0 ]; then args+=(--allow-run-as-root); fi
exec mpirun "${args[@]}" "$@"
