//! `ringrec._ringrec.HostTable`: the Rust half of `ringrec.torch.HostEmbedding` — this
//! host's shared embedding table and the sparse exchanger, exactly as `ringrec train` runs
//! them ([`EmbeddingStage`]: one copy per host, growth, admission, eviction, storage dtype,
//! SGD or row-wise Adagrad on the leader, `--sparse-normalize`).
//!
//! The Python half turns tensors into addresses and runs torch's autograd; what happens to
//! keys and rows is done here: the batch's keys deduplicated ([`Deduper`]), their rows
//! looked up, and a step's gradients exchanged, normalised and applied by the host leader,
//! then the host barrier. Every call that touches other ranks is collective over the world.
//!
//! A process holds any number of tables at once (a CTR model's table per feature), each
//! under its name ([`TableName`]): its own shared-memory files, segments and exchangers.

use std::path::Path;
use std::sync::{Arc, Mutex, Weak};

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use ringrec::embedding::{EmbeddingTable, TableSource};
use ringrec::sparse::Deduper;
use ringrec::train::embedding::{board_bound, default_step_keys, share_among, EmbeddingStage, Sharer, TableName};
use ringrec::train::{NanPolicy, TrainConfig, TrainError};

use crate::{with_runtime, RingrecError};

/// The `ringrec train` settings a `HostEmbedding` takes as keyword arguments (the
/// [`TrainConfig`] field of each flag, `--table-dtype` as `table_dtype`).
pub const TABLE_SETTINGS: &[&str] = &[
    "table_capacity",
    "sparse_lr",
    "sparse_optimizer",
    "seed",
    "sparse_exchange",
    "sparse_normalize",
    "sparse_compression",
    "onebit_lambda",
    "table_dtype",
    "table_init_scale",
    "table_max_bytes",
    "admit_after",
    "admit_sketch_mib",
    "expire_after_steps",
    "evict",
    "nan_policy",
];

/// The stage and its scratch, movable across the GIL's release.
struct Stage {
    stage: EmbeddingStage,
    deduper: Deduper,
    policy: NanPolicy,
    steps: u64,
    /// `table_max_bytes=`, when given, and how (for errors).
    own_max: Option<(u64, String)>,
    /// The most bytes its host boards take ([`board_bound`]).
    boards: u64,
}

// SAFETY: the stage's MPI communicators are its own duplicates, named the same from every
// thread; MPI runs at MPI_THREAD_MULTIPLE (the engine refuses a multi-rank world without it)
// and the `Mutex` around each stage serialises every use.
unsafe impl Send for Stage {}

type Shared = Arc<Mutex<Option<Stage>>>;

/// A table as the registry of open tables holds it: closed tables drop out.
type Held = Weak<Mutex<Option<Stage>>>;

/// Every table of this process by name, closed by `shutdown()` before MPI is finalised.
static OPEN: Mutex<Vec<(String, Held)>> = Mutex::new(Vec::new());

/// Whether the table behind `w` is still open.
fn alive(w: &Held) -> bool {
    w.upgrade().is_some_and(|s| s.lock().unwrap_or_else(|e| e.into_inner()).is_some())
}

/// Whether the table `name` is open in this process.
fn is_open(name: &str) -> bool {
    OPEN.lock().unwrap_or_else(|e| e.into_inner()).iter().any(|(n, w)| n == name && alive(w))
}

/// The largest sizes of the tables open in this process and of `new` (collective over the
/// world, as opening is): [`share_among`] them, so that together they fit the shared-memory
/// directory's free space (each `HostEmbedding` without `table_max_bytes` gets a share by
/// its file's size, those with one keep theirs); refused when the sizes given do not fit.
/// Each open shares again among the tables open then: an earlier table's size may go down
/// (never below its file: it then evicts instead of growing).
fn share_open(topo: &ringrec::topology::Topology, new: &mut Stage) -> PyResult<()> {
    let open: Vec<Shared> = OPEN.lock().unwrap_or_else(|e| e.into_inner()).iter().filter_map(|(_, w)| w.upgrade()).collect();
    let mut guards: Vec<_> = open.iter().map(|s| s.lock().unwrap_or_else(|e| e.into_inner())).collect();
    let mut tables: Vec<Sharer<'_>> = guards.iter_mut().filter_map(|g| g.as_mut()).map(|s| Sharer { stage: &mut s.stage, own: s.own_max.clone(), boards: s.boards }).collect();
    tables.push(Sharer { stage: &mut new.stage, own: new.own_max.clone(), boards: new.boards });
    share_among(topo, tables, None, "HostEmbedding").map_err(train_err)
}

/// Closes every table still open (before the runtime stops).
pub fn close_all() {
    let open = std::mem::take(&mut *OPEN.lock().unwrap_or_else(|e| e.into_inner()));
    for (_, w) in open {
        if let Some(s) = w.upgrade() {
            s.lock().unwrap_or_else(|e| e.into_inner()).take();
        }
    }
}

fn train_err(e: TrainError) -> PyErr {
    match e {
        TrainError::Config(m) => PyValueError::new_err(m),
        e => RingrecError::new_err(e.to_string()),
    }
}

/// `n` values of `T` at `address`, lent by the Python layer for the call.
///
/// # Safety
/// `address` must be the data of a live, contiguous tensor of at least `n` `T`s, aligned
/// for `T` and not touched by anything else during the call.
unsafe fn lent<'a, T>(address: usize, n: usize) -> &'a mut [T] {
    if n == 0 {
        return &mut [];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts_mut(address as *mut T, n) }
}

/// A step's gradient bytes from which [`HostTable::release_after_step`] gives memory back.
const TRIM_FROM_BYTES: usize = 1 << 20;

/// Gives the heap's free pages back to the system. A step's temporaries (torch's rows and
/// gradients, the exchange's) are freed again, but glibc keeps what it frees in its heap,
/// resident: with 16384 keys a step on each of 4 ranks that was 36 MB on top of the 160 MB
/// host table (docs/BENCHMARKS.md). Elsewhere than glibc a no-op.
fn release_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> std::ffi::c_int;
        }
        // SAFETY: glibc's malloc_trim only returns free memory of the heap to the system.
        unsafe {
            malloc_trim(0);
        }
    }
}

/// The shape of a saved table file: (dim, capacity, dtype, optimizer, seed, init scale),
/// what `HostEmbedding.load` opens it with.
#[pyfunction]
pub fn saved_table_shape(path: &str) -> PyResult<(u32, u64, String, String, u64, f32)> {
    let t = EmbeddingTable::open_readonly(Path::new(path)).map_err(|e| PyValueError::new_err(e.to_string()))?;
    let h = t.header();
    Ok((h.dim, h.capacity, h.dtype.to_string(), h.optimizer.to_string(), h.seed, h.init_scale))
}

/// This rank's handle on its host's shared table and the sparse exchanger.
#[pyclass(module = "ringrec._ringrec", frozen)]
pub struct HostTable {
    inner: Shared,
    dim: usize,
}

impl HostTable {
    fn run<T: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut Stage) -> PyResult<T> + Send) -> PyResult<T> {
        let inner = self.inner.clone();
        py.detach(move || {
            let mut g = inner.lock().unwrap_or_else(|e| e.into_inner());
            match g.as_mut() {
                Some(s) => f(s),
                None => Err(PyValueError::new_err("the HostEmbedding's table is closed (ringrec.shutdown() closes every table)")),
            }
        })
    }
}

#[pymethods]
impl HostTable {
    /// Opens this host's table `name` (collective over the world; every rank opens the same
    /// names with the same dims in the same order): `settings` are (field, value) pairs of
    /// [`TABLE_SETTINGS`] over `ringrec train`'s defaults, `dim` the row width; `saved` a
    /// table saved by [`HostTable::save`] to start from (its shape must match). A name
    /// open in this process already is a `ValueError`.
    #[new]
    #[pyo3(signature = (dim, settings, name, saved=None))]
    fn new(py: Python<'_>, dim: usize, settings: Vec<(String, String)>, name: String, saved: Option<String>) -> PyResult<HostTable> {
        let mut cfg = TrainConfig::new(std::path::PathBuf::from("."));
        if dim == 0 {
            return Err(PyValueError::new_err("embedding_dim must be positive"));
        }
        cfg.dim = dim;
        for (field, value) in &settings {
            if !TABLE_SETTINGS.contains(&field.as_str()) {
                return Err(PyTypeError::new_err(format!("HostEmbedding() got an unexpected keyword argument '{field}'; it takes {}", TABLE_SETTINGS.join(", "))));
            }
            cfg.set(field, &[value.as_str()]).map_err(|e| PyValueError::new_err(format!("HostEmbedding({field}={value}): {e}")))?;
        }
        cfg.validate_table().map_err(train_err)?;
        let policy = cfg.nan_policy;
        if name.is_empty() {
            return Err(PyValueError::new_err("a HostEmbedding's name must not be empty"));
        }
        if is_open(&name) {
            return Err(PyValueError::new_err(format!("a HostEmbedding named {name:?} is already open in this process: give each table its own name, or close() the other first")));
        }
        let stage = py.detach(|| {
            with_runtime(|rt| {
                let topo = rt.topology();
                cfg.engine_config(topo).map_err(train_err)?;
                let tc = cfg.table_config();
                let source = match saved.as_deref() {
                    Some(p) => TableSource::Saved(Path::new(p), &tc),
                    None => TableSource::New(&tc),
                };
                let step_keys = default_step_keys(topo, &cfg);
                let own_max = cfg.table_max_bytes.map(|m| (m, format!("HostEmbedding {name:?} table_max_bytes={m}")));
                let boards = board_bound(topo, &cfg, step_keys);
                let stage = EmbeddingStage::open_named(topo, &cfg, source, &TableName::named(&name), step_keys).map_err(train_err)?;
                let mut stage = Stage { stage, deduper: Deduper::new(), policy, steps: 0, own_max, boards };
                share_open(topo, &mut stage)?;
                Ok::<Stage, PyErr>(stage)
            })
        })??;
        let inner: Shared = Arc::new(Mutex::new(Some(stage)));
        let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|(_, w)| alive(w));
        open.push((name, Arc::downgrade(&inner)));
        Ok(HostTable { inner, dim: cfg.row_width() })
    }

    /// Values per row.
    #[getter]
    fn dim(&self) -> usize {
        self.dim
    }

    /// (slots, live rows, largest size in bytes) of the table now.
    fn size(&self, py: Python<'_>) -> PyResult<(u64, u64, u64)> {
        self.run(py, |s| {
            let h = s.stage.table().table().header();
            Ok((h.capacity, h.live_rows, s.stage.max_bytes()))
        })
    }

    /// Sets the learning rate of the leader's update from the next step on.
    fn set_lr(&self, py: Python<'_>, lr: f32) -> PyResult<()> {
        if !(lr.is_finite() && lr >= 0.0) {
            return Err(PyValueError::new_err(format!("lr must be a finite value >= 0, got {lr}")));
        }
        self.run(py, |s| {
            s.stage.set_lr(lr);
            Ok(())
        })
    }

    /// Deduplicates the `n` int64 keys at `keys`: writes the distinct keys in key order to
    /// `unique` and each key's place among them to `places` (int64), returns their number.
    ///
    /// The addresses are those of contiguous int64 tensors of `n` values the caller holds.
    fn dedupe(&self, py: Python<'_>, keys: usize, n: usize, unique: usize, places: usize) -> PyResult<usize> {
        self.run(py, |s| {
            // SAFETY: the Python layer passes three contiguous int64 tensors of n values
            // (`HostEmbedding._dedupe`), alive and untouched for the call; int64 and u64
            // have one layout.
            let (keys, unique, places) = unsafe { (lent::<u64>(keys, n), lent::<u64>(unique, n), lent::<i64>(places, n)) };
            let u = s.deduper.index_keys(keys).map_err(|e| PyValueError::new_err(format!("HostEmbedding keys: {e}")))?;
            for (d, k) in unique.iter_mut().zip(s.deduper.sorted_keys()) {
                *d = k;
            }
            for (d, p) in places.iter_mut().zip(s.deduper.places()) {
                *d = i64::from(p);
            }
            Ok(u)
        })
    }

    /// The rows of the `n` keys at `keys` (int64) into the float32 `n` x dim at `rows`:
    /// the table's, or the deterministic initial row of a key it does not hold.
    fn lookup(&self, py: Python<'_>, keys: usize, n: usize, rows: usize) -> PyResult<()> {
        let dim = self.dim;
        self.run(py, |s| {
            // SAFETY: contiguous int64 (n) and float32 (n x dim) tensors the Python layer
            // holds for the call (`HostEmbedding._rows`).
            let (keys, out) = unsafe { (lent::<u64>(keys, n), lent::<f32>(rows, n * dim)) };
            s.stage.lookup(keys, out).map_err(train_err)
        })
    }

    /// One sparse step (collective over the world): the gradient rows (float32, `n` x dim
    /// at `grads`) of this rank's `n` distinct keys (int64 at `keys`, in key order) are
    /// exchanged, normalised (`sparse_normalize`) and applied by the host leader (the
    /// table's optimizer); then the host barrier. Returns (bytes sent, bytes received) by
    /// this rank.
    fn exchange_and_apply(&self, py: Python<'_>, keys: usize, n: usize, grads: usize) -> PyResult<(u64, u64)> {
        let dim = self.dim;
        self.run(py, |s| {
            // SAFETY: contiguous int64 (n) and float32 (n x dim) tensors the Python layer
            // holds for the call (`HostEmbedding._step`).
            let (keys, grads) = unsafe { (lent::<u64>(keys, n), lent::<f32>(grads, n * dim)) };
            s.steps += 1;
            let st = s.stage.exchange_and_apply(keys, grads, s.steps, s.policy).map_err(train_err)?;
            Ok((st.host_bytes_sent + st.cross_bytes_sent, st.host_bytes_received + st.cross_bytes_received))
        })
    }

    /// After a large sparse step (at least [`TRIM_FROM_BYTES`] of gradients, `step_bytes`),
    /// once `HostEmbedding.sparse_step` has dropped the step's tensors: the forward's dedupe
    /// buffers go (the next forward makes them again: about 70 bytes a key, beside a step's
    /// rows and gradients of 8 bytes a value), then glibc's freed heap goes back to the
    /// system, theirs and the tensors' with it. Smaller steps keep both: what they would
    /// free is little, and the next step reuses it.
    fn release_after_step(&self, py: Python<'_>, step_bytes: usize) -> PyResult<()> {
        if step_bytes < TRIM_FROM_BYTES {
            return Ok(());
        }
        self.run(py, |s| {
            s.deduper = Deduper::new();
            release_freed_heap();
            Ok(())
        })
    }

    /// Closes the table (collective over the world): this rank's mapping and segments go,
    /// then every rank waits for the others. Later calls do nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let inner = self.inner.clone();
        py.detach(move || {
            let was = inner.lock().unwrap_or_else(|e| e.into_inner()).take();
            if was.is_some() {
                drop(was);
                with_runtime(|rt| rt.topology().control().barrier("every rank closing its HostEmbedding"))?;
            }
            Ok(())
        })
    }

    /// Saves the table to `path` (collective over the world): world rank 0 writes its
    /// host's table — every host holds the same rows after a step — atomically, with
    /// the checksums every open verifies; every rank returns its outcome.
    fn save(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        let mine = self.run(py, |s| Ok(with_runtime(|rt| rt.rank() == 0)?.then(|| s.stage.table().table().save(Path::new(path)))))?;
        let ok = u8::from(!matches!(mine, Some(Err(_))));
        let all = py.detach(|| with_runtime(|rt| rt.topology().control().all_min("every rank's outcome of HostEmbedding.save", ok)))?;
        match mine {
            Some(Err(e)) => Err(RingrecError::new_err(format!("HostEmbedding.save({path}): {e}"))),
            _ if all == 0 => Err(RingrecError::new_err(format!("HostEmbedding.save({path}): rank 0 could not write it; see its error"))),
            _ => Ok(()),
        }
    }
}
