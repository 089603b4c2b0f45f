#!/usr/bin/env bash
# Memory of the host-shared embedding table vs a per-rank copy, on one host.
#
# For 1, 2, 4 and 8 ranks, runs `ringrec table hold` twice under mpirun: once with the
# host table (one file in /dev/shm mapped by every rank, every row touched by every rank),
# once with --per-rank-copy (every rank builds its own HashMap<u64, Vec<f32>>). Each run
# prints one JSON line with every rank's Pss (/proc/self/smaps_rollup) before and after.
# Writes target/bench/embedding_memory.jsonl, prints a table, and plots
# docs/embedding_memory.png with the venv of scripts/bench/venv.sh.
#
#   scripts/bench/embedding_memory.sh            # 1.6M rows x dim 64 f32 (load factor 0.76)
#   ROWS=400000 DIM=16 scripts/bench/embedding_memory.sh
#   RINGREC=path/to/ringrec scripts/bench/embedding_memory.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
ROWS=${ROWS:-1600000}
DIM=${DIM:-64}
RANKS=${RANKS:-"1 2 4 8"}
RINGREC=${RINGREC:-}
if [ -z "$RINGREC" ]; then
  cargo build --release --bin ringrec >&2
  RINGREC="$root/target/release/ringrec"
fi
mpi_flags=(--oversubscribe)
[ "$(id -u)" -eq 0 ] && mpi_flags+=(--allow-run-as-root)
out="$root/target/bench/embedding_memory.jsonl"
mkdir -p "$(dirname "$out")"
: > "$out"
for np in $RANKS; do
  for mode in "" "--per-rank-copy"; do
    RINGREC_JOB_ID="embmem-$$-$np" mpirun "${mpi_flags[@]}" -np "$np" -x RINGREC_JOB_ID \
      "$RINGREC" table hold --rows "$ROWS" --dim "$DIM" $mode | grep '^{' >> "$out"
  done
done

py=$("$root/scripts/bench/venv.sh")
"$py" - "$out" "$root/docs/embedding_memory.png" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
table = {r["ranks"]: r for r in rows if r["mode"] == "host-table"}
copy = {r["ranks"]: r for r in rows if r["mode"] == "per-rank-hashmap"}
ranks = sorted(table)
mib = lambda kib: kib / 1024
r0 = rows[0]
print(f"# {r0['rows']} rows x dim {r0['dim']} f32; host table file {r0['table_bytes'] / 2**20:.0f} MiB "
      f"(rows alone {r0['row_bytes_total'] / 2**20:.0f} MiB)")
print(f"{'ranks':>5} | {'table: sum Pss':>14} {'baseline':>9} {'table - base':>12} | {'per-rank: sum Pss':>17} | {'ratio':>6}")
for n in ranks:
    t, c = table[n], copy[n]
    print(f"{n:>5} | {mib(t['sum_pss_after_kib']):>11.0f} MiB {mib(t['sum_pss_before_kib']):>5.0f} MiB "
          f"{mib(t['sum_pss_after_kib'] - t['sum_pss_before_kib']):>8.0f} MiB | {mib(c['sum_pss_after_kib']):>13.0f} MiB | "
          f"{c['sum_pss_after_kib'] / t['sum_pss_after_kib']:>5.2f}x")
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(6, 4))
ax.plot(ranks, [mib(table[n]["sum_pss_after_kib"]) for n in ranks], "o-", label="host-shared table (sum of Pss)")
ax.plot(ranks, [mib(copy[n]["sum_pss_after_kib"]) for n in ranks], "s-", label="per-rank HashMap copy (sum of Pss)")
ax.axhline(mib(r0["table_bytes"] / 1024), color="gray", ls="--", label="table file size")
ax.set_xlabel("ranks on one host")
ax.set_ylabel("MiB")
ax.set_xticks(ranks)
ax.set_title(f"Embedding memory, {r0['rows']/1e6:g}M rows x dim {r0['dim']} f32")
ax.legend()
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=120)
print(f"plot: {sys.argv[2]}")
PY
