# Issue 30's GPU check, the step list (sourced by scripts/device/run.sh with PART=i30 and by
# scripts/gpu-check.sh; both define `tstep NAME TIMEOUT CMD...`, which runs CMD under the
# timeout, records its last JSON line and respects their DEADLINE):
#   1. two data sets: the 200k-row synthetic set (as the earlier GPU runs) and a Zipf set
#      (`data synth --vocab-scale 300 --zipf 1.05`: a key space of 97M keys, ZROWS rows);
#   2. on each, at batch 1024, 8192 and 65536: ringrec `--device $DEVICE` with the GPU
#      hot-row cache off (`--gpu-cache-mib 0`) and on (`--gpu-cache-mib $CACHE_MIB`, its keys
#      chosen every CACHE_REFRESH = 10 steps: the runs are short), both
#      `--pipeline on`, and PyTorch on the same GPU (scripts/bench/torch_ctr.py --device
#      cuda: model and data in GPU memory, nn.Embedding(sparse=True)) with --threads 1 and
#      its default, the best of the two its reference; the same flags (dim 16, EPOCHS
#      epochs, EPOCHS_LARGE at batch 65536 so a run has more than a few steps; the same
#      split);
#   3. `ringrec bench step` with the cache (0, 256, 1024 MiB; write-through and write-back)
#      on the Zipf set, batch 8192 and 16384 (larger ones would wrap around its rows);
#   4. the GPU tests: every bundled test binary (TEST_BINS) filtered to the tests named
#      `gpu`.
# Flags the binary lacks (a build without the cache or the pipeline) are left out, and said
# so in the log; the report (scripts/device/i30_report.py) then shows what ran.
# Inputs (environment): R (the ringrec binary), OUT, DEVICE (cuda; `host` stands in on a
# machine without a GPU), TORCH_PY (a Python with torch), TORCH_DEVICE (cuda; cpu stands
# in), ROWS, ZROWS, EPOCHS, EPOCHS_LARGE, CACHE_MIB, CACHE_REFRESH, I30_BATCHES, TEST_BINS (test binaries; none: no tests), DATA_DIR.
: "${DEVICE:=cuda}" "${TORCH_DEVICE:=cuda}" "${TORCH_PY:=python3}" "${ROWS:=200000}" "${ZROWS:=500000}"
: "${EPOCHS:=3}" "${EPOCHS_LARGE:=10}" "${CACHE_MIB:=1024}" "${CACHE_REFRESH:=10}" "${DATA_DIR:=/tmp/ringrec-i30}" "${I30_BATCHES:=1024 8192 65536}"
mkdir -p "$DATA_DIR"
# What this binary supports (the lead merges the cache and pipeline branches before the run).
HELP=$("$R" train --help 2>/dev/null)
CACHE_ON=(); CACHE_OFF=(); PIPE=()
if grep -q -- '--gpu-cache-mib' <<< "$HELP"; then
  # Runs here are short (30 to 500 steps): keys chosen every CACHE_REFRESH steps, not 50.
  CACHE_ON=(--gpu-cache-mib "$CACHE_MIB" --gpu-cache-refresh "$CACHE_REFRESH"); CACHE_OFF=(--gpu-cache-mib 0)
else
  echo "== i30: this ringrec has no --gpu-cache-mib: the cache-on runs are skipped" | tee -a "${LOG:-/dev/null}"
fi
if grep -q -- '--pipeline' <<< "$HELP"; then PIPE=(--pipeline on); else
  echo "== i30: this ringrec has no --pipeline: runs without it" | tee -a "${LOG:-/dev/null}"
fi
tstep data-synth 60 "$R" data synth --rows "$ROWS" --out "$DATA_DIR/synth.tsv" --seed 1
tstep data-zipf 120 "$R" data synth --rows "$ZROWS" --vocab-scale 300 --zipf 1.05 --out "$DATA_DIR/zipf.tsv" --seed 1
# PyTorch parses each TSV once (its cache in DATA_DIR): a short run, not measured.
for set in synth zipf; do
  tstep "torch-parse-$set" 150 "$TORCH_PY" scripts/bench/torch_ctr.py --data "$DATA_DIR/$set.tsv" --device "$TORCH_DEVICE" \
    --dim 16 --batch 1024 --max-steps 5 --json --progress-every 0 --cache-dir "$DATA_DIR/torch-cache"
done
for set in synth zipf; do
  for b in $I30_BATCHES; do
    e=$EPOCHS; [ "$b" -ge 65536 ] && e=$EPOCHS_LARGE
    C=(--data "$DATA_DIR/$set.tsv" --data-dir "$DATA_DIR/rr" --dim 16 --epochs "$e" --json --no-progress --device "$DEVICE" "${PIPE[@]}")
    TP=("$TORCH_PY" scripts/bench/torch_ctr.py --data "$DATA_DIR/$set.tsv" --dim 16 --epochs "$e" --json --progress-every 0
        --cache-dir "$DATA_DIR/torch-cache" --device "$TORCH_DEVICE")
    tstep "rr-$set-b$b-off" 90 "$R" train "${C[@]}" --batch "$b" "${CACHE_OFF[@]}"
    [ ${#CACHE_ON[@]} -gt 0 ] && tstep "rr-$set-b$b-on" 90 "$R" train "${C[@]}" --batch "$b" "${CACHE_ON[@]}"
    tstep "torch-$set-b$b-t1" 90 "${TP[@]}" --batch "$b" --threads 1
    tstep "torch-$set-b$b-tdef" 90 "${TP[@]}" --batch "$b"
  done
done
if grep -q -- '--gpu-cache-mib' <<< "$("$R" bench step --help 2>/dev/null)"; then
  tstep bench-step-zipf 150 "$R" bench step --data "$DATA_DIR/zipf.tsv" --data-dir "$DATA_DIR/rr" --batch 8192,16384 \
    --gpu-cache-mib 0,256,1024 --gpu-cache-refresh "$CACHE_REFRESH" --write-back --json
fi
for t in ${TEST_BINS:-}; do
  [ -x "$t" ] && tstep "gpu-tests-$(basename "$t")" 150 "$t" gpu --test-threads=4
done
