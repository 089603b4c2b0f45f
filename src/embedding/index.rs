//! The key-to-slot index of a table: open addressing with linear probing over a power-of-two
//! array of u64 keys in the file ([`EMPTY_KEY`] marks a free slot). Keys are never deleted.
//! [`probe`] is the one probe every lookup and insertion uses.

use super::format::EMPTY_KEY;
use super::init::home_slot;

/// Where the probe for `key` ends in `index` (a power-of-two number of slots, home slots by
/// `shift`): `(slot, false)` holding `key`, `(slot, true)` the free slot where it would be
/// inserted, or `None` when it visits every slot (a full, hostile index).
#[inline(always)]
pub fn probe(index: &[u64], key: u64, shift: u32) -> Option<(usize, bool)> {
    probe_from(index, key, home_slot(key, shift))
}

/// [`probe`] resumed at slot `start` (taken modulo the length): what the probe from the
/// key's home slot finds when every slot from home to `start` holds another key — as a
/// probe of the same key earlier left them, since keys are never deleted.
#[inline(always)]
pub fn probe_from(index: &[u64], key: u64, start: usize) -> Option<(usize, bool)> {
    let mask = index.len().wrapping_sub(1);
    let mut i = start & mask;
    for _ in 0..index.len() {
        let k = index[i];
        if k == key || k == EMPTY_KEY {
            return Some((i, k == EMPTY_KEY));
        }
        i = (i + 1) & mask;
    }
    None
}

/// Prefetches `key`'s home slot of `index` (a hint: lookups are bound by memory latency).
#[inline(always)]
pub fn prefetch_slot<T>(index: &[u64], rows: &[T], dim: usize, key: u64, shift: u32) {
    #[cfg(target_arch = "x86_64")]
    {
        let i = home_slot(key, shift) & index.len().wrapping_sub(1);
        // SAFETY: prefetch is a hint that never faults, whatever the address; `i` is in
        // bounds of the index anyway.
        unsafe { std::arch::x86_64::_mm_prefetch(index.as_ptr().wrapping_add(i) as *const i8, std::arch::x86_64::_MM_HINT_T0) };
        // SAFETY: as above; the home slot's row is where the key's row most likely is.
        unsafe { std::arch::x86_64::_mm_prefetch(rows.as_ptr().wrapping_add(i * dim) as *const i8, std::arch::x86_64::_MM_HINT_T0) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (index, rows, dim, key, shift);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_wrap_and_stop_on_a_full_index() {
        let shift = 64 - 4u32.trailing_zeros();
        let home = home_slot(7, shift) & 3;
        let mut index = [EMPTY_KEY; 4];
        assert_eq!(probe(&index, 7, shift), Some((home, true)));
        index[home] = 9;
        assert_eq!(probe(&index, 7, shift), Some(((home + 1) & 3, true)));
        index[(home + 1) & 3] = 7;
        assert_eq!(probe(&index, 7, shift), Some(((home + 1) & 3, false)));
        let full = [1u64, 2, 3, 4];
        assert_eq!(probe(&full, 7, shift), None);
    }
}
