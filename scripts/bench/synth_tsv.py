"""A synthetic Criteo-format TSV for the training benchmarks, in Python (numpy only).

Fallback for when `ringrec data synth` is not available. Same shape as ringrec's
generator (not the same bytes): 40 tab-separated fields; label; 13 integers
`floor(exp(mu_k + 1.2 z)) - 1` (I2 shifted down by 2, each missing with 2% or 20%);
26 categoricals with vocabularies log-spaced 10..100,000 (scrambled field order), values
drawn Zipf(1.1) by rank and written as 8 hex digits, some fields often missing; the label
is drawn from a planted logistic model over the categorical values and ln(1 + max(x, 0))
of the integers, with the bias calibrated to a CTR of about 25%.

    python scripts/bench/synth_tsv.py --rows 200000 --out target/bench-data/synth-200k.tsv --seed 1
"""
import argparse
import os
import sys

import numpy as np

NUM_DENSE, NUM_SPARSE = 13, 26


def dense_columns(rng, n, logit, wrng=None):
    """The 13 integer columns (as strings, "" when missing); adds their planted terms to logit.
    The planted weights come from wrng when given (a model shared by several files), else rng."""
    dense_cols = []
    for k in range(NUM_DENSE):
        mu = 0.3 + (k * 0.77) % 3.5
        x = np.floor(np.exp(mu + 1.2 * rng.standard_normal(n))).astype(np.int64) - 1
        if k == 1:
            x -= 2
        missing = rng.random(n) < (0.2 if k % 4 == 0 else 0.02)
        w = 0.3 * (wrng if wrng is not None else rng).standard_normal()
        logit += np.where(missing, 0.0, w * np.log1p(np.maximum(x, 0)))
        dense_cols.append(np.where(missing, "", x.astype(str)))
    return dense_cols


def draw_labels(rng, logit):
    """Labels of the planted model, its bias calibrated so the mean click probability is 25%."""
    lo, hi = -30.0, 30.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if np.mean(1 / (1 + np.exp(-(logit + mid)))) < 0.25:
            lo = mid
        else:
            hi = mid
    prob = 1 / (1 + np.exp(-(logit + 0.5 * (lo + hi))))
    return (rng.random(len(logit)) < prob).astype(np.int64)


def write_tsv(out, cols):
    """Writes the columns (label first) as a TSV, atomically (a temporary, then a rename)."""
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = out + ".tmp"
    n = len(cols[0])
    with open(tmp, "w") as fh:
        step = 50_000
        for s in range(0, n, step):
            fh.write("".join("\t".join(r) + "\n" for r in zip(*(c[s:s + step] for c in cols))))
    os.replace(tmp, out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    n = a.rows

    logit = np.zeros(n)
    dense_cols = dense_columns(rng, n, logit)

    cat_cols = []
    for f in range(NUM_SPARSE):
        v = int(round(10 ** (1 + 4 * ((f * 7) % NUM_SPARSE) / (NUM_SPARSE - 1))))
        p = np.arange(1, v + 1, dtype=np.float64) ** -1.1
        cdf = np.cumsum(p)
        j = np.minimum(np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right"), v - 1)
        miss_p = {2: 0.35, 4: 0.05}.get(f % 6, 0.0)
        missing = rng.random(n) < miss_p
        weights = 0.35 * rng.standard_normal(v + 1)  # last one: missing
        logit += np.where(missing, weights[v], weights[j])
        # Distinct 8-hex-digit names per rank: a random permutation of a random 32-bit range.
        names = rng.choice(1 << 32, size=v, replace=False).astype(np.uint32)
        hexes = np.array([f"{h:08x}" for h in names])
        cat_cols.append(np.where(missing, "", hexes[j]))

    label = draw_labels(rng, logit)
    write_tsv(a.out, [label.astype(str)] + dense_cols + cat_cols)
    print(f"wrote {a.out}: {n} rows, ctr {label.mean():.4f}", file=sys.stderr)


if __name__ == "__main__":
    main()
