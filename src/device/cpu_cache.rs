//! The GPU hot-row cache's kernels (kernels/cache.cu) on the CPU device: the input gathered
//! from the cache or the misses (its multi-hot pooling is `cpu_pooling`'s), the cached rows' update with the table's own arithmetic
//! (`embedding::update`: the same order and roundings, no contraction), rows put into slots,
//! new keys' initial rows.

use super::cpu::CpuDevice;
use super::ops::Op;
use super::CACHE_MISS;
use super::DeviceResult;

/// The row (`dim` values) a hot-row cache source `s` names: row `s` of `cache`, or, with
/// [`CACHE_MISS`] set, row `s & !CACHE_MISS` of `misses`.
pub(super) fn sourced_row<'t>(cache: &'t [f32], misses: &'t [f32], s: u32, dim: usize) -> &'t [f32] {
    let (from, at) = if s & CACHE_MISS != 0 { (misses, (s & !CACHE_MISS) as usize) } else { (cache, s as usize) };
    &from[at * dim..(at + 1) * dim]
}

impl CpuDevice {
    /// Runs a cache kernel; any other op goes on to [`CpuDevice::exec_model`].
    pub(super) fn exec_cache(&self, op: Op<'_, Self>) -> DeviceResult<()> {
        match op {
            Op::GatherSourced { cache, misses, source, index, out, rows, per_row, dim, stride } => self.for_chunks(&mut out[..rows * stride], stride, |r0, chunk| {
                for (j, row) in chunk.chunks_exact_mut(stride).enumerate() {
                    let r = r0 + j;
                    for (f, u) in index[r * per_row..(r + 1) * per_row].iter().enumerate() {
                        row[f * dim..(f + 1) * dim].copy_from_slice(sourced_row(cache, misses, source[*u as usize], dim));
                    }
                }
            }),
            Op::CacheUpdate { rows, acc, slots, grads, index, n, dim, lr, eps, adagrad } => {
                for (e, s) in slots[..n].iter().enumerate() {
                    if *s & CACHE_MISS != 0 {
                        continue;
                    }
                    let at = index.map_or(e, |i| i[e] as usize);
                    let g = &grads[at * dim..(at + 1) * dim];
                    let s = *s as usize;
                    let w = &mut rows[s * dim..(s + 1) * dim];
                    if adagrad {
                        // The order and roundings of `embedding::update`'s row-wise Adagrad.
                        let a = &mut acc[s];
                        *a += g.iter().map(|g| g * g).sum::<f32>() / dim as f32;
                        let denom = a.sqrt() + eps;
                        for (x, g) in w.iter_mut().zip(g) {
                            *x -= lr * g / denom;
                        }
                    } else {
                        for (x, g) in w.iter_mut().zip(g) {
                            *x -= lr * g;
                        }
                    }
                }
            }
            Op::CachePut { rows, acc, slots, values, accs, n, dim, has_acc } => {
                for (e, s) in slots[..n].iter().enumerate() {
                    let s = *s as usize;
                    rows[s * dim..(s + 1) * dim].copy_from_slice(&values[e * dim..(e + 1) * dim]);
                    if has_acc {
                        acc[s] = accs[e];
                    }
                }
            }
            Op::InitRows { keys, out, at, n, dim, seed, scale } => {
                for (e, row) in out[at * dim..(at + n) * dim].chunks_exact_mut(dim).enumerate() {
                    crate::hash::init_row_f32(keys[2 * e] as u64 | (keys[2 * e + 1] as u64) << 32, seed, scale, row);
                }
            }
            op => return self.exec_pooling(op),
        }
        Ok(())
    }
}
