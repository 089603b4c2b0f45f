//! [`EmbeddingStage`]: the sparse half of a step — the host-shared table and the sparse
//! exchanger together: rows of a batch's unique keys looked up ([`EmbeddingStage::lookup`]),
//! then their gradients exchanged, normalised and applied by the host leader, followed by
//! the host barrier ([`EmbeddingStage::exchange_and_apply`]).

use std::path::Path;

use super::{TrainConfig, TrainResult};
use crate::embedding::{HostTable, TableConfig, TableSource};
use crate::sparse::{SparseExchanger, SparseStats};
use crate::topology::Topology;

/// The host table and the sparse exchanger of a run.
pub struct EmbeddingStage {
    table: HostTable,
    exchanger: SparseExchanger,
    lr: f32,
}

impl EmbeddingStage {
    /// Opens this host's table (collective over the world): a new one shaped by `cfg`, or
    /// the byte-exact copy of a checkpoint's table `saved`.
    pub fn open(topo: &Topology, cfg: &TrainConfig, saved: Option<&Path>) -> TrainResult<EmbeddingStage> {
        let mut tc = TableConfig::new(cfg.dim as u32, cfg.table_capacity);
        tc.seed = cfg.seed;
        tc.optimizer = cfg.sparse_optimizer;
        let table = match saved {
            Some(p) => HostTable::open_from(topo, TableSource::Saved(p)),
            None => HostTable::open_from(topo, TableSource::New(&tc)),
        }?;
        let exchanger = SparseExchanger::new(topo, cfg.sparse_exchange, cfg.sparse_normalize, cfg.dim)?;
        Ok(EmbeddingStage { table, exchanger, lr: cfg.sparse_lr })
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
    /// the host barrier; returns what the exchange moved.
    pub fn exchange_and_apply(&mut self, keys: &[u64], grads: &[f32]) -> TrainResult<SparseStats> {
        let (_, stats) = self.exchanger.exchange_and_apply(&mut self.table, keys, grads, self.lr)?;
        Ok(stats)
    }
}
