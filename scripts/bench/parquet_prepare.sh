#!/usr/bin/env bash
# Issue 33's figure: `ringrec data prepare` from a Parquet file on all threads, beside
# pyarrow's own `read_table` + conversion of the same columns to numpy arrays (the label,
# 13 integers, 26 strings), on the same file in the same run; rows/s of each and the ratio.
# Each side runs REPS times, the best kept; the page cache is warm for both (the file is
# read once before).
#   scripts/bench/parquet_prepare.sh            ROWS=1000000 REPS=3 (release build; RINGREC_BIN
#                                               names another binary)
# Needs target/test-venv (scripts/test-venv.sh: pyarrow, numpy). Writes the raw output to
# docs/bench/parquet_prepare.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
rows=${ROWS:-1000000}
reps=${REPS:-3}
bin=${RINGREC_BIN:-target/release/ringrec}
py=$(scripts/test-venv.sh)
work=target/bench-data/parquet
mkdir -p "$work" docs/bench
pq="$work/criteo-$rows.parquet"
[ -f "$pq" ] || "$bin" data synth --format parquet --rows "$rows" --out "$pq" >&2
cat "$pq" > /dev/null
out=docs/bench/parquet_prepare.txt
{
  echo "# scripts/bench/parquet_prepare.sh ROWS=$rows REPS=$reps, $(nproc) cores, $(date -u +%FT%TZ), git $(git rev-parse --short HEAD)"
  echo "# the machine was shared with other jobs when this ran"
  ls -l "$pq"
  best=0
  for i in $(seq "$reps"); do
    line=$("$bin" data prepare "$pq" "$work/out.rrdata")
    echo "ringrec: $line"
    r=$(head -1 <<<"$line" | sed -E 's/.*\(([0-9]+) rows\/s.*/\1/')
    best=$(python3 -c "print(max($best, $r))")
  done
  echo "ringrec best rows/s: $best"
  arrow=$("$py" - "$pq" "$reps" <<'EOF'
import sys, time
import numpy as np, pyarrow.parquet as pq
path, reps = sys.argv[1], int(sys.argv[2])
best = 0.0
for _ in range(reps):
    t = time.perf_counter()
    table = pq.read_table(path)
    read = time.perf_counter() - t
    cols = {}
    for name in table.column_names:
        c = table.column(name).combine_chunks()
        cols[name] = c.to_numpy(zero_copy_only=False)
    n = table.num_rows
    dt = time.perf_counter() - t
    print(f"pyarrow: read_table + to_numpy of {len(cols)} columns, {n} rows in {dt:.3f}s ({n / dt:.0f} rows/s; read_table alone {read:.3f}s, {n / read:.0f} rows/s)", file=sys.stderr)
    best = max(best, n / dt)
print(f"{best:.0f}")
EOF
)
  echo "pyarrow best rows/s: $arrow"
  python3 -c "print(f'ratio ringrec / pyarrow: {$best / $arrow:.2f}x')"
} 2>&1 | tee "$out"
rm -f "$work/out.rrdata"
