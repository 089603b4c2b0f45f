"""Tables of the training benchmarks' JSONL files (written by json_run.py).

    python bench_report.py train docs/bench/train.jsonl       # samples/s and the speedup ratios
    python bench_report.py auc docs/bench/criteo_auc.jsonl    # mean test AUC per implementation

Records are grouped by their `label` ("ringrec np=2", "pytorch threads=2",
"pytorch-ddp np=2 threads=1", ...), the best of each group (samples/s) is its row. A record
with an `error` field is a failed run: listed, never counted.

train: the headline ratios compare ringrec 1 rank with the fastest PyTorch single-process
row and ringrec 2 ranks with the fastest PyTorch DDP-2 row, among the rows with sparse
embedding gradients only ("embedding_grad": "sparse"); dense-gradient rows are listed as
"dense-grad (informational)" and never used. Targets: ringrec 1 rank / PyTorch single (best)
>= 1.5x, ringrec 2 ranks / PyTorch DDP 2 (best) >= 2x, |test AUC difference| <= 0.005 on
the same split.
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


def ratio_line(name, a, b, target):
    """samples/s of record a over record b, with the target's verdict."""
    if a is None or b is None:
        return f"{name:<44} n/a (no successful run)" + (f"  target >= {target}x" if target else "")
    r = a["samples_per_sec"] / b["samples_per_sec"]
    verdict = "met" if r >= target else "NOT met"
    return (f"{name:<44} {r:6.2f}x  ({a['samples_per_sec']:,.0f} / {b['samples_per_sec']:,.0f} "
            f"samples/s)  target >= {target}x: {verdict}")


def auc_line(name, a, b, target=0.005):
    """test AUC of record a minus record b, when both used the same train/test split."""
    if a is None or b is None:
        return f"{name:<44} n/a (no successful run)  target |diff| <= {target}"
    split_a = (a.get("train_rows"), a.get("test_rows"))
    split_b = (b.get("train_rows"), b.get("test_rows"))
    if split_a != split_b or None in split_a:
        return (f"{name:<44} n/a: not the same split (train/test rows {split_a} vs {split_b})  "
                f"target |diff| <= {target}")
    d = a["test_auc"] - b["test_auc"]
    verdict = "met" if abs(d) <= target else "NOT met"
    return (f"{name:<44} {d:+.5f}  ({a['test_auc']:.5f} - {b['test_auc']:.5f}, test rows "
            f"{split_a[1]:,})  target |diff| <= {target}: {verdict}")


def is_reference(r, impl, procs):
    """A row that may be a headline's reference: PyTorch with sparse embedding gradients."""
    return (r is not None and r.get("impl") == impl and r.get("procs") == procs
            and r.get("embedding_grad") == "sparse")


def train(path):
    g = groups(load(path))
    bests = {label: best(rs) for label, rs in g.items()}
    # The references: the fastest sparse-gradient PyTorch rows (never a dense-grad row).
    refs = {}
    for key, impl, procs in (("single", "pytorch", 1), ("ddp2", "pytorch-ddp", 2)):
        cands = [lbl for lbl, b in bests.items() if is_reference(b, impl, procs)]
        refs[key] = max(cands, key=lambda lbl: bests[lbl]["samples_per_sec"]) if cands else None
    notes = {refs["single"]: "reference: PyTorch single (best)",
             refs["ddp2"]: "reference: PyTorch DDP 2 (best)"}

    w = max([20] + [len(lbl) for lbl in g])  # the label column
    print(f"# {path}: best of {max(len(v) for v in g.values()) if g else 0} run(s) per row "
          "(samples/s of the training loop only)")
    print(f"{'run':<{w}} {'procs':>5} {'thr':>4} {'emb grad':>8} {'samples/s':>11} {'steps':>6} "
          f"{'train loss':>10} {'test logloss':>12} {'test AUC':>9} {'load':>5}  note")
    for label, rs in g.items():
        b = bests[label]
        if b is None:
            err = rs[-1].get("error", "?")
            print(f"{label:<{w}} FAILED: {err}")
            tail = rs[-1].get("stderr_tail", "").strip().splitlines()[-2:]
            for t in tail:
                print(f"{'':<{w}}   {t[:110]}")
            continue
        grad = b.get("embedding_grad", "-" if b.get("impl") == "ringrec" else "?")
        note = notes.get(label, "")
        if grad == "dense":
            note = "dense-grad (informational)"
        print(f"{label:<{w}} {fmt(b.get('procs', b.get('ranks')), '>5')} "
              f"{fmt(b.get('threads', b.get('threads_per_rank')), '>4')} {grad:>8} "
              f"{fmt(b['samples_per_sec'], '>11,.0f')} {fmt(b.get('steps'), '>6')} "
              f"{fmt(b.get('train_loss'), '>10.5f')} {fmt(b.get('test_logloss'), '>12.5f')} "
              f"{fmt(b.get('test_auc'), '>9.5f')} {fmt(b.get('loadavg_before'), '>5.1f')}  {note}".rstrip())
    print()
    for key, what in (("single", "PyTorch single (best)"), ("ddp2", "PyTorch DDP 2 (best)")):
        lbl = refs[key]
        if lbl is None:
            print(f"{what + ':':<44} none (no successful sparse-gradient run)")
        else:
            b = bests[lbl]
            print(f"{what + ':':<44} \"{lbl}\" ({b.get('procs')} process(es) x {b.get('threads')} "
                  f"thread(s), sparse embedding gradients, torch {b.get('torch', '?')})")
    r1, r2 = bests.get("ringrec np=1"), bests.get("ringrec np=2")
    ref1 = bests[refs["single"]] if refs["single"] else None
    ref2 = bests[refs["ddp2"]] if refs["ddp2"] else None
    print(ratio_line("ringrec 1 rank / PyTorch single (best)", r1, ref1, 1.5))
    print(ratio_line("ringrec 2 ranks / PyTorch DDP 2 (best)", r2, ref2, 2))
    print(auc_line("test AUC ringrec 1 rank - PyTorch single", r1, ref1))
    print(auc_line("test AUC ringrec 2 ranks - PyTorch DDP 2", r2, ref2))


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
