//! A table that never stops the job: what the host leader does around each update batch
//! under a [`TablePolicy`] ([`apply_managed`], called by [`super::HostTable::apply_updates`]).
//!
//! Before the batch, when its admitted new keys would take the table past its high-water
//! mark ([`format::high_water`], 0.7 of the slots):
//! 1. **growth**: a copy of double capacity (or more, until the batch fits) is built in a
//!    new file ([`EmbeddingTable::grow_into`]) and replaces the table; the replaced one is
//!    marked ([`EmbeddingTable::mark_replaced`]) and handed back, for the host's other
//!    ranks to move to the new one at the host barrier. Growth stops at
//!    [`TablePolicy::max_capacity`] (from `--table-max-bytes`);
//! 2. **eviction**, at that largest size: the rows the policy ranks first (LRU or LFU,
//!    [`Evict`]) are removed until the table and the batch's new keys fit under the
//!    low-water mark ([`format::low_water`], 0.6), sparing the rows the batch updates; if
//!    the batch's new keys alone do not fit, the excess is refused (its gradients dropped,
//!    counted), never an error.
//!
//! The new file of a growth is made ahead ([`Ahead`]): once the table passes half load, a
//! background thread creates, allocates and maps the file of double capacity (the kernel
//! zeroing every page is the slow part of a growth), so the growth itself only rehashes.
//!
//! After the batch, every `max(1, S / 8)` updates, rows not updated for `S` updates
//! (`--expire-after-steps S`) are removed ([`EmbeddingTable::expire`]): a row lives between
//! `S` and `S + S / 8` updates after its last one.
//!
//! Every decision is a function of the table and the batch, which are the same on every
//! host: every host's table stays byte-identical.

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Instant;

use super::error::TableResult;
use super::evict::Evict;
use super::format::{self, Header, Layout};
use super::grow::Spare;
use super::table::EmbeddingTable;
use super::update::{UpdatePlan, UpdateStats};

/// How a managed table grows and makes room (the same on every host).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct TablePolicy {
    /// Largest capacity growth may reach (slots); a table already larger does not grow.
    pub max_capacity: u64,
    /// Which rows go when the table at its largest size needs room.
    pub evict: Evict,
    /// Remove rows not updated for this many updates.
    pub expire_after: Option<u64>,
}

/// Expiry sweeps per expiry period: a sweep runs every `max(1, S / EXPIRY_SWEEPS)` updates.
pub const EXPIRY_SWEEPS: u64 = 8;

impl TablePolicy {
    /// The largest capacity, doubling from `header`'s own, whose file (same shape) takes at
    /// most `max_bytes`; the table's own capacity when even that is larger.
    pub fn max_capacity_for(header: &Header, max_bytes: u64) -> u64 {
        let mut cap = header.capacity;
        while cap < format::MAX_CAPACITY {
            match Layout::compute(header.dim, header.dtype, cap * 2, header.optimizer, header.extras) {
                Some(l) if l.file_len <= max_bytes => cap *= 2,
                _ => break,
            }
        }
        cap
    }

    /// Updates between expiry sweeps (`None` without expiry).
    pub fn expiry_period(&self) -> Option<u64> {
        self.expire_after.map(|s| (s / EXPIRY_SWEEPS).max(1))
    }
}

/// One growth of a table.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Growth {
    /// The table's generation when it grew (the update batch that needed it comes next).
    pub generation: u64,
    /// Slots before.
    pub from: u64,
    /// Slots after.
    pub to: u64,
    /// Bytes of the new file.
    pub bytes: u64,
    /// Seconds to build the new table (create, rehash).
    pub seconds: f64,
}

/// What [`apply_managed`] did.
#[derive(Debug, Default)]
pub struct Managed {
    /// The update batch.
    pub stats: UpdateStats,
    /// The growth before it, with the replaced table (still mapped; drop it once no rank
    /// reads it).
    pub growth: Option<(Growth, EmbeddingTable)>,
    /// Rows evicted to make room for it.
    pub evicted: u64,
    /// Rows expired after it.
    pub expired: u64,
}

/// Load, in tenths of the capacity, from which the next growth's file is made ahead (0.5).
pub const PREPARE_TENTHS: u64 = 5;

/// The file of a table's next growth, made ahead by a background thread ([`Spare`]): the
/// leader keeps one per table. Dropped, it waits for the thread and removes the file.
#[derive(Default)]
pub struct Ahead {
    pending: Option<(u64, PathBuf, JoinHandle<TableResult<Spare>>)>,
}

impl std::fmt::Debug for Ahead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ahead").field("pending", &self.pending.as_ref().map(|(c, p, _)| (c, p))).finish()
    }
}

impl Ahead {
    /// Starts making the file `path` of a table like `like` at `capacity` slots, unless one
    /// is on its way already.
    fn prepare(&mut self, like: &Header, capacity: u64, path: &Path) {
        if self.pending.is_some() {
            return;
        }
        let (like, p) = (*like, path.to_path_buf());
        let spawned = std::thread::Builder::new().name("ringrec-grow".into()).spawn(move || Spare::make(&p, &like, capacity));
        if let Ok(h) = spawned {
            self.pending = Some((capacity, path.to_path_buf(), h));
        }
    }

    /// The file made ahead for `capacity` slots at `path`, once its thread is done; `None`
    /// when there is none, it is of another size or place (it is removed), or making it
    /// failed (the growth makes it again and reports the error).
    fn take(&mut self, capacity: u64, path: &Path) -> Option<Spare> {
        let (c, p, h) = self.pending.take()?;
        let spare = h.join().ok()?.ok()?;
        (c == capacity && p == path).then_some(spare)
    }
}

impl Drop for Ahead {
    fn drop(&mut self) {
        if let Some((_, _, h)) = self.pending.take() {
            let _ = h.join();
        }
    }
}

/// Applies one optimizer step per `(key, gradient row)` to `table` (as
/// [`EmbeddingTable::apply_updates`]) under `policy`: growing it first (into the file
/// `next`, made ahead by `ahead` when it could be) or evicting rows when the batch would
/// pass the high-water mark, and expiring rows after it (see the module docs). On growth
/// `table` is the new table afterwards; the next growth needs another `next`. With `held`,
/// the rows held elsewhere are not stepped ([`EmbeddingTable::apply_updates_held`]).
#[allow(clippy::too_many_arguments)]
pub fn apply_managed(table: &mut EmbeddingTable, keys: &[u64], grads: &[f32], lr: f32, policy: &TablePolicy, next: &Path, ahead: &mut Ahead, held: Option<&[u32]>) -> TableResult<Managed> {
    let mut out = Managed::default();
    let mut plan = table.plan_updates(keys, true)?;
    let mut room = None;
    // Rows after the batch: its absent keys bound the insertions; with admission, the
    // sketch says which of them are inserted when the bound passes the mark.
    let need = |t: &EmbeddingTable, plan: &UpdatePlan| -> TableResult<u64> {
        let bound = t.live_rows() + plan.absent;
        if bound <= t.header().high_water() {
            return Ok(bound);
        }
        Ok(t.live_rows() + t.planned_inserts(keys, plan)?)
    };
    let needed = need(table, &plan)?;
    if needed > table.header().high_water() {
        let mut cap = table.capacity();
        while format::high_water(cap) < needed && cap < policy.max_capacity {
            cap *= 2;
        }
        if cap > table.capacity() {
            let t0 = Instant::now();
            let new = match ahead.take(cap, next) {
                Some(spare) => table.grow_with(spare)?,
                None => table.grow_into(next, cap)?,
            };
            let from = table.capacity();
            let mut old = std::mem::replace(table, new);
            old.mark_replaced()?;
            let growth = Growth { generation: table.generation(), from, to: cap, bytes: table.header().layout.file_len, seconds: t0.elapsed().as_secs_f64() };
            out.growth = Some((growth, old));
            plan = table.plan_updates(keys, true)?;
        }
        let high = table.header().high_water();
        let needed = need(table, &plan)?;
        if needed > high {
            let n = needed.saturating_sub(format::low_water(table.capacity()));
            out.evicted = table.evict_sparing(n, policy.evict, &plan.present())?;
            plan = table.plan_updates(keys, true)?;
            room = Some(high.saturating_sub(table.live_rows()));
        }
    }
    out.stats = table.apply_planned(keys, grads, lr, plan, room, held)?;
    if let (Some(period), Some(s)) = (policy.expiry_period(), policy.expire_after) {
        if table.generation() % period == 0 {
            out.expired = table.expire(s)?;
        }
    }
    let cap = table.capacity();
    if out.growth.is_none() && cap < policy.max_capacity && table.live_rows() >= cap / 10 * PREPARE_TENTHS {
        ahead.prepare(table.header(), cap * 2, next);
    }
    Ok(out)
}
