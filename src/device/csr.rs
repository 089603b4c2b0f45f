//! The input's per-key lists (CSR): each unique key's (sample, field) slots, the transpose
//! of a batch's inverse map, which drives the per-key sum of the input gradient
//! ([`Op::SegmentSum`]). [`build_csr`] builds them on the host (the CPU device, the
//! reference); [`Op::BuildCsr`] on a kernel device from the inverse map already there
//! (kernels/csr.cu: a stable radix sort of the slots by key), so a batch uploads its
//! inverse map only (issue 30). Both give the same lists, slot for slot: a key's slots in
//! increasing order, the one summation order of its gradient inside a rank.

use super::kernels::Kernel;
use super::ops::{KernelArg, LaunchKernels};
use super::{Device, DeviceError, DeviceResult, Op};

/// Entries per chunk of the device's sort: one thread counts and scatters each chunk.
pub const CSR_CHUNK: usize = 256;
/// Bits of the key sorted per pass (kernels/csr.cu's `CSR_BITS`).
const CSR_BITS: usize = 4;
/// Digits per pass (kernels/csr.cu's `CSR_DIGITS`).
const CSR_DIGITS: usize = 1 << CSR_BITS;
/// Counts per block of the counts' prefix sums (kernels/csr.cu's `CSR_SCAN`).
const CSR_SCAN: usize = 64;

/// Each of `keys` keys' slots in CSR form: `slots[offsets[u]..offsets[u + 1]]` are the
/// slots `p` (in increasing order: sample order, then field order — the one summation
/// order of a key's gradient inside a rank) with `inverse[p] == u`. `next` is scratch.
/// An error names a slot whose key is out of range.
pub fn build_csr(inverse: &[u32], keys: usize, offsets: &mut [u32], slots: &mut [u32], next: &mut Vec<u32>) -> Result<(), String> {
    if let Some(bad) = inverse.iter().find(|u| **u as usize >= keys) {
        return Err(format!("inverse names row {bad} of {keys} unique keys"));
    }
    offsets[..keys + 1].fill(0);
    for u in inverse {
        offsets[*u as usize + 1] += 1;
    }
    for u in 0..keys {
        offsets[u + 1] += offsets[u];
    }
    next.clear();
    next.extend_from_slice(&offsets[..keys]);
    for (p, u) in inverse.iter().enumerate() {
        let at = &mut next[*u as usize];
        slots[*at as usize] = p as u32;
        *at += 1;
    }
    Ok(())
}

/// The device's working buffers of [`Op::BuildCsr`] for up to `n` slots: the other half
/// of the sort's ping-pong, and per pass the (digit, chunk) counts and starts and the sums
/// and starts of their blocks.
pub struct CsrScratch<D: Device> {
    order: D::Buf<u32>,
    counts: D::Buf<u32>,
    starts: D::Buf<u32>,
    sums: D::Buf<u32>,
    block_starts: D::Buf<u32>,
}

impl<D: Device> CsrScratch<D> {
    /// Empty buffers.
    pub fn new(dev: &D) -> DeviceResult<CsrScratch<D>> {
        Ok(CsrScratch { order: dev.alloc(0)?, counts: dev.alloc(0)?, starts: dev.alloc(0)?, sums: dev.alloc(0)?, block_starts: dev.alloc(0)? })
    }

    /// Grows the buffers that hold less than `n` slots need.
    pub fn fit(&mut self, dev: &D, n: usize) -> DeviceResult<()> {
        let (per_pass, blocks) = (CSR_DIGITS * chunks(n), blocks(n));
        for (b, need) in [(&mut self.order, n), (&mut self.counts, per_pass), (&mut self.starts, per_pass), (&mut self.sums, blocks), (&mut self.block_starts, blocks)] {
            if dev.len(b) < need {
                *b = dev.alloc(need)?;
            }
        }
        Ok(())
    }

    /// Whether it holds what `n` slots need.
    pub(super) fn fits(&self, dev: &D, n: usize) -> bool {
        let (per_pass, blocks) = (CSR_DIGITS * chunks(n), blocks(n));
        let fit = |b: &D::Buf<u32>, need: usize| dev.len(b) >= need;
        fit(&self.order, n) && fit(&self.counts, per_pass) && fit(&self.starts, per_pass) && fit(&self.sums, blocks) && fit(&self.block_starts, blocks)
    }

    /// The CPU device's scratch: the sort's other half serves as [`build_csr`]'s `next`.
    pub(super) fn next(&mut self) -> &mut D::Buf<u32> {
        &mut self.order
    }
}

/// Chunks of [`CSR_CHUNK`] entries that `n` slots make.
fn chunks(n: usize) -> usize {
    n.div_ceil(CSR_CHUNK)
}

/// Blocks of the counts' prefix sums for `n` slots.
fn blocks(n: usize) -> usize {
    (CSR_DIGITS * chunks(n)).div_ceil(CSR_SCAN)
}

/// Radix passes that sort keys below `keys`: one per [`CSR_BITS`] bits of the largest, at
/// least one.
fn passes(keys: usize) -> usize {
    let bits = usize::BITS - keys.saturating_sub(1).leading_zeros();
    (bits as usize).div_ceil(CSR_BITS).max(1)
}

/// An `int` kernel argument, refused past `i32::MAX`.
fn int<'a, D: Device>(v: usize) -> DeviceResult<KernelArg<'a, D>> {
    i32::try_from(v).map(KernelArg::I32).map_err(|_| DeviceError::refused("build_csr", format!("size {v} does not fit the kernel's int argument; use a smaller --batch")))
}

/// Runs [`Op::BuildCsr`] with kernels/csr.cu (bounds already checked): the passes of the
/// sort, ping-ponging between `slots` and the scratch so the last one writes `slots`, then
/// the offsets.
pub(super) fn launch<D: LaunchKernels>(dev: &D, op: Op<'_, D>) -> DeviceResult<()> {
    use KernelArg::{InU32, OutU32, I32};
    let Op::BuildCsr { inverse, n, keys, offsets, slots, scratch } = op else {
        return Err(DeviceError::refused("build_csr", "not a CSR build"));
    };
    let (chunks, passes, blocks) = (chunks(n), passes(keys), blocks(n));
    let len = CSR_DIGITS * chunks;
    let CsrScratch { order, counts, starts, sums, block_starts } = scratch;
    for pass in 0..passes {
        // The last pass writes `slots`; each pass reads what the one before wrote.
        let to_slots = (passes - 1 - pass) % 2 == 0;
        let (from, to): (&D::Buf<u32>, &mut D::Buf<u32>) = if to_slots { (&*order, &mut *slots) } else { (&*slots, &mut *order) };
        let (from, ordered) = if pass == 0 { (inverse, 0) } else { (from, 1) };
        dev.launch(Kernel::CsrCount, chunks, &mut [InU32(inverse), InU32(from), I32(ordered), OutU32(counts, 0), int(n)?, int(chunks)?, int(CSR_CHUNK)?, int(pass * CSR_BITS)?])?;
        dev.launch(Kernel::CsrBlockSums, blocks, &mut [InU32(counts), OutU32(sums, 0), int(len)?])?;
        dev.launch(Kernel::CsrBlockStarts, 1, &mut [InU32(sums), OutU32(block_starts, 0), int(blocks)?])?;
        dev.launch(Kernel::CsrStarts, blocks, &mut [InU32(counts), InU32(block_starts), OutU32(starts, 0), int(len)?])?;
        dev.launch(Kernel::CsrScatter, chunks, &mut [InU32(inverse), InU32(from), I32(ordered), InU32(starts), OutU32(to, 0), int(n)?, int(chunks)?, int(CSR_CHUNK)?, int(pass * CSR_BITS)?])?;
    }
    dev.launch(Kernel::CsrOffsets, n + 1, &mut [InU32(inverse), InU32(slots), OutU32(offsets, 0), int(n)?, int(keys)?])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_cover_the_largest_key() {
        assert_eq!([0, 1, 2, 16, 17, 256, 257, 85_185, 1 << 20].map(passes), [1, 1, 1, 1, 2, 2, 3, 5, 5]);
        assert_eq!([0, 1, 256, 257].map(chunks), [0, 1, 1, 2]);
        assert_eq!([0, 1, 4 * 256, 4 * 256 + 1].map(blocks), [0, 1, 1, 2]);
    }
}
