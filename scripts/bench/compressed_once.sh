#!/usr/bin/env bash
# Issue 33, compressed inputs decoded once: `ringrec data prepare` rows/s of one generated
# Criteo TSV compressed as one gzip stream (`gzip -1`) and as one zstd frame (`zstd -3 -T1`),
# both decoded as one stream, with a build that decodes it twice (BASE_BIN: once to count
# the lines, once to parse) and with this build (decoded once, the columns spilled until
# the lines are known), in the same run, alternately, REPS times each, the best kept; and
# pyarrow's CSV reader (`pyarrow.csv.read_csv`, all threads) on the decompressed text, the
# reference issue 33 names. The page cache is warm (each file read once before). Every
# cache's columns must be the plain TSV's, byte for byte (checked).
#   BASE_BIN=/work/main/target/release/ringrec scripts/bench/compressed_once.sh
#       ROWS=1000000 REPS=3; RINGREC_BIN names the new binary (default target/release/ringrec)
# Needs gzip and zstd on PATH and target/test-venv (scripts/test-venv.sh: pyarrow). The
# files live under target/compressed-once, removed at the end. Writes the raw output to
# docs/bench/compressed_once.txt (OUT names another file).
set -euo pipefail
cd "$(dirname "$0")/../.."
rows=${ROWS:-1000000}
reps=${REPS:-3}
bin=${RINGREC_BIN:-target/release/ringrec}
base=${BASE_BIN:?BASE_BIN: the ringrec that decodes a compressed TSV twice}
py=$(scripts/test-venv.sh)
work=target/compressed-once
trap 'rm -rf "$work"' EXIT
mkdir -p "$work" docs/bench
tsv="$work/day.tsv"
"$bin" data synth --rows "$rows" --out "$tsv" >&2
gzip -1 -c "$tsv" > "$tsv.gz"
zstd -q -3 -T1 -c "$tsv" > "$tsv.zst"
out=${OUT:-docs/bench/compressed_once.txt}
{
  echo "# scripts/bench/compressed_once.sh ROWS=$rows REPS=$reps, $(nproc) cores, $(date -u +%FT%TZ), git $(git rev-parse --short HEAD)"
  echo "# the machine was shared with other jobs when this ran: load average $(cut -d' ' -f1-3 /proc/loadavg)"
  ls -l "$tsv" "$tsv.gz" "$tsv.zst"
  cat "$tsv" "$tsv.gz" "$tsv.zst" > /dev/null
  "$bin" data prepare "$tsv" "$work/plain.rrdata" > /dev/null
  declare -A best
  for f in "$tsv.gz" "$tsv.zst"; do
    for who in base new; do best[$who$f]=0; done
    for i in $(seq "$reps"); do
      for who in base new; do
        b=$bin
        [ "$who" = base ] && b=$base
        line=$("$b" data prepare "$f" "$work/out.rrdata")
        echo "$who $(basename "$f"): $line"
        r=$(head -1 <<<"$line" | sed -E 's/.*\(([0-9]+) rows\/s.*/\1/')
        best[$who$f]=$(python3 -c "print(max(${best[$who$f]}, $r))")
        # The cache past its header page (the columns and their block sums) against the TSV's.
        if cmp -s <(tail -c +4097 "$work/out.rrdata") <(tail -c +4097 "$work/plain.rrdata"); then same=yes; else same=NO; fi
        echo "$who $(basename "$f"): the plain TSV's columns byte for byte: $same"
        rm -f "$work/out.rrdata"
      done
    done
    echo "$(basename "$f") best rows/s: base ${best[base$f]}, new ${best[new$f]}"
  done
  arrow=$("$py" - "$tsv" "$reps" <<'EOF'
import sys, time
import pyarrow.csv as csv
path, reps = sys.argv[1], int(sys.argv[2])
best = 0.0
for _ in range(reps):
    t = time.perf_counter()
    table = csv.read_csv(path, read_options=csv.ReadOptions(autogenerate_column_names=True), parse_options=csv.ParseOptions(delimiter="\t"))
    dt = time.perf_counter() - t
    print(f"pyarrow.csv.read_csv: {table.num_rows} rows, {table.num_columns} columns in {dt:.3f}s ({table.num_rows / dt:.0f} rows/s)", file=sys.stderr)
    best = max(best, table.num_rows / dt)
print(f"{best:.0f}")
EOF
)
  echo "pyarrow (decompressed text) best rows/s: $arrow"
  python3 -c "
g0, g1, z0, z1, a = ${best[base$tsv.gz]}, ${best[new$tsv.gz]}, ${best[base$tsv.zst]}, ${best[new$tsv.zst]}, $arrow
print(f'gzip: new / base {g1 / g0:.2f}x; new / pyarrow {g1 / a:.2f}x, base / pyarrow {g0 / a:.2f}x')
print(f'zstd: new / base {z1 / z0:.2f}x; new / pyarrow {z1 / a:.2f}x, base / pyarrow {z0 / a:.2f}x')
"
} 2>&1 | tee "$out"
