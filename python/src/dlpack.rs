//! DLPack: a tensor handed over by `t.__dlpack__()` (numpy arrays, torch tensors) as a
//! tensor the engine reduces where it is, without a copy.
//!
//! The capsule (named `dltensor`) holds a `DLManagedTensor`: the data pointer, device,
//! dtype, shape and strides, and the deleter that releases the producer's tensor. Taking it
//! renames the capsule `used_dltensor` (the protocol's rule: the consumer now owns it) and
//! the deleter runs when the engine's tensor is dropped ([`Managed`]).

use std::ffi::{c_void, CStr};

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use ringrec::dtype::DType;
use ringrec::engine::Tensor;

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
        DEVICE_CPU | DEVICE_CUDA_HOST => {}
        DEVICE_CUDA => return Err(cuda_refused(what, t.device.device_id)),
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
    if !t.strides.is_null() && ndim > 0 {
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
    let n: usize = shape.iter().product();
    let nbytes = n * dt.size();
    if nbytes == 0 {
        return Ok(Tensor::zeros(dt, &shape));
    }
    let address = (t.data as usize).wrapping_add(t.byte_offset as usize);
    // SAFETY: the producer's tensor holds `nbytes` contiguous bytes at `address` (checked
    // above: host memory, compact strides); `managed` keeps them alive until the engine's
    // tensor is dropped, and the caller does not touch them until the operation completes
    // (Horovod's contract for a tensor in flight).
    unsafe { Tensor::borrowed(address as *mut u8, nbytes, dt, &shape, managed) }.ok_or_else(|| PyValueError::new_err(format!("{what}: its data at {address:#x} is null or not aligned for {dt}")))
}

/// Why a CUDA tensor is refused: the engine takes device tensors only from its own NCCL
/// executor's memory; lending a framework's CUDA memory to it is not built.
fn cuda_refused(what: &str, device: i32) -> PyErr {
    let why = if cfg!(feature = "cuda") {
        "this build has the cuda feature, but the engine cannot yet reduce a CUDA tensor lent through DLPack (only its own executor's device buffers); copy it to the CPU (t.cpu())"
    } else {
        "this build of ringrec takes CPU tensors (build the extension with the cuda feature for device tensors, not done yet); copy it to the CPU (t.cpu())"
    };
    PyTypeError::new_err(format!("{what} is on cuda:{device}: {why}"))
}
