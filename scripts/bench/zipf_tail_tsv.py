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

--model-seed M plants one model for every file made with it (day files of one stream): a
value's weight is a hash of (M, field, value), the missing values' and the integers' weights
are drawn from M; --seed then only changes which rows are drawn. Without it each file has
its own model (drawn from --seed).

--drift D --day K (with --model-seed) makes the planted model change by day, for the time
decay figure of issue 17: on each day 1..K, a share D of the (field, value) weights is
redrawn (which ones is a hash of (M, field, value, day)), so day K's model is day K-1's with
a share D of its value effects new. --drift 0 (the default) is the fixed model above.
--duplicates P makes a share P of the rows copies (label included) of other rows of the
same file, drawn uniformly: the repeated impressions that `--merge-duplicates` folds.

    for d in 0 1 2 3; do python scripts/bench/zipf_tail_tsv.py --rows 20000 --max-vocab 1000 \
        --model-seed 7 --drift 0.3 --day $d --seed $((100 + d)) --out day_$d.tsv; done
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


M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def mix64(z):
    """splitmix64's finaliser on uint64 arrays (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def hashed_normal(model_seed, f, ranks, epoch=None):
    """A standard normal per (model_seed, field f, value rank[, epoch]), the same in every file.
    epoch (an array like ranks, the day of the value's last redraw) gives the value a new draw."""
    x = ranks.astype(np.uint64) * np.uint64(64) + np.uint64(f) + np.uint64((model_seed * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF)
    if epoch is not None:
        x = x ^ mix64(epoch.astype(np.uint64) + np.uint64(0x5851F42D4C957F2D))
    u1 = (mix64(x) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    u2 = (mix64(x ^ np.uint64(0xD1B54A32D192ED03)) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    return np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2)


def last_redraw(model_seed, f, ranks, day, drift):
    """Per value rank: the last day in 1..day on which its weight was redrawn (0: never)."""
    last = np.zeros(len(ranks), dtype=np.int64)
    base = ranks.astype(np.uint64) * np.uint64(64) + np.uint64(f) + np.uint64((model_seed * 0xD6E8FEB86659FD93) & 0xFFFFFFFFFFFFFFFF)
    for d in range(1, day + 1):
        u = (mix64(base ^ mix64(np.uint64(d) * np.uint64(0x9E3779B97F4A7C15))) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
        last = np.where(u < drift, d, last)
    return last


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-vocab", type=int, default=10_000_000)
    ap.add_argument("--zipf", type=float, default=1.1)
    ap.add_argument("--model-seed", type=int, default=None,
                    help="one planted model for every file made with it (see above)")
    ap.add_argument("--drift", type=float, default=0.0,
                    help="share of the value weights redrawn each day (needs --model-seed)")
    ap.add_argument("--day", type=int, default=0, help="the day of this file (with --drift)")
    ap.add_argument("--duplicates", type=float, default=0.0,
                    help="share of rows that copy another row of the file")
    a = ap.parse_args()
    if a.drift and a.model_seed is None:
        ap.error("--drift changes a planted model by day: give --model-seed too")
    if not 0.0 <= a.drift <= 1.0 or not 0.0 <= a.duplicates < 1.0:
        ap.error("--drift must be in [0, 1] and --duplicates in [0, 1)")
    rng = np.random.default_rng(a.seed)
    wrng = np.random.default_rng(a.model_seed) if a.model_seed is not None else None
    n = a.rows

    logit = np.zeros(n)
    dense_cols = dense_columns(rng, n, logit, wrng)

    cat_cols = []
    once = 0
    for f in range(NUM_SPARSE):
        v = int(round(10 ** (1 + np.log10(a.max_vocab / 10) * ((f * 7) % NUM_SPARSE) / (NUM_SPARSE - 1))))
        j = zipf_ranks(rng, v, n, a.zipf)
        miss_p = {2: 0.35, 4: 0.05}.get(f % 6, 0.0)
        missing = rng.random(n) < miss_p
        used, inv, counts = np.unique(j, return_inverse=True, return_counts=True)
        once += int((counts == 1).sum())
        if wrng is None:
            weights = 0.35 * rng.standard_normal(len(used))
            miss_w = 0.35 * rng.standard_normal()
        else:
            epoch = last_redraw(a.model_seed, f, used, a.day, a.drift) if a.drift else None
            weights = 0.35 * hashed_normal(a.model_seed, f, used, epoch)
            miss_w = 0.35 * wrng.standard_normal()
        logit += np.where(missing, miss_w, weights[inv])
        # Distinct 8-hex-digit names: an odd multiplier is a bijection of u32.
        names = ((used * 0x9E3779B1 + f * 0x85EBCA6B) & 0xFFFFFFFF).astype(np.uint64)
        hexes = np.array([f"{h:08x}" for h in names])
        cat_cols.append(np.where(missing, "", hexes[inv]))

    label = draw_labels(rng, logit)
    cols = [label.astype(str)] + dense_cols + cat_cols
    if a.duplicates:
        src = np.arange(n)
        copies = rng.random(n) < a.duplicates
        src[copies] = rng.integers(0, n, int(copies.sum()))
        cols = [np.asarray(c)[src] for c in cols]
        label = label[src]
    write_tsv(a.out, cols)
    print(f"wrote {a.out}: {n} rows, ctr {label.mean():.4f}, {once} (field, value) pairs occur once", file=sys.stderr)


if __name__ == "__main__":
    main()
