//! The host tables' part of what a run reports: [`TableSummary`], one table's shape and
//! counts, filled per table of the run (the default one and each `--table`'s) and summed
//! over them ([`TableSummary::sum`]) for the summary's and `--metrics-out`'s `table_*`
//! keys, which keep their one-table meaning; with `--table` the summary and each report
//! also hold the per-table breakdown (`tables: {NAME: {...}}`, the default table as
//! [`DEFAULT_TABLE`]).

use std::collections::BTreeMap;

use serde::Serialize;

use super::embedding::EmbeddingStage;
use super::{Trainer, TrainResult};
use crate::device::Device;

/// The default table's name in the per-table breakdown (refused as a `--table` name).
pub const DEFAULT_TABLE: &str = "default";

/// One host table's part of a run (see the module docs). The shape and the row counts are
/// the same on every rank; `nan_skips` and the growth seconds are rank 0's host's; the
/// traffic and the deltas (the summary's only, `None` in an interval report) are summed
/// over the ranks.
#[derive(Serialize, Debug, Clone, Default, PartialEq)]
pub struct TableSummary {
    /// Live rows at the end.
    pub rows: u64,
    /// Slots.
    pub capacity: u64,
    /// Bytes of its file (one per host).
    pub bytes: u64,
    /// Largest size it may grow to (`--table-max-bytes`, or its share of the free space).
    pub max_bytes: u64,
    /// Times it grew in this run.
    pub growths: u64,
    /// Seconds rank 0's host leader spent building its grown files (sum).
    pub growth_seconds: f64,
    /// The longest of those growths (seconds).
    pub growth_max_seconds: f64,
    /// Rows inserted in this run.
    pub inserted: u64,
    /// Rows evicted in this run.
    pub evictions: u64,
    /// Rows expired in this run.
    pub expirations: u64,
    /// Gradient rows dropped for want of a row in this run.
    pub refused: u64,
    /// Bytes of its admission sketch.
    pub admission_sketch_bytes: u64,
    /// Updates rank 0's host skipped as not finite (`--nan-policy skip-step`).
    pub nan_skips: u64,
    /// Keys whose 1-bit residual rank 0 keeps (`--sparse-compression`).
    pub compression_residual_rows: u64,
    /// Its sparse-exchange bytes sent inside hosts, over the ranks (gradients and deltas).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sparse_bytes_sent_intra_host: Option<u64>,
    /// Its sparse-exchange bytes sent across hosts, over the ranks (gradients and deltas).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sparse_bytes_sent_cross_host: Option<u64>,
    /// `--sync-every` k > 1: its rows the hosts updated between syncs (over hosts and syncs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sync_touched_rows: Option<u64>,
    /// Of those, the rows whose zero-filtered delta was sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sync_delta_rows: Option<u64>,
}

impl TableSummary {
    /// What `stage` knows on this rank (no collective: the traffic and deltas are `None`).
    pub fn of(stage: &EmbeddingStage) -> TableSummary {
        let t = stage.table().table();
        let (h, c) = (t.header(), stage.counts());
        let (growth_seconds, growth_max_seconds) = stage.growth_seconds();
        TableSummary {
            rows: t.live_rows(),
            capacity: h.capacity,
            bytes: h.layout.file_len,
            max_bytes: stage.max_bytes(),
            growths: c.growths,
            growth_seconds,
            growth_max_seconds,
            inserted: c.inserted,
            evictions: c.evicted,
            expirations: c.expired,
            refused: c.refused,
            admission_sketch_bytes: h.layout.sketch_len,
            nan_skips: stage.nan_skips(),
            compression_residual_rows: stage.exchanger().compression_residual_rows() as u64,
            ..TableSummary::default()
        }
    }

    /// The run's tables together: every count summed, the longest growth the longest.
    pub fn sum<'s>(all: impl IntoIterator<Item = &'s TableSummary>) -> TableSummary {
        let opt = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        };
        all.into_iter().fold(TableSummary::default(), |s, t| TableSummary {
            rows: s.rows + t.rows,
            capacity: s.capacity + t.capacity,
            bytes: s.bytes + t.bytes,
            max_bytes: s.max_bytes.saturating_add(t.max_bytes),
            growths: s.growths + t.growths,
            growth_seconds: s.growth_seconds + t.growth_seconds,
            growth_max_seconds: s.growth_max_seconds.max(t.growth_max_seconds),
            inserted: s.inserted + t.inserted,
            evictions: s.evictions + t.evictions,
            expirations: s.expirations + t.expirations,
            refused: s.refused + t.refused,
            admission_sketch_bytes: s.admission_sketch_bytes + t.admission_sketch_bytes,
            nan_skips: s.nan_skips + t.nan_skips,
            compression_residual_rows: s.compression_residual_rows + t.compression_residual_rows,
            sparse_bytes_sent_intra_host: opt(s.sparse_bytes_sent_intra_host, t.sparse_bytes_sent_intra_host),
            sparse_bytes_sent_cross_host: opt(s.sparse_bytes_sent_cross_host, t.sparse_bytes_sent_cross_host),
            sync_touched_rows: opt(s.sync_touched_rows, t.sync_touched_rows),
            sync_delta_rows: opt(s.sync_delta_rows, t.sync_delta_rows),
        })
    }
}

impl<D: Device> Trainer<'_, D> {
    /// Every table of the run with its name in the breakdown: the default one
    /// ([`DEFAULT_TABLE`]) first, then each `--table`'s in flag order.
    pub(super) fn stages(&self) -> Vec<(&str, &EmbeddingStage)> {
        std::iter::once((DEFAULT_TABLE, &self.embedding)).chain(self.tables.iter().flat_map(|t| t.named())).collect()
    }

    /// Every table's part of an interval report on this rank (no collective).
    pub(super) fn table_parts(&self) -> Vec<(String, TableSummary)> {
        self.stages().into_iter().map(|(n, s)| (n.to_string(), TableSummary::of(s))).collect()
    }

    /// Every table's part of the summary (collective: the traffic and the deltas summed
    /// over the ranks).
    pub(super) fn table_parts_summed(&self) -> Vec<(String, TableSummary)> {
        let control = self.topo.control();
        let stages = self.stages();
        stages
            .into_iter()
            .map(|(name, stage)| {
                let (t, d) = (stage.traffic_totals(), stage.delta_counts());
                let all = control.all_sum_each("the run's summary", [t.host_bytes_sent, t.cross_bytes_sent, d.touched_rows, d.delta_rows]);
                let part = TableSummary { sparse_bytes_sent_intra_host: Some(all[0]), sparse_bytes_sent_cross_host: Some(all[1]), sync_touched_rows: Some(all[2]), sync_delta_rows: Some(all[3]), ..TableSummary::of(stage) };
                (name.to_string(), part)
            })
            .collect()
    }

    /// Each host's rows of every table as one CRC-32 (the default table's
    /// [`EmbeddingStage::rows_crc`] alone in a one-table run; with `--table`, a CRC-32 of
    /// every table's in order).
    pub(super) fn rows_crc(&self) -> TrainResult<u32> {
        let stages = self.stages();
        if stages.len() == 1 {
            return self.embedding.rows_crc();
        }
        let mut crc = crate::hash::Crc32::new();
        for (_, s) in stages {
            crc.update(&s.rows_crc()?.to_le_bytes());
        }
        Ok(crc.finish())
    }
}

/// The per-table breakdown of `parts`: empty in a one-table run (the `table_*` keys say it all).
pub fn breakdown(parts: Vec<(String, TableSummary)>) -> BTreeMap<String, TableSummary> {
    if parts.len() < 2 {
        return BTreeMap::new();
    }
    parts.into_iter().collect()
}
