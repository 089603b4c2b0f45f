//! Admission of new keys (`--admit-after K`, Monolith's frequency filter): a key without a
//! row gets one only in the K-th update batch that holds it; until then it reads its
//! deterministic initial row and its gradient is dropped (counted as `refused`).
//!
//! The batches a key was in are counted in a **count-min sketch** kept in the table file
//! (its `sketch` section, so it is host-shared, copied by growth and saved with every
//! checkpoint): [`DEPTH`] rows of `width` u8 counters (a power of two), row `i` indexed by
//! the high bits of `splitmix64(key + (i + 1) * golden)`. A batch counts a key without a
//! row once, with the *conservative update*: the new estimate is `min_i c_i + 1`, and only
//! the counters below it are raised to it. The estimate never undercounts, so a key is
//! never admitted late; a key whose counters all collide with others' may be admitted
//! early (the fraction grows with distinct keys / width). Its memory is fixed at creation
//! (`depth x width` bytes, reported by `inspect` and the training summary) whatever the
//! number of keys; a count stays after its key is admitted, so a key that expiry or
//! eviction removed is admitted again at once.

use super::error::{TableError, TableResult};
use super::format::{check_sketch, MAX_ADMIT_AFTER, MAX_SKETCH_WIDTH, MIN_SKETCH_WIDTH};
use crate::hash::{splitmix64, GOLDEN};

/// Rows (independent hashes) of a sketch.
pub const DEPTH: u32 = 4;
/// Bytes of a sketch unless configured (`--admit-sketch-mib 16`): 4 rows of 4 Mi counters.
pub const DEFAULT_SKETCH_BYTES: u64 = 16 << 20;

/// The sketch (depth, width) of a table admitting keys after `admit_after` batches within
/// `bytes`: none for `admit_after` 1, else [`DEPTH`] rows of the largest power-of-two width
/// that fits.
pub fn shape(admit_after: u32, bytes: u64) -> TableResult<(u32, u64)> {
    if !(1..=MAX_ADMIT_AFTER).contains(&admit_after) {
        return Err(TableError::Config(format!("--admit-after {admit_after} must be in 1..={MAX_ADMIT_AFTER} (1: every key gets a row at once)")));
    }
    if admit_after == 1 {
        return Ok((0, 0));
    }
    let per_row = (bytes / DEPTH as u64).min(MAX_SKETCH_WIDTH);
    if per_row < MIN_SKETCH_WIDTH {
        return Err(TableError::Config(format!("an admission sketch of {bytes} bytes (--admit-sketch-mib) is too small: it needs at least {} bytes ({DEPTH} rows of {MIN_SKETCH_WIDTH} counters)", DEPTH as u64 * MIN_SKETCH_WIDTH)));
    }
    let width = 1u64 << (63 - per_row.leading_zeros());
    check_sketch(DEPTH, width, admit_after).map_err(TableError::Config)?;
    Ok((DEPTH, width))
}

/// Counter of `key` in row `row` of a sketch of `width` counters per row (a power of two).
#[inline(always)]
fn cell(key: u64, row: u32, width: u64) -> usize {
    let h = splitmix64(key.wrapping_add((row as u64 + 1).wrapping_mul(GOLDEN)));
    (row as u64 * width + (h >> (64 - width.trailing_zeros()))) as usize
}

/// How many batches held `key` so far, as the sketch `cells` (`depth` rows of `width`)
/// estimates it: never less than the truth.
pub fn estimate(cells: &[u8], depth: u32, width: u64, key: u64) -> u8 {
    (0..depth).map(|r| cells.get(cell(key, r, width)).copied().unwrap_or(u8::MAX)).min().unwrap_or(u8::MAX)
}

/// Counts one more batch holding `key` (conservative update, saturating at 255) and
/// returns the new estimate.
pub fn bump(cells: &mut [u8], depth: u32, width: u64, key: u64) -> u8 {
    let n = estimate(cells, depth, width, key).saturating_add(1);
    for r in 0..depth {
        if let Some(c) = cells.get_mut(cell(key, r, width)) {
            *c = (*c).max(n);
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_round_down_to_powers_of_two() {
        assert_eq!(shape(1, 1 << 20).unwrap(), (0, 0));
        assert_eq!(shape(2, 16 << 20).unwrap(), (4, 4 << 20));
        assert_eq!(shape(2, (16 << 20) - 1).unwrap(), (4, 2 << 20));
        assert_eq!(shape(3, 256).unwrap(), (4, 64));
        assert!(shape(2, 255).unwrap_err().to_string().contains("too small"));
        assert!(shape(0, 1 << 20).is_err());
        assert!(shape(256, 1 << 20).unwrap_err().to_string().contains("1..=255"));
    }

    #[test]
    fn counts_never_undercount_and_are_exact_without_collisions() {
        let (d, w) = (DEPTH, 1 << 16);
        let mut cells = vec![0u8; (d as u64 * w) as usize];
        let keys: Vec<u64> = (0..2000u64).map(|i| i * 7919 + 3).collect();
        for round in 1..=3u8 {
            for k in keys.iter().skip(round as usize * 500) {
                bump(&mut cells, d, w, *k);
            }
        }
        for (i, k) in keys.iter().enumerate() {
            let truth = ((i / 500).min(3)) as u8;
            let e = estimate(&cells, d, w, *k);
            assert!(e >= truth, "key {k}: estimate {e} < {truth}");
            // 2000 keys in 65536 counters per row: a 4-way collision is (2000/65536)^4.
            assert_eq!(e, truth, "key {k}");
        }
        let mut one = vec![0u8; 4 * 64];
        for _ in 0..300 {
            bump(&mut one, 4, 64, 5);
        }
        assert_eq!(estimate(&one, 4, 64, 5), 255, "saturates");
    }
}
