//! [`Dlrm`]: DLRM's dense network (Naumov et al. 2019, `interaction_op=dot`) — the bottom
//! MLP over the dense features (ReLU after every layer, its last width `d`) giving `z_0`,
//! the dot products of every pair of `[z_0, e_1..e_F]` ([`Op::Interaction`]), and the top
//! MLP over `[z_0, dots]` to the logit. Groups: the bottom layers, then the top layers.

use super::layers::Layers;
use super::net::{grow, mlp_at, Backward};
use super::spec::{Group, ModelSpec};
use crate::device::{Device, DeviceResult, Op};

/// DLRM's parts and buffers (see the module docs).
pub struct Dlrm<D: Device> {
    bottom: Layers<D>,
    top: Layers<D>,
    fields: usize,
    dim: usize,
    /// Input row width (`F d + n`).
    width: usize,
    with_self: bool,
    /// `[z_0, e_1..e_F]` per sample, and its gradient.
    z: D::Buf<f32>,
    dz: D::Buf<f32>,
    /// The top MLP's input `[z_0, dots]`, and its gradient.
    inter: D::Buf<f32>,
    dinter: D::Buf<f32>,
}

impl<D: Device> Dlrm<D> {
    /// The parts of `spec` (a dlrm) over its parameter `groups`.
    pub fn new(dev: &D, spec: &ModelSpec, groups: &[Group]) -> DeviceResult<Dlrm<D>> {
        let (b, t) = (spec.bottom_widths(), spec.deep_widths());
        let nb = b.len() - 1;
        Ok(Dlrm {
            bottom: mlp_at(dev, groups, 0, b, true)?,
            top: mlp_at(dev, groups, nb, t, false)?,
            fields: spec.fields,
            dim: spec.dim,
            width: spec.concat_width(),
            with_self: spec.interaction_self,
            z: dev.alloc(0)?,
            dz: dev.alloc(0)?,
            inter: dev.alloc(0)?,
            dinter: dev.alloc(0)?,
        })
    }

    /// The logits of the last forward.
    pub fn output(&self) -> &D::Buf<f32> {
        self.top.output()
    }
    /// The logits and their gradient's buffer.
    pub fn output_and_delta(&mut self) -> (&D::Buf<f32>, &mut D::Buf<f32>) {
        self.top.output_and_delta()
    }

    fn vectors(&self) -> usize {
        self.fields + 1
    }

    /// Forward of `batch` samples.
    pub fn forward(&mut self, dev: &D, params: &D::Buf<f32>, x: &D::Buf<f32>, dense: &D::Buf<f32>, batch: usize) -> DeviceResult<()> {
        let (v, d) = (self.vectors(), self.dim);
        let zw = v * d;
        let iw = self.top.widths()[0];
        grow(dev, &mut self.z, batch * zw)?;
        grow(dev, &mut self.dz, batch * zw)?;
        grow(dev, &mut self.inter, batch * iw)?;
        grow(dev, &mut self.dinter, batch * iw)?;
        self.bottom.forward(dev, params, dense, batch)?;
        dev.exec(Op::CopyBlock { src: self.bottom.output(), src_stride: d, src_col: 0, out: &mut self.z, stride: zw, col: 0, rows: batch, cols: d })?;
        dev.exec(Op::CopyBlock { src: x, src_stride: self.width, src_col: 0, out: &mut self.z, stride: zw, col: d, rows: batch, cols: self.fields * d })?;
        dev.exec(Op::Interaction { z: &self.z, out: &mut self.inter, rows: batch, vectors: v, dim: d, with_self: self.with_self })?;
        self.top.forward(dev, params, &self.inter, batch)
    }

    /// Backward of the last forward: the top layers' groups, then the bottom's; the
    /// embeddings' gradient into `dx`'s embedding columns.
    pub fn backward(&mut self, bw: &mut Backward<'_, D>, dense: &D::Buf<f32>, dx: &mut D::Buf<f32>, batch: usize) -> DeviceResult<()> {
        let (dev, v, d) = (bw.dev, self.vectors(), self.dim);
        let zw = v * d;
        bw.layers(&mut self.top, self.bottom.len(), &self.inter, Some(&mut self.dinter), batch)?;
        dev.exec(Op::InteractionGrad { z: &self.z, dout: &self.dinter, dz: &mut self.dz, rows: batch, vectors: v, dim: d, with_self: self.with_self })?;
        dev.exec(Op::CopyBlock { src: &self.dz, src_stride: zw, src_col: d, out: dx, stride: self.width, col: 0, rows: batch, cols: self.fields * d })?;
        let (_, delta) = self.bottom.output_and_delta();
        dev.exec(Op::CopyBlock { src: &self.dz, src_stride: zw, src_col: 0, out: delta, stride: d, col: 0, rows: batch, cols: d })?;
        bw.layers(&mut self.bottom, 0, dense, None, batch)
    }
}
