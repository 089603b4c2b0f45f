#!/usr/bin/env bash
# Issue 32's engine-overhead figures at 2 ranks, one run: allreduce (sum, float32) of 4 KiB
# to 64 MiB numpy arrays from Python (ringrec.allreduce) against the same calls from Rust
# through the same engine in the same job (Runtime::allreduce; both also in place, without
# copying the input), against the backend alone
# (`ringrec bench allreduce --backends shm`, the engine's backend on one host; mpi is
# measured too, as bench's reference), and torch.distributed.all_reduce (gloo) at 16 MiB.
# Release builds: the binary and the extension (maturin --release into target/python-site-release).
# Writes docs/bench/python-allreduce.{json,jsonl,txt}.
#   scripts/bench/python_allreduce.sh      (needs scripts/python-venv.sh's venv: torch)
set -euo pipefail
cd "$(dirname "$0")/../.."
target=${CARGO_TARGET_DIR:-target}
case $target in /*) ;; *) target="$PWD/$target" ;; esac
py=${PYTHON:-$(scripts/python-venv.sh)}
echo "# $(date -u +%FT%TZ) $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
if [ "${SKIP_BUILD:-0}" != 1 ]; then   # SKIP_BUILD=1: both release builds are already there
  cargo build --locked --release --features cuda >&2
  rm -rf "$target/python-wheel-release" "$target/python-site-release"
  CARGO_TARGET_DIR=$target "$(dirname "$py")/maturin" build --quiet --release -m python/Cargo.toml -i "$py" --out "$target/python-wheel-release" >&2
  "$py" -m pip install --disable-pip-version-check -q --no-deps --target "$target/python-site-release" "$target/python-wheel-release"/ringrec-*.whl >&2
fi
mpi=(mpirun --oversubscribe -np 2)
[ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
out=docs/bench
"${mpi[@]}" "$target/release/ringrec" bench allreduce --backends shm -b 4K -e 64M -f 4 --json-out "$out/python-allreduce.json" >&2
port=$(( 20000 + RANDOM % 20000 ))
"${mpi[@]}" -x PYTHONPATH="$target/python-site-release" -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=$port -x OMP_NUM_THREADS=1 \
  "$py" scripts/bench/python_allreduce.py --min-bytes 4096 --max-bytes $((64 << 20)) --factor 4 > "$out/python-allreduce.jsonl"
"$py" - "$out/python-allreduce.json" "$out/python-allreduce.jsonl" <<'PY' | tee "$out/python-allreduce.txt"
import json, sys
rust = {r["size"]: r["time_us"] for r in json.load(open(sys.argv[1]))["rows"] if r["backend"] == "shm"}
rows = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")]
py = {r["size"]: r["time_us"] for r in rows if r["what"] == "python"}
eng = {r["size"]: r["time_us"] for r in rows if r["what"] == "rust-engine"}
gloo = {r["size"]: r["time_us"] for r in rows if r["what"] == "gloo"}
py_in = {r["size"]: r["time_us"] for r in rows if r["what"] == "python-inplace"}
eng_in = {r["size"]: r["time_us"] for r in rows if r["what"] == "rust-engine-inplace"}
cpu = {(r["what"], r["size"]): r.get("cpu_us", float("nan")) for r in rows}
print("# allreduce sum float32, 2 ranks: Python (ringrec.allreduce on numpy) vs Rust through the same engine")
print("# in the same job (Runtime::allreduce) and vs Rust's backend alone (bench allreduce, shm)")
print("# (medians of alternating repeats); in place: allreduce_ (Average) vs a Vec moved through the engine, no copy;")
print("# cpu: the calling thread's CPU time per call, in place, Rust and Python (to 64 KiB: above, making")
print("# bench_allreduce's input, which its CPU figure subtracts, varies more than a call costs)")
print("%12s %12s %12s %12s %8s %8s %12s %12s %8s %10s %10s" % ("size(B)", "bench(us)", "rust-eng(us)", "python(us)", "py/eng", "py/bench", "rust-in(us)", "py-in(us)", "in/in", "cpu-rs(us)", "cpu-py(us)"))
for s in sorted(py):
    if s in rust and s in eng and s in eng_in and s in py_in:
        small = s <= 65536
        print("%12d %12.1f %12.1f %12.1f %8.2f %8.2f %12.1f %12.1f %8.2f %10s %10s" % (s, rust[s], eng[s], py[s], py[s] / eng[s], py[s] / rust[s], eng_in[s], py_in[s], py_in[s] / eng_in[s],
              "%.2f" % cpu[("rust-engine-inplace", s)] if small else "-", "%.2f" % cpu[("python-inplace", s)] if small else "-"))
for s, t in sorted(gloo.items()):
    print("# %d B: torch.distributed.all_reduce (gloo) %.1f us, ringrec from Python %.1f us: ringrec %.2fx gloo's speed" % (s, t, py[s], t / py[s]))
PY
