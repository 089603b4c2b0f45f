//! Updates of a table, by the host leader only: an optimizer step per (key, gradient row)
//! ([`EmbeddingTable::apply_updates`]: SGD, or row-wise Adagrad) or an assignment
//! ([`EmbeddingTable::put_rows`]), inserting absent keys — an optimizer step only once the
//! key is admitted ([`super::admit`]). Each updated row's usage (last update, update count)
//! is recorded when the table keeps it. Deterministic: every host applying the same list
//! gets a byte-identical file.
//!
//! A GPU hot-row cache in write-back ([`EmbeddingTable::apply_updates_held`]) holds some
//! rows elsewhere: those keys go through the batch as every other (placement, admission,
//! eviction's sparing, usage), only their rows are not stepped here; the holder writes
//! them back ([`EmbeddingTable::write_back`]) before anything reads them.

use std::collections::HashSet;
use std::path::Path;

use half::{bf16, f16};
use rayon::prelude::*;

use super::error::{TableError, TableResult};
use super::admit;
use super::format::{self, Header, OptimizerKind, StorageDtype, FORMAT, HEADER_FIELDS};
use super::index;
use super::init::{self, Elem};
use super::table::{cast_mut, EmbeddingTable, Mapping, PAR_CHUNK_KEYS, PAR_MIN_UPDATES, PREFETCH_AHEAD};

/// Hints the CPU to fetch the cache line at `p` (updates are bound by memory latency).
#[inline(always)]
fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetch is a hint that never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p as *const i8, std::arch::x86_64::_MM_HINT_T0)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Marks a key absent from the table in `resolve_slots`' output.
const ABSENT: usize = 1 << (usize::BITS - 1);
/// Marks a key whose gradient is dropped (not admitted, or no room) in `write_rows_t`.
const SKIP: usize = usize::MAX;
/// Marks a key of [`EmbeddingTable::apply_updates_held`] whose row is held elsewhere.
pub const HELD: u32 = u32::MAX;

/// What an update batch did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UpdateStats {
    /// Keys inserted by this batch.
    pub inserted: u64,
    /// Row updates applied (one per key occurrence).
    pub updated: u64,
    /// Gradient rows dropped: their key has no row and was not admitted (`--admit-after`),
    /// or a managed table at its largest size had no room left for it.
    pub refused: u64,
    /// The table's generation after the batch.
    pub generation: u64,
}

/// Where each key of an update batch goes, worked out before anything is written
/// ([`EmbeddingTable::plan_updates`]): valid for the table as it was then.
#[derive(Debug)]
pub(super) struct UpdatePlan {
    /// Per key: its slot, or [`ABSENT`] | where its probe ended.
    slots: Vec<usize>,
    /// Distinct absent keys: the most rows the batch can insert.
    pub(super) absent: u64,
    /// Whether the batch is an optimizer step (which admits keys) or an assignment.
    step: bool,
    /// What the table looked like: a plan is refused on a table that changed since.
    stamp: (u64, u64, u64, u64),
}

impl UpdatePlan {
    /// Slots of the keys present in the table (the rows this batch touches).
    pub(super) fn present(&self) -> Vec<usize> {
        self.slots.iter().filter(|s| **s & ABSENT == 0).copied().collect()
    }
}

/// `b.split_at_mut(n)` without the panic.
fn split_mut(b: &mut [u8], n: usize) -> Option<(&mut [u8], &mut [u8])> {
    if n <= b.len() {
        Some(b.split_at_mut(n))
    } else {
        None
    }
}

/// The sections of the table file `b` (at `path`, for errors) laid out as `l`, the rows
/// as `T`.
pub(super) fn split_parts<'a, T: bytemuck::Pod>(path: &std::path::Path, b: &'a mut [u8], l: &format::Layout) -> TableResult<Parts<'a, T>> {
    let bad = || TableError::from(FORMAT.layout(path, "section outside the mapping"));
    let (header, mut rest) = split_mut(b, l.index_offset as usize).ok_or_else(bad)?;
    // Each section in file order: skip to its offset (`at` is where `rest` starts).
    let mut at = l.index_offset;
    let mut take = |off: u64, len: u64| -> TableResult<&'a mut [u8]> {
        let skip = off.checked_sub(at).ok_or_else(bad)? as usize;
        let r = std::mem::take(&mut rest).get_mut(skip..).ok_or_else(bad)?;
        let (sec, tail) = split_mut(r, len as usize).ok_or_else(bad)?;
        rest = tail;
        at = off + len;
        Ok(sec)
    };
    let index = take(l.index_offset, l.index_len)?;
    let rows = take(l.rows_offset, l.rows_len)?;
    let state = take(l.state_offset, l.state_len)?;
    let usage = take(l.usage_offset, l.usage_len)?;
    let sketch = take(l.sketch_offset, l.sketch_len)?;
    Ok(Parts { header, index: cast_mut(path, index)?, rows: cast_mut(path, rows)?, state: cast_mut(path, state)?, usage: cast_mut(path, usage)?, sketch })
}

/// Mutable sections of a writable table.
pub(super) struct Parts<'a, T> {
    pub(super) header: &'a mut [u8],
    pub(super) index: &'a mut [u64],
    pub(super) rows: &'a mut [T],
    pub(super) state: &'a mut [f32],
    /// Per slot: u32 last update (generation), u32 update count; empty without usage.
    pub(super) usage: &'a mut [u32],
    pub(super) sketch: &'a mut [u8],
}

/// One row's change in f32: assignment, an SGD step, or (with `acc`, the row's Adagrad
/// accumulator) a row-wise Adagrad step. The sequential and parallel update paths share it,
/// so they compute every row identically.
fn step_row(w: &mut [f32], v: &[f32], op: RowOp, acc: Option<&mut f32>, eps: f32) {
    match (op, acc) {
        (RowOp::Assign, _) => w.copy_from_slice(v),
        (RowOp::Step(lr), None) => {
            for (x, g) in w.iter_mut().zip(v) {
                *x -= lr * g;
            }
        }
        (RowOp::Step(lr), Some(acc)) => {
            *acc += v.iter().map(|g| g * g).sum::<f32>() / v.len() as f32;
            let denom = acc.sqrt() + eps;
            for (x, g) in w.iter_mut().zip(v) {
                *x -= lr * g / denom;
            }
        }
    }
}

/// How `write_rows` changes a row.
#[derive(Clone, Copy)]
enum RowOp {
    /// Apply an optimizer step with this learning rate to the given gradient.
    Step(f32),
    /// Overwrite the row with the given values.
    Assign,
}

impl EmbeddingTable {
    /// Per key: its slot when it is in the table, else [`ABSENT`] | the free slot where
    /// its probe ended (where it goes unless this batch fills that slot first); and the
    /// number of distinct absent keys. Prefetches the index `PREFETCH_AHEAD` keys ahead:
    /// updates are bound by memory latency, not arithmetic.
    fn resolve_slots(&self, keys: &[u64]) -> TableResult<(Vec<usize>, u64)> {
        let v = self.view::<u8>()?;
        let find_all = |chunk: &[u64], out: &mut Vec<usize>| {
            for (n, k) in chunk.iter().enumerate() {
                if let Some(next) = chunk.get(n + PREFETCH_AHEAD) {
                    v.prefetch(*next);
                }
                out.push(match v.probe(*k) {
                    Some((s, false)) => s,
                    Some((s, true)) => ABSENT | s,
                    None => ABSENT, // a full (hostile) index: pass 1 reports it
                });
            }
        };
        let mut slots = Vec::with_capacity(keys.len());
        if keys.len() >= PAR_MIN_UPDATES && rayon::current_num_threads() > 1 {
            // Read-only lookups: independent, so split over the pool (order kept).
            let parts: Vec<Vec<usize>> = keys
                .par_chunks(PAR_CHUNK_KEYS)
                .map(|c| {
                    let mut out = Vec::with_capacity(c.len());
                    find_all(c, &mut out);
                    out
                })
                .collect();
            for p in parts {
                slots.extend(p);
            }
        } else {
            find_all(keys, &mut slots);
        }
        let absent = slots.iter().filter(|s| **s & ABSENT != 0).count() as u64;
        if absent == 0 || keys.windows(2).all(|w| w[0] < w[1]) {
            // Distinct keys (what the sparse exchange hands the leader): no set needed.
            return Ok((slots, absent));
        }
        let new: HashSet<u64> = keys.iter().zip(&slots).filter(|(_, s)| **s & ABSENT != 0).map(|(k, _)| *k).collect();
        Ok((slots, new.len() as u64))
    }

    /// What the table looks like for [`UpdatePlan`]s: any growth, removal or update changes it.
    fn stamp(&self) -> (u64, u64, u64, u64) {
        let h = &self.header;
        (h.generation, h.live_rows, h.capacity, h.counts.evicted.wrapping_add(h.counts.expired))
    }

    /// Plans an update batch of `keys` (`step`: an optimizer step, which admits keys;
    /// else an assignment, which inserts every key): where each key is, and how many keys
    /// are absent. Reads only.
    pub(super) fn plan_updates(&self, keys: &[u64], step: bool) -> TableResult<UpdatePlan> {
        Self::check_keys(keys)?;
        let (slots, absent) = self.resolve_slots(keys)?;
        Ok(UpdatePlan { slots, absent, step, stamp: self.stamp() })
    }

    /// How many rows the planned batch inserts: its distinct absent keys that are admitted
    /// — with `admit_after` K > 1, those whose sketch estimate reaches K with this batch
    /// (a sketch read per absent key, so only asked when the bound `plan.absent` matters).
    pub(super) fn planned_inserts(&self, keys: &[u64], plan: &UpdatePlan) -> TableResult<u64> {
        let h = &self.header;
        if plan.absent == 0 || !plan.step || h.admit_after <= 1 {
            return Ok(plan.absent);
        }
        let sketch = self.section(h.layout.sketch_offset, h.layout.sketch_len)?;
        let (d, w, k) = (h.extras.sketch_depth, h.extras.sketch_width, h.admit_after);
        let admitted = |key: &u64| admit::estimate(sketch, d, w, *key).saturating_add(1) as u32 >= k;
        let absent_keys = keys.iter().zip(&plan.slots).filter(|(_, s)| **s & ABSENT != 0).map(|(k, _)| k);
        Ok(if keys.windows(2).all(|w| w[0] < w[1]) {
            absent_keys.filter(|k| admitted(k)).count() as u64
        } else {
            absent_keys.collect::<HashSet<_>>().into_iter().filter(|k| admitted(k)).count() as u64
        })
    }

    /// Applies one optimizer step per `(key, gradient row)` in the given order (a key given
    /// twice is stepped twice), inserting keys not yet present — with `admit_after` K > 1
    /// only in the K-th batch that holds the key; until then its gradient is dropped
    /// ([`super::admit`]). A new row starts from the key's initial row, so it reads the same
    /// before and after insertion. Deterministic: every host applying the same list gets a
    /// byte-identical file. Bumps the generation.
    ///
    /// Fails without changing anything on a read-only handle ([`TableError::ReadOnly`]), on
    /// the reserved key, on a wrong `grads` length, or when the new keys would exceed the
    /// load limit ([`TableError::Full`]).
    pub fn apply_updates(&mut self, keys: &[u64], grads: &[f32], lr: f32) -> TableResult<UpdateStats> {
        if !lr.is_finite() {
            return Err(TableError::Config(format!("learning rate {lr} is not finite")));
        }
        self.write_rows(keys, grads, RowOp::Step(lr))
    }

    /// Sets the rows of `keys` to `values` (inserting absent keys; the Adagrad accumulator of a
    /// new row starts at its initial value, that of an existing row is kept). Values are
    /// rounded to the storage dtype. Same rules and errors as [`EmbeddingTable::apply_updates`].
    pub fn put_rows(&mut self, keys: &[u64], values: &[f32]) -> TableResult<UpdateStats> {
        self.write_rows(keys, values, RowOp::Assign)
    }

    /// [`EmbeddingTable::apply_updates`] for strictly increasing `keys` of which some rows are
    /// held elsewhere (a GPU hot-row cache in write-back, which steps them itself): `rows`
    /// gives per key the index of its gradient row in `grads`, or [`HELD`]. A held key
    /// goes through the batch as any other — it must be in the table, it is spared by
    /// eviction and its usage is recorded — but its row and optimizer state are left as
    /// they are. The table's file is then the one [`EmbeddingTable::apply_updates`] of
    /// every row gives, but for the held rows' values, which the holder writes back
    /// ([`EmbeddingTable::write_back`]).
    pub fn apply_updates_held(&mut self, keys: &[u64], grads: &[f32], lr: f32, rows: &[u32]) -> TableResult<UpdateStats> {
        if !lr.is_finite() {
            return Err(TableError::Config(format!("learning rate {lr} is not finite")));
        }
        if !self.is_writable() {
            return Err(TableError::ReadOnly);
        }
        let plan = self.plan_updates(keys, true)?;
        self.write_planned(keys, Vals { vals: grads, rows: Some(rows) }, RowOp::Step(lr), plan, None)
    }

    /// Sets the rows of `keys` (and with `accs`, their Adagrad accumulators) to what a
    /// holder of them computed (a GPU hot-row cache in write-back, [`EmbeddingTable::apply_updates_held`]),
    /// leaving everything else — usage, generation, counts — as it is, so the file is the
    /// one the table would hold had it stepped those rows itself. Keys not in the table
    /// (removed since) are passed over; returns the rows written.
    pub fn write_back(&mut self, keys: &[u64], rows: &[f32], accs: Option<&[f32]>) -> TableResult<usize> {
        self.check_len("written-back rows", keys.len(), rows.len())?;
        if let Some(a) = accs.filter(|a| a.len() != keys.len()) {
            return Err(TableError::Shape { what: "written-back accumulators", keys: keys.len(), dim: 1, expected: keys.len(), got: a.len() });
        }
        let slots: Vec<Option<usize>> = keys.iter().map(|k| self.slot_of(*k)).collect();
        let h = self.header;
        let written = match h.dtype {
            StorageDtype::F32 => self.write_back_t::<f32>(&slots, rows, accs)?,
            StorageDtype::F16 => self.write_back_t::<f16>(&slots, rows, accs)?,
            StorageDtype::Bf16 => self.write_back_t::<bf16>(&slots, rows, accs)?,
        };
        self.write_header(h)?;
        Ok(written)
    }

    fn write_back_t<T: Elem>(&mut self, slots: &[Option<usize>], rows: &[f32], accs: Option<&[f32]>) -> TableResult<usize> {
        let d = self.dim();
        let adagrad = self.header.optimizer == OptimizerKind::Adagrad;
        let path = self.path.clone();
        let p = self.parts_mut::<T>()?;
        let mut written = 0;
        for (n, s) in slots.iter().enumerate() {
            let Some(s) = *s else { continue };
            let row = p.rows.get_mut(s * d..(s + 1) * d).ok_or_else(|| TableError::from(FORMAT.layout(&path, "row outside its section")))?;
            T::store(&rows[n * d..(n + 1) * d], row);
            if let (true, Some(a)) = (adagrad, accs) {
                *p.state.get_mut(s).ok_or_else(|| TableError::from(FORMAT.layout(&path, "state outside its section")))? = a[n];
            }
            written += 1;
        }
        Ok(written)
    }

    fn write_rows(&mut self, keys: &[u64], vals: &[f32], op: RowOp) -> TableResult<UpdateStats> {
        if !self.is_writable() {
            return Err(TableError::ReadOnly);
        }
        self.check_len(if matches!(op, RowOp::Assign) { "row values" } else { "gradients" }, keys.len(), vals.len())?;
        let plan = self.plan_updates(keys, matches!(op, RowOp::Step(_)))?;
        self.write_planned(keys, Vals { vals, rows: None }, op, plan, None)
    }

    /// [`EmbeddingTable::apply_updates`] by a plan made on this table as it is now, inserting
    /// at most `room` keys (the others' gradients are dropped, counted as refused), or,
    /// without `room`, failing with [`TableError::Full`] when the plan's insertions would
    /// pass the load limit.
    /// With `held` (per key: its gradient row in `grads`, or [`HELD`]), the held rows are
    /// not stepped ([`EmbeddingTable::apply_updates_held`]).
    pub(super) fn apply_planned(&mut self, keys: &[u64], grads: &[f32], lr: f32, plan: UpdatePlan, room: Option<u64>, held: Option<&[u32]>) -> TableResult<UpdateStats> {
        if !lr.is_finite() {
            return Err(TableError::Config(format!("learning rate {lr} is not finite")));
        }
        if held.is_none() {
            self.check_len("gradients", keys.len(), grads.len())?;
        }
        self.write_planned(keys, Vals { vals: grads, rows: held }, RowOp::Step(lr), plan, room)
    }

    fn write_planned(&mut self, keys: &[u64], vals: Vals<'_>, op: RowOp, plan: UpdatePlan, room: Option<u64>) -> TableResult<UpdateStats> {
        if !self.is_writable() {
            return Err(TableError::ReadOnly);
        }
        if plan.stamp != self.stamp() || plan.slots.len() != keys.len() {
            return Err(TableError::Config("an update plan was applied to a table that changed since it was made".into()));
        }
        vals.check(self.dim(), keys, &plan.slots)?;
        let h = self.header;
        let max_rows = h.max_rows();
        let new = if h.live_rows + plan.absent > max_rows { self.planned_inserts(keys, &plan)? } else { plan.absent };
        if room.is_none() && h.live_rows + new > max_rows {
            return Err(TableError::Full {
                capacity: h.capacity,
                live: h.live_rows,
                new,
                max_rows,
                load: format::LOAD_NUM as f64 / format::LOAD_DEN as f64,
                suggest: format::capacity_for_rows(h.live_rows + new),
            });
        }
        let room = room.unwrap_or(u64::MAX).min(max_rows.saturating_sub(h.live_rows));
        let stats = match h.dtype {
            StorageDtype::F32 => self.write_rows_t::<f32>(keys, vals, op, plan.slots, room),
            StorageDtype::F16 => self.write_rows_t::<f16>(keys, vals, op, plan.slots, room),
            StorageDtype::Bf16 => self.write_rows_t::<bf16>(keys, vals, op, plan.slots, room),
        }?;
        Ok(stats)
    }

    /// The sections of a writable table, the rows as `T`.
    pub(super) fn parts_mut<T: bytemuck::Pod>(&mut self) -> TableResult<Parts<'_, T>> {
        let l = self.header.layout;
        let path = self.path.clone();
        let Mapping::Rw(map) = &mut self.map else { return Err(TableError::ReadOnly) };
        split_parts(&path, map, &l)
    }

    /// `slots` as [`EmbeddingTable::resolve_slots`] made them: a present key's slot stays
    /// valid while others are inserted (nothing is removed during a batch); an absent key's
    /// probe resumes at the free slot where it ended, which gives the slot a probe from its
    /// home would give (the slots before it still hold other keys), at one cache line per
    /// new key.
    ///
    /// Pass 1 (sequential, list order) finds or inserts every key's slot — an optimizer
    /// step inserts a key only once the admission sketch admits it, and at most `room` keys
    /// — so the slots, and the file, do not depend on how pass 2 is split. Pass 2 steps each
    /// occurrence's row with [`step_row`] and records its usage: in list order, or in
    /// parallel for strictly increasing keys (what the sparse exchange hands the leader:
    /// distinct keys, disjoint rows, the same result).
    fn write_rows_t<T: Elem>(&mut self, keys: &[u64], vals: Vals<'_>, op: RowOp, mut slots: Vec<usize>, room: u64) -> TableResult<UpdateStats> {
        let mut h = self.header;
        let path = self.path.clone();
        let mut p = self.parts_mut::<T>()?;
        let batch = Batch { keys, vals: vals.vals, rows: vals.rows, op, distinct: keys.windows(2).all(|w| w[0] < w[1]) };
        let (inserted, mut stats) = place_keys(&mut p, &mut h, &path, &batch, &mut slots, room)?;
        stats.updated = keys.len() as u64 - stats.refused;
        step_rows(&mut p, &h, &path, &batch, &slots, &inserted)?;
        h.generation = h.generation.wrapping_add(1);
        h.counts.inserted += stats.inserted;
        h.counts.refused += stats.refused;
        // The body changed: checksums of a saved table opened read-write no longer hold.
        (h.sums_valid, h.sums_crc) = (false, 0);
        stats.generation = h.generation;
        p.header[..HEADER_FIELDS].copy_from_slice(&h.encode());
        self.header = h;
        Ok(stats)
    }
}

/// The values of an update batch: one row per key, or (`rows`: per key its row in `vals`,
/// or [`HELD`]) one per key not held elsewhere.
#[derive(Clone, Copy)]
struct Vals<'a> {
    vals: &'a [f32],
    rows: Option<&'a [u32]>,
}

impl Vals<'_> {
    /// Whether these values fit a batch of `keys` planned into `slots`: a row per key, or
    /// every row index inside `vals` and every held key in the table, keys strictly
    /// increasing.
    fn check(&self, dim: usize, keys: &[u64], slots: &[usize]) -> TableResult<()> {
        let Some(rows) = self.rows else { return Ok(()) };
        let have = self.vals.len() / dim.max(1);
        let bad = |why: &str| Err(TableError::Config(format!("an update with held rows {why}")));
        if rows.len() != keys.len() || self.vals.len() % dim.max(1) != 0 {
            return bad("gives a row index per key and whole rows");
        }
        if !keys.windows(2).all(|w| w[0] < w[1]) {
            return bad("takes strictly increasing keys");
        }
        for (r, s) in rows.iter().zip(slots) {
            match *r {
                HELD if s & ABSENT != 0 => return bad("holds a row the table does not have"),
                HELD => {}
                r if r as usize >= have => return bad("names a gradient row past its rows"),
                _ => {}
            }
        }
        Ok(())
    }
}

/// One batch of row writes: its keys, their values (gradients or rows, `dim` per key) and
/// what to do with them.
struct Batch<'a> {
    keys: &'a [u64],
    vals: &'a [f32],
    /// Per key its row in `vals`, or [`HELD`] (not stepped); `None`: row `n` for key `n`.
    rows: Option<&'a [u32]>,
    op: RowOp,
    /// Strictly increasing keys (what the sparse exchange hands the leader): each key comes
    /// once, so rows are disjoint and pass 2 may run in parallel.
    distinct: bool,
}

/// Pass 1 of [`EmbeddingTable::write_rows_t`]: the slot of every key absent from
/// `slots` (found by its probe, or inserted in `h`'s table: for an optimizer step once the
/// admission sketch admits it, and at most `room` keys), in list order; a refused key's
/// slot becomes `SKIP`. Which occurrences inserted their row, and the counts.
fn place_keys<T>(p: &mut Parts<'_, T>, h: &mut Header, path: &Path, batch: &Batch<'_>, slots: &mut [usize], mut room: u64) -> TableResult<(Vec<bool>, UpdateStats)> {
    let Batch { keys, op, distinct, .. } = *batch;
    let admitting = matches!(op, RowOp::Step(_)) && h.admit_after > 1;
    let (depth, width) = (h.extras.sketch_depth, h.extras.sketch_width);
    // Keys refused in this batch, when a key may come again in it.
    let mut refused_keys: HashSet<u64> = HashSet::new();
    let mut inserted = vec![false; keys.len()];
    let mut stats = UpdateStats::default();
    for (n, key) in keys.iter().enumerate() {
        if slots[n] & ABSENT == 0 {
            continue; // found by resolve_slots; nothing moves during a batch
        }
        if !distinct && refused_keys.contains(key) {
            slots[n] = SKIP;
            stats.refused += 1;
            continue;
        }
        let Some((slot, insert)) = index::probe_from(p.index, *key, slots[n] & !ABSENT) else {
            return Err(TableError::CorruptIndex { path: path.to_path_buf(), detail: "no free slot although the load limit holds".into() });
        };
        if insert {
            let admitted = !admitting || admit::bump(p.sketch, depth, width, *key) as u32 >= h.admit_after;
            if !admitted || room == 0 {
                slots[n] = SKIP;
                stats.refused += 1;
                if !distinct {
                    refused_keys.insert(*key);
                }
                continue;
            }
            room -= 1;
            p.index[slot] = *key;
            h.live_rows += 1;
            stats.inserted += 1;
            inserted[n] = true;
            if let Some(a) = p.state.get_mut(slot) {
                *a = h.adagrad_init;
            }
        }
        slots[n] = slot;
    }
    Ok((inserted, stats))
}

/// Pass 2 of [`EmbeddingTable::write_rows_t`]: each occurrence's row (new rows from
/// [`init::init_row`]) stepped with [`step_row`] and its usage recorded, in list order, or
/// in parallel for `distinct` keys (disjoint rows, the same result).
fn step_rows<T: Elem>(p: &mut Parts<'_, T>, h: &Header, path: &Path, batch: &Batch<'_>, slots: &[usize], inserted: &[bool]) -> TableResult<()> {
    let Batch { keys, vals, rows, op, distinct } = *batch;
    let d = h.dim as usize;
    let adagrad = matches!(op, RowOp::Step(_)) && h.optimizer == OptimizerKind::Adagrad;
    let usage = !p.usage.is_empty();
    let in_bounds = |s: usize| (s + 1) * d <= p.rows.len() && (!adagrad || s < p.state.len()) && (!usage || 2 * s + 1 < p.usage.len());
    if slots.iter().any(|s| *s != SKIP && !in_bounds(*s)) {
        return Err(TableError::from(FORMAT.layout(path, "row, state or usage outside its section")));
    }
    struct Shared<T>(*mut T, *mut f32, *mut u32);
    // SAFETY: the pointers are only used for the rows/states/usage of the slots (below).
    unsafe impl<T> Sync for Shared<T> {}
    let shared = Shared(p.rows.as_mut_ptr(), p.state.as_mut_ptr(), p.usage.as_mut_ptr());
    let shared = &shared;
    let (seed, scale, eps) = (h.seed, h.init_scale, h.adagrad_eps);
    // Usage records the generation of this batch (its low 32 bits: ages wrap).
    let now = h.generation.wrapping_add(1) as u32;
    let step = |w: &mut Vec<f32>, n: usize| {
        if let Some(ahead) = slots.get(n + PREFETCH_AHEAD).filter(|s| **s != SKIP) {
            // The row (and usage) PREFETCH_AHEAD keys ahead (random slots: latency-bound).
            prefetch(shared.0.wrapping_add(ahead * d));
            if usage {
                prefetch(shared.2.wrapping_add(2 * ahead));
            }
        }
        let slot = slots[n];
        if slot == SKIP {
            return;
        }
        let r = rows.map_or(n, |r| r[n] as usize);
        if r != HELD as usize {
            // SAFETY: bounds checked above; the row and state of `slot` are touched by this
            // call only (sequentially, or in parallel for distinct keys, hence distinct slots).
            let row = unsafe { std::slice::from_raw_parts_mut(shared.0.add(slot * d), d) };
            if inserted[n] {
                init::init_row::<T>(keys[n], seed, scale, w);
            } else {
                T::load(row, w);
            }
            // SAFETY: as for the row; slot < state.len() checked above.
            let acc = adagrad.then(|| unsafe { &mut *shared.1.add(slot) });
            step_row(w, &vals[r * d..(r + 1) * d], op, acc, eps);
            T::store(w, row);
        }
        if usage {
            // SAFETY: as for the row; 2 * slot + 1 < usage.len() checked above.
            let u = unsafe { std::slice::from_raw_parts_mut(shared.2.add(2 * slot), 2) };
            u[0] = now;
            u[1] = u[1].saturating_add(1);
        }
    };
    if keys.len() >= PAR_MIN_UPDATES && rayon::current_num_threads() > 1 && distinct {
        (0..keys.len()).into_par_iter().with_min_len(256).for_each_init(|| vec![0f32; d], step);
    } else {
        let mut w = vec![0f32; d];
        (0..keys.len()).for_each(|n| step(&mut w, n));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embedding::TableConfig;

    /// A fresh table with usage, in a file whose name is gone once mapped.
    fn table(name: &str, optimizer: OptimizerKind) -> EmbeddingTable {
        let dir = std::env::temp_dir().join(format!("ringrec-update-unit-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = TableConfig { optimizer, track_usage: true, ..TableConfig::new(4, 256) };
        let t = EmbeddingTable::create(&dir.join("t.rrt"), &cfg).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        t
    }

    #[test]
    fn held_rows_written_back_give_the_file_of_every_row_stepped() {
        for opt in [OptimizerKind::Adagrad, OptimizerKind::Sgd] {
            let (mut all, mut held, mut holder) = (table(&format!("all-{opt}"), opt), table(&format!("held-{opt}"), opt), table(&format!("holder-{opt}"), opt));
            let keys: Vec<u64> = (1..40).collect();
            let mut rng = crate::hash::Stream(3);
            for step in 0..5 {
                let g: Vec<f32> = (0..keys.len() * 4).map(|_| rng.unit() as f32 - 0.5).collect();
                all.apply_updates(&keys, &g, 0.1).unwrap();
                // The holder steps every row too: its rows are what a cache computed.
                holder.apply_updates(&keys, &g, 0.1).unwrap();
                // Keys 10..20 held (after the first step, which inserts them).
                let is_held = |k: u64| step > 0 && (10..20).contains(&k);
                let mut sent = Vec::new();
                let rows: Vec<u32> = keys
                    .iter()
                    .enumerate()
                    .map(|(i, k)| match is_held(*k) {
                        true => HELD,
                        false => {
                            sent.extend_from_slice(&g[i * 4..(i + 1) * 4]);
                            (sent.len() / 4 - 1) as u32
                        }
                    })
                    .collect();
                held.apply_updates_held(&keys, &sent, 0.1, &rows).unwrap();
            }
            assert!(held.as_bytes() != all.as_bytes(), "{opt}: the held rows were stepped");
            let back: Vec<u64> = (10..20).chain([999]).collect();
            let mut values = vec![0f32; back.len() * 4];
            holder.lookup(&back, &mut values).unwrap();
            let accs: Vec<f32> = back.iter().map(|k| holder.accumulator(*k).unwrap_or(0.0)).collect();
            // Key 999 is not in the table: passed over.
            assert_eq!(held.write_back(&back, &values, Some(&accs)).unwrap(), 10);
            assert!(held.as_bytes() == all.as_bytes(), "{opt}: written back, the file differs from every row stepped");
            // A held key the table does not have is refused, changing nothing.
            let e = held.apply_updates_held(&[5, 1000], &[0.0; 4], 0.1, &[0, HELD]).unwrap_err();
            assert!(e.to_string().contains("held"), "{e}");
            assert!(held.as_bytes() == all.as_bytes());
        }
    }
}
