"""The curves of a training run from its `--metrics-out` file (one JSON line per
`--eval-every` interval): train loss and held-out log loss, held-out AUC, samples/s.

    $(scripts/bench/venv.sh) scripts/plot_metrics.py metrics.jsonl curves.png [more.jsonl ...]

Several files are drawn on the same axes (one colour each, labelled by file name), e.g. a
run and its warm-started continuation, or two settings side by side.
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    rows = []
    for n, line in enumerate(open(path), 1):
        line = line.strip()
        if not line:
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            sys.exit(f"{path}:{n}: not a JSON line ({e}); is it a --metrics-out file?")
    if not rows:
        sys.exit(f"{path}: no interval in it; was the run started with --eval-every N?")
    return rows


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, inputs = sys.argv[2], [sys.argv[1]] + sys.argv[3:]
    fig, (ax_loss, ax_auc, ax_rate) = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    for path in inputs:
        rows = load(path)
        name = os.path.basename(path)
        step = [r["step"] for r in rows]
        ax_loss.plot(step, [r.get("train_loss") for r in rows], "-", label=f"{name}: train loss")
        if any(r.get("eval_logloss") is not None for r in rows):
            ax_loss.plot(step, [r.get("eval_logloss") for r in rows], "--", label=f"{name}: held-out log loss")
        if any(r.get("eval_auc") is not None for r in rows):
            ax_auc.plot(step, [r.get("eval_auc") for r in rows], "o-", label=name)
        ax_rate.plot(step, [r.get("samples_per_sec") for r in rows], ".-", label=name)
    ax_loss.set_ylabel("log loss")
    ax_auc.set_ylabel("held-out AUC")
    ax_rate.set_ylabel("samples/s (all ranks)")
    ax_rate.set_xlabel("global step")
    for ax in (ax_loss, ax_auc, ax_rate):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("ringrec train: interval reports (--eval-every)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
