#!/usr/bin/env bash
# Issue 33, compressed inputs: `ringrec data prepare` rows/s of one generated Criteo TSV as
# it is, as a zstd file of one frame (`zstd -T1`: decoded as one stream, on one thread), as a
# zstd file of several frames (`pzstd`: its frames decoded on every thread) and as one gzip
# stream (`gzip -1`: one thread), all threads, in the same run; the ratios against the
# one-frame file and the plain TSV. Each runs REPS times, the best kept; the page cache is
# warm (each file read once before). Every cache must be the plain TSV's, byte for byte.
#   scripts/bench/compressed_prepare.sh         ROWS=1000000 REPS=3 (release build; RINGREC_BIN
#                                               names another binary)
# Needs zstd, pzstd and gzip on PATH. Writes the raw output to docs/bench/compressed_prepare.txt
# (OUT names another file).
set -euo pipefail
cd "$(dirname "$0")/../.."
rows=${ROWS:-1000000}
reps=${REPS:-3}
bin=${RINGREC_BIN:-target/release/ringrec}
work=target/bench-data/compressed-$rows
mkdir -p "$work" docs/bench
tsv="$work/day.tsv"
[ -f "$tsv" ] || "$bin" data synth --rows "$rows" --out "$tsv" >&2
[ -f "$tsv.zst" ] || zstd -q -3 -T1 -c "$tsv" > "$tsv.zst"
[ -f "$tsv.p.zst" ] || pzstd -q -3 -p "$(nproc)" -c "$tsv" > "$tsv.p.zst"
[ -f "$tsv.gz" ] || gzip -1 -c "$tsv" > "$tsv.gz"
out=${OUT:-docs/bench/compressed_prepare.txt}
{
  echo "# scripts/bench/compressed_prepare.sh ROWS=$rows REPS=$reps, $(nproc) cores, $(date -u +%FT%TZ), git $(git rev-parse --short HEAD)"
  echo "# the machine was shared with other jobs when this ran"
  ls -l "$tsv" "$tsv.zst" "$tsv.p.zst" "$tsv.gz"
  python3 - "$tsv.zst" "$tsv.p.zst" <<'PY'
import struct, sys
# zstd frames by their magic at frame starts (the header walk ringrec does, in brief)
for p in sys.argv[1:]:
    b = open(p, "rb").read()
    print(f"{p}: {b.count(struct.pack('<I', 0xFD2FB528))} zstd magic(s) (frames, at most)")
PY
  declare -A best
  for f in "$tsv" "$tsv.zst" "$tsv.p.zst" "$tsv.gz"; do
    cat "$f" > /dev/null
    best[$f]=0
    for i in $(seq "$reps"); do
      line=$("$bin" data prepare "$f" "$work/out.rrdata")
      echo "$(basename "$f"): $line"
      r=$(head -1 <<<"$line" | sed -E 's/.*\(([0-9]+) rows\/s.*/\1/')
      best[$f]=$(python3 -c "print(max(${best[$f]}, $r))")
    done
    # The cache past its header page (the columns and their block sums) against the TSV's.
    [ "$f" = "$tsv" ] && cp "$work/out.rrdata" "$work/plain.rrdata"
    if cmp -s <(tail -c +4097 "$work/out.rrdata") <(tail -c +4097 "$work/plain.rrdata"); then same=yes; else same=NO; fi
    echo "$(basename "$f"): the plain TSV's columns byte for byte: $same"
    echo "$(basename "$f") best rows/s: ${best[$f]}"
  done
  python3 -c "
p, one, many, gz = ${best[$tsv]}, ${best[$tsv.zst]}, ${best[$tsv.p.zst]}, ${best[$tsv.gz]}
print(f'ratio several frames / one frame: {many / one:.2f}x')
print(f'ratio several frames / plain TSV: {many / p:.2f}x; one frame / plain: {one / p:.2f}x; gzip / plain: {gz / p:.2f}x')
"
} 2>&1 | tee "$out"
rm -f "$work/out.rrdata" "$work/plain.rrdata"
