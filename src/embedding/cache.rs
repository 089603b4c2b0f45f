//! The host side of the GPU hot-row cache (issue 30): which keys' rows a rank keeps in
//! its device's memory, and in which slot ([`CacheDirectory`]).
//!
//! The host table stays the source of truth (write-through): the leader updates every row
//! as without a cache, and each rank applies the same merged gradients to the rows it
//! caches with the same arithmetic, so a cached row always equals the host's. The
//! directory only decides:
//!
//! - **Staging** ([`CacheDirectory::plan`]): for each unique key of a batch, a *source*
//!   (one `u32`): its cache slot, or [`MISS`] | its index among the batch's misses. Only the
//!   misses are looked up from the host table and uploaded; a gather kernel builds the
//!   input from the cache or the staged misses.
//! - **Updates** ([`CacheDirectory::select_cached`]): the entries of a merged gradient list
//!   whose keys are cached, with their slots.
//! - **Refresh** ([`CacheDirectory::refresh`]): every `--gpu-cache-refresh` steps, the
//!   `capacity` keys of highest score, where a key's score is its occurrences in this
//!   rank's batches since the last refresh plus half its score at that refresh (a decayed
//!   window: a key seen in no batch of an interval loses half its score; only keys seen in
//!   the last interval or cached are candidates, so memory is bounded by one interval's
//!   keys). Ties go to the smaller key, so every run chooses the same. Only keys the
//!   caller says are live in the table are chosen (`--admit-after`). Keys that stay keep
//!   their slot; keys entering take the slots freed, to be read (row and optimizer state)
//!   from the host table and uploaded by the caller; keys leaving need no write-back.
//!
//! [`CacheCounters`] holds what the cache did: hit rate, bytes moved each way, rows
//! refreshed. The byte counters are counted where the transfers happen (the caller's
//! [`CacheCounters::uploaded`] / [`CacheCounters::downloaded`]).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::format::OptimizerKind;

/// Marks a source that is not a cache slot: the low 31 bits are the key's index among the
/// batch's misses ([`StagingPlan::misses`]).
pub const MISS: u32 = crate::device::CACHE_MISS;

/// The default `--gpu-cache-refresh`: steps between two refreshes of the cache's keys.
pub const DEFAULT_REFRESH_STEPS: u64 = 50;

/// Device bytes one cache slot takes: the row (`dim` f32) and its optimizer state (row-wise
/// Adagrad's accumulator: one f32; SGD: none).
pub fn slot_bytes(dim: usize, optimizer: OptimizerKind) -> u64 {
    let state = match optimizer {
        OptimizerKind::Sgd => 0,
        OptimizerKind::Adagrad => 1,
    };
    4 * (dim as u64 + state)
}

/// Slots that fit in `bytes` of device memory (see [`slot_bytes`]), at most [`MISS`] - 1.
pub fn slots_for_bytes(bytes: u64, dim: usize, optimizer: OptimizerKind) -> usize {
    (bytes / slot_bytes(dim, optimizer).max(1)).min(MISS as u64 - 1) as usize
}

/// A cheap hasher for table keys (splitmix64 of the key): the directory is on the step's
/// path, and keys are not chosen by an adversary who could gain from collisions here.
#[derive(Default)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        crate::hash::splitmix64(self.0)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, k: u64) {
        self.0 = k;
    }
}

/// A map keyed by table keys, hashed with [`KeyHasher`].
pub type KeyMap<V> = HashMap<u64, V, BuildHasherDefault<KeyHasher>>;

/// Where the rows of a batch's unique keys come from ([`CacheDirectory::plan`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StagingPlan {
    /// Per unique key: its cache slot, or [`MISS`] | its index in `misses`.
    pub source: Vec<u32>,
    /// The keys not cached, in the batch's key order: look these up into staging.
    pub misses: Vec<u64>,
    /// Unique keys found in the cache.
    pub hits: usize,
}

/// What [`CacheDirectory::refresh`] changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Refresh {
    /// Keys entering the cache and their slots, by key: read each one's row and optimizer
    /// state from the host table into its slot.
    pub entering: Vec<(u64, u32)>,
    /// Keys that left (their slots are reused or empty now).
    pub left: usize,
}

/// What a rank's cache did over a run (sums; ratios by the methods).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct CacheCounters {
    /// Samples of the batches planned.
    pub samples: u64,
    /// Unique keys of the batches planned.
    pub unique_keys: u64,
    /// Of those, the keys found in the cache.
    pub hits: u64,
    /// Bytes the step copied to the device (every upload: batch arrays, missed rows, update
    /// rows, refreshed rows).
    pub bytes_uploaded: u64,
    /// Bytes the step copied from the device.
    pub bytes_downloaded: u64,
    /// Rows read from the host table into the cache by refreshes.
    pub rows_refreshed: u64,
    /// Refreshes done.
    pub refreshes: u64,
}

impl CacheCounters {
    /// Unique keys found in the cache / unique keys (0 before any batch).
    pub fn hit_rate(&self) -> f64 {
        self.hits as f64 / (self.unique_keys.max(1)) as f64
    }

    /// Bytes uploaded per sample.
    pub fn uploaded_per_sample(&self) -> f64 {
        self.bytes_uploaded as f64 / self.samples.max(1) as f64
    }

    /// Bytes downloaded per sample.
    pub fn downloaded_per_sample(&self) -> f64 {
        self.bytes_downloaded as f64 / self.samples.max(1) as f64
    }

    /// Counts an upload of `bytes`.
    pub fn uploaded(&mut self, bytes: usize) {
        self.bytes_uploaded += bytes as u64;
    }

    /// Counts a download of `bytes`.
    pub fn downloaded(&mut self, bytes: usize) {
        self.bytes_downloaded += bytes as u64;
    }

    /// Adds `o`'s counts to these.
    pub fn add(&mut self, o: &CacheCounters) {
        self.samples += o.samples;
        self.unique_keys += o.unique_keys;
        self.hits += o.hits;
        self.bytes_uploaded += o.bytes_uploaded;
        self.bytes_downloaded += o.bytes_downloaded;
        self.rows_refreshed += o.rows_refreshed;
        self.refreshes += o.refreshes;
    }

    /// The counts since `earlier` (an older copy of these).
    pub fn since(&self, earlier: &CacheCounters) -> CacheCounters {
        CacheCounters {
            samples: self.samples - earlier.samples,
            unique_keys: self.unique_keys - earlier.unique_keys,
            hits: self.hits - earlier.hits,
            bytes_uploaded: self.bytes_uploaded - earlier.bytes_uploaded,
            bytes_downloaded: self.bytes_downloaded - earlier.bytes_downloaded,
            rows_refreshed: self.rows_refreshed - earlier.rows_refreshed,
            refreshes: self.refreshes - earlier.refreshes,
        }
    }
}

/// The key -> slot directory of one rank's hot-row cache, its key frequencies and its
/// counters (see the module docs).
#[derive(Debug)]
pub struct CacheDirectory {
    capacity: usize,
    /// Cached key -> its slot.
    slot_of: KeyMap<u32>,
    /// Per slot: its key and score at the last refresh (`None`: empty).
    slots: Vec<Option<(u64, f64)>>,
    /// Occurrences of each key in the batches since the last refresh.
    window: KeyMap<u64>,
    counters: CacheCounters,
}

impl CacheDirectory {
    /// An empty directory of `capacity` slots (0: no cache, every key misses).
    pub fn new(capacity: usize) -> CacheDirectory {
        let capacity = capacity.min(MISS as usize - 1);
        CacheDirectory { capacity, slot_of: KeyMap::default(), slots: vec![None; capacity], window: KeyMap::default(), counters: CacheCounters::default() }
    }

    /// Its number of slots.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Keys cached now.
    pub fn len(&self) -> usize {
        self.slot_of.len()
    }

    /// Whether no key is cached.
    pub fn is_empty(&self) -> bool {
        self.slot_of.is_empty()
    }

    /// The slot of `key`, if cached.
    pub fn slot(&self, key: u64) -> Option<u32> {
        self.slot_of.get(&key).copied()
    }

    /// Every cached key with its slot, by slot.
    pub fn entries(&self) -> Vec<(u64, u32)> {
        self.slots.iter().enumerate().filter_map(|(s, e)| e.map(|(k, _)| (k, s as u32))).collect()
    }

    /// The counters so far.
    pub fn counters(&self) -> &CacheCounters {
        &self.counters
    }

    /// The counters, to count transfers where they happen.
    pub fn counters_mut(&mut self) -> &mut CacheCounters {
        &mut self.counters
    }

    /// Records a batch's keys for the next refresh: its unique keys `uniq` and `inverse`
    /// (each sample field's index in `uniq`), so each key counts its occurrences. Nothing
    /// is recorded without slots.
    pub fn observe(&mut self, uniq: &[u64], inverse: &[u32]) {
        if self.capacity == 0 {
            return;
        }
        let mut counts = vec![0u64; uniq.len()];
        for i in inverse {
            if let Some(c) = counts.get_mut(*i as usize) {
                *c += 1;
            }
        }
        for (k, c) in uniq.iter().zip(counts) {
            *self.window.entry(*k).or_insert(0) += c;
        }
    }

    /// Maps each of a batch's unique keys `uniq` (of `samples` samples) to its source
    /// (into `plan`, reused) and counts the batch, its unique keys and hits.
    pub fn plan(&mut self, uniq: &[u64], samples: usize, plan: &mut StagingPlan) {
        plan.source.clear();
        plan.misses.clear();
        plan.source.reserve(uniq.len());
        for k in uniq {
            match self.slot_of.get(k) {
                Some(s) => plan.source.push(*s),
                None => {
                    plan.source.push(MISS | plan.misses.len() as u32);
                    plan.misses.push(*k);
                }
            }
        }
        plan.hits = uniq.len() - plan.misses.len();
        self.counters.samples += samples as u64;
        self.counters.unique_keys += uniq.len() as u64;
        self.counters.hits += plan.hits as u64;
    }

    /// The entries of the key list `keys` (a merged gradient list) whose keys are cached:
    /// their indices in `keys` into `at` and their slots into `slots` (both cleared first),
    /// in list order.
    pub fn select_cached(&self, keys: &[u64], at: &mut Vec<u32>, slots: &mut Vec<u32>) {
        at.clear();
        slots.clear();
        if self.slot_of.is_empty() {
            return;
        }
        for (i, k) in keys.iter().enumerate() {
            if let Some(s) = self.slot_of.get(k) {
                at.push(i as u32);
                slots.push(*s);
            }
        }
    }

    /// Chooses the cached keys anew (see the module docs): the `capacity` keys of highest
    /// score among those seen since the last refresh and those cached, keeping only keys
    /// for which `live` is true; clears the window. Returns the keys entering with their
    /// slots, and counts them as rows refreshed.
    pub fn refresh(&mut self, mut live: impl FnMut(u64) -> bool) -> Refresh {
        if self.capacity == 0 {
            return Refresh::default();
        }
        let mut window = std::mem::take(&mut self.window);
        let mut candidates: Vec<(u64, f64)> = Vec::with_capacity(window.len() + self.slot_of.len());
        for (k, s) in self.slots.iter().flatten() {
            let seen = window.remove(k).unwrap_or(0);
            candidates.push((*k, seen as f64 + s / 2.0));
        }
        candidates.extend(window.drain().map(|(k, c)| (k, c as f64)));
        self.window = window;
        let by_score = |a: &(u64, f64), b: &(u64, f64)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        // The best `capacity` live keys: candidates in score order, partially sorted.
        let mut chosen: Vec<(u64, f64)> = Vec::with_capacity(self.capacity);
        let mut rest = &mut candidates[..];
        while chosen.len() < self.capacity && !rest.is_empty() {
            let take = (self.capacity - chosen.len()).min(rest.len());
            if take < rest.len() {
                rest.select_nth_unstable_by(take - 1, by_score);
            }
            let (head, tail) = rest.split_at_mut(take);
            head.sort_unstable_by(by_score);
            chosen.extend(head.iter().filter(|(k, _)| live(*k)).copied());
            rest = tail;
        }
        let keep: KeyMap<f64> = chosen.iter().copied().collect();
        // Keys that stay keep their slot (with their new score); the others leave.
        let mut left = 0;
        for e in self.slots.iter_mut() {
            if let Some((k, s)) = e {
                match keep.get(k) {
                    Some(new) => *s = *new,
                    None => {
                        self.slot_of.remove(k);
                        *e = None;
                        left += 1;
                    }
                }
            }
        }
        let mut entering: Vec<(u64, f64)> = chosen.into_iter().filter(|(k, _)| !self.slot_of.contains_key(k)).collect();
        entering.sort_unstable_by_key(|(k, _)| *k);
        let mut free = self.slots.iter().enumerate().filter(|(_, e)| e.is_none()).map(|(s, _)| s).collect::<Vec<_>>().into_iter();
        let mut out = Vec::with_capacity(entering.len());
        for (k, score) in entering {
            let Some(s) = free.next() else { break };
            self.slots[s] = Some((k, score));
            self.slot_of.insert(k, s as u32);
            out.push((k, s as u32));
        }
        self.counters.rows_refreshed += out.len() as u64;
        self.counters.refreshes += 1;
        Refresh { entering: out, left }
    }

    /// Empties the cache (its window is kept): after something changed rows behind its
    /// back, the next refresh reloads every key it chooses.
    pub fn clear(&mut self) {
        self.slot_of.clear();
        self.slots.iter_mut().for_each(|e| *e = None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_row_and_its_optimizer_state() {
        assert_eq!(slot_bytes(16, OptimizerKind::Sgd), 64);
        assert_eq!(slot_bytes(16, OptimizerKind::Adagrad), 68);
        assert_eq!(slots_for_bytes(1 << 20, 16, OptimizerKind::Sgd), 16384);
        assert_eq!(slots_for_bytes(0, 16, OptimizerKind::Adagrad), 0);
    }

    #[test]
    fn an_empty_cache_misses_every_key_in_order() {
        let mut d = CacheDirectory::new(0);
        let mut p = StagingPlan::default();
        d.observe(&[5, 7], &[0, 1, 1]);
        d.plan(&[5, 7, 9], 3, &mut p);
        assert_eq!(p.source, vec![MISS, MISS | 1, MISS | 2]);
        assert_eq!(p.misses, vec![5, 7, 9]);
        assert_eq!(d.refresh(|_| true), Refresh::default());
        assert_eq!(d.counters().hit_rate(), 0.0);
    }

    #[test]
    fn refresh_keeps_the_most_frequent_live_keys_and_their_slots() {
        let mut d = CacheDirectory::new(2);
        // 3 occurs 3 times, 1 twice, 2 once: 3 and 1 enter, by key.
        d.observe(&[1, 2, 3], &[0, 2, 1, 2, 0, 2]);
        let r = d.refresh(|_| true);
        assert_eq!(r.entering, vec![(1, 0), (3, 1)]);
        assert_eq!((d.slot(1), d.slot(3), d.slot(2)), (Some(0), Some(1), None));
        // Next interval: 2 seen 3 times; 3 once (score 1 + 3/2 = 2.5); 1 unseen (2/2 = 1):
        // 1 leaves, 2 takes its slot, 3 stays in its own.
        d.observe(&[2, 3], &[0, 0, 0, 1]);
        let r = d.refresh(|_| true);
        assert_eq!((r.entering, r.left), (vec![(2, 0)], 1));
        assert_eq!((d.slot(2), d.slot(3), d.slot(1)), (Some(0), Some(1), None));
        // A key the table does not hold (not admitted) is never cached.
        d.observe(&[8], &[0, 0, 0, 0, 0, 0, 0]);
        let r = d.refresh(|k| k != 8);
        assert!(r.entering.is_empty() && d.slot(8).is_none());
        assert_eq!(d.counters().rows_refreshed, 3);
        assert_eq!(d.counters().refreshes, 3);
    }

    #[test]
    fn ties_go_to_the_smaller_key() {
        let mut d = CacheDirectory::new(3);
        d.observe(&[40, 10, 30, 20], &[0, 1, 2, 3]);
        let r = d.refresh(|_| true);
        assert_eq!(r.entering, vec![(10, 0), (20, 1), (30, 2)]);
    }

    #[test]
    fn plans_sources_and_counts_hits() {
        let mut d = CacheDirectory::new(4);
        d.observe(&[10, 20], &[0, 1]);
        d.refresh(|_| true);
        let mut p = StagingPlan::default();
        d.plan(&[5, 10, 15, 20], 8, &mut p);
        assert_eq!(p.source, vec![MISS, 0, MISS | 1, 1]);
        assert_eq!(p.misses, vec![5, 15]);
        assert_eq!(p.hits, 2);
        let c = d.counters();
        assert_eq!((c.samples, c.unique_keys, c.hits, c.hit_rate()), (8, 4, 2, 0.5));
        let (mut at, mut slots) = (Vec::new(), Vec::new());
        d.select_cached(&[1, 10, 11, 20], &mut at, &mut slots);
        assert_eq!((at, slots), (vec![1, 3], vec![0, 1]));
    }

    #[test]
    fn large_refreshes_choose_the_same_keys_as_a_full_sort() {
        let mut rng = crate::hash::Stream(7);
        let mut d = CacheDirectory::new(100);
        let keys: Vec<u64> = (0..1000).collect();
        let inverse: Vec<u32> = (0..20_000).map(|_| (rng.below(1000) * rng.below(1000) / 1000) as u32).collect();
        d.observe(&keys, &inverse);
        let mut counts = vec![0u64; 1000];
        inverse.iter().for_each(|i| counts[*i as usize] += 1);
        let mut want: Vec<(u64, u64)> = keys.iter().map(|k| (*k, counts[*k as usize])).filter(|(k, _)| k % 3 != 0).collect();
        want.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut want: Vec<u64> = want.into_iter().take(100).map(|(k, _)| k).collect();
        want.sort_unstable();
        let r = d.refresh(|k| k % 3 != 0);
        assert_eq!(r.entering.iter().map(|(k, _)| *k).collect::<Vec<_>>(), want);
    }
}
