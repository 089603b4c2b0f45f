//! `ringrec._ringrec`: the Rust half of the `ringrec` Python module — ringrec's engine
//! (`ringrec::init()` → [`Runtime`]) and topology, exposed to Python under Horovod's names.
//!
//! The Python half (`python/ringrec/`) only turns numpy arrays and torch tensors into
//! (object, address, dtype, shape) and back; everything the library does is done here, by
//! the library: negotiation, fusion, the response cache, compression, the timeline, the
//! deadlines and the dead-rank checks are the engine's, exactly as in the `ringrec` binary.
//! The common blocking call (`allreduce_` of a contiguous numpy array or torch CPU tensor)
//! skips the Python half's checks: [`allreduce_simple`] does it in one call, and declines
//! what needs them.
//!
//! Memory: a submitted tensor comes as a DLPack capsule (`t.__dlpack__()`, [`dlpack`]) and
//! is lent to the engine ([`Tensor::borrowed`]), which reduces or broadcasts it in place,
//! without a copy; an allgather's new result comes back as a
//! [`Buffer`] that numpy and torch view without a copy (`__array_interface__`).

mod dlpack;
mod embedding;
mod names;

use std::sync::{Mutex, MutexGuard};

use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::intern;
use pyo3::types::{PyCapsule, PyDict, PyString};
use ringrec::dtype::{DType, ReduceOp};
use ringrec::engine::{self, Compression, EngineError, Runtime, Tensor};

create_exception!(_ringrec, RingrecError, PyRuntimeError, "The engine stopped, a collective failed, or a setting is invalid.");

/// The process's runtime: `Empty` before `init()`, `Running` after, `Done` after `shutdown()`
/// (MPI is initialised once per process, so it cannot start again).
enum State {
    Empty,
    Running(Owned),
    Done,
}

/// The runtime, movable across the GIL's release (`Python::detach`) and into the lock.
struct Owned(Box<Runtime>);

// SAFETY: the runtime's MPI handles (the topology's communicators) are values that name the
// same objects from every thread; MPI runs at MPI_THREAD_MULTIPLE (`Engine::start` refuses a
// multi-rank world without it), and `RUNTIME`'s lock serialises every use made from Python.
unsafe impl Send for Owned {}

impl std::ops::Deref for Owned {
    type Target = Runtime;
    fn deref(&self) -> &Runtime {
        &self.0
    }
}

/// The one runtime of the process, behind a lock taken only to submit or to read the
/// topology (never while waiting).
static RUNTIME: Mutex<State> = Mutex::new(State::Empty);

fn state() -> MutexGuard<'static, State> {
    RUNTIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn not_running(s: &State) -> PyErr {
    match s {
        State::Done => PyValueError::new_err("ringrec has been shut down; call ringrec.init() before shutdown(), once per process"),
        _ => PyValueError::new_err("ringrec has not been initialised; call ringrec.init() first"),
    }
}

/// Runs `f` on the runtime, or raises when there is none.
pub(crate) fn with_runtime<T>(f: impl FnOnce(&Runtime) -> T) -> PyResult<T> {
    match &*state() {
        State::Running(rt) => Ok(f(rt)),
        s => Err(not_running(s)),
    }
}

/// An engine error as the Python exception a user expects: what the caller did wrong
/// (differing shapes or dtypes across ranks, a name in flight twice, an invalid request) is a
/// `ValueError`; the engine stopping or a collective failing is a `RingrecError`.
fn py_err(e: EngineError) -> PyErr {
    match e {
        EngineError::Mismatch { .. } | EngineError::Duplicate(_) | EngineError::Invalid { .. } => PyValueError::new_err(e.to_string()),
        _ => RingrecError::new_err(e.to_string()),
    }
}

/// Starts MPI, the topology and the engine with the `RINGREC_*` settings (collective: every
/// rank calls it). A second call is a no-op, as Horovod's.
#[pyfunction]
fn init(py: Python<'_>) -> PyResult<()> {
    let mut s = state();
    match &*s {
        State::Running(_) => return Ok(()),
        State::Done => return Err(not_running(&s)),
        State::Empty => {}
    }
    let placement = dlpack::placement()?;
    let rt = py.detach(|| engine::init_on(placement).map(|rt| Owned(Box::new(rt)))).map_err(py_err)?;
    *s = State::Running(rt);
    Ok(())
}

/// Stops the engine on every rank and finalises MPI (collective). Later calls do nothing.
#[pyfunction]
fn shutdown(py: Python<'_>) {
    let rt = {
        let mut s = state();
        match std::mem::replace(&mut *s, State::Done) {
            State::Running(rt) => Some(rt),
            State::Empty => {
                *s = State::Empty;
                None
            }
            State::Done => None,
        }
    };
    if let Some(rt) = rt {
        // The host tables' communicators go before MPI does.
        embedding::close_all();
        py.detach(move || drop(rt));
    }
}

/// True between `init()` and `shutdown()`.
#[pyfunction]
fn is_initialized() -> bool {
    matches!(*state(), State::Running(_))
}

/// The topology's numbers: rank, size, local_rank, local_size, cross_rank, cross_size.
#[pyfunction]
fn topology() -> PyResult<(usize, usize, usize, usize, usize, usize)> {
    with_runtime(|rt| (rt.rank(), rt.size(), rt.local_rank(), rt.local_size(), rt.cross_rank(), rt.cross_size()))
}

/// The engine's host backend and compression, in words.
#[pyfunction]
fn describe() -> PyResult<String> {
    with_runtime(|rt| format!("{}; backend {}; compression {}", rt.topology().describe(), rt.backend_name(), rt.compression().name()))
}

/// Prints `message` on stderr and ends the whole job (`MPI_Abort`), as the binary does on
/// an error: what an uncaught Python exception on one rank does, so no rank hangs.
#[pyfunction]
fn abort(message: &str, code: i32) {
    ringrec::eprint_line(message);
    let s = state();
    match &*s {
        State::Running(rt) if rt.size() > 1 => rt.topology().abort(code),
        _ => {
            drop(s);
            std::process::exit(code)
        }
    }
}

fn op_of(code: u32) -> PyResult<ReduceOp> {
    ReduceOp::from_code(code).ok_or_else(|| PyValueError::new_err(format!("op {code} is not one of ringrec.Sum, Average, Min, Max")))
}

fn compression_of(name: Option<&str>, rt_default: Compression) -> PyResult<Compression> {
    match name {
        None => Ok(rt_default),
        Some(n) => Compression::parse(n).ok_or_else(|| PyValueError::new_err(format!("compression {n:?} is not one of none, fp16, bf16, 1bit, 1bit-l1"))),
    }
}

/// A tensor the engine handed back: numpy views its memory without a copy through
/// `__array_interface__` (bfloat16 as uint16, which torch views as bfloat16).
#[pyclass(module = "ringrec._ringrec", frozen)]
struct Buffer {
    tensor: Mutex<Tensor>,
    dtype: DType,
    shape: Vec<usize>,
}

#[pymethods]
impl Buffer {
    /// The element type's name (`float32`, `bfloat16`, ...).
    #[getter]
    fn dtype(&self) -> &'static str {
        match self.dtype {
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U8 => "uint8",
        }
    }

    /// The shape.
    #[getter]
    fn shape(&self) -> Vec<usize> {
        self.shape.clone()
    }

    /// DLPack's device of the result: (kDLCUDA, ordinal) for a device tensor, else (kDLCPU, 0).
    fn __dlpack_device__(&self) -> PyResult<(i32, i32)> {
        let on_device = self.tensor.lock().unwrap_or_else(|e| e.into_inner()).location() == engine::Location::Device;
        Ok(if on_device { (2, with_runtime(|rt| rt.lender().map_or(0, |l| l.ordinal() as i32))?) } else { (1, 0) })
    }

    /// A device result handed over as a DLPack capsule (`torch.from_dlpack(buffer)`), once:
    /// the capsule owns it from then on. Ready for any stream (`stream` needs no wait).
    #[pyo3(signature = (stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(&self, py: Python<'_>, stream: Option<Bound<'_, PyAny>>, max_version: Option<Bound<'_, PyAny>>, dl_device: Option<Bound<'_, PyAny>>, copy: Option<bool>) -> PyResult<Py<PyAny>> {
        let _ = (stream, max_version, dl_device, copy);
        let t = {
            let mut g = self.tensor.lock().unwrap_or_else(|e| e.into_inner());
            if g.location() != engine::Location::Device {
                return Err(PyValueError::new_err("a host result: view it with numpy (np.asarray), not DLPack"));
            }
            std::mem::replace(&mut *g, Tensor::zeros(self.dtype, &[0]))
        };
        if t.location() != engine::Location::Device {
            return Err(PyValueError::new_err("this result was already handed over through DLPack"));
        }
        with_runtime(|rt| match rt.lender() {
            Some(l) => dlpack::export(py, t, l),
            None => Err(RingrecError::new_err("a device result without a device executor")),
        })?
    }

    /// numpy's array interface (version 3) over the tensor's memory.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let mut t = self.tensor.lock().unwrap_or_else(|e| e.into_inner());
        let address = t.host_bytes_mut().map(|b| b.as_mut_ptr() as usize).ok_or_else(|| RingrecError::new_err("the result is in a device's memory"))?;
        let typestr = match self.dtype {
            DType::F32 => "<f4",
            DType::F64 => "<f8",
            DType::F16 => "<f2",
            DType::BF16 => "<u2",
            DType::I32 => "<i4",
            DType::I64 => "<i8",
            DType::U8 => "|u1",
        };
        let d = PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("shape", pyo3::types::PyTuple::new(py, &self.shape)?)?;
        d.set_item("typestr", typestr)?;
        d.set_item("data", (address, false))?;
        Ok(d)
    }
}

/// A submitted operation (`allreduce_async` & co.): `poll()` or `wait()` for its result.
#[pyclass(module = "ringrec._ringrec", frozen)]
struct Handle {
    inner: Mutex<Option<engine::Handle>>,
    name: String,
}

impl Handle {
    fn new(h: engine::Handle) -> Handle {
        Handle { name: h.name().to_string(), inner: Mutex::new(Some(h)) }
    }
}

#[pymethods]
impl Handle {
    /// The tensor's name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// True once the result is there (`wait()` then returns at once).
    fn poll(&self) -> bool {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.as_mut().is_none_or(|h| h.poll())
    }

    /// Waits (the GIL released) for the result; every wait is under the engine's deadlines.
    /// An in-place operation's result is the submitted memory itself.
    fn wait(&self, py: Python<'_>) -> PyResult<Buffer> {
        let h = self.inner.lock().unwrap_or_else(|e| e.into_inner()).take();
        let h = h.ok_or_else(|| PyValueError::new_err(format!("the handle of '{}' was already waited for", self.name)))?;
        let t = py.detach(|| h.wait()).map_err(py_err)?;
        Ok(Buffer { dtype: t.dtype(), shape: t.shape().to_vec(), tensor: Mutex::new(t) })
    }
}

/// Submits an allreduce, in place, of the memory of `tensor` (a `__dlpack__()` capsule);
/// `op` is a `ReduceOp` code (Sum 0, Average 1, Min 2, Max 3); `compression` None takes the
/// engine's (`RINGREC_COMPRESSION`).
#[pyfunction]
#[pyo3(signature = (name, tensor, op, compression=None))]
fn allreduce_async(name: &str, tensor: Bound<'_, PyAny>, op: u32, compression: Option<&str>) -> PyResult<Handle> {
    let op = op_of(op)?;
    let t = dlpack::lent_tensor(&tensor, name)?;
    with_runtime(|rt| {
        let c = compression_of(compression, rt.compression())?;
        Ok(Handle::new(rt.allreduce_async_with(name, t, op, c)))
    })?
}

/// A blocking allreduce, in place, of `tensor`'s memory (the arguments of
/// [`allreduce_async`]): submitted and waited for in one call with the GIL released, the
/// path a Rust caller of `Runtime::allreduce` takes (no handle objects, the engine's cycle
/// started at once).
#[pyfunction]
#[pyo3(signature = (name, tensor, op, compression=None))]
fn allreduce(py: Python<'_>, name: &str, tensor: Bound<'_, PyAny>, op: u32, compression: Option<&str>) -> PyResult<()> {
    let h = allreduce_async(name, tensor, op, compression)?;
    let h = h.inner.into_inner().unwrap_or_else(|e| e.into_inner());
    match h {
        // The lent tensor comes back and goes here, with the GIL held: its array's
        // reference is released at once, not deferred to pyo3's pool.
        Some(h) => py.detach(|| h.wait()).map(drop).map_err(py_err),
        None => Ok(()),
    }
}

/// The common call's fast path, `ringrec.allreduce_` (and `allreduce`, on its copy) of a
/// numpy array or a torch CPU tensor: one extension call that takes the tensor's DLPack
/// capsule (`tensor.__dlpack__()`, or `tensor` itself when it is a capsule: torch's
/// `to_dlpack`), makes the automatic name here ([`names`]), submits and waits with the GIL
/// released — no Python-side checks, no handle objects. Returns false, having submitted
/// nothing and counted no name, when the call needs the general path, whose checks raise the
/// errors that name the problem: a tensor not exported (numpy's read-only or byte-swapped
/// arrays), one not contiguous, a dtype ringrec does not take, a name that is not a
/// non-empty string, an op or compression that is not one of ringrec's. The engine's own
/// errors (shapes that differ across ranks, a name in flight twice, a deadline, a rank gone)
/// are raised as by [`allreduce`].
#[pyfunction]
fn allreduce_simple(py: Python<'_>, tensor: &Bound<'_, PyAny>, name: &Bound<'_, PyAny>, op: &Bound<'_, PyAny>, compression: &Bound<'_, PyAny>) -> PyResult<bool> {
    let Some(op) = op.extract::<u32>().ok().and_then(ReduceOp::from_code) else { return Ok(false) };
    let compression = if compression.is_none() {
        None
    } else {
        match compression.cast::<PyString>().ok().and_then(|c| Compression::parse(&c.to_cow().ok()?)) {
            Some(c) => Some(c),
            None => return Ok(false),
        }
    };
    let given = if name.is_none() {
        None
    } else {
        match name.cast::<PyString>().ok().and_then(|n| n.to_cow().ok()) {
            Some(n) if !n.is_empty() => Some(n),
            _ => return Ok(false),
        }
    };
    let capsule = if tensor.is_instance_of::<PyCapsule>() {
        tensor.clone()
    } else {
        match tensor.call_method0(intern!(py, "__dlpack__")) {
            Ok(c) => c,
            Err(_) => return Ok(false),
        }
    };
    let Ok(t) = dlpack::lent_tensor(&capsule, "tensor") else { return Ok(false) };
    let h = with_runtime(|rt| {
        let auto;
        let name: &str = match &given {
            Some(n) => n,
            None => {
                auto = names::next("allreduce");
                &auto
            }
        };
        rt.allreduce_async_with(name, t, op, compression.unwrap_or(rt.compression()))
    })?;
    // The lent tensor comes back and goes here, with the GIL held (its array's reference).
    py.detach(|| h.wait()).map(drop).map_err(py_err)?;
    Ok(true)
}

/// Submits tensors that are reduced together, in one cycle: `tensors` is a list of
/// (name, `__dlpack__()` capsule).
#[pyfunction]
fn grouped_allreduce_async(tensors: Vec<(String, Bound<'_, PyAny>)>, op: u32) -> PyResult<Vec<Handle>> {
    let op = op_of(op)?;
    let mut named = Vec::with_capacity(tensors.len());
    for (name, tensor) in tensors {
        let t = dlpack::lent_tensor(&tensor, &name)?;
        named.push((name, t));
    }
    with_runtime(|rt| rt.grouped_allreduce_async(named, op).into_iter().map(Handle::new).collect())
}

/// Submits an allgather of `tensor` (every rank's rows concatenated in rank order, a new
/// tensor).
#[pyfunction]
fn allgather_async(name: &str, tensor: Bound<'_, PyAny>) -> PyResult<Handle> {
    let t = dlpack::lent_tensor(&tensor, name)?;
    with_runtime(|rt| Handle::new(rt.allgather_async(name, t)))
}

/// Submits a broadcast from `root_rank`, in place in `tensor`'s memory.
#[pyfunction]
fn broadcast_async(name: &str, tensor: Bound<'_, PyAny>, root_rank: usize) -> PyResult<Handle> {
    let t = dlpack::lent_tensor(&tensor, name)?;
    with_runtime(|rt| Handle::new(rt.broadcast_async(name, t, root_rank)))
}

/// Seconds per blocking allreduce of `count` float32 (`iters` calls after 3 warm-up ones)
/// made from Rust through this process's engine: the reference of
/// scripts/bench/python_allreduce.py (what a Rust program calling `Runtime::allreduce` pays,
/// measured in the same job). Each call sums a fresh copy of the input, as `ringrec.allreduce`
/// does from Python; `in_place`: each call averages one buffer moved in and back out
/// (`Tensor::from_vec`, `into_vec`: no copy), as `ringrec.allreduce_(x, op=Average)` does.
#[pyfunction]
#[pyo3(signature = (name, count, iters, in_place=false))]
fn bench_allreduce(py: Python<'_>, name: &str, count: usize, iters: usize, in_place: bool) -> PyResult<f64> {
    let x = vec![1.0f32; count];
    py.detach(|| {
        with_runtime(|rt| {
            let mut per_call = 0.0;
            let mut buf = x.clone();
            for (i, n) in [3, iters.max(1)].into_iter().enumerate() {
                let t = std::time::Instant::now();
                for _ in 0..n {
                    if in_place {
                        let out = rt.allreduce(name, Tensor::from_vec(std::mem::take(&mut buf)), ReduceOp::Average).map_err(py_err)?;
                        buf = out.into_vec().map_err(|_| RingrecError::new_err("the engine handed back another tensor"))?;
                    } else {
                        rt.allreduce(name, Tensor::from_slice(&x), ReduceOp::Sum).map_err(py_err)?;
                    }
                }
                if i == 1 {
                    per_call = t.elapsed().as_secs_f64() / n as f64;
                }
            }
            Ok(per_call)
        })?
    })
}

/// The module.
#[pymodule]
fn _ringrec(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("RingrecError", m.py().get_type::<RingrecError>())?;
    m.add_class::<Handle>()?;
    m.add_class::<Buffer>()?;
    m.add_class::<embedding::HostTable>()?;
    m.add_function(wrap_pyfunction!(embedding::saved_table_shape, m)?)?;
    m.add_function(wrap_pyfunction!(init, m)?)?;
    m.add_function(wrap_pyfunction!(shutdown, m)?)?;
    m.add_function(wrap_pyfunction!(is_initialized, m)?)?;
    m.add_function(wrap_pyfunction!(topology, m)?)?;
    m.add_function(wrap_pyfunction!(describe, m)?)?;
    m.add_function(wrap_pyfunction!(abort, m)?)?;
    m.add_function(wrap_pyfunction!(allreduce_async, m)?)?;
    m.add_function(wrap_pyfunction!(allreduce, m)?)?;
    m.add_function(wrap_pyfunction!(allreduce_simple, m)?)?;
    m.add_function(wrap_pyfunction!(names::auto_name, m)?)?;
    m.add_function(wrap_pyfunction!(grouped_allreduce_async, m)?)?;
    m.add_function(wrap_pyfunction!(allgather_async, m)?)?;
    m.add_function(wrap_pyfunction!(broadcast_async, m)?)?;
    m.add_function(wrap_pyfunction!(bench_allreduce, m)?)?;
    m.add_function(wrap_pyfunction!(dlpack::device_stream, m)?)?;
    m.add_function(wrap_pyfunction!(dlpack::device, m)?)?;
    Ok(())
}
