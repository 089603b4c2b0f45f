//! [`CpuDevice`]: the [`Device`] trait on the CPU, in Rust — the main training path on
//! machines without a GPU.
//!
//! Memory is `Vec<T>`; "uploading" a staged batch swaps the vectors. Work is split over the
//! rank's threads (the rayon pool): a GEMM `c = a b` cuts the rows of `c` into one part per
//! thread, each a single-threaded SGEMM of the `gemm` crate with its epilogue applied while
//! the part is in cache; a weight-gradient GEMM `c = a^T b` (both operands stored with the
//! batch as rows) cuts the batch instead and sums the parts' products in part order, with
//! the bias gradient (column sums of `b`) computed on the same parts. Independent parts
//! scale better on few cores than one multi-threaded SGEMM (measured: `ringrec bench
//! gemm`), and the cut is a function of the shape and the thread count only, so results
//! are deterministic. Reductions (column sums, sums) use the same parts and add them in
//! order; element-wise kernels are exact whatever the split.
//!
//! At [`GemmPrecision::Bf16`] the same cuts run [`super::bgemm`] instead of the SGEMM
//! (operands packed to bf16 once per GEMM, the packed `b` shared by the row parts); the
//! epilogues and the part-order sums are the same f32 code.
//!
//! Scoring ([`Device::set_row_tile`]): the `gemm` crate picks its kernel and its blocking of
//! the inner dimension by the shape (a one-row product is a GEMV, a small one a dot-product
//! kernel, a blocking of k by whether m and n pass 64), so a row's result would follow the
//! number of rows in its part. With a row tile every row part is exactly that many rows
//! (the last padded with zeros), so each row's result is a function of the row alone:
//! `predict`, the evaluation and `serve-model` score a row to the same bits whatever rows
//! share its batch and whatever the thread count (at f32; a bf16 device keeps its cut).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use super::bgemm;
use super::ops::{Activation, Epilogue, Gemm, GemmPrecision, HalfMut, HalfRef, Op};
use super::sgemm::sgemm;
use super::{Device, DeviceError, DeviceResult, Direction, Scalar};
use crate::partition::part;
use crate::dtype::Element;
use crate::tensor::Tensor;

/// Element-wise kernels on fewer elements run on the calling thread.
const PAR_MIN: usize = 1 << 15;

/// The CPU as a [`Device`] (see the module docs).
pub struct CpuDevice {
    threads: usize,
    precision: GemmPrecision,
    /// The partial products of a cut weight-gradient GEMM (parts 1.. of it), reused.
    scratch: Mutex<Vec<f32>>,
    /// Rows per GEMM row part in scoring mode; 0: the default cut.
    row_tile: AtomicUsize,
}

impl CpuDevice {
    /// A device splitting its work into `threads` parts (on the rayon pool).
    pub fn new(threads: usize) -> CpuDevice {
        CpuDevice { threads: threads.max(1), precision: GemmPrecision::F32, scratch: Mutex::new(Vec::new()), row_tile: AtomicUsize::new(0) }
    }

    /// Threads the work is split over.
    pub fn threads(&self) -> usize {
        self.threads
    }

    fn parts(&self, n: usize) -> usize {
        self.threads.min(n).max(1)
    }

    /// `c = op(a) op(b)` at the device's precision, the rows of `c` cut into `threads` parts
    /// for bf16, one SGEMM of `threads` threads for f32 (shapes the models do not use).
    #[allow(clippy::too_many_arguments)]
    fn product(&self, m: usize, n: usize, k: usize, a: &[f32], a_t: bool, b: &[f32], b_t: bool, c: &mut [f32], threads: usize) {
        match self.precision {
            GemmPrecision::F32 => sgemm(m, n, k, a, a_t, b, b_t, c, false, threads),
            GemmPrecision::Bf16 => bgemm::gemm(m, n, k, a, a_t, b, b_t, c, threads, |_, _| {}),
        }
    }

    /// `c = a b` with the rows of `c` (and `a`) cut into parts (tiles in scoring mode).
    fn gemm_rows(&self, g: &Gemm, a: &[f32], b: &[f32], c: &mut [f32], epi: &Epilogue<'_, Self>) {
        let (m, n, k) = (g.m, g.n, g.k);
        let epilogue = |r: std::ops::Range<usize>, c: &mut [f32]| match epi {
            Epilogue::Bias { bias, at, act } => bias_act(c, &bias[*at..*at + n], *act),
            Epilogue::ReluGrad { act } => relu_grad(c, &act[r.start * n..r.end * n]),
            Epilogue::None | Epilogue::BiasGrad { .. } => {}
        };
        let tile = self.row_tile.load(Ordering::Relaxed);
        if tile > 0 && self.precision == GemmPrecision::F32 {
            let run = |(i, c): (usize, &mut [f32])| {
                let r = i * tile..(i * tile + c.len() / n);
                if r.len() == tile {
                    sgemm(tile, n, k, &a[r.start * k..], false, b, g.b_t, c, false, 1);
                } else {
                    // The last tile, padded with zero rows to the tile's height.
                    let mut padded = vec![0f32; tile * k];
                    padded[..r.len() * k].copy_from_slice(&a[r.start * k..r.end * k]);
                    let mut out = vec![0f32; tile * n];
                    sgemm(tile, n, k, &padded, false, b, g.b_t, &mut out, false, 1);
                    c.copy_from_slice(&out[..r.len() * n]);
                }
                epilogue(r, c);
            };
            let c = &mut c[..m * n];
            if m <= tile || self.threads == 1 {
                c.chunks_mut(tile * n).enumerate().for_each(run);
            } else {
                c.par_chunks_mut(tile * n).enumerate().for_each(run);
            }
            return;
        }
        let parts = self.parts(m);
        if self.precision == GemmPrecision::Bf16 {
            bgemm::gemm(m, n, k, a, false, b, g.b_t, c, parts, epilogue);
            return;
        }
        let run = |(i, c): (usize, &mut [f32])| {
            let r = part(m, parts, i);
            sgemm(r.len(), n, k, &a[r.start * k..], false, b, g.b_t, c, false, 1);
            epilogue(r, c);
        };
        let chunks = split_rows(c, m, n, parts);
        if parts == 1 {
            chunks.into_iter().enumerate().for_each(run);
        } else {
            chunks.into_par_iter().enumerate().for_each(run);
        }
    }

    /// `c = a^T b` (`a` stored k x m, `b` stored k x n) with the k rows cut into parts, the
    /// parts' products (and column sums of `b` into `bias_grad`) summed in part order.
    fn gemm_split_k(&self, g: &Gemm, a: &[f32], b: &[f32], c: &mut [f32], mut bias_grad: Option<&mut [f32]>) {
        let (m, n, k) = (g.m, g.n, g.k);
        let parts = self.parts(k);
        let with_bias = bias_grad.is_some();
        let per = m * n + if with_bias { n } else { 0 };
        let mut scratch = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        if scratch.len() < (parts - 1) * per {
            scratch.resize((parts - 1) * per, 0.0);
        }
        let product = |i: usize, c: &mut [f32], db: Option<&mut [f32]>| {
            let r = part(k, parts, i);
            self.product(m, n, r.len(), &a[r.start * m..r.end * m], true, &b[r.start * n..r.end * n], false, c, 1);
            if let Some(db) = db {
                column_sum(&b[r.start * n..r.end * n], n, db);
            }
        };
        {
            let mut outs: Vec<(&mut [f32], Option<&mut [f32]>)> = vec![(&mut *c, bias_grad.as_deref_mut())];
            for s in scratch[..(parts - 1) * per].chunks_mut(per) {
                let (p, db) = s.split_at_mut(m * n);
                outs.push((p, with_bias.then_some(db)));
            }
            if parts == 1 {
                outs.into_iter().enumerate().for_each(|(i, (c, db))| product(i, c, db));
            } else {
                outs.into_par_iter().enumerate().for_each(|(i, (c, db))| product(i, c, db));
            }
        }
        for s in scratch[..(parts - 1) * per].chunks(per) {
            add_into(c, &s[..m * n]);
            if let Some(db) = bias_grad.as_deref_mut() {
                add_into(db, &s[m * n..]);
            }
        }
    }

    /// Runs `f` on consecutive chunks of `v` (of `unit` elements each unit) on the pool
    /// when there is enough work.
    pub(super) fn for_chunks<T: Send>(&self, v: &mut [T], unit: usize, f: impl Fn(usize, &mut [T]) + Sync + Send) {
        let units = v.len() / unit.max(1);
        if v.len() < PAR_MIN || self.threads == 1 || units < 2 {
            f(0, v);
            return;
        }
        let per = units.div_ceil(self.threads * 4).max(1) * unit;
        v.par_chunks_mut(per).enumerate().for_each(|(i, c)| f(i * per / unit.max(1), c));
    }

    /// Runs `f` on each of `rows` (disjoint pieces of one buffer, `n` values in all) with its
    /// index, on the pool when there is enough work.
    pub(super) fn for_rows<T: Send>(&self, rows: Vec<&mut [T]>, n: usize, f: impl Fn(usize, &mut [T]) + Sync + Send) {
        if n < PAR_MIN || self.threads == 1 || rows.len() < 2 {
            rows.into_iter().enumerate().for_each(|(i, r)| f(i, r));
        } else {
            rows.into_par_iter().enumerate().for_each(|(i, r)| f(i, r));
        }
    }
}

/// `v` (rows x cols) cut into `parts` consecutive row blocks.
fn split_rows(v: &mut [f32], rows: usize, cols: usize, parts: usize) -> Vec<&mut [f32]> {
    let mut out = Vec::with_capacity(parts);
    let mut rest = &mut v[..rows * cols];
    for i in 0..parts {
        let (a, b) = rest.split_at_mut(part(rows, parts, i).len() * cols);
        out.push(a);
        rest = b;
    }
    out
}

/// Two disjoint ranges of `v`, mutably (checked disjoint by `Epilogue::check`).
fn disjoint<T>(v: &mut [T], a: std::ops::Range<usize>, b: std::ops::Range<usize>) -> (&mut [T], &mut [T]) {
    if a.start <= b.start {
        let (lo, hi) = v.split_at_mut(b.start);
        (&mut lo[a], &mut hi[..b.len()])
    } else {
        let (lo, hi) = v.split_at_mut(a.start);
        (&mut hi[..a.len()], &mut lo[b])
    }
}

pub(super) fn add_into(acc: &mut [f32], x: &[f32]) {
    for (a, b) in acc.iter_mut().zip(x) {
        *a += b;
    }
}

/// `out = column sums of x` (rows of `cols` values, in row order, from zero).
fn column_sum(x: &[f32], cols: usize, out: &mut [f32]) {
    out.fill(0.0);
    for row in x.chunks_exact(cols) {
        add_into(out, row);
    }
}

fn bias_act(z: &mut [f32], bias: &[f32], act: Activation) {
    for row in z.chunks_exact_mut(bias.len().max(1)) {
        match act {
            Activation::Relu => {
                for (v, b) in row.iter_mut().zip(bias) {
                    *v = (*v + b).max(0.0);
                }
            }
            Activation::Identity => add_into(row, bias),
        }
    }
}

fn relu_grad(delta: &mut [f32], act: &[f32]) {
    for (d, a) in delta.iter_mut().zip(act) {
        if *a <= 0.0 {
            *d = 0.0;
        }
    }
}

/// Numerically stable binary cross-entropy of a logit `z` against a 0/1 label `y`.
pub fn bce_with_logits(z: f32, y: f32) -> f32 {
    z.max(0.0) - z * y + (-z.abs()).exp().ln_1p()
}

/// Logistic function.
pub fn sigmoid(z: f32) -> f32 {
    1.0 / (1.0 + (-z).exp())
}

impl Device for CpuDevice {
    type Buf<T: Scalar> = Vec<T>;
    type Staging<T: Scalar> = Vec<T>;
    type Mark = std::time::Instant;

    super::vec_memory!();

    fn mark(&self) -> DeviceResult<std::time::Instant> {
        Ok(std::time::Instant::now())
    }
    fn seconds_between(&self, from: &std::time::Instant, to: &std::time::Instant) -> DeviceResult<f64> {
        Ok(to.saturating_duration_since(*from).as_secs_f64())
    }

    fn describe(&self) -> String {
        "cpu".into()
    }
    fn kind(&self) -> &'static str {
        "cpu"
    }
    fn fork(&self) -> DeviceResult<CpuDevice> {
        Ok(CpuDevice { precision: self.precision, ..CpuDevice::new(self.threads) })
    }
    fn gemm_precision(&self) -> GemmPrecision {
        self.precision
    }
    fn set_gemm_precision(&mut self, p: GemmPrecision) -> DeviceResult<()> {
        if p == GemmPrecision::Bf16 && !bgemm::available() {
            return Err(DeviceError::Precision { precision: p, needs: "AVX-512 BF16 (avx512_bf16)".into(), device: "this CPU".into() });
        }
        self.precision = p;
        Ok(())
    }
    fn set_row_tile(&self, rows: Option<usize>) {
        self.row_tile.store(rows.unwrap_or(0), Ordering::Relaxed);
    }
    fn upload_unchecked<T: Scalar>(&self, src: &mut Vec<T>, _n: usize, dst: &mut Vec<T>) -> DeviceResult<()> {
        std::mem::swap(src, dst);
        Ok(())
    }
    fn download_unchecked<T: Scalar>(&self, src: &mut Vec<T>, _n: usize, dst: &mut Vec<T>) -> DeviceResult<()> {
        std::mem::swap(src, dst);
        Ok(())
    }

    fn gemm_unchecked(&self, g: &Gemm, a: (&Vec<f32>, usize), b: (&Vec<f32>, usize), c: (&mut Vec<f32>, usize), epi: Epilogue<'_, Self>) -> DeviceResult<()> {
        let (m, n, k) = (g.m, g.n, g.k);
        let (a, b) = (&a.0[a.1..a.1 + m * k], &b.0[b.1..b.1 + k * n]);
        if let Epilogue::BiasGrad { at } = epi {
            let (c, db) = disjoint(c.0, c.1..c.1 + m * n, at..at + n);
            if g.a_t && !g.b_t {
                self.gemm_split_k(g, a, b, c, Some(db));
            } else {
                self.product(m, n, k, a, g.a_t, b, g.b_t, c, self.threads);
                column_sum(b, n, db);
            }
            return Ok(());
        }
        let c = &mut c.0[c.1..c.1 + m * n];
        if !g.a_t {
            self.gemm_rows(g, a, b, c, &epi);
            return Ok(());
        }
        if g.b_t {
            self.product(m, n, k, a, true, b, true, c, self.threads);
        } else {
            self.gemm_split_k(g, a, b, c, None);
        }
        match epi {
            Epilogue::Bias { bias, at, act } => bias_act(c, &bias[at..at + n], act),
            Epilogue::ReluGrad { act } => relu_grad(c, &act[..m * n]),
            Epilogue::None | Epilogue::BiasGrad { .. } => {}
        }
        Ok(())
    }

    fn exec_unchecked(&self, op: Op<'_, Self>) -> DeviceResult<()> {
        match op {
            Op::BiasAct { z, bias, at, rows, cols, act } => {
                let bias = &bias[at..at + cols];
                self.for_chunks(&mut z[..rows * cols], cols, |_, c| bias_act(c, bias, act));
            }
            Op::ReluGrad { delta, act, n } => self.for_chunks(&mut delta[..n], 1, |i, d| relu_grad(d, &act[i..i + d.len()])),
            Op::ColumnSum { x, rows, cols, out, at } => {
                let parts = self.parts(rows);
                let out = &mut out[at..at + cols];
                let partial = |i: usize| {
                    let mut s = vec![0f32; cols];
                    column_sum(&x[part(rows, parts, i).start * cols..part(rows, parts, i).end * cols], cols, &mut s);
                    s
                };
                let sums: Vec<Vec<f32>> = if parts == 1 { vec![partial(0)] } else { (0..parts).into_par_iter().map(partial).collect() };
                out.copy_from_slice(&sums[0]);
                for s in &sums[1..] {
                    add_into(out, s);
                }
            }
            Op::BceWithLogits { z, y, loss, delta, n, scale } => {
                let (loss, delta) = (&mut loss[..n], &mut delta[..n]);
                for i in 0..n {
                    loss[i] = bce_with_logits(z[i], y[i]);
                    delta[i] = (sigmoid(z[i]) - y[i]) * scale;
                }
            }
            Op::WeightedBce { z, y, w, loss, delta, n, scale } => {
                let (loss, delta) = (&mut loss[..n], &mut delta[..n]);
                for i in 0..n {
                    loss[i] = w[i] * bce_with_logits(z[i], y[i]);
                    delta[i] = w[i] * (sigmoid(z[i]) - y[i]) * scale;
                }
            }
            Op::Sum { x, n, out, at } => {
                let parts = self.parts(n);
                let partial = |i: usize| x[part(n, parts, i)].iter().fold(0f64, |s, v| s + *v as f64);
                let sums: Vec<f64> = if parts == 1 { vec![partial(0)] } else { (0..parts).into_par_iter().map(partial).collect() };
                out[at] = sums.iter().sum::<f64>() as f32;
            }
            Op::GatherRows { table, index, out, rows, per_row, dim, stride } => self.for_chunks(&mut out[..rows * stride], stride, |r0, chunk| {
                for (j, row) in chunk.chunks_exact_mut(stride).enumerate() {
                    let r = r0 + j;
                    for (f, u) in index[r * per_row..(r + 1) * per_row].iter().enumerate() {
                        let u = *u as usize;
                        row[f * dim..(f + 1) * dim].copy_from_slice(&table[u * dim..(u + 1) * dim]);
                    }
                }
            }),
            Op::CopyColumns { src, out, rows, cols, stride, col } => self.for_chunks(&mut out[..rows * stride], stride, |r0, chunk| {
                for (j, row) in chunk.chunks_exact_mut(stride).enumerate() {
                    row[col..col + cols].copy_from_slice(&src[(r0 + j) * cols..(r0 + j + 1) * cols]);
                }
            }),
            Op::SegmentSum { src, offsets, slots, out, segments, per_row, dim, stride, .. } => self.for_chunks(&mut out[..segments * dim], dim, |u0, chunk| {
                for (j, acc) in chunk.chunks_exact_mut(dim).enumerate() {
                    let u = u0 + j;
                    acc.fill(0.0);
                    for p in &slots[offsets[u] as usize..offsets[u + 1] as usize] {
                        let p = *p as usize;
                        let at = (p / per_row) * stride + (p % per_row) * dim;
                        add_into(acc, &src[at..at + dim]);
                    }
                }
            }),
            Op::Sgd { p, at, g, lr, n } => {
                for (p, g) in p[at..at + n].iter_mut().zip(&g[..n]) {
                    *p -= lr * g;
                }
            }
            Op::Adam { p, at, g, m, v, alpha, beta1, beta2, eps_hat, n } => {
                let moments = m[at..at + n].iter_mut().zip(&mut v[at..at + n]);
                for ((p, g), (m, v)) in p[at..at + n].iter_mut().zip(&g[..n]).zip(moments) {
                    *m = beta1 * *m + (1.0 - beta1) * g;
                    *v = beta2 * *v + (1.0 - beta2) * g * g;
                    *p -= alpha * *m / (v.sqrt() + eps_hat);
                }
            }
            Op::ToHalf { src, src_at, dst, dst_at, n } => {
                let src = &src[src_at..src_at + n];
                match dst {
                    HalfMut::F16(d) => d[dst_at..dst_at + n].convert_from_f32_slice(src),
                    HalfMut::Bf16(d) => d[dst_at..dst_at + n].convert_from_f32_slice(src),
                }
            }
            Op::FromHalf { src, src_at, dst, dst_at, n } => {
                let dst = &mut dst[dst_at..dst_at + n];
                match src {
                    HalfRef::F16(s) => s[src_at..src_at + n].convert_to_f32_slice(dst),
                    HalfRef::Bf16(s) => s[src_at..src_at + n].convert_to_f32_slice(dst),
                }
            }
            Op::OneBitEncode { x, residual, n, l1, lambda, block, enc, at, .. } => onebit_encode(&x[..n], &mut residual[..n], l1, lambda, block, &mut enc[at..at + super::ops::onebit_words(n, block)]),
            Op::OneBitDecodeSum { gathered, stride, at, ranks, x, n, block, average } => onebit_decode_sum(&gathered[..ranks * stride], stride, at, ranks, &mut x[..n], block, average),
            Op::BuildCsr { inverse, n, keys, offsets, slots, scratch } => super::csr::build_csr(&inverse[..n], keys, offsets, &mut slots[..n], scratch.next()).map_err(|e| DeviceError::refused("build_csr", e))?,
            op => return self.exec_cache(op),
        }
        Ok(())
    }

    fn lend<T: Scalar + Element>(&self, b: Vec<T>) -> Tensor {
        Tensor::from_vec(b)
    }
    fn take_back<T: Scalar + Element>(&self, t: Tensor) -> DeviceResult<Vec<T>> {
        let dtype = t.dtype();
        t.into_vec::<T>().map_err(|_| DeviceError::refused("taking a tensor back", format!("a {dtype} tensor is not host memory of {}", T::DTYPE)))
    }
}

/// [`Op::OneBitEncode`] as kernels/compress.cu computes it (the same parts, the same order).
fn onebit_encode(x: &[f32], residual: &mut [f32], l1: bool, lambda: f32, block: usize, enc: &mut [u32]) {
    let n = x.len();
    let (parts, scales) = (super::ops::onebit_parts(n, block), super::ops::onebit_scales(n, block));
    let mut sums = vec![0f64; parts];
    for (p, sum) in sums.iter_mut().enumerate() {
        let idx: Box<dyn Iterator<Item = usize>> = if block > 0 { Box::new(p * block..((p + 1) * block).min(n)) } else { Box::new((p..n).step_by(parts)) };
        for i in idx {
            let v = residual[i] + x[i];
            residual[i] = v;
            *sum += if l1 { v.abs() as f64 } else { v as f64 * v as f64 };
        }
    }
    let scale = |sum: f64, d: usize| match (d, l1) {
        (0, _) => 0.0,
        (_, true) => (sum / d as f64) as f32,
        (_, false) => lambda * (sum / d as f64).sqrt() as f32,
    };
    if block > 0 {
        for (t, e) in enc[..scales].iter_mut().enumerate() {
            *e = scale(sums[t], n.saturating_sub(t * block).min(block)).to_bits();
        }
    } else {
        enc[0] = scale(sums.iter().sum::<f64>(), n).to_bits();
    }
    let (s, words) = enc.split_at_mut(scales);
    for (w, word) in words.iter_mut().enumerate() {
        let mut bits = 0u32;
        for (b, v) in residual[32 * w..(32 * w + 32).min(n)].iter_mut().enumerate() {
            let sc = f32::from_bits(s[(32 * w + b).checked_div(block).unwrap_or(0)]);
            if *v >= 0.0 {
                bits |= 1 << b;
                *v -= sc;
            } else {
                *v += sc;
            }
        }
        *word = bits;
    }
}

/// [`Op::OneBitDecodeSum`] as kernels/compress.cu computes it.
fn onebit_decode_sum(gathered: &[u32], stride: usize, at: usize, ranks: usize, x: &mut [f32], block: usize, average: bool) {
    let scales = super::ops::onebit_scales(x.len(), block);
    x.fill(0.0);
    for r in 0..ranks {
        let e = &gathered[r * stride + at..];
        for (i, v) in x.iter_mut().enumerate() {
            let s = f32::from_bits(e[i.checked_div(block).unwrap_or(0)]);
            if (e[scales + i / 32] >> (i % 32)) & 1 == 1 {
                *v += s;
            } else {
                *v -= s;
            }
        }
    }
    if average {
        for v in x.iter_mut() {
            *v /= ranks as f32;
        }
    }
}
