"""The five CTR models of issue 31 in PyTorch, as their users write them: the references of
`ringrec train --model mlp|dlrm|dcn|deepfm|wide-deep` (trained by torch_ctr.py --model).

Each follows the models' one definition (issue 31's model spec, written up in docs/models.md):
F = 26 sparse fields, d = --dim, n = 13 dense features, one nn.Embedding(sparse=True) table
whose row is d values (mlp, dlrm, dcn) or d + 1 (deepfm, wide-deep: the key's first-order
weight is the row's last value), initialised U(-1/sqrt(row), 1/sqrt(row)) like
torch_ctr.py's table; Linear weights Glorot-uniform, biases 0; ReLU after every hidden layer.

- mlp: MLP [F*d + n, hidden..., 1] on [e_1..e_F, x].
- dlrm (DLRM's dlrm_s_pytorch.py, interaction_op="dot"): bottom MLP [n, bottom..., d] with
  ReLU after every layer (the last too); T = [z0, e_1..e_F] (B, F+1, d); Z = bmm(T, T^T);
  the pairs Z[:, li, lj] for i in range(F+1) for j in range(i + offset) (offset 1 with
  --interaction-self); top MLP [d + P, hidden..., 1] on [z0, pairs].
- dcn (DCN-v2; TorchRec's CrossNet / LowRankCrossNet): x_{l+1} = x_0 * (x_l @ W_l + b_l) + x_l
  (low rank: (x_l @ V_l) @ U_l); TorchRec stores W_l transposed (kernel @ x), here W_l is
  kept as the spec lays it out (in x out) and applied to row vectors. stacked: MLP
  [w, hidden..., 1] on x_L; parallel: MLP [w, hidden...] (ReLU on all) on x_0 gives h, then
  one layer [w + hidden_last, 1] on [x_L, h].
- deepfm: deep MLP [F*d + n, hidden..., 1] on [e_1..e_F, x] + linear (x @ w_x + b, zeros)
  + sum_f w_{k_f} + 0.5 * sum_dims((sum_f e_f)^2 - sum_f e_f^2).
- wide-deep: deepfm without the second-order term.

`spec_groups(net)` lays the dense parameters out as the spec's flat groups (W in x out
row-major, then b), and `expected_groups(...)` gives each group's size from the spec's
formulas; `python torch_models.py --check` checks both, the row widths, and each model's
forward against a loop-by-loop numpy evaluation of the spec (no torch code shared).

Imports nothing from ringrec (numpy and torch only).
"""
import argparse
import math
import sys

import numpy as np
import torch
import torch.nn as nn

NUM_DENSE, NUM_SPARSE = 13, 26
MODELS = ("mlp", "dlrm", "dcn", "deepfm", "wide-deep")


def row_width(model, dim):
    """Values per embedding row: d, or d + 1 with the first-order weight last."""
    return dim + 1 if model in ("deepfm", "wide-deep") else dim


def mlp(widths, relu_last):
    """Linear layers over consecutive widths, ReLU after each hidden layer (and after the
    last when relu_last). Glorot-uniform weights, zero biases, set after all layers exist
    (the order torch_ctr.py's model always used, so its seeds give the same numbers)."""
    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i < len(widths) - 2 or relu_last:
            layers.append(nn.ReLU())
    for m in layers:
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            nn.init.zeros_(m.bias)
    return nn.Sequential(*layers)


def linears(seq):
    return [m for m in seq if isinstance(m, nn.Linear)]


class CTRNet(nn.Module):
    """The table every model shares: one row per (field, value), `width` values."""

    def __init__(self, vocab_rows, width, sparse_grad):
        super().__init__()
        self.emb = nn.Embedding(vocab_rows, width, sparse=sparse_grad)
        s = 1.0 / math.sqrt(width)
        nn.init.uniform_(self.emb.weight, -s, s)

    def dense_parameters(self):
        return [p for name, p in self.named_parameters() if not name.startswith("emb.")]


class MLP(CTRNet):
    def __init__(self, vocab_rows, dim, hidden, sparse_grad):
        super().__init__(vocab_rows, dim, sparse_grad)
        self.mlp = mlp([NUM_SPARSE * dim + NUM_DENSE] + hidden + [1], relu_last=False)

    def forward(self, sparse, dense):
        e = self.emb(sparse).reshape(sparse.shape[0], -1)  # [b, 26*dim], field 0 first
        return self.mlp(torch.cat([e, dense], dim=1)).squeeze(1)

    def groups(self):
        return [[m.weight.T, m.bias] for m in linears(self.mlp)]


class DLRM(CTRNet):
    def __init__(self, vocab_rows, dim, hidden, sparse_grad, bottom=(64,), interaction_self=False):
        super().__init__(vocab_rows, dim, sparse_grad)
        self.bottom = mlp([NUM_DENSE] + list(bottom) + [dim], relu_last=True)
        ni = NUM_SPARSE + 1
        offset = 1 if interaction_self else 0
        # DLRM's reference code: the strictly lower triangle (with the diagonal when offset 1),
        # row by row.
        self.register_buffer("li", torch.tensor([i for i in range(ni) for j in range(i + offset)]),
                             persistent=False)
        self.register_buffer("lj", torch.tensor([j for i in range(ni) for j in range(i + offset)]),
                             persistent=False)
        pairs = len(self.li)
        self.top = mlp([dim + pairs] + hidden + [1], relu_last=False)

    def forward(self, sparse, dense):
        b = sparse.shape[0]
        z0 = self.bottom(dense)  # [b, d]
        t = torch.cat([z0.unsqueeze(1), self.emb(sparse)], dim=1)  # [b, F+1, d]
        z = torch.bmm(t, torch.transpose(t, 1, 2))  # [b, F+1, F+1]
        zflat = z[:, self.li, self.lj]
        return self.top(torch.cat([z0, zflat], dim=1)).squeeze(1)

    def groups(self):
        return [[m.weight.T, m.bias] for m in linears(self.bottom) + linears(self.top)]


class CrossNet(nn.Module):
    """DCN-v2's cross layers (TorchRec's CrossNet, or LowRankCrossNet when rank > 0)."""

    def __init__(self, width, layers, rank):
        super().__init__()
        self.rank = rank

        def glorot(rows, cols):
            return nn.Parameter(nn.init.xavier_uniform_(torch.empty(rows, cols)))

        if rank > 0:
            self.V = nn.ParameterList([glorot(width, rank) for _ in range(layers)])
            self.U = nn.ParameterList([glorot(rank, width) for _ in range(layers)])
        else:
            self.W = nn.ParameterList([glorot(width, width) for _ in range(layers)])
        self.b = nn.ParameterList([nn.Parameter(torch.zeros(width)) for _ in range(layers)])

    def forward(self, x0):
        x = x0
        for l in range(len(self.b)):
            y = (x @ self.V[l]) @ self.U[l] if self.rank > 0 else x @ self.W[l]
            x = x0 * (y + self.b[l]) + x
        return x

    def groups(self):
        if self.rank > 0:
            return [[self.V[l], self.U[l], self.b[l]] for l in range(len(self.b))]
        return [[self.W[l], self.b[l]] for l in range(len(self.b))]


class DCN(CTRNet):
    def __init__(self, vocab_rows, dim, hidden, sparse_grad, cross_layers=3, cross_rank=0,
                 structure="stacked"):
        super().__init__(vocab_rows, dim, sparse_grad)
        w = NUM_SPARSE * dim + NUM_DENSE
        self.structure = structure
        self.cross = CrossNet(w, cross_layers, cross_rank)
        if structure == "stacked":
            self.deep = mlp([w] + hidden + [1], relu_last=False)
        else:
            if not hidden:
                raise ValueError("dcn parallel needs at least one hidden layer")
            self.deep = mlp([w] + hidden, relu_last=True)
            self.last = mlp([w + hidden[-1], 1], relu_last=False)

    def forward(self, sparse, dense):
        x0 = torch.cat([self.emb(sparse).reshape(sparse.shape[0], -1), dense], dim=1)
        xl = self.cross(x0)
        if self.structure == "stacked":
            return self.deep(xl).squeeze(1)
        return self.last(torch.cat([xl, self.deep(x0)], dim=1)).squeeze(1)

    def groups(self):
        g = self.cross.groups() + [[m.weight.T, m.bias] for m in linears(self.deep)]
        if self.structure == "parallel":
            g += [[m.weight.T, m.bias] for m in linears(self.last)]
        return g


class DeepFM(CTRNet):
    """DeepFM (second_order=True) or Wide & Deep (False): rows of d + 1 values."""

    def __init__(self, vocab_rows, dim, hidden, sparse_grad, second_order=True):
        super().__init__(vocab_rows, dim + 1, sparse_grad)
        self.dim = dim
        self.second_order = second_order
        self.deep = mlp([NUM_SPARSE * dim + NUM_DENSE] + hidden + [1], relu_last=False)
        self.linear = nn.Linear(NUM_DENSE, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, sparse, dense):
        rows = self.emb(sparse)  # [b, F, d + 1]
        e, w = rows[:, :, :self.dim], rows[:, :, self.dim]
        deep = self.deep(torch.cat([e.reshape(e.shape[0], -1), dense], dim=1)).squeeze(1)
        logit = deep + self.linear(dense).squeeze(1) + w.sum(dim=1)
        if self.second_order:
            s = e.sum(dim=1)
            logit = logit + 0.5 * (s * s - (e * e).sum(dim=1)).sum(dim=1)
        return logit

    def groups(self):
        return [[m.weight.T, m.bias] for m in linears(self.deep)] + \
            [[self.linear.weight.reshape(-1), self.linear.bias]]


def build(model, vocab_rows, dim, hidden, sparse_grad=True, bottom=(64,), interaction_self=False,
          cross_layers=3, cross_rank=0, cross_structure="stacked"):
    """The model named `model` (one of MODELS)."""
    if model == "mlp":
        return MLP(vocab_rows, dim, hidden, sparse_grad)
    if model == "dlrm":
        return DLRM(vocab_rows, dim, hidden, sparse_grad, bottom, interaction_self)
    if model == "dcn":
        return DCN(vocab_rows, dim, hidden, sparse_grad, cross_layers, cross_rank, cross_structure)
    if model in ("deepfm", "wide-deep"):
        return DeepFM(vocab_rows, dim, hidden, sparse_grad, second_order=model == "deepfm")
    raise ValueError(f"unknown model {model!r}; expected one of {', '.join(MODELS)}")


def spec_groups(net):
    """The dense parameters as the spec's flat groups (float64 numpy, in flat order)."""
    return [np.concatenate([t.detach().double().reshape(-1).numpy() for t in g]) for g in net.groups()]


# ------------------------------------------------------------------- the spec's formulas
def mlp_sizes(widths):
    return [widths[i] * widths[i + 1] + widths[i + 1] for i in range(len(widths) - 1)]


def expected_groups(model, dim, hidden, bottom=(64,), interaction_self=False, cross_layers=3,
                    cross_rank=0, cross_structure="stacked", F=NUM_SPARSE, n=NUM_DENSE):
    """Each dense group's size, from the spec's formulas."""
    if model == "mlp":
        return mlp_sizes([F * dim + n] + hidden + [1])
    if model == "dlrm":
        pairs = (F + 1) * (F + 2) // 2 if interaction_self else (F + 1) * F // 2
        return mlp_sizes([n] + list(bottom) + [dim]) + mlp_sizes([dim + pairs] + hidden + [1])
    if model == "dcn":
        w = F * dim + n
        cross = [(2 * w * cross_rank if cross_rank else w * w) + w] * cross_layers
        if cross_structure == "stacked":
            return cross + mlp_sizes([w] + hidden + [1])
        return cross + mlp_sizes([w] + hidden) + [w + hidden[-1] + 1]
    return mlp_sizes([F * dim + n] + hidden + [1]) + [n + 1]


# ------------------------------------------- the spec evaluated loop by loop, in numpy
def _dense_layer(x, flat, at, fan_in, fan_out, relu):
    W = flat[at:at + fan_in * fan_out].reshape(fan_in, fan_out)
    b = flat[at + fan_in * fan_out:at + fan_in * fan_out + fan_out]
    y = x @ W + b
    return (np.maximum(y, 0.0) if relu else y), at + fan_in * fan_out + fan_out


def _spec_mlp(x, groups, widths, relu_last):
    for i in range(len(widths) - 1):
        x, _ = _dense_layer(x, groups[i], 0, widths[i], widths[i + 1],
                            relu=i < len(widths) - 2 or relu_last)
    return x


def spec_logit(model, cfg, groups, rows, x):
    """One sample's logit from the spec's text: rows [F, row width] (float64), x [n]."""
    F, d, hidden = len(rows), cfg["dim"], cfg["hidden"]
    e = rows[:, :d]
    n = len(x)
    if model == "mlp":
        return _spec_mlp(np.concatenate([e.reshape(-1), x]), groups, [F * d + n] + hidden + [1], False)[0]
    if model == "dlrm":
        bw = [n] + list(cfg["bottom"]) + [d]
        z0 = _spec_mlp(x, groups[:len(bw) - 1], bw, True)
        Z = [z0] + [e[f] for f in range(F)]
        dots = []
        for i in range(F + 1):
            for j in range(i + 1 if cfg["interaction_self"] else i):
                dots.append(float(np.dot(Z[i], Z[j])))
        top = groups[len(bw) - 1:]
        return _spec_mlp(np.concatenate([z0, dots]), top, [d + len(dots)] + hidden + [1], False)[0]
    if model == "dcn":
        w = F * d + n
        x0 = np.concatenate([e.reshape(-1), x])
        xl = x0.copy()
        L, R = cfg["cross_layers"], cfg["cross_rank"]
        for l in range(L):
            g = groups[l]
            if R:
                V, U, b = g[:w * R].reshape(w, R), g[w * R:2 * w * R].reshape(R, w), g[2 * w * R:]
                y = (xl @ V) @ U + b
            else:
                W, b = g[:w * w].reshape(w, w), g[w * w:]
                y = xl @ W + b
            xl = x0 * y + xl
        deep = groups[L:]
        if cfg["cross_structure"] == "stacked":
            return _spec_mlp(xl, deep, [w] + hidden + [1], False)[0]
        h = _spec_mlp(x0, deep[:len(hidden)], [w] + hidden, True)
        return _spec_mlp(np.concatenate([xl, h]), deep[len(hidden):], [w + hidden[-1], 1], False)[0]
    deep = _spec_mlp(np.concatenate([e.reshape(-1), x]), groups[:-1], [F * d + n] + hidden + [1], False)[0]
    lin = groups[-1]
    logit = deep + float(x @ lin[:n]) + lin[n] + float(rows[:, d].sum())
    if model == "deepfm":
        s = e.sum(axis=0)
        logit += 0.5 * float((s * s - (e * e).sum(axis=0)).sum())
    return logit


def check():
    """Shapes, parameter counts and forward values against the spec; prints a summary."""
    torch.manual_seed(3)
    vocab, d, hidden = 50, 4, [8, 6]
    cases = [
        ("mlp", {}), ("dlrm", {}), ("dlrm", {"interaction_self": True, "bottom": (7, 5)}),
        ("dcn", {}), ("dcn", {"cross_rank": 3}), ("dcn", {"cross_structure": "parallel", "cross_layers": 2}),
        ("dcn", {"cross_structure": "parallel", "cross_rank": 2}), ("deepfm", {}), ("wide-deep", {}),
    ]
    passed = failed = 0
    for model, kw in cases:
        cfg = {"dim": d, "hidden": hidden, "bottom": (64,), "interaction_self": False,
               "cross_layers": 3, "cross_rank": 0, "cross_structure": "stacked"}
        cfg.update(kw)
        net = build(model, vocab, d, hidden, True, cfg["bottom"], cfg["interaction_self"],
                    cfg["cross_layers"], cfg["cross_rank"], cfg["cross_structure"]).double()
        # Give the zero-initialised values (biases, the linear part) something to check.
        with torch.no_grad():
            for p in net.dense_parameters():
                p.add_(0.1 * torch.randn_like(p))
        name = f"{model} {kw}" if kw else model
        problems = []
        want = expected_groups(model, d, hidden, cfg["bottom"], cfg["interaction_self"],
                               cfg["cross_layers"], cfg["cross_rank"], cfg["cross_structure"])
        got = [len(g) for g in spec_groups(net)]
        if got != want:
            problems.append(f"group sizes {got}, spec {want}")
        total = sum(p.numel() for p in net.dense_parameters())
        if total != sum(want):
            problems.append(f"{total} dense parameters, spec {sum(want)}")
        if net.emb.weight.shape != (vocab, row_width(model, d)):
            problems.append(f"table {tuple(net.emb.weight.shape)}")
        b = 5
        sparse = torch.randint(0, vocab, (b, NUM_SPARSE))
        dense = torch.rand(b, NUM_DENSE, dtype=torch.float64)
        out = net(sparse, dense)
        if out.shape != (b,):
            problems.append(f"output shape {tuple(out.shape)}")
        groups = spec_groups(net)
        table = net.emb.weight.detach().numpy()
        for i in range(b):
            ref = spec_logit(model, cfg, groups, table[sparse[i].numpy()], dense[i].numpy())
            got_i = float(out[i].detach())
            if abs(got_i - ref) > 1e-9 * (1 + abs(ref)):
                problems.append(f"sample {i}: torch {got_i:.12g}, spec {ref:.12g}")
                break
        # A backward step gives the table a sparse gradient.
        net.zero_grad()
        out.sum().backward()
        if not net.emb.weight.grad.is_sparse:
            problems.append("the table's gradient is not sparse")
        if problems:
            failed += 1
            print(f"FAIL {name}: {'; '.join(problems)}")
        else:
            passed += 1
            print(f"ok   {name}: groups {got} ({sum(want)} dense parameters), row width "
                  f"{row_width(model, d)}")
    print(f"{passed} passed, {failed} failed")
    return failed == 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="check the models against the spec")
    a = ap.parse_args()
    if not a.check:
        ap.error("nothing to do: --check, or train with torch_ctr.py --model M")
    sys.exit(0 if check() else 1)
