//! The GPU hot-row cache with `--table` (issue 30 with issue 33): one [`GpuCache`] per table
//! that holds a field (the default table first, then the named ones in flag order), each
//! with its table's width, optimizer state, exchange and leader update; `--gpu-cache-mib`
//! is shared out equally among them. Write-through only (`--gpu-cache-mode write-back` is
//! refused with `--table`: [`super::TrainConfig::validate_tables`]).
//!
//! - **Staging** ([`crate::train::tables::Gather::stage_cached`]): each table's keys of the
//!   batch are planned by its cache; the misses' rows are looked up and uploaded, the
//!   hits' rows gathered on the device from their slots ([`GpuCache::gather_hits`]) and
//!   copied after them ([`DenseModel::load_with_rows`]). The keys are staged misses first,
//!   so [`crate::device::Op::GatherFields`] and its backward run unchanged, each key's row
//!   at its offset; the key gradients are put back in table order before the exchange.
//! - **Update** ([`TableCaches::update`]): after the exchange, each table's cache applies
//!   the merged list its table's leader applied ([`GpuCache::apply`], the rows uploaded),
//!   then empties or refreshes itself from its table ([`GpuCache::after_step`]).

use super::batch::Batch;
use super::embedding::EmbeddingStage;
use super::gpu_cache::{cache_bytes, slots_in, GpuCache, TableAt};
use super::tables::Tables;
use super::{TrainConfig, TrainError, TrainResult};
use crate::device::Device;
use crate::embedding::CacheCounters;
use crate::model::DenseModel;

/// One rank's hot-row caches over a run's tables (see the module docs).
pub struct TableCaches<D: Device> {
    /// Per table of the layout (the default first): its cache, `None` for a table without
    /// fields or slots.
    caches: Vec<Option<GpuCache<D>>>,
    /// The staged batch's hits on the device: (table, values, offset among the staged rows).
    hits: Vec<(usize, usize, usize)>,
}

impl<D: Device> TableCaches<D> {
    /// The caches of this run's tables on `model`'s device (`default` and `tables`), `None`
    /// without `--gpu-cache-mib` (or when no table gets a slot).
    pub fn open(cfg: &TrainConfig, model: &DenseModel<D>, default: &mut EmbeddingStage, tables: &mut Tables) -> TrainResult<Option<TableCaches<D>>> {
        let bytes = cache_bytes(cfg);
        if bytes == 0 {
            return Ok(None);
        }
        let layout = tables.layout();
        let n = layout.widths.len();
        let used: Vec<bool> = (0..n).map(|t| layout.used(t)).collect();
        let share = bytes / used.iter().filter(|u| **u).count().max(1) as u64;
        let mut caches = Vec::with_capacity(n);
        for (t, used) in used.iter().enumerate() {
            let table = tables.stage_mut(t, default).table().table();
            let slots = if *used { slots_in(share, table) } else { 0 };
            caches.push(match slots {
                0 => None,
                s => Some(GpuCache::new(model.device(), table, s, cfg.sparse_lr, cfg.gpu_cache_refresh, cfg.gpu_cache_mode)?),
            });
        }
        if caches.iter().all(Option::is_none) {
            return Ok(None);
        }
        Ok(Some(TableCaches { caches, hits: Vec::new() }))
    }

    /// Stages batch `b` for `model` from `default` and `tables` through the caches.
    pub fn stage(&mut self, model: &mut DenseModel<D>, default: &EmbeddingStage, tables: &mut Tables, b: &Batch) -> TrainResult<()> {
        self.hits = tables.stage_cached(model, default, b, &mut self.caches)?;
        Ok(())
    }

    /// Loads the staged batch into `model`, the hits' rows copied from the caches.
    pub fn load(&self, model: &mut DenseModel<D>) -> TrainResult<(usize, usize)> {
        let mut rows = Vec::with_capacity(self.hits.len());
        for (t, values, at) in &self.hits {
            let cache = self.caches[*t].as_ref().ok_or_else(|| TrainError::Config(format!("internal: hits staged from table {t}, which has no cache")))?;
            rows.push((cache.hit_rows(), *values, *at));
        }
        Ok(model.load_with_rows(&rows)?)
    }

    /// After global step `step`'s exchange and host barrier: each cache applies the list
    /// its table's leader applied, then empties or refreshes itself when due.
    pub fn update(&mut self, dev: &D, default: &mut EmbeddingStage, tables: &mut Tables, step: u64) -> TrainResult<()> {
        for (t, cache) in self.caches.iter_mut().enumerate() {
            let Some(cache) = cache else { continue };
            let stage = tables.stage_mut(t, default);
            if let Some(g) = stage.applied()? {
                cache.apply(dev, g.keys, g.grads, None)?;
            }
            cache.after_step(dev, TableAt::Read(stage.table().table()), step)?;
        }
        Ok(())
    }

    /// The caches' counters, summed.
    pub fn counters(&self) -> CacheCounters {
        let mut c = CacheCounters::default();
        self.caches.iter().flatten().for_each(|g| c.add(g.counters()));
        c
    }

    /// Their slots, summed.
    pub fn capacity(&self) -> usize {
        self.caches.iter().flatten().map(GpuCache::capacity).sum()
    }

    /// Device bytes their slots take, summed.
    pub fn bytes(&self) -> u64 {
        self.caches.iter().flatten().map(GpuCache::bytes).sum()
    }
}
