//! The host side of the GPU hot-row cache (issue 30): which keys' rows a rank keeps in
//! its device's memory, and in which slot ([`CacheDirectory`]).
//!
//! In write-through the host table stays the source of truth: the leader updates every row
//! as without a cache, and each rank applies the same merged gradients to the rows it
//! caches with the same arithmetic, so a cached row always equals the host's; in write-back
//! (`train::gpu_cache`) the cached rows are the truth and are written back. The
//! directory only decides:
//!
//! - **Staging** ([`CacheDirectory::plan`]): for each unique key of a batch, a *source*
//!   (one `u32`): its cache slot, or [`MISS`] | its index among the batch's misses, and its
//!   occurrences counted for the refresh, in one hash lookup per key. Only the misses are
//!   looked up from the host table and uploaded; a gather kernel builds the input from the
//!   cache or the staged misses.
//! - **Updates** ([`CacheDirectory::select_update`]): the entries of a merged gradient list
//!   whose keys are cached, with their slots; in a world of one rank the list is the
//!   batch's own keys and the slots are the plan's sources (no lookup).
//! - **Refresh** ([`CacheDirectory::refresh`]): every `--gpu-cache-refresh` steps, the
//!   `capacity` keys of highest score, where a key's score is its occurrences in this
//!   rank's batches since the last refresh plus half its score at that refresh (a decayed
//!   window: a key seen in no batch of an interval loses half its score). Candidates are
//!   the cached keys and the keys seen at least twice in the interval or once in it and
//!   once in the interval before (admission: a key's first sighting only sets a bit, a
//!   doorkeeper, so the Zipf tail seen once is neither
//!   counted in the map nor uploaded); memory and time follow the keys cached and those
//!   candidates, not the capacity. Ties go to the smaller key, so every run chooses the
//!   same. Only keys the caller says are live in the table enter (`--admit-after`). Keys
//!   that stay keep their slot; keys entering take the lowest slots free, to be read (row
//!   and optimizer state) from the host table and uploaded by the caller (only the rows
//!   that changed slot travel); keys leaving are listed with their slots, for a write-back
//!   cache to write their rows back.
//!
//! [`CacheCounters`] holds what the cache did: hit rate, bytes moved each way, rows
//! refreshed. The byte counters are counted where the transfers happen (the caller's
//! [`CacheCounters::uploaded`] / [`CacheCounters::downloaded`]).

use super::format::{OptimizerKind, EMPTY_KEY};
use super::index::{prefetch_slot, probe};

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

impl StagingPlan {
    /// A write-back cache's step on this plan's batch: its misses' rows of `grads` (every
    /// unique key's row of `dim` values, in key order) into `sent`, and per unique key its
    /// row among those or [`crate::embedding::update::HELD`] (cached: the device steps it)
    /// into `held` (see [`crate::embedding::EmbeddingTable::apply_updates_held`]). Returns
    /// the misses, the keys of `sent`.
    pub fn split_held(&self, grads: &[f32], dim: usize, sent: &mut Vec<f32>, held: &mut Vec<u32>) -> &[u64] {
        sent.clear();
        held.clear();
        for (u, s) in self.source.iter().enumerate() {
            if s & MISS == 0 {
                held.push(super::update::HELD);
                continue;
            }
            held.push(s & !MISS);
            sent.extend_from_slice(&grads[u * dim..(u + 1) * dim]);
        }
        &self.misses
    }
}

/// What [`CacheDirectory::refresh`] changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Refresh {
    /// Keys entering the cache and their slots, by key: read each one's row and optimizer
    /// state from the host table into its slot.
    pub entering: Vec<(u64, u32)>,
    /// Keys that left (their slots are reused or empty now).
    pub left: usize,
    /// Those keys with the slots they had, by slot: a write-back cache writes their rows
    /// back (before the entering rows are put into the slots).
    pub leaving: Vec<(u64, u32)>,
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

/// How many keys ahead [`CacheDirectory::plan`] prefetches their index slots.
const PREFETCH_AHEAD: usize = 8;

/// The directory's key -> value index: open addressing with the table's own probe
/// ([`probe`]) over a power-of-two array of keys ([`EMPTY_KEY`]: free), the values beside,
/// at most half full. Between refreshes keys are only added; a refresh rebuilds it from the
/// keys it keeps, so it needs no removal.
#[derive(Debug)]
struct KeyIndex {
    keys: Vec<u64>,
    vals: Vec<u32>,
    len: usize,
    shift: u32,
}

impl KeyIndex {
    /// An empty index with room for `n` keys.
    fn with_room(n: usize) -> KeyIndex {
        let cap = (2 * n.max(1 << 12)).next_power_of_two();
        KeyIndex { keys: vec![EMPTY_KEY; cap], vals: vec![0; cap], len: 0, shift: 64 - cap.trailing_zeros() }
    }

    fn len(&self) -> usize {
        self.len
    }

    /// Where `key` is, or the free slot where it would go.
    #[inline]
    fn find(&self, key: u64) -> (usize, bool) {
        probe(&self.keys, key, self.shift).expect("the cache directory's index is at most half full")
    }

    /// Hints the CPU to fetch `key`'s home slot.
    #[inline]
    fn prefetch(&self, key: u64) {
        prefetch_slot(&self.keys, &self.vals, 1, key, self.shift);
    }

    fn get(&self, key: u64) -> Option<u32> {
        match self.find(key) {
            (i, false) => Some(self.vals[i]),
            (_, true) => None,
        }
    }

    /// The value of `key` to change in place, or `None` with the free slot for it.
    #[inline]
    fn entry(&mut self, key: u64) -> Result<&mut u32, usize> {
        match self.find(key) {
            (i, false) => Ok(&mut self.vals[i]),
            (i, true) => Err(i),
        }
    }

    /// Puts `key` (absent, [`KeyIndex::entry`] said so) with `val` into free slot `at`.
    fn insert_at(&mut self, at: usize, key: u64, val: u32) {
        self.keys[at] = key;
        self.vals[at] = val;
        self.len += 1;
        if 2 * self.len > self.keys.len() {
            let mut bigger = KeyIndex::with_room(self.keys.len());
            self.iter().for_each(|(k, v)| bigger.insert(k, v));
            *self = bigger;
        }
    }

    /// Puts `key` with `val`, replacing its value if it is there.
    fn insert(&mut self, key: u64, val: u32) {
        match self.entry(key) {
            Ok(v) => *v = val,
            Err(at) => self.insert_at(at, key, val),
        }
    }

    /// Every key and its value, in slot order.
    fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.keys.iter().zip(&self.vals).filter(|(k, _)| **k != EMPTY_KEY).map(|(k, v)| (*k, *v))
    }
}

/// Marks a directory entry that is not a slot but a candidate: the low 31 bits count its
/// occurrences since the last refresh.
const CANDIDATE: u32 = 1 << 31;

/// The first sightings of keys not in the directory in this refresh interval and the one
/// before: one bit per hashed key and interval (TinyLFU's doorkeeper, in two generations so
/// that a key seen once in each of two intervals in a row is admitted too). A key whose bit
/// is set in either was (most likely) seen before and becomes a candidate; a false positive
/// only lets a key in one sighting early. Hashed with a fixed function, so every run admits
/// the same keys.
#[derive(Debug, Default)]
struct Doorkeeper {
    now: Vec<u64>,
    before: Vec<u64>,
    mask: u64,
}

impl Doorkeeper {
    /// Bits for a cache of `capacity` slots: 8 per slot (at least 2^20, at most 2^30) per
    /// generation, none without slots.
    fn new(capacity: usize) -> Doorkeeper {
        if capacity == 0 {
            return Doorkeeper::default();
        }
        let n = (8 * capacity as u64).clamp(1 << 20, 1 << 30).next_power_of_two();
        Doorkeeper { now: vec![0; (n / 64) as usize], before: vec![0; (n / 64) as usize], mask: n - 1 }
    }

    /// Sets `key`'s bit in this interval; returns whether it was set already, in this
    /// interval or the one before.
    #[inline]
    fn test_and_set(&mut self, key: u64) -> bool {
        let h = crate::hash::splitmix64(key ^ 0x6361_6368_6564_6f6f) & self.mask;
        let (w, b) = ((h / 64) as usize, 1u64 << (h % 64));
        let was = (self.now[w] | self.before[w]) & b != 0;
        self.now[w] |= b;
        was
    }

    /// A new interval: this one's sightings become the one before's.
    fn next_interval(&mut self) {
        std::mem::swap(&mut self.now, &mut self.before);
        self.now.iter_mut().for_each(|w| *w = 0);
    }
}

/// The cached entries of a merged gradient list ([`CacheDirectory::select_update`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UpdateSelection {
    /// Indices of the cached entries in the list, in list order.
    pub at: Vec<u32>,
    /// Their slots.
    pub slots: Vec<u32>,
    /// Where every selected row is this rank's own key gradient: each one's index among
    /// the rank's unique keys (empty otherwise).
    pub own_index: Vec<u32>,
    /// Whether the list was the planned batch's own key list: entry `i` is unique key `i`,
    /// and the plan's sources are the slots of every entry (a miss's to be skipped).
    pub from_plan: bool,
}

/// The key -> slot directory of one rank's hot-row cache, its key frequencies and its
/// counters (see the module docs).
///
/// One index holds both the cached keys (value: the slot) and the candidates, keys seen
/// at least twice since the last refresh and not cached (value: [`CANDIDATE`] | their
/// occurrences), so planning a batch costs one lookup per unique key; a cached key's
/// occurrences are counted beside its slot. Slots are used from the lowest up, so the
/// per-slot arrays grow with the keys cached, not with the capacity.
#[derive(Debug)]
pub struct CacheDirectory {
    capacity: usize,
    /// Cached key -> its slot; candidate -> [`CANDIDATE`] | its occurrences.
    map: KeyIndex,
    /// Per slot up to the highest used: its key and score at the last refresh (`None`:
    /// empty).
    slots: Vec<Option<(u64, f64)>>,
    /// Per slot: its key's occurrences since the last refresh.
    seen: Vec<u32>,
    /// Keys cached now.
    cached: usize,
    doorkeeper: Doorkeeper,
    /// Per unique key of the batch being planned: its occurrences (scratch).
    counts: Vec<u32>,
    counters: CacheCounters,
}

impl CacheDirectory {
    /// An empty directory of `capacity` slots (0: no cache, every key misses).
    pub fn new(capacity: usize) -> CacheDirectory {
        let capacity = capacity.min(MISS as usize - 1);
        CacheDirectory {
            capacity,
            map: KeyIndex::with_room(0),
            slots: Vec::new(),
            seen: Vec::new(),
            cached: 0,
            doorkeeper: Doorkeeper::new(capacity),
            counts: Vec::new(),
            counters: CacheCounters::default(),
        }
    }

    /// Its number of slots.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Keys cached now.
    pub fn len(&self) -> usize {
        self.cached
    }

    /// Whether no key is cached.
    pub fn is_empty(&self) -> bool {
        self.cached == 0
    }

    /// The slot of `key`, if cached.
    pub fn slot(&self, key: u64) -> Option<u32> {
        self.map.get(key).filter(|v| v & CANDIDATE == 0)
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
    /// is recorded without slots. ([`CacheDirectory::plan`] does this too.)
    pub fn observe(&mut self, uniq: &[u64], inverse: &[u32]) {
        self.visit(uniq, &[inverse], None);
    }

    /// Records a batch's keys for the next refresh as [`CacheDirectory::observe`] does and,
    /// in the same pass (one lookup per key), maps each of its unique keys `uniq` (of
    /// `samples` samples) to its source (into `plan`, reused); counts the batch, its unique
    /// keys and hits. `occurrences` are the batch's lists of indices into `uniq`: its
    /// inverse map, and a multi-hot batch's bag ids (a list id counts as often as it occurs).
    pub fn plan(&mut self, uniq: &[u64], occurrences: &[&[u32]], samples: usize, plan: &mut StagingPlan) {
        plan.source.clear();
        plan.misses.clear();
        plan.source.reserve(uniq.len());
        self.visit(uniq, occurrences, Some(plan));
        plan.hits = uniq.len() - plan.misses.len();
        self.counters.samples += samples as u64;
        self.counters.unique_keys += uniq.len() as u64;
        self.counters.hits += plan.hits as u64;
    }

    /// Counts each unique key's occurrences (a cached key's beside its slot, a candidate's
    /// in its entry, a key's first sighting in the doorkeeper) and, with `plan`, pushes its
    /// source.
    fn visit(&mut self, uniq: &[u64], occurrences: &[&[u32]], mut plan: Option<&mut StagingPlan>) {
        let record = self.capacity > 0;
        if record {
            self.counts.clear();
            self.counts.resize(uniq.len(), 0);
            for i in occurrences.iter().flat_map(|o| o.iter()) {
                if let Some(c) = self.counts.get_mut(*i as usize) {
                    *c = c.saturating_add(1);
                }
            }
        }
        for (u, k) in uniq.iter().enumerate() {
            if let Some(next) = uniq.get(u + PREFETCH_AHEAD) {
                self.map.prefetch(*next);
            }
            let slot = match self.map.entry(*k) {
                _ if *k == EMPTY_KEY => None,
                Ok(v) if *v & CANDIDATE == 0 => {
                    if record {
                        let s = &mut self.seen[*v as usize];
                        *s = s.saturating_add(self.counts[u]);
                    }
                    Some(*v)
                }
                Ok(v) if record => {
                    *v = CANDIDATE | (*v & !CANDIDATE).saturating_add(self.counts[u]).min(!CANDIDATE);
                    None
                }
                Ok(_) => None,
                Err(at) => {
                    if record {
                        let c = self.counts[u];
                        let before = self.doorkeeper.test_and_set(*k) as u32;
                        if c + before >= 2 {
                            self.map.insert_at(at, *k, CANDIDATE | (c + before).min(!CANDIDATE));
                        }
                    }
                    None
                }
            };
            if let Some(p) = plan.as_deref_mut() {
                match slot {
                    Some(s) => p.source.push(s),
                    None => {
                        p.source.push(MISS | p.misses.len() as u32);
                        p.misses.push(*k);
                    }
                }
            }
        }
    }

    /// The entries of the key list `keys` (a merged gradient list) whose keys are cached:
    /// their indices in `keys` into `at` and their slots into `slots` (both cleared first),
    /// in list order.
    pub fn select_cached(&self, keys: &[u64], at: &mut Vec<u32>, slots: &mut Vec<u32>) {
        at.clear();
        slots.clear();
        if self.cached == 0 {
            return;
        }
        for (i, k) in keys.iter().enumerate() {
            if let Some(s) = self.slot(*k) {
                at.push(i as u32);
                slots.push(s);
            }
        }
    }

    /// The cached entries of a merged gradient list (`keys`, rows of `dim` values `grads`)
    /// into `sel`, for the cache's update. `own`: this rank's unique keys and key gradient
    /// rows of the batch last planned into `plan` (no refresh since). Returns whether every
    /// selected row is, bit for bit, this rank's own key gradient (`sel.own_index` then
    /// gives each one's place among the own keys), so the device can read the rows where
    /// it holds them. Where the list is the rank's own key list (a world of one rank), the
    /// slots are the plan's sources, with no lookup.
    pub fn select_update(&self, plan: &StagingPlan, keys: &[u64], grads: &[f32], dim: usize, own: Option<(&[u64], &[f32])>, sel: &mut UpdateSelection) -> bool {
        sel.own_index.clear();
        let planned = own.is_some_and(|(k, _)| k == keys) && plan.source.len() == keys.len();
        sel.from_plan = planned;
        if planned {
            sel.at.clear();
            sel.slots.clear();
            for (i, s) in plan.source.iter().enumerate() {
                if s & MISS == 0 {
                    sel.at.push(i as u32);
                    sel.slots.push(*s);
                }
            }
        } else {
            self.select_cached(keys, &mut sel.at, &mut sel.slots);
        }
        let Some((own_keys, own_grads)) = own else { return false };
        let index = &mut sel.own_index;
        let same = sel.at.iter().all(|&j| {
            let j = j as usize;
            let p = match planned {
                true => j,
                false => match own_keys.binary_search(&keys[j]) {
                    Ok(p) => p,
                    Err(_) => return false,
                },
            };
            index.push(p as u32);
            match (grads.get(j * dim..(j + 1) * dim), own_grads.get(p * dim..(p + 1) * dim)) {
                (Some(a), Some(b)) => bytemuck::cast_slice::<f32, u32>(a) == bytemuck::cast_slice::<f32, u32>(b),
                _ => false,
            }
        });
        if !same {
            sel.own_index.clear();
        }
        same
    }

    /// Chooses the cached keys anew (see the module docs): the `capacity` keys of highest
    /// score among the candidates (keys seen at least twice since the last refresh, or once
    /// since and once in the interval before) for
    /// which `live` is true and the keys cached; clears the counts. Cached keys are live: a
    /// row leaves the table only by a removal, after which the caller empties the cache
    /// ([`CacheDirectory::clear`]). Returns the keys entering with their slots (the lowest
    /// free ones, by key), and counts them as rows refreshed. Its cost follows the keys
    /// cached and the candidates, not the capacity.
    pub fn refresh(&mut self, mut live: impl FnMut(u64) -> bool) -> Refresh {
        if self.capacity == 0 {
            return Refresh::default();
        }
        const NEW: u32 = u32::MAX;
        // (key, score, its slot or NEW) for every key that may stay or enter.
        let mut items: Vec<(u64, f64, u32)> = Vec::with_capacity(self.map.len());
        for (s, (e, seen)) in self.slots.iter().zip(self.seen.iter_mut()).enumerate() {
            if let Some((k, score)) = e {
                items.push((*k, *seen as f64 + score / 2.0, s as u32));
            }
            *seen = 0;
        }
        items.extend(self.map.iter().filter(|(k, v)| v & CANDIDATE != 0 && live(*k)).map(|(k, v)| (k, (v & !CANDIDATE) as f64, NEW)));
        self.doorkeeper.next_interval();
        let by_score = |a: &(u64, f64, u32), b: &(u64, f64, u32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        let mut leaving = Vec::new();
        if items.len() > self.capacity {
            items.select_nth_unstable_by(self.capacity, by_score);
            for (k, _, s) in items.drain(self.capacity..) {
                if s != NEW {
                    self.slots[s as usize] = None;
                    self.cached -= 1;
                    leaving.push((k, s));
                }
            }
        }
        leaving.sort_unstable_by_key(|(_, s)| *s);
        // Keys that stay keep their slot (with their new score); the others take the
        // lowest free slots, by key.
        let mut entering: Vec<(u64, f64)> = Vec::new();
        for (k, score, s) in items {
            match s {
                NEW => entering.push((k, score)),
                s => self.slots[s as usize] = Some((k, score)),
            }
        }
        entering.sort_unstable_by_key(|(k, _)| *k);
        let holes: Vec<usize> = self.slots.iter().enumerate().filter(|(_, e)| e.is_none()).map(|(s, _)| s).collect();
        let mut free = holes.into_iter().chain(self.slots.len()..self.capacity);
        let mut out = Vec::with_capacity(entering.len());
        for (k, score) in entering {
            let Some(s) = free.next() else { break };
            if s == self.slots.len() {
                self.slots.push(None);
                self.seen.push(0);
            }
            self.slots[s] = Some((k, score));
            self.cached += 1;
            out.push((k, s as u32));
        }
        // The candidates are spent: the index holds the cached keys only.
        self.map = KeyIndex::with_room(self.cached);
        for (s, e) in self.slots.iter().enumerate() {
            if let Some((k, _)) = e {
                self.map.insert(*k, s as u32);
            }
        }
        self.counters.rows_refreshed += out.len() as u64;
        self.counters.refreshes += 1;
        Refresh { entering: out, left: leaving.len(), leaving }
    }

    /// Empties the cache (its counts are kept: a cached key seen since the last refresh
    /// becomes a candidate): after something changed rows behind its back, the next
    /// refresh reloads every key it chooses.
    pub fn clear(&mut self) {
        let candidates = self.map.iter().filter(|(_, v)| v & CANDIDATE != 0);
        let dropped = self.slots.iter().zip(&self.seen).filter_map(|(e, n)| e.filter(|_| *n > 0).map(|(k, _)| (k, CANDIDATE | (*n).min(!CANDIDATE))));
        let kept: Vec<(u64, u32)> = candidates.chain(dropped).collect();
        self.map = KeyIndex::with_room(kept.len());
        kept.into_iter().for_each(|(k, v)| self.map.insert(k, v));
        self.slots.clear();
        self.seen.clear();
        self.cached = 0;
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
        d.plan(&[5, 7, 9], &[&[0, 1, 2]], 3, &mut p);
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
        d.observe(&[40, 10, 30, 20], &[0, 1, 2, 3, 3, 2, 1, 0]);
        let r = d.refresh(|_| true);
        assert_eq!(r.entering, vec![(10, 0), (20, 1), (30, 2)]);
    }

    #[test]
    fn plans_sources_and_counts_hits() {
        let mut d = CacheDirectory::new(4);
        d.observe(&[10, 20], &[0, 1, 0, 1]);
        d.refresh(|_| true);
        let mut p = StagingPlan::default();
        d.plan(&[5, 10, 15, 20], &[&[0, 1, 2, 3, 3, 2, 1, 0]], 8, &mut p);
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
    fn list_ids_count_as_often_as_they_occur() {
        // Key 30 occurs in no single-hot field but three times in the bags: it is chosen
        // over key 10, seen twice in the inverse map, and 20, once.
        let mut d = CacheDirectory::new(1);
        let mut p = StagingPlan::default();
        d.plan(&[10, 20, 30], &[&[0, 0, 1], &[2, 2, 2]], 3, &mut p);
        assert_eq!(d.refresh(|_| true).entering, vec![(30, 0)]);
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
        // Candidates: live keys seen at least twice.
        let mut want: Vec<(u64, u64)> = keys.iter().map(|k| (*k, counts[*k as usize])).filter(|(k, c)| k % 3 != 0 && *c >= 2).collect();
        want.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut want: Vec<u64> = want.into_iter().take(100).map(|(k, _)| k).collect();
        want.sort_unstable();
        let r = d.refresh(|k| k % 3 != 0);
        assert_eq!(r.entering.iter().map(|(k, _)| *k).collect::<Vec<_>>(), want);
    }

    #[test]
    fn a_key_enters_only_once_seen_twice() {
        let mut d = CacheDirectory::new(8);
        // Seen once: only its first sighting is noted; nothing enters.
        d.observe(&[1, 2], &[0, 1]);
        assert!(d.refresh(|_| true).entering.is_empty());
        // Twice in one batch, or once in each of two batches of an interval: it enters.
        d.observe(&[3, 4], &[0, 0, 1]);
        d.observe(&[4, 5], &[0, 1]);
        assert_eq!(d.refresh(|_| true).entering, vec![(3, 0), (4, 1)]);
        // Once in each of two intervals in a row: it enters (5 was seen in the last one).
        d.observe(&[5, 6], &[0, 1]);
        assert_eq!(d.refresh(|_| true).entering, vec![(5, 2)]);
        // Sightings older than the interval before do not count (6, two refreshes ago).
        d.refresh(|_| true);
        d.observe(&[6], &[0]);
        assert!(d.refresh(|_| true).entering.is_empty());
    }

    #[test]
    fn a_large_capacity_costs_only_the_keys_cached() {
        let mut d = CacheDirectory::new(1 << 24);
        d.observe(&[7, 9], &[0, 0, 1, 1]);
        assert_eq!(d.refresh(|_| true).entering, vec![(7, 0), (9, 1)]);
        assert_eq!((d.slots.len(), d.seen.len(), d.len()), (2, 2, 2));
    }

    #[test]
    fn the_update_selection_of_a_planned_list_needs_no_lookup() {
        let mut d = CacheDirectory::new(4);
        d.observe(&[10, 20, 30], &[0, 0, 1, 1, 2, 2]);
        d.refresh(|_| true);
        let (keys, mut p) = ([5u64, 10, 20, 25], StagingPlan::default());
        d.plan(&keys, &[&[0, 1, 2, 3]], 4, &mut p);
        let grads: Vec<f32> = (0..8).map(|i| i as f32).collect();
        let mut planned = UpdateSelection::default();
        assert!(d.select_update(&p, &keys, &grads, 2, Some((&keys, &grads)), &mut planned));
        assert_eq!(planned, UpdateSelection { at: vec![1, 2], slots: vec![0, 1], own_index: vec![1, 2], from_plan: true });
        // The same from lookups: a list that is not the planned one.
        let (merged, merged_grads) = ([10u64, 20, 30], [2.0f32, 3.0, 4.0, 5.0, 9.0, 9.0]);
        let mut looked = UpdateSelection::default();
        assert!(!d.select_update(&p, &merged, &merged_grads, 2, Some((&keys, &grads)), &mut looked));
        assert_eq!((looked.at, looked.slots, looked.own_index, looked.from_plan), (vec![0, 1, 2], vec![0, 1, 2], vec![], false));
        // A row that differs from the own gradient by one bit: the rows must travel.
        let mut other = grads.clone();
        other[5] = f32::from_bits(other[5].to_bits() ^ 1);
        assert!(!d.select_update(&p, &keys, &other, 2, Some((&keys, &grads)), &mut planned));
        assert!(planned.own_index.is_empty() && planned.at == vec![1, 2]);
    }

    #[test]
    fn clear_keeps_the_counts_of_the_keys_it_drops() {
        let mut d = CacheDirectory::new(2);
        d.observe(&[1, 2], &[0, 0, 1, 1]);
        d.refresh(|_| true);
        d.observe(&[1], &[0]);
        d.clear();
        assert!(d.is_empty() && d.slot(1).is_none() && d.entries().is_empty());
        // 1 was seen since the refresh: it is a candidate again; 2 was not.
        assert_eq!(d.refresh(|_| true).entering, vec![(1, 0)]);
    }
}
