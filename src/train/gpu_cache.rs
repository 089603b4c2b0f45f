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
//!   one `u32` source per unique key (a miss the table does not hold, in an f32 table: its
//!   key only, the device makes its initial row, [`Op::InitRows`]);
//!   [`Op::GatherSourced`] builds the input. A multi-hot batch's list ids are keys like
//!   any other (counted per occurrence for the refresh's choice), and its bags are pooled
//!   from the same sources ([`Op::PoolBagsSourced`]); the key gradients are per unique key
//!   either way, so the update below reads them unchanged.
//! - **Update** ([`GpuCache::apply`]): after the exchange, the merged list the leader
//!   applied (every local rank reads it: [`crate::sparse::SparseExchanger::host_result`];
//!   nothing when the leader skipped it as not finite) is filtered to the cached keys, and
//!   those (slot, gradient row) entries are uploaded and applied by [`Op::CacheUpdate`]
//!   with the table's own arithmetic, so cached rows stay equal to the host's bit for bit.
//! - **Between steps** ([`GpuCache::after_step`]): a step that removed rows from the table
//!   (eviction, expiry) empties the cache; every `--gpu-cache-refresh` steps, and after a
//!   step that leaves the cache empty (the first one, a removal), the keys are chosen anew and the entering keys' rows and accumulators are read from the host table
//!   (after the step's host barrier) and put into their slots ([`Op::CachePut`]).
//!
//! Every copy to the device is queued in stream order before the work that reads it, and a
//! staging buffer is refilled only through [`Device::host`], which waits for the copies
//! still reading it (a run with `RINGREC_HOST_FAULT=no-staging-wait` removes that wait).
//!
//! **Write-back** (`--gpu-cache-mode write-back`, [`GpuCacheMode`]; one rank per host): the
//! cached rows and their accumulators are the truth for the keys they hold. The leader's
//! update holds them ([`crate::embedding::EmbeddingTable::apply_updates_held`]: placement,
//! eviction's sparing and usage as in write-through, the row not stepped). In a world of one
//! rank the step exchanges only the misses' key gradients, the update takes the batch's
//! every key, and the device steps the cached rows from the key gradients it holds
//! ([`GpuCache::apply_own`]); where a key gradient is not finite (or under `--sparse-normalize
//! weighted`) the step goes the write-through way, so `--nan-policy` decides on the same
//! list. With more hosts every key is exchanged, the leader holds the merged keys its rank
//! caches, and the cache applies the merged list as in write-through. Rows are written back (gathered on the device by slot with
//! [`Op::GatherRows`], downloaded, and put into the host table with their accumulators,
//! [`crate::embedding::EmbeddingTable::write_back`], which leaves usage and generation as
//! they are) when they leave at a refresh, before the cache empties after a removal, and
//! all of them before anything else reads the table ([`GpuCache::write_back_all`]: the
//! trainer's checkpoints, evaluations and end), so the table's file is write-through's
//! byte for byte whenever it is read. The download is waited for by [`Device::host`] on
//! its staging; `RINGREC_HOST_FAULT=no-write-back-wait` (`--device host`) skips the
//! write-backs, so the table's readers no longer wait for them: the tests must catch it.

use super::batch::Batch;
use super::{TrainConfig, TrainError, TrainResult};
use crate::device::{Device, DeviceResult, Direction, Op, Scalar, CACHE_MISS};
use crate::embedding::cache::{slots_for_bytes, CacheCounters, CacheDirectory, StagingPlan, UpdateSelection};
use crate::embedding::{EmbeddingTable, OptimizerKind, RowCounts, StorageDtype};
use crate::model::DenseModel;

/// `--gpu-cache-mode`: who updates the cached rows (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GpuCacheMode {
    /// The host table's leader updates every row; the cache updates its copies.
    #[default]
    WriteThrough,
    /// The device alone updates the cached rows; they are written back before the host
    /// table is read.
    WriteBack,
}

crate::config::named_enum!(GpuCacheMode { WriteThrough => "write-through", WriteBack => "write-back" });

/// An upload: host staging (of `cap` elements) and the device buffer it goes to.
struct Upload<D: Device, T: Scalar> {
    host: D::Staging<T>,
    cap: usize,
    dev: D::Buf<T>,
}

impl<D: Device, T: Scalar> Upload<D, T> {
    fn new(dev: &D) -> DeviceResult<Upload<D, T>> {
        Ok(Upload { host: dev.staging(0, Direction::ToDevice)?, cap: 0, dev: dev.alloc(1)? })
    }

    /// The host view of `n` elements to fill: one [`Device::host`], which waits for the
    /// copies still reading the staging (the wait `RINGREC_HOST_FAULT=no-staging-wait`
    /// removes).
    fn fill<'a>(&'a mut self, dev: &D, n: usize) -> DeviceResult<&'a mut [T]> {
        if self.cap < n {
            self.host = dev.staging(n, Direction::ToDevice)?;
            self.cap = n;
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

/// A download: the device buffer gathered into and the host staging it comes down to.
struct Download<D: Device, T: Scalar> {
    dev: D::Buf<T>,
    host: D::Staging<T>,
    cap: usize,
}

impl<D: Device, T: Scalar> Download<D, T> {
    fn new(dev: &D) -> DeviceResult<Download<D, T>> {
        Ok(Download { dev: dev.alloc(1)?, host: dev.staging(0, Direction::FromDevice)?, cap: 0 })
    }

    /// The device buffer of at least `n` elements to gather into.
    fn target(&mut self, dev: &D, n: usize) -> DeviceResult<&mut D::Buf<T>> {
        if dev.len(&self.dev) < n {
            self.dev = dev.alloc(n)?;
        }
        Ok(&mut self.dev)
    }

    /// Queues the copy of the first `n` elements down and returns them once there (the
    /// wait is [`Device::host`]'s).
    fn fetch(&mut self, dev: &D, n: usize) -> DeviceResult<&[T]> {
        if self.cap < n {
            self.host = dev.staging(n, Direction::FromDevice)?;
            self.cap = n;
        }
        dev.download(&mut self.dev, n, &mut self.host)?;
        Ok(&dev.host(&mut self.host)?[..n])
    }
}

/// Whether `RINGREC_HOST_FAULT=no-write-back-wait` is set on the host-kernels device `dev`:
/// the host table's readers then do not wait for the cache's write-back (it is skipped),
/// so a test comparing the table must fail.
fn write_back_skipped<D: Device>(dev: &D) -> bool {
    dev.kind() == "host-kernels" && crate::config::var("RINGREC_HOST_FAULT").is_some_and(|v| v == crate::device::HostFault::NoWriteBackWait.name())
}

/// The host table as [`GpuCache::after_step`] uses it: read (write-through), or read and
/// written (write-back, on the rank that is its leader).
pub enum TableAt<'a> {
    /// Read only.
    Read(&'a EmbeddingTable),
    /// Read and written.
    Write(&'a mut EmbeddingTable),
}

impl TableAt<'_> {
    fn get(&self) -> &EmbeddingTable {
        match self {
            TableAt::Read(t) => t,
            TableAt::Write(t) => t,
        }
    }

    fn get_mut(&mut self) -> TrainResult<&mut EmbeddingTable> {
        match self {
            TableAt::Read(_) => Err(TrainError::Config("internal: a write-back to a host table this rank only reads".into())),
            TableAt::Write(t) => Ok(t),
        }
    }
}

/// The step's own key gradients ([`GpuCache::apply`]): this rank's unique keys (in key
/// order), their gradient rows as downloaded, and the device buffer that holds them.
pub struct OwnGrads<'a, D: Device> {
    /// The unique keys of the step's batch, sorted.
    pub keys: &'a [u64],
    /// Their gradient rows (keys x dim), the host copy.
    pub host: &'a [f32],
    /// The same rows on the device.
    pub dev: &'a D::Buf<f32>,
    /// The batch's sources as the device holds them (one per key), if it does.
    pub sources: Option<&'a D::Buf<u32>>,
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
    /// The update's and the refresh's uploads: slots, rows, accumulators, and the rows'
    /// indices among the step's own key gradients.
    slots: Upload<D, u32>,
    index: Upload<D, u32>,
    values: Upload<D, f32>,
    accs: Upload<D, f32>,
    /// The merged list's cached entries (scratch).
    selection: UpdateSelection,
    /// The table's removals when last seen.
    removed: u64,
    /// Write-back ([`GpuCacheMode::WriteBack`]): the cached rows are the truth.
    write_back: bool,
    /// Write-back: whether a cached row changed since it was last written back.
    dirty: bool,
    /// `RINGREC_HOST_FAULT=no-write-back-wait` (tests): write-backs are skipped.
    skip_write_back: bool,
    /// Write-back's downloads: the rows and accumulators gathered by slot.
    down_rows: Download<D, f32>,
    down_accs: Download<D, f32>,
    /// Write-back's step (scratch, [`GpuCache::split_own`]): the misses' key gradients and
    /// per unique key its row among them or `HELD`.
    sent: Vec<f32>,
    held: Vec<u32>,
    /// Staging scratch: the misses absent from the table (positions among the misses), and
    /// each miss's staged row.
    absent: Vec<u32>,
    packed: Vec<u32>,
    /// A per-table cache's hits ([`GpuCache::gather_hits`]): their slots and rows gathered.
    hit_slots: Upload<D, u32>,
    hit_rows: D::Buf<f32>,
}

/// Rows removed from a table so far (eviction and expiry).
fn removed(c: RowCounts) -> u64 {
    c.evicted + c.expired
}

/// The slots of this run's cache (`--gpu-cache-mib`; none by default), at most the rows the
/// table can hold. 0 where the run cannot have one.
///
/// The default is off, not a share of the GPU's free memory: on 2026-11-28 the cache cost
/// more host time per step than it saved (docs/BENCHMARKS.md, "The GPU hot-row cache's host
/// work") and a 60-step H100 run with a 128 MiB cache was slower than without one.
pub fn cache_slots(cfg: &TrainConfig, table: &EmbeddingTable) -> usize {
    slots_in(cache_bytes(cfg), table)
}

/// The device memory `--gpu-cache-mib` gives the cache, in bytes (none by default).
pub fn cache_bytes(cfg: &TrainConfig) -> u64 {
    match cfg.gpu_cache_mib {
        Some(mib) => (mib * (1u64 << 20) as f64) as u64,
        None => 0,
    }
}

/// The slots `bytes` of device memory give a cache of `table`'s rows, at most the rows
/// the table can hold.
pub fn slots_in(bytes: u64, table: &EmbeddingTable) -> usize {
    slots_for_bytes(bytes, table.dim(), table.header().optimizer).min(table.capacity() as usize)
}

impl<D: Device> GpuCache<D> {
    /// A cache of `slots` slots on `dev` for rows of `table`, updated with the sparse
    /// learning rate `lr`, its keys chosen every `refresh_every` steps.
    pub fn new(dev: &D, table: &EmbeddingTable, slots: usize, lr: f32, refresh_every: u64, mode: GpuCacheMode) -> TrainResult<GpuCache<D>> {
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
            index: Upload::new(dev).map_err(err)?,
            values: Upload::new(dev).map_err(err)?,
            accs: Upload::new(dev).map_err(err)?,
            selection: UpdateSelection::default(),
            removed: removed(table.counts()),
            write_back: mode == GpuCacheMode::WriteBack,
            dirty: false,
            skip_write_back: write_back_skipped(dev),
            down_rows: Download::new(dev).map_err(err)?,
            down_accs: Download::new(dev).map_err(err)?,
            sent: Vec::new(),
            held: Vec::new(),
            absent: Vec::new(),
            packed: Vec::new(),
            hit_slots: Upload::new(dev).map_err(err)?,
            hit_rows: dev.alloc(1).map_err(err)?,
        })
    }

    /// Whether it runs in write-back ([`GpuCacheMode::WriteBack`]).
    pub fn is_write_back(&self) -> bool {
        self.write_back
    }

    /// Whether it holds `key`'s row.
    pub fn holds(&self, key: u64) -> bool {
        self.dir.slot(key).is_some()
    }

    /// Write-back, for the step of the batch last staged: the misses, the keys the
    /// exchange and the host's update take, with their key gradients gathered from this
    /// rank's own `grads` (its unique keys' rows, in key order); and per unique key its
    /// row among those, or [`crate::embedding::update::HELD`] (cached: the device steps it,
    /// [`GpuCache::apply_own`]).
    pub fn split_own(&mut self, grads: &[f32]) -> (&[u64], &[f32], &[u32]) {
        let misses = self.plan.split_held(grads, self.dim, &mut self.sent, &mut self.held);
        (misses, &self.sent, &self.held)
    }

    /// Write-back: steps the cached rows of the batch last staged with this rank's own key
    /// gradients, where the device holds them (`own`): from the batch's sources on the
    /// device when it holds those (nothing travels), else with the slots and indices
    /// uploaded.
    pub fn apply_own(&mut self, dev: &D, own: OwnGrads<'_, D>) -> TrainResult<()> {
        let (dim, n) = (self.dim, own.keys.len());
        if self.plan.hits == 0 {
            return Ok(());
        }
        self.dirty = true;
        if let Some(sources) = own.sources {
            dev.exec(Op::CacheUpdate { rows: &mut self.rows, acc: &mut self.acc, slots: sources, grads: own.dev, index: None, n, dim, lr: self.lr, eps: self.eps, adagrad: self.adagrad })?;
            return Ok(());
        }
        let hits = self.plan.hits;
        let (slots, index) = (self.slots.fill(dev, hits)?, &mut Vec::with_capacity(hits));
        let mut k = 0;
        for (u, s) in self.plan.source.iter().enumerate() {
            if s & CACHE_MISS == 0 {
                slots[k] = *s;
                index.push(u as u32);
                k += 1;
            }
        }
        self.index.fill(dev, hits)?.copy_from_slice(index);
        self.slots.send(dev, hits)?;
        self.index.send(dev, hits)?;
        self.dir.counters_mut().uploaded(8 * hits);
        let (slots, index) = (&self.slots.dev, &self.index.dev);
        dev.exec(Op::CacheUpdate { rows: &mut self.rows, acc: &mut self.acc, slots, grads: own.dev, index: Some(index), n: hits, dim, lr: self.lr, eps: self.eps, adagrad: self.adagrad })?;
        Ok(())
    }

    /// Write-back: writes the cached rows and accumulators of `entries` (key, slot) into
    /// `table` (see the module docs): gathered on the device, downloaded, put.
    fn write_back_entries(&mut self, dev: &D, table: &mut EmbeddingTable, entries: &[(u64, u32)]) -> TrainResult<()> {
        let (n, dim) = (entries.len(), self.dim);
        if n == 0 || self.skip_write_back {
            return Ok(());
        }
        for (s, (_, slot)) in self.slots.fill(dev, n)?.iter_mut().zip(entries) {
            *s = *slot;
        }
        self.slots.send(dev, n)?;
        self.dir.counters_mut().uploaded(4 * n);
        let index = &self.slots.dev;
        let out = self.down_rows.target(dev, n * dim)?;
        dev.exec(Op::GatherRows { table: &self.rows, index, out, rows: n, per_row: 1, dim, stride: dim })?;
        if self.adagrad {
            let out = self.down_accs.target(dev, n)?;
            dev.exec(Op::GatherRows { table: &self.acc, index, out, rows: n, per_row: 1, dim: 1, stride: 1 })?;
        }
        let keys: Vec<u64> = entries.iter().map(|(k, _)| *k).collect();
        let accs = if self.adagrad { Some(self.down_accs.fetch(dev, n)?.to_vec()) } else { None };
        let rows = self.down_rows.fetch(dev, n * dim)?;
        self.dir.counters_mut().downloaded(4 * (n * dim + accs.as_ref().map_or(0, |a| a.len())));
        table.write_back(&keys, rows, accs.as_deref())?;
        Ok(())
    }

    /// Write-back: writes every cached row changed since the last write-back into the host
    /// table (this rank its leader), before anything reads it. Nothing in write-through.
    pub fn write_back_all(&mut self, dev: &D, table: &mut EmbeddingTable) -> TrainResult<()> {
        if !self.write_back || !self.dirty {
            return Ok(());
        }
        let entries = self.dir.entries();
        self.write_back_entries(dev, table, &entries)?;
        self.dirty = false;
        Ok(())
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
    /// source, the inverse map, dense features, labels and a multi-hot batch's bags (its
    /// ids pooled from the same sources); records its keys' occurrences, list ids included.
    /// In an f32 table, a miss absent from the table (it reads as its initial row) travels
    /// as its key and the device makes its row ([`DenseModel::stage_new_rows`]): the
    /// present misses' rows are staged first, the new ones after them, and the staged
    /// sources say so (the plan's own stay in miss order).
    pub fn stage(&mut self, model: &mut DenseModel<D>, table: &EmbeddingTable, b: &Batch) -> TrainResult<()> {
        self.stage_rows(model, table, b)?;
        super::predict::stage_bags(model, b)
    }

    /// [`GpuCache::stage`] but the bags.
    fn stage_rows(&mut self, model: &mut DenseModel<D>, table: &EmbeddingTable, b: &Batch) -> TrainResult<()> {
        self.dir.plan(&b.uniq, &[&b.inverse, &b.bag_index], b.len(), &mut self.plan);
        let misses = &self.plan.misses;
        let h = table.header();
        let (st, source) = model.stage_sourced(b.len(), b.uniq.len(), misses.len())?;
        st.inverse.copy_from_slice(&b.inverse);
        st.dense.copy_from_slice(&b.dense);
        st.labels.copy_from_slice(&b.labels);
        source.copy_from_slice(&self.plan.source);
        if h.dtype != StorageDtype::F32 {
            // The device makes f32 rows only; a half table's rows are rounded on the host.
            table.lookup(misses, st.emb)?;
            return Ok(());
        }
        let present = table.lookup_present(misses, st.emb, &mut self.absent)?;
        if self.absent.is_empty() {
            return Ok(());
        }
        // Miss i's row: the next present row, or after all of them for an absent key.
        self.packed.clear();
        let (mut p, mut a) = (0u32, self.absent.iter().peekable());
        for i in 0..misses.len() as u32 {
            if a.next_if_eq(&&i).is_some() {
                self.packed.push(present as u32 + (self.packed.len() as u32 - p));
            } else {
                self.packed.push(p);
                p += 1;
            }
        }
        for s in source.iter_mut().filter(|s| **s & CACHE_MISS != 0) {
            *s = CACHE_MISS | self.packed[(*s & !CACHE_MISS) as usize];
        }
        let keys = model.stage_new_rows(self.absent.len(), h.seed, h.init_scale)?;
        for (k, i) in keys.chunks_exact_mut(2).zip(&self.absent) {
            let key = misses[*i as usize];
            k.copy_from_slice(&[key as u32, (key >> 32) as u32]);
        }
        Ok(())
    }

    /// A `--table` table's cache ([`super::table_caches`]): maps its keys of the batch
    /// (`keys`, sorted; `occurrences`: the batch's lists of indices into them) to their
    /// slots or misses, recording them for the refresh as [`GpuCache::stage`] does. Returns
    /// the plan: per key its source, and the misses in key order.
    pub fn plan_keys(&mut self, keys: &[u64], occurrences: &[&[u32]], samples: usize) -> &StagingPlan {
        self.dir.plan(keys, occurrences, samples, &mut self.plan);
        &self.plan
    }

    /// After [`GpuCache::plan_keys`]: the hits' rows, in key order, gathered on `dev` from
    /// their slots ([`Op::GatherRows`]) into a buffer of the cache's; returns it and its
    /// values (hits x dim); [`GpuCache::hit_rows`] holds them.
    pub fn gather_hits(&mut self, dev: &D) -> TrainResult<usize> {
        let (hits, dim) = (self.plan.hits, self.dim);
        if hits == 0 {
            return Ok(0);
        }
        let slots = self.hit_slots.fill(dev, hits)?;
        for (s, src) in slots.iter_mut().zip(self.plan.source.iter().filter(|s| **s & CACHE_MISS == 0)) {
            *s = *src;
        }
        self.hit_slots.send(dev, hits)?;
        self.dir.counters_mut().uploaded(4 * hits);
        if dev.len(&self.hit_rows) < hits * dim {
            self.hit_rows = dev.alloc(hits * dim)?;
        }
        dev.exec(Op::GatherRows { table: &self.rows, index: &self.hit_slots.dev, out: &mut self.hit_rows, rows: hits, per_row: 1, dim, stride: dim })?;
        Ok(hits * dim)
    }

    /// The rows [`GpuCache::gather_hits`] gathered.
    pub fn hit_rows(&self) -> &D::Buf<f32> {
        &self.hit_rows
    }

    /// The plan of the keys last planned.
    pub fn plan(&self) -> &StagingPlan {
        &self.plan
    }

    /// Loads the staged batch into `model`, its input gathered from the cache and the
    /// staged misses.
    pub fn load(&self, model: &mut DenseModel<D>) -> TrainResult<(usize, usize)> {
        Ok(model.load_cached(&self.rows)?)
    }

    /// Applies the merged list the leader applied (`keys`, normalised gradient rows
    /// `grads`) to the cached rows on `dev`, after [`GpuCache::stage`] of the same batch.
    /// Where every cached entry's row is, bit for bit, this rank's own key gradient of the
    /// step (`own`; in a world of one rank the merge of one list normalised by a count of 1),
    /// the rows are read where the device holds them and only slots and indices travel, or
    /// nothing where the list is the batch's own key list and the device holds its sources;
    /// else the rows are uploaded.
    pub fn apply(&mut self, dev: &D, keys: &[u64], grads: &[f32], own: Option<OwnGrads<'_, D>>) -> TrainResult<()> {
        let dim = self.dim;
        let same = self.dir.select_update(&self.plan, keys, grads, dim, own.as_ref().map(|o| (o.keys, o.host)), &mut self.selection);
        let sel = &self.selection;
        let n = sel.at.len();
        if n == 0 {
            return Ok(());
        }
        self.dirty = true;
        if let (true, Some(o)) = (same, own) {
            // The batch's own key list: its sources on the device are the slots, entry i
            // its key gradient row i, the misses skipped. Nothing travels.
            if let (true, Some(sources)) = (sel.from_plan, o.sources) {
                let n = o.keys.len();
                dev.exec(Op::CacheUpdate { rows: &mut self.rows, acc: &mut self.acc, slots: sources, grads: o.dev, index: None, n, dim, lr: self.lr, eps: self.eps, adagrad: self.adagrad })?;
                return Ok(());
            }
            self.slots.fill(dev, n)?.copy_from_slice(&sel.slots);
            self.index.fill(dev, n)?.copy_from_slice(&sel.own_index);
            self.slots.send(dev, n)?;
            self.index.send(dev, n)?;
            self.dir.counters_mut().uploaded(8 * n);
            let (slots, index) = (&self.slots.dev, &self.index.dev);
            dev.exec(Op::CacheUpdate { rows: &mut self.rows, acc: &mut self.acc, slots, grads: o.dev, index: Some(index), n, dim, lr: self.lr, eps: self.eps, adagrad: self.adagrad })?;
            return Ok(());
        }
        self.slots.fill(dev, n)?.copy_from_slice(&sel.slots);
        let rows = self.values.fill(dev, n * dim)?;
        for (row, i) in rows.chunks_exact_mut(dim).zip(&sel.at) {
            let i = *i as usize;
            row.copy_from_slice(&grads[i * dim..(i + 1) * dim]);
        }
        self.slots.send(dev, n)?;
        self.values.send(dev, n * dim)?;
        self.dir.counters_mut().uploaded(4 * (n + n * dim));
        let (slots, grads) = (&self.slots.dev, &self.values.dev);
        dev.exec(Op::CacheUpdate { rows: &mut self.rows, acc: &mut self.acc, slots, grads, index: None, n, dim, lr: self.lr, eps: self.eps, adagrad: self.adagrad })?;
        Ok(())
    }

    /// Between steps, after global step `step` (from 1) and its host barrier: empties the
    /// cache if the step removed rows from `table`; every `--gpu-cache-refresh` steps (and
    /// while it is empty), chooses its keys anew and puts the entering keys' rows and accumulators, read from
    /// `table`, into their slots.
    ///
    /// In write-back the rows leaving are written into `host` first: before the cache
    /// empties after a removal (every cached key still in the table), at a refresh the
    /// keys that leave.
    pub fn after_step(&mut self, dev: &D, mut host: TableAt<'_>, step: u64) -> TrainResult<()> {
        if self.capacity() == 0 {
            return Ok(());
        }
        let now = removed(host.get().counts());
        if now != self.removed {
            self.removed = now;
            if self.write_back && self.dirty {
                self.write_back_all(dev, host.get_mut()?)?;
            }
            self.dir.clear();
        }
        // Due every `--gpu-cache-refresh` steps, and after any step that leaves it empty
        // (the first, a removal): an empty cache waits for nothing.
        if step % self.refresh_every != 0 && !self.dir.is_empty() {
            return Ok(());
        }
        let table = host.get();
        let r = self.dir.refresh(|k| table.contains(k));
        if self.write_back && !r.leaving.is_empty() {
            self.write_back_entries(dev, host.get_mut()?, &r.leaving)?;
        }
        let table = host.get();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{CpuDevice, HostDelay, HostFault, HostKernels, HostOptions};
    use crate::embedding::TableConfig;
    use crate::hash::Stream;

    const DIM: usize = 8;
    const LR: f32 = 0.05;

    /// A table of keys `0..keys` after one update, in a fresh file.
    fn table(name: &str, optimizer: OptimizerKind, keys: u64) -> EmbeddingTable {
        let dir = std::env::temp_dir().join(format!("ringrec-gpu-cache-unit-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = TableConfig { optimizer, ..TableConfig::new(DIM as u32, 1024) };
        let mut t = EmbeddingTable::create(&dir.join("t.rrt"), &cfg).unwrap();
        // The mapping outlives the file's name: nothing is left in the temp directory.
        std::fs::remove_dir_all(&dir).unwrap();
        let all: Vec<u64> = (0..keys).collect();
        t.apply_updates(&all, &grads(&mut Stream(99), all.len()), LR).unwrap();
        t
    }

    /// Gradient rows with the values that test rounding: large and tiny, negative, zero
    /// and negative zero.
    fn grads(rng: &mut Stream, n: usize) -> Vec<f32> {
        (0..n * DIM)
            .map(|i| match i % 11 {
                0 => 0.0,
                1 => -0.0,
                2 => (rng.unit() as f32 - 0.5) * 1e-20,
                3 => (rng.unit() as f32 - 0.5) * 1e6,
                _ => rng.unit() as f32 * 2.0 - 1.0,
            })
            .collect()
    }

    /// Caches the keys of `table` seen most (refresh after one step), then applies
    /// `rounds` merged lists to both; returns the cached (key, row, accumulator) triples
    /// that differ from the table's, with the number compared.
    fn run<D: Device>(dev: &D, optimizer: OptimizerKind, name: &str, rounds: usize) -> (Vec<u64>, usize) {
        run_with(dev, optimizer, name, rounds, Own::No).0
    }

    /// Whether [`run_with`]'s lists are also the step's own key gradients, and how.
    #[derive(Clone, Copy, PartialEq)]
    enum Own {
        No,
        /// On the device too.
        Rows,
        /// On the device too, with the list planned as the batch and its sources there.
        Sources,
    }

    /// [`run`] with lists that are the step's own key gradients as `own` says. Also
    /// returns the bytes the cache uploaded.
    fn run_with<D: Device>(dev: &D, optimizer: OptimizerKind, name: &str, rounds: usize, own: Own) -> ((Vec<u64>, usize), u64) {
        let mut t = table(name, optimizer, 200);
        let mut cache = GpuCache::new(dev, &t, 64, LR, 1, GpuCacheMode::WriteThrough).unwrap();
        let seen: Vec<u64> = (0..120).collect();
        // Every key seen at least twice (a candidate), the first 40 three times.
        let inverse: Vec<u32> = (0..120u32).chain(0..120).chain(0..40).collect();
        cache.dir.observe(&seen, &inverse);
        cache.after_step(dev, TableAt::Read(&t), 1).unwrap();
        assert_eq!(cache.dir.len(), 64);
        let mut rng = Stream(7);
        let mut on_device = Vec::new();
        for _ in 0..rounds {
            // A merged list: distinct keys in order, some cached, some not.
            let keys: Vec<u64> = (0..200).filter(|_| rng.below(3) != 0).collect();
            let g = grads(&mut rng, keys.len());
            t.apply_updates(&keys, &g, LR).unwrap();
            if own == Own::No {
                cache.apply(dev, &keys, &g, None).unwrap();
                continue;
            }
            let mut buf = dev.alloc(g.len()).unwrap();
            dev.write(&g, &mut buf, 0).unwrap();
            let mut sources = dev.alloc(keys.len().max(1)).unwrap();
            if own == Own::Sources {
                let mut plan = StagingPlan::default();
                cache.dir.plan(&keys, &[], keys.len(), &mut plan);
                dev.write(&plan.source, &mut sources, 0).unwrap();
                cache.plan = plan;
            }
            let sources = (own == Own::Sources).then_some(&sources);
            cache.apply(dev, &keys, &g, Some(OwnGrads { keys: &keys, host: &g, dev: &buf, sources })).unwrap();
            on_device.push(buf);
        }
        let contents = cache.contents(dev).unwrap();
        let mut row = vec![0f32; DIM];
        let differ = contents
            .iter()
            .filter(|(k, r, a)| {
                t.lookup(&[*k], &mut row).unwrap();
                let acc = t.accumulator(*k).unwrap_or(0.0);
                bytemuck::cast_slice::<f32, u32>(&row) != bytemuck::cast_slice::<f32, u32>(r) || acc.to_bits() != a.to_bits()
            })
            .map(|(k, _, _)| *k)
            .collect();
        ((differ, contents.len()), cache.counters().bytes_uploaded)
    }

    #[test]
    fn a_world_of_one_updates_from_the_key_gradients_on_the_device() {
        let host = HostKernels::with_options(HostOptions { delay: Some(HostDelay { seed: 5, max_us: 300 }), fault: None }).unwrap();
        for opt in [OptimizerKind::Adagrad, OptimizerKind::Sgd] {
            let ((d, n), sent) = run_with(&host, opt, &format!("own-{opt}"), 5, Own::Rows);
            assert!(d.is_empty() && n == 64, "{opt}: keys {d:?} differ from the table");
            let ((_, _), uploaded_rows) = run_with(&host, opt, &format!("rows-{opt}"), 5, Own::No);
            assert!(sent < uploaded_rows, "{opt}: {sent} bytes sent with the rows on the device, {uploaded_rows} without");
            // The batch's own list with its sources on the device: no update travels, only
            // the refresh's rows.
            let ((d, n), from_sources) = run_with(&host, opt, &format!("src-{opt}"), 5, Own::Sources);
            assert!(d.is_empty() && n == 64, "{opt} from the sources: keys {d:?} differ from the table");
            let refresh = 64 * (4 + 4 * DIM as u64 + if opt == OptimizerKind::Adagrad { 4 } else { 0 });
            assert_eq!(from_sources, refresh, "{opt}: bytes sent with the sources on the device");
            for own in [Own::Rows, Own::Sources] {
                let ((d, _), _) = run_with(&CpuDevice::new(2), opt, &format!("own-cpu-{opt}"), 5, own);
                assert!(d.is_empty(), "{opt} on the CPU device: keys {d:?} differ");
            }
        }
    }

    #[test]
    fn cached_rows_stay_the_table_rows_bit_for_bit() {
        let host = HostKernels::new().unwrap();
        let delayed = HostKernels::with_options(HostOptions { delay: Some(HostDelay { seed: 3, max_us: 300 }), fault: None }).unwrap();
        for opt in [OptimizerKind::Adagrad, OptimizerKind::Sgd] {
            let (d, n) = run(&CpuDevice::new(2), opt, &format!("cpu-{opt}"), 5);
            assert!(d.is_empty() && n == 64, "{opt} on the CPU device: keys {d:?} differ from the table");
            let (d, n) = run(&host, opt, &format!("host-{opt}"), 5);
            assert!(d.is_empty() && n == 64, "{opt} on the host kernels: keys {d:?} differ from the table");
            let (d, _) = run(&delayed, opt, &format!("delayed-{opt}"), 5);
            assert!(d.is_empty(), "{opt} on the host kernels with delays: keys {d:?} differ from the table");
        }
    }

    #[test]
    fn a_staging_refilled_before_its_upload_ran_breaks_the_cache() {
        // RINGREC_HOST_FAULT=no-staging-wait removes the wait in `Device::host` that keeps
        // the next update list (or a refresh's rows) from overwriting the staging an update
        // still reads: with delays in the queue, the cached rows then stop matching.
        let dev = |seed, fault| HostKernels::with_options(HostOptions { delay: Some(HostDelay { seed, max_us: 2000 }), fault }).unwrap();
        let broke = (1..=4).any(|seed| !run(&dev(seed, Some(HostFault::NoStagingWait)), OptimizerKind::Adagrad, &format!("fault-{seed}"), 6).0.is_empty());
        assert!(broke, "the removed staging wait went unnoticed");
        // The same delays with the wait in place change nothing.
        for seed in 1..=2 {
            let (d, _) = run(&dev(seed, None), OptimizerKind::Adagrad, &format!("nofault-{seed}"), 6);
            assert!(d.is_empty(), "delay seed {seed} without the fault: keys {d:?} differ");
        }
    }
}
