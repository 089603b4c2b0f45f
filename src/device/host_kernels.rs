//! [`HostKernels`]: the [`Device`] trait on the CPU, running the kernels of kernels/*.cu
//! compiled as host C++ (kernels/host_shim.h) and cuBLAS's column-major SGEMM semantics
//! ([`ColumnMajorGemm::reference`]).
//!
//! It exists for tests: the GPU code path — the dense model over the kernels, its tensors
//! handed to the engine's device executor — and every kernel run through it on machines
//! without a GPU, and are compared with the CPU device. Each launch
//! walks a small grid (2 blocks of 3 threads) one thread at a time, so the kernels'
//! grid-stride indexing is exercised; one thread owns each output, so the sequential walk
//! computes what the GPU computes. The first use compiles the kernels with the system's
//! C++ compiler (`$CXX`, else `c++`) into a temporary shared library and loads it.

use std::ffi::{c_void, CString};
use std::sync::{Arc, Mutex, OnceLock};

use super::kernels::{host_source, Kernel};
use super::ops::{launch, launch_epilogue, Epilogue, Gemm, KernelArg, LaunchKernels, Op};
use super::plan::row_major;
use super::{Device, DeviceError, DeviceResult, Direction, Scalar};
use crate::dtype::Element;
use crate::tensor::{DeviceTensor, Tensor};

/// Blocks and threads per block of every host launch.
const GRID: (u32, u32) = (2, 3);

/// CUDA's `dim3` as host_shim.h declares it.
#[repr(C)]
struct Dim3 {
    x: u32,
    y: u32,
    z: u32,
}

/// The loaded library: one entry point per kernel and the launch-geometry globals.
struct Library {
    entries: Vec<(Kernel, unsafe extern "C" fn(*mut *mut c_void))>,
    /// threadIdx, blockIdx, blockDim, gridDim.
    geometry: [*mut Dim3; 4],
    /// The geometry is global: one launch at a time in the process.
    lock: Mutex<()>,
}

// SAFETY: the raw pointers are addresses of globals in a library that stays loaded for the
// life of the process (never dlclose'd); every access to them holds `lock`.
unsafe impl Send for Library {}
// SAFETY: as above.
unsafe impl Sync for Library {}

/// One kernel argument's value, where `void** args` points (aligned for any scalar or pointer).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct Slot([u8; 8]);

impl Slot {
    fn of(bytes: &[u8]) -> Slot {
        let mut s = [0u8; 8];
        s[..bytes.len()].copy_from_slice(bytes);
        Slot(s)
    }
}

fn compile() -> Result<Library, String> {
    let dir = std::env::temp_dir().join(format!("ringrec-host-kernels-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let src = dir.join("kernels.cpp");
    let lib = dir.join("libringrec_kernels.so");
    std::fs::write(&src, host_source()).map_err(|e| format!("writing {}: {e}", src.display()))?;
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".to_string());
    let out = std::process::Command::new(&cxx)
        .args(["-std=c++14", "-O1", "-ffp-contract=off", "-fno-fast-math", "-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .output()
        .map_err(|e| format!("running the C++ compiler `{cxx}`: {e} (install g++, or set CXX)"))?;
    if !out.status.success() {
        return Err(format!("`{cxx}` could not compile kernels/*.cu as host C++:\n{}", String::from_utf8_lossy(&out.stderr)));
    }
    let path = CString::new(lib.to_string_lossy().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: dlopen of a library we just built; its constructors are the C++ runtime's.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    let _ = std::fs::remove_dir_all(&dir);
    if handle.is_null() {
        return Err("dlopen of the host kernel library failed".into());
    }
    let sym = |name: &str| -> Result<*mut c_void, String> {
        let c = CString::new(name).map_err(|e| e.to_string())?;
        // SAFETY: handle is a live library handle; c is a NUL-terminated name.
        let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
        if p.is_null() {
            Err(format!("symbol {name} missing from the host kernel library"))
        } else {
            Ok(p)
        }
    };
    let mut entries = Vec::new();
    for k in Kernel::ALL {
        let p = sym(&format!("rr_launch_{}", k.name()))?;
        // SAFETY: rr_launch_<name> is defined by host_source() as `void (void**)`.
        let f: unsafe extern "C" fn(*mut *mut c_void) = unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut *mut c_void)>(p) };
        entries.push((k, f));
    }
    let geometry = [sym("threadIdx")? as *mut Dim3, sym("blockIdx")? as *mut Dim3, sym("blockDim")? as *mut Dim3, sym("gridDim")? as *mut Dim3];
    Ok(Library { entries, geometry, lock: Mutex::new(()) })
}

fn library() -> Result<Arc<Library>, DeviceError> {
    static LIB: OnceLock<Result<Arc<Library>, String>> = OnceLock::new();
    LIB.get_or_init(|| compile().map(Arc::new)).clone().map_err(|log| DeviceError::Kernel { name: "host build".into(), log })
}

/// The [`Device`] trait on the CPU with the real kernel sources (tests; see the module docs).
#[derive(Clone)]
pub struct HostKernels {
    lib: Arc<Library>,
}

impl HostKernels {
    /// Compiles (once per process) and loads the kernels.
    pub fn new() -> Result<HostKernels, DeviceError> {
        Ok(HostKernels { lib: library()? })
    }
}

/// The address of element `at` of a buffer a kernel reads.
fn input<T>(v: &[T], at: usize) -> usize {
    v.as_ptr().wrapping_add(at) as usize
}

/// The address of element `at` of a buffer a kernel writes.
fn output<T>(v: &mut [T], at: usize) -> usize {
    v.as_mut_ptr().wrapping_add(at) as usize
}

impl Device for HostKernels {
    type Buf<T: Scalar> = Vec<T>;
    type Staging<T: Scalar> = Vec<T>;

    super::vec_memory!();

    fn describe(&self) -> String {
        "host-kernels (kernels/*.cu compiled as C++ for the CPU)".into()
    }
    fn kind(&self) -> &'static str {
        "host-kernels"
    }
    fn fork(&self) -> DeviceResult<HostKernels> {
        Ok(self.clone())
    }
    fn upload_unchecked<T: Scalar>(&self, src: &mut Vec<T>, n: usize, dst: &mut Vec<T>) -> DeviceResult<()> {
        dst[..n].copy_from_slice(&src[..n]);
        Ok(())
    }
    fn download_unchecked<T: Scalar>(&self, src: &mut Vec<T>, n: usize, dst: &mut Vec<T>) -> DeviceResult<()> {
        dst[..n].copy_from_slice(&src[..n]);
        Ok(())
    }
    fn gemm_unchecked(&self, g: &Gemm, a: (&Vec<f32>, usize), b: (&Vec<f32>, usize), c: (&mut Vec<f32>, usize), epi: Epilogue<'_, Self>) -> DeviceResult<()> {
        // cuBLAS's column-major call on the CPU: the GPU path's operand swap is tested too.
        if g.m > 0 && g.n > 0 {
            row_major(g).reference(&b.0[b.1..], &a.0[a.1..], &mut c.0[c.1..]);
        }
        launch_epilogue(self, g, b, c.0, c.1, epi)
    }
    fn exec_unchecked(&self, op: Op<'_, Self>) -> DeviceResult<()> {
        launch(self, op)
    }
    fn lend<T: Scalar + Element>(&self, b: Vec<T>) -> Tensor {
        let n = b.len();
        Tensor::on_device(DeviceTensor::new(b, T::DTYPE, n, self.kind()))
    }
    fn take_back<T: Scalar + Element>(&self, t: Tensor) -> DeviceResult<Vec<T>> {
        let what = || DeviceError::refused("taking a tensor back", format!("not a {} buffer of the host-kernels device", T::DTYPE));
        t.into_device().map_err(|_| what())?.into_buffer::<Vec<T>>().map_err(|_| what())
    }
}

impl LaunchKernels for HostKernels {
    fn launch(&self, kernel: Kernel, work: usize, args: &mut [KernelArg<'_, Self>]) -> DeviceResult<()> {
        if work == 0 {
            return Ok(());
        }
        let f = self.lib.entries.iter().find(|(k, _)| *k == kernel).map(|(_, f)| *f).ok_or_else(|| DeviceError::Kernel { name: kernel.name().into(), log: "not in the host library".into() })?;
        // Offsets were checked against the buffers' lengths (Op::check), so every pointer
        // below is in bounds (wrapping_add: no UB even for empty buffers).
        let mut values: Vec<Slot> = args
            .iter_mut()
            .map(|a| match a {
                KernelArg::In(b, off) => Slot::of(&input(b, *off).to_ne_bytes()),
                KernelArg::Out(b, off) => Slot::of(&output(b, *off).to_ne_bytes()),
                KernelArg::InU32(b) => Slot::of(&input(b, 0).to_ne_bytes()),
                KernelArg::InF16(b, off) => Slot::of(&input(b, *off).to_ne_bytes()),
                KernelArg::OutF16(b, off) => Slot::of(&output(b, *off).to_ne_bytes()),
                KernelArg::InBf16(b, off) => Slot::of(&input(b, *off).to_ne_bytes()),
                KernelArg::OutBf16(b, off) => Slot::of(&output(b, *off).to_ne_bytes()),
                KernelArg::I32(v) => Slot::of(&v.to_ne_bytes()),
                KernelArg::I64(v) => Slot::of(&v.to_ne_bytes()),
                KernelArg::F32(v) => Slot::of(&v.to_ne_bytes()),
            })
            .collect();
        let mut ptrs: Vec<*mut c_void> = values.iter_mut().map(|s| s as *mut Slot as *mut c_void).collect();
        let _one_at_a_time = self.lib.lock.lock().unwrap_or_else(|p| p.into_inner());
        let [thread, block, block_dim, grid_dim] = self.lib.geometry;
        for b in 0..GRID.0 {
            for t in 0..GRID.1 {
                // SAFETY: the geometry pointers are the library's globals (see Library),
                // written under the lock; `ptrs` holds one pointer per kernel parameter, in
                // order, to a value of the parameter's type (ops::launch builds `args` from
                // the kernel's signature), and the buffers they point into are borrowed by
                // `args` for the whole call. Output pointers come from `&mut` buffers.
                unsafe {
                    *grid_dim = Dim3 { x: GRID.0, y: 1, z: 1 };
                    *block_dim = Dim3 { x: GRID.1, y: 1, z: 1 };
                    *block = Dim3 { x: b, y: 0, z: 0 };
                    *thread = Dim3 { x: t, y: 0, z: 0 };
                    f(ptrs.as_mut_ptr());
                }
            }
        }
        Ok(())
    }
}
