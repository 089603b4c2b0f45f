//! The Horovod-style engine: named asynchronous collectives, negotiated by a background
//! thread, fused, optionally compressed, traced and watched for stalls.
//!
//! A program submits tensors by name as they become ready (`allreduce_async`, ...) and
//! gets a [`Handle`] to wait on. A background thread per process runs cycles
//! (`RINGREC_CYCLE_TIME` ms): ranks agree on which names *every* rank has submitted — in
//! steady state by one small bit-vector allreduce over the response cache, otherwise
//! through the coordinator on rank 0 — and run them in the same order everywhere, packing
//! small allreduces into fused ones up to `RINGREC_FUSION_THRESHOLD` bytes.
//!
//! ```no_run
//! use ringrec::dtype::ReduceOp;
//! use ringrec::engine::Tensor;
//! let rt = ringrec::init().expect("engine");
//! let g = rt.allreduce_async("grad.w", Tensor::from_vec(vec![1.0f32; 4]), ReduceOp::Average);
//! let avg = g.wait().expect("allreduce").into_vec::<f32>().unwrap();
//! assert_eq!(avg, vec![1.0; 4]);
//! ```
//!
//! Settings (environment, read on every rank; rank 0's values of the fusion threshold and
//! cycle time win): `RINGREC_FUSION_THRESHOLD` (bytes, `K`/`M`/`G` suffixes; default
//! 128M; 0 disables fusion), `RINGREC_CYCLE_TIME` (ms, default 1), `RINGREC_CACHE_CAPACITY`
//! (default 1024; 0 disables the cache), `RINGREC_COMPRESSION` (none, fp16, bf16, 1bit),
//! `RINGREC_TIMELINE` (path), `RINGREC_STALL_CHECK_TIME_SECONDS` (default 60; 0 disables),
//! `RINGREC_STALL_SHUTDOWN_TIME_SECONDS` (default 0 = never), `RINGREC_AUTOTUNE` (1 to
//! search), `RINGREC_AUTOTUNE_LOG` (CSV path), `RINGREC_ENGINE_BACKEND` (mpi, ring, shm,
//! hier; default: the best for the topology).

/// Runs `$self.$f::<T>(args)` for the element type `T` of `$dtype` (the device executor
/// and the lender of framework tensors; `half`'s `f16`/`bf16` in scope where it is used).
macro_rules! by_dtype {
    ($self:ident, $f:ident, $dtype:expr, $($arg:expr),*) => {
        match $dtype {
            DType::F32 => $self.$f::<f32>($($arg),*),
            DType::F64 => $self.$f::<f64>($($arg),*),
            DType::F16 => $self.$f::<f16>($($arg),*),
            DType::BF16 => $self.$f::<bf16>($($arg),*),
            DType::I32 => $self.$f::<i32>($($arg),*),
            DType::I64 => $self.$f::<i64>($($arg),*),
            DType::U8 => $self.$f::<u8>($($arg),*),
        }
    };
}

pub mod autotune;
pub mod cache;
pub mod compression;
pub mod controller;
pub mod coordinator;
pub mod device;
pub mod error;
pub mod fusion;
pub mod lend;
pub mod message;
pub mod timeline;
pub mod weighted;

use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use compression::Compression;
pub use error::{EngineError, EngineResult};
pub use device::{DeviceExecutor, ExecuteDevice};
pub use lend::{init_on, LendDevice};
pub use message::OpKind;
pub use weighted::WeightedHandle;
pub use crate::tensor::{DeviceTensor, Location, Tensor};

use self::autotune::{Autotuner, Params};
pub use self::controller::{MakeDevice, StatsSnapshot};
use self::controller::{Controller, LoopConfig, Msg, Stats, StopReason, Submission};
use self::message::{GroupTag, Request};
use self::timeline::Timeline;
use crate::comm::mpi_backend::MpiCollectives;
use crate::comm::{self, Backend};
use crate::config;
use crate::dtype::{DType, Element, ReduceOp};
use crate::topology::Topology;

/// The engine's settings.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Data backend (`None`: [`Backend::auto`]).
    pub backend: Option<Backend>,
    /// Fusion threshold in bytes; 0 disables fusion.
    pub fusion_threshold: usize,
    /// Background cycle time.
    pub cycle_time: Duration,
    /// Response cache entries; 0 disables the cache.
    pub cache_capacity: usize,
    /// Compression of allreduces that do not choose their own.
    pub compression: Compression,
    /// The factor lambda of 1-bit compression's L2 form (`RINGREC_ONEBIT_LAMBDA`, in
    /// `(0, 1]`; 1 keeps the norm).
    pub onebit_lambda: f32,
    /// Values per scale of 1-bit compression (`RINGREC_ONEBIT_BLOCK`; 0: one per tensor).
    pub onebit_block: usize,
    /// Chrome trace written by rank 0.
    pub timeline: Option<PathBuf>,
    /// Stall warning after this wait (`None`: no stall checks).
    pub stall_check: Option<Duration>,
    /// Stop the job after this wait (`None`: never).
    pub stall_shutdown: Option<Duration>,
    /// Search fusion threshold and cycle time during the first steps.
    pub autotune: bool,
    /// Where the autotuner logs what it tried.
    pub autotune_log: Option<PathBuf>,
    /// Seconds each autotune candidate is measured.
    pub autotune_sample: Duration,
    /// Names the engine's shared segments.
    pub tag: String,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            backend: None,
            fusion_threshold: 128 << 20,
            cycle_time: Duration::from_millis(1),
            cache_capacity: 1024,
            compression: Compression::None,
            onebit_lambda: compression::DEFAULT_LAMBDA,
            onebit_block: compression::DEFAULT_BLOCK,
            timeline: None,
            stall_check: Some(Duration::from_secs(60)),
            stall_shutdown: None,
            autotune: false,
            autotune_log: None,
            autotune_sample: Duration::from_millis(500),
            tag: "engine".into(),
        }
    }
}

fn bad(name: &str, value: &str, expected: &str) -> EngineError {
    EngineError::Config(format!("{name}={value:?} is not valid: expected {expected}"))
}

impl EngineConfig {
    /// The defaults overridden by the `RINGREC_*` environment variables.
    pub fn from_env() -> EngineResult<EngineConfig> {
        let mut c = EngineConfig::default();
        if let Some(v) = config::var("RINGREC_ENGINE_BACKEND") {
            if v != "auto" {
                c.backend = Some(Backend::parse(&v).ok_or_else(|| bad("RINGREC_ENGINE_BACKEND", &v, "auto, mpi, ring, shm or hier"))?);
            }
        }
        if let Some(v) = config::var("RINGREC_FUSION_THRESHOLD") {
            c.fusion_threshold = config::parse_bytes(&v).ok_or_else(|| bad("RINGREC_FUSION_THRESHOLD", &v, "bytes, e.g. 67108864 or 64M (0 disables fusion)"))?;
        }
        if let Some(v) = config::var("RINGREC_CYCLE_TIME") {
            let ms: f64 = v.trim().parse().ok().filter(|m: &f64| *m >= 0.0 && *m <= 10_000.0).ok_or_else(|| bad("RINGREC_CYCLE_TIME", &v, "milliseconds between 0 and 10000, e.g. 1 or 2.5"))?;
            c.cycle_time = Duration::from_secs_f64(ms / 1000.0);
        }
        if let Some(v) = config::var("RINGREC_CACHE_CAPACITY") {
            c.cache_capacity = v.trim().parse().ok().filter(|n| *n <= 1 << 20).ok_or_else(|| bad("RINGREC_CACHE_CAPACITY", &v, "a number of entries up to 1048576 (0 disables the cache)"))?;
        }
        if let Some(v) = config::var("RINGREC_COMPRESSION") {
            c.compression = Compression::parse(&v).ok_or_else(|| bad("RINGREC_COMPRESSION", &v, "none, fp16, bf16, 1bit or 1bit-l1"))?;
        }
        if let Some(v) = config::var("RINGREC_ONEBIT_BLOCK") {
            c.onebit_block = v.trim().parse::<usize>().ok().filter(|b| *b <= 1 << 30).ok_or_else(|| bad("RINGREC_ONEBIT_BLOCK", &v, "values per scale, e.g. 256 (0: one scale per tensor)"))?;
        }
        if let Some(v) = config::var("RINGREC_ONEBIT_LAMBDA") {
            c.onebit_lambda = v.trim().parse::<f32>().ok().and_then(|l| compression::check_lambda(l).ok()).ok_or_else(|| bad("RINGREC_ONEBIT_LAMBDA", &v, "a factor in (0, 1], e.g. 0.5"))?;
        }
        c.timeline = config::var("RINGREC_TIMELINE").map(PathBuf::from);
        if let Some(s) = config::seconds("RINGREC_STALL_CHECK_TIME_SECONDS").map_err(EngineError::Config)? {
            c.stall_check = s;
        }
        if let Some(s) = config::seconds("RINGREC_STALL_SHUTDOWN_TIME_SECONDS").map_err(EngineError::Config)? {
            c.stall_shutdown = s;
        }
        c.autotune = config::flag("RINGREC_AUTOTUNE").map_err(EngineError::Config)?.unwrap_or(false);
        c.autotune_log = config::var("RINGREC_AUTOTUNE_LOG").map(PathBuf::from);
        if let Some(Some(s)) = config::seconds("RINGREC_AUTOTUNE_SAMPLE_SECONDS").map_err(EngineError::Config)? {
            c.autotune_sample = s;
        }
        Ok(c)
    }
}

/// A submitted operation: wait for it, or poll it.
pub struct Handle {
    name: String,
    rx: Receiver<EngineResult<Tensor>>,
    done: Option<EngineResult<Tensor>>,
    stop: StopReason,
    /// Tells the background thread to start its next cycle now when we block.
    kick: Option<Sender<Msg>>,
}

impl Handle {
    fn failed(name: &str, e: EngineError) -> Handle {
        let (tx, rx) = mpsc::channel();
        let _ = tx.send(Err(e));
        Handle { name: name.to_string(), rx, done: None, stop: Arc::new(Mutex::new(None)), kick: None }
    }

    /// The tensor's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn gone(&self) -> EngineError {
        let why = self.stop.lock().ok().and_then(|s| s.clone()).unwrap_or_else(|| "its background thread exited".into());
        EngineError::ShutDown(why)
    }

    /// True once the result is there (then [`Handle::wait`] returns at once).
    pub fn poll(&mut self) -> bool {
        if self.done.is_none() {
            match self.rx.try_recv() {
                Ok(r) => self.done = Some(r),
                Err(mpsc::TryRecvError::Empty) => return false,
                Err(mpsc::TryRecvError::Disconnected) => self.done = Some(Err(self.gone())),
            }
        }
        true
    }

    /// Blocks until the operation finished; returns the resulting tensor. Waiting also
    /// starts the engine's next cycle at once instead of at the end of the cycle time.
    pub fn wait(mut self) -> EngineResult<Tensor> {
        if let Some(r) = self.done.take() {
            return r;
        }
        if let Ok(r) = self.rx.try_recv() {
            return r;
        }
        if let Some(k) = self.kick.take() {
            let _ = k.send(Msg::Flush);
        }
        self.rx.recv().unwrap_or_else(|_| Err(self.gone()))
    }
}

/// The engine of one process: submits tensors to the background thread.
pub struct Engine {
    tx: Mutex<Option<Sender<Msg>>>,
    thread: Option<JoinHandle<()>>,
    stop: StopReason,
    stats: Arc<Stats>,
    compression: Compression,
    backend_name: &'static str,
    /// The device executor in words, once there is one (given at the start, or attached).
    device: OnceLock<String>,
    rank: usize,
    size: usize,
}

impl Engine {
    /// Starts the engine over all ranks of `topo` for tensors in host memory (collective:
    /// every rank calls it).
    pub fn start(topo: &Topology, config: &EngineConfig) -> EngineResult<Engine> {
        Engine::start_with_device(topo, config, None)
    }

    /// Starts the engine over all ranks of `topo`; tensors in a device's memory go to
    /// `device` (every rank passes one, or none).
    pub fn start_with_device(topo: &Topology, config: &EngineConfig, device: Option<Box<dyn ExecuteDevice>>) -> EngineResult<Engine> {
        if !topo.thread_multiple && topo.size > 1 {
            return Err(EngineError::Config(
                "the MPI library did not grant MPI_THREAD_MULTIPLE, which the engine's background thread needs; use an MPI built with thread support (Open MPI and MPICH are by default)".into(),
            ));
        }
        let backend = config.backend.unwrap_or_else(|| Backend::auto(topo));
        let data = comm::build_tagged(backend, topo, &config.tag)?;
        let backend_name = data.name();
        let control = topo.world.duplicate();
        let ctl = MpiCollectives::new(topo.world.duplicate(), false);
        let params = Params { fusion_threshold: config.fusion_threshold, cycle_time: config.cycle_time };
        let timeline = match (&config.timeline, topo.rank) {
            (Some(p), 0) => Some(Timeline::create(p, 0).map_err(|e| EngineError::Config(format!("RINGREC_TIMELINE={}: {e}; give a writable path", p.display())))?),
            _ => None,
        };
        let autotuner = match (config.autotune, topo.rank) {
            (true, 0) => {
                let log = match &config.autotune_log {
                    Some(p) => Some(crate::fileio::create_private(p, false).map_err(|e| EngineError::Config(format!("RINGREC_AUTOTUNE_LOG={}: {e}; give a writable path", p.display())))?),
                    None => None,
                };
                Some(Autotuner::new(params, 2, config.autotune_sample, log))
            }
            _ => None,
        };
        let (tx, rx) = mpsc::channel();
        let stop: StopReason = Arc::new(Mutex::new(None));
        let device_name = OnceLock::new();
        if let Some(d) = &device {
            let _ = device_name.set(d.describe());
        }
        compression::check_lambda(config.onebit_lambda).map_err(EngineError::Config)?;
        let cfg = LoopConfig { onebit_lambda: config.onebit_lambda, onebit_block: config.onebit_block, params, cache_capacity: config.cache_capacity, stall_check: config.stall_check, stall_shutdown: config.stall_shutdown, timeline, autotune: config.autotune, autotuner, device, place: comm::traffic::Place::of(topo), shm_direct_max: comm::shm::direct_max(topo.config.shm_chunk_bytes) };
        let stats = Arc::new(Stats::default());
        stats.publish_params(params, config.autotune);
        let controller = Controller::new(control, ctl, data, rx, cfg, stop.clone(), stats.clone());
        let thread = std::thread::Builder::new()
            .name("ringrec-engine".into())
            .spawn(move || controller.run())
            .map_err(|e| EngineError::Config(format!("cannot start the engine thread: {e}")))?;
        Ok(Engine { tx: Mutex::new(Some(tx)), thread: Some(thread), stop, stats, compression: config.compression, backend_name, device: device_name, rank: topo.rank, size: topo.size })
    }

    /// The compression of allreduces that do not choose their own.
    pub fn compression(&self) -> Compression {
        self.compression
    }

    /// The host backend's name.
    pub fn backend_name(&self) -> &'static str {
        self.backend_name
    }

    /// The device executor, in words (`nccl on <GPU>`), when the engine has one.
    pub fn device(&self) -> Option<&str> {
        self.device.get().map(String::as_str)
    }

    /// Gives an engine started without a device executor one, `describe`d, made by `make`
    /// on the engine's thread at the first response on device tensors ([`MakeDevice`]:
    /// collective then). Device tensors are taken from now on. Refused when the engine has
    /// a device executor already.
    pub fn attach_device(&self, describe: String, make: MakeDevice) -> EngineResult<()> {
        if self.device.set(describe).is_err() {
            return Err(EngineError::Config("the engine has a device executor already".into()));
        }
        let tx = self.tx.lock().ok().and_then(|g| g.clone());
        match tx {
            Some(tx) if tx.send(Msg::Device(make)).is_ok() => Ok(()),
            _ => Err(EngineError::ShutDown(self.stopped().unwrap_or_else(|| "the engine stopped".into()))),
        }
    }

    fn submit(&self, req: Request, tensor: Tensor) -> Handle {
        let name = req.name.clone();
        if name.is_empty() {
            return Handle::failed("", EngineError::Invalid { name, reason: "tensor names may not be empty".into() });
        }
        if req.kind == OpKind::Allreduce && req.dtype == DType::U8 {
            return Handle::failed(&name, EngineError::Invalid { name: name.clone(), reason: "uint8 tensors cannot be reduced; use int32 or float".into() });
        }
        if req.location == Location::Device && self.device.get().is_none() {
            let reason = "a device tensor was submitted to an engine started without a device executor; start it with Engine::start_with_device".to_string();
            return Handle::failed(&name, EngineError::Invalid { name: name.clone(), reason });
        }
        let (reply, rx) = mpsc::channel();
        let msg = Msg::Submit(Box::new(Submission { req, tensor, reply, submitted: Instant::now() }));
        let tx = self.tx.lock().ok().and_then(|g| g.clone());
        let sent = tx.as_ref().is_some_and(|tx| tx.send(msg).is_ok());
        let h = Handle { name, rx, done: None, stop: self.stop.clone(), kick: tx };
        if !sent {
            let e = h.gone();
            return Handle::failed(&h.name, e);
        }
        h
    }

    fn request(&self, name: &str, kind: OpKind, t: &Tensor, op: ReduceOp, root: usize, compression: Compression) -> Request {
        Request {
            name: name.to_string(),
            kind,
            dtype: t.dtype(),
            location: t.location(),
            shape: t.shape().to_vec(),
            op,
            root: root as u32,
            compression: compression.effective(t.dtype(), op),
            group: None,
            age_us: 0,
        }
    }

    /// Allreduces `tensor` over all ranks under the engine's compression.
    pub fn allreduce_async(&self, name: &str, tensor: Tensor, op: ReduceOp) -> Handle {
        self.allreduce_async_with(name, tensor, op, self.compression)
    }

    /// Allreduces `tensor` with the given compression (applies to float32 sum/average).
    pub fn allreduce_async_with(&self, name: &str, tensor: Tensor, op: ReduceOp, compression: Compression) -> Handle {
        let req = self.request(name, OpKind::Allreduce, &tensor, op, 0, compression);
        self.submit(req, tensor)
    }

    /// Allreduces several tensors that are executed together, in the same cycle.
    pub fn grouped_allreduce_async(&self, tensors: Vec<(String, Tensor)>, op: ReduceOp) -> Vec<Handle> {
        let id = format!("{}+{}", tensors.first().map_or("", |t| t.0.as_str()), tensors.len());
        let size = tensors.len() as u32;
        tensors
            .into_iter()
            .map(|(name, t)| {
                let mut req = self.request(&name, OpKind::Allreduce, &t, op, 0, self.compression);
                req.group = Some(GroupTag { id: id.clone(), size });
                self.submit(req, t)
            })
            .collect()
    }

    /// Concatenates every rank's `tensor` along the first dimension (which may differ
    /// between ranks), in rank order.
    pub fn allgather_async(&self, name: &str, tensor: Tensor) -> Handle {
        let req = self.request(name, OpKind::Allgather, &tensor, ReduceOp::Sum, 0, Compression::None);
        self.submit(req, tensor)
    }

    /// Replaces `tensor` on every rank with rank `root`'s.
    pub fn broadcast_async(&self, name: &str, tensor: Tensor, root: usize) -> Handle {
        if root >= self.size {
            return Handle::failed(name, EngineError::Invalid { name: name.into(), reason: format!("root {root} is not a rank of a world of {}", self.size) });
        }
        let req = self.request(name, OpKind::Broadcast, &tensor, ReduceOp::Sum, root, Compression::None);
        self.submit(req, tensor)
    }

    /// Blocking allreduce.
    pub fn allreduce(&self, name: &str, tensor: Tensor, op: ReduceOp) -> EngineResult<Tensor> {
        self.allreduce_async(name, tensor, op).wait()
    }

    /// Copies rank `root`'s parameters into every rank's (all submitted at once, so they fuse
    /// into few transfers).
    pub fn broadcast_parameters<T: Element>(&self, params: &mut [(&str, &mut [T])], root: usize) -> EngineResult<()> {
        let handles: Vec<Handle> = params.iter().map(|(name, p)| self.broadcast_async(name, Tensor::from_slice(p), root)).collect();
        Self::wait_into(handles, params)
    }

    /// Averages each named gradient over all ranks, in place.
    pub fn average_gradients<T: Element>(&self, grads: &mut [(&str, &mut [T])]) -> EngineResult<()> {
        let handles: Vec<Handle> = grads.iter().map(|(name, g)| self.allreduce_async(name, Tensor::from_slice(g), ReduceOp::Average)).collect();
        Self::wait_into(handles, grads)
    }

    fn wait_into<T: Element>(handles: Vec<Handle>, dst: &mut [(&str, &mut [T])]) -> EngineResult<()> {
        let mut first_err = None;
        for (h, (_, d)) in handles.into_iter().zip(dst.iter_mut()) {
            match h.wait() {
                Ok(t) => d.copy_from_slice(t.as_slice::<T>().unwrap_or(&[])),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Stops this rank's engine; every rank's stops in the same cycle (pending operations
    /// fail with [`EngineError::ShutDown`]). Also done on drop.
    pub fn shutdown(&mut self) {
        if let Ok(mut g) = self.tx.lock() {
            if let Some(tx) = g.take() {
                let _ = tx.send(Msg::Shutdown);
            }
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// The background thread's counters.
    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    /// Why the engine stopped, once it has.
    pub fn stopped(&self) -> Option<String> {
        self.stop.lock().ok().and_then(|s| s.clone())
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// What [`init`] returns: the process topology and its engine.
pub struct Runtime {
    /// Declared first: stopped (and its communicators freed) before the topology goes.
    engine: Engine,
    /// Lends device tensors to the engine's device executor ([`lend`]), when it has one.
    device: lend::DeviceSide,
    topo: Topology,
}

impl Runtime {
    /// Starts the engine over `topo` with `config`.
    pub fn new(topo: Topology, config: &EngineConfig) -> EngineResult<Runtime> {
        Ok(Runtime { engine: Engine::start(&topo, config)?, device: lend::DeviceSide::default(), topo })
    }
    /// The process topology.
    pub fn topology(&self) -> &Topology {
        &self.topo
    }
    /// Rank in the world.
    pub fn rank(&self) -> usize {
        self.topo.rank
    }
    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.topo.size
    }
    /// Rank on this host.
    pub fn local_rank(&self) -> usize {
        self.topo.local_rank
    }
    /// Ranks on this host.
    pub fn local_size(&self) -> usize {
        self.topo.local_size
    }
    /// Rank among the ranks with this local_rank.
    pub fn cross_rank(&self) -> usize {
        self.topo.cross_rank
    }
    /// Number of hosts (ranks with this local_rank).
    pub fn cross_size(&self) -> usize {
        self.topo.cross_size
    }
}

impl std::ops::Deref for Runtime {
    type Target = Engine;
    fn deref(&self) -> &Engine {
        &self.engine
    }
}

impl std::ops::DerefMut for Runtime {
    fn deref_mut(&mut self) -> &mut Engine {
        &mut self.engine
    }
}

/// Initialises MPI, the topology and the engine with settings from the environment.
pub fn init() -> EngineResult<Runtime> {
    let config = EngineConfig::from_env()?;
    let topo = Topology::init()?;
    Runtime::new(topo, &config)
}
