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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synth_tsv import NUM_SPARSE, dense_columns, draw_labels, write_tsv  # noqa: E402


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
    dense_cols = dense_columns(rng, n, logit)

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

    label = draw_labels(rng, logit)
    write_tsv(a.out, [label.astype(str)] + dense_cols + cat_cols)
    print(f"wrote {a.out}: {n} rows, ctr {label.mean():.4f}, {once} (field, value) pairs occur once", file=sys.stderr)


if __name__ == "__main__":
    main()
