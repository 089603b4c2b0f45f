//! [`EmbeddingStage`]: the sparse half of a step — the host-shared table and the sparse
//! exchanger together: rows of a batch's unique keys looked up ([`EmbeddingStage::lookup`]),
//! then their gradients exchanged, normalised and applied by the host leader, followed by
//! the host barrier ([`EmbeddingStage::exchange_and_apply`]).
//!
//! The table is managed ([`crate::embedding::manage`]): it grows up to
//! `--table-max-bytes`, then evicts (`--evict`); `--expire-after-steps` and `--admit-after`
//! apply. Rank 0 reports every growth; the counts since the start of the run are in
//! [`EmbeddingStage::counts`].
//!
//! A process may hold several stages at once, each under its own [`TableName`] (the Python
//! module's tables, one per feature): the name tells their shared-memory files and segments
//! apart, and every rank must open the same names with the same dims in the same order.

use std::path::Path;

use super::{NanPolicy, TrainConfig, TrainError, TrainResult};
use crate::embedding::update::HELD;
use crate::embedding::{HostTable, RowCounts, TablePolicy, TableSource};
use crate::engine::Compression;
use crate::data::Dataset;
use crate::sparse::compress::RowForm;
use crate::sparse::delta::RowsAtSync;
use crate::sparse::error::NON_FINITE;
use crate::sparse::{AggregatedGrads, SparseError, SparseExchanger, SparseNormalize, SparseResult, SparseStats};
use crate::topology::Topology;

/// Which of a process's host tables a stage is: `ringrec train`'s one table
/// ([`TableName::default`], today's segment names) or a named one, whose shared-memory
/// files (the table, its grown files, its host barrier) and exchangers' segments carry a
/// hash of the name. Every rank opens the same names in the same order
/// ([`EmbeddingStage::open_named`] checks it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableName(Option<String>);

impl TableName {
    /// The named table `name`.
    pub fn named(name: &str) -> TableName {
        TableName(Some(name.to_string()))
    }

    /// The name as a user wrote it (`None`: the job's one table).
    pub fn name(&self) -> Option<&str> {
        self.0.as_deref()
    }

    /// The segment tag of this table's `base` (`table`, `sparse`, `sparse-delta`): `base`
    /// itself for the default table, else `base.<FNV-1a of the name>` (any name, any length,
    /// fits a file name; the sweep of stale segments recognises it as ever).
    pub fn tag(&self, base: &str) -> String {
        match &self.0 {
            None => base.to_string(),
            Some(n) => format!("{base}.{}", crate::hash::fnv_hex(n.as_bytes())),
        }
    }
}

/// Bytes of a table's name that a mismatch's message shows per rank.
const NAME_SHOWN: usize = 48;

/// Every rank opens the same table (name and row width) as this one (collective over the
/// world): else every rank gets the same [`TrainError::Config`] naming what each rank
/// opened, before any collective of the table itself, so ranks that build their tables in
/// different orders fail here instead of waiting on each other.
fn check_same_table(topo: &Topology, name: &TableName, width: usize) -> TrainResult<()> {
    let id = name.name().map_or(0, |n| crate::hash::fnv1a64(n.as_bytes()) | 1);
    let all = topo.control().all_gather("every rank's name and dim of the host table it opens", [id, width as u64]);
    if all.iter().all(|a| *a == all[0]) {
        return Ok(());
    }
    let mut shown = [0u8; NAME_SHOWN];
    if let Some(n) = name.name() {
        let b = n.as_bytes();
        let k = b.len().min(NAME_SHOWN);
        shown[..k].copy_from_slice(&b[..k]);
    }
    let names = topo.control().all_gather("every rank's name of the host table it opens", shown);
    let what = |r: usize| {
        let n = String::from_utf8_lossy(&names[r]).trim_end_matches('\0').to_string();
        let n = if all[r][0] == 0 { "the job's table".to_string() } else { format!("table {n:?}") };
        format!("rank {r} opens {n} of dim {}", all[r][1])
    };
    let differ: Vec<String> = (1..all.len()).filter(|r| all[*r] != all[0]).take(8).map(what).collect();
    Err(TrainError::Config(format!(
        "the ranks open different host tables: {}, {}; every rank must create its tables in the same order with the same names and dims",
        what(0),
        differ.join(", ")
    )))
}

/// What a write-back GPU hot-row cache holds of a step's table update
/// ([`EmbeddingStage::exchange_and_apply_held`]): those rows are not stepped by the leader.
pub enum Held<'a> {
    /// One rank: the exchange takes the batch's misses; the update takes every unique key
    /// of the batch (`all`), `rows` giving per key its row among the merged misses' or
    /// [`HELD`] (cached).
    Misses {
        /// The batch's unique keys.
        all: &'a [u64],
        /// Per key: its row in the merged list, or [`HELD`].
        rows: &'a [u32],
    },
    /// One rank per host: the exchange takes every key; the update holds the merged
    /// keys this says are cached.
    Cached(&'a dyn Fn(u64) -> bool),
}

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
    /// `--sync-every` k > 1: the sparse half of lazy synchronisation.
    sync: Option<SparseSync>,
    /// The most keys a host's step lists, as its boards were reserved room for.
    step_keys: u64,
}

/// The sparse half of `--sync-every` (see [`super::sync`] and [`crate::sparse::delta`]):
/// the steps' exchange stays inside each host, the leader records the rows at the last
/// sync, and a sync exchanges the zero-filtered deltas through an exchanger of its own.
struct SparseSync {
    rows: RowsAtSync,
    exchanger: SparseExchanger,
    /// Table updates skipped as not finite since the last sync (leader).
    skipped: u64,
    counts: DeltaCounts,
}

/// What the sparse syncs of a run did on this rank (leaders' rows; every rank's bytes).
#[derive(Clone, Copy, Debug, Default)]
pub struct DeltaCounts {
    /// Rows this host's leader updated between syncs, summed over the syncs.
    pub touched_rows: u64,
    /// Of those, rows whose value changed: the zero-filtered deltas sent.
    pub delta_rows: u64,
    /// Bytes this rank sent to other hosts in the delta exchanges.
    pub cross_bytes_sent: u64,
    /// Bytes this rank received from other hosts in the delta exchanges.
    pub cross_bytes_received: u64,
}

/// Share of the free space of the shared-memory directory a host table may grow to by
/// default, at most: a growth holds the old table and the new one (half as large again) at
/// once.
pub const AUTO_MAX_SHARE: f64 = 0.5;

/// The default `--table-max-bytes` (collective over the world), once the host table of
/// `table_bytes` and the exchangers' segments exist: the largest table file whose growth
/// fits, on every host, in its share of what its leader sees free in the shared-memory
/// directory (simulated hosts share one directory) plus its own table — the growth's peak
/// (the old table and the new one at once: 1.5 times the new file) beside the segments the
/// run creates later (the sparse exchange's host boards, each at its largest:
/// [`board_bound`] of `step_keys`) — and at most [`AUTO_MAX_SHARE`] of that. At that size
/// the table evicts instead of growing. The same on every rank.
pub fn auto_max_bytes(topo: &Topology, cfg: &TrainConfig, table_bytes: u64, step_keys: u64) -> u64 {
    let hosts_here = (topo.machine_local_size / topo.local_size.max(1)).max(1) as u64;
    // Measured once the table and the exchangers' segments exist: the host's share of the
    // free space, plus its own table (a growth's old file is counted in the peak).
    let free = if topo.is_leader() { crate::fileio::free_bytes(&topo.config.shm_dir) } else { None };
    let mine = free.map_or(u64::MAX, |f| (f / hosts_here).saturating_add(table_bytes));
    let least = topo.control().all_min("every rank's agreement on the table's largest size", mine);
    growth_limit(least, board_bound(topo, cfg, step_keys))
}

/// `--table-max-bytes` over the tables of a run with `--table` (collective over the world),
/// once every table (`default`, then `named` in `cfg.tables`' order) and its exchangers'
/// segments exist: [`share_among`] the tables, a table's `max_bytes=` its own size, the total
/// `--table-max-bytes`.
pub fn share_max_bytes<'s>(topo: &Topology, cfg: &TrainConfig, default: &'s mut EmbeddingStage, named: impl Iterator<Item = &'s mut EmbeddingStage>) -> TrainResult<()> {
    let boards = board_bound(topo, cfg, default.step_keys);
    let mut tables = vec![Sharer { stage: default, own: None, boards }];
    for (t, s) in cfg.tables.iter().zip(named) {
        let boards = board_bound(topo, &cfg.for_table(t), s.step_keys);
        tables.push(Sharer { stage: s, own: t.max_bytes.map(|m| (m, format!("table `{}` max_bytes={m}", t.name))), boards });
    }
    share_among(topo, tables, cfg.table_max_bytes.map(|b| (b, format!("--table-max-bytes {b}"))), "--table")
}

/// One table of [`share_among`]: its stage, its own largest size and how it was given (for
/// errors), the bound of its host boards ([`board_bound`]).
pub struct Sharer<'s> {
    /// The table.
    pub stage: &'s mut EmbeddingStage,
    /// Its own largest size, and how it was given (`table `a` max_bytes=...`).
    pub own: Option<(u64, String)>,
    /// The most bytes its host boards take ([`board_bound`]).
    pub boards: u64,
}

/// The largest sizes of several host tables of one process (collective over the world; every
/// rank passes the same tables in the same order), once the tables and their exchangers'
/// segments exist. A table with a size of its own keeps it; the others share a total by their
/// files' sizes (capacity times row bytes): the total given (`total`, and how it was given),
/// else what [`growth_limit`] leaves of the shared-memory directory's free space (with every
/// table's file and every table's host boards, as [`auto_max_bytes`] counts one table's) less
/// the tables' own sizes. A table never gets less than its file (it then evicts at its size).
/// The sizes given are refused, on every rank alike, when their growth's peak cannot fit
/// beside the boards in that free space; `what` (`--table`) starts the error.
pub fn share_among(topo: &Topology, tables: Vec<Sharer<'_>>, total: Option<(u64, String)>, what: &str) -> TrainResult<()> {
    let file = |s: &EmbeddingStage| s.table.table().header().layout.file_len;
    let files: u64 = tables.iter().map(|t| file(t.stage)).sum();
    let boards: u64 = tables.iter().map(|t| t.boards).fold(0, u64::saturating_add);
    let hosts_here = (topo.machine_local_size / topo.local_size.max(1)).max(1) as u64;
    let free = if topo.is_leader() { crate::fileio::free_bytes(&topo.config.shm_dir) } else { None };
    let mine = free.map_or(u64::MAX, |f| (f / hosts_here).saturating_add(files));
    let least = topo.control().all_min("every rank's agreement on the tables' largest sizes", mine);
    let own: u64 = tables.iter().filter_map(|t| t.own.as_ref().map(|o| o.0)).sum();
    let given = own.saturating_add(total.as_ref().map_or(0, |t| t.0));
    let fits = least.saturating_sub(boards) / 3 * 2;
    if given > fits {
        let each: Vec<&str> = tables.iter().filter_map(|t| t.own.as_ref().map(|o| o.1.as_str())).chain(total.as_ref().map(|t| t.1.as_str())).collect();
        return Err(TrainError::Config(format!(
            "{what}: the tables' largest sizes given ({}) sum to {given} bytes, and a growth's peak (the old file and the new) beside the sparse exchange's host boards ({boards} bytes) fits {fits} bytes in {} ({least} bytes free with the tables' files): lower them, or make room there",
            each.join(", "),
            topo.config.shm_dir.display()
        )));
    }
    let total = total.map_or_else(|| growth_limit(least, boards).saturating_sub(own), |t| t.0);
    let sizes: Vec<(u64, Option<u64>)> = tables.iter().map(|t| (file(t.stage), t.own.as_ref().map(|o| o.0))).collect();
    for (t, share) in tables.into_iter().zip(shares(total, &sizes)) {
        t.stage.set_max_bytes(share);
    }
    Ok(())
}

/// Each table's largest size, of tables `(file bytes, own max_bytes=)`: its own, else its
/// share of `total` by its file's bytes among the tables without one ([`share_max_bytes`]).
pub fn shares(total: u64, tables: &[(u64, Option<u64>)]) -> Vec<u64> {
    let sharers: u128 = tables.iter().filter(|(_, m)| m.is_none()).map(|(f, _)| *f as u128).sum();
    tables.iter().map(|(f, m)| m.unwrap_or((total as u128 * *f as u128 / sharers.max(1)) as u64)).collect()
}

/// The largest table file one host may grow to in `free` bytes of its shared-memory
/// directory that must also hold `boards` bytes of host boards: the growth's peak (the old
/// file and the new one, 1.5 times the new) fits beside them, and it is at most
/// [`AUTO_MAX_SHARE`] of `free`.
pub fn growth_limit(free: u64, boards: u64) -> u64 {
    let peak_room = free.saturating_sub(boards) / 3 * 2;
    peak_room.min((free as f64 * AUTO_MAX_SHARE) as u64)
}

/// Rows of the global batch one host's ranks read in a step (the host's share).
fn host_rows(topo: &Topology, cfg: &TrainConfig) -> usize {
    cfg.batch.div_ceil(topo.size.max(1)) * topo.local_size
}

/// The most keys one host's step lists on its board (before dedupe) for data like `ds`:
/// every single-hot field of each of the host's rows ([`crate::data::Fields`]: a TSV's 26,
/// a Parquet file's its own count) and the list ids of the rows with the most
/// ([`Dataset::most_ids`]: rows drawn in any order hold no more).
pub fn host_step_keys(topo: &Topology, cfg: &TrainConfig, ds: &Dataset) -> u64 {
    let rows = host_rows(topo, cfg);
    step_keys_of(rows, ds.fields().sparse, ds.most_ids(rows))
}

/// The most keys `rows` rows list: `sparse` single-hot keys each and `most_ids` list ids.
fn step_keys_of(rows: usize, sparse: usize, most_ids: u64) -> u64 {
    (rows as u64).saturating_mul(sparse as u64).saturating_add(most_ids)
}

/// [`host_step_keys`] over every `--data` file of `data` whose cache is there
/// ([`super::data::TrainData::most_ids`]: the first file's, and the prepared caches of the
/// others, read cheaply), the largest over the ranks (collective: a cache the background
/// preparation finishes meanwhile must not give ranks different bounds). A later file
/// whose cache was not there yet and that holds longer lists makes the boards grow past
/// it (a board grows as its pieces need; a shared-memory directory without room for that is
/// an error naming the bytes).
pub fn data_step_keys(topo: &Topology, cfg: &TrainConfig, data: &super::data::TrainData) -> TrainResult<u64> {
    let (first, _) = data.first()?;
    let rows = host_rows(topo, cfg);
    let mine = step_keys_of(rows, first.fields().sparse, data.most_ids(rows));
    Ok(topo.control().all_max("every rank's most keys of a host's step", mine))
}

/// [`host_step_keys`] without data to look at (a Python `HostEmbedding`): one key of each
/// of Criteo's 26 categorical fields for each of the host's rows of a `--batch`-sized step.
pub fn default_step_keys(topo: &Topology, cfg: &TrainConfig) -> u64 {
    (host_rows(topo, cfg) as u64).saturating_mul(crate::data::criteo::NUM_SPARSE as u64)
}

/// The most bytes the host boards of a run take in the shared-memory directory on one host
/// ([`crate::sparse::board::board_bytes`]): the gradient exchange's board, whose largest
/// piece is the host's list of a step (at most `step_keys` keys, [`host_step_keys`]), and
/// with `--sync-every k > 1` the delta exchange's, whose list holds at most the rows of `k`
/// steps.
pub fn board_bound(topo: &Topology, cfg: &TrainConfig, step_keys: u64) -> u64 {
    use crate::sparse::board::board_bytes;
    use crate::sparse::list::encoded_len;
    let step_keys = usize::try_from(step_keys).unwrap_or(usize::MAX);
    let width = cfg.row_width();
    let (empty, row) = (encoded_len(0, width, true), encoded_len(1, width, true) - encoded_len(0, width, true));
    let list = |keys: usize| empty.saturating_add(keys.saturating_mul(row));
    let mut bound = board_bytes(topo.local_size, list(step_keys));
    if cfg.sync_every > 1 {
        bound = bound.saturating_add(board_bytes(topo.local_size, list(step_keys.saturating_mul(cfg.sync_every as usize))));
    }
    bound
}

impl EmbeddingStage {
    /// Opens this host's table (collective over the world): a new one shaped by `cfg`, or
    /// the byte-exact copy of a checkpoint's table `saved`; then manages it as `cfg` says,
    /// its host boards sized for steps of `step_keys` keys at most ([`host_step_keys`]).
    pub fn open(topo: &Topology, cfg: &TrainConfig, saved: Option<&Path>, step_keys: u64) -> TrainResult<EmbeddingStage> {
        let tc = cfg.table_config();
        match saved {
            Some(p) => EmbeddingStage::open_from(topo, cfg, TableSource::Saved(p, &tc), step_keys),
            None => EmbeddingStage::open_from(topo, cfg, TableSource::New(&tc), step_keys),
        }
    }

    /// Opens this host's table from `source` (collective over the world) and manages it as
    /// `cfg` says: what [`EmbeddingStage::open`] does, and a warm start's table
    /// (`--init-from`).
    pub fn open_from(topo: &Topology, cfg: &TrainConfig, source: TableSource<'_>, step_keys: u64) -> TrainResult<EmbeddingStage> {
        EmbeddingStage::open_named(topo, cfg, source, &TableName::default(), step_keys)
    }

    /// [`EmbeddingStage::open_from`] for the table `name` (collective over the world): one
    /// of several a process holds at once. Every rank must open the same name with the same
    /// row width here, else every rank gets [`TrainError::Config`] saying what each opened.
    pub fn open_named(topo: &Topology, cfg: &TrainConfig, source: TableSource<'_>, name: &TableName, step_keys: u64) -> TrainResult<EmbeddingStage> {
        check_same_table(topo, name, cfg.row_width())?;
        let mut table = HostTable::open_tagged(topo, source, &name.tag("table"))?;
        let h = *table.table().header();
        let mut exchanger = SparseExchanger::new_tagged(topo, cfg.sparse_exchange, cfg.sparse_normalize, cfg.row_width(), &name.tag("sparse"))?;
        // `--sparse-compression`: the rows that cross hosts, gradients or (with
        // `--sync-every`) the deltas of a sync.
        let row_form = match cfg.sparse_compression {
            Compression::Fp16 => Some(RowForm::Fp16),
            Compression::Bf16 => Some(RowForm::Bf16),
            c => c.onebit_form(cfg.onebit_lambda.unwrap_or(crate::onebit::DEFAULT_LAMBDA)).map(RowForm::OneBit),
        };
        exchanger.set_row_compression(row_form)?;
        let sync = if cfg.sync_every > 1 {
            exchanger.set_host_only(true);
            // Only leaders send deltas: a key's count is the number of hosts that changed it.
            let mut exchanger = SparseExchanger::new_tagged(topo, cfg.sparse_exchange, SparseNormalize::Frequency, cfg.row_width(), &name.tag("sparse-delta"))?;
            exchanger.set_row_compression(row_form)?;
            Some(SparseSync { rows: RowsAtSync::new(cfg.row_width()), exchanger, skipped: 0, counts: DeltaCounts::default() })
        } else {
            None
        };
        // After every segment made at the start, so that the free space measured is what
        // the table's growths have.
        let max_bytes = match cfg.table_max_bytes {
            Some(b) => b,
            None => auto_max_bytes(topo, cfg, h.layout.file_len, step_keys),
        };
        table.set_policy(TablePolicy { max_capacity: TablePolicy::max_capacity_for(&h, max_bytes), evict: cfg.evict, expire_after: cfg.expire_after_steps });
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
            sync,
            step_keys,
        })
    }

    /// Sets the largest size the table may grow to ([`share_max_bytes`]): at least its file.
    fn set_max_bytes(&mut self, max: u64) {
        let h = *self.table.table().header();
        if let Some(p) = self.table.policy().copied() {
            self.table.set_policy(TablePolicy { max_capacity: TablePolicy::max_capacity_for(&h, max), ..p });
        }
        self.max_bytes = max.max(h.layout.file_len);
    }

    /// The host table.
    pub fn table(&self) -> &HostTable {
        &self.table
    }

    /// The host table, to write (a write-back cache on its leader).
    pub fn table_mut(&mut self) -> &mut HostTable {
        &mut self.table
    }

    /// The exchanger (its cumulative statistics).
    pub fn exchanger(&self) -> &SparseExchanger {
        &self.exchanger
    }

    /// Sets the learning rate of the leader's updates from the next step on (the Python
    /// module's `SparseOptimizer(lr=...)`; `--sparse-lr` at the start).
    pub fn set_lr(&mut self, lr: f32) {
        self.lr = lr;
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
    ///
    /// With `--sync-every` k > 1 the exchange stays inside the host, the leader records
    /// the rows at the last sync before it updates them, and a non-finite update is skipped
    /// on this host under either policy (under `Stop` every rank stops at the next sync).
    pub fn exchange_and_apply(&mut self, keys: &[u64], grads: &[f32], step: u64, policy: NanPolicy) -> TrainResult<SparseStats> {
        self.exchange_and_apply_with(keys, grads, step, policy, None)
    }

    /// [`EmbeddingStage::exchange_and_apply`] of a GPU hot-row cache in write-back, whose
    /// cached rows the leader's update leaves as they are
    /// ([`crate::embedding::EmbeddingTable::apply_updates_held`]), as `held` says.
    pub fn exchange_and_apply_held(&mut self, keys: &[u64], grads: &[f32], held: Held<'_>, step: u64, policy: NanPolicy) -> TrainResult<SparseStats> {
        self.exchange_and_apply_with(keys, grads, step, policy, Some(held))
    }

    fn exchange_and_apply_with(&mut self, keys: &[u64], grads: &[f32], step: u64, policy: NanPolicy, held: Option<Held<'_>>) -> TrainResult<SparseStats> {
        let skips = &mut self.nan_skips;
        let mut sync = self.sync.as_mut();
        let lr = self.lr;
        let mut update = |table: &mut HostTable, g: AggregatedGrads<'_>| -> SparseResult<()> {
            let dim = g.grads.len() / g.keys.len().max(1);
            if let Some(i) = crate::train::checkpoint::first_non_finite(g.grads) {
                let e = SparseError::NonFinite { key: g.keys[i / dim.max(1)], at: i % dim.max(1), value: g.grads[i] };
                match (policy, sync.as_mut()) {
                    (NanPolicy::Stop, None) => return Err(e),
                    (NanPolicy::Stop, Some(s)) => {
                        s.skipped += 1;
                        crate::eprint_line(&format!("ringrec: step {step}: {e}: this host skips it; every rank stops at the next sync (--nan-policy stop)"));
                    }
                    (NanPolicy::SkipStep, _) => {
                        *skips += 1;
                        crate::eprint_line(&format!("ringrec: warning: step {step}: {e}: skipped (--nan-policy skip-step)"));
                    }
                }
                return Ok(());
            }
            if let Some(s) = sync.as_mut() {
                s.rows.record(table.table(), g.keys)?;
            }
            match &held {
                None => table.apply_updates(g.keys, g.grads, lr)?,
                Some(Held::Misses { all, rows }) => {
                    // The merged list is the misses', in the batch's key order.
                    let misses = all.iter().zip(*rows).filter(|(_, r)| **r != HELD).map(|(k, _)| k);
                    if g.keys.len() != keys.len() || !misses.eq(g.keys.iter()) {
                        return Err(SparseError::Invalid("the merged list of a write-back cache's step is not its misses".into()));
                    }
                    table.apply_updates_held(all, g.grads, lr, rows)?
                }
                Some(Held::Cached(cached)) => {
                    let rows: Vec<u32> = g.keys.iter().enumerate().map(|(i, k)| if cached(*k) { HELD } else { i as u32 }).collect();
                    table.apply_updates_held(g.keys, g.grads, lr, &rows)?
                }
            };
            Ok(())
        };
        let done = self.exchanger.exchange_and_update(&mut self.table, keys, grads, &mut update);
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

    /// The merged list the leader applied to the table in the last step
    /// ([`EmbeddingStage::exchange_and_apply`]), readable on every rank
    /// ([`SparseExchanger::host_result`]); `None` when the leader skipped it as not finite
    /// (every rank decides that on the same list).
    pub fn applied(&mut self) -> TrainResult<Option<AggregatedGrads<'_>>> {
        let g = self.exchanger.host_result()?;
        // One sequential pass: on the step's path, where waking a thread pool costs more.
        Ok(g.grads.iter().all(|x| x.is_finite()).then_some(g))
    }

    /// The sparse half of a `--sync-every` sync (collective over the world; nothing
    /// without lazy synchronisation): each leader sends the zero-filtered deltas of the rows
    /// its host changed since the last sync, combined per key over the hosts that changed
    /// it, and every leader sets those rows to their value at the last sync plus the
    /// combined delta (see [`crate::sparse::delta`]); then the host barrier. Afterwards every
    /// host holds the same rows. Returns the exchange's counters (`None` without sync) and
    /// the table updates this host skipped as not finite since the last sync (leader).
    pub fn sync_tables(&mut self) -> TrainResult<(Option<SparseStats>, u64)> {
        let Some(s) = self.sync.as_mut() else { return Ok((None, 0)) };
        let (mut keys, mut deltas) = (Vec::new(), Vec::new());
        let leader = self.table.is_leader();
        // Only a lookup of the leader's own table can fail here: an impossible shape error.
        let found = if leader { s.rows.deltas(self.table.table(), &mut keys, &mut deltas) } else { Ok(()) };
        if found.is_err() {
            keys.clear();
            deltas.clear();
        }
        if leader {
            s.counts.touched_rows += s.rows.len() as u64;
            s.counts.delta_rows += keys.len() as u64;
        }
        let rows = &mut s.rows;
        let mut values = Vec::new();
        let mut update = |table: &mut HostTable, g: AggregatedGrads<'_>| -> SparseResult<()> {
            rows.rows_after_sync(table.table(), g.keys, g.grads, &mut values)?;
            // Absent keys are inserted first (the table grows if it must) by a step of
            // zero, which leaves every row as it is; then the rows are set.
            table.apply_updates(g.keys, &vec![0.0; g.grads.len()], 0.0)?;
            table.table_mut()?.put_rows(g.keys, &values)?;
            Ok(())
        };
        let (_, st) = s.exchanger.exchange_and_update(&mut self.table, &keys, &deltas, &mut update)?;
        found?;
        s.rows.clear();
        s.counts.cross_bytes_sent += st.cross_bytes_sent;
        s.counts.cross_bytes_received += st.cross_bytes_received;
        Ok((Some(st), std::mem::take(&mut s.skipped)))
    }

    /// A CRC-32 of the table's rows: every live key with its row, in key order (the same
    /// on two hosts whose tables hold the same rows, wherever the rows lie in the file).
    pub fn rows_crc(&self) -> TrainResult<u32> {
        let t = self.table.table();
        let keys: Vec<u64> = t.live_keys().into_iter().map(|(k, _)| k).collect();
        let mut crc = crate::hash::Crc32::new();
        let mut rows = Vec::new();
        for chunk in keys.chunks(4096) {
            rows.resize(chunk.len() * t.dim(), 0.0);
            t.lookup(chunk, &mut rows)?;
            for (k, row) in chunk.iter().zip(rows.chunks_exact(t.dim())) {
                crc.update(&k.to_le_bytes());
                crc.update(bytemuck::cast_slice(row));
            }
        }
        Ok(crc.finish())
    }

    /// What the sparse syncs did so far (zero without `--sync-every`).
    pub fn delta_counts(&self) -> DeltaCounts {
        self.sync.as_ref().map(|s| s.counts).unwrap_or_default()
    }

    /// Sums of this rank's sparse-exchange counters over the run: the steps' exchange and
    /// the syncs' delta exchange.
    pub fn traffic_totals(&self) -> SparseStats {
        let mut t = self.exchanger.totals().clone();
        if let Some(s) = &self.sync {
            t.add(s.exchanger.totals());
        }
        t
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

    /// The most keys a host's step lists, as the default `--table-max-bytes` left its
    /// boards room for ([`host_step_keys`]).
    pub fn step_keys(&self) -> u64 {
        self.step_keys
    }

    /// Seconds this run's growths took on this host's leader (0 on other ranks): the sum
    /// and the longest.
    pub fn growth_seconds(&self) -> (f64, f64) {
        (self.growth_seconds, self.growth_max_seconds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embedding::{Extras, Layout, OptimizerKind, StorageDtype};

    #[test]
    fn tables_share_the_largest_size_by_their_files() {
        // 64 MiB over three tables of 1, 2 and 1 MiB files: 16, 32 and 16 MiB.
        let mib = 1u64 << 20;
        assert_eq!(shares(64 * mib, &[(mib, None), (2 * mib, None), (mib, None)]), vec![16 * mib, 32 * mib, 16 * mib]);
        // A table of its own max_bytes= keeps it and takes no share.
        assert_eq!(shares(64 * mib, &[(mib, None), (2 * mib, Some(5 * mib)), (3 * mib, None)]), vec![16 * mib, 5 * mib, 48 * mib]);
        assert_eq!(shares(0, &[(mib, Some(mib))]), vec![mib]);
    }

    #[test]
    fn the_default_limit_leaves_room_for_a_growth_beside_the_boards() {
        // Issue 36's case: 2 ranks on a 20 MiB tmpfs, 16 MiB free when the table opens, the
        // boards of a 1024-row batch at dim 16 (about 10 MiB) still to come.
        let boards = crate::sparse::board::board_bytes(2, crate::sparse::list::encoded_len(1024 * 26, 16, true));
        let free = 16_769_024;
        let limit = growth_limit(free, boards);
        let file = |cap: u64| Layout::compute(16, StorageDtype::F32, cap, OptimizerKind::Sgd, Extras { usage: true, sketch_depth: 0, sketch_width: 0 }).unwrap().file_len;
        assert!(limit < file(65536), "limit {limit}: the growth to 65536 slots (old {} + new {}) would not fit beside {boards} bytes of boards", file(32768), file(65536));
        assert!(file(32768) + file(16384) + boards <= free, "the growth to the largest size fits");
        // A large directory keeps the old default: half the free space.
        assert_eq!(growth_limit(64 << 30, boards), 32 << 30);
        // No room beside the boards: no growth at all (the table evicts at its own size).
        assert_eq!(growth_limit(boards / 2, boards), 0);
    }
}
