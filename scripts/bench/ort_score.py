#!/usr/bin/env python3
"""ONNX Runtime's own inference speed on a ringrec bundle's model.onnx, for the serving
comparison (`ringrec serve-model` against the same graph in ONNX Runtime's Python API).

    scripts/bench/ort_score.py BUNDLE DATA.tsv [--test-fraction F] [--batch 512]
                               [--single 2000] [--repeat 3] [--threads 1] [--json]

The rows: DATA's rows (its last fraction F with --test-fraction, train's held-out split),
in file order, made into the graph's inputs once before any timing, as
scripts/bundle_predict.py makes them (dense features transformed; each field's row from
table.bin by key, a key it lacks given its initial row). So the figures are ONNX Runtime's
inference alone, not the parsing or the table lookup a server also does.

- rows/s: the rows cut into batches of --batch rows (the last one shorter), each one
  `InferenceSession.run`, the whole pass timed --repeat times after one warm-up pass; the
  best pass is reported (and every pass in --json).
- single-row latency: the first --single rows, each run alone (batch 1), each call timed;
  p50 and p99 over the calls.

Needs numpy and onnxruntime (scripts/test-venv.sh makes a venv with them; the bundle from
`ringrec export --format onnx`). --threads sets ONNX Runtime's intra-op threads (1: one
server worker).
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bundle_predict as bp  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("data")
    ap.add_argument("--test-fraction", type=float, default=0.0)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--single", type=int, default=2000, help="rows timed one at a time")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    model = bp.open_bundle(a.bundle)
    if model.get("onnx") is None:
        bp.fail(f"{a.bundle}: no model.onnx (ringrec export --format onnx)")
    model, _, _, tables = bp.load_bundle(a.bundle)
    _, emb, dense, _, _, _ = bp.inputs(model, tables, a.data, a.test_fraction)
    dense, emb = np.ascontiguousarray(dense, dtype=np.float32), np.ascontiguousarray(emb, dtype=np.float32)
    n = len(dense)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = a.threads
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(os.path.join(a.bundle, model["onnx"]["file"]), sess_options=opts, providers=["CPUExecutionProvider"])
    batches = [({"dense": dense[i:i + a.batch], "emb": emb[i:i + a.batch]}) for i in range(0, n, a.batch)]

    def one_pass():
        t = time.perf_counter()
        for feed in batches:
            sess.run(["probability"], feed)
        return time.perf_counter() - t

    one_pass()
    passes = [one_pass() for _ in range(a.repeat)]
    rows_per_s = n / min(passes)

    k = min(a.single, n)
    lat = []
    for i in range(k):
        feed = {"dense": dense[i:i + 1], "emb": emb[i:i + 1]}
        t = time.perf_counter()
        sess.run(["probability"], feed)
        lat.append(time.perf_counter() - t)
    lat_us = np.array(lat) * 1e6
    p50, p99 = (float(np.percentile(lat_us, q)) for q in (50, 99))
    out = {
        "onnxruntime": ort.__version__,
        "rows": n,
        "batch": a.batch,
        "threads": a.threads,
        "rows_per_s": rows_per_s,
        "pass_s": passes,
        "single_rows": k,
        "single_p50_us": p50,
        "single_p99_us": p99,
    }
    if a.json:
        print(json.dumps(out))
    else:
        print(f"ort_score: onnxruntime {ort.__version__}, {a.threads} intra-op thread(s), {n} rows of {a.bundle}")
        print(f"  batches of {a.batch}: {rows_per_s:,.0f} rows/s (best of {a.repeat} passes: {', '.join(f'{p:.4f}' for p in passes)} s)")
        print(f"  single rows ({k} calls): p50 {p50:.1f} us, p99 {p99:.1f} us")


if __name__ == "__main__":
    main()
