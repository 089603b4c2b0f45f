//! Removing rows from a table: expiry (rows not updated for a number of updates) and
//! eviction (the least recently or least frequently updated rows, to make room in a table
//! at its largest size). Both read the usage section (each row's last update, as the
//! table's generation, and its update count) and remove by backward shift
//! ([`index::remove_at`]): no tombstones, a removed key reads its initial row again, and a
//! freed slot reads as in a new table (zero row, initial accumulator, zero usage).
//!
//! Deterministic: victims are chosen by (score, key) — never by slot — and removed in key
//! order, so every host holding the same table removes the same rows and ends with the
//! same bytes. Ages are 32-bit generation differences (they wrap after 2^32 updates).

use rayon::prelude::*;

use super::error::{TableError, TableResult};
use super::format::{EMPTY_KEY, FORMAT};
use super::index;
use super::table::EmbeddingTable;
use super::update::Parts;

/// Which rows eviction removes first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Evict {
    /// Least recently used: the longest since its last update first, ties by key.
    Lru,
    /// Least frequently used: the fewest updates first, then the longest since its last
    /// update, ties by key.
    Lfu,
}

crate::config::named_enum!(Evict { Lru => "lru", Lfu => "lfu" });

/// Buckets of each histogram pass that narrows down the eviction threshold.
const BUCKETS: usize = 1 << 16;
/// Rows of one score range ranked one by one (by score, then key) once the histogram
/// passes have narrowed the threshold down to a range holding at most this many.
const TIED_ROWS: u64 = 1 << 16;

impl Evict {
    /// The rank of a row for eviction (larger goes first), from its usage and the table's
    /// current generation `now` (low 32 bits).
    #[inline]
    fn score(self, usage: [u32; 2], now: u32) -> u64 {
        let age = now.wrapping_sub(usage[0]) as u64;
        match self {
            Evict::Lru => age,
            Evict::Lfu => ((u32::MAX - usage[1]) as u64) << 32 | age,
        }
    }
}

impl EmbeddingTable {
    /// The usage of every slot (`None` for an empty one) as pairs, checked to have one per
    /// slot.
    fn usage_pairs(&self) -> TableResult<(&[u64], &[[u32; 2]])> {
        let l = self.header.layout;
        if !self.header.extras.usage {
            return Err(TableError::Config("this table keeps no usage (last update of each row): expiry and eviction need a table created with it".into()));
        }
        let index: &[u64] = bytemuck::try_cast_slice(self.section(l.index_offset, l.index_len)?).map_err(|_| FORMAT.layout(&self.path, "misaligned index"))?;
        let usage: &[[u32; 2]] = bytemuck::try_cast_slice(self.section(l.usage_offset, l.usage_len)?).map_err(|_| FORMAT.layout(&self.path, "misaligned usage"))?;
        if usage.len() != index.len() {
            return Err(FORMAT.layout(&self.path, "the usage section does not hold one entry per slot").into());
        }
        Ok((index, usage))
    }

    /// Removes every row not updated in its last `max_age` updates (`generation - last
    /// update >= max_age`, 32-bit), counted as expired; returns how many. Needs a table
    /// that keeps usage.
    pub fn expire(&mut self, max_age: u64) -> TableResult<u64> {
        let now = self.header.generation as u32;
        let max_age = max_age.clamp(1, u32::MAX as u64) as u32;
        let (index, usage) = self.usage_pairs()?;
        let mut victims: Vec<u64> = index
            .par_iter()
            .zip(usage.par_iter())
            .filter(|(k, u)| **k != EMPTY_KEY && now.wrapping_sub(u[0]) >= max_age)
            .map(|(k, _)| *k)
            .collect();
        victims.sort_unstable();
        let n = self.remove_keys(&victims)?;
        self.bump_counts(|c| c.expired += n)?;
        Ok(n)
    }

    /// Removes the `n` rows that `policy` ranks first (all of them when fewer), counted as
    /// evicted; returns how many. Needs a table that keeps usage.
    pub fn evict(&mut self, n: u64, policy: Evict) -> TableResult<u64> {
        self.evict_sparing(n, policy, &[])
    }

    /// [`EmbeddingTable::evict`], never taking the rows in the slots `spare` (the rows an
    /// update batch is about to touch).
    pub(super) fn evict_sparing(&mut self, n: u64, policy: Evict, spare: &[usize]) -> TableResult<u64> {
        if n == 0 {
            return Ok(0);
        }
        let now = self.header.generation as u32;
        let (index, usage) = self.usage_pairs()?;
        let mut spared = vec![false; index.len()];
        for s in spare {
            if let Some(x) = spared.get_mut(*s) {
                *x = true;
            }
        }
        let candidate = |s: usize| index[s] != EMPTY_KEY && !spared[s];
        let score = |s: usize| policy.score(usage[s], now);
        let top = (0..index.len()).into_par_iter().filter(|s| candidate(*s)).map(score).max();
        let Some(top) = top else { return Ok(0) };
        // The threshold score lies in [lo, hi]: rows scoring above hi all go, `need` more
        // come from [lo, hi]. Each pass narrows the range with a histogram of 2^16
        // buckets, until the rows in it are few (or all tie); then those are ranked by
        // (score, key).
        let (mut lo, mut hi, mut need) = (0u64, top, n);
        let mut narrow = self.header.live_rows > TIED_ROWS;
        while narrow {
            let span = hi - lo;
            let shift = (64 - span.leading_zeros()).saturating_sub(BUCKETS.trailing_zeros());
            let in_range = |s: usize| candidate(s) && (lo..=hi).contains(&score(s));
            let hist = (0..index.len())
                .into_par_iter()
                .with_min_len(1 << 16)
                .fold(|| vec![0u64; BUCKETS], |mut h, s| {
                    if in_range(s) {
                        h[((score(s) - lo) >> shift) as usize] += 1;
                    }
                    h
                })
                .reduce(|| vec![0u64; BUCKETS], |mut a, b| {
                    a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
                    a
                });
            let mut above = 0u64;
            let mut bucket = 0usize;
            for b in (0..BUCKETS).rev() {
                if above + hist[b] >= need {
                    bucket = b;
                    break;
                }
                above += hist[b];
            }
            let b_lo = lo + ((bucket as u64) << shift);
            let b_hi = hi.min(b_lo.saturating_add((1u64 << shift) - 1));
            need -= above.min(need);
            (lo, hi) = (b_lo, b_hi);
            narrow = shift > 0 && hist[bucket] > TIED_ROWS;
        }
        let mut victims: Vec<u64> = (0..index.len()).into_par_iter().filter(|s| candidate(*s) && score(*s) > hi).map(|s| index[s]).collect();
        let mut tied: Vec<(u64, u64)> = (0..index.len()).into_par_iter().filter(|s| candidate(*s) && (lo..=hi).contains(&score(*s))).map(|s| (score(s), index[s])).collect();
        tied.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        victims.extend(tied.iter().take(need as usize).map(|(_, k)| *k));
        victims.sort_unstable();
        let removed = self.remove_keys(&victims)?;
        self.bump_counts(|c| c.evicted += removed)?;
        Ok(removed)
    }

    /// Removes `keys` (those present) one after the other by backward shift, moving each
    /// shifted key's row, optimizer state and usage with it, and clearing the slot freed
    /// last; updates `live_rows` (the counts are the caller's). Returns how many it removed.
    fn remove_keys(&mut self, keys: &[u64]) -> TableResult<u64> {
        let h = self.header;
        let (shift, rb) = (self.shift, h.row_bytes() as usize);
        let path = self.path.clone();
        let cap = h.capacity as usize;
        let p: Parts<'_, u8> = self.parts_mut::<u8>()?;
        let Parts { index: idx, rows, state, usage, .. } = p;
        let state_on = !state.is_empty();
        let usage_on = !usage.is_empty();
        if idx.len() != cap || rows.len() != cap * rb || (state_on && state.len() != cap) || (usage_on && usage.len() != 2 * cap) {
            return Err(FORMAT.layout(&path, "a section does not hold one entry per slot").into());
        }
        let mut removed = 0u64;
        for key in keys {
            let Some((slot, false)) = index::probe(idx, *key, shift) else { continue };
            let freed = index::remove_at(idx, slot, shift, |from, to| {
                rows.copy_within(from * rb..(from + 1) * rb, to * rb);
                if state_on {
                    state[to] = state[from];
                }
                if usage_on {
                    usage.copy_within(2 * from..2 * from + 2, 2 * to);
                }
            });
            rows[freed * rb..(freed + 1) * rb].fill(0);
            if state_on {
                state[freed] = h.adagrad_init;
            }
            if usage_on {
                usage[2 * freed..2 * freed + 2].fill(0);
            }
            removed += 1;
        }
        let mut nh = h;
        nh.live_rows -= removed;
        self.write_header(nh)?;
        Ok(removed)
    }

    /// Changes the header's row counts with `f` (and writes the header).
    pub(super) fn bump_counts(&mut self, f: impl FnOnce(&mut super::format::RowCounts)) -> TableResult<()> {
        let mut h = self.header;
        f(&mut h.counts);
        self.write_header(h)
    }
}
