//! The models of issue 31 (docs/models.md, one definition every implementation follows) as
//! ONNX graphs over a flat dense parameter vector: one short function per model, each
//! taking its parameter groups in the spec's flat order. An initializer is named after its
//! group, `layer<g>.W`/`.b` (`.V`/`.U` of a low-rank cross layer, `.w` of the linear part),
//! as the engine names the group's tensor `dense.layer<g>`.

use std::borrow::Cow;

use super::graph::Graph;
use super::{CrossStructure, Net, OnnxError, OnnxResult, Sizes};

/// The flat parameters, handed out group by group in order. A counting cursor (no
/// parameters) hands out zeros and only counts, for [`super::param_count`].
struct Params<'a> {
    all: Option<&'a [f32]>,
    at: usize,
}

impl<'a> Params<'a> {
    fn take(&mut self, n: usize) -> OnnxResult<Cow<'a, [f32]>> {
        let at = self.at;
        self.at += n;
        match self.all {
            None => Ok(Cow::Owned(vec![0.0; n])),
            Some(all) => all.get(at..at + n).map(Cow::Borrowed).ok_or(OnnxError::Params { given: all.len(), used: None }),
        }
    }
}

/// A graph under construction with its parameter cursor and the next group's number.
pub(super) struct Build<'a> {
    pub(super) g: Graph,
    p: Params<'a>,
    group: usize,
}

impl<'a> Build<'a> {
    pub(super) fn new(params: Option<&'a [f32]>) -> Build<'a> {
        Build { g: Graph::new(), p: Params { all: params, at: 0 }, group: 0 }
    }

    /// Parameters taken so far; an error when a given vector was not used up exactly.
    pub(super) fn used(&self) -> OnnxResult<usize> {
        match self.p.all {
            Some(all) if all.len() != self.p.at => Err(OnnxError::Params { given: all.len(), used: Some(self.p.at) }),
            _ => Ok(self.p.at),
        }
    }

    /// The next group's tensor `part` of shape `dims`, named `layer<g>.<part>`.
    fn tensor(&mut self, part: &str, dims: &[usize]) -> OnnxResult<String> {
        let v = self.p.take(dims.iter().product())?;
        Ok(self.g.weight(&format!("layer{}.{part}", self.group), dims, &v))
    }

    /// One MLP layer (in -> out) on `x`: its group's W (in x out) and b, then ReLU if `relu`.
    fn layer(&mut self, x: &str, fan_in: usize, fan_out: usize, relu: bool) -> OnnxResult<String> {
        let w = self.tensor("W", &[fan_in, fan_out])?;
        let b = self.tensor("b", &[fan_out])?;
        self.group += 1;
        let y = self.g.gemm(x, &w, &b);
        Ok(if relu { self.g.relu(&y) } else { y })
    }

    /// MLP layers of `widths` on `x`: ReLU after every layer but the last (the logit), and
    /// after that one too when `relu_last` (DLRM's bottom MLP, DCN's parallel deep layers).
    fn mlp(&mut self, x: &str, widths: &[usize], relu_last: bool) -> OnnxResult<String> {
        let mut h = x.to_string();
        for (l, pair) in widths.windows(2).enumerate() {
            let last = l + 2 == widths.len();
            h = self.layer(&h, pair[0], pair[1], !last || relu_last)?;
        }
        Ok(h)
    }

    /// `[e_1..e_F, x]` flattened: batch x (F * d + n), `emb` holding d values per field.
    fn concat_input(&mut self, emb: &str, dense: &str) -> String {
        let e = self.g.flatten(emb, 1);
        self.g.concat(&[&e, dense], 1)
    }
}

/// `[first, hidden..., last]`.
fn widths(first: usize, hidden: &[usize], last: Option<usize>) -> Vec<usize> {
    std::iter::once(first).chain(hidden.iter().copied()).chain(last).collect()
}

/// The logit of `net` on the graph inputs `dense` (batch x n) and `emb` (batch x F x row).
pub(super) fn logit(b: &mut Build<'_>, net: &Net, s: Sizes, dense: &str, emb: &str) -> OnnxResult<String> {
    match net {
        Net::Mlp { hidden } => mlp(b, s, hidden, dense, emb),
        Net::Dlrm { bottom, hidden, interaction_self } => dlrm(b, s, (bottom, hidden, *interaction_self), dense, emb),
        Net::Dcn { layers, rank, structure, hidden } => dcn(b, s, (*layers, *rank, *structure), hidden, dense, emb),
        Net::DeepFm { hidden } => deepfm(b, s, hidden, true, dense, emb),
        Net::WideDeep { hidden, field_dims } if !field_dims.is_empty() => wide_deep_of_dims(b, s, hidden, field_dims, dense, emb),
        Net::WideDeep { hidden, .. } => deepfm(b, s, hidden, false, dense, emb),
    }
}

/// mlp: layers [F*d + n, hidden..., 1] on [e_1..e_F, x].
fn mlp(b: &mut Build<'_>, s: Sizes, hidden: &[usize], dense: &str, emb: &str) -> OnnxResult<String> {
    let x = b.concat_input(emb, dense);
    b.mlp(&x, &widths(s.fields * s.dim + s.dense, hidden, Some(1)), false)
}

/// The pairs of DLRM's dot interaction as indices into the flattened (F+1) x (F+1) Gram
/// matrix: for i in 0..=F, j in 0..i (0..=i with `self_dots`), i * (F + 1) + j.
pub fn dlrm_pairs(fields: usize, self_dots: bool) -> Vec<i64> {
    let n = fields + 1;
    (0..n).flat_map(|i| (0..i + usize::from(self_dots)).map(move |j| (i * n + j) as i64)).collect()
}

/// dlrm: bottom MLP [n, bottom..., d] (ReLU on all) giving z_0; the dots of [z_0, e_1..e_F]
/// in DLRM's pair order; top MLP [d + P, hidden..., 1] on [z_0, dots].
fn dlrm(b: &mut Build<'_>, s: Sizes, shape: (&[usize], &[usize], bool), dense: &str, emb: &str) -> OnnxResult<String> {
    let (bottom, hidden, self_dots) = shape;
    let z0 = b.mlp(dense, &widths(s.dense, bottom, Some(s.dim)), true)?;
    let z0_row = b.g.unsqueeze(&z0, 1);
    let z = b.g.concat(&[&z0_row, emb], 1);
    let zt = b.g.transpose(&z, &[0, 2, 1]);
    let gram = b.g.matmul(&z, &zt);
    let flat = b.g.flatten(&gram, 1);
    let pairs = dlrm_pairs(s.fields, self_dots);
    let dots = b.g.gather(&flat, 1, &pairs);
    let top = b.g.concat(&[&z0, &dots], 1);
    b.mlp(&top, &widths(s.dim + pairs.len(), hidden, Some(1)), false)
}

/// dcn (DCN-v2): L cross layers x_{l+1} = x_0 * (x_l W_l + b_l) + x_l (low-rank:
/// (x_l V_l) U_l + b_l) on x_0 = [e_1..e_F, x]; stacked: the MLP on x_L; parallel: the deep
/// layers on x_0 (ReLU on all) and one last layer on [x_L, h].
fn dcn(b: &mut Build<'_>, s: Sizes, cross: (usize, usize, CrossStructure), hidden: &[usize], dense: &str, emb: &str) -> OnnxResult<String> {
    let (layers, rank, structure) = cross;
    let w = s.fields * s.dim + s.dense;
    let x0 = b.concat_input(emb, dense);
    let mut xl = x0.clone();
    for _ in 0..layers {
        let y = if rank == 0 {
            let (wl, bl) = (b.tensor("W", &[w, w])?, b.tensor("b", &[w])?);
            b.g.gemm(&xl, &wl, &bl)
        } else {
            let (v, u, bl) = (b.tensor("V", &[w, rank])?, b.tensor("U", &[rank, w])?, b.tensor("b", &[w])?);
            let t = b.g.matmul(&xl, &v);
            b.g.gemm(&t, &u, &bl)
        };
        b.group += 1;
        let gated = b.g.mul(&x0, &y);
        xl = b.g.add(&gated, &xl);
    }
    match structure {
        CrossStructure::Stacked => b.mlp(&xl, &widths(w, hidden, Some(1)), false),
        CrossStructure::Parallel => {
            let last = *hidden.last().ok_or(OnnxError::Shape("dcn --cross-structure parallel needs at least one --hidden layer".into()))?;
            let h = b.mlp(&x0, &widths(w, hidden, None), true)?;
            let joined = b.g.concat(&[&xl, &h], 1);
            b.layer(&joined, w + last, 1, false)
        }
    }
}

/// deepfm (`fm`) and wide-deep: the deep MLP on [e_1..e_F, x] + (x w_x + b) + the keys'
/// first-order weights (value d of each row) + with `fm` 0.5 * sum over the d dims of
/// ((sum_f e_f)^2 - sum_f e_f^2).
fn deepfm(b: &mut Build<'_>, s: Sizes, hidden: &[usize], fm: bool, dense: &str, emb: &str) -> OnnxResult<String> {
    let e = b.g.slice(emb, 2, 0, s.dim);
    let wk = b.g.slice(emb, 2, s.dim, s.dim + 1);
    wide_and_deep(b, s, hidden, fm, dense, &e, &wk)
}

/// wide-deep over fields of different dims: the one input field's blocks (field f: `d_f`
/// values, then its weight) cut into the embeddings `e` and the weights, as [`deepfm`] takes
/// them.
fn wide_deep_of_dims(b: &mut Build<'_>, s: Sizes, hidden: &[usize], field_dims: &[usize], dense: &str, emb: &str) -> OnnxResult<String> {
    let (mut es, mut ws, mut at) = (Vec::new(), Vec::new(), 0);
    for d in field_dims {
        es.push(b.g.slice(emb, 2, at, at + d));
        ws.push(b.g.slice(emb, 2, at + d, at + d + 1));
        at += d + 1;
    }
    let e = b.g.concat(&es.iter().map(String::as_str).collect::<Vec<_>>(), 2);
    let wk = b.g.concat(&ws.iter().map(String::as_str).collect::<Vec<_>>(), 2);
    wide_and_deep(b, s, hidden, false, dense, &e, &wk)
}

/// [`deepfm`] from the embeddings `e` [batch, F, d] and the first-order weights `wk`.
fn wide_and_deep(b: &mut Build<'_>, s: Sizes, hidden: &[usize], fm: bool, dense: &str, e: &str, wk: &str) -> OnnxResult<String> {
    let x = b.concat_input(e, dense);
    let deep = b.mlp(&x, &widths(s.fields * s.dim + s.dense, hidden, Some(1)), false)?;
    let (wx, bias) = (b.tensor("w", &[s.dense, 1])?, b.tensor("b", &[1])?);
    b.group += 1;
    let linear = b.g.gemm(dense, &wx, &bias);
    let wk = b.g.flatten(wk, 1);
    let first = b.g.reduce_sum(&wk, &[1], true);
    let sum = b.g.add(&deep, &linear);
    let mut logit = b.g.add(&sum, &first);
    if fm {
        let se = b.g.reduce_sum(e, &[1], false);
        let square_of_sum = b.g.mul(&se, &se);
        let ee = b.g.mul(e, e);
        let sum_of_squares = b.g.reduce_sum(&ee, &[1], false);
        let diff = b.g.sub(&square_of_sum, &sum_of_squares);
        let total = b.g.reduce_sum(&diff, &[1], true);
        let half = b.g.weight("fm.half", &[1], &[0.5]);
        let second = b.g.mul(&total, &half);
        logit = b.g.add(&logit, &second);
    }
    Ok(logit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dlrm_pairs_follow_dlrms_order() {
        // F = 2: Z = [z0, e1, e2]; pairs (1,0), (2,0), (2,1) in a 3 x 3 Gram matrix.
        assert_eq!(dlrm_pairs(2, false), [3, 6, 7]);
        assert_eq!(dlrm_pairs(2, true), [0, 3, 4, 6, 7, 8]);
        assert_eq!(dlrm_pairs(26, false).len(), 27 * 26 / 2);
    }

    #[test]
    fn widths_join_input_hidden_and_output() {
        assert_eq!(widths(10, &[4, 3], Some(1)), [10, 4, 3, 1]);
        assert_eq!(widths(10, &[], None), [10]);
    }
}
