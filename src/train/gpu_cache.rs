//! [`GpuCache`]: the device side of the GPU hot-row cache (issue 30; the host side, which
//! keys sit in which slot, is [`crate::embedding::cache`]).
//!
//! Each rank's device holds `capacity` slots of rows and their optimizer state (row-wise
//! Adagrad's accumulator; SGD: none). The host table stays the source of truth and the
//! leader keeps updating every row (write-through), so checkpoints, export, predict and
//! growth (rows move between slots of the table, not between values) need nothing. Around
//! a step:
//!
//! - **Staging** ([`GpuCache::stage`]): each unique key of the batch is mapped to a cache
//!   slot or a miss; only the misses are looked up from the host table and uploaded, with
//!   one `u32` source per unique key; [`Op::GatherSourced`] builds the input.
//! - **Update** ([`GpuCache::apply`]): after the exchange, the merged list the leader
//!   applied (every local rank reads it: [`crate::sparse::SparseExchanger::host_result`];
//!   nothing when the leader skipped it as not finite) is filtered to the cached keys, and
//!   those (slot, gradient row) entries are uploaded and applied by [`Op::CacheUpdate`]
//!   with the table's own arithmetic, so cached rows stay equal to the host's bit for bit.
//! - **Between steps** ([`GpuCache::after_step`]): a step that removed rows from the table
//!   (eviction, expiry) empties the cache; every `--gpu-cache-refresh` steps the keys are
//!   chosen anew and the entering keys' rows and accumulators are read from the host table
//!   (after the step's host barrier) and put into their slots ([`Op::CachePut`]).
//!
//! Every copy to the device is queued in stream order before the work that reads it, and a
//! staging buffer is refilled only through [`Device::host`], which waits for the copies
//! still reading it (a run with `RINGREC_HOST_FAULT=no-staging-wait` removes that wait).

use super::batch::Batch;
use super::{TrainConfig, TrainError, TrainResult};
use crate::device::{Device, DeviceResult, Direction, Op, Placement, Scalar};
use crate::embedding::cache::{slots_for_bytes, CacheCounters, CacheDirectory, StagingPlan};
use crate::embedding::{EmbeddingTable, OptimizerKind, RowCounts};
use crate::model::DenseModel;

/// Share of the GPU's free memory (once the model is there) the default cache takes.
pub const DEFAULT_FREE_SHARE: f64 = 0.25;

/// An upload: host staging and the device buffer it goes to.
struct Upload<D: Device, T: Scalar> {
    host: D::Staging<T>,
    dev: D::Buf<T>,
}

impl<D: Device, T: Scalar> Upload<D, T> {
    fn new(dev: &D) -> DeviceResult<Upload<D, T>> {
        Ok(Upload { host: dev.staging(0, Direction::ToDevice)?, dev: dev.alloc(1)? })
    }

    /// The host view of `n` elements to fill (waits for the copies still reading it).
    fn fill<'a>(&'a mut self, dev: &D, n: usize) -> DeviceResult<&'a mut [T]> {
        if dev.host(&mut self.host)?.len() < n {
            self.host = dev.staging(n, Direction::ToDevice)?;
        }
        Ok(&mut dev.host(&mut self.host)?[..n])
    }

    /// Queues the copy of the first `n` elements to the device.
    fn send(&mut self, dev: &D, n: usize) -> DeviceResult<()> {
        if dev.len(&self.dev) < n {
            self.dev = dev.alloc(n)?;
        }
        dev.upload(&mut self.host, n, &mut self.dev)
    }
}

/// The device side of one rank's hot-row cache (see the module docs).
pub struct GpuCache<D: Device> {
    dir: CacheDirectory,
    plan: StagingPlan,
    refresh_every: u64,
    dim: usize,
    adagrad: bool,
    lr: f32,
    eps: f32,
    /// Cached rows (capacity x dim) and accumulators (capacity; one value for SGD).
    rows: D::Buf<f32>,
    acc: D::Buf<f32>,
    /// The update's and the refresh's uploads: slots, rows, accumulators.
    slots: Upload<D, u32>,
    values: Upload<D, f32>,
    accs: Upload<D, f32>,
    /// Indices of the merged list's cached entries (scratch).
    at: Vec<u32>,
    slot_list: Vec<u32>,
    /// The table's removals when last seen.
    removed: u64,
}

/// Rows removed from a table so far (eviction and expiry).
fn removed(c: RowCounts) -> u64 {
    c.evicted + c.expired
}

/// The slots of this run's cache on `dev` (`--gpu-cache-mib`, or its default: on a GPU
/// [`DEFAULT_FREE_SHARE`] of its free memory, on other devices none), at most the rows the
/// table can hold. 0 where the run cannot have one.
pub fn cache_slots<D: Device>(cfg: &TrainConfig, dev: &D, table: &EmbeddingTable) -> usize {
    let h = table.header();
    let bytes = match cfg.gpu_cache_mib {
        Some(mib) => mib << 20,
        None if cfg.device == Placement::Cpu || cfg.gpu_cache_unsupported().is_some() => 0,
        None => dev.free_memory().map_or(0, |free| (free as f64 * DEFAULT_FREE_SHARE) as u64),
    };
    slots_for_bytes(bytes, table.dim(), h.optimizer).min(table.capacity() as usize)
}

impl<D: Device> GpuCache<D> {
    /// A cache of `slots` slots on `dev` for rows of `table`, updated with the sparse
    /// learning rate `lr`, its keys chosen every `refresh_every` steps.
    pub fn new(dev: &D, table: &EmbeddingTable, slots: usize, lr: f32, refresh_every: u64) -> TrainResult<GpuCache<D>> {
        let h = table.header();
        let dim = table.dim();
        let adagrad = h.optimizer == OptimizerKind::Adagrad;
        let err = |e: crate::device::DeviceError| TrainError::from(e);
        Ok(GpuCache {
            dir: CacheDirectory::new(slots),
            plan: StagingPlan::default(),
            refresh_every: refresh_every.max(1),
            dim,
            adagrad,
            lr,
            eps: h.adagrad_eps,
            rows: dev.alloc((slots * dim).max(1)).map_err(err)?,
            acc: dev.alloc(slots.max(1)).map_err(err)?,
            slots: Upload::new(dev).map_err(err)?,
            values: Upload::new(dev).map_err(err)?,
            accs: Upload::new(dev).map_err(err)?,
            at: Vec::new(),
            slot_list: Vec::new(),
            removed: removed(table.counts()),
        })
    }

    /// Its number of slots.
    pub fn capacity(&self) -> usize {
        self.dir.capacity()
    }

    /// Device bytes its slots take.
    pub fn bytes(&self) -> u64 {
        (self.capacity() * (self.dim + self.adagrad as usize) * 4) as u64
    }

    /// What it did so far (the model's own transfers not included).
    pub fn counters(&self) -> &CacheCounters {
        self.dir.counters()
    }

    /// Stages batch `b` for `model`: the misses' rows from `table`, every unique key's
    /// source, the inverse map, dense features and labels; records its keys' occurrences.
    pub fn stage(&mut self, model: &mut DenseModel<D>, table: &EmbeddingTable, b: &Batch) -> TrainResult<()> {
        self.dir.observe(&b.uniq, &b.inverse);
        self.dir.plan(&b.uniq, b.len(), &mut self.plan);
        let (st, source) = model.stage_sourced(b.len(), b.uniq.len(), self.plan.misses.len())?;
        table.lookup(&self.plan.misses, st.emb)?;
        source.copy_from_slice(&self.plan.source);
        st.inverse.copy_from_slice(&b.inverse);
        st.dense.copy_from_slice(&b.dense);
        st.labels.copy_from_slice(&b.labels);
        Ok(())
    }

    /// Loads the staged batch into `model`, its input gathered from the cache and the
    /// staged misses.
    pub fn load(&self, model: &mut DenseModel<D>) -> TrainResult<(usize, usize)> {
        Ok(model.load_cached(&self.rows)?)
    }

    /// Applies the merged list the leader applied (`keys`, normalised gradient rows
    /// `grads`) to the cached rows on `dev`.
    pub fn apply(&mut self, dev: &D, keys: &[u64], grads: &[f32]) -> TrainResult<()> {
        self.dir.select_cached(keys, &mut self.at, &mut self.slot_list);
        let (n, dim) = (self.at.len(), self.dim);
        if n == 0 {
            return Ok(());
        }
        self.slots.fill(dev, n)?.copy_from_slice(&self.slot_list);
        let rows = self.values.fill(dev, n * dim)?;
        for (row, i) in rows.chunks_exact_mut(dim).zip(&self.at) {
            let i = *i as usize;
            row.copy_from_slice(&grads[i * dim..(i + 1) * dim]);
        }
        self.slots.send(dev, n)?;
        self.values.send(dev, n * dim)?;
        self.dir.counters_mut().uploaded(4 * (n + n * dim));
        let (slots, grads) = (&self.slots.dev, &self.values.dev);
        dev.exec(Op::CacheUpdate { rows: &mut self.rows, acc: &mut self.acc, slots, grads, n, dim, lr: self.lr, eps: self.eps, adagrad: self.adagrad })?;
        Ok(())
    }

    /// Between steps, after global step `step` (from 1) and its host barrier: empties the
    /// cache if the step removed rows from `table`; every `--gpu-cache-refresh` steps,
    /// chooses its keys anew and puts the entering keys' rows and accumulators, read from
    /// `table`, into their slots.
    pub fn after_step(&mut self, dev: &D, table: &EmbeddingTable, step: u64) -> TrainResult<()> {
        if self.capacity() == 0 {
            return Ok(());
        }
        let now = removed(table.counts());
        if now != self.removed {
            self.removed = now;
            self.dir.clear();
        }
        if step % self.refresh_every != 0 {
            return Ok(());
        }
        let r = self.dir.refresh(|k| table.contains(k));
        let (n, dim) = (r.entering.len(), self.dim);
        if n == 0 {
            return Ok(());
        }
        let keys: Vec<u64> = r.entering.iter().map(|(k, _)| *k).collect();
        for (s, (_, slot)) in self.slots.fill(dev, n)?.iter_mut().zip(&r.entering) {
            *s = *slot;
        }
        table.lookup(&keys, self.values.fill(dev, n * dim)?)?;
        let has_acc = self.adagrad;
        if has_acc {
            for (a, k) in self.accs.fill(dev, n)?.iter_mut().zip(&keys) {
                *a = table.accumulator(*k).unwrap_or(0.0);
            }
            self.accs.send(dev, n)?;
        }
        self.slots.send(dev, n)?;
        self.values.send(dev, n * dim)?;
        self.dir.counters_mut().uploaded(4 * (n + n * dim + if has_acc { n } else { 0 }));
        let (slots, values, accs) = (&self.slots.dev, &self.values.dev, &self.accs.dev);
        dev.exec(Op::CachePut { rows: &mut self.rows, acc: &mut self.acc, slots, values, accs, n, dim, has_acc })?;
        Ok(())
    }

    /// The cached rows and accumulators as the device holds them (waits): (key, row,
    /// accumulator) by slot, for tests.
    pub fn contents(&self, dev: &D) -> TrainResult<Vec<(u64, Vec<f32>, f32)>> {
        let rows = dev.to_vec(&self.rows, dev.len(&self.rows))?;
        let acc = dev.to_vec(&self.acc, dev.len(&self.acc))?;
        let dim = self.dim;
        Ok(self.dir.entries().into_iter().map(|(k, s)| (k, rows[s as usize * dim..(s as usize + 1) * dim].to_vec(), if self.adagrad { acc[s as usize] } else { 0.0 })).collect())
    }
}
