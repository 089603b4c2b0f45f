//! The CPU implementations of multi-hot pooling ([`Op::PoolBags`], [`Op::PoolBagsGrad`];
//! through the GPU hot-row cache, `Op::PoolBagsSourced`)
//! and of the input of fields of several widths ([`Op::GatherFields`],
//! [`Op::GatherFieldsGrad`]: `--table`), one output row (or key) at a time, in the order
//! kernels/pooling.cu sums them, so the CPU, `--device host` and CUDA agree bit for bit;
//! the rows (keys) are split over the device's threads. For the common row widths (8, 16,
//! 32, 64) a bag's (a key's) sum is held in registers while its rows are added — the same
//! additions in the same order.
//!
//! [`Op::PoolBags`]: super::ops::Op::PoolBags
//! [`Op::PoolBagsGrad`]: super::ops::Op::PoolBagsGrad
//! [`Op::GatherFields`]: super::ops::Op::GatherFields
//! [`Op::GatherFieldsGrad`]: super::ops::Op::GatherFieldsGrad

use super::cpu::{add_into, CpuDevice};
use super::cpu_cache::sourced_row;
use super::ops::{FieldCols, Op};
use super::DeviceResult;

impl CpuDevice {
    /// Runs a pooling kernel; any other goes on to the models' kernels.
    pub(super) fn exec_pooling(&self, op: Op<'_, Self>) -> DeviceResult<()> {
        match op {
            Op::PoolBags { table, index, offsets, out, rows, bags, dim, stride, col, mean } => {
                let bags_of = BagsOnCpu { index, offsets, bags, dim, stride, col, mean };
                self.for_chunks(&mut out[..rows * stride], stride, |r0, chunk| bags_of.pool(r0, chunk, |u| &table[u * dim..(u + 1) * dim]))
            }
            Op::PoolBagsSourced { cache, misses, source, index, offsets, out, rows, bags, dim, stride, col, mean } => {
                let bags_of = BagsOnCpu { index, offsets, bags, dim, stride, col, mean };
                self.for_chunks(&mut out[..rows * stride], stride, |r0, chunk| bags_of.pool(r0, chunk, |u| sourced_row(cache, misses, source[u], dim)))
            }
            Op::PoolBagsGrad { src, offsets, key_offsets, slots, out, segments, bags, dim, stride, col, mean, .. } => self.for_chunks(&mut out[..segments * dim], dim, |u0, chunk| {
                for (j, acc) in chunk.chunks_exact_mut(dim).enumerate() {
                    let u = u0 + j;
                    let bags_of_key = &slots[key_offsets[u] as usize..key_offsets[u + 1] as usize];
                    // Bag b's pooled gradient block, and the length it is divided by (mean).
                    let block = |b: usize| {
                        let at = (b / bags) * stride + col + (b % bags) * dim;
                        let len = ((mean >> (b % bags)) & 1 == 1).then(|| (offsets[b + 1] - offsets[b]) as f32);
                        (&src[at..at + dim], len)
                    };
                    spread_to_key(acc, bags_of_key, block);
                }
            }),
            Op::GatherFields { emb, key_at, inverse, index, offsets, cols, out, rows, stride } => {
                let (c, row_of) = (FieldsOnCpu::of(&cols), |u: u32| &emb[key_at[u as usize] as usize..key_at[u as usize + 1] as usize]);
                self.for_chunks(&mut out[..rows * stride], stride, |r0, chunk| {
                    for (j, row) in chunk.chunks_exact_mut(stride).enumerate() {
                        let r = r0 + j;
                        for f in 0..c.fields {
                            let (lo, hi) = (c.field_col[f] as usize, c.field_col[f + 1] as usize);
                            let out = &mut row[lo..hi];
                            match f.checked_sub(c.single) {
                                None => out.copy_from_slice(&row_of(inverse[r * c.single + f])[..hi - lo]),
                                Some(g) => {
                                    let b = r * c.bags + g;
                                    let ids = &index[offsets[b] as usize..offsets[b + 1] as usize];
                                    pool_bag(|u| &row_of(u as u32)[..hi - lo], ids, (c.mean >> g) & 1 == 1, out);
                                }
                            }
                        }
                    }
                });
            }
            Op::GatherFieldsGrad { src, key_at, offsets, slots, bag_offsets, key_offsets, bag_slots, cols, out, keys, floats, stride, .. } => {
                let c = FieldsOnCpu::of(&cols);
                // Each key's gradient row, cut from `out` at `key_at` (rows of their tables' widths).
                let mut rest = &mut out[..floats];
                let mut rows: Vec<&mut [f32]> = Vec::with_capacity(keys);
                for u in 0..keys {
                    let (row, tail) = rest.split_at_mut((key_at[u + 1] - key_at[u]) as usize);
                    rows.push(row);
                    rest = tail;
                }
                let key_grad = |u: usize, acc: &mut [f32]| {
                    let w = acc.len();
                    acc.fill(0.0);
                    let slot = |p: usize| {
                        let at = (p / c.single) * stride + c.field_col[p % c.single] as usize;
                        (&src[at..at + w], None)
                    };
                    spread_to_key(acc, slots_of(slots, offsets, u), slot);
                    let block = |b: usize| {
                        let g = b % c.bags;
                        let at = (b / c.bags) * stride + c.field_col[c.single + g] as usize;
                        let len = ((c.mean >> g) & 1 == 1).then(|| (bag_offsets[b + 1] - bag_offsets[b]) as f32);
                        (&src[at..at + w], len)
                    };
                    spread_to_key(acc, slots_of(bag_slots, key_offsets, u), block);
                };
                self.for_rows(rows, floats, key_grad);
            }
            op => return self.exec_model(op),
        }
        Ok(())
    }
}

/// The bags of an [`Op::PoolBags`] (or [`Op::PoolBagsSourced`]) as the CPU reads them.
///
/// [`Op::PoolBagsSourced`]: super::ops::Op::PoolBagsSourced
struct BagsOnCpu<'a> {
    index: &'a [u32],
    offsets: &'a [u32],
    bags: usize,
    dim: usize,
    stride: usize,
    col: usize,
    mean: u32,
}

impl BagsOnCpu<'_> {
    /// Pools the bags of the output rows in `chunk` (rows from `r0`), unique key `u`'s row
    /// being `row(u)`.
    fn pool<'t>(&self, r0: usize, chunk: &mut [f32], row: impl Fn(usize) -> &'t [f32] + Copy) {
        let BagsOnCpu { index, offsets, bags, dim, stride, col, mean } = *self;
        for (j, out) in chunk.chunks_exact_mut(stride).enumerate() {
            for f in 0..bags {
                let b = (r0 + j) * bags + f;
                let (lo, hi) = (offsets[b] as usize, offsets[b + 1] as usize);
                pool_bag(row, &index[lo..hi], (mean >> f) & 1 == 1, &mut out[col + f * dim..col + (f + 1) * dim]);
            }
        }
    }
}

/// Key `u`'s entries of a CSR list (`slots[offsets[u]..offsets[u + 1]]`).
fn slots_of<'s>(slots: &'s [u32], offsets: &[u32], u: usize) -> &'s [u32] {
    &slots[offsets[u] as usize..offsets[u + 1] as usize]
}

/// A [`FieldCols`]'s arrays as the CPU reads them, and its bags.
struct FieldsOnCpu<'a> {
    field_col: &'a [u32],
    fields: usize,
    single: usize,
    bags: usize,
    mean: u32,
}

impl<'a> FieldsOnCpu<'a> {
    fn of(c: &FieldCols<'a, CpuDevice>) -> FieldsOnCpu<'a> {
        FieldsOnCpu { field_col: c.field_col, fields: c.fields, single: c.single, bags: c.fields - c.single, mean: c.mean }
    }
}

/// `acc` = the bag `ids` pooled: the sum of their rows (`row(u)`, `acc.len()` values) in
/// list order from zero, divided by its length when `mean` and it is not empty.
fn pool_bag<'t>(row: impl Fn(usize) -> &'t [f32], ids: &[u32], mean: bool, acc: &mut [f32]) {
    sum_rows(row, ids, acc);
    if mean && !ids.is_empty() {
        let len = ids.len() as f32;
        acc.iter_mut().for_each(|v| *v /= len);
    }
}

/// `acc` = the sum of the rows `row(u)` of `ids` (`acc.len()` values each), in list order,
/// from zero.
fn sum_rows<'t>(row: impl Fn(usize) -> &'t [f32], ids: &[u32], acc: &mut [f32]) {
    match acc.len() {
        8 => sum_rows_fixed::<8>(row, ids, acc),
        16 => sum_rows_fixed::<16>(row, ids, acc),
        32 => sum_rows_fixed::<32>(row, ids, acc),
        64 => sum_rows_fixed::<64>(row, ids, acc),
        _ => {
            acc.fill(0.0);
            for u in ids {
                add_into(acc, row(*u as usize));
            }
        }
    }
}

/// [`sum_rows`] for rows of `D` values, summed in registers.
#[inline(always)]
fn sum_rows_fixed<'t, const D: usize>(row: impl Fn(usize) -> &'t [f32], ids: &[u32], out: &mut [f32]) {
    let mut acc = [0f32; D];
    for u in ids {
        for (a, x) in acc.iter_mut().zip(&row(*u as usize)[..D]) {
            *a += x;
        }
    }
    out.copy_from_slice(&acc);
}

/// Adds to a key's gradient row `acc` the gradient blocks of its bags `bags_of_key` (or of
/// its single-hot slots), in list order: `block(b)` is bag b's block and, for a mean field,
/// its length (each value divided by it before it is added).
fn spread_to_key<'s>(acc: &mut [f32], bags_of_key: &[u32], block: impl Fn(usize) -> (&'s [f32], Option<f32>)) {
    match acc.len() {
        8 => spread_fixed::<8, _>(acc, bags_of_key, block),
        16 => spread_fixed::<16, _>(acc, bags_of_key, block),
        32 => spread_fixed::<32, _>(acc, bags_of_key, block),
        64 => spread_fixed::<64, _>(acc, bags_of_key, block),
        _ => {
            for b in bags_of_key {
                match block(*b as usize) {
                    (g, Some(len)) => acc.iter_mut().zip(g).for_each(|(a, g)| *a += g / len),
                    (g, None) => add_into(acc, g),
                }
            }
        }
    }
}

/// [`spread_to_key`] for rows of `D` values, the row held in registers.
#[inline(always)]
fn spread_fixed<'s, const D: usize, F: Fn(usize) -> (&'s [f32], Option<f32>)>(out: &mut [f32], bags_of_key: &[u32], block: F) {
    let mut acc = [0f32; D];
    acc.copy_from_slice(out);
    for b in bags_of_key {
        match block(*b as usize) {
            (g, Some(len)) => acc.iter_mut().zip(g).for_each(|(a, g)| *a += g / len),
            (g, None) => acc.iter_mut().zip(g).for_each(|(a, g)| *a += g),
        }
    }
    out.copy_from_slice(&acc);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_widths_sum_as_the_general_loop_does() {
        // Values whose sums round differently in another order.
        let value = |i: usize| ((i * 7919) % 1000) as f32 * 1.0e-3 + if i % 3 == 0 { 1.0e4 } else { 0.0 };
        for dim in [3, 8, 16, 32, 64] {
            let table: Vec<f32> = (0..10 * dim).map(value).collect();
            let ids = [4u32, 0, 9, 4, 7, 1];
            let mut general = vec![0f32; dim];
            for u in ids {
                add_into(&mut general, &table[u as usize * dim..(u as usize + 1) * dim]);
            }
            let mut got = vec![f32::NAN; dim];
            sum_rows(|u| &table[u * dim..(u + 1) * dim], &ids, &mut got);
            assert_eq!(got, general, "dim {dim}");
            sum_rows(|u| &table[u * dim..(u + 1) * dim], &[], &mut got);
            assert!(got.iter().all(|v| *v == 0.0), "an empty bag pools to zeros");
            // The spread: bag b's block is row b of the table, mean for odd bags.
            let block = |b: usize| (&table[b * dim..(b + 1) * dim], (b % 2 == 1).then_some(3.0f32));
            let mut want: Vec<f32> = (0..dim).map(|i| value(i + 5)).collect();
            let mut got = want.clone();
            for b in ids {
                let (g, len) = block(b as usize);
                want.iter_mut().zip(g).for_each(|(a, g)| *a += len.map_or(*g, |l| g / l));
            }
            spread_to_key(&mut got, &ids, block);
            assert_eq!(got, want, "dim {dim}");
        }
    }
}
