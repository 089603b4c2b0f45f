//! [`EmbeddingStage`]: the sparse half of a step — the host-shared table and the sparse
//! exchanger together: rows of a batch's unique keys looked up ([`EmbeddingStage::lookup`]),
//! then their gradients exchanged, normalised and applied by the host leader, followed by
//! the host barrier ([`EmbeddingStage::exchange_and_apply`]).

use std::path::Path;

use super::{NanPolicy, TrainConfig, TrainError, TrainResult};
use crate::embedding::{HostTable, TableConfig, TableSource};
use crate::sparse::error::NON_FINITE;
use crate::sparse::{AggregatedGrads, SparseError, SparseExchanger, SparseResult, SparseStats};
use crate::topology::Topology;

/// The shape and initialisation of a run's new host table.
pub fn table_config(cfg: &TrainConfig) -> TableConfig {
    let mut tc = TableConfig::new(cfg.dim as u32, cfg.table_capacity);
    tc.seed = cfg.seed;
    tc.optimizer = cfg.sparse_optimizer;
    tc
}

/// The host table and the sparse exchanger of a run.
pub struct EmbeddingStage {
    table: HostTable,
    exchanger: SparseExchanger,
    lr: f32,
    nan_skips: u64,
}

impl EmbeddingStage {
    /// Opens this host's table (collective over the world): a new one shaped by `cfg`, or
    /// the byte-exact copy of a checkpoint's table `saved`.
    pub fn open(topo: &Topology, cfg: &TrainConfig, saved: Option<&Path>) -> TrainResult<EmbeddingStage> {
        let tc = table_config(cfg);
        match saved {
            Some(p) => EmbeddingStage::open_from(topo, cfg, TableSource::Saved(p, &tc)),
            None => EmbeddingStage::open_from(topo, cfg, TableSource::New(&tc)),
        }
    }

    /// Opens this host's table from `source` (collective over the world): what
    /// [`EmbeddingStage::open`] does, and a warm start's table (`--init-from`).
    pub fn open_from(topo: &Topology, cfg: &TrainConfig, source: TableSource<'_>) -> TrainResult<EmbeddingStage> {
        let table = HostTable::open_from(topo, source)?;
        let exchanger = SparseExchanger::new(topo, cfg.sparse_exchange, cfg.sparse_normalize, cfg.dim)?;
        Ok(EmbeddingStage { table, exchanger, lr: cfg.sparse_lr, nan_skips: 0 })
    }

    /// The host table.
    pub fn table(&self) -> &HostTable {
        &self.table
    }

    /// The exchanger (its cumulative statistics).
    pub fn exchanger(&self) -> &SparseExchanger {
        &self.exchanger
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
        match self.exchanger.exchange_and_apply_checked(&mut self.table, keys, grads, self.lr, &mut check) {
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
}
