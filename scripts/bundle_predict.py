#!/usr/bin/env python3
"""Scores a Criteo TSV with a ringrec export bundle, with numpy only: an independent reader
of the bundle format (it shares no code with ringrec; everything it needs is in the bundle's
model.json and in the layouts documented there and in ringrec's src/train/bundle.rs,
src/frame.rs, src/model/dense_bin.rs and src/embedding/params.rs).

    scripts/bundle_predict.py BUNDLE DATA.tsv [--out scores.tsv] [--test-fraction F]
                              [--compare ringrec_scores.tsv [--tolerance 1e-6]]

It checks every file's size and CRC-32 against model.json (and each file's own trailer, and
the frame's header CRC of bundle version 2),
parses the TSV as ringrec does (malformed lines are skipped and counted), looks every
categorical key up in table.bin, gives a key the table lacks its deterministic initial row
(the splitmix64 rule in model.json, rounded to the table's dtype), runs the MLP in float64
and writes `score<TAB>label` lines. With --compare it reads `ringrec predict --out` scores
of the same rows and fails (exit 1) when any differs by more than the tolerance.
"""

import argparse
import json
import math
import re
import struct
import sys
import zlib

import numpy as np

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
INT_RE = re.compile(r"-?[0-9]+")
HEX_RE = re.compile(r"[0-9a-fA-F]{1,16}")


def fail(msg):
    sys.exit(f"bundle_predict: {msg}")


def splitmix64(x):
    """splitmix64 of a uint64 array (wrapping arithmetic)."""
    z = x + np.uint64(GOLDEN)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def u64(values):
    return np.array([v & M64 for v in values], dtype=np.uint64)


def read_checked(bundle, name, model):
    """The bytes of a bundle file, checked against model.json and its own CRC-32 trailer."""
    entry = next((f for f in model["files"] if f["name"] == name), None)
    if entry is None:
        fail(f"{bundle}/model.json lists no checksum for {name}")
    with open(f"{bundle}/{name}", "rb") as f:
        data = f.read()
    if len(data) != entry["bytes"]:
        fail(f"{bundle}/{name}: {len(data)} bytes, model.json says {entry['bytes']}")
    crc = zlib.crc32(data[:-4])
    (trailer,) = struct.unpack("<I", data[-4:])
    if crc != entry["crc32"] or trailer != crc:
        fail(f"{bundle}/{name}: CRC-32 {crc:#010x}, trailer {trailer:#010x}, model.json {entry['crc32']:#010x}: damaged")
    return data


def unframe(data, name, magic, framed):
    """(version, payload) of a bundle file: framed (version >= framed: a 32-byte header of
    magic, u32 version, u32 header length 32, u64 payload length, the header's CRC-32 and 4
    zero bytes; the payload; the CRC-32 trailer) or an older unframed one (the whole file)."""
    if data[:8] != magic:
        fail(f"{name}: wrong magic")
    (version,) = struct.unpack_from("<I", data, 8)
    if version < framed:
        return version, data
    header_len, n, header_crc = struct.unpack_from("<IQI", data, 12)
    if header_crc != zlib.crc32(data[:24]):
        fail(f"{name}: header checksum mismatch: damaged")
    if header_len != 32 or len(data) != 32 + n + 4:
        fail(f"{name}: {len(data)} bytes, its header says {32 + n + 4}")
    return version, data[32:32 + n]


def load_dense(data):
    """[(W, b)] per layer, float64, from dense.bin (RRMLP version 2, or 1 of older bundles)."""
    version, p = unframe(data, "dense.bin", b"RRMLP\0\0\0", 2)
    if version == 1:
        (layers,) = struct.unpack_from("<I", p, 12)
        widths = struct.unpack_from(f"<{layers + 1}I", p, 16)
        params = np.frombuffer(p, dtype="<f4", offset=20 + 4 * layers, count=(len(p) - 24 - 4 * layers) // 4)
    elif version == 2:
        # u64 step, u32 layers L, L + 1 u32 widths, u32 moments K, then the parameters (and
        # K optimizer moments of as many values, which a bundle does not have).
        (layers,) = struct.unpack_from("<I", p, 8)
        widths = struct.unpack_from(f"<{layers + 1}I", p, 12)
        (moments,) = struct.unpack_from("<I", p, 16 + 4 * layers)
        params = np.frombuffer(p, dtype="<f4", offset=20 + 4 * layers, count=(len(p) - 20 - 4 * layers) // 4 // (1 + moments))
    else:
        fail(f"dense.bin: version {version}, this reader knows 1 and 2")
    out, at = [], 0
    for fan_in, fan_out in zip(widths, widths[1:]):
        w = params[at:at + fan_in * fan_out].reshape(fan_in, fan_out)
        at += fan_in * fan_out
        b = params[at:at + fan_out]
        at += fan_out
        out.append((w.astype(np.float64), b.astype(np.float64)))
    if at != len(params):
        fail(f"dense.bin: {len(params)} parameters, widths {widths} need {at}")
    return list(widths), out


def load_table(data):
    """(keys ascending, rows float32) from table.bin (RRSPARAM version 3, or 2 of older bundles)."""
    version, p = unframe(data, "table.bin", b"RRSPARAM", 3)
    if version == 2:
        dim, count = struct.unpack_from("<IQ", p, 12)
        at, end = 24, len(p) - 4
    elif version == 3:
        dim, zero, count = struct.unpack_from("<IIQ", p, 0)
        at, end = 16, len(p)
    else:
        fail(f"table.bin: version {version}, this reader knows 2 and 3")
    if end - at != count * (8 + 4 * dim):
        fail("table.bin: length does not match its header")
    rec = np.dtype([("key", "<u8"), ("row", "<f4", (dim,))])
    r = np.frombuffer(p, dtype=rec, offset=at, count=count)
    keys, rows = r["key"].astype(np.uint64), r["row"].astype(np.float32)
    if count > 1 and not np.all(keys[1:] > keys[:-1]):
        fail("table.bin: keys are not strictly ascending")
    return keys, rows


def round_dtype(x, dtype):
    """float32 values rounded to the table's storage dtype (to nearest, ties to even)."""
    if dtype == "f32":
        return x
    if dtype == "f16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bf16":
        bits = x.view(np.uint32)
        bits = (bits + (((bits >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF))) & np.uint32(0xFFFF0000)
        return bits.view(np.float32)
    fail(f"unknown table dtype {dtype}")


def init_rows(keys, dim, seed, scale, dtype):
    """The initial rows of keys the table does not hold (model.json's table.unseen_keys)."""
    base = splitmix64(u64([seed])[0] ^ splitmix64(keys))
    out = np.empty((len(keys), dim), dtype=np.float32)
    for j in range(dim):
        u = splitmix64(base + u64([(j + 1) * GOLDEN])[0]) >> np.uint64(40)
        unit = (u.astype(np.float64) * 2.0**-23 - 1.0).astype(np.float32)  # exact
        out[:, j] = np.float32(scale) * unit
    return round_dtype(out, dtype)


def parse_tsv(path, spec):
    """(labels, dense float32 (n, 13), values uint64 (n, 26), skipped lines), as ringrec parses."""
    missing = int(spec["missing_value"], 16)
    nd, nc = spec["dense_features"], spec["categorical_features"]
    labels, dense, values, skipped = [], [], [], 0
    with open(path, "rb") as f:
        raw = f.read()
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    for line in lines:
        if line.endswith(b"\r"):
            line = line[:-1]
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            skipped += 1
            continue
        fields = text.split("\t")
        if len(fields) != 1 + nd + nc or fields[0] not in ("0", "1"):
            skipped += 1
            continue
        d, ok = [], True
        for s in fields[1:1 + nd]:
            if s == "":
                d.append(0.0)
                continue
            if not INT_RE.fullmatch(s) or not -(1 << 63) <= int(s) < (1 << 63):
                ok = False
                break
            x = int(s)
            d.append(float(np.float32(math.log1p(float(x)))) if x > 0 else 0.0)
        c = []
        for s in fields[1 + nd:] if ok else []:
            if s == "":
                c.append(missing)
            elif HEX_RE.fullmatch(s):
                c.append(int(s, 16))
            else:
                ok = False
                break
        if not ok:
            skipped += 1
            continue
        labels.append(float(fields[0]))
        dense.append(d)
        values.append(c)
    return np.array(labels, dtype=np.float32), np.array(dense, dtype=np.float32).reshape(-1, nd), u64([v for row in values for v in row]).reshape(-1, nc), skipped


def embedding_rows(values, spec, tab, tkeys, trows):
    """The table rows of the rows' categorical values (n, fields) as float32 (n, fields,
    dim): each (field, value)'s key (model.json's input.key) looked up in table.bin's sorted
    keys, a key it lacks given its initial row; with how many distinct keys were found and
    how many there were."""
    dim = tab["dim"]
    with np.errstate(over="ignore"):
        salt_base = int(spec["field_salt_base"], 16)
        salts = splitmix64(u64([salt_base + f for f in range(spec["categorical_features"])]))
        keys = splitmix64(salts[None, :] ^ values)
        keys[keys == np.uint64(M64)] = np.uint64(M64 - 1)
        uniq, inverse = np.unique(keys, return_inverse=True)
        at = np.minimum(np.searchsorted(tkeys, uniq), max(len(tkeys) - 1, 0))
        found = (tkeys[at] == uniq) if len(tkeys) else np.zeros(len(uniq), dtype=bool)
        rows = np.empty((len(uniq), dim), dtype=np.float32)
        rows[found] = trows[at[found]]
        rows[~found] = init_rows(uniq[~found], dim, tab["init_seed"], tab["init_scale"], tab["dtype"])
    return rows[inverse.reshape(-1)].reshape(values.shape[0], values.shape[1], dim), int(found.sum()), len(uniq)


def open_bundle(bundle):
    """model.json of a bundle, its format and version checked."""
    with open(f"{bundle}/model.json") as f:
        model = json.load(f)
    if model.get("format") != "ringrec-bundle" or model.get("version") not in (1, 2):
        fail(f"{bundle}/model.json: format {model.get('format')} version {model.get('version')}, this reader knows ringrec-bundle 1 and 2")
    return model


def inputs(bundle, model, data, test_fraction):
    """The model's inputs of a TSV's rows (its last test_fraction of them when > 0, train's
    held-out split): labels (n), transformed dense features (n, 13) and the fields' table
    rows (n, 26, dim) from the bundle's table.bin; with the malformed lines skipped and how
    many of the distinct keys the table held."""
    spec, tab = model["input"], model["table"]
    tkeys, trows = load_table(read_checked(bundle, tab["file"], model))
    labels, dense, values, skipped = parse_tsv(data, spec)
    n = len(labels)
    cut = n - min(n, int(math.floor(n * test_fraction + 0.5))) if test_fraction > 0 else 0
    labels, dense, values = labels[cut:], dense[cut:], values[cut:]
    emb, found, distinct = embedding_rows(values, spec, tab, tkeys, trows)
    return labels, dense, emb, skipped, found, distinct


def compare(path, scores, labels, tolerance, who):
    """Compares scores with `ringrec predict --out` scores of the same rows (path); prints
    the largest difference and exits 1 when it is over the tolerance."""
    theirs = np.loadtxt(path, dtype=np.float64, delimiter="\t", ndmin=2)
    if theirs.shape[0] != len(scores):
        fail(f"{path}: {theirs.shape[0]} rows, {who} scored {len(scores)}")
    if not np.array_equal(theirs[:, 1], labels.astype(np.float64)):
        fail(f"{path}: labels differ (not the same rows)")
    worst = float(np.max(np.abs(theirs[:, 0] - scores))) if len(scores) else 0.0
    print(f"{who}: max |score - ringrec's| = {worst:.3e} over {len(scores)} rows (tolerance {tolerance:g})", file=sys.stderr)
    if not worst <= tolerance:
        sys.exit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("data")
    ap.add_argument("--out", help="write score<TAB>label lines here")
    ap.add_argument("--test-fraction", type=float, default=0.0, help="score only the last fraction of the rows (train's held-out split)")
    ap.add_argument("--compare", help="ringrec predict --out scores of the same rows")
    ap.add_argument("--tolerance", type=float, default=1e-6)
    a = ap.parse_args()

    model = open_bundle(a.bundle)
    dense_spec = model["dense"]
    widths, layers = load_dense(read_checked(a.bundle, dense_spec["file"], model))
    if widths != dense_spec["widths"] or dense_spec["hidden_activation"] != "relu":
        fail(f"dense.bin widths {widths}, model.json says {dense_spec['widths']} ({dense_spec['hidden_activation']})")
    labels, dense, emb, skipped, found, distinct = inputs(a.bundle, model, a.data, a.test_fraction)

    x = np.concatenate([emb.reshape(len(labels), -1), dense], axis=1).astype(np.float64)
    h = x
    for i, (w, b) in enumerate(layers):
        h = h @ w + b
        if i + 1 < len(layers):
            h = np.maximum(h, 0.0)
    scores = 1.0 / (1.0 + np.exp(-h[:, 0]))

    print(f"bundle_predict: {len(scores)} rows scored ({skipped} malformed line(s) skipped); {found} of {distinct} distinct keys in the table, the others from their initial rows", file=sys.stderr)
    if a.out:
        with open(a.out, "w") as f:
            for s, y in zip(scores, labels):
                f.write(f"{s!r}\t{int(y)}\n")
    if a.compare:
        compare(a.compare, scores, labels, a.tolerance, "bundle_predict")


if __name__ == "__main__":
    main()
