#!/usr/bin/env bash
# One command for whoever has an NVIDIA GPU host (bare metal, or inside the Docker image):
# proves the GPU path and measures it, then writes one report to attach to
# docs/BENCHMARKS.md.
#
#   scripts/gpu-check.sh                 # from the repository (builds with --features cuda)
#   RINGREC=/usr/local/bin/ringrec scripts/gpu-check.sh   # an installed binary (Docker image)
#
# What it does, each step recorded (pass / fail / skipped, with its output):
#   1. the machine: nvidia-smi (GPUs, driver), `ringrec info` (every CUDA library ringrec
#      found, where, and its version);
#   2. every GPU test: `cargo test --release --features cuda -- gpu` (kernels vs the CPU,
#      50 training steps vs the CPU device, NCCL sums; skipped without a source tree);
#   3. the NCCL allreduce table on all GPUs: `ringrec bench allreduce --backends nccl,shm`
#      (mpi is always measured too), nccl-tests style (busbw, #wrong);
#   4. GPU vs CPU training on the default data set: `ringrec train --device cuda` and
#      `--device cpu`, same flags, per-step losses and samples/s, 1 rank and one rank per GPU;
#   5. every model of issue 31 (mlp, dlrm, dcn, deepfm, wide-deep) on one GPU, f32 and
#      `--dense-precision bf16`, on one generated TSV, beside the same model in PyTorch on the
#      same GPU (scripts/bench/torch_ctr.py --device cuda --model M: model and data on the
#      GPU, nn.Embedding(sparse=True)) where a Python with torch exists (TORCH_PY, else
#      target/bench-venv/bin/python; skipped, with the reason, without one).
#   6. issue 30 (scripts/device/i30.sh): the GPU hot-row cache off and on (pipeline on)
#      beside PyTorch on the same GPU at batch 1024, 8192 and 65536, on the 200k-row set and
#      a Zipf set of a 97M-key space; test AUC of cache on vs off; `bench step` with the
#      cache (0, 256, 1024 MiB). Its table: $OUT/i30-report.txt (scripts/device/i30_report.py).
#      I30=0 leaves it out; DEVICE=host runs it without a GPU (the kernels on the CPU, PyTorch
#      on the CPU: a check of the script, not a measurement). GPU_TESTS=0 leaves out step 2.
# Output: target/gpu-check/report.json (machine-readable) and target/gpu-check/report.txt
# (the same, readable), plus each step's raw output beside them. Exit status 0 when every
# step that ran passed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-target/gpu-check}
mkdir -p "$OUT"
RINGREC=${RINGREC:-}
STEPS=${STEPS:-300}
status=0
declare -a names results

step() { # name, then the command; output to $OUT/<name>.txt
  local name=$1; shift
  echo "== $name: $*"
  if "$@" > "$OUT/$name.txt" 2>&1; then results+=("pass"); else results+=("FAIL"); status=1; fi
  names+=("$name")
  tail -n 5 "$OUT/$name.txt" | sed 's/^/   /'
}
skip() { names+=("$1"); results+=("skipped: $2"); echo "== $1: skipped ($2)"; }

if [ -z "$RINGREC" ]; then
  if [ -f Cargo.toml ]; then
    step build cargo build --release --locked --features cuda
    RINGREC=target/release/ringrec
  else
    RINGREC=$(command -v ringrec || true)
  fi
fi
[ -x "$RINGREC" ] || { echo "gpu-check: no ringrec binary (set RINGREC=...)" >&2; exit 2; }

mpirun_args=(--oversubscribe)
[ "$(id -u)" -eq 0 ] && mpirun_args+=(--allow-run-as-root)
if command -v nvidia-smi >/dev/null 2>&1; then
  step nvidia-smi nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,memory.total --format=csv
  GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
else
  skip nvidia-smi "nvidia-smi not found (no NVIDIA driver?)"
  GPUS=0
fi
step info "$RINGREC" info

if [ "${GPU_TESTS:-1}" = 0 ]; then
  skip gpu-tests "GPU_TESTS=0"
elif [ -f Cargo.toml ]; then
  step gpu-tests cargo test --release --locked --features cuda -- gpu --test-threads=1
else
  skip gpu-tests "no source tree here (run from the repository for the tests)"
fi

if [ "$GPUS" -ge 1 ]; then
  step nccl-allreduce mpirun "${mpirun_args[@]}" -np "$GPUS" "$RINGREC" bench allreduce --backends nccl,shm -b 8 -e 1G
  step train-gpu-1 "$RINGREC" train --device cuda --max-steps "$STEPS" --record-losses --json --no-progress
  step train-cpu-1 "$RINGREC" train --device cpu --max-steps "$STEPS" --record-losses --json --no-progress
  if [ "$GPUS" -ge 2 ]; then
    step train-gpu-n mpirun "${mpirun_args[@]}" -np "$GPUS" "$RINGREC" train --device cuda --max-steps "$STEPS" --record-losses --json --no-progress
    step train-cpu-n mpirun "${mpirun_args[@]}" -np "$GPUS" "$RINGREC" train --device cpu --max-steps "$STEPS" --record-losses --json --no-progress
  fi
  MODEL_DATA=$OUT/models-synth.tsv
  [ -s "$MODEL_DATA" ] || "$RINGREC" data synth --interactions --rows "${MODEL_ROWS:-400000}" --out "$MODEL_DATA" >/dev/null 2>&1
  TORCH_PY=${TORCH_PY:-target/bench-venv/bin/python}
  for m in mlp dlrm dcn deepfm wide-deep; do
    step "model-$m-gpu" "$RINGREC" train --device cuda --model "$m" --data "$MODEL_DATA" --sparse-optimizer adagrad --json --no-progress
    step "model-$m-gpu-bf16" "$RINGREC" train --device cuda --model "$m" --dense-precision bf16 --data "$MODEL_DATA" --sparse-optimizer adagrad --json --no-progress
    if "$TORCH_PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
      step "model-$m-torch" "$TORCH_PY" scripts/bench/torch_ctr.py --device cuda --model "$m" --data "$MODEL_DATA" --sparse-optimizer adagrad --json
    else
      skip "model-$m-torch" "no Python with torch and CUDA at $TORCH_PY (set TORCH_PY)"
    fi
  done
else
  skip nccl-allreduce "no GPU"
  skip train "no GPU"
fi

if [ "${I30:-1}" != 0 ] && { [ "$GPUS" -ge 1 ] || [ "${DEVICE:-cuda}" != cuda ]; }; then
  RES=$OUT/i30-results.jsonl; : > "$RES"
  tstep() { # name timeout cmd...: a step under a timeout, its last JSON line into $RES
    local name=$1 to=$2; shift 2
    local t0; t0=$(date +%s.%N)
    step "$name" timeout -k 5 "$to" "$@"
    local rc=0; [ "${results[${#results[@]}-1]}" = pass ] || rc=1
    local dt; dt=$(awk "BEGIN{printf \"%.2f\", $(date +%s.%N) - $t0}")
    local line; line=$(grep -h '^{.*}$' "$OUT/$name.txt" 2>/dev/null | tail -n 1)
    case $line in
      '{}'|'') echo "{\"step\":\"$name\",\"rc\":$rc,\"secs\":$dt}" ;;
      *) echo "{\"step\":\"$name\",\"rc\":$rc,\"secs\":$dt,${line#\{}" ;;
    esac >> "$RES"
  }
  [ "${DEVICE:-cuda}" = cuda ] || TORCH_DEVICE=${TORCH_DEVICE:-cpu}
  TORCH_PY=${TORCH_PY:-target/bench-venv/bin/python} R=$RINGREC DATA_DIR=${DATA_DIR:-$OUT/i30-data} TEST_BINS=
  . scripts/device/i30.sh
  python3 scripts/device/i30_report.py "$RES" > "$OUT/i30-report.txt" 2>&1 || status=1
else
  skip i30 "no GPU (DEVICE=host runs it on the CPU)"
fi

# The report: every step's result, the machine, and the training summaries side by side.
json_line() { grep -h '^{' "$OUT/$1.txt" 2>/dev/null | tail -n 1; }
{
  printf '{"date":"%s","host":"%s","gpus":%s,"steps":{' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(hostname)" "$GPUS"
  for i in "${!names[@]}"; do
    [ "$i" -gt 0 ] && printf ','
    printf '"%s":"%s"' "${names[$i]}" "${results[$i]//\"/\'}"
  done
  printf '},"train":{'
  first=1
  for t in train-gpu-1 train-cpu-1 train-gpu-n train-cpu-n; do
    line=$(json_line "$t")
    [ -n "$line" ] || continue
    [ $first -eq 1 ] || printf ','
    printf '"%s":%s' "$t" "$line"
    first=0
  done
  printf '}}\n'
} > "$OUT/report.json"
{
  echo "# ringrec gpu-check, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(hostname), $GPUS GPU(s)"
  for i in "${!names[@]}"; do printf '%-16s %s\n' "${names[$i]}" "${results[$i]}"; done
  echo
  [ -f "$OUT/nvidia-smi.txt" ] && cat "$OUT/nvidia-smi.txt"
  echo; cat "$OUT/info.txt"
  if [ -f "$OUT/nccl-allreduce.txt" ]; then echo; grep -E '^#|^ +[0-9]' "$OUT/nccl-allreduce.txt"; fi
  echo
  [ -f "$OUT/i30-report.txt" ] && { echo; cat "$OUT/i30-report.txt"; }
  echo
  printf '%-22s %12s %10s %10s %10s\n' run samples/s train_loss test_auc params_fnv
  for t in train-gpu-1 train-cpu-1 train-gpu-n train-cpu-n $(for m in mlp dlrm dcn deepfm wide-deep; do echo "model-$m-gpu model-$m-gpu-bf16 model-$m-torch"; done); do
    line=$(json_line "$t")
    [ -n "$line" ] || continue
    field() { echo "$line" | grep -o "\"$1\":[^,}]*" | head -n 1 | cut -d: -f2- | tr -d '"'; }
    printf '%-22s %12.0f %10s %10s %10s\n' "$t" "$(field samples_per_sec)" "$(field train_loss)" "$(field test_auc)" "$(field params_fnv)"
  done
} > "$OUT/report.txt"
cat "$OUT/report.txt"
echo "gpu-check: report in $OUT/report.json and $OUT/report.txt"
exit $status
