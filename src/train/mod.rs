//! Synchronous data-parallel training of the CTR model (design 003): [`run`] with a
//! [`TrainConfig`], or a [`Trainer`] step by step (`new`, `step`, `evaluate`, `summary`).
//!
//! One step on every rank ([`Trainer::step`]):
//! 1. this rank's slice of the global batch (the same global batches at any rank count),
//!    its keys deduplicated ([`batch::Batch`]);
//! 2. the embedding stage looks the unique keys' rows up in the host-shared table
//!    ([`embedding::EmbeddingStage`]) straight into the dense model's staging slot;
//! 3. the dense model ([`crate::model::DenseModel`], on the CPU or a device) runs forward
//!    and backward; each layer's gradient (already scaled by 1/global batch, so the sum
//!    over ranks is the average) goes to the [`crate::engine`] as soon as backward produced
//!    it (`dense.layer<l>`, last layer first), so its allreduce runs on the engine's thread
//!    while the layers below are back-propagated;
//! 4. meanwhile, on this thread, the embedding stage exchanges the per-key gradients (host
//!    pre-aggregation, leaders allgather, frequency normalisation), the leader applies
//!    them to the table, then the host barrier;
//! 5. the reduced dense gradients come back from the engine; the dense optimizer runs on
//!    every rank (identical inputs, identical replicas).
//!
//! With `--sync-every k > 1` steps 3-5 stay on the rank (or host) and a sync every k steps
//! averages the dense delta and exchanges the tables' row deltas instead ([`sync`]).
//!
//! The data is one or more files trained in order, each cached as a memory-mappable
//! binary as training reaches it, the next one prepared in the background ([`data`]); it
//! defaults to a synthetic Criteo-format file that ringrec generates once.
//!
//! Using a trained model: [`predict`] (the scoring both the evaluation and `ringrec
//! predict` use), [`bundle`] (`ringrec export`'s serving bundle), [`source`] (what
//! `--model` and `--init-from` name), [`warm`] (`train --init-from`).

pub mod batch;
pub mod bundle;
pub mod checkpoint;
pub mod config;
pub mod data;
pub mod embedding;
pub mod error;
pub mod metrics;
pub mod phases;
pub mod predict;
pub mod source;
pub mod sync;
pub mod trainer;
pub mod warm;
pub mod weights;

use serde::Serialize;

use crate::comm::device::{Alone, HostCollectives};
use crate::comm::nccl::NcclComm;
use crate::comm;
use crate::device::{CpuDevice, CudaDevice, Device, HostKernels, HostOptions, Placement};
use crate::engine::controller::AssertSend;
use crate::engine::{DeviceExecutor, Engine, ExecuteDevice};
use crate::topology::Topology;

pub use config::{NanPolicy, TrainConfig};
pub use error::{TrainError, TrainResult};
pub use sync::SyncScope;

pub use trainer::{Evaluation, Progress, Trainer};

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
    /// Largest peak resident set over the ranks (MiB).
    pub peak_rss_mib: f64,
    /// MLP forward+backward GFLOP/s on rank 0 (CPU device; 0 on a GPU, whose step only
    /// queues work).
    pub mlp_gflops: f64,
    /// Rows in the host table at the end.
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
    /// wait for the dense allreduce that remains after the sparse exchange), optimizer.
    pub phase_seconds: std::collections::BTreeMap<String, f64>,
    /// Checkpoints written by this run (rank 0).
    pub checkpoints_written: u64,
    /// Periodic checkpoints not written because the parameters moved less than
    /// `--checkpoint-min-change` (rank 0).
    pub checkpoints_skipped: u64,
    /// Updates skipped under `--nan-policy skip-step` (dense and sparse halves counted
    /// apart: `dense`, `sparse`).
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
    /// Largest size the table may grow to (`--table-max-bytes`, or what the shared-memory
    /// directory allowed).
    pub table_max_bytes: u64,
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
    /// `--weight-column`: the field of each line that held its sample's weight (`None`:
    /// no weight column).
    pub weight_column: Option<u32>,
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

/// Trains as `cfg` says on every rank of `topo` (collective), calling `progress` on every
/// rank after each step (each rank's own view: a display shows rank 0's, `--progress-dir`
/// writes every rank's); returns the summary.
pub fn run(topo: &Topology, cfg: &TrainConfig, progress: &mut dyn FnMut(&Progress)) -> TrainResult<TrainSummary> {
    let engine = cfg.engine_config(topo)?;
    let cfg = &TrainConfig { onebit_lambda: Some(engine.onebit_lambda), ..cfg.clone() };
    topo.agree_settings_shown(&cfg.settings(topo, &engine))?;
    cfg.validate()?;
    let threads = cfg.threads_per_rank(topo);
    let _ = rayon::ThreadPoolBuilder::new().num_threads(threads).build_global();
    let mut placement = topo.agree(cfg.device.resolve(topo.machine_local_rank, topo.size).map_err(|e| format!("rank {}: {e}", topo.rank)))?;
    let mut gpu = None;
    if let Placement::Cuda(ordinal) = placement {
        // NCCL cannot run two ranks of a job on one GPU.
        gpu = rank_gpu(topo, cfg.device, ordinal.unwrap_or(0), true)?;
        if gpu.is_none() {
            placement = Placement::Cpu;
        }
    }
    match placement {
        Placement::HostKernels => {
            let options = topo.agree(HostOptions::from_env(topo.rank))?;
            let dev = topo.agree(HostKernels::with_options(options).map_err(|e| format!("rank {}: {e}", topo.rank)))?;
            let coll = HostCollectives::new(comm::build_tagged(cfg.backend(topo), topo, "device")?);
            let exec = DeviceExecutor::new(dev.fork()?, coll);
            drive(topo, cfg, dev, Engine::start_with_device(topo, &engine, Some(Box::new(exec)))?, progress)
        }
        Placement::Cuda(_) => {
            let dev = gpu.ok_or_else(|| TrainError::Config("internal: the GPU placement has no device".into()))?;
            let queue = dev.fork()?;
            let exec: Box<dyn ExecuteDevice> = if topo.size == 1 {
                // One rank: nothing to reduce, so no NCCL (nor libnccl) needed.
                Box::new(DeviceExecutor::new(queue, Alone))
            } else {
                let nccl = NcclComm::new(topo, &queue).map_err(|e| TrainError::Config(format!("rank {} joining the NCCL communicator: {e}", topo.rank)))?;
                Box::new(DeviceExecutor::new(queue, nccl))
            };
            if topo.rank == 0 {
                crate::eprint_line(&format!("ringrec: dense model on {}", dev.describe()));
            }
            drive(topo, cfg, dev, Engine::start_with_device(topo, &engine, Some(exec))?, progress)
        }
        Placement::Cpu | Placement::Auto => {
            let engine = Engine::start(topo, &engine)?;
            on_pool(|| drive(topo, cfg, CpuDevice::new(threads), engine, progress))
        }
    }
}

/// This rank's GPU `ordinal`, opened on every rank before any waits in NCCL's start-up.
/// Ranks of a machine on one physical GPU (every rank's pick is gathered, so every rank
/// decides alike): under `--device auto` (`asked`) every rank goes to the CPU instead
/// (`None`, with a note on rank 0), as without a GPU, so `train` and `predict` always
/// agree on the device; under `--device cuda` they are refused when `exclusive` (NCCL).
pub(crate) fn rank_gpu(topo: &Topology, asked: Placement, ordinal: usize, exclusive: bool) -> TrainResult<Option<CudaDevice>> {
    let dev = topo.agree(CudaDevice::new(ordinal).map_err(|e| format!("rank {} on GPU {ordinal} of {}: {e}", topo.rank, topo.hostname)))?;
    if !exclusive && asked != Placement::Auto {
        return Ok(Some(dev));
    }
    let bus = dev.pci_bus_id().unwrap_or_else(|e| format!("unknown to rank {} ({e})", topo.rank));
    match crate::device::select::check_distinct(topo, &bus, topo.config.allow_shared_gpu) {
        Ok(()) => Ok(Some(dev)),
        Err(e @ crate::device::DeviceError::SharedGpu { .. }) if asked == Placement::Auto => {
            if topo.rank == 0 {
                crate::eprint_line(&format!("ringrec: --device auto: {e}; running on the CPU (--device cuda refuses instead)"));
            }
            Ok(None)
        }
        Err(e) => Err(TrainError::Config(e.to_string())),
    }
}

/// Runs `f` on a worker of the rayon pool, so the CPU device's parallel regions fork from
/// a thread that takes part in them (a caller outside the pool would sleep and be woken at
/// each of a step's dozen regions: measured 4-5% of a 2-thread step).
fn on_pool<R: Send>(f: impl FnOnce() -> R) -> R {
    // SAFETY of the Send assertion: the closure's captures (the topology's MPI
    // communicators, the engine's handle) are used by one thread at a time: the pool
    // worker while this thread waits in `rayon::scope`; MPI runs with
    // MPI_THREAD_MULTIPLE (as for the engine's thread), and nothing captured is
    // thread-local.
    let f = AssertSend(f);
    rayon::scope(move |_| {
        let f = f;
        (f.0)()
    })
}

/// Steps a trainer on `dev` to the end, checkpointing as configured, then evaluates.
///
/// A failed step leaves its trainer undropped: dropping it would shut the engine down,
/// which waits for every rank's engine — and after a failure a peer may be dead or stuck,
/// so the error must reach the caller first. The process is expected to end after an
/// error (the shared segments' names are already gone, nothing is left behind).
fn drive<D: Device>(topo: &Topology, cfg: &TrainConfig, dev: D, engine: Engine, progress: &mut dyn FnMut(&Progress)) -> TrainResult<TrainSummary> {
    let mut t = Trainer::new(topo, cfg, dev, engine)?;
    progress(&t.progress());
    loop {
        match t.step() {
            Ok(true) => progress(&t.progress()),
            Ok(false) => return t.summary(),
            // Every rank stops after the same step: the normal teardown is safe.
            Err(e @ (TrainError::Stopped { .. } | TrainError::NonFinite { .. })) => return Err(e),
            Err(e) => {
                std::mem::forget(t);
                return Err(e);
            }
        }
    }
}
