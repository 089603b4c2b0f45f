//! DLPack: a tensor handed over by `t.__dlpack__()` (numpy arrays, torch tensors) as a
//! tensor the engine reduces where it is, without a copy.
//!
//! The capsule (named `dltensor`) holds a `DLManagedTensor`: the data pointer, device,
//! dtype, shape and strides, and the deleter that releases the producer's tensor. Taking it
//! renames the capsule `used_dltensor` (the protocol's rule: the consumer now owns it) and
//! the deleter runs when the engine's tensor is dropped ([`Managed`]).
//!
//! CUDA tensors (device type kDLCUDA) go to the engine's device executor
//! (`ringrec::engine::LendDevice`: NCCL on the rank's GPU; with `RINGREC_PY_DEVICE=host`, a
//! test hook, the host-kernels device, whose "device memory" is host memory), handed over
//! with the executor's stream ([`device_stream`]); a new result on the device (an
//! allgather's) goes back to the framework as a capsule ([`export`]).

use std::ffi::{c_void, CStr};

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use ringrec::dtype::DType;
use ringrec::device::Placement;
use ringrec::engine::{LendDevice, Tensor};

/// `DLDevice`.
#[repr(C)]
#[derive(Clone, Copy)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

/// `DLDataType`: type code (0 int, 1 uint, 2 float, 4 bfloat), bits, lanes.
#[repr(C)]
#[derive(Clone, Copy)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

/// `DLTensor`.
#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

/// `DLManagedTensor` (the unversioned form every producer gives by default).
#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// `kDLCPU`.
const DEVICE_CPU: i32 = 1;
/// `kDLCUDA`.
const DEVICE_CUDA: i32 = 2;
/// `kDLCUDAHost`: pinned host memory, addressable by the CPU.
const DEVICE_CUDA_HOST: i32 = 3;

const CAPSULE: &CStr = c"dltensor";
const USED: &CStr = c"used_dltensor";

/// The producer's tensor, owned by the engine's tensor: its deleter runs on drop.
struct Managed(*mut DlManagedTensor);

// SAFETY: DLPack's deleter may be called from any thread (numpy's takes the GIL itself,
// torch's frees a reference-counted tensor); the pointer is used by nothing else.
unsafe impl Send for Managed {}

impl Drop for Managed {
    fn drop(&mut self) {
        // SAFETY: the pointer came from a `dltensor` capsule this value took over (renamed
        // `used_dltensor`), so the deleter runs exactly once, here.
        unsafe {
            if let Some(d) = (*self.0).deleter {
                d(self.0);
            }
        }
    }
}

fn dtype_of(t: &DlDataType) -> Option<DType> {
    if t.lanes != 1 {
        return None;
    }
    Some(match (t.code, t.bits) {
        (2, 32) => DType::F32,
        (2, 64) => DType::F64,
        (2, 16) => DType::F16,
        (4, 16) => DType::BF16,
        (0, 32) => DType::I32,
        (0, 64) => DType::I64,
        (1, 8) => DType::U8,
        _ => return None,
    })
}

/// The tensor of a `__dlpack__()` capsule (`what` names it in errors), lent to the engine
/// without a copy: host memory (CPU or CUDA-pinned), contiguous, of a dtype ringrec takes.
/// A CUDA tensor is refused with a `TypeError` that says why.
pub fn lent_tensor(capsule: &Bound<'_, PyAny>, what: &str) -> PyResult<Tensor> {
    let obj = capsule.as_ptr();
    // SAFETY: `obj` is a live object (borrowed for the call); PyCapsule_IsValid accepts any
    // object and only reads it.
    if unsafe { pyo3::ffi::PyCapsule_IsValid(obj, CAPSULE.as_ptr()) } != 1 {
        return Err(PyTypeError::new_err(format!("{what}: not a DLPack capsule named 'dltensor' (an unused t.__dlpack__())")));
    }
    // SAFETY: a valid capsule of that name; its pointer is the producer's DLManagedTensor.
    let m = unsafe { pyo3::ffi::PyCapsule_GetPointer(obj, CAPSULE.as_ptr()) }.cast::<DlManagedTensor>();
    if m.is_null() {
        return Err(PyErr::take(capsule.py()).unwrap_or_else(|| PyValueError::new_err(format!("{what}: an empty DLPack capsule"))));
    }
    // SAFETY: renaming a valid capsule; from here on its deleter (if any) leaves the tensor
    // to us, and `Managed` releases it on every path below.
    if unsafe { pyo3::ffi::PyCapsule_SetName(obj, USED.as_ptr()) } != 0 {
        return Err(PyErr::fetch(capsule.py()));
    }
    let managed = Managed(m);
    // SAFETY: the producer's DLTensor lives until its deleter runs (`managed`'s drop).
    let t = unsafe { &(*m).dl_tensor };
    match t.device.device_type {
        DEVICE_CPU | DEVICE_CUDA_HOST | DEVICE_CUDA => {}
        d => return Err(PyTypeError::new_err(format!("{what} is on DLPack device type {d}: ringrec takes host memory (CPU) tensors"))),
    }
    let dt = dtype_of(&t.dtype).ok_or_else(|| {
        PyTypeError::new_err(format!("{what} has DLPack dtype (code {}, {} bits, {} lanes): ringrec takes float32, float64, float16, bfloat16, int32, int64 and uint8", t.dtype.code, t.dtype.bits, t.dtype.lanes))
    })?;
    let ndim = usize::try_from(t.ndim).map_err(|_| PyValueError::new_err(format!("{what}: a negative ndim {}", t.ndim)))?;
    let dims: &[i64] = if ndim == 0 || t.shape.is_null() {
        &[]
    } else {
        // SAFETY: DLPack's shape holds ndim values while the tensor lives.
        unsafe { std::slice::from_raw_parts(t.shape, ndim) }
    };
    let shape: Vec<usize> = dims.iter().map(|&d| usize::try_from(d)).collect::<Result<_, _>>().map_err(|_| PyValueError::new_err(format!("{what}: a negative dimension in {dims:?}")))?;
    // An empty tensor's strides say nothing (numpy gives 0s): it has no elements to lay out.
    if !t.strides.is_null() && ndim > 0 && !dims.contains(&0) {
        // SAFETY: as the shape, when not null.
        let strides = unsafe { std::slice::from_raw_parts(t.strides, ndim) };
        let mut want = 1i64;
        for (i, (&d, &s)) in dims.iter().zip(strides).enumerate().rev() {
            if d != 1 && s != want {
                return Err(PyValueError::new_err(format!("{what} is not contiguous (strides {strides:?}, dimension {i}); make it contiguous first")));
            }
            want = want.saturating_mul(d.max(1));
        }
    }
    let address = (t.data as usize).wrapping_add(t.byte_offset as usize);
    if t.device.device_type == DEVICE_CUDA {
        return lent_device_tensor(managed, address, t.device.device_id, dt, &shape, what);
    }
    let n: usize = shape.iter().product();
    let nbytes = n * dt.size();
    if nbytes == 0 {
        return Ok(Tensor::zeros(dt, &shape));
    }
    // SAFETY: the producer's tensor holds `nbytes` contiguous bytes at `address` (checked
    // above: host memory, compact strides); `managed` keeps them alive until the engine's
    // tensor is dropped, and the caller does not touch them until the operation completes
    // (Horovod's contract for a tensor in flight).
    unsafe { Tensor::borrowed(address as *mut u8, nbytes, dt, &shape, managed) }.ok_or_else(|| PyValueError::new_err(format!("{what}: its data at {address:#x} is null or not aligned for {dt}")))
}

/// A CUDA tensor (`managed`, its data at `address` on GPU `device`) lent to the engine's
/// device executor without a copy ([`ringrec::device::LentBuf`]): the producer made the
/// executor's stream wait for its work (`__dlpack__(stream=...)`, [`device_stream`]);
/// refused with the reason when this rank has no device for them. The first device tensor
/// makes the device side ([`ringrec::engine::Runtime::lend_device`]); one of no elements
/// may have a null data pointer.
fn lent_device_tensor(managed: Managed, address: usize, device: i32, dt: DType, shape: &[usize], what: &str) -> PyResult<Tensor> {
    let ordinal = usize::try_from(device).map_err(|_| PyValueError::new_err(format!("{what}: a negative DLPack device id {device}")))?;
    crate::with_runtime(|rt| {
        let lender = rt.lend_device().map_err(|why| cuda_refused(what, device, &why))?;
        // SAFETY: the producer's tensor holds its elements, contiguous (checked by the
        // caller), in the memory of device `ordinal` (the lender checks the ordinal and, on a
        // GPU, asks the driver; the host-kernels test hook takes host memory by contract);
        // `managed` keeps them alive until the engine's tensor is dropped, and the caller does
        // not touch them until the operation completes (Horovod's contract).
        unsafe { lender.lend(address, dt, shape, ordinal, Box::new(managed)) }.map_err(|e| PyValueError::new_err(format!("{what}: {e}")))
    })?
}

/// Why a CUDA tensor is refused: this rank has no device for it (`why`, the library's).
fn cuda_refused(what: &str, device: i32, why: &str) -> PyErr {
    let what_to_do = if cfg!(feature = "cuda") {
        "run on a machine with a GPU (RINGREC_PY_DEVICE=auto or cuda), or copy it to the CPU (t.cpu())"
    } else {
        "this build of ringrec takes CPU tensors only; build the extension with the cuda feature (MATURIN_PEP517_ARGS=\"--features cuda\" pip install ./python) for CUDA tensors, or copy it to the CPU (t.cpu())"
    };
    PyTypeError::new_err(format!("{what} is on cuda:{device}: {why}; {what_to_do}"))
}

/// The stream to pass as `t.__dlpack__(stream=...)` for a CUDA tensor: the device
/// executor's (NCCL's) stream, which the producer makes wait for its pending work on the
/// tensor; `None` without a GPU executor (the host-kernels test hook has no CUDA stream).
/// Asked for a CUDA tensor, it makes this rank's device side the first time (the lender
/// then refuses the tensor with the reason when there is none).
#[pyfunction]
pub fn device_stream() -> PyResult<Option<usize>> {
    crate::with_runtime(|rt| rt.lend_device().ok().and_then(|l| l.stream()))
}

/// The device executor's device in words: `None` until the first device tensor made it,
/// or when there is none (CUDA tensors are refused).
#[pyfunction]
pub fn device() -> PyResult<Option<String>> {
    crate::with_runtime(|rt| rt.lender().map(|l| format!("{} ({}, device {})", l.describe(), l.kind(), l.ordinal())))
}

/// Where the Python module's device tensors go: `RINGREC_PY_DEVICE` (`auto`, `cuda`, `cpu`,
/// and the test hook `host`: the host-kernels device, which takes DLPack capsules of device
/// type kDLCUDA over host memory).
pub fn placement() -> PyResult<Placement> {
    let v = ringrec::config::var("RINGREC_PY_DEVICE").unwrap_or_else(|| "auto".into());
    match Placement::parse(&v) {
        Some(Placement::Cuda(_)) => Ok(Placement::Cuda(None)),
        Some(p) => Ok(p),
        None => Err(PyValueError::new_err(format!("RINGREC_PY_DEVICE={v}: expected auto, cuda, cpu or host (a test hook)"))),
    }
}

/// A tensor the engine made on its device (an allgather's result), handed to a framework
/// as a DLPack capsule (`dltensor`, device type kDLCUDA): the capsule owns the tensor, and
/// its deleter (or the capsule's destructor, when no one took it) frees it. The result is
/// ready for any stream (the executor synchronized before answering), so the consumer's
/// `stream` needs no wait.
pub fn export(py: Python<'_>, mut tensor: Tensor, lender: &dyn LendDevice) -> PyResult<Py<PyAny>> {
    let address = lender.address(&mut tensor).ok_or_else(|| PyValueError::new_err("the result is not in the device executor's memory"))?;
    let dtype = match tensor.dtype() {
        DType::F32 => DlDataType { code: 2, bits: 32, lanes: 1 },
        DType::F64 => DlDataType { code: 2, bits: 64, lanes: 1 },
        DType::F16 => DlDataType { code: 2, bits: 16, lanes: 1 },
        DType::BF16 => DlDataType { code: 4, bits: 16, lanes: 1 },
        DType::I32 => DlDataType { code: 0, bits: 32, lanes: 1 },
        DType::I64 => DlDataType { code: 0, bits: 64, lanes: 1 },
        DType::U8 => DlDataType { code: 1, bits: 8, lanes: 1 },
    };
    let mut held = Box::new(Exported { shape: tensor.shape().iter().map(|&d| d as i64).collect(), _tensor: tensor });
    let device = DlDevice { device_type: DEVICE_CUDA, device_id: lender.ordinal() as i32 };
    let dl_tensor = DlTensor { data: address as *mut c_void, device, ndim: held.shape.len() as i32, dtype, shape: held.shape.as_mut_ptr(), strides: std::ptr::null_mut(), byte_offset: 0 };
    let managed = Box::into_raw(Box::new(DlManagedTensor { dl_tensor, manager_ctx: Box::into_raw(held).cast(), deleter: Some(delete_exported) }));
    // SAFETY: a new capsule over the boxed DLManagedTensor, named as DLPack requires; the
    // destructor frees it unless a consumer renamed the capsule (took it over).
    let capsule = unsafe { pyo3::ffi::PyCapsule_New(managed.cast(), CAPSULE.as_ptr(), Some(capsule_destructor)) };
    if capsule.is_null() {
        // SAFETY: the capsule was not made; the DLManagedTensor is still ours alone.
        unsafe { delete_exported(managed) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: PyCapsule_New returned a new reference.
    Ok(unsafe { Bound::from_owned_ptr(py, capsule) }.unbind())
}

/// What an exported capsule owns: the engine's tensor and the shape DLPack points to.
struct Exported {
    shape: Vec<i64>,
    _tensor: Tensor,
}

/// The DLPack deleter of an exported tensor: frees the engine's tensor and the structures.
unsafe extern "C" fn delete_exported(m: *mut DlManagedTensor) {
    if m.is_null() {
        return;
    }
    // SAFETY: `m` and its manager came from Box::into_raw in `export`; DLPack calls the
    // deleter once (the consumer that took the capsule, or the capsule's destructor).
    unsafe {
        let m = Box::from_raw(m);
        drop(Box::from_raw(m.manager_ctx.cast::<Exported>()));
    }
}

/// The capsule's destructor: frees the tensor when no consumer took it (still named
/// `dltensor`).
unsafe extern "C" fn capsule_destructor(capsule: *mut pyo3::ffi::PyObject) {
    // SAFETY: called by Python with the GIL on a capsule made by `export`; a consumer that
    // took it renamed it, and then owns the tensor.
    unsafe {
        if pyo3::ffi::PyCapsule_IsValid(capsule, CAPSULE.as_ptr()) == 1 {
            let m = pyo3::ffi::PyCapsule_GetPointer(capsule, CAPSULE.as_ptr()).cast::<DlManagedTensor>();
            delete_exported(m);
        } else {
            pyo3::ffi::PyErr_Clear();
        }
    }
}
