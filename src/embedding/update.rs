//! Updates of a table, by the host leader only: an optimizer step per (key, gradient row)
//! ([`EmbeddingTable::apply_updates`]: SGD, or row-wise Adagrad) or an assignment
//! ([`EmbeddingTable::put_rows`]), inserting absent keys. Deterministic: every host applying
//! the same list gets a byte-identical file.

use std::collections::HashSet;

use half::{bf16, f16};
use rayon::prelude::*;

use super::error::{TableError, TableResult};
use super::format::{self, OptimizerKind, StorageDtype, FORMAT, HEADER_FIELDS};
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

/// What an update batch did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UpdateStats {
    /// Keys inserted by this batch.
    pub inserted: u64,
    /// Row updates applied (one per key occurrence).
    pub updated: u64,
    /// The table's generation after the batch.
    pub generation: u64,
}

/// `b.split_at_mut(n)` without the panic.
fn split_mut(b: &mut [u8], n: usize) -> Option<(&mut [u8], &mut [u8])> {
    if n <= b.len() {
        Some(b.split_at_mut(n))
    } else {
        None
    }
}

/// Mutable sections of a writable table.
struct Parts<'a, T> {
    header: &'a mut [u8],
    index: &'a mut [u64],
    rows: &'a mut [T],
    state: &'a mut [f32],
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

    /// Applies one optimizer step per `(key, gradient row)` in the given order (a key given
    /// twice is stepped twice), inserting keys not yet present; a new row starts from the
    /// key's initial row, so it reads the same before and after insertion. Deterministic:
    /// every host applying the same list gets a byte-identical file. Bumps the generation.
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

    fn write_rows(&mut self, keys: &[u64], vals: &[f32], op: RowOp) -> TableResult<UpdateStats> {
        if !self.is_writable() {
            return Err(TableError::ReadOnly);
        }
        self.check_len(if matches!(op, RowOp::Assign) { "row values" } else { "gradients" }, keys.len(), vals.len())?;
        Self::check_keys(keys)?;
        let (slots, new) = self.resolve_slots(keys)?;
        let h = self.header;
        let max_rows = h.max_rows();
        if h.live_rows + new > max_rows {
            return Err(TableError::Full {
                capacity: h.capacity,
                live: h.live_rows,
                new,
                max_rows,
                load: format::LOAD_NUM as f64 / format::LOAD_DEN as f64,
                suggest: format::capacity_for_rows(h.live_rows + new),
            });
        }
        let stats = match h.dtype {
            StorageDtype::F32 => self.write_rows_t::<f32>(keys, vals, op, &slots),
            StorageDtype::F16 => self.write_rows_t::<f16>(keys, vals, op, &slots),
            StorageDtype::Bf16 => self.write_rows_t::<bf16>(keys, vals, op, &slots),
        }?;
        Ok(stats)
    }

    fn parts_mut<T: Elem>(&mut self) -> TableResult<Parts<'_, T>> {
        let l = self.header.layout;
        let path = self.path.clone();
        let Mapping::Rw(map) = &mut self.map else { return Err(TableError::ReadOnly) };
        let bad = || TableError::from(FORMAT.layout(&path, "section outside the mapping"));
        let b: &mut [u8] = map;
        let (header, rest) = split_mut(b, l.index_offset as usize).ok_or_else(bad)?;
        let (index, rest) = split_mut(rest, l.index_len as usize).ok_or_else(bad)?;
        let rest = rest.get_mut((l.rows_offset - l.index_offset - l.index_len) as usize..).ok_or_else(bad)?;
        let (rows, rest) = split_mut(rest, l.rows_len as usize).ok_or_else(bad)?;
        let rest = rest.get_mut((l.state_offset - l.rows_offset - l.rows_len) as usize..).ok_or_else(bad)?;
        let state = rest.get_mut(..l.state_len as usize).ok_or_else(bad)?;
        Ok(Parts { header, index: cast_mut(&path, index)?, rows: cast_mut(&path, rows)?, state: cast_mut(&path, state)? })
    }

    /// `slots` as [`EmbeddingTable::resolve_slots`] made them: a present key's slot stays
    /// valid while others are inserted (keys never move); an absent key's probe resumes at
    /// the free slot where it ended, which gives the slot a probe from its home would give
    /// (the slots before it still hold other keys), at one cache line per new key.
    ///
    /// Pass 1 (sequential, list order) finds or inserts every key's slot, so the slots — and
    /// the file — do not depend on how pass 2 is split. Pass 2 steps each occurrence's row
    /// with [`step_row`]: in list order, or in parallel for strictly increasing keys (what
    /// the sparse exchange hands the leader: distinct keys, disjoint rows, the same result).
    fn write_rows_t<T: Elem>(&mut self, keys: &[u64], vals: &[f32], op: RowOp, slots: &[usize]) -> TableResult<UpdateStats> {
        let mut h = self.header;
        let d = h.dim as usize;
        let path = self.path.clone();
        let p = self.parts_mut::<T>()?;
        let mut slots = slots.to_vec();
        let mut inserted = vec![false; keys.len()];
        let mut stats = UpdateStats { updated: keys.len() as u64, ..UpdateStats::default() };
        for (n, key) in keys.iter().enumerate() {
            if slots[n] & ABSENT == 0 {
                continue; // found by resolve_slots; keys never move
            }
            let Some((slot, insert)) = index::probe_from(p.index, *key, slots[n] & !ABSENT) else {
                return Err(TableError::CorruptIndex { path, detail: "no free slot although the load limit holds".into() });
            };
            if insert {
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
        let adagrad = matches!(op, RowOp::Step(_)) && h.optimizer == OptimizerKind::Adagrad;
        if slots.iter().any(|s| (s + 1) * d > p.rows.len() || (adagrad && *s >= p.state.len())) {
            return Err(TableError::from(FORMAT.layout(&path, "row or state outside its section")));
        }
        struct Shared<T>(*mut T, *mut f32);
        // SAFETY: the pointers are only used for the rows/states of the slots (below).
        unsafe impl<T> Sync for Shared<T> {}
        let shared = Shared(p.rows.as_mut_ptr(), p.state.as_mut_ptr());
        let shared = &shared;
        let (seed, scale, eps) = (h.seed, h.init_scale, h.adagrad_eps);
        let step = |w: &mut Vec<f32>, n: usize| {
            if let Some(ahead) = slots.get(n + PREFETCH_AHEAD) {
                // The row PREFETCH_AHEAD keys ahead (random slots: latency-bound).
                prefetch(shared.0.wrapping_add(ahead * d));
            }
            let slot = slots[n];
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
            step_row(w, &vals[n * d..(n + 1) * d], op, acc, eps);
            T::store(w, row);
        };
        if keys.len() >= PAR_MIN_UPDATES && rayon::current_num_threads() > 1 && keys.windows(2).all(|w| w[0] < w[1]) {
            (0..keys.len()).into_par_iter().with_min_len(256).for_each_init(|| vec![0f32; d], step);
        } else {
            let mut w = vec![0f32; d];
            (0..keys.len()).for_each(|n| step(&mut w, n));
        }
        h.generation = h.generation.wrapping_add(1);
        // The body changed: checksums of a saved table opened read-write no longer hold.
        (h.sums_valid, h.sums_crc) = (false, 0);
        stats.generation = h.generation;
        p.header[..HEADER_FIELDS].copy_from_slice(&h.encode());
        self.header = h;
        Ok(stats)
    }
}
