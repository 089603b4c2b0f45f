#!/usr/bin/env bash
# The GPU machine's check, one call (scripts/device/bundle.sh prepared .gpu/ beside it):
#   OUT=<dir> PART=bench|tests|all|i17|i30 DEADLINE=<s> bash .gpu/run.sh
# bench: ringrec train --device cuda vs --device cpu vs the PyTorch reference on the same
#   GPU (scripts/bench/torch_ctr.py --device cuda: model and whole data set on the GPU,
#   sparse embedding gradients), 200k-row synthetic set, 3 epochs, batch 1024 and 8192,
#   interleaved, twice; the NCCL allreduce table (one rank per GPU).
# tests: the bundled test binaries (GPU tests and, with one GPU, everything else under
#   --device auto). Writes $OUT/log.txt and $OUT/results.jsonl (one JSON line per run).
# i30: issue 30's check (scripts/device/i30.sh: ringrec's GPU cache off / on vs PyTorch on
#   the same GPU at batch 1024, 8192, 65536 on the 200k-row set and a Zipf set, bench step
#   with the cache, the bundled binaries' `gpu` tests); its readable report in
#   $OUT/i30-report.txt. DEADLINE defaults to 420 s and no step runs past HARD (460 s).
#   Bundle its tests with `scripts/device/bundle.sh device train gpu_cache` (each binary
#   runs its tests named `gpu`, at most 150 s each).
# Steps past DEADLINE seconds are skipped (the device time is short); with HARD set, a
# step's timeout is cut so that it ends by HARD seconds.
set -u
cd "$(dirname "$0")/.."
T0=$(date +%s); LOG=$OUT/log.txt; RES=$OUT/results.jsonl; : > "$RES"
PART=${PART:-all}
if [ "$PART" = i30 ]; then DEADLINE=${DEADLINE:-420}; HARD=${HARD:-460}; else DEADLINE=${DEADLINE:-400}; fi
el() { echo $(( $(date +%s) - T0 )); }
step() { # name timeout cmd...
  local name=$1 to=$2; shift 2
  if [ "$(el)" -gt "$DEADLINE" ]; then echo "== $name: SKIPPED (deadline, $(el) s)" | tee -a "$LOG"; return; fi
  if [ -n "${HARD:-}" ] && [ "$to" -gt $(( HARD - $(el) )) ]; then to=$(( HARD - $(el) )); fi
  if [ "$to" -lt 5 ]; then echo "== $name: SKIPPED (hard limit, $(el) s)" | tee -a "$LOG"; return; fi
  echo "== $name ($(el) s): $*" | tee -a "$LOG"
  local t; t=$(date +%s.%N)
  timeout -k 5 "$to" "$@" > /tmp/step.out 2>&1; local rc=$?
  local dt; dt=$(awk "BEGIN{printf \"%.2f\", $(date +%s.%N) - $t}")
  cat /tmp/step.out >> "$LOG"
  if grep -q '^{' /tmp/step.out; then
    grep -h '^{' /tmp/step.out | tail -n 1 | sed "s/^{/{\"step\":\"$name\",\"rc\":$rc,\"secs\":$dt,/" >> "$RES"
  else
    echo "{\"step\":\"$name\",\"rc\":$rc,\"secs\":$dt}" >> "$RES"
  fi
  echo "-- $name: rc=$rc ${dt}s" | tee -a "$LOG"
  tail -n 4 /tmp/step.out
}
. .gpu/ompi-env.sh
[ -d /opt/torch/.venv ] && export VIRTUAL_ENV=/opt/torch/.venv
# The test binaries run the ringrec binary at the path it was built at.
[ -e /work/main ] || { mkdir -p /work; ln -sfn "$PWD" /work/main; }
mkdir -p target/release && cp .gpu/bin/ringrec target/release/ringrec
export RUST_BACKTRACE=1 TMPDIR=/tmp
R=target/release/ringrec
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
{ echo "pwd=$PWD"; date -u; nvidia-smi; nproc; free -g; python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))'; } >> "$LOG" 2>&1
step info 30 $R info
if [ "$PART" = i30 ]; then
  [ -z "${TORCH_PY:-}" ] && { TORCH_PY=python3; [ -x /opt/torch/.venv/bin/python ] && TORCH_PY=/opt/torch/.venv/bin/python; }
  TEST_BINS=$(for t in .gpu/bin/*; do [ "$(basename "$t")" = ringrec ] || echo "$t"; done)
  tstep() { step "$@"; }
  . scripts/device/i30.sh
  python3 scripts/device/i30_report.py "$RES" > "$OUT/i30-report.txt" 2>&1
  cat "$OUT/i30-report.txt"
fi
if [ "$PART" != tests ] && [ "$PART" != i17 ] && [ "$PART" != i30 ]; then
  step nccl-bench 90 mpirun --allow-run-as-root --oversubscribe -np "$GPUS" $R bench allreduce --backends nccl,shm -b 8 -e 256M
  step data-synth 60 $R data synth --rows 200000 --out /tmp/synth-200k.tsv --seed 1
  TP=(python3 scripts/bench/torch_ctr.py --data /tmp/synth-200k.tsv --dim 16 --epochs 3 --json --progress-every 0 --cache-dir /tmp/torch-cache)
  C=(--data /tmp/synth-200k.tsv --dim 16 --epochs 3 --json --no-progress)
  step torch-warm 60 "${TP[@]}" --batch 1024 --device cuda --max-steps 20
  for b in 1024 8192; do
    for rep in 1 2; do
      step train-cuda-b$b-r$rep 60 $R train "${C[@]}" --batch $b --device cuda
      step train-cpu-b$b-r$rep 60 $R train "${C[@]}" --batch $b --device cpu
      step torch-cuda-b$b-r$rep 60 "${TP[@]}" --batch $b --device cuda
    done
  done
  step torch-cpu-b1024 60 "${TP[@]}" --batch 1024 --device cpu
fi
if [ "$PART" = i17 ]; then
  # Issue 17 on the GPU: the 1-bit forms through kernels/compress.cu in training (one rank:
  # the device executor without NCCL), against --device cpu on the same data.
  [ -x .gpu/bin/device ] && step tests-device 150 .gpu/bin/device --test-threads=4
  step data-synth 60 $R data synth --rows 200000 --out /tmp/synth-200k.tsv --seed 1
  C=(--data /tmp/synth-200k.tsv --dim 16 --json --no-progress)
  for c in none 1bit 1bit-l1; do
    for d in cuda cpu; do step "train-$d-$c" 60 $R train "${C[@]}" --device $d --compression $c; done
  done
  step train-cuda-1bit-block0 60 $R train "${C[@]}" --device cuda --compression 1bit --onebit-block 0
  step train-cuda-1bit-lambda 60 $R train "${C[@]}" --device cuda --compression 1bit --onebit-lambda 0.5
  [ -n "${I17_EXTRA:-}" ] && eval "$I17_EXTRA"
fi
if [ "$PART" != bench ] && [ "$PART" != i17 ] && [ "$PART" != i30 ]; then
  for t in .gpu/bin/*; do
    [ "$(basename "$t")" = ringrec ] && continue
    step "tests-$(basename "$t")" 200 "$t" --test-threads=4
  done
fi
echo "== done ($(el) s)" | tee -a "$LOG"
grep -E "^(== |-- |test result|test .* (ok|FAILED))" "$LOG" | tail -n 80
