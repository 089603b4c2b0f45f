//! The key-to-slot index of a table: open addressing with linear probing over a power-of-two
//! array of u64 keys in the file ([`EMPTY_KEY`] marks a free slot). [`probe`] is the one
//! probe every lookup and insertion uses; [`remove_at`] deletes by *backward shift*, so there
//! are no tombstones: after a removal the index is exactly what inserting the remaining keys
//! would have left, every probe still ends at its key or at the first free slot.

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
/// probe of the same key earlier left them, as long as no key was removed since.
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

/// Empties `slot` of `index` (home slots by `shift`) by backward-shift deletion: each later
/// key of the cluster whose probe passes the hole moves back into it, and the hole moves
/// on, until a free slot ends the cluster. `moved(from, to)` is called for each key moved
/// (in order), so the caller moves the slot's row and state with it; the slot left free
/// last is returned. Deterministic: the same index and slot give the same moves.
pub fn remove_at(index: &mut [u64], slot: usize, shift: u32, mut moved: impl FnMut(usize, usize)) -> usize {
    let mask = index.len().wrapping_sub(1);
    let mut hole = slot & mask;
    let mut j = hole;
    for _ in 0..index.len() {
        j = (j + 1) & mask;
        let k = index[j];
        if k == EMPTY_KEY {
            break;
        }
        // The key at j may fill the hole when the hole lies on its probe, home..=j.
        let home = home_slot(k, shift) & mask;
        if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
            index[hole] = k;
            moved(j, hole);
            hole = j;
        }
    }
    index[hole] = EMPTY_KEY;
    hole
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

    /// Inserts `keys` in order into an empty index of `n` slots.
    fn build(keys: &[u64], n: usize) -> Vec<u64> {
        let shift = 64 - n.trailing_zeros();
        let mut index = vec![EMPTY_KEY; n];
        for k in keys {
            let (s, _) = probe(&index, *k, shift).unwrap();
            index[s] = *k;
        }
        index
    }

    #[test]
    fn backward_shift_keeps_every_key_reachable() {
        // A crowded index (many clusters, some wrapping): remove every key in turn, in two
        // orders; after each removal every other key is found where a probe looks, and the
        // removed one is not.
        let n = 64usize;
        let shift = 64 - n.trailing_zeros();
        let keys: Vec<u64> = (0..50u64).map(|i| i.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 3).collect();
        for order in [keys.clone(), keys.iter().rev().copied().collect()] {
            let mut index = build(&keys, n);
            let mut gone = std::collections::HashSet::new();
            for k in &order {
                let (s, vacant) = probe(&index, *k, shift).unwrap();
                assert!(!vacant);
                remove_at(&mut index, s, shift, |_, _| {});
                gone.insert(*k);
                for x in &keys {
                    match probe(&index, *x, shift) {
                        Some((s, false)) => assert!(!gone.contains(x) && index[s] == *x),
                        Some((_, true)) => assert!(gone.contains(x), "key {x:#x} lost after removing {k:#x}"),
                        None => panic!("no free slot"),
                    }
                }
                assert_eq!(index.iter().filter(|k| **k != EMPTY_KEY).count(), keys.len() - gone.len());
            }
        }
        // Removing from a cluster moves exactly the keys whose probe passes the hole.
        let home = |k: u64| home_slot(k, shift) & (n - 1);
        let mut index = build(&keys, n);
        let (s, _) = probe(&index, keys[0], shift).unwrap();
        let mut moves = Vec::new();
        remove_at(&mut index, s, shift, |from, to| moves.push((from, to)));
        for (from, to) in moves {
            let k = index[to];
            assert!((from.wrapping_sub(home(k)) & (n - 1)) >= (from.wrapping_sub(to) & (n - 1)), "moved {k:#x} before its home");
        }
    }
}
