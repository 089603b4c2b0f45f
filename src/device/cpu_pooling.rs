//! The CPU implementations of multi-hot pooling ([`Op::PoolBags`], [`Op::PoolBagsGrad`]),
//! one output row (or key) at a time, in the order kernels/pooling.cu sums them, so the
//! CPU, `--device host` and CUDA agree bit for bit; the rows (keys) are split over the
//! device's threads.
//!
//! [`Op::PoolBags`]: super::ops::Op::PoolBags
//! [`Op::PoolBagsGrad`]: super::ops::Op::PoolBagsGrad

use super::cpu::{add_into, CpuDevice};
use super::ops::Op;
use super::DeviceResult;

impl CpuDevice {
    /// Runs a pooling kernel; any other goes on to the models' kernels.
    pub(super) fn exec_pooling(&self, op: Op<'_, Self>) -> DeviceResult<()> {
        match op {
            Op::PoolBags { table, index, offsets, out, rows, bags, dim, stride, col, mean } => self.for_chunks(&mut out[..rows * stride], stride, |r0, chunk| {
                for (j, row) in chunk.chunks_exact_mut(stride).enumerate() {
                    for f in 0..bags {
                        let b = (r0 + j) * bags + f;
                        let (lo, hi) = (offsets[b] as usize, offsets[b + 1] as usize);
                        let acc = &mut row[col + f * dim..col + (f + 1) * dim];
                        acc.fill(0.0);
                        for u in &index[lo..hi] {
                            let u = *u as usize;
                            add_into(acc, &table[u * dim..(u + 1) * dim]);
                        }
                        if (mean >> f) & 1 == 1 && hi > lo {
                            let len = (hi - lo) as f32;
                            acc.iter_mut().for_each(|v| *v /= len);
                        }
                    }
                }
            }),
            Op::PoolBagsGrad { src, offsets, key_offsets, slots, out, segments, bags, dim, stride, col, mean, .. } => self.for_chunks(&mut out[..segments * dim], dim, |u0, chunk| {
                for (j, acc) in chunk.chunks_exact_mut(dim).enumerate() {
                    let u = u0 + j;
                    for b in &slots[key_offsets[u] as usize..key_offsets[u + 1] as usize] {
                        let b = *b as usize;
                        let (f, at) = (b % bags, (b / bags) * stride + col + (b % bags) * dim);
                        let g = &src[at..at + dim];
                        if (mean >> f) & 1 == 1 {
                            let len = (offsets[b + 1] - offsets[b]) as f32;
                            acc.iter_mut().zip(g).for_each(|(a, g)| *a += g / len);
                        } else {
                            add_into(acc, g);
                        }
                    }
                }
            }),
            op => return self.exec_model(op),
        }
        Ok(())
    }
}
