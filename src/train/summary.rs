//! What a run reports: [`TrainSummary`] (rank 0 prints it, `ringrec train --json`), its
//! parts ([`RankTraffic`], [`StopTarget`]), and how [`Trainer::summary`] fills it at the
//! end of a run — the counts summed over the ranks, the held-out evaluation, the table's
//! shape, the `--sync-every` part, the dense and sparse traffic ([`super::traffic`]).

use serde::Serialize;

use super::{metrics, Trainer, TrainResult};
use crate::device::Device;

/// What a run reports (rank 0 prints it).
#[derive(Serialize, Debug, Clone, Default)]
pub struct TrainSummary {
    /// World size.
    pub ranks: usize,
    /// Hosts.
    pub hosts: usize,
    /// Threads per rank.
    pub threads_per_rank: usize,
    /// The host collectives backend (start-up broadcasts, evaluation; the engine's for
    /// host tensors).
    pub backend: String,
    /// Where the dense model ran: `cpu`, or the device's name.
    pub device: String,
    /// Sparse exchange.
    pub sparse_exchange: String,
    /// Sparse normalisation.
    pub sparse_normalize: String,
    /// Training rows.
    pub train_rows: usize,
    /// Held-out rows.
    pub test_rows: usize,
    /// Global steps taken in this run.
    pub steps: u64,
    /// Global step reached (resumed runs count earlier steps).
    pub global_step: u64,
    /// Samples trained on in this run.
    pub samples: u64,
    /// Wall time of the training loop (seconds).
    pub train_seconds: f64,
    /// Training samples per second (all ranks).
    pub samples_per_sec: f64,
    /// Mean training loss over the last epoch's steps of this run.
    pub train_loss: f64,
    /// Held-out log loss.
    pub test_logloss: Option<f64>,
    /// Held-out AUC over all ranks' predictions.
    pub test_auc: Option<f64>,
    /// Held-out normalised entropy (log loss / entropy of the held-out click rate,
    /// [`super::metrics::ne`]).
    pub test_ne: Option<f64>,
    /// Held-out calibration (mean prediction / held-out click rate).
    pub test_calibration: Option<f64>,
    /// Largest peak resident set over the ranks (MiB).
    pub peak_rss_mib: f64,
    /// MLP forward+backward GFLOP/s on rank 0 (CPU device; 0 on a GPU, whose step only
    /// queues work).
    pub mlp_gflops: f64,
    /// Rows in the host table at the end (with `--table`, in all the run's tables: every
    /// `table_*` count is summed over them, and `tables` breaks them down).
    pub table_rows: u64,
    /// Sparse-exchange bytes rank 0 sent + received inside its host per step (mean).
    pub sparse_bytes_intra_host_per_step: f64,
    /// Sparse-exchange bytes rank 0 sent + received across hosts per step (mean).
    pub sparse_bytes_cross_host_per_step: f64,
    /// FNV-1a of the final dense parameters (same on every rank).
    pub params_fnv: String,
    /// Seconds rank 0 spent per phase: batch (data + lookup + input), mlp (forward,
    /// backward and submitting the layers' gradients), scatter (key gradients), sparse
    /// (exchange + apply + host barrier, overlapping the dense allreduce), allreduce (the
    /// wait for the dense allreduce that remains after the sparse exchange), optimizer;
    /// and gpu_wait: the time the device waited for the host between steps (beside the
    /// others, not a part of them: see [`super::phases::DeviceWait`]).
    pub phase_seconds: std::collections::BTreeMap<String, f64>,
    /// Steps whose batch rank 0 read ahead, during the step before (`--pipeline`).
    pub prefetched_batches: u64,
    /// Checkpoints written by this run (rank 0).
    pub checkpoints_written: u64,
    /// Periodic checkpoints not written because the parameters moved less than
    /// `--checkpoint-min-change` (rank 0).
    pub checkpoints_skipped: u64,
    /// Updates skipped under `--nan-policy skip-step` (dense and sparse halves counted
    /// apart: `dense`, `sparse`, the latter over every table).
    pub nan_skips: std::collections::BTreeMap<String, u64>,
    /// Every step's global mean loss (with `record_losses`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub losses: Vec<f64>,
    /// Storage dtype of the table's rows.
    pub table_dtype: String,
    /// Slots of the host table at the end.
    pub table_capacity: u64,
    /// Bytes of the host table file at the end (one per host).
    pub table_bytes: u64,
    /// `--init-from`: the model the run started from (the checkpoint used, its step, and
    /// newer checkpoints skipped as damaged); absent without it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub init_from: Option<super::warm::WarmFrom>,
    /// Largest size the table may grow to (`--table-max-bytes`, or what the shared-memory
    /// directory allowed; with `--table`, the tables' sizes summed).
    pub table_max_bytes: u64,
    /// The most keys a host's step lists (a host board's largest list, before dedupe), as
    /// the shared-memory directory's room for the boards was counted: the host's rows times
    /// the single-hot fields, plus the list ids of the rows with the most (in any `--data`
    /// file whose cache was there at the start).
    pub board_step_keys: u64,
    /// Times the table grew in this run.
    pub table_growths: u64,
    /// Seconds rank 0's host leader spent building grown tables in this run (sum).
    pub table_growth_seconds: f64,
    /// The longest of those growths (seconds).
    pub table_growth_max_seconds: f64,
    /// Rows inserted in this run.
    pub table_inserted: u64,
    /// Rows evicted in this run (the table at its largest size needed room).
    pub table_evictions: u64,
    /// Rows expired in this run (`--expire-after-steps`).
    pub table_expirations: u64,
    /// Gradient rows dropped in this run because their key had no row: not admitted yet
    /// (`--admit-after`), or no room at the largest size.
    pub table_refused: u64,
    /// Bytes of the admission sketch (0 without `--admit-after`).
    pub admission_sketch_bytes: u64,
    /// `--table`: each table's part, the default table as `default` (empty, and absent
    /// from the JSON, in a one-table run).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub tables: std::collections::BTreeMap<String, super::TableSummary>,
    /// Why the run ended before its last step: a `--stop-at-loss` / `--stop-at-auc` target
    /// reached at an `--eval-every` report (every rank stops after that step).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped_at_target: Option<StopTarget>,
    /// Every rank's sparse-exchange bytes in this run, by direction, inside its host and
    /// across hosts (counted where the bytes are written and read; the sums of `sent` and
    /// `received` over the ranks are equal).
    pub sparse_traffic_per_rank: Vec<RankTraffic>,
    /// Sparse-exchange bytes sent across hosts by all ranks, per sample trained.
    pub sparse_cross_host_bytes_per_sample: f64,
    /// Compression of the dense allreduce (`none`, `fp16`, `bf16`, `1bit`, `1bit-l1`).
    pub dense_compression: String,
    /// Bytes of dense tensors each rank reduced per step (as float32).
    pub dense_bytes_per_step: f64,
    /// Bytes each rank put on the wire for them per step (after compression; 1-bit: the
    /// encodings, 1/32 of the float32 bytes plus 4 bytes of scale per tensor).
    pub dense_wire_bytes_per_step: f64,
    /// Every rank's dense bytes in this run (the engine's collectives and, with
    /// `--sync-scope host`, the per-step host allreduces) by direction, inside its host and
    /// across hosts: as counted by ringrec's own backends ([`crate::comm::count`]; no
    /// agreement headers), else as modelled (`dense_traffic_source` says which).
    pub dense_traffic_per_rank: Vec<RankTraffic>,
    /// `counted` (every rank's backends counted every dense collective) or `model` (MPI's
    /// or NCCL's collectives, or one left to MPI's own algorithm: 1-bit's allgather on
    /// `ring` or across the hosts of `hier`).
    pub dense_traffic_source: String,
    /// The same bytes from each collective's wire bytes and the backend's algorithm (the
    /// stated model of [`crate::comm::traffic`]), whatever the source.
    pub dense_traffic_model_per_rank: Vec<RankTraffic>,
    /// The backend whose algorithm `dense_traffic_model_per_rank` follows.
    pub dense_traffic_model: String,
    /// Collectives the engine ran on each rank (a fused one counts once): the counted and
    /// the modelled traffic differ by less than 16 bytes per collective, rank and direction
    /// (parts rounded to whole elements).
    pub dense_collectives: u64,
    /// Bytes sent across hosts by all ranks, dense and sparse, per sample trained.
    pub cross_host_bytes_per_sample: f64,
    /// Compression of the sparse rows sent across hosts (`none`, `1bit`, `1bit-l1`).
    pub sparse_compression: String,
    /// Keys whose 1-bit residual rank 0 keeps (`--sparse-compression`).
    pub sparse_compression_residual_rows: u64,
    /// `--sync-every` (1: every step).
    pub sync_every: u64,
    /// `--sync-scope`.
    pub sync_scope: String,
    /// Syncs in this run: one per step with `--sync-every 1`.
    pub syncs: u64,
    /// Allreduces of the dense model over the world: the gradient every step with
    /// `--sync-every 1`, else the delta at every sync (each `dense_param_bytes`, plus a
    /// value).
    pub dense_world_allreduces: u64,
    /// Bytes of the dense parameters (f32).
    pub dense_param_bytes: u64,
    /// Table rows the hosts updated between syncs, summed over hosts and syncs
    /// (`--sync-every` > 1).
    pub sync_touched_rows: u64,
    /// Of those, the rows whose zero-filtered delta was sent (the others did not change).
    pub sync_delta_rows: u64,
    /// Bytes the sparse delta exchanges sent across hosts, summed over the ranks (part of
    /// `sparse_traffic_per_rank`).
    pub sync_delta_cross_bytes_sent: u64,
    /// Bytes the sparse delta exchanges received across hosts, summed over the ranks.
    pub sync_delta_cross_bytes_received: u64,
    /// With `--sync-every` k > 1 or `--sparse-compression`, each host's table rows at the end, as a CRC-32 of every
    /// live key and its row in key order (hex, host order): all equal when the hosts hold
    /// the same rows. Empty strings with k = 1 (the tables are byte-identical files).
    pub table_rows_crc_per_host: Vec<String>,
    /// Every rank's `params_fnv` (rank order): all equal, as the replicas are.
    pub params_fnv_per_rank: Vec<String>,
    /// Training rows left out for weighing less than `--min-sample-weight` (after merging;
    /// over the files opened).
    pub samples_dropped_by_weight: u64,
    /// Training rows merged into an identical earlier row of their file
    /// (`--merge-duplicates`).
    pub samples_merged: u64,
    /// `--weight-column`: the field of each line that held its sample's weight, or a Parquet
    /// input's weight column (`None`: no weight column).
    pub weight_column: Option<crate::data::weights::WeightColumn>,
    /// The nulls of each column read from the Parquet inputs (training and held-out files,
    /// summed; from the files' statistics, `None` where a writer did not count them); empty
    /// without Parquet inputs.
    pub column_nulls: Vec<super::data::ColumnNulls>,
    /// The GPU hot-row cache and the step's copies to and from the device, over the ranks.
    pub gpu_cache: GpuCacheSummary,
}

/// What the GPU hot-row caches did (`--gpu-cache-mib`), and every copy the steps made to
/// and from the device, summed over the ranks (0 on `--device cpu`, which copies nothing).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GpuCacheSummary {
    /// Slots of each rank's cache (0: off).
    pub slots: u64,
    /// MiB of device memory each rank's cache takes.
    pub mib: f64,
    /// Steps between two choices of its keys (`--gpu-cache-refresh`).
    pub refresh_steps: u64,
    /// Who updates its rows (`--gpu-cache-mode`): `write-through` or `write-back`.
    pub mode: String,
    /// Unique keys of the batches found in the cache / unique keys.
    pub hit_rate: f64,
    /// Bytes copied to the device per sample: the batch, the missed rows, the cache's
    /// updates and refreshes.
    pub bytes_uploaded_per_sample: f64,
    /// Bytes copied from the device per sample.
    pub bytes_downloaded_per_sample: f64,
    /// Rows read from the host table into the caches by refreshes.
    pub rows_refreshed: u64,
}

/// One rank's traffic, by direction.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RankTraffic {
    /// World rank.
    pub rank: usize,
    /// Its host (0-based).
    pub host: usize,
    /// Bytes sent to ranks of its own host.
    pub intra_host_sent: u64,
    /// Bytes received from ranks of its own host.
    pub intra_host_received: u64,
    /// Bytes sent to ranks of other hosts.
    pub cross_host_sent: u64,
    /// Bytes received from ranks of other hosts.
    pub cross_host_received: u64,
}

/// A `--stop-at-*` target reached.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StopTarget {
    /// The global step after which every rank stopped.
    pub step: u64,
    /// The flag and its value (`--stop-at-auc 0.75`).
    pub target: String,
    /// The held-out value that reached it.
    pub value: f64,
}

impl<D: Device> Trainer<'_, D> {
    /// Ends the run on every rank (collective): the last loss, the held-out evaluation
    /// (unless disabled) and the summary (the same on every rank but the evaluation,
    /// which rank 0 holds).
    pub fn summary(mut self) -> TrainResult<TrainSummary> {
        // The run ends synchronised (`--sync-every`), with the rows a write-back GPU cache
        // changed in the host table.
        self.sync()?;
        self.write_back_cache()?;
        if let Some(u) = self.unread.take() {
            self.record(self.model.loss_sum()?, u)?;
        }
        let topo = self.topo;
        topo.control().barrier("the ranks' barrier");
        let train_seconds = self.train_seconds();
        if topo.config.log_sparse {
            let x = self.embedding.exchanger();
            crate::eprint_line(&format!("rank {} sparse exchange over {} steps: {}", topo.rank, x.steps(), x.totals()));
        }
        let _w = crate::watchdog::waiting("the run's summary");
        let samples = topo.control().all_sum("the run's summary", self.counters.samples);
        let eval = match self.last_eval {
            // The last interval report evaluated this very model.
            Some((step, e)) if step == self.position.step => e,
            _ if self.cfg.eval && self.data.has_held_out() => self.evaluate()?,
            _ => None,
        };
        // The last checkpoint is written while the evaluation runs: every rank learns its
        // outcome before the summary.
        self.finish_checkpoint()?;
        let peak = topo.control().all_max("the run's summary", metrics::peak_rss_mib());
        let traffic = self.traffic_per_rank();
        let cross_sent: u64 = traffic.iter().map(|t| t.cross_host_sent).sum();
        let mlp = self.phases.seconds("mlp");
        let steps = self.counters.steps.max(1) as f64;
        let on_cpu = self.model.device().kind() == "cpu";
        let sync = self.sync_summary()?;
        Ok(TrainSummary {
            ranks: topo.size,
            hosts: topo.num_hosts,
            threads_per_rank: self.cfg.threads_per_rank(topo),
            backend: self.coll.name().to_string(),
            device: self.model.device().describe(),
            sparse_exchange: self.cfg.sparse_exchange.name().to_string(),
            sparse_normalize: self.cfg.sparse_normalize.name().to_string(),
            train_rows: self.data.train_rows(),
            test_rows: self.data.held_out_rows(),
            steps: self.counters.steps,
            global_step: self.position.step,
            samples,
            train_seconds,
            samples_per_sec: self.counters.global_samples as f64 / train_seconds.max(1e-9),
            train_loss: self.losses.sum / self.losses.steps.max(1) as f64,
            test_logloss: eval.map(|e| e.logloss),
            test_auc: eval.map(|e| e.auc),
            test_ne: eval.and_then(|e| e.ne),
            test_calibration: eval.and_then(|e| e.calibration),
            peak_rss_mib: peak,
            mlp_gflops: if mlp > 0.0 && on_cpu { self.model.net().flops_per_sample() * self.counters.samples as f64 / mlp / 1e9 } else { 0.0 },
            sparse_bytes_intra_host_per_step: self.counters.intra_bytes / steps,
            sparse_bytes_cross_host_per_step: self.counters.cross_bytes / steps,
            params_fnv: crate::hash::fnv_hex(bytemuck::cast_slice(&self.model.params()?)),
            checkpoints_written: self.counters.checkpoints_written,
            checkpoints_skipped: self.counters.checkpoints_skipped,
            phase_seconds: self.phase_seconds()?,
            prefetched_batches: self.counters.prefetched,
            losses: std::mem::take(&mut self.losses.all),
            stopped_at_target: self.stopped.clone(),
            sparse_cross_host_bytes_per_sample: cross_sent as f64 / (self.counters.global_samples.max(1)) as f64,
            sparse_traffic_per_rank: traffic,
            init_from: self.warm_from.clone(),
            ..self.dense_summary(cross_sent, sync)
        })
    }

    /// The `--sync-every` part of the summary, with the tables' part (collective): the
    /// syncs, the sparse deltas summed over the tables, hosts and ranks, each host's rows'
    /// CRC-32.
    fn sync_summary(&self) -> TrainResult<TrainSummary> {
        let control = self.topo.control();
        let d = self.stages().iter().fold([0u64; 4], |a, (_, s)| {
            let d = s.delta_counts();
            [a[0] + d.touched_rows, a[1] + d.delta_rows, a[2] + d.cross_bytes_sent, a[3] + d.cross_bytes_received]
        });
        let all = control.all_sum_each("the run's summary", d);
        let fnvs = control.all_gather("the run's summary", [crate::hash::fnv1a64(bytemuck::cast_slice(&self.model.params()?))]);
        // The hosts' rows (k > 1 or --sparse-compression only: it reads the whole table,
        // which a synchronous run's invariant makes pointless).
        let check = self.local.is_some() || self.cfg.sparse_compression != crate::engine::Compression::None || self.gpu_cache.is_some() || self.table_caches.is_some();
        let crc = if self.topo.is_leader() && check { self.rows_crc()? as u64 } else { u64::MAX };
        let crcs = control.all_gather("the run's summary", [crc]);
        let mut per_host = vec![String::new(); self.topo.num_hosts];
        for (r, [c]) in crcs.iter().enumerate().filter(|(_, [c])| *c != u64::MAX) {
            per_host[self.topo.host_of_rank[r]] = format!("{c:08x}");
        }
        let (every, scope) = self.local.as_ref().map_or((1, self.cfg.sync_scope), |l| (l.every(), l.scope()));
        let syncs = self.dense_allreduces();
        Ok(TrainSummary {
            sync_every: every,
            sync_scope: scope.to_string(),
            syncs,
            dense_world_allreduces: syncs,
            dense_param_bytes: 4 * self.model.num_params() as u64,
            sync_touched_rows: all[0],
            sync_delta_rows: all[1],
            sync_delta_cross_bytes_sent: all[2],
            sync_delta_cross_bytes_received: all[3],
            table_rows_crc_per_host: per_host,
            params_fnv_per_rank: fnvs.iter().map(|[f]| format!("{f:016x}")).collect(),
            samples_merged: self.data.weight_counts().0,
            samples_dropped_by_weight: self.data.weight_counts().1,
            weight_column: self.cfg.weight_config().weight_column,
            column_nulls: self.data.column_nulls().to_vec(),
            gpu_cache: self.gpu_cache_summary(),
            ..self.table_summary(self.table_parts_summed())
        })
    }

    /// Seconds per phase so far, with the device's wait for the host (`gpu_wait`).
    pub(super) fn phase_seconds(&mut self) -> TrainResult<std::collections::BTreeMap<String, f64>> {
        let mut t = self.phases.totals();
        t.insert("gpu_wait".into(), self.device_wait.seconds(self.model.device())?);
        Ok(t)
    }

    /// The dense half of the summary's traffic, and its sum with the sparse cross-host
    /// bytes sent (collective).
    fn dense_summary(&self, sparse_cross_sent: u64, rest: TrainSummary) -> TrainSummary {
        let s = self.engine.stats();
        let backend = self.engine.device().and_then(crate::comm::traffic::model_name).unwrap_or(self.engine.backend_name()).to_string();
        let (model, counted) = self.dense_traffic(&s);
        let source = if counted.is_some() { "counted" } else { "model" };
        let traffic = counted.unwrap_or_else(|| model.clone());
        let cross: u64 = traffic.iter().map(|t| t.cross_host_sent).sum::<u64>() + sparse_cross_sent;
        let steps = self.counters.steps.max(1) as f64;
        TrainSummary {
            dense_compression: self.engine.compression().name().to_string(),
            dense_bytes_per_step: s.bytes as f64 / steps,
            dense_wire_bytes_per_step: (s.allreduce_wire_bytes + s.allgather_wire_bytes) as f64 / steps,
            dense_traffic_per_rank: traffic,
            dense_traffic_source: source.to_string(),
            dense_traffic_model_per_rank: model,
            dense_traffic_model: backend,
            dense_collectives: s.collectives,
            sparse_compression: self.cfg.sparse_compression.name().to_string(),
            cross_host_bytes_per_sample: cross as f64 / self.counters.global_samples.max(1) as f64,
            ..rest
        }
    }

    /// The GPU hot-row cache's part of the summary (collective): its counters and the
    /// model's copies, summed over the ranks.
    pub(super) fn gpu_cache_summary(&self) -> GpuCacheSummary {
        let c = self.gpu_cache_counters();
        let all = self.topo.control().all_sum_each("the run's summary", [c.samples, c.unique_keys, c.hits, c.bytes_uploaded, c.bytes_downloaded, c.rows_refreshed]);
        let samples = all[0].max(1) as f64;
        let (slots, bytes) = match (self.gpu_cache.as_ref(), self.table_caches.as_ref()) {
            (Some(c), _) => (c.capacity(), c.bytes()),
            (None, Some(c)) => (c.capacity(), c.bytes()),
            (None, None) => (0, 0),
        };
        GpuCacheSummary {
            slots: slots as u64,
            mib: bytes as f64 / (1u64 << 20) as f64,
            refresh_steps: self.cfg.gpu_cache_refresh,
            mode: self.cfg.gpu_cache_mode.name().to_string(),
            hit_rate: all[2] as f64 / all[1].max(1) as f64,
            bytes_uploaded_per_sample: all[3] as f64 / samples,
            bytes_downloaded_per_sample: all[4] as f64 / samples,
            rows_refreshed: all[5],
        }
    }

    /// This rank's cache counters with the model's copies added (none on the CPU device),
    /// over the samples of its steps.
    pub(super) fn gpu_cache_counters(&self) -> crate::embedding::CacheCounters {
        let mut c = match (self.gpu_cache.as_ref(), self.table_caches.as_ref()) {
            (Some(g), _) => *g.counters(),
            (None, Some(t)) => t.counters(),
            (None, None) => Default::default(),
        };
        if self.model.device().kind() != "cpu" {
            let (up, down) = self.model.bytes_moved();
            c.bytes_uploaded += up;
            c.bytes_downloaded += down;
        }
        c.samples = self.counters.samples;
        c
    }

    /// The tables' part of the summary, from each table's `parts`: their shape at the end
    /// and what happened to their rows in this run, summed over the tables, and the
    /// per-table breakdown.
    fn table_summary(&self, parts: Vec<(String, super::TableSummary)>) -> TrainSummary {
        let all = super::TableSummary::sum(parts.iter().map(|(_, p)| p));
        TrainSummary {
            table_dtype: self.embedding.table().table().header().dtype.to_string(),
            table_rows: all.rows,
            table_capacity: all.capacity,
            table_bytes: all.bytes,
            table_max_bytes: all.max_bytes,
            board_step_keys: self.embedding.step_keys(),
            table_growths: all.growths,
            table_growth_seconds: all.growth_seconds,
            table_growth_max_seconds: all.growth_max_seconds,
            table_inserted: all.inserted,
            table_evictions: all.evictions,
            table_expirations: all.expirations,
            table_refused: all.refused,
            admission_sketch_bytes: all.admission_sketch_bytes,
            nan_skips: [("dense".to_string(), self.counters.nan_skips_dense), ("sparse".to_string(), all.nan_skips)].into_iter().collect(),
            sparse_compression_residual_rows: all.compression_residual_rows,
            tables: super::table_summary::breakdown(parts),
            ..TrainSummary::default()
        }
    }
}
