//! The dedupe's key sort: one counting-sort pass on the high bits of the keys, then each
//! (small) bucket sorted on its own.
//!
//! Keys are hashed ids, so their high bits spread them evenly: with about one bucket per
//! key most buckets hold zero, one or two keys, and the sort is two linear passes instead of
//! the ~log2(n) passes of a comparison sort. The buckets use the bits just below the highest
//! bit in which the keys differ, so small or clustered keys spread as well; keys that still
//! pile into one bucket (an adversary's, or many equal ones) are sorted there by
//! `sort_unstable`, so the worst case is a comparison sort plus one pass.

/// Below this many keys a comparison sort is as fast.
const SMALL: usize = 256;
/// Buckets up to this many keys are sorted by insertion.
const INSERTION: usize = 16;

/// Fills `out` with `(keys[i], i)` for every `i`, sorted by key, equal keys by index: the
/// same order as `sort_unstable` of those pairs. `counts` is scratch kept between calls.
pub fn sort_indexed(keys: &[u64], counts: &mut Vec<u32>, out: &mut Vec<(u64, u32)>) {
    debug_assert!(u32::try_from(keys.len()).is_ok(), "indices are u32");
    out.clear();
    let (Some(lo), Some(hi)) = (keys.iter().min(), keys.iter().max()) else { return };
    let differ = 64 - (lo ^ hi).leading_zeros();
    if keys.len() < SMALL || differ == 0 {
        out.extend(keys.iter().enumerate().map(|(i, k)| (*k, i as u32)));
        if differ != 0 {
            out.sort_unstable();
        }
        return;
    }
    // About one bucket per key; the bits [shift, differ) of a key are its bucket (all keys
    // agree above `differ`, so the bucket grows with the key).
    let bits = (usize::BITS - keys.len().leading_zeros() - 1).clamp(8, 16).min(differ);
    let shift = differ - bits;
    let mask = (1u64 << bits) - 1;
    let bucket = |k: u64| ((k >> shift) & mask) as usize;
    counts.clear();
    counts.resize(1 << bits, 0);
    for k in keys {
        counts[bucket(*k)] += 1;
    }
    // Counts become each bucket's first place.
    let mut at = 0u32;
    for c in counts.iter_mut() {
        let n = *c;
        *c = at;
        at += n;
    }
    out.resize(keys.len(), (0, 0));
    for (i, k) in keys.iter().enumerate() {
        let b = bucket(*k);
        out[counts[b] as usize] = (*k, i as u32);
        counts[b] += 1;
    }
    // Now counts[b] is the end of bucket b; keys came in index order, so each bucket is
    // sorted by index already.
    let mut start = 0usize;
    for end in counts.iter() {
        let end = *end as usize;
        let run = &mut out[start..end];
        if run.len() > INSERTION {
            run.sort_unstable();
        } else if run.len() > 1 {
            insertion_sort(run);
        }
        start = end;
    }
}

/// Sorts a short run (stable, so equal keys keep their index order).
fn insertion_sort(run: &mut [(u64, u32)]) {
    for i in 1..run.len() {
        let x = run[i];
        let mut j = i;
        while j > 0 && run[j - 1].0 > x.0 {
            run[j] = run[j - 1];
            j -= 1;
        }
        run[j] = x;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::splitmix64;

    /// What `sort_indexed` must produce.
    fn reference(keys: &[u64]) -> Vec<(u64, u32)> {
        let mut v: Vec<(u64, u32)> = keys.iter().enumerate().map(|(i, k)| (*k, i as u32)).collect();
        v.sort_unstable();
        v
    }

    fn check(keys: &[u64], what: &str) {
        let (mut counts, mut out) = (Vec::new(), vec![(7, 7)]);
        sort_indexed(keys, &mut counts, &mut out);
        assert_eq!(out.len(), keys.len(), "{what}");
        assert!(out == reference(keys), "{what}: differs from sort_unstable");
    }

    #[test]
    fn sorts_like_sort_unstable_on_hashed_keys() {
        for n in [0usize, 1, 2, 255, 256, 257, 1000, 33_497, 100_000] {
            let keys: Vec<u64> = (0..n as u64).map(|i| splitmix64(i ^ 0xA5)).collect();
            check(&keys, &format!("{n} hashed keys"));
        }
        // Hashed ids drawn with repeats (a Zipf-like skew: many small ids).
        let keys: Vec<u64> = (0..50_000u64).map(|i| splitmix64(splitmix64(i) % (1 + i % 977))).collect();
        check(&keys, "hashed keys with repeats");
    }

    #[test]
    fn sorts_adversarial_keys() {
        let n = 5000u64;
        let cases: Vec<(&str, Vec<u64>)> = vec![
            ("all equal", vec![42; n as usize]),
            ("all u64::MAX - 1", vec![u64::MAX - 1; n as usize]),
            ("small integers, descending", (0..n).rev().collect()),
            ("0 and u64::MAX - 1 alternating", (0..n).map(|i| if i % 2 == 0 { 0 } else { u64::MAX - 1 }).collect()),
            ("one outlier above many zeros", (0..n).map(|i| if i == n / 2 { u64::MAX - 1 } else { 0 }).collect()),
            ("clustered in the low bits", (0..n).map(|i| (1 << 40) + splitmix64(i) % 64).collect()),
            ("same high bits, differing low bits", (0..n).map(|i| 0xFFFF_0000_0000_0000 | (splitmix64(i) & 0xFFFF)).collect()),
            ("multiples of 2^48", (0..n).map(|i| (splitmix64(i) % 65_536) << 48).collect()),
            ("two values only", (0..n).map(|i| 7 + (i % 2)).collect()),
        ];
        for (what, keys) in &cases {
            check(keys, what);
        }
        // Extremes survive a large, mixed input.
        let mut keys: Vec<u64> = (0..10_000u64).map(splitmix64).collect();
        keys.extend([0, u64::MAX - 1, u64::MAX - 1, 0, 1]);
        check(&keys, "hashed keys with 0 and u64::MAX - 1");
    }

    #[test]
    fn reuses_its_scratch() {
        let (mut counts, mut out) = (Vec::new(), Vec::new());
        for round in 0..4u64 {
            let keys: Vec<u64> = (0..(3000 >> round)).map(|i| splitmix64(i + 1000 * round)).collect();
            sort_indexed(&keys, &mut counts, &mut out);
            assert!(out == reference(&keys), "round {round}");
        }
    }
}
