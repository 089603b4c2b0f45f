//! Which rows each rank trains on: epoch order, global batches, per-rank slices, the
//! train/test split.
//!
//! Results must not depend on the number of ranks for the same global batch, so batches are
//! defined globally and then cut among ranks:
//!
//! ```text
//! order  = epoch_order(train.len(), epoch, Some(seed))     // same on every rank
//! for step in 0..steps_per_epoch(train.len(), global_batch):
//!     batch = global_batch_range(step, global_batch, train.len())   // positions in `order`
//!     mine  = rank_slice(batch, rank, size)
//!     rows  = order[mine].map(|p| train.start + p)          // this rank's rows
//! ```
//!
//! Every row of `train` is used exactly once per epoch: the global batches tile `0..n`
//! (the last one may be short) and the rank slices tile each batch (a rank's slice may be
//! empty when a batch has fewer rows than ranks). For the averaged gradient to equal the
//! one-rank gradient, divide each rank's gradient *sum* by the global batch length, not by
//! its own slice length.

use std::ops::Range;

use super::error::{DataError, DataResult};
use crate::hash::{splitmix64, Stream};

/// Global batches in an epoch of `n_rows` rows, counting the last, partial one.
/// Panics when `global_batch` is 0.
pub fn steps_per_epoch(n_rows: usize, global_batch: usize) -> usize {
    assert!(global_batch > 0, "the global batch must hold at least one row");
    n_rows.div_ceil(global_batch)
}

/// Positions (into the epoch order) of global batch `step_in_epoch`: `global_batch` of
/// them, fewer for the last batch, none past the end of the epoch.
/// Panics when `global_batch` is 0.
pub fn global_batch_range(step_in_epoch: usize, global_batch: usize, n_rows: usize) -> Range<usize> {
    assert!(global_batch > 0, "the global batch must hold at least one row");
    let start = step_in_epoch.saturating_mul(global_batch).min(n_rows);
    let end = start.saturating_add(global_batch).min(n_rows);
    start..end
}

/// The contiguous part of `range` that rank `rank` of `size` takes: lengths differ by at
/// most one (the first `len % size` ranks take one more), slices are disjoint, in rank
/// order, and their union is `range`. Panics when `rank >= size`.
pub fn rank_slice(range: Range<usize>, rank: usize, size: usize) -> Range<usize> {
    assert!(rank < size, "rank {rank} is not below the number of ranks {size}");
    let len = range.end.saturating_sub(range.start);
    let (base, rem) = (len / size, len % size);
    let start = range.start + rank * base + rank.min(rem);
    start..start + base + usize::from(rank < rem)
}

/// The order in which epoch `epoch` visits rows `0..n_rows`: a Fisher-Yates shuffle seeded
/// by `(seed, epoch)`, the same on every rank and every platform; the identity when `seed`
/// is `None` (shuffling off). Row numbers are u32 (4 bytes a row), so `n_rows` may be at
/// most 2^32.
pub fn epoch_order(n_rows: usize, epoch: u64, seed: Option<u64>) -> DataResult<Vec<u32>> {
    if n_rows as u64 > u32::MAX as u64 + 1 {
        return Err(DataError::InvalidArgument(format!("{n_rows} rows: an epoch order holds at most 2^32 rows; split the data into several files")));
    }
    let mut order: Vec<u32> = (0..n_rows).map(|i| i as u32).collect();
    if let Some(seed) = seed {
        let mut rng = Stream(splitmix64(seed ^ splitmix64(epoch)));
        for i in (1..n_rows).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            order.swap(i, j);
        }
    }
    Ok(order)
}

/// Splits `0..n_rows` into `(train, test)`: the last `round(n_rows * test_fraction)` rows
/// are held out ("90/10 split" is `test_fraction = 0.1`). `test_fraction` must be in [0, 1].
pub fn split(n_rows: usize, test_fraction: f64) -> DataResult<(Range<usize>, Range<usize>)> {
    if !(0.0..=1.0).contains(&test_fraction) {
        return Err(DataError::InvalidArgument(format!("test fraction {test_fraction} is not between 0 and 1")));
    }
    let test = ((n_rows as f64 * test_fraction).round() as usize).min(n_rows);
    let cut = n_rows - test;
    Ok((0..cut, cut..n_rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_tile_the_batch() {
        for len in 0..20 {
            for size in 1..7 {
                let r = 5..5 + len;
                let mut next = r.start;
                for rank in 0..size {
                    let s = rank_slice(r.clone(), rank, size);
                    assert_eq!(s.start, next);
                    assert!(s.len() == len / size || s.len() == len / size + 1);
                    next = s.end;
                }
                assert_eq!(next, r.end);
            }
        }
        assert_eq!(rank_slice(0..10, 0, 4), 0..3);
        assert_eq!(rank_slice(0..10, 1, 4), 3..6);
        assert_eq!(rank_slice(0..10, 2, 4), 6..8);
        assert_eq!(rank_slice(0..10, 3, 4), 8..10);
    }

    #[test]
    fn batches_tile_the_epoch() {
        assert_eq!(steps_per_epoch(10, 4), 3);
        assert_eq!(global_batch_range(0, 4, 10), 0..4);
        assert_eq!(global_batch_range(2, 4, 10), 8..10);
        assert_eq!(global_batch_range(3, 4, 10), 10..10);
        assert_eq!(global_batch_range(usize::MAX, 4, 10), 10..10);
    }

    #[test]
    fn order_is_a_deterministic_permutation() {
        let a = epoch_order(1000, 3, Some(7)).unwrap();
        assert_eq!(a, epoch_order(1000, 3, Some(7)).unwrap());
        assert_ne!(a, epoch_order(1000, 4, Some(7)).unwrap());
        assert_ne!(a, epoch_order(1000, 3, Some(8)).unwrap());
        let mut s = a.clone();
        s.sort_unstable();
        assert_eq!(s, (0..1000).collect::<Vec<u32>>());
        assert_eq!(epoch_order(5, 0, None).unwrap(), vec![0, 1, 2, 3, 4]);
        assert!(epoch_order(0, 0, Some(1)).unwrap().is_empty());
        // Pinned, so a change of the shuffle (which would change every run) is noticed.
        assert_eq!(epoch_order(8, 0, Some(42)).unwrap(), PINNED_ORDER.to_vec());
    }

    const PINNED_ORDER: [u32; 8] = [3, 7, 2, 5, 0, 1, 6, 4];

    #[test]
    fn split_is_last_fraction() {
        assert_eq!(split(100, 0.1).unwrap(), (0..90, 90..100));
        assert_eq!(split(10, 0.0).unwrap(), (0..10, 10..10));
        assert_eq!(split(10, 1.0).unwrap(), (0..0, 0..10));
        assert_eq!(split(7, 0.5).unwrap(), (0..3, 3..7));
        assert!(split(10, 1.5).is_err());
        assert!(split(10, f64::NAN).is_err());
    }
}
