"""A synthetic Criteo-format TSV whose categorical values have a long Zipf tail (many
values seen once), for the table benchmarks of issue 16 (admission, half-precision rows).

Like synth_tsv.py (numpy only): label, 13 integers, 26 categoricals; the label is drawn
from a planted logistic model over the categorical values and ln(1 + max(x, 0)) of the
integers, bias calibrated to a CTR of about 25%. The categoricals' vocabularies are
log-spaced from 10 to --max-vocab (default 10,000,000, not 100,000), values drawn
Zipf(--zipf) by rank, so the large fields have a tail of values that occur once: their
keys are the ones `--admit-after 2` never gives a row. Names and weights are drawn only
for the values that occur.

    python scripts/bench/zipf_tail_tsv.py --rows 1000000 --out target/bench-data/tail-1m.tsv
"""
import argparse
import os
import sys

import numpy as np

NUM_DENSE, NUM_SPARSE = 13, 26


def zipf_ranks(rng, v, n, s):
    """n ranks in 0..v drawn with probability ~ 1/(r+1)^s (inverse of the continuous CDF)."""
    u = rng.random(n)
    a = (v + 1.0) ** (1.0 - s) - 1.0
    r = np.floor((a * u + 1.0) ** (1.0 / (1.0 - s))) - 1.0
    return np.clip(r, 0, v - 1).astype(np.int64)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-vocab", type=int, default=10_000_000)
    ap.add_argument("--zipf", type=float, default=1.1)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    n = a.rows

    logit = np.zeros(n)
    dense_cols = []
    for k in range(NUM_DENSE):
        mu = 0.3 + (k * 0.77) % 3.5
        x = np.floor(np.exp(mu + 1.2 * rng.standard_normal(n))).astype(np.int64) - 1
        if k == 1:
            x -= 2
        missing = rng.random(n) < (0.2 if k % 4 == 0 else 0.02)
        w = 0.3 * rng.standard_normal()
        logit += np.where(missing, 0.0, w * np.log1p(np.maximum(x, 0)))
        dense_cols.append(np.where(missing, "", x.astype(str)))

    cat_cols = []
    once = 0
    for f in range(NUM_SPARSE):
        v = int(round(10 ** (1 + np.log10(a.max_vocab / 10) * ((f * 7) % NUM_SPARSE) / (NUM_SPARSE - 1))))
        j = zipf_ranks(rng, v, n, a.zipf)
        miss_p = {2: 0.35, 4: 0.05}.get(f % 6, 0.0)
        missing = rng.random(n) < miss_p
        used, inv, counts = np.unique(j, return_inverse=True, return_counts=True)
        once += int((counts == 1).sum())
        weights = 0.35 * rng.standard_normal(len(used))
        logit += np.where(missing, 0.35 * rng.standard_normal(), weights[inv])
        # Distinct 8-hex-digit names: an odd multiplier is a bijection of u32.
        names = ((used * 0x9E3779B1 + f * 0x85EBCA6B) & 0xFFFFFFFF).astype(np.uint64)
        hexes = np.array([f"{h:08x}" for h in names])
        cat_cols.append(np.where(missing, "", hexes[inv]))

    lo, hi = -30.0, 30.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if np.mean(1 / (1 + np.exp(-(logit + mid)))) < 0.25:
            lo = mid
        else:
            hi = mid
    prob = 1 / (1 + np.exp(-(logit + 0.5 * (lo + hi))))
    label = (rng.random(n) < prob).astype(np.int64)

    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    tmp = a.out + ".tmp"
    cols = [label.astype(str)] + dense_cols + cat_cols
    with open(tmp, "w") as fh:
        step = 50_000
        for s in range(0, n, step):
            fh.write("".join("\t".join(r) + "\n" for r in zip(*(c[s:s + step] for c in cols))))
    os.replace(tmp, a.out)
    print(f"wrote {a.out}: {n} rows, ctr {label.mean():.4f}, {once} (field, value) pairs occur once", file=sys.stderr)


if __name__ == "__main__":
    main()
