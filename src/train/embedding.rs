//! [`EmbeddingStage`]: the sparse half of a step — the host-shared table and the sparse
//! exchanger together: rows of a batch's unique keys looked up ([`EmbeddingStage::lookup`]),
//! then their gradients exchanged, normalised and applied by the host leader, followed by
//! the host barrier ([`EmbeddingStage::exchange_and_apply`]).
//!
//! The table is managed ([`crate::embedding::manage`]): it grows up to
//! `--table-max-bytes`, then evicts (`--evict`); `--expire-after-steps` and `--admit-after`
//! apply. Rank 0 reports every growth; the counts since the start of the run are in
//! [`EmbeddingStage::counts`].

use std::path::Path;

use mpi::collective::{CommunicatorCollectives, SystemOperation};

use super::{NanPolicy, TrainConfig, TrainError, TrainResult};
use crate::embedding::{HostTable, RowCounts, TablePolicy, TableSource};
use crate::sparse::error::NON_FINITE;
use crate::sparse::{AggregatedGrads, SparseError, SparseExchanger, SparseResult, SparseStats};
use crate::topology::Topology;

/// The host table and the sparse exchanger of a run.
pub struct EmbeddingStage {
    table: HostTable,
    exchanger: SparseExchanger,
    lr: f32,
    nan_skips: u64,
    /// The table's counts when the run started.
    counts_at_start: RowCounts,
    /// The table's largest size (bytes).
    max_bytes: u64,
    /// Seconds of this run's growths on this rank's host (leader only), and the longest.
    growth_seconds: f64,
    growth_max_seconds: f64,
    /// World rank 0 reports growths.
    report: bool,
}

/// Share of the free space of the shared-memory directory a host table may grow to by
/// default: a growth holds the old table and the new one (half as large again) at once.
pub const AUTO_MAX_SHARE: f64 = 0.5;

/// The default `--table-max-bytes` (collective over the world): [`AUTO_MAX_SHARE`] of the
/// least free space any host leader sees in its shared-memory directory, divided among the
/// hosts of a machine (simulated hosts share one directory). The same on every rank.
pub fn auto_max_bytes(topo: &Topology) -> u64 {
    let mine = if topo.is_leader() { crate::fileio::free_bytes(&topo.config.shm_dir).unwrap_or(u64::MAX) } else { u64::MAX };
    let mut least = 0u64;
    {
        let _w = crate::watchdog::waiting("every rank's agreement on the table's largest size");
        topo.world.comm.all_reduce_into(&mine, &mut least, SystemOperation::min());
    }
    let hosts_here = (topo.machine_local_size / topo.local_size.max(1)).max(1) as u64;
    (least as f64 * AUTO_MAX_SHARE) as u64 / hosts_here
}

impl EmbeddingStage {
    /// Opens this host's table (collective over the world): a new one shaped by `cfg`, or
    /// the byte-exact copy of a checkpoint's table `saved`; then manages it as `cfg` says.
    pub fn open(topo: &Topology, cfg: &TrainConfig, saved: Option<&Path>) -> TrainResult<EmbeddingStage> {
        let tc = cfg.table_config();
        match saved {
            Some(p) => EmbeddingStage::open_from(topo, cfg, TableSource::Saved(p, &tc)),
            None => EmbeddingStage::open_from(topo, cfg, TableSource::New(&tc)),
        }
    }

    /// Opens this host's table from `source` (collective over the world) and manages it as
    /// `cfg` says: what [`EmbeddingStage::open`] does, and a warm start's table
    /// (`--init-from`).
    pub fn open_from(topo: &Topology, cfg: &TrainConfig, source: TableSource<'_>) -> TrainResult<EmbeddingStage> {
        let max_bytes = match cfg.table_max_bytes {
            Some(b) => b,
            None => auto_max_bytes(topo),
        };
        let mut table = HostTable::open_from(topo, source)?;
        let h = *table.table().header();
        table.set_policy(TablePolicy { max_capacity: TablePolicy::max_capacity_for(&h, max_bytes), evict: cfg.evict, expire_after: cfg.expire_after_steps });
        let exchanger = SparseExchanger::new(topo, cfg.sparse_exchange, cfg.sparse_normalize, cfg.dim)?;
        Ok(EmbeddingStage {
            table,
            exchanger,
            lr: cfg.sparse_lr,
            nan_skips: 0,
            counts_at_start: h.counts,
            max_bytes: max_bytes.max(h.layout.file_len),
            growth_seconds: 0.0,
            growth_max_seconds: 0.0,
            report: topo.rank == 0,
        })
    }

    /// The host table.
    pub fn table(&self) -> &HostTable {
        &self.table
    }

    /// The exchanger (its cumulative statistics).
    pub fn exchanger(&self) -> &SparseExchanger {
        &self.exchanger
    }

    /// This rank's weight and all ranks' for the next exchange (`--sparse-normalize
    /// weighted`: [`SparseExchanger::set_weights`]).
    pub fn set_sparse_weights(&mut self, (mine, total): (f32, f32)) {
        self.exchanger.set_weights(mine, total);
    }

    /// The rows of `keys` (keys x dim) into `out`.
    pub fn lookup(&self, keys: &[u64], out: &mut [f32]) -> TrainResult<()> {
        Ok(self.table.lookup(keys, out)?)
    }

    /// Exchanges the gradient rows `grads` of `keys` (this rank's unique keys) with every
    /// rank, applies the normalised result to the host table (on its leader) and waits in
    /// the host barrier; returns what the exchange moved. A merged gradient that is not
    /// finite is never applied: under `NanPolicy::Stop` every rank fails this `step` with
    /// [`TrainError::NonFinite`], under `SkipStep` the update is skipped (and counted).
    pub fn exchange_and_apply(&mut self, keys: &[u64], grads: &[f32], step: u64, policy: NanPolicy) -> TrainResult<SparseStats> {
        let skips = &mut self.nan_skips;
        let mut check = |g: &AggregatedGrads<'_>| -> SparseResult<bool> {
            let dim = g.grads.len() / g.keys.len().max(1);
            let Some(i) = crate::train::checkpoint::first_non_finite(g.grads) else { return Ok(true) };
            let e = SparseError::NonFinite { key: g.keys[i / dim.max(1)], at: i % dim.max(1), value: g.grads[i] };
            match policy {
                NanPolicy::Stop => Err(e),
                NanPolicy::SkipStep => {
                    *skips += 1;
                    crate::eprint_line(&format!("ringrec: warning: step {step}: {e}: skipped (--nan-policy skip-step)"));
                    Ok(false)
                }
            }
        };
        let done = self.exchanger.exchange_and_apply_checked(&mut self.table, keys, grads, self.lr, &mut check);
        for g in self.table.take_growths() {
            self.growth_seconds += g.seconds;
            self.growth_max_seconds = self.growth_max_seconds.max(g.seconds);
            if self.report {
                let mib = g.bytes as f64 / (1 << 20) as f64;
                crate::eprint_line(&format!("ringrec: step {step}: the embedding table grew from {} to {} slots ({mib:.1} MiB) in {:.3} s", g.from, g.to, g.seconds));
            }
        }
        match done {
            Ok((_, stats)) => Ok(stats),
            // The leaders found it; the other ranks hear it from them.
            Err(e @ SparseError::NonFinite { .. }) => Err(TrainError::NonFinite { step, what: e.to_string() }),
            Err(SparseError::Peer { message, .. }) if message.starts_with(NON_FINITE) => Err(TrainError::NonFinite { step, what: message }),
            Err(e) => Err(e.into()),
        }
    }

    /// Table updates this host's leader skipped as not finite (`NanPolicy::SkipStep`).
    pub fn nan_skips(&self) -> u64 {
        self.nan_skips
    }

    /// What happened to the table's rows since the run started (the same on every rank:
    /// the header every local rank reads).
    pub fn counts(&self) -> RowCounts {
        self.table.table().counts().since(&self.counts_at_start)
    }

    /// The largest size the table may grow to (bytes).
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Seconds this run's growths took on this host's leader (0 on other ranks): the sum
    /// and the longest.
    pub fn growth_seconds(&self) -> (f64, f64) {
        (self.growth_seconds, self.growth_max_seconds)
    }
}
