#!/usr/bin/env bash
# The ONNX export (issue 34 item 1) against ringrec's own scoring, with ONNX Runtime:
#   1. synthetic data (ROWS rows), the default model trained on 2 ranks for one epoch,
#      exported with --format onnx; `ringrec predict` scores the held-out 10% from the bundle,
#   2. scripts/onnx_check.py bundle: onnx's full checker, ONNX Runtime on the same rows, the
#      largest |ORT - predict| (the figure: within 1e-5),
#   3. scripts/bench/ort_score.py on all ROWS rows: ONNX Runtime's own rows/s in 512-row batches and
#      single-row latency (p50/p99) of the first 2000, for the serving comparison,
#   4. the other models of issue 31 (until their Rust nets land: tests/onnx.rs's graphs of
#      random parameters), ONNX Runtime against a numpy implementation of the spec.
#   scripts/bench/onnx.sh      Environment: RINGREC (default target/release/ringrec, else
#                              target/debug/ringrec), ROWS (20000).
set -euo pipefail
cd "$(dirname "$0")/../.."
R=${RINGREC:-target/release/ringrec}
[ -x "$R" ] || R=target/debug/ringrec
ROWS=${ROWS:-20000}
py=$(scripts/test-venv.sh)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export RINGREC_DATA_DIR="$dir/cache"
echo "# $(date -u +%FT%TZ) $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); $R; $ROWS rows"
"$R" data synth --rows "$ROWS" --out "$dir/d.tsv" >/dev/null
scripts/mpirun.sh -np 2 "$R" train --data "$dir/d.tsv" --epochs 1 --batch 512 --checkpoint-dir "$dir/ck" --no-progress --json | tail -1 | "$py" -c 'import json,sys; j=json.loads(sys.stdin.read()); print("train: %d steps, test AUC %.4f on %d held-out rows" % (j["steps"], j["test_auc"], j["test_rows"]))'
"$R" export --model "$dir/ck" --out "$dir/b" --format onnx
"$R" predict --model "$dir/b" --data "$dir/d.tsv" --test-fraction 0.1 --out "$dir/s.tsv" --json | tail -1
echo "## ONNX Runtime vs ringrec predict (held-out rows)"
"$py" scripts/onnx_check.py bundle "$dir/b" "$dir/d.tsv" --test-fraction 0.1 --tolerance 1e-5 --compare "$dir/s.tsv" 2>&1
echo "## ONNX Runtime's own inference (scripts/bench/ort_score.py)"
"$py" scripts/bench/ort_score.py "$dir/b" "$dir/d.tsv" --repeat 5
echo "## every model's graph vs a numpy implementation of the spec (tests/onnx.rs)"
RINGREC_TEST_PYTHON="$py" cargo test --locked --test onnx every_models -- --nocapture 2>&1 | grep -E '^onnx_check|^test result'
