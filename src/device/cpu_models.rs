//! The CPU implementations of the models' kernels ([`Op::Interaction`] and the ones after it
//! in [`Op`]), one row (or element) at a time, in the order kernels/models.cu sums them, so
//! the CPU, `--device host` and CUDA agree. [`super::CpuDevice`] splits the rows over its
//! threads.
//!
//! [`Op`]: super::ops::Op
//! [`Op::Interaction`]: super::ops::Op::Interaction

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
