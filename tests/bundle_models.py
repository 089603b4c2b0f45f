#!/usr/bin/env python3
"""A second, independent implementation of the models' one definition, to check
scripts/bundle_predict.py on bundles of every model (tests/predict.rs writes them, with
random parameters):

    tests/bundle_models.py scripts/bundle_predict.py DATA.tsv BUNDLE...

For each bundle it takes the parameters by the tensors model.json lists (name, offset,
rows, cols; bundle_predict.py lays them out by its own reading of the groups) and computes
every sample's logit with per-sample loops written from the definition (DLRM's pairs,
DCN's cross layers, FM's second-order term as the sum over pairs of fields), then compares
with bundle_predict.py's logits (as a module) and its command line's scores (--out).
Prints one line per bundle; exits 1 on the first difference above 1e-9.
"""

import importlib.util
import json
import subprocess
import sys
import tempfile

import numpy as np


def tensors(model, flat):
    """{group name: {tensor name: float64 matrix}} by model.json's own offsets."""
    out = {}
    for g in model["model"]["groups"]:
        out[g["name"]] = {t["name"]: flat[t["offset"]:t["offset"] + t["rows"] * t["cols"]].astype(np.float64).reshape(t["rows"], t["cols"]) for t in g["tensors"]}
    return out


def layers(t, prefix):
    out, i = [], 0
    while f"{prefix} layer {i}" in t:
        out.append(t[f"{prefix} layer {i}"])
        i += 1
    return out


def mlp(v, ls, relu_all):
    for i, layer in enumerate(ls):
        v = v @ layer["W"] + layer["b"][0]
        if relu_all or i + 1 < len(ls):
            v = np.maximum(v, 0.0)
    return v


def reference(model, flat, rows, dense):
    """Logits, one sample at a time, from models-spec.md."""
    m = model["model"]
    kind, f, d = m["kind"], m["fields"], m["dim"]
    t = tensors(model, flat)
    out = []
    for s in range(len(rows)):
        e = [rows[s, k, :d].astype(np.float64) for k in range(f)]
        xd = dense[s].astype(np.float64)
        x = np.concatenate(e + [xd])
        if kind == "mlp":
            z = mlp(x, layers(t, "mlp"), False)[0]
        elif kind == "dlrm":
            z0 = mlp(xd, layers(t, "bottom"), True)
            vecs = [z0] + e
            dots = []
            for i in range(f + 1):
                for j in range(i + 1 if m["interaction_self"] else i):
                    dots.append(sum(float(a) * float(b) for a, b in zip(vecs[i], vecs[j])))
            z = mlp(np.concatenate([z0, np.array(dots)]), layers(t, "top"), False)[0]
        elif kind == "dcn":
            xl = x.copy()
            for i in range(m["cross_layers"]):
                c = t[f"cross layer {i}"]
                y = (xl @ c["W"] if m["cross_rank"] == 0 else (xl @ c["V"]) @ c["U"]) + c["b"][0]
                xl = x * y + xl
            if m["cross_structure"] == "stacked":
                z = mlp(xl, layers(t, "deep"), False)[0]
            else:
                h = mlp(x, layers(t, "deep"), True)
                z = mlp(np.concatenate([xl, h]), [t["last layer"]], False)[0]
        else:
            z = mlp(x, layers(t, "deep"), False)[0]
            z += float(xd @ t["linear"]["w_x"][:, 0]) + t["linear"]["b"][0, 0]
            z += sum(float(rows[s, k, d]) for k in range(f))
            if kind == "deepfm":
                # 0.5 ((sum e)^2 - sum e^2) summed over the dims is the sum over pairs of fields.
                z += sum(float(np.dot(e[a], e[b])) for a in range(f) for b in range(a + 1, f))
        out.append(z)
    return np.array(out)


def main():
    script, data, bundles = sys.argv[1], sys.argv[2], sys.argv[3:]
    spec = importlib.util.spec_from_file_location("bundle_predict", script)
    bp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bp)
    for bundle in bundles:
        model, mspec, flat, tables = bp.load_bundle(bundle)
        labels, rows, dense, _, _, _ = bp.inputs(model, tables, data, 0.0)
        want = reference(model, flat, rows, dense)
        got = bp.logits(mspec, flat, rows, dense)
        worst = float(np.max(np.abs(want - got) / np.maximum(1.0, np.abs(want))))
        with tempfile.NamedTemporaryFile("r", suffix=".tsv") as out:
            subprocess.run([sys.executable, script, bundle, data, "--out", out.name], check=True, capture_output=True)
            cli = np.loadtxt(out.name, dtype=np.float64, delimiter="\t", ndmin=2)
        worst_cli = float(np.max(np.abs(cli[:, 0] - 1.0 / (1.0 + np.exp(-want)))))
        spread = float(np.std(want))
        print(f"{model['model']['summary']}: {len(want)} rows, logit spread {spread:.3g}, max relative difference {worst:.3e}, command line's scores {worst_cli:.3e}")
        if not (worst <= 1e-9 and worst_cli <= 1e-9 and spread > 1e-3 and np.array_equal(cli[:, 1], labels)):
            sys.exit(f"bundle_models: {bundle}: the reader differs from the definition")


if __name__ == "__main__":
    main()
