#!/usr/bin/env bash
# Fusion order (branch fusionorder): the ring and the engine before and after the fused
# layout, 4 ranks, alternating the two builds (run 1 old, new; run 2 old, new) on one machine.
#   scripts/bench/fusion_order.sh OLD_RINGREC NEW_RINGREC [OUT_DIR]
# Writes OUT_DIR/fusion_order.txt (default docs/bench): per build and run, `bench allreduce`
# (ring, shm, hier, 8 B to 16 MiB by 4x, one host) and `bench engine` (ResNet-50-shaped
# gradients, 10 steps) on ring (one host) and on hier over 4 simulated hosts of one rank.
set -euo pipefail
old=$1
new=$2
out=${3:-docs/bench}
mkdir -p "$out"
log="$out/fusion_order.txt"
: > "$log"
here=$(dirname "$0")
run() {
  echo "### $*" | tee -a "$log"
  "$@" 2>&1 | tee -a "$log"
}
for round in 1 2; do
  for which in old new; do
    bin=$old
    [ "$which" = new ] && bin=$new
    echo "## round $round, $which ($bin), load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"
    run "$here/../mpirun.sh" -np 4 "$bin" bench allreduce --backends ring,shm,hier -b 8 -e 16M -f 4
    run "$here/../mpirun.sh" -np 4 "$bin" bench engine --backend ring -n 10
    run "$here/../mpirun.sh" -np 4 -x RINGREC_RANKS_PER_HOST=1 "$bin" bench engine --backend hier -n 10
  done
done
