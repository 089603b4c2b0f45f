#!/usr/bin/env python3
"""Checks ringrec's ONNX export with an independent implementation: onnx's checker and ONNX
Runtime (both from PyPI; scripts/test-venv.sh makes a venv with them).

    scripts/onnx_check.py bundle BUNDLE DATA.tsv --compare ringrec_scores.tsv
                          [--test-fraction F] [--tolerance 1e-5]
    scripts/onnx_check.py reference CASE_DIR...  [--rows 64] [--tolerance 1e-5]

bundle: `onnx.checker.check_model(full_check=True)` on BUNDLE/model.onnx (size and CRC-32
checked against model.json first), then ONNX Runtime scores the TSV's rows (the last
fraction F of them with --test-fraction, train's held-out split), the inputs made as
scripts/bundle_predict.py makes them (dense features transformed, each field's row from
table.bin, a key it lacks given its initial row; a Parquet file's columns as model.json's
input.schema names them, a multi-hot field's slot its list's pooled rows), and the scores are compared with
`ringrec predict --out` scores of the same rows: exit 1 when any differs by more than the
tolerance.

reference: each CASE_DIR holds model.onnx, spec.json (the model and its shape flags, as
docs/models.md names them: model, fields, dim, dense, hidden, bottom, interaction_self,
cross_layers, cross_rank, cross_structure) and params.bin (the flat dense parameters,
little-endian f32, in the spec's group order). The graph passes the checker, ONNX Runtime
scores random inputs, and a numpy float64 implementation of the spec written here from
docs/models.md (no ringrec code) scores the same: exit 1 when they differ by more than the
tolerance.
"""

import argparse
import json
import os
import sys
import zlib

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bundle_predict as bp  # noqa: E402  (the bundle reader, beside this script)


def checked_graph(path, expect=None):
    """The bytes of model.onnx, after onnx's full check (and model.json's size and CRC)."""
    with open(path, "rb") as f:
        data = f.read()
    if expect is not None and (len(data) != expect["bytes"] or zlib.crc32(data) != expect["crc32"]):
        bp.fail(f"{path}: {len(data)} bytes of CRC-32 {zlib.crc32(data):#010x}, model.json says {expect['bytes']} of {expect['crc32']:#010x}")
    onnx.checker.check_model(onnx.load_from_string(data), full_check=True)
    return data


def session(data):
    """An ONNX Runtime CPU session of the graph, one thread (as a server's worker)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(data, sess_options=opts, providers=["CPUExecutionProvider"])


def score(sess, dense, emb):
    """ONNX Runtime's probabilities (n,) of the inputs."""
    (p,) = sess.run(["probability"], {"dense": dense.astype(np.float32), "emb": emb.astype(np.float32)})
    return p[:, 0].astype(np.float64)


def check_bundle(a):
    model = bp.open_bundle(a.bundle)
    spec = model.get("onnx")
    if spec is None:
        bp.fail(f"{a.bundle}: no model.onnx (export with --format onnx)")
    data = checked_graph(os.path.join(a.bundle, spec["file"]), spec)
    model, _, _, tables = bp.load_bundle(a.bundle)
    labels, emb, dense, skipped, found, distinct = bp.inputs(model, tables, a.data, a.test_fraction, bp.schema_columns(model))
    scores = score(session(data), dense, emb)
    print(f"onnx_check: onnx {onnx.__version__} checker (full) passed; onnxruntime {ort.__version__} scored {len(scores)} rows ({skipped} malformed line(s) skipped; {found} of {distinct} distinct keys in the table)", file=sys.stderr)
    bp.compare(a.compare, scores, labels, a.tolerance, "onnx_check")


class Params:
    """The flat parameter vector, taken group by group in the spec's order."""

    def __init__(self, flat):
        self.flat, self.at = flat.astype(np.float64), 0

    def take(self, *shape):
        n = int(np.prod(shape))
        if self.at + n > len(self.flat):
            bp.fail(f"params.bin: {len(self.flat)} values, the spec's layout needs more")
        v = self.flat[self.at:self.at + n].reshape(shape)
        self.at += n
        return v


def mlp(p, x, widths, relu_last=False):
    """Layers (in -> out) y = x @ W + b, ReLU after every layer but the last (and after it
    too with relu_last)."""
    for i, (fan_in, fan_out) in enumerate(zip(widths, widths[1:])):
        x = x @ p.take(fan_in, fan_out) + p.take(fan_out)
        if i + 2 < len(widths) or relu_last:
            x = np.maximum(x, 0.0)
    return x


def reference_logit(s, p, dense, emb):
    """docs/models.md's logit of each row, float64."""
    n_rows, f, d, n = len(dense), s["fields"], s["dim"], s["dense"]
    hidden, m = s["hidden"], s["model"]
    if m == "mlp":
        return mlp(p, np.concatenate([emb.reshape(n_rows, -1), dense], 1), [f * d + n, *hidden, 1])[:, 0]
    if m == "dlrm":
        z0 = mlp(p, dense, [n, *s["bottom"], d], relu_last=True)
        z = np.concatenate([z0[:, None, :], emb], 1)
        dots = [np.sum(z[:, i] * z[:, j], axis=1) for i in range(f + 1) for j in range(i + int(s["interaction_self"]))]
        top = np.concatenate([z0, np.stack(dots, 1)], 1)
        return mlp(p, top, [d + len(dots), *hidden, 1])[:, 0]
    if m == "dcn":
        x0 = np.concatenate([emb.reshape(n_rows, -1), dense], 1)
        w, r, xl = x0.shape[1], s["cross_rank"], x0
        for _ in range(s["cross_layers"]):
            if r == 0:
                y = xl @ p.take(w, w) + p.take(w)
            else:
                v, u = p.take(w, r), p.take(r, w)
                y = (xl @ v) @ u + p.take(w)
            xl = x0 * y + xl
        if s["cross_structure"] == "stacked":
            return mlp(p, xl, [w, *hidden, 1])[:, 0]
        h = mlp(p, x0, [w, *hidden], relu_last=True)
        return (np.concatenate([xl, h], 1) @ p.take(w + hidden[-1], 1) + p.take(1))[:, 0]
    if m in ("deepfm", "wide-deep"):
        e, wk = emb[:, :, :d], emb[:, :, d]
        deep = mlp(p, np.concatenate([e.reshape(n_rows, -1), dense], 1), [f * d + n, *hidden, 1])[:, 0]
        logit = deep + dense @ p.take(n) + p.take(1)[0] + wk.sum(1)
        if m == "deepfm":
            logit = logit + 0.5 * np.sum(e.sum(1) ** 2 - (e**2).sum(1), axis=1)
        return logit
    bp.fail(f"spec.json: unknown model {m}")


def check_reference(case, rows, tolerance, rng):
    with open(os.path.join(case, "spec.json")) as f:
        s = json.load(f)
    flat = np.fromfile(os.path.join(case, "params.bin"), dtype="<f4")
    data = checked_graph(os.path.join(case, "model.onnx"))
    width = s["dim"] + (1 if s["model"] in ("deepfm", "wide-deep") else 0)
    # Transformed dense features are >= 0; table rows small, of either sign.
    dense = np.log1p(rng.integers(0, 1000, size=(rows, s["dense"]))).astype(np.float32)
    emb = (rng.standard_normal((rows, s["fields"], width)) * 0.3).astype(np.float32)
    p = Params(flat)
    logit = reference_logit(s, p, dense.astype(np.float64), emb.astype(np.float64))
    if p.at != len(flat):
        bp.fail(f"{case}/params.bin: {len(flat)} values, the spec's layout uses {p.at}")
    want = 1.0 / (1.0 + np.exp(-logit))
    got = score(session(data), dense, emb)
    worst = float(np.max(np.abs(got - want)))
    spread = float(np.std(want))
    print(f"onnx_check: {s['model']} {os.path.basename(case)}: checker passed; max |onnxruntime - numpy reference| = {worst:.3e} over {rows} rows ({len(flat)} parameters, score std {spread:.3f}, tolerance {tolerance:g})", file=sys.stderr)
    if not spread > 1e-3:
        print(f"onnx_check: {case}: the reference's scores hardly vary (std {spread:.2e}): a weak comparison", file=sys.stderr)
        return False
    return worst <= tolerance


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    b = sub.add_parser("bundle")
    b.add_argument("bundle")
    b.add_argument("data")
    b.add_argument("--compare", required=True, help="ringrec predict --out scores of the same rows")
    b.add_argument("--test-fraction", type=float, default=0.0)
    b.add_argument("--tolerance", type=float, default=1e-5)
    r = sub.add_parser("reference")
    r.add_argument("cases", nargs="+")
    r.add_argument("--rows", type=int, default=64)
    r.add_argument("--tolerance", type=float, default=1e-5)
    a = ap.parse_args()
    if a.mode == "bundle":
        check_bundle(a)
        return
    rng = np.random.default_rng(31)
    ok = [check_reference(c, a.rows, a.tolerance, rng) for c in a.cases]
    print(f"onnx_check: {sum(ok)} of {len(ok)} graphs agree with the numpy reference", file=sys.stderr)
    if not all(ok):
        sys.exit(1)


if __name__ == "__main__":
    main()
