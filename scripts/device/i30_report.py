"""Issue 30's GPU check, the readable report: reads the JSON lines of scripts/device/i30.sh's
steps (results.jsonl: one line per step, its "step" name, "rc", "secs" and the run's own
JSON summary) and prints, per data set and batch, ringrec with the GPU cache off and on
beside PyTorch's best on the same GPU (ratios), the test AUC of cache on vs off, the cache's
counters, then `bench step`'s rows and the tests' results. Standard library only.

    python3 scripts/device/i30_report.py OUT/results.jsonl > OUT/i30-report.txt
"""
import json
import sys

FIGURES = {1024: 1.5, 8192: 2.0}  # issue 30: ringrec >= this x PyTorch on the same GPU
AUC_TOLERANCE = 0.002


def find(d, *names):
    """The first value of a key named like one of `names` anywhere in `d` (nested)."""
    if isinstance(d, dict):
        for n in names:
            if n in d and not isinstance(d[n], (dict, list)):
                return d[n]
        for v in d.values():
            r = find(v, *names)
            if r is not None:
                return r
    elif isinstance(d, list):
        for v in d:
            r = find(v, *names)
            if r is not None:
                return r
    return None


def num(x, fmt="{:,.0f}"):
    return "-" if x is None else fmt.format(x)


def ratio(a, b):
    return None if a is None or b in (None, 0) else a / b


def bench_table(report):
    """`ringrec bench step --json`'s rows, the cache's columns: host time per sample of the
    slowest rank, its ratio to the cache-off row, hit rate, bytes per sample each way (and
    of the upload, the update list's), rows
    refreshed per step, unique keys per rank and step, and the phases (ms). A cache marked
    `wb` is the write-back alternative (`--write-back`)."""
    print(f"# ranks {report.get('ranks')}, table keys {report.get('table_keys')}")
    print("{:>8} {:>6} {:>9} {:>7} {:>6} {:>8} {:>8} {:>8} {:>9} {:>8}  {}".format(
        "batch", "cache", "us/smp", "of off", "hit%", "up B", "upd B", "down B", "refr/st", "uniq/rk", "phases ms"))
    for r in report.get("rows", []):
        phases = " ".join(f"{k} {v:.2f}" for k, v in r.get("phases_ms", {}).items() if k in ("batch", "plan", "lookup", "grads", "exchange", "apply", "update", "refresh"))
        print("{:>8} {:>6} {:>9.3f} {:>7.2f} {:>6.1f} {:>8.0f} {:>8.0f} {:>8.0f} {:>9.0f} {:>8.0f}  {}".format(
            r["batch_per_rank"], f"{r['gpu_cache_mib']}{'wb' if r.get('write_back') else ''}", r["host_us_per_sample"], r["of_cache_off"], 100 * r["hit_rate"],
            r["uploaded_per_sample"], r.get("update_uploaded_per_sample", 0.0), r["downloaded_per_sample"], r["rows_refreshed_per_step"], r["unique_per_rank"], phases))


def main(path):
    runs = {}
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                print(f"# unreadable line in {path}: {e}")
                continue
            runs[d.get("step", "?")] = d
    ok = lambda d: d is not None and d.get("rc") == 0
    sps = lambda d: d.get("samples_per_sec") if ok(d) else None
    device = next((d.get("device") for d in runs.values() if str(d.get("step", "")).startswith("torch") and ok(d)), None)
    print(f"# issue 30, the GPU check: ringrec (GPU cache off / on) vs PyTorch on the same device ({device or 'unknown'})")
    print("# samples/s of the training loop; PyTorch: the best of --threads 1 and its default; ratios ringrec / PyTorch;")
    print("# AUC: test AUC; fnv: cache on and off end with the same params_fnv; hit%, up/down: the cache's counters (bytes per sample)")
    head = ("set", "batch", "rr off", "rr on", "torch", "off/pt", "on/pt", "on/off", "AUC off", "AUC on", "dAUC", "fnv", "hit%", "up B", "down B", "figure")
    print("{:<6} {:>6} {:>10} {:>10} {:>10} {:>7} {:>7} {:>7} {:>8} {:>8} {:>8} {:>5} {:>6} {:>7} {:>7}  {}".format(*head))
    verdicts = []
    for s in ("synth", "zipf"):
        batches = sorted({int(k.split("-b")[1].split("-")[0]) for k in runs if k.startswith(f"rr-{s}-b") or k.startswith(f"torch-{s}-b")})
        for b in batches:
            off, on = runs.get(f"rr-{s}-b{b}-off"), runs.get(f"rr-{s}-b{b}-on")
            torch = [runs.get(f"torch-{s}-b{b}-{t}") for t in ("t1", "tdef")]
            pt = max((sps(t) for t in torch if sps(t) is not None), default=None)
            auc_off = off.get("test_auc") if ok(off) else None
            auc_on = on.get("test_auc") if ok(on) else None
            dauc = None if auc_off is None or auc_on is None else auc_on - auc_off
            fnv = "-" if not (ok(off) and ok(on)) else ("same" if off.get("params_fnv") == on.get("params_fnv") else "DIFF")
            hit = find(on, "hit_rate") if ok(on) else None
            up = find(on, "uploaded_per_sample", "bytes_uploaded_per_sample") if ok(on) else None
            down = find(on, "downloaded_per_sample", "bytes_downloaded_per_sample") if ok(on) else None
            r_on = ratio(sps(on), pt)
            fig = ""
            if b in FIGURES and s == "synth":
                met = "not measured" if r_on is None else "met" if r_on >= FIGURES[b] else "NOT met"
                fig = f">= {FIGURES[b]}x: {met}"
                verdicts.append(f"batch {b}: ringrec (cache on) {num(r_on, '{:.2f}')}x PyTorch (figure >= {FIGURES[b]}x): {met}")
            if dauc is not None:
                verdicts.append(f"{s} batch {b}: AUC cache on - off = {dauc:+.5f} (figure within {AUC_TOLERANCE}): {'met' if abs(dauc) <= AUC_TOLERANCE else 'NOT met'}")
            print("{:<6} {:>6} {:>10} {:>10} {:>10} {:>7} {:>7} {:>7} {:>8} {:>8} {:>8} {:>5} {:>6} {:>7} {:>7}  {}".format(
                s, b, num(sps(off)), num(sps(on)), num(pt), num(ratio(sps(off), pt), "{:.2f}"), num(r_on, "{:.2f}"),
                num(ratio(sps(on), sps(off)), "{:.2f}"), num(auc_off, "{:.5f}"), num(auc_on, "{:.5f}"), num(dauc, "{:+.5f}"), fnv,
                num(None if hit is None else 100 * hit, "{:.1f}"), num(up), num(down), fig))
    print()
    for v in verdicts:
        print(v)
    bench = runs.get("bench-step-zipf")
    if bench is not None:
        print()
        print(f"# ringrec bench step on the Zipf set (rc {bench.get('rc')}): host time per sample of the slowest rank, vs the cache-off row")
        bench_table(bench)
    print()
    print("# every step: rc, seconds")
    for name, d in runs.items():
        print(f"{name:<28} rc={d.get('rc')} {d.get('secs')}s")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "results.jsonl")
