"""Table of docs/bench/step.jsonl (scripts/bench/step_compare.sh): per label and batch the
best of the repeats (samples/s per host, step time, phases), new/old ratios, roofline."""
import collections
import json
import sys

runs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
best = collections.OrderedDict()
for r in runs:
    for row in r["rows"]:
        key = (r["label"], row["batch_per_rank"])
        if key not in best or row["samples_per_sec_host"] > best[key][1]["samples_per_sec_host"]:
            best[key] = (r, row)
print(f"# ringrec bench step: best of {sum(1 for r in runs if r['label'] == 'new np=2')} run(s) per row; "
      "phases in ms (the slowest rank's mean)")
print(f"{'run':<20} {'batch/rk':>8} {'step ms':>8} {'samples/s/host':>15} | {'batch':>6} {'lookup':>6} {'grads':>6} {'exch':>6} "
      f"({'apply':>6}) | {'B/smp':>6} {'of roofline':>11}")
for (label, b), (r, row) in best.items():
    p = row["phases_ms"]
    roof = f"{100 * row['of_roofline']:.0f}%" if "of_roofline" in row else "-"
    bps = f"{row['bytes_per_sample']:.0f}" if "bytes_per_sample" in row else "-"
    print(f"{label:<20} {b:>8} {row['step_ms']:>8.2f} {row['samples_per_sec_host']:>15,.0f} | {p['batch']:>6.2f} {p['lookup']:>6.2f} "
          f"{p['grads']:>6.2f} {p['exchange']:>6.2f} ({p['apply']:>6.2f}) | {bps:>6} {roof:>11}")
print()
for (label, b), (r, row) in best.items():
    if label != "new np=2":
        continue
    old = best.get(("old np=2", b))
    if old:
        ratio = row["samples_per_sec_host"] / old[1]["samples_per_sec_host"]
        target = "  target >= 2x at 16384: " + ("met" if ratio >= 2 else "NOT met") if b == 16384 else ""
        print(f"new / old (8fd7d85), 2 ranks, batch {b:>6}/rank: {ratio:.2f}x{target}")
