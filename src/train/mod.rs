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
//! With `--pipeline` (on by default for a device that queues its work) step 1 of the next
//! step runs on a second thread during steps 2-5 ([`prefetch`]); the next step's lookup
//! (2) stays after this step's table update (4), so the results are the same bits.
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
//! `--model` and `--init-from` name), [`warm`] (`train --init-from`), [`scorer`] (a model
//! loaded for `ringrec serve-model`, scoring through `predict`'s step).

pub mod batch;
pub mod bundle;
pub mod checkpoint;
pub mod checkpointing;
pub mod config;
pub mod data;
pub mod describe;
pub mod embedding;
pub mod error;
pub mod fault;
pub mod gpu_cache;
pub mod metrics;
pub mod phases;
pub mod predict;
pub mod prefetch;
pub mod report;
pub mod scorer;
pub mod source;
pub mod summary;
pub mod sync;
pub mod table_caches;
pub mod table_summary;
pub mod tables;
pub mod traffic;
pub mod trainer;
pub mod warm;
pub mod weights;


use crate::comm::device::{Alone, HostCollectives};
use crate::comm::nccl::NcclComm;
use crate::comm;
use crate::device::{CpuDevice, CudaDevice, Device, HostKernels, HostOptions, Placement};
use crate::engine::{DeviceExecutor, Engine, ExecuteDevice};
use crate::topology::Topology;

pub use config::{NanPolicy, TrainConfig};
pub use error::{TrainError, TrainResult};
pub use summary::{RankTraffic, StopTarget, TrainSummary};
pub use gpu_cache::GpuCacheMode;
pub use sync::SyncScope;
pub use table_summary::TableSummary;

pub use metrics::Evaluation;
pub use trainer::{Progress, Trainer};


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
            let dev = at_precision(topo, cfg, dev)?;
            let coll = HostCollectives::new(comm::build_tagged(cfg.backend(topo), topo, "device")?);
            let exec = DeviceExecutor::new(dev.fork()?, coll);
            drive(topo, cfg, dev, Engine::start_with_device(topo, &engine, Some(Box::new(exec)))?, progress)
        }
        Placement::Cuda(_) => {
            let dev = gpu.ok_or_else(|| TrainError::Config("internal: the GPU placement has no device".into()))?;
            let dev = at_precision(topo, cfg, dev)?;
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
            let dev = at_precision(topo, cfg, CpuDevice::new(threads))?;
            let engine = Engine::start(topo, &engine)?;
            on_pool(|| drive(topo, cfg, dev, engine, progress))
        }
    }
}

/// `dev` with its GEMMs at `--dense-precision`, agreed by every rank (a rank whose device
/// cannot stops them all at start, saying why).
fn at_precision<D: Device>(topo: &Topology, cfg: &TrainConfig, mut dev: D) -> TrainResult<D> {
    topo.agree(dev.set_gemm_precision(cfg.dense_precision).map_err(|e| format!("rank {}: {e}", topo.rank)))?;
    Ok(dev)
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
    /// The caller's closure, run by one pool worker while the caller waits for it.
    struct WhileCallerWaits<F>(F);
    // SAFETY: the closure's captures (the topology's MPI communicators, the engine's handle)
    // are used by one thread at a time: the pool worker while this thread waits in
    // `rayon::scope`, as in a plain call; MPI runs with MPI_THREAD_MULTIPLE (as for the
    // engine's thread), and nothing captured is thread-local. The type is local to this
    // function: nothing else can send a value with it.
    unsafe impl<F> Send for WhileCallerWaits<F> {}
    let f = WhileCallerWaits(f);
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
