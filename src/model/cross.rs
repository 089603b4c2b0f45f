//! [`Dcn`]: DCN-v2's dense network (Wang et al. 2021) — `L` cross layers over the input
//! `x_0` (width `w = F d + n`), `x_{l+1} = x_0 * y_l + x_l` with `y_l = x_l W_l + b_l`
//! (full) or `(x_l V_l) U_l + b_l` (low rank `r`), and the deep MLP: stacked on `x_L`, or
//! parallel on `x_0` with one last layer over `[x_L, h]`. Groups: the cross layers (`W_l`,
//! `b_l`, or `V_l`, `U_l`, `b_l`), the deep layers, the last layer (parallel).
//!
//! Backward of a cross layer from `g = dL/dx_{l+1}`: `dy = g * x_0`; `dx_0 += g * y_l`;
//! `dW = x_l^T dy`, `db` its column sums (low rank: `dU = t^T dy` with `t = x_l V`,
//! `dt = dy U^T`, `dV = x_l^T dt`); `dL/dx_l = g + dy W^T` (`g + dt V^T`).

use super::layers::Layers;
use super::net::{grow, mlp_at, Backward};
use super::spec::{CrossStructure, Group, ModelSpec};
use crate::device::{Activation, Device, DeviceResult, Epilogue, Gemm, Op};

/// DCN-v2's parts and buffers (see the module docs).
pub struct Dcn<D: Device> {
    /// `w`.
    width: usize,
    /// 0: full matrices.
    rank: usize,
    /// Each cross layer's offset in the flat parameters.
    offsets: Vec<usize>,
    /// `x_{l+1}` per layer, `y_l` per layer, `t_l = x_l V_l` per layer (low rank).
    xs: Vec<D::Buf<f32>>,
    ys: Vec<D::Buf<f32>>,
    ts: Vec<D::Buf<f32>>,
    /// Backward scratch: `dy`, `dt`, the running `dL/dx_l` (two, in turn), `dL/dx_0`'s
    /// direct part.
    dy: D::Buf<f32>,
    dt: D::Buf<f32>,
    g: [D::Buf<f32>; 2],
    dx0: D::Buf<f32>,
    deep: Layers<D>,
    /// Parallel: the last layer over `[x_L, h]`, its input, the input's gradient, and the
    /// deep part's input gradient.
    last: Option<Layers<D>>,
    cat: D::Buf<f32>,
    dcat: D::Buf<f32>,
    ddeep: D::Buf<f32>,
}

impl<D: Device> Dcn<D> {
    /// The parts of `spec` (a dcn) over its parameter `groups`.
    pub fn new(dev: &D, spec: &ModelSpec, groups: &[Group]) -> DeviceResult<Dcn<D>> {
        let (w, nl) = (spec.concat_width(), spec.cross_layers);
        let widths = spec.deep_widths();
        let (deep, last) = match spec.cross_structure {
            CrossStructure::Stacked => (mlp_at(dev, groups, nl, widths, false)?, None),
            CrossStructure::Parallel => {
                let h = spec.hidden.last().copied().unwrap_or(0);
                let nd = widths.len() - 1;
                (mlp_at(dev, groups, nl, widths, true)?, Some(mlp_at(dev, groups, nl + nd, vec![w + h, 1], false)?))
            }
        };
        let bufs = |n: usize| (0..n).map(|_| dev.alloc(0)).collect::<DeviceResult<Vec<_>>>();
        Ok(Dcn {
            width: w,
            rank: spec.cross_rank,
            offsets: groups[..nl].iter().map(|g| g.offset).collect(),
            xs: bufs(nl)?,
            ys: bufs(nl)?,
            ts: bufs(if spec.cross_rank > 0 { nl } else { 0 })?,
            dy: dev.alloc(0)?,
            dt: dev.alloc(0)?,
            g: [dev.alloc(0)?, dev.alloc(0)?],
            dx0: dev.alloc(0)?,
            deep,
            last,
            cat: dev.alloc(0)?,
            dcat: dev.alloc(0)?,
            ddeep: dev.alloc(0)?,
        })
    }

    /// The logits of the last forward.
    pub fn output(&self) -> &D::Buf<f32> {
        self.last.as_ref().unwrap_or(&self.deep).output()
    }
    /// The logits and their gradient's buffer.
    pub fn output_and_delta(&mut self) -> (&D::Buf<f32>, &mut D::Buf<f32>) {
        self.last.as_mut().unwrap_or(&mut self.deep).output_and_delta()
    }

    fn fit(&mut self, dev: &D, batch: usize) -> DeviceResult<()> {
        let (bw, br) = (batch * self.width, batch * self.rank);
        for b in self.xs.iter_mut().chain(&mut self.ys).chain(&mut self.g).chain([&mut self.dy, &mut self.dx0]) {
            grow(dev, b, bw)?;
        }
        for b in self.ts.iter_mut().chain([&mut self.dt]) {
            grow(dev, b, br)?;
        }
        if self.last.is_some() {
            let cw = batch * (self.width + self.deep.output_width());
            grow(dev, &mut self.cat, cw)?;
            grow(dev, &mut self.dcat, cw)?;
            grow(dev, &mut self.ddeep, bw)?;
        }
        Ok(())
    }

    /// Forward of `batch` samples of `x` (= `x_0`).
    pub fn forward(&mut self, dev: &D, params: &D::Buf<f32>, x: &D::Buf<f32>, batch: usize) -> DeviceResult<()> {
        self.fit(dev, batch)?;
        let (w, r) = (self.width, self.rank);
        for l in 0..self.offsets.len() {
            let at = self.offsets[l];
            let (done, rest) = self.xs.split_at_mut(l);
            let input = if l == 0 { x } else { &done[l - 1] };
            let y = &mut self.ys[l];
            if r == 0 {
                dev.gemm(&Gemm { m: batch, n: w, k: w, a_t: false, b_t: false }, (input, 0), (params, at), (y, 0), Epilogue::Bias { bias: params, at: at + w * w, act: Activation::Identity })?;
            } else {
                let t = &mut self.ts[l];
                dev.gemm(&Gemm { m: batch, n: r, k: w, a_t: false, b_t: false }, (input, 0), (params, at), (t, 0), Epilogue::None)?;
                dev.gemm(&Gemm { m: batch, n: w, k: r, a_t: false, b_t: false }, (t, 0), (params, at + w * r), (y, 0), Epilogue::Bias { bias: params, at: at + 2 * w * r, act: Activation::Identity })?;
            }
            let out = &mut rest[0];
            dev.exec(Op::Mul { a: x, b: y, out, n: batch * w, accumulate: false })?;
            dev.exec(Op::AddInto { x: input, out, n: batch * w })?;
        }
        let x_last = &self.xs[self.xs.len() - 1];
        match &mut self.last {
            None => self.deep.forward(dev, params, x_last, batch),
            Some(last) => {
                self.deep.forward(dev, params, x, batch)?;
                let (h, cw) = (self.deep.output_width(), w + self.deep.output_width());
                dev.exec(Op::CopyBlock { src: x_last, src_stride: w, src_col: 0, out: &mut self.cat, stride: cw, col: 0, rows: batch, cols: w })?;
                dev.exec(Op::CopyBlock { src: self.deep.output(), src_stride: h, src_col: 0, out: &mut self.cat, stride: cw, col: w, rows: batch, cols: h })?;
                last.forward(dev, params, &self.cat, batch)
            }
        }
    }

    /// Backward of the last forward: the last layer's and the deep layers' groups, then
    /// the cross layers' (last first); the input gradient into `dx`.
    pub fn backward(&mut self, bw: &mut Backward<'_, D>, x: &D::Buf<f32>, dx: &mut D::Buf<f32>, batch: usize) -> DeviceResult<()> {
        let (dev, params) = (bw.dev, bw.params);
        let (w, r, nl) = (self.width, self.rank, self.offsets.len());
        let len = batch * w;
        let [g0, g1] = &mut self.g;
        let (mut cur, mut next) = (g0, g1);
        match &mut self.last {
            None => bw.layers(&mut self.deep, nl, &self.xs[nl - 1], Some(&mut *cur), batch)?,
            Some(last) => {
                let (h, cw) = (self.deep.output_width(), w + self.deep.output_width());
                bw.layers(last, nl + self.deep.len(), &self.cat, Some(&mut self.dcat), batch)?;
                dev.exec(Op::CopyBlock { src: &self.dcat, src_stride: cw, src_col: 0, out: cur, stride: w, col: 0, rows: batch, cols: w })?;
                let (_, delta) = self.deep.output_and_delta();
                dev.exec(Op::CopyBlock { src: &self.dcat, src_stride: cw, src_col: w, out: delta, stride: h, col: 0, rows: batch, cols: h })?;
                bw.layers(&mut self.deep, nl, x, Some(&mut self.ddeep), batch)?;
            }
        }
        for l in (0..nl).rev() {
            let at = self.offsets[l];
            let input = if l == 0 { x } else { &self.xs[l - 1] };
            dev.exec(Op::Mul { a: cur, b: x, out: &mut self.dy, n: len, accumulate: false })?;
            dev.exec(Op::Mul { a: cur, b: &self.ys[l], out: &mut self.dx0, n: len, accumulate: l + 1 < nl })?;
            let mut grad = bw.take(l)?;
            let dy = &self.dy;
            if r == 0 {
                dev.gemm(&Gemm { m: w, n: w, k: batch, a_t: true, b_t: false }, (input, 0), (dy, 0), (&mut grad, 0), Epilogue::BiasGrad { at: w * w })?;
                dev.gemm(&Gemm { m: batch, n: w, k: w, a_t: false, b_t: true }, (dy, 0), (params, at), (next, 0), Epilogue::None)?;
            } else {
                dev.gemm(&Gemm { m: r, n: w, k: batch, a_t: true, b_t: false }, (&self.ts[l], 0), (dy, 0), (&mut grad, w * r), Epilogue::BiasGrad { at: 2 * w * r })?;
                dev.gemm(&Gemm { m: batch, n: r, k: w, a_t: false, b_t: true }, (dy, 0), (params, at + w * r), (&mut self.dt, 0), Epilogue::None)?;
                dev.gemm(&Gemm { m: w, n: r, k: batch, a_t: true, b_t: false }, (input, 0), (&self.dt, 0), (&mut grad, 0), Epilogue::None)?;
                dev.gemm(&Gemm { m: batch, n: w, k: r, a_t: false, b_t: true }, (&self.dt, 0), (params, at), (next, 0), Epilogue::None)?;
            }
            dev.exec(Op::AddInto { x: cur, out: next, n: len })?;
            std::mem::swap(&mut cur, &mut next);
            bw.done(l, grad)?;
        }
        dev.exec(Op::CopyBlock { src: cur, src_stride: w, src_col: 0, out: dx, stride: w, col: 0, rows: batch, cols: w })?;
        dev.exec(Op::AddInto { x: &self.dx0, out: dx, n: len })?;
        if self.last.is_some() {
            dev.exec(Op::AddInto { x: &self.ddeep, out: dx, n: len })?;
        }
        Ok(())
    }
}
