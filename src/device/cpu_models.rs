//! The CPU implementations of the models' kernels ([`Op::Interaction`] and the ones after it
//! in [`Op`]), one row (or element) at a time, in the order kernels/models.cu sums them, so
//! the CPU, `--device host` and CUDA agree; `CpuDevice::exec_model` splits the rows over
//! the device's threads.
//!
//! [`Op`]: super::ops::Op
//! [`Op::Interaction`]: super::ops::Op::Interaction

use super::cpu::{add_into, CpuDevice};
use super::ops::{interaction_pairs, Op};
use super::{DeviceError, DeviceResult};

impl CpuDevice {
    /// Runs one of the models' kernels; any other is refused.
    pub(super) fn exec_model(&self, op: Op<'_, Self>) -> DeviceResult<()> {
        match op {
            Op::CopyBlock { src, src_stride, src_col, out, stride, col, rows, cols } => self.for_chunks(&mut out[..rows * stride], stride, |r0, chunk| {
                for (j, row) in chunk.chunks_exact_mut(stride).enumerate() {
                    let at = (r0 + j) * src_stride + src_col;
                    row[col..col + cols].copy_from_slice(&src[at..at + cols]);
                }
            }),
            Op::Mul { a, b, out, n, accumulate } => self.for_chunks(&mut out[..n], 1, |i, o| {
                for (j, o) in o.iter_mut().enumerate() {
                    let p = a[i + j] * b[i + j];
                    *o = if accumulate { *o + p } else { p };
                }
            }),
            Op::AddInto { x, out, n } => self.for_chunks(&mut out[..n], 1, |i, o| add_into(o, &x[i..i + o.len()])),
            Op::Interaction { z, out, rows, vectors, dim, with_self } => {
                let (w, zw) = (dim + interaction_pairs(vectors, with_self), vectors * dim);
                self.for_chunks(&mut out[..rows * w], w, |r0, chunk| {
                    for (j, o) in chunk.chunks_exact_mut(w).enumerate() {
                        interaction_row(&z[(r0 + j) * zw..(r0 + j + 1) * zw], o, vectors, dim, with_self);
                    }
                })
            }
            Op::InteractionGrad { z, dout, dz, rows, vectors, dim, with_self } => {
                let (w, zw) = (dim + interaction_pairs(vectors, with_self), vectors * dim);
                self.for_chunks(&mut dz[..rows * zw], zw, |r0, chunk| {
                    for (j, o) in chunk.chunks_exact_mut(zw).enumerate() {
                        let r = r0 + j;
                        interaction_grad_row(&z[r * zw..(r + 1) * zw], &dout[r * w..(r + 1) * w], o, vectors, dim, with_self);
                    }
                })
            }
            Op::StripFirstOrder { x, out, rows, fields, dim, ndense } => {
                let (iw, ow) = (fields * (dim + 1) + ndense, fields * dim + ndense);
                self.for_chunks(&mut out[..rows * ow], ow, |r0, chunk| {
                    for (j, o) in chunk.chunks_exact_mut(ow).enumerate() {
                        strip_first_order_row(&x[(r0 + j) * iw..(r0 + j + 1) * iw], o, fields, dim);
                    }
                })
            }
            Op::FirstOrderSum { x, out, rows, fields, dim, ndense } => {
                let iw = fields * (dim + 1) + ndense;
                self.for_chunks(&mut out[..rows], 1, |r0, o| {
                    for (j, o) in o.iter_mut().enumerate() {
                        *o = first_order_sum_row(&x[(r0 + j) * iw..(r0 + j + 1) * iw], fields, dim);
                    }
                })
            }
            Op::StripFirstOrderGrad { ddeep, dsum, dx, rows, fields, dim, ndense } => {
                let (iw, ow) = (fields * (dim + 1) + ndense, fields * dim + ndense);
                self.for_chunks(&mut dx[..rows * iw], iw, |r0, chunk| {
                    for (j, o) in chunk.chunks_exact_mut(iw).enumerate() {
                        let r = r0 + j;
                        strip_first_order_grad_row(&ddeep[r * ow..(r + 1) * ow], dsum[r], o, fields, dim);
                    }
                })
            }
            Op::FmSecondOrder { emb, out, rows, fields, dim, stride } => self.for_chunks(&mut out[..rows], 1, |r0, o| {
                for (j, o) in o.iter_mut().enumerate() {
                    *o = fm_second_order_row(&emb[(r0 + j) * stride..], fields, dim);
                }
            }),
            Op::FmSecondOrderGrad { emb, dout, demb, rows, fields, dim, stride } => self.for_chunks(&mut demb[..rows * stride], stride, |r0, chunk| {
                for (j, o) in chunk.chunks_exact_mut(stride).enumerate() {
                    let r = r0 + j;
                    fm_second_order_grad_row(&emb[r * stride..(r + 1) * stride], dout[r], o, fields, dim);
                }
            }),
            op => return Err(DeviceError::refused(op.name(), "not a kernel of the models (kernels/models.cu)")),
        }
        Ok(())
    }
}

/// The index of DLRM's pair `(i, j)` (`j < i`, or `j <= i` with self-interaction).
fn pair(i: usize, j: usize, with_self: bool) -> usize {
    (if with_self { i * (i + 1) / 2 } else { i * i.saturating_sub(1) / 2 }) + j
}

/// One row of [`super::ops::Op::Interaction`]: `z` (`vectors x dim`) into `out` (`dim + pairs`).
pub(super) fn interaction_row(z: &[f32], out: &mut [f32], vectors: usize, dim: usize, with_self: bool) {
    out[..dim].copy_from_slice(&z[..dim]);
    let mut p = dim;
    for i in 0..vectors {
        let last = if with_self { i + 1 } else { i };
        for j in 0..last {
            let mut acc = 0f32;
            for k in 0..dim {
                acc += z[i * dim + k] * z[j * dim + k];
            }
            out[p] = acc;
            p += 1;
        }
    }
}

/// One row of [`super::ops::Op::InteractionGrad`].
pub(super) fn interaction_grad_row(z: &[f32], g: &[f32], dz: &mut [f32], vectors: usize, dim: usize, with_self: bool) {
    for i in 0..vectors {
        for k in 0..dim {
            let mut acc = if i == 0 { g[k] } else { 0.0 };
            for j in 0..vectors {
                if j == i {
                    if with_self {
                        acc += 2.0 * g[dim + pair(i, i, true)] * z[i * dim + k];
                    }
                } else {
                    let p = if j < i { pair(i, j, with_self) } else { pair(j, i, with_self) };
                    acc += g[dim + p] * z[j * dim + k];
                }
            }
            dz[i * dim + k] = acc;
        }
    }
}

/// One row of [`super::ops::Op::StripFirstOrder`]: `x` (`fields (dim + 1) + ndense`) into
/// `out` (`fields dim + ndense`).
pub(super) fn strip_first_order_row(x: &[f32], out: &mut [f32], fields: usize, dim: usize) {
    for f in 0..fields {
        out[f * dim..(f + 1) * dim].copy_from_slice(&x[f * (dim + 1)..f * (dim + 1) + dim]);
    }
    out[fields * dim..].copy_from_slice(&x[fields * (dim + 1)..]);
}

/// One row of [`super::ops::Op::FirstOrderSum`].
pub(super) fn first_order_sum_row(x: &[f32], fields: usize, dim: usize) -> f32 {
    (0..fields).fold(0f32, |acc, f| acc + x[f * (dim + 1) + dim])
}

/// One row of [`super::ops::Op::StripFirstOrderGrad`].
pub(super) fn strip_first_order_grad_row(ddeep: &[f32], dsum: f32, dx: &mut [f32], fields: usize, dim: usize) {
    for f in 0..fields {
        dx[f * (dim + 1)..f * (dim + 1) + dim].copy_from_slice(&ddeep[f * dim..(f + 1) * dim]);
        dx[f * (dim + 1) + dim] = dsum;
    }
    dx[fields * (dim + 1)..].copy_from_slice(&ddeep[fields * dim..]);
}

/// One row of [`super::ops::Op::FmSecondOrder`].
pub(super) fn fm_second_order_row(e: &[f32], fields: usize, dim: usize) -> f32 {
    let mut acc = 0f32;
    for k in 0..dim {
        let (mut s, mut sq) = (0f32, 0f32);
        for f in 0..fields {
            let v = e[f * dim + k];
            s += v;
            sq += v * v;
        }
        acc += s * s - sq;
    }
    0.5 * acc
}

/// One row of [`super::ops::Op::FmSecondOrderGrad`], added into `demb`.
pub(super) fn fm_second_order_grad_row(e: &[f32], dout: f32, demb: &mut [f32], fields: usize, dim: usize) {
    for k in 0..dim {
        let s = (0..fields).fold(0f32, |s, f| s + e[f * dim + k]);
        for f in 0..fields {
            demb[f * dim + k] += dout * (s - e[f * dim + k]);
        }
    }
}
