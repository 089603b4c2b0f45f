#!/usr/bin/env python3
"""Scores a Criteo TSV (or a Parquet file) with a ringrec export bundle, with numpy only: an independent reader
of the bundle format (it shares no code with ringrec; everything it needs is in the bundle's
model.json and in the layouts documented there and in ringrec's src/train/bundle.rs,
src/frame.rs, src/model/dense_bin.rs and src/embedding/params.rs). Every model: mlp, dlrm,
dcn, deepfm and wide-deep, as the models' one definition (src/model/spec.rs) gives them.

    scripts/bundle_predict.py BUNDLE DATA.tsv [--out scores.tsv] [--test-fraction F]
                              [--compare ringrec_scores.tsv [--tolerance 1e-6]]
    scripts/bundle_predict.py BUNDLE DATA.parquet [--label-column NAME]
                              [--dense-columns A,B] [--sparse-columns C,D] ...

A Parquet file (it starts with PAR1) is read with pyarrow, which is then needed, by the rules
of model.json's `input.parquet` (single-hot columns: as `ringrec predict` reads them), with
the columns model.json's `input.schema` names (the training run's --schema or column flags,
each dense column's transform included) unless the column flags here name others. A model
with multi-hot fields (model.json's `input.multi_hot`) reads each of them from its list
column: every id's row (keyed with its field's salt, as `input.key` says), the rows summed
or averaged as the field's `pooling` says (a null or empty list: zeros, a null id left out),
after the single-hot fields' rows. A model whose fields keep tables of their own (`train
--table`, model.json's `tables`, bundle version 4) looks each field's keys up in its table
(`tables.fields`: the default table.bin or a named table.NAME.bin, each with its own dim,
dtype and initial rows) and lays the rows out as `tables.input` says.

It checks every file's size and CRC-32 against model.json (and each file's own trailer, and
the frame's header CRC of bundle version 2),
parses the TSV as ringrec does (malformed lines are skipped and counted), looks every
categorical key up in table.bin, gives a key the table lacks its deterministic initial row
(the splitmix64 rule in model.json, rounded to the table's dtype), runs the model in float64
(the table rows of deepfm and wide-deep hold one more value, the key's first-order weight)
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


KINDS = ["mlp", "dlrm", "dcn", "deepfm", "wide-deep"]
CRITEO_FIELDS, CRITEO_DENSE = 26, 13


def mlp_spec(widths):
    """The spec of an mlp of dense.bin widths [26 dim + 13, hidden..., 1] (versions 1, 2)."""
    dim, rest = divmod(widths[0] - CRITEO_DENSE, CRITEO_FIELDS)
    if rest or dim <= 0 or widths[-1] != 1:
        fail(f"dense.bin: widths {list(widths)} are not an mlp over 26 fields x dim + 13 dense features")
    return {"kind": "mlp", "fields": CRITEO_FIELDS, "dim": dim, "dense_features": CRITEO_DENSE, "hidden": list(widths[1:-1])}


def spec_of_json(model):
    """The spec model.json describes (its `model`; a bundle without one is an mlp of dense.widths)."""
    if "model" not in model:
        return mlp_spec(model["dense"]["widths"])
    m = model["model"]
    spec = {k: m[k] for k in ("kind", "fields", "dim", "dense_features", "hidden")}
    if m["kind"] == "dlrm":
        spec.update(bottom=m["bottom"], interaction_self=m["interaction_self"])
    if m["kind"] == "dcn":
        spec.update(cross_layers=m["cross_layers"], cross_rank=m["cross_rank"], cross_structure=m["cross_structure"])
    if "field_dims" in m:
        spec.update(field_dims=m["field_dims"])
    return spec


def load_dense(data):
    """(spec, flat float32 parameters) from dense.bin (RRMLP version 4, 3, 2 or 1)."""
    version, p = unframe(data, "dense.bin", b"RRMLP\0\0\0", 2)
    if version == 1:
        (layers,) = struct.unpack_from("<I", p, 12)
        widths = struct.unpack_from(f"<{layers + 1}I", p, 16)
        params = np.frombuffer(p, dtype="<f4", offset=20 + 4 * layers, count=(len(p) - 24 - 4 * layers) // 4)
        return mlp_spec(widths), params
    if version == 2:
        # u64 step, u32 layers L, L + 1 u32 widths, u32 moments K, then the parameters (and
        # K optimizer moments of as many values, which a bundle does not have).
        (layers,) = struct.unpack_from("<I", p, 8)
        widths = struct.unpack_from(f"<{layers + 1}I", p, 12)
        (moments,) = struct.unpack_from("<I", p, 16 + 4 * layers)
        params = np.frombuffer(p, dtype="<f4", offset=20 + 4 * layers, count=(len(p) - 20 - 4 * layers) // 4 // (1 + moments))
        return mlp_spec(widths), params
    if version not in (3, 4):
        fail(f"dense.bin: version {version}, this reader knows 1 to 4")
    # u64 step; u32 kind, fields, dim, dense features, H, B, interaction_self, cross layers,
    # cross rank, cross structure; H hidden and B bottom widths; version 4: u32 G and G field
    # dims (a wide-deep over fields of different dims); u32 moments K; u64 count P.
    kind, fields, dim, ndense, h, b, inter, layers, rank, structure = struct.unpack_from("<10I", p, 8)
    widths = struct.unpack_from(f"<{h + b}I", p, 48)
    at = 48 + 4 * (h + b)
    field_dims = []
    if version == 4:
        (g,) = struct.unpack_from("<I", p, at)
        field_dims = list(struct.unpack_from(f"<{g}I", p, at + 4))
        at += 4 * (g + 1)
    moments, count = struct.unpack_from("<IQ", p, at)
    at += 12
    if kind >= len(KINDS) or len(p) != at + 4 * count * (1 + moments):
        fail(f"dense.bin: model kind {kind}, {count} parameters and {moments} moments do not fill its {len(p)} payload bytes")
    spec = {"kind": KINDS[kind], "fields": fields, "dim": dim, "dense_features": ndense, "hidden": list(widths[:h])}
    if spec["kind"] == "dlrm":
        spec.update(bottom=list(widths[h:]), interaction_self=bool(inter))
    if spec["kind"] == "dcn":
        spec.update(cross_layers=layers, cross_rank=rank, cross_structure=["stacked", "parallel"][structure])
    if field_dims:
        spec.update(field_dims=field_dims)
    return spec, np.frombuffer(p, dtype="<f4", offset=at, count=count)


def row_width(spec):
    """Values per table row: dim, and the first-order weight of deepfm and wide-deep (a
    wide-deep over fields of different dims: its one input field, every field's dim + 1)."""
    return spec["dim"] + (max(len(spec.get("field_dims", [])), 1) if spec["kind"] in ("deepfm", "wide-deep") else 0)


def split_first_order(spec, rows):
    """(embeddings N x F x d, first-order weights N x F) of rows with first-order weights
    (a wide-deep over fields of different dims: F = 1 of their values side by side, and each
    field's weight)."""
    d = spec["dim"]
    if "field_dims" not in spec:
        return rows[:, :, :d], rows[:, :, d]
    es, ws, at = [], [], 0
    for fd in spec["field_dims"]:
        es.append(rows[:, :, at:at + fd])
        ws.append(rows[:, 0, at + fd])
        at += fd + 1
    return np.concatenate(es, axis=2), np.stack(ws, axis=1)


def pairs(spec):
    """DLRM's (i, j) pairs in order: i in 0..=F, j < i (j <= i with self-interaction)."""
    f = spec["fields"]
    return [(i, j) for i in range(f + 1) for j in range(i + (1 if spec["interaction_self"] else 0))]


def layout(spec):
    """The parameter groups [(name, rows, cols)] in flat order (an MLP layer in -> out is
    (in + 1) x out: W, then b as its last row)."""
    f, d, n, hidden = spec["fields"], spec["dim"], spec["dense_features"], spec["hidden"]
    w = f * d + n
    out = []

    def mlp(what, widths):
        out.extend((f"{what} layer {i}", a + 1, b) for i, (a, b) in enumerate(zip(widths, widths[1:])))

    kind = spec["kind"]
    if kind == "mlp":
        mlp("mlp", [w, *hidden, 1])
    elif kind == "dlrm":
        mlp("bottom", [n, *spec["bottom"], d])
        mlp("top", [d + len(pairs(spec)), *hidden, 1])
    elif kind == "dcn":
        r = spec["cross_rank"]
        out.extend((f"cross layer {i}", w + 1 if r == 0 else 2 * r + 1, w) for i in range(spec["cross_layers"]))
        if spec["cross_structure"] == "stacked":
            mlp("deep", [w, *hidden, 1])
        else:
            mlp("deep", [w, *hidden])
            out.append(("last layer", w + hidden[-1] + 1, 1))
    elif kind in ("deepfm", "wide-deep"):
        mlp("deep", [w, *hidden, 1])
        out.append(("linear", n + 1, 1))
    else:
        fail(f"model kind {kind}: this reader knows {', '.join(KINDS)}")
    return out


class Params:
    """The flat parameter vector, taken group by group in flat order (float64)."""

    def __init__(self, flat):
        self.flat, self.at = flat.astype(np.float64), 0

    def take(self, rows, cols):
        v = self.flat[self.at:self.at + rows * cols].reshape(rows, cols)
        self.at += rows * cols
        return v

    def layer(self, fan_in, fan_out):
        return self.take(fan_in, fan_out), self.take(1, fan_out)[0]

    def mlp(self, widths):
        return [self.layer(a, b) for a, b in zip(widths, widths[1:])]


def run_mlp(h, layers, relu_last):
    for i, (w, b) in enumerate(layers):
        h = h @ w + b
        if relu_last or i + 1 < len(layers):
            h = np.maximum(h, 0.0)
    return h


def logits(spec, flat, rows, dense):
    """The model's logits (float64) of samples with table rows `rows` (N x F x row_width,
    field order) and transformed dense features `dense` (N x n), per the models' one
    definition (model.json's model.logit)."""
    f, d, n, hidden = spec["fields"], spec["dim"], spec["dense_features"], spec["hidden"]
    w = f * d + n
    e = rows[:, :, :d].astype(np.float64)
    if spec["kind"] in ("deepfm", "wide-deep"):
        e, first = (v.astype(np.float64) for v in split_first_order(spec, rows))
    dense = dense.astype(np.float64)
    x = np.concatenate([e.reshape(len(e), f * d), dense], axis=1)
    p, kind = Params(flat), spec["kind"]
    if kind == "mlp":
        z = run_mlp(x, p.mlp([w, *hidden, 1]), False)[:, 0]
    elif kind == "dlrm":
        bottom, top = p.mlp([n, *spec["bottom"], d]), None
        z0 = run_mlp(dense, bottom, True)
        big = np.concatenate([z0[:, None, :], e], axis=1)
        gram = big @ big.transpose(0, 2, 1)
        ij = pairs(spec)
        dots = gram[:, [i for i, _ in ij], [j for _, j in ij]]
        top = p.mlp([d + len(ij), *hidden, 1])
        z = run_mlp(np.concatenate([z0, dots], axis=1), top, False)[:, 0]
    elif kind == "dcn":
        r, xl = spec["cross_rank"], x
        for _ in range(spec["cross_layers"]):
            if r == 0:
                wl, bl = p.layer(w, w)
                y = xl @ wl + bl
            else:
                v, u, bl = p.take(w, r), p.take(r, w), p.take(1, w)[0]
                y = (xl @ v) @ u + bl
            xl = x * y + xl
        if spec["cross_structure"] == "stacked":
            z = run_mlp(xl, p.mlp([w, *hidden, 1]), False)[:, 0]
        else:
            h = run_mlp(x, p.mlp([w, *hidden]), True)
            z = run_mlp(np.concatenate([xl, h], axis=1), [p.layer(w + hidden[-1], 1)], False)[:, 0]
    else:
        deep = run_mlp(x, p.mlp([w, *hidden, 1]), False)[:, 0]
        wx, b = p.take(n, 1)[:, 0], p.take(1, 1)[0, 0]
        z = deep + dense @ wx + b + first.sum(axis=1)
        if kind == "deepfm":
            z = z + 0.5 * (e.sum(axis=1) ** 2 - (e ** 2).sum(axis=1)).sum(axis=1)
    if p.at != len(flat):
        fail(f"dense.bin: {len(flat)} parameters, the {kind} model needs {p.at}")
    return z


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


def fnv1a64(data):
    """FNV-1a 64 of bytes."""
    h = 0xCBF29CE484222325
    for c in data:
        h = ((h ^ c) * 0x100000001B3) & M64
    return h


def parse_lists(path, table, fields):
    """Per multi-hot field of model.json's input.multi_hot, every row's ids (uint64) from its
    list column: a null list is empty, null ids are left out."""
    import pyarrow.types as pt

    out = []
    for f in fields:
        name = f["name"]
        if name not in table.column_names:
            fail(f"{path}: column `{name}`: no such column; the model's multi-hot field `{name}` is a list column")
        typ = table.schema.field(name).type
        if not (pt.is_list(typ) or pt.is_large_list(typ)):
            fail(f"{path}: column `{name}`: {typ}, the model's multi-hot field `{name}` is a list of integer or string ids")
        vt = typ.value_type
        text = pt.is_string(vt) or pt.is_large_string(vt) or pt.is_binary(vt) or pt.is_large_binary(vt)
        if not (pt.is_integer(vt) or text):
            fail(f"{path}: column `{name}`: {typ}, the model's multi-hot field `{name}` is a list of integer or string ids")

        def id_of(v):
            # An integer as an unsigned 64-bit number; a string's 1 to 16 hex digits the
            # number they spell, another string its FNV-1a 64; an empty one left out.
            if not text:
                return v & M64
            b = v.encode("utf-8") if isinstance(v, str) else v
            if not b:
                return None
            return int(b, 16) if HEX_RE.fullmatch(b.decode("latin-1")) else fnv1a64(b)

        rows = []
        for ids in table.column(name).to_pylist():
            rows.append(u64([x for x in (id_of(i) for i in (ids or []) if i is not None) if x is not None]))
        out.append(rows)
    return out


def pooled_rows(lists, fields, spec, dim, lookup):
    """(n, G, row_width) float32: per row and multi-hot field its ids' rows pooled as the
    field's `pooling` says (sum, or mean; an empty list: zeros), in binary32 in list order
    as ringrec pools them."""
    salt_base = int(spec["field_salt_base"], 16)
    n = len(lists[0]) if lists else 0
    out = None
    for g, (f, rows) in enumerate(zip(fields, lists)):
        with np.errstate(over="ignore"):
            salt = splitmix64(u64([salt_base + f["field"]]))[0]
            ids = np.concatenate(rows) if rows else u64([])
            keys = splitmix64(salt ^ ids)
            keys[keys == np.uint64(M64)] = np.uint64(M64 - 1)
        vals = lookup(keys)
        if out is None:
            out = np.zeros((n, len(fields), dim), dtype=np.float32)
        at = 0
        for r, ids in enumerate(rows):
            bag = vals[at:at + len(ids)]
            at += len(ids)
            if len(ids) == 0:
                continue
            acc = np.zeros(bag.shape[1], dtype=np.float32)
            for v in bag:
                acc = acc + v
            if f["pooling"] == "mean":
                acc = acc / np.float32(len(ids))
            out[r, g] = acc
    return out


def parse_parquet(path, spec, label, dense_columns, sparse_columns, transforms=None):
    """(labels, dense float32 (n, 13), values uint64 (n, 26), 0, lists), as ringrec reads a
    Parquet file (model.json's input.parquet): the label column; numbers dense (integers and
    booleans ln(1 + max(x, 0)), floats as they are, unless `transforms` maps the column to
    "log" or "none"), strings categorical (1 to 16 hex digits: the number they spell, else
    their FNV-1a 64), or exactly the named columns; nulls are empty fields; the list columns
    of the model's multi-hot fields read by parse_lists."""
    transforms = transforms or {}
    import pyarrow.parquet as pq
    import pyarrow.types as pt

    missing = int(spec["missing_value"], 16)
    nd, nc = spec["dense_features"], spec["categorical_features"]
    table = pq.read_table(path)
    n = table.num_rows
    if label not in table.column_names:
        fail(f"{path}: column `{label}`: no such column; name the label column with --label-column")
    y = table.column(label).combine_chunks()
    if y.null_count:
        fail(f"{path}: column `{label}`: the label is null")
    labels = np.asarray(y.to_numpy(zero_copy_only=False), dtype=np.float64)
    if not np.all((labels == 0) | (labels == 1)):
        fail(f"{path}: column `{label}`: a label is not 0 or 1")
    named = bool(dense_columns or sparse_columns)
    dense = np.zeros((n, nd), dtype=np.float32)
    values = np.full((n, nc), missing, dtype=np.uint64)
    di = si = 0
    fields = spec.get("multi_hot", [])
    multi = {f["name"] for f in fields}
    for name in table.column_names:
        if name == label or name in multi:
            continue
        typ = table.schema.field(name).type
        if pt.is_dictionary(typ):
            typ = typ.value_type
        text = pt.is_string(typ) or pt.is_large_string(typ) or pt.is_binary(typ) or pt.is_large_binary(typ)
        as_dense, as_sparse = (name in dense_columns, name in sparse_columns) if named else (not text, text)
        if not (as_dense or as_sparse):
            continue
        if pt.is_list(typ) or pt.is_large_list(typ):
            fail(f"{path}: column `{name}`: a list column (multi-hot), and the model's multi-hot fields are {sorted(multi) or 'none'}")
        col = table.column(name).combine_chunks()
        if pt.is_dictionary(col.type):
            col = col.cast(typ)
        null = np.asarray(col.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        if as_dense:
            if di >= nd:
                fail(f"{path}: column `{name}`: more than {nd} dense columns")
            log = transforms.get(name, "none" if pt.is_floating(typ) else "log") == "log"
            kind = np.float64 if pt.is_floating(typ) else np.int64
            x = np.asarray(col.fill_null(0).to_numpy(zero_copy_only=False), dtype=kind)
            if log:
                x = np.log1p(np.maximum(x, 0).astype(np.float64))
            x = x.astype(np.float64).astype(np.float32)
            x[null] = 0.0
            dense[:, di] = x
            di += 1
        else:
            if si >= nc:
                fail(f"{path}: column `{name}`: more than {nc} categorical columns")
            if text:
                out = []
                for v in col.to_pylist():
                    b = v.encode("utf-8") if isinstance(v, str) else v
                    if not b:
                        out.append(missing)
                    elif HEX_RE.fullmatch(b.decode("latin-1")):
                        out.append(int(b, 16))
                    else:
                        out.append(fnv1a64(b))
                v = u64(out)
            else:
                v = np.asarray(col.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64).astype(np.uint64)
                v[null] = np.uint64(missing)
            values[:, si] = v
            si += 1
    return labels.astype(np.float32), dense, values, 0, parse_lists(path, table, fields)


def load_bundle(bundle):
    """(model.json, spec, flat parameters, table keys, table rows) of a bundle, every file
    checked against model.json, dense.bin's model against model.json's."""
    with open(f"{bundle}/model.json") as f:
        model = json.load(f)
    if model.get("format") != "ringrec-bundle" or model.get("version") not in (1, 2, 3, 4):
        fail(f"{bundle}/model.json: format {model.get('format')} version {model.get('version')}, this reader knows ringrec-bundle 1 to 4")
    tab, dense_spec = model["table"], model["dense"]
    spec, flat = load_dense(read_checked(bundle, dense_spec["file"], model))
    if spec != spec_of_json(model):
        fail(f"dense.bin holds {spec}, model.json says {spec_of_json(model)}")
    if "model" in model:
        # The groups model.json lists are the ones this reader lays the parameters out by.
        at, mine = 0, []
        for name, rows, cols in layout(spec):
            mine.append((name, at, rows, cols))
            at += rows * cols
        theirs = [(g["name"], g["offset"], g["rows"], g["cols"]) for g in model["model"]["groups"]]
        if mine != theirs or model["model"]["row_width"] != row_width(spec):
            fail(f"model.json's groups {theirs} are not this reader's {mine}")
    tables = {}
    for t in [tab] + [n for n in model.get("tables", {}).get("named", [])]:
        keys, rows = load_table(read_checked(bundle, t["file"], model))
        if rows.shape[1] != t["dim"]:
            fail(f"{t['file']}: rows of {rows.shape[1]} values, model.json says {t['dim']}")
        tables[t["file"]] = (keys, rows, t)
    if "tables" in model:
        widths = [f["width"] for f in model["tables"]["fields"]]
        for f in model["tables"]["fields"]:
            if f["table"] not in tables or tables[f["table"]][2]["dim"] != f["width"]:
                fail(f"model.json: field {f['name']} reads {f['width']} values of {f['table']}, which is not one of its tables of that dim")
        same = all(w == row_width(spec) for w in widths) and spec["fields"] == len(widths)
        side_by_side = spec["fields"] == 1 and spec["kind"] in ("mlp", "dcn") and spec["dim"] == sum(widths)
        of_dims = spec.get("field_dims") == [w - 1 for w in widths]
        if not same and not side_by_side and not of_dims:
            fail(f"model.json: the fields' widths {widths} are not what the {spec['kind']} reads ({spec['fields']} fields of {row_width(spec)})")
    elif tab["dim"] != row_width(spec):
        fail(f"table.bin: rows of {tab['dim']} values, the {spec['kind']} reads {row_width(spec)}")
    return model, spec, flat, tables


def table_lookup(keys_rows_spec):
    """A function giving the rows of uint64 keys from a table (keys, rows, model.json's
    description), a key it lacks its initial row; and one counting the keys it holds."""
    tkeys, trows, tab = keys_rows_spec
    dim = tab["dim"]

    def hits(keys):
        at = np.minimum(np.searchsorted(tkeys, keys), max(len(tkeys) - 1, 0))
        return at, ((tkeys[at] == keys) if len(tkeys) else np.zeros(len(keys), dtype=bool))

    def lookup(keys):
        at, hit = hits(keys)
        out = np.empty((len(keys), dim), dtype=np.float32)
        out[hit] = trows[at[hit]]
        out[~hit] = init_rows(keys[~hit], dim, tab["init_seed"], tab["init_scale"], tab["dtype"])
        return out

    return lookup, lambda keys: int(hits(keys)[1].sum())


def inputs(model, tables, data, test_fraction, columns=("label", (), ())):
    """(labels, table rows N x F x row_width, dense N x n, skipped lines, keys found,
    distinct keys) of the rows of `data` (its last `test_fraction` with one); `columns`: a
    Parquet file's label, dense and categorical columns. A model of several tables: each
    field's rows from its table, N x F x width when every width is the same, else
    N x 1 x (their sum)."""
    spec, tab = model["input"], model["table"]
    with open(data, "rb") as f:
        parquet = f.read(4) == b"PAR1"
    labels, dense, values, skipped, lists = parse_parquet(data, spec, *columns) if parquet else (*parse_tsv(data, spec), [])
    fields = spec.get("multi_hot", [])
    if fields and not parquet:
        fail(f"{data}: a TSV has no list columns, and the model has multi-hot fields ({', '.join(f['name'] for f in fields)}): score a Parquet file")
    n = len(labels)
    cut = n - min(n, int(math.floor(n * test_fraction + 0.5))) if test_fraction > 0 else 0
    labels, dense, values = labels[cut:], dense[cut:], values[cut:]
    lists = [rows[cut:] for rows in lists]

    nc = spec["categorical_features"]
    with np.errstate(over="ignore"):
        salt_base = int(spec["field_salt_base"], 16)
        salts = splitmix64(u64([salt_base + f for f in range(nc)]))
        keys = splitmix64(salts[None, :] ^ values)
        keys[keys == np.uint64(M64)] = np.uint64(M64 - 1)
    # Per field: the file of its table (one table: table.bin for every field).
    layout = model.get("tables", {}).get("fields") or [{"table": tab["file"]} for _ in range(nc + len(fields))]
    lookups = {file: table_lookup(t) for file, t in tables.items()}
    parts, found, distinct = [], 0, 0
    for f in range(nc):
        lookup, count = lookups[layout[f]["table"]]
        uniq, inverse = np.unique(keys[:, f], return_inverse=True)
        parts.append(lookup(uniq)[inverse.reshape(-1)][:, None, :])
    for g in range(len(fields)):
        lookup, _ = lookups[layout[nc + g]["table"]]
        width = tables[layout[nc + g]["table"]][2]["dim"]
        parts.append(pooled_rows([lists[g]], [fields[g]], spec, width, lookup))
    for file in tables:
        # The keys of the fields of each table, counted once.
        own = [keys[:, f] for f in range(nc) if layout[f]["table"] == file]
        uniq = np.unique(np.concatenate(own)) if own else u64([])
        found += lookups[file][1](uniq)
        distinct += len(uniq)
    widths = {p.shape[2] for p in parts}
    if len(widths) <= 1:
        per_sample = np.concatenate(parts, axis=1) if parts else np.zeros((len(labels), 0, tab["dim"]), dtype=np.float32)
    else:
        per_sample = np.concatenate([p.reshape(len(labels), -1) for p in parts], axis=1)[:, None, :]
    return labels, per_sample, dense, skipped, found, distinct


def schema_columns(model):
    """A Parquet file's (label, dense, categorical columns, transforms) as model.json's
    input.schema names them (the training run's --schema or column flags), or by type."""
    schema = model["input"].get("schema")
    if not schema:
        return ("label", (), (), {})
    return (schema.get("label") or "label", tuple(schema["dense"]), tuple(schema["sparse"]), dict(schema.get("transforms", [])))


def open_bundle(bundle):
    """model.json of a bundle, every file checked (see load_bundle)."""
    return load_bundle(bundle)[0]


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
    ap.add_argument("--label-column", default="label", help="a Parquet file's label column")
    ap.add_argument("--dense-columns", default="", help="a Parquet file's dense columns, comma-separated")
    ap.add_argument("--sparse-columns", default="", help="a Parquet file's categorical columns, comma-separated")
    a = ap.parse_args()
    names = lambda s: tuple(x for x in s.split(",") if x)
    columns = (a.label_column, names(a.dense_columns), names(a.sparse_columns), {})

    model, spec, flat, tables = load_bundle(a.bundle)
    if not (a.dense_columns or a.sparse_columns or a.label_column != "label"):
        # The columns the model was trained with, each dense column's transform included.
        columns = schema_columns(model)
    labels, rows, dense, skipped, found, distinct = inputs(model, tables, a.data, a.test_fraction, columns)
    scores = 1.0 / (1.0 + np.exp(-logits(spec, flat, rows, dense)))

    print(f"bundle_predict: {len(scores)} rows scored with the {spec['kind']} model ({skipped} malformed line(s) skipped); {found} of {distinct} distinct keys in the table, the others from their initial rows", file=sys.stderr)
    if a.out:
        with open(a.out, "w") as f:
            for s, y in zip(scores, labels):
                f.write(f"{float(s)!r}\t{int(y)}\n")
    if a.compare:
        compare(a.compare, scores, labels, a.tolerance, "bundle_predict")

if __name__ == "__main__":
    main()
