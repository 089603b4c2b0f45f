//! The per-rank dedupe: a rank's batch (keys with repeats, one row each) becomes its sparse
//! list (distinct keys in increasing order, each with the sum of its rows in input order).
//!
//! Two passes over the batch. The first gives every key the index of its distinct key
//! (first-seen order) through an open-addressing table, then the distinct keys are sorted
//! ([`radix`]: hashed keys sort in two linear passes). The second writes each row straight
//! into its sorted place (copied on a key's first occurrence, added afterwards): into a
//! [`SparseList`], or into a serialized list where it lies (the host's shared segment), so
//! the list is written once. Two passes rather than one because the second knows every
//! row's place in advance and prefetches it; a one-pass sum waits on each row it adds to.

use super::error::{SparseError, SparseResult};
use super::list::{self, check_input, SparseList};
use super::merge::add_row;
use super::radix;
use crate::embedding::init::home_slot;
use crate::embedding::EMPTY_KEY;

/// How many keys ahead the dedupe prefetches hash slots and rows.
const PREFETCH_AHEAD: usize = 8;

/// Hints the CPU to fetch the cache line of `v[i]` (nothing when `i` is out of bounds or
/// on other architectures).
#[inline(always)]
fn prefetch<T>(v: &[T], i: usize) {
    #[cfg(target_arch = "x86_64")]
    if i < v.len() {
        let p = v.as_ptr().wrapping_add(i) as *const i8;
        // SAFETY: a prefetch is a hint that never faults; `p` points into `v` anyway.
        unsafe { std::arch::x86_64::_mm_prefetch(p, std::arch::x86_64::_MM_HINT_T0) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (v, i);
}

/// Sums the rows of repeated keys of one rank's batch (in the order they appear) and sorts
/// by key. Keeps its hash table and buffers between calls, the table sized from the
/// previous batch's distinct keys (batches of one job look alike), so it stays cache-sized
/// and nothing is allocated.
///
/// [`Deduper::run_into`] does it all; the exchange splits it in two: [`Deduper::index`]
/// (which tells the list's size), then, once a place for it is ready, [`Deduper::encode_to`]
/// (or [`Deduper::write_list`]).
#[derive(Debug, Default)]
pub struct Deduper {
    /// Open-addressing table: per slot, a key (`EMPTY_KEY` = free) and its index into
    /// `unique`, side by side so a probe touches one cache line.
    slots: Vec<[u64; 2]>,
    /// Distinct keys in first-seen order, and the slot each one sits in.
    unique: Vec<u64>,
    unique_slot: Vec<u32>,
    /// Per input key: the index of its distinct key.
    index: Vec<u32>,
    /// The distinct keys in key order, each with its first-seen index.
    order: Vec<(u64, u32)>,
    /// The key sort's scratch.
    buckets: Vec<u32>,
    /// Per distinct key (first-seen order): its place in key order.
    place: Vec<u32>,
    /// Values per row of the last batch.
    dim: usize,
    /// The last batch's list, where it cannot be serialized in place.
    scratch: SparseList,
}

impl Deduper {
    /// A deduper with no memory reserved yet.
    pub fn new() -> Deduper {
        Deduper::default()
    }

    /// One row per distinct key of `keys` (sum of its rows, in input order), sorted by key,
    /// every count 1. Fails on a bad shape or the reserved key.
    pub fn run(&mut self, keys: &[u64], grads: &[f32], dim: usize) -> SparseResult<SparseList> {
        let mut out = SparseList::empty(dim);
        self.run_into(keys, grads, dim, &mut out)?;
        Ok(out)
    }

    /// [`Deduper::run`] into `out`, reusing its memory.
    pub fn run_into(&mut self, keys: &[u64], grads: &[f32], dim: usize, out: &mut SparseList) -> SparseResult<()> {
        out.clear(dim);
        self.index(keys, grads, dim)?;
        self.write_list(grads, out)
    }

    /// The first pass over the batch: finds its distinct keys and sorts them; returns their
    /// number. [`Deduper::encode_to`] or [`Deduper::write_list`] then writes the list (given
    /// the same `grads`). Keys already sorted and distinct (a batch deduplicated upstream,
    /// [`Deduper::index_keys`]) are taken as they are, with no hashing or sorting. Fails on
    /// a bad shape or the reserved key (the deduper then holds no list).
    pub fn index(&mut self, keys: &[u64], grads: &[f32], dim: usize) -> SparseResult<usize> {
        self.dim = dim;
        if let Err(e) = check_input(keys, grads, dim) {
            self.reset(0);
            return Err(e);
        }
        if keys.windows(2).all(|w| w[0] < w[1]) {
            self.reset(0);
            self.index.extend(0..keys.len() as u32);
            self.order.extend(keys.iter().zip(0u32..).map(|(k, u)| (*k, u)));
            self.place.extend(0..keys.len() as u32);
            return Ok(keys.len());
        }
        self.index_keys(keys)
    }

    /// The key pass alone: the distinct keys of `keys` ([`Deduper::sorted_keys`]) and each
    /// key's place among them ([`Deduper::places`]); returns their number.
    pub fn index_keys(&mut self, keys: &[u64]) -> SparseResult<usize> {
        let expected = self.unique.len().min(keys.len());
        self.reset(expected);
        check_input(keys, &[], 0)?;
        if u32::try_from(keys.len()).is_err() {
            return Err(SparseError::Invalid(format!("{} keys in one batch; at most {} per step", keys.len(), u32::MAX)));
        }
        // The distinct-key index of every key (load <= 1/2).
        let mut cap = self.slots.len();
        let mut shift = 64 - cap.trailing_zeros();
        for (i, &k) in keys.iter().enumerate() {
            if let Some(next) = keys.get(i + PREFETCH_AHEAD) {
                prefetch(&self.slots, home_slot(*next, shift));
            }
            let mut s = home_slot(k, shift);
            let u = loop {
                let [sk, si] = self.slots[s];
                if sk == k {
                    break si as u32;
                }
                if sk == EMPTY_KEY {
                    let u = self.unique.len() as u32;
                    self.slots[s] = [k, u as u64];
                    self.unique.push(k);
                    self.unique_slot.push(s as u32);
                    if 2 * self.unique.len() > cap {
                        self.grow();
                        cap = self.slots.len();
                        shift = 64 - cap.trailing_zeros();
                    }
                    break u;
                }
                s = (s + 1) & (cap - 1);
            };
            self.index.push(u);
        }
        // The distinct keys in key order, and each one's place in it.
        radix::sort_indexed(&self.unique, &mut self.buckets, &mut self.order);
        self.place.resize(self.order.len(), 0);
        for (p, (_, u)) in self.order.iter().enumerate() {
            self.place[*u as usize] = p as u32;
        }
        Ok(self.order.len())
    }

    /// The distinct keys of the last batch, in key order.
    pub fn sorted_keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.order.iter().map(|(k, _)| *k)
    }

    /// Per key of the last batch, in input order: its distinct key's place in key order.
    pub fn places(&self) -> impl Iterator<Item = u32> + '_ {
        self.index.iter().map(|u| self.place[*u as usize])
    }

    /// Distinct keys of the last batch ([`Deduper::index`]).
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// True when the last batch had no keys (or failed).
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Serialized length of the last batch's list (without counts).
    pub fn encoded_len(&self) -> usize {
        list::encoded_len(self.len(), self.dim, false)
    }

    /// The second pass: serializes the last batch's list (without counts) into `out`,
    /// exactly [`Deduper::encoded_len`] bytes (a place in shared memory, say); `grads` are
    /// the batch's rows, as given to [`Deduper::index`].
    pub fn encode_to(&mut self, grads: &[f32], out: &mut [u8]) -> SparseResult<()> {
        self.check_rows(grads)?;
        if let Some((keys, _, rows)) = list::wire_sections(out, self.len(), self.dim, false)? {
            self.write_to(grads, keys, rows);
            return Ok(());
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        let written = self.write_list(grads, &mut scratch).and_then(|()| scratch.view().encode_to(false, out));
        self.scratch = scratch;
        written
    }

    /// Fails unless `grads` holds a row for every key of the last batch.
    fn check_rows(&self, grads: &[f32]) -> SparseResult<()> {
        let (keys, dim) = (self.index.len(), self.dim);
        if grads.len() != keys * dim {
            return Err(SparseError::Shape { keys, dim, expected: keys * dim, grads: grads.len() });
        }
        Ok(())
    }

    /// The second pass: the last batch's list into `out`; `grads` are the batch's rows, as
    /// given to [`Deduper::index`].
    pub fn write_list(&self, grads: &[f32], out: &mut SparseList) -> SparseResult<()> {
        self.check_rows(grads)?;
        let (m, dim) = (self.len(), self.dim);
        out.clear(dim);
        out.keys.resize(m, 0);
        out.counts.resize(m, 1);
        out.grads.resize(m * dim, 0.0);
        self.write_to(grads, &mut out.keys, &mut out.grads);
        Ok(())
    }

    /// The keys and rows of the list into `keys` and `rows` (exactly its size): each row
    /// into its sorted place, in input order. Distinct indices were handed out in first-seen
    /// order, so `u == seen` marks a key's first occurrence.
    fn write_to(&self, grads: &[f32], keys: &mut [u64], rows: &mut [f32]) {
        for (dst, (k, _)) in keys.iter_mut().zip(&self.order) {
            *dst = *k;
        }
        let dim = self.dim;
        let mut seen = 0u32;
        for (i, (u, row)) in self.index.iter().zip(grads.chunks_exact(dim.max(1))).enumerate() {
            if let Some(next) = self.index.get(i + PREFETCH_AHEAD) {
                prefetch(rows, self.place[*next as usize] as usize * dim);
            }
            let p = self.place[*u as usize] as usize;
            let dst = &mut rows[p * dim..(p + 1) * dim];
            if *u == seen {
                dst.copy_from_slice(row);
                seen += 1;
            } else {
                add_row(dst, row);
            }
        }
    }

    /// Forgets the last batch: empties the table (only the slots in use) and makes sure it
    /// has room for `2 * expected` keys.
    fn reset(&mut self, expected: usize) {
        for s in &self.unique_slot {
            self.slots[*s as usize][0] = EMPTY_KEY;
        }
        self.unique.clear();
        self.unique_slot.clear();
        self.index.clear();
        self.order.clear();
        self.place.clear();
        let cap = (2 * expected).next_power_of_two().max(1024);
        if self.slots.len() < cap {
            self.slots = vec![[EMPTY_KEY, 0]; cap];
        }
    }

    /// Doubles the table and re-inserts the distinct keys seen so far.
    fn grow(&mut self) {
        let cap = self.slots.len() * 2;
        self.slots = vec![[EMPTY_KEY, 0]; cap];
        let shift = 64 - cap.trailing_zeros();
        for (u, k) in self.unique.iter().enumerate() {
            let mut s = home_slot(*k, shift);
            while self.slots[s][0] != EMPTY_KEY {
                s = (s + 1) & (cap - 1);
            }
            self.slots[s] = [*k, u as u64];
            self.unique_slot[u] = s as u32;
        }
    }
}

/// [`Deduper::run`] with a fresh deduper.
pub fn dedupe(keys: &[u64], grads: &[f32], dim: usize) -> SparseResult<SparseList> {
    Deduper::new().run(keys, grads, dim)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::splitmix64;
    use crate::sparse::list::{view, Viewed};

    #[test]
    fn dedupe_sums_repeats_in_input_order_and_sorts() {
        let keys = [30u64, 10, 30, 20, 30];
        let grads = [1.0f32, 2.0, 10.0, 20.0, 100.0, 200.0, 5.0, 6.0, 0.5, 0.25];
        let l = dedupe(&keys, &grads, 2).unwrap();
        assert_eq!(l.keys, vec![10, 20, 30]);
        assert_eq!(l.counts, vec![1, 1, 1]);
        assert_eq!(l.grads, vec![10.0, 20.0, 5.0, 6.0, 1.0 + 100.0 + 0.5, 2.0 + 200.0 + 0.25]);
        // Order of summation is the input order: (a + b) + c, not a + (b + c).
        let big = [1e8f32, 1.0, -1e8];
        let l = dedupe(&[7, 7, 7], &big, 1).unwrap();
        assert_eq!(l.grads[0].to_bits(), ((1e8f32 + 1.0) + -1e8).to_bits());
        // Empty input and dim-0 rows.
        assert!(dedupe(&[], &[], 4).unwrap().is_empty());
        assert_eq!(dedupe(&[5, 3, 5], &[], 0).unwrap().keys, vec![3, 5]);
    }

    #[test]
    fn a_batch_deduplicated_once_upstream_gives_the_same_list() {
        let keys = [9u64, 4, 9, 7, 4, 4];
        let mut d = Deduper::new();
        assert_eq!(d.index_keys(&keys).unwrap(), 3);
        let uniq: Vec<u64> = d.sorted_keys().collect();
        assert_eq!((uniq.as_slice(), d.places().collect::<Vec<u32>>()), ([4, 7, 9].as_slice(), vec![2, 0, 2, 1, 0, 0]));
        // The per-key sums, already sorted and distinct: the exchanger's dedupe passes them on.
        let grads = [0.5f32, -1.0, 3.0];
        assert_eq!(d.index(&uniq, &grads, 1).unwrap(), 3);
        let list = d.run(&uniq, &grads, 1).unwrap();
        assert_eq!((list.keys.as_slice(), list.grads.as_slice()), (uniq.as_slice(), grads.as_slice()));
        assert!(matches!(d.index_keys(&[1, u64::MAX]), Err(SparseError::ReservedKey { .. })));
    }

    #[test]
    fn dedupe_reuses_its_table_across_batches() {
        let mut d = Deduper::new();
        for round in 0..5u64 {
            let keys: Vec<u64> = (0..1000).map(|i| (i * 7 + round) % 97).collect();
            let grads: Vec<f32> = (0..1000).map(|i| i as f32).collect();
            let l = d.run(&keys, &grads, 1).unwrap();
            assert_eq!(l.len(), 97);
            assert!(l.keys.windows(2).all(|w| w[0] < w[1]));
            let total: f32 = l.grads.iter().sum();
            assert_eq!(total, (0..1000).sum::<i32>() as f32);
        }
    }

    #[test]
    fn dedupe_rejects_bad_shape_and_reserved_key() {
        match dedupe(&[1, 2], &[0.0; 5], 2) {
            Err(e @ SparseError::Shape { keys: 2, dim: 2, expected: 4, grads: 5 }) => assert!(e.to_string().contains("keys.len() * dim"), "{e}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(dedupe(&[1, u64::MAX], &[0.0; 2], 1), Err(SparseError::ReservedKey { key: u64::MAX })));
        // A failed batch leaves no list behind.
        let mut d = Deduper::new();
        assert_eq!(d.index(&[4, 5], &[1.0, 2.0], 1).unwrap(), 2);
        assert!(d.index(&[4, u64::MAX], &[1.0, 2.0], 1).is_err());
        assert!(d.is_empty());
        // Rows of another batch than the one indexed.
        assert_eq!(d.index(&[4, 5, 4], &[1.0, 2.0, 3.0], 1).unwrap(), 2);
        assert!(matches!(d.encode_to(&[1.0, 2.0], &mut [0u8; 40]), Err(SparseError::Shape { keys: 3, .. })));
    }

    /// A batch with hot repeated keys and sums that depend on the order.
    fn zipf_like_batch(n: usize, dim: usize) -> (Vec<u64>, Vec<f32>) {
        let keys: Vec<u64> = (0..n as u64).map(|i| splitmix64(splitmix64(i) % (1 + i % 300))).collect();
        let grads: Vec<f32> = (0..n * dim).map(|i| ((i as f32) * 0.37).sin() * 1e4f32.powi((i % 3) as i32 - 1)).collect();
        (keys, grads)
    }

    #[test]
    fn dedupe_matches_a_map_of_sums_in_input_order() {
        let dim = 3;
        let (keys, grads) = zipf_like_batch(20_000, dim);
        let mut want: std::collections::BTreeMap<u64, Vec<f32>> = Default::default();
        for (k, row) in keys.iter().zip(grads.chunks_exact(dim)) {
            match want.get_mut(k) {
                Some(acc) => acc.iter_mut().zip(row).for_each(|(a, g)| *a += *g),
                None => {
                    want.insert(*k, row.to_vec());
                }
            }
        }
        let got = dedupe(&keys, &grads, dim).unwrap();
        assert_eq!(got.keys, want.keys().copied().collect::<Vec<_>>());
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got.grads), bits(&want.values().flatten().copied().collect::<Vec<_>>()));
    }

    #[test]
    fn encode_to_writes_what_encode_of_the_list_writes() {
        let dim = 4;
        let (keys, grads) = zipf_like_batch(5000, dim);
        let mut d = Deduper::new();
        let want = d.run(&keys, &grads, dim).unwrap();
        let mut encoded = Vec::new();
        want.encode_into(false, &mut encoded).unwrap();
        assert_eq!(d.index(&keys, &grads, dim).unwrap(), want.len());
        assert_eq!(d.encoded_len(), encoded.len());
        // An 8-byte aligned place (written in place) and a misaligned one (via the scratch).
        let mut words = vec![0u64; encoded.len().div_ceil(8) + 1];
        for shift in [0usize, 4] {
            let out = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut words)[shift..shift + encoded.len()];
            d.encode_to(&grads, out).unwrap();
            assert_eq!(out, &encoded[..], "shift {shift}");
        }
        let out = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..encoded.len()];
        d.encode_to(&grads, out).unwrap();
        let mut scratch = SparseList::default();
        let Viewed::List(v) = view(out, dim, 1, &mut scratch).unwrap() else { panic!("not a list") };
        assert_eq!(v.keys, &want.keys[..]);
        assert!(d.encode_to(&grads, &mut vec![0; encoded.len() + 1]).is_err());
    }
}
