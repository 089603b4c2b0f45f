#!/usr/bin/env bash
# Issue 32's dlrm.py figure, one run (release builds; the machine as it is):
#   examples/python/dlrm.py at 2 ranks on ringrec (HostEmbedding + DistributedOptimizer)
#   vs the same model under torch DDP (gloo, nn.Embedding(sparse=True), the same global
#   batch) at 1 and 2 threads per rank (the best is the reference): samples/s and AUC.
# Writes docs/bench/python-dlrm.txt.
#   scripts/bench/python_dlrm.sh     (ROWS=200000 STEPS=300; needs scripts/python-venv.sh's venv)
set -euo pipefail
cd "$(dirname "$0")/../.."
target=${CARGO_TARGET_DIR:-target}
case $target in /*) ;; *) target="$PWD/$target" ;; esac
py=${PYTHON:-$(scripts/python-venv.sh)}
rows=${ROWS:-200000}
steps=${STEPS:-300}
site=${SITE:-$target/python-site-release}     # SITE=target/python-site: the debug extension
bin=${RINGREC_BIN:-$target/release/ringrec}
if [ "${SKIP_BUILD:-0}" != 1 ]; then   # SKIP_BUILD=1: the builds are already there
  cargo build --locked --release --features cuda >&2
  rm -rf "$target/python-wheel-release" "$target/python-site-release"
  CARGO_TARGET_DIR=$target "$(dirname "$py")/maturin" build --quiet --release -m python/Cargo.toml -i "$py" --out "$target/python-wheel-release" >&2
  "$py" -m pip install --disable-pip-version-check -q --no-deps --target "$target/python-site-release" "$target/python-wheel-release"/ringrec-*.whl >&2
fi
data=${DATA:-$target/bench-data/synth-$rows.tsv}
[ -f "$data" ] || "$bin" data synth --rows "$rows" --out "$data" >&2
mpi=(mpirun --oversubscribe -np 2)
[ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
out=docs/bench/python-dlrm.txt
{
  echo "# $(date -u +%FT%TZ) $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) (a shared machine)"
  echo "# dlrm.py --data $data --steps $steps --batch 256 per rank, 2 ranks"
  for t in 1 2; do
    "${mpi[@]}" -x PYTHONPATH="$site" -x OMP_NUM_THREADS=$t "$py" examples/python/dlrm.py --data "$data" --steps "$steps" --threads $t | grep 'dlrm: done' | sed "s/^/threads $t /"
    port=$(( 20000 + RANDOM % 20000 ))
    "${mpi[@]}" -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=$port -x OMP_NUM_THREADS=$t "$py" examples/python/dlrm.py --ddp --data "$data" --steps "$steps" --threads $t | grep 'dlrm: done' | sed "s/^/threads $t /"
  done
} | tee "$out"
