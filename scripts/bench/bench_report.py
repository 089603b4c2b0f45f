"""Tables of the training benchmarks' JSONL files (written by json_run.py).

    python bench_report.py train docs/bench/train.jsonl       # samples/s and the speedup ratios
    python bench_report.py auc docs/bench/criteo_auc.jsonl    # mean test AUC per implementation

Records are grouped by their `label` ("ringrec np=2", "pytorch", "pytorch-ddp np=2", ...).
A record with an `error` field is a failed run: listed, never counted.
"""
import json
import math
import statistics
import sys


def load(path):
    recs = []
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if line:
                recs.append(json.loads(line))
    return recs


def groups(recs):
    out = {}
    for r in recs:
        out.setdefault(r.get("label", "?"), []).append(r)
    return out


def fmt(x, spec):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    try:
        return format(x, spec)
    except (TypeError, ValueError):
        return str(x)


def best(rs, key="samples_per_sec"):
    ok = [r for r in rs if "error" not in r and isinstance(r.get(key), (int, float))]
    return max(ok, key=lambda r: r[key]) if ok else None


def ratio_line(name, num, den, target, g):
    a, b = best(g.get(num, [])), best(g.get(den, []))
    if a is None or b is None:
        missing = [lbl for lbl, r in ((num, a), (den, b)) if r is None]
        return (f"{name:<38} n/a (no successful run of {', '.join(missing)})"
                + (f"  target >= {target}x" if target else ""))
    r = a["samples_per_sec"] / b["samples_per_sec"]
    if target is None:
        return (f"{name:<38} {r:6.2f}x  ({a['samples_per_sec']:,.0f} / {b['samples_per_sec']:,.0f} "
                "samples/s)  (same cores; informational)")
    verdict = "met" if r >= target else "NOT met"
    return (f"{name:<38} {r:6.2f}x  ({a['samples_per_sec']:,.0f} / {b['samples_per_sec']:,.0f} "
            f"samples/s)  target >= {target}x: {verdict}")


def train(path):
    g = groups(load(path))
    print(f"# {path}: best of {max(len(v) for v in g.values()) if g else 0} run(s) per row "
          "(samples/s of the training loop only)")
    print(f"{'run':<20} {'procs':>5} {'thr':>4} {'samples/s':>11} {'steps':>6} {'train loss':>10} "
          f"{'test logloss':>12} {'test AUC':>9} {'load':>5}")
    for label, rs in g.items():
        b = best(rs)
        if b is None:
            err = rs[-1].get("error", "?")
            print(f"{label:<20} FAILED: {err}")
            tail = rs[-1].get("stderr_tail", "").strip().splitlines()[-2:]
            for t in tail:
                print(f"{'':<20}   {t[:110]}")
            continue
        print(f"{label:<20} {fmt(b.get('procs', b.get('ranks')), '>5')} {fmt(b.get('threads', b.get('threads_per_rank')), '>4')} "
              f"{fmt(b['samples_per_sec'], '>11,.0f')} {fmt(b.get('steps'), '>6')} "
              f"{fmt(b.get('train_loss'), '>10.5f')} {fmt(b.get('test_logloss'), '>12.5f')} "
              f"{fmt(b.get('test_auc'), '>9.5f')} {fmt(b.get('loadavg_before'), '>5.1f')}")
    print()
    print(ratio_line("ringrec 2 ranks / PyTorch DDP 2", "ringrec np=2", "pytorch-ddp np=2", 2.5, g))
    print(ratio_line("ringrec 1 rank / PyTorch single", "ringrec np=1", "pytorch", 1.2, g))
    if g.get("pytorch sparse-grad"):
        print(ratio_line("ringrec 1 rank / PyTorch sparse-grad", "ringrec np=1", "pytorch sparse-grad", None, g)
              .replace("same cores; ", "embedding sparse=True; "))
    if g.get("pytorch threads=1"):
        print(ratio_line("ringrec 1 rank / PyTorch 1 thread", "ringrec np=1", "pytorch threads=1", None, g))


def auc(path):
    g = groups(load(path))
    print(f"# {path}: test AUC over seeds")
    print(f"{'run':<20} {'runs':>4} {'failed':>6} {'mean AUC':>9} {'std':>7} {'min':>8} {'max':>8} "
          f"{'mean logloss':>12}")
    means = {}
    for label, rs in g.items():
        ok = [r for r in rs if "error" not in r and isinstance(r.get("test_auc"), (int, float))]
        bad = len(rs) - len(ok)
        if not ok:
            print(f"{label:<20} {len(rs):>4} {bad:>6} FAILED: {rs[-1].get('error', '?')}")
            continue
        a = [r["test_auc"] for r in ok]
        ll = [r["test_logloss"] for r in ok if isinstance(r.get("test_logloss"), (int, float))]
        means[label] = statistics.fmean(a)
        print(f"{label:<20} {len(rs):>4} {bad:>6} {means[label]:>9.5f} "
              f"{(statistics.stdev(a) if len(a) > 1 else 0.0):>7.5f} {min(a):>8.5f} {max(a):>8.5f} "
              f"{fmt(statistics.fmean(ll) if ll else None, '>12.5f')}")
    print()
    ref = "pytorch"
    if ref not in means:
        print("no successful PyTorch run: no difference to report")
        return
    for label, m in means.items():
        if label == ref:
            continue
        d = m - means[ref]
        print(f"{label} - {ref}: {d:+.5f} mean test AUC  target |diff| <= 0.01: "
              f"{'met' if abs(d) <= 0.01 else 'NOT met'}")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("train", "auc"):
        sys.exit(__doc__)
    {"train": train, "auc": auc}[sys.argv[1]](sys.argv[2])
