"""The table of scripts/bench/models.sh: issue 31's models, ringrec beside PyTorch.

    python models_report.py docs/bench/models.jsonl

Per data set and model:
- test AUC, mean over seeds, of ringrec 1 rank, ringrec 2 ranks and PyTorch (single
  process, default threads); the paired difference ringrec - PyTorch (same seed, same
  split), its mean and standard error; target |mean difference| <= 0.002;
- on the interactions set, each model's paired lift over mlp (same implementation, same
  seed); target >= 0.005 for dlrm, dcn and deepfm;
- training samples/s: ringrec 1 rank / PyTorch single (best of the thread sweep), target
  >= 1.2x; ringrec 2 ranks / PyTorch DDP 2 (best thread setting, sparse gradients), >= 2x.
A record with an `error` field is a failed run: counted, never used.
"""
import json
import math
import statistics
import sys

AUC_TARGET = 0.002
LIFT_TARGET = 0.005
LIFT_MODELS = ("dlrm", "dcn", "deepfm")
SPEED_TARGETS = {1: 1.2, 2: 2.0}


def load(path):
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def ok(r):
    return "error" not in r and isinstance(r.get("test_auc"), (int, float)) \
        and not math.isnan(r["test_auc"])


def auc_by_seed(recs, impl, procs, threads=None):
    """seed -> test AUC of the matching successful runs (the first per seed)."""
    out = {}
    for r in recs:
        if r.get("impl") == impl and r.get("procs") == procs and ok(r) and \
                (threads is None or r.get("threads") == threads):
            out.setdefault(r.get("seed"), r["test_auc"])
    return out


def paired(a, b):
    """Mean and standard error of a[s] - b[s] over the seeds both have, and their count."""
    seeds = sorted(set(a) & set(b))
    d = [a[s] - b[s] for s in seeds]
    if not d:
        return None, None, 0
    se = statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else float("nan")
    return statistics.fmean(d), se, len(d)


def fmt_diff(mean, se, n, target, lower_bound=False):
    if mean is None:
        return "n/a (no paired runs)"
    verdict = ("met" if mean >= target else "NOT met") if lower_bound else \
        ("met" if abs(mean) <= target else "NOT met")
    sign = ">=" if lower_bound else "|.| <="
    se_s = "" if math.isnan(se) else f" +- {se:.4f}"
    return f"{mean:+.4f}{se_s} ({n} seeds)  target {sign} {target}: {verdict}"


def best_speed(recs, impl, procs):
    cands = [r for r in recs if r.get("impl") == impl and r.get("procs") == procs
             and "error" not in r and isinstance(r.get("samples_per_sec"), (int, float))]
    return max(cands, key=lambda r: r["samples_per_sec"]) if cands else None


def mean_auc(by_seed):
    return f"{statistics.fmean(by_seed.values()):.4f}" if by_seed else "-"


def main(path):
    recs = load(path)
    sets = list(dict.fromkeys(r.get("set") for r in recs))
    failed = [r for r in recs if "error" in r]
    for s in sets:
        rs = [r for r in recs if r.get("set") == s]
        models = list(dict.fromkeys(r.get("model") for r in rs))
        print(f"## {s}")
        print(f"{'model':<10} {'AUC ringrec 1':>13} {'ringrec 2':>9} {'PyTorch':>8}  "
              f"{'samples/s r1':>12} {'r2':>9} {'PT single':>9} {'PT DDP2':>9}")
        torch_auc = {}
        ring_auc = {}
        for m in models:
            mr = [r for r in rs if r.get("model") == m]
            pt = {}
            for r in mr:  # PyTorch's AUC run: the default thread count (the most threads)
                if r.get("impl") == "pytorch" and ok(r):
                    cur = pt.get(r.get("seed"))
                    if cur is None or r.get("threads", 0) > cur.get("threads", 0):
                        pt[r.get("seed")] = r
            torch_auc[m] = {k: v["test_auc"] for k, v in pt.items()}
            ring_auc[m] = {np_: auc_by_seed(mr, "ringrec", np_) for np_ in (1, 2)}
            sp = {k: best_speed(mr, *k) for k in (("ringrec", 1), ("ringrec", 2),
                                                  ("pytorch", 1), ("pytorch-ddp", 2))}
            speed = [f"{sp[k]['samples_per_sec']:,.0f}" if sp[k] else "-" for k in sp]
            print(f"{m:<10} {mean_auc(ring_auc[m][1]):>13} {mean_auc(ring_auc[m][2]):>9} "
                  f"{mean_auc(torch_auc[m]):>8}  {speed[0]:>12} {speed[1]:>9} {speed[2]:>9} "
                  f"{speed[3]:>9}")
        print()
        for m in models:
            mr = [r for r in rs if r.get("model") == m]
            for np_ in (1, 2):
                d = paired(ring_auc[m][np_], torch_auc[m])
                print(f"{m:<10} AUC ringrec {np_} rank(s) - PyTorch: {fmt_diff(*d, AUC_TARGET)}")
            for np_, (impl, procs) in ((1, ("pytorch", 1)), (2, ("pytorch-ddp", 2))):
                a, b = best_speed(mr, "ringrec", np_), best_speed(mr, impl, procs)
                tgt = SPEED_TARGETS[np_]
                if a is None or b is None:
                    print(f"{m:<10} samples/s ringrec {np_} / {impl} {procs}: n/a (no successful run)"
                          f"  target >= {tgt}x")
                    continue
                x = a["samples_per_sec"] / b["samples_per_sec"]
                print(f"{m:<10} samples/s ringrec {np_} / {impl} {procs} (threads "
                      f"{b.get('threads')}): {x:.2f}x  target >= {tgt}x: "
                      f"{'met' if x >= tgt else 'NOT met'}")
        if s == "interactions" and "mlp" in models:
            print()
            for m in models:
                if m == "mlp":
                    continue
                t = LIFT_TARGET if m in LIFT_MODELS else None
                for who, a, b in (("PyTorch", torch_auc[m], torch_auc["mlp"]),
                                  ("ringrec 1", ring_auc[m][1], ring_auc["mlp"][1])):
                    d = paired(a, b)
                    line = fmt_diff(*d, t, lower_bound=True) if t is not None else \
                        (f"{d[0]:+.4f} ({d[2]} seeds)  (no target)" if d[0] is not None else "n/a")
                    print(f"{m:<10} AUC lift over mlp, {who}: {line}")
        print()
    if failed:
        print(f"{len(failed)} failed run(s):")
        for r in failed:
            print(f"  {r.get('set')} {r.get('model')} seed {r.get('seed')} {r.get('label')}: "
                  f"{str(r.get('error'))[:100]}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
