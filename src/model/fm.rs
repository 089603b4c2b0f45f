//! [`Fm`]: DeepFM's (Guo et al. 2017) and Wide & Deep's (Cheng et al. 2016) dense network.
//! The input rows hold each field's `d + 1` values (embedding, first-order weight of the
//! key) then the dense features. logit = the deep MLP over `[e_1..e_F, x]` + the linear
//! part `x w_x + b` + the sum of the sample's first-order weights (+ for DeepFM the
//! factorisation machine's `0.5 * sum_k ((sum_f e_f)_k^2 - sum_f e_{f,k}^2)`), added in that
//! order. Groups: the deep layers, then the linear part (`w_x`, `b`).
//!
//! A wide-deep over fields of different dims ([`ModelSpec::field_dims`]) reads the one input
//! field's blocks (field `f`: `d_f` values, then its weight) with a copy per field: the
//! values into the deep input, the weights into one column each of `weights`, summed in
//! field order.

use super::layers::Layers;
use super::net::{grow, mlp_at, Backward};
use super::spec::{Group, ModelKind, ModelSpec};
use crate::device::{Activation, Device, DeviceResult, Epilogue, Gemm, Op};

/// The parts and buffers (see the module docs).
pub struct Fm<D: Device> {
    fields: usize,
    dim: usize,
    ndense: usize,
    /// DeepFM (with the second-order term) or Wide & Deep.
    second: bool,
    /// Per field of different dims ([`ModelSpec::field_dims`]): its block's first column in
    /// an input row, its first column in the deep input, its dim (empty: `fields` of `dim`).
    blocks: Vec<(usize, usize, usize)>,
    deep: Layers<D>,
    /// The linear group: its index and offset.
    linear: (usize, usize),
    /// The deep input `[e_1..e_F, x]`, its gradient; the first-order sums, the second-order
    /// terms, the logits and their gradient (one per sample).
    input: D::Buf<f32>,
    dinput: D::Buf<f32>,
    first: D::Buf<f32>,
    fm: D::Buf<f32>,
    z: D::Buf<f32>,
    dz: D::Buf<f32>,
    /// The fields' first-order weights (one column per block; with blocks only).
    weights: D::Buf<f32>,
}

impl<D: Device> Fm<D> {
    /// The parts of `spec` (a deepfm or wide-deep) over its parameter `groups`.
    pub fn new(dev: &D, spec: &ModelSpec, groups: &[Group]) -> DeviceResult<Fm<D>> {
        let widths = spec.deep_widths();
        let nd = widths.len() - 1;
        let buf = || dev.alloc(0);
        let (mut at, mut col) = (0, 0);
        let blocks = spec
            .field_dims
            .iter()
            .map(|&d| {
                let b = (at, col, d);
                (at, col) = (at + d + 1, col + d);
                b
            })
            .collect();
        Ok(Fm {
            blocks,
            fields: spec.fields,
            dim: spec.dim,
            ndense: spec.ndense,
            second: spec.kind == ModelKind::DeepFm,
            deep: mlp_at(dev, groups, 0, widths, false)?,
            linear: (nd, groups.get(nd).map_or(0, |g| g.offset)),
            input: buf()?,
            dinput: buf()?,
            first: buf()?,
            fm: buf()?,
            z: buf()?,
            dz: buf()?,
            weights: buf()?,
        })
    }

    /// The logits of the last forward.
    pub fn output(&self) -> &D::Buf<f32> {
        &self.z
    }
    /// The logits and their gradient's buffer.
    pub fn output_and_delta(&mut self) -> (&D::Buf<f32>, &mut D::Buf<f32>) {
        (&self.z, &mut self.dz)
    }

    /// Forward of `batch` samples.
    pub fn forward(&mut self, dev: &D, params: &D::Buf<f32>, x: &D::Buf<f32>, dense: &D::Buf<f32>, batch: usize) -> DeviceResult<()> {
        let (f, d, n) = (self.fields, self.dim, self.ndense);
        let iw = f * d + n;
        grow(dev, &mut self.input, batch * iw)?;
        grow(dev, &mut self.dinput, batch * iw)?;
        for b in [&mut self.first, &mut self.fm, &mut self.z, &mut self.dz] {
            grow(dev, b, batch)?;
        }
        if self.blocks.is_empty() {
            dev.exec(Op::StripFirstOrder { x, out: &mut self.input, rows: batch, fields: f, dim: d, ndense: n })?;
            dev.exec(Op::FirstOrderSum { x, out: &mut self.first, rows: batch, fields: f, dim: d, ndense: n })?;
        } else {
            self.split_blocks(dev, x, batch)?;
        }
        self.deep.forward(dev, params, &self.input, batch)?;
        let at = self.linear.1;
        dev.gemm(&Gemm { m: batch, n: 1, k: n, a_t: false, b_t: false }, (dense, 0), (params, at), (&mut self.z, 0), Epilogue::Bias { bias: params, at: at + n, act: Activation::Identity })?;
        dev.exec(Op::AddInto { x: self.deep.output(), out: &mut self.z, n: batch })?;
        dev.exec(Op::AddInto { x: &self.first, out: &mut self.z, n: batch })?;
        if self.second {
            dev.exec(Op::FmSecondOrder { emb: &self.input, out: &mut self.fm, rows: batch, fields: f, dim: d, stride: iw })?;
            dev.exec(Op::AddInto { x: &self.fm, out: &mut self.z, n: batch })?;
        }
        Ok(())
    }

    /// Backward of the last forward: the linear group, then the deep layers (last first);
    /// the input gradient (embeddings and first-order weights) into `dx`.
    pub fn backward(&mut self, bw: &mut Backward<'_, D>, dense: &D::Buf<f32>, dx: &mut D::Buf<f32>, batch: usize) -> DeviceResult<()> {
        let dev = bw.dev;
        let (f, d, n) = (self.fields, self.dim, self.ndense);
        let iw = f * d + n;
        let (g, _) = self.linear;
        let mut grad = bw.take(g)?;
        dev.gemm(&Gemm { m: n, n: 1, k: batch, a_t: true, b_t: false }, (dense, 0), (&self.dz, 0), (&mut grad, 0), Epilogue::BiasGrad { at: n })?;
        bw.done(g, grad)?;
        let (_, delta) = self.deep.output_and_delta();
        dev.exec(Op::CopyBlock { src: &self.dz, src_stride: 1, src_col: 0, out: delta, stride: 1, col: 0, rows: batch, cols: 1 })?;
        bw.layers(&mut self.deep, 0, &self.input, Some(&mut self.dinput), batch)?;
        if self.second {
            dev.exec(Op::FmSecondOrderGrad { emb: &self.input, dout: &self.dz, demb: &mut self.dinput, rows: batch, fields: f, dim: d, stride: iw })?;
        }
        if self.blocks.is_empty() {
            return dev.exec(Op::StripFirstOrderGrad { ddeep: &self.dinput, dsum: &self.dz, dx, rows: batch, fields: f, dim: d, ndense: n });
        }
        let (xw, iw) = (self.input_width(), f * d + n);
        for &(at, col, d) in &self.blocks {
            dev.exec(Op::CopyBlock { src: &self.dinput, src_stride: iw, src_col: col, out: dx, stride: xw, col: at, rows: batch, cols: d })?;
            dev.exec(Op::CopyBlock { src: &self.dz, src_stride: 1, src_col: 0, out: dx, stride: xw, col: at + d, rows: batch, cols: 1 })?;
        }
        if n > 0 {
            dev.exec(Op::CopyBlock { src: &self.dinput, src_stride: iw, src_col: f * d, out: dx, stride: xw, col: xw - n, rows: batch, cols: n })?;
        }
        Ok(())
    }

    /// Values of an input row with blocks: every field's `d_f + 1`, then the dense features.
    fn input_width(&self) -> usize {
        self.blocks.iter().map(|(_, _, d)| d + 1).sum::<usize>() + self.ndense
    }

    /// The forward's [`Op::StripFirstOrder`] and [`Op::FirstOrderSum`] over the blocks of
    /// fields of different dims (see the module docs).
    fn split_blocks(&mut self, dev: &D, x: &D::Buf<f32>, batch: usize) -> DeviceResult<()> {
        let (xw, iw, n, nf) = (self.input_width(), self.fields * self.dim + self.ndense, self.ndense, self.blocks.len());
        grow(dev, &mut self.weights, batch * nf)?;
        for (i, &(at, col, d)) in self.blocks.iter().enumerate() {
            dev.exec(Op::CopyBlock { src: x, src_stride: xw, src_col: at, out: &mut self.input, stride: iw, col, rows: batch, cols: d })?;
            dev.exec(Op::CopyBlock { src: x, src_stride: xw, src_col: at + d, out: &mut self.weights, stride: nf, col: i, rows: batch, cols: 1 })?;
        }
        if n > 0 {
            dev.exec(Op::CopyBlock { src: x, src_stride: xw, src_col: xw - n, out: &mut self.input, stride: iw, col: iw - n, rows: batch, cols: n })?;
        }
        // Rows of `nf` weights: `nf` fields of dim 0 (their weight only).
        dev.exec(Op::FirstOrderSum { x: &self.weights, out: &mut self.first, rows: batch, fields: nf, dim: 0, ndense: 0 })
    }
}
