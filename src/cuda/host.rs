//! [`HostDevice`]: the [`Device`] trait on the CPU, running the kernels of kernels/*.cu
//! compiled as host C++ (kernels/host_shim.h) and cuBLAS's column-major SGEMM semantics
//! ([`ColumnMajorGemm::reference`]).
//!
//! It exists for tests: the GPU model code ([`super::mlp::DeviceMlp`]) and every kernel run
//! through it on machines without a GPU, and are compared with the CPU path. Each launch
//! walks a small grid (2 blocks of 3 threads) one thread at a time, so the kernels'
//! grid-stride indexing is exercised; one thread owns each output, so the sequential walk
//! computes what the GPU computes. The first use compiles the kernels with the system's
//! C++ compiler (`$CXX`, else `c++`) into a temporary shared library and loads it.

use std::ffi::{c_void, CString};
use std::sync::{Arc, Mutex, OnceLock};

use super::device::{Device, DeviceReducer, DeviceResult, Direction, KernelArg};
use crate::comm::{Collectives, CollectivesExt};
use crate::dtype::{DType, ReduceOp};
use super::kernels::{host_source, Kernel};
use super::plan::ColumnMajorGemm;
use super::CudaError;

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
struct HostKernels {
    entries: Vec<(Kernel, unsafe extern "C" fn(*mut *mut c_void))>,
    /// threadIdx, blockIdx, blockDim, gridDim.
    geometry: [*mut Dim3; 4],
    /// The geometry is global: one launch at a time in the process.
    lock: Mutex<()>,
}

// SAFETY: the raw pointers are addresses of globals in a library that stays loaded for the
// life of the process (never dlclose'd); every access to them holds `lock`.
unsafe impl Send for HostKernels {}
// SAFETY: as above.
unsafe impl Sync for HostKernels {}

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

fn compile() -> Result<HostKernels, String> {
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
    Ok(HostKernels { entries, geometry, lock: Mutex::new(()) })
}

fn kernels() -> Result<Arc<HostKernels>, CudaError> {
    static LIB: OnceLock<Result<Arc<HostKernels>, String>> = OnceLock::new();
    LIB.get_or_init(|| compile().map(Arc::new)).clone().map_err(|log| CudaError::Kernel { name: "host build".into(), log })
}

/// The [`Device`] trait on the CPU with the real kernel sources (tests; see the module docs).
pub struct HostDevice {
    lib: Arc<HostKernels>,
}

impl HostDevice {
    /// Compiles (once per process) and loads the kernels.
    pub fn new() -> Result<HostDevice, CudaError> {
        Ok(HostDevice { lib: kernels()? })
    }
}

impl Device for HostDevice {
    type F32 = Vec<f32>;
    type U32 = Vec<u32>;
    type U16 = Vec<u16>;
    type HostF32 = Vec<f32>;
    type HostU32 = Vec<u32>;

    fn describe(&self) -> String {
        "host (kernels compiled as C++ for the CPU)".into()
    }
    fn zeros_f32(&self, n: usize) -> DeviceResult<Vec<f32>> {
        Ok(vec![0.0; n])
    }
    fn zeros_u32(&self, n: usize) -> DeviceResult<Vec<u32>> {
        Ok(vec![0; n])
    }
    fn zeros_u16(&self, n: usize) -> DeviceResult<Vec<u16>> {
        Ok(vec![0; n])
    }
    fn len_u16(&self, b: &Vec<u16>) -> usize {
        b.len()
    }
    fn read_u16(&self, src: &Vec<u16>, dst: &mut [u16]) -> DeviceResult<()> {
        let n = dst.len();
        dst.copy_from_slice(src.get(..n).ok_or_else(|| CudaError::Call { what: "read".into(), detail: format!("{n} values of a buffer of {}", src.len()) })?);
        Ok(())
    }
    fn len_f32(&self, b: &Vec<f32>) -> usize {
        b.len()
    }
    fn len_u32(&self, b: &Vec<u32>) -> usize {
        b.len()
    }
    fn staging_f32(&self, n: usize, _dir: Direction) -> DeviceResult<Vec<f32>> {
        Ok(vec![0.0; n])
    }
    fn staging_u32(&self, n: usize) -> DeviceResult<Vec<u32>> {
        Ok(vec![0; n])
    }
    fn host_f32<'a>(&self, h: &'a mut Vec<f32>) -> DeviceResult<&'a mut [f32]> {
        Ok(h)
    }
    fn host_u32<'a>(&self, h: &'a mut Vec<u32>) -> DeviceResult<&'a mut [u32]> {
        Ok(h)
    }
    fn upload_f32(&self, src: &Vec<f32>, n: usize, dst: &mut Vec<f32>) -> DeviceResult<()> {
        copy(&src[..n.min(src.len())], dst, 0, "upload")
    }
    fn upload_u32(&self, src: &Vec<u32>, n: usize, dst: &mut Vec<u32>) -> DeviceResult<()> {
        copy(&src[..n.min(src.len())], dst, 0, "upload")
    }
    fn download_f32(&self, src: &Vec<f32>, n: usize, dst: &mut Vec<f32>) -> DeviceResult<()> {
        copy(&src[..n.min(src.len())], dst, 0, "download")
    }
    fn write_f32(&self, src: &[f32], dst: &mut Vec<f32>, offset: usize) -> DeviceResult<()> {
        copy(src, dst, offset, "write")
    }
    fn read_f32(&self, src: &Vec<f32>, offset: usize, dst: &mut [f32]) -> DeviceResult<()> {
        let piece = src.get(offset..offset + dst.len()).ok_or_else(|| CudaError::Call { what: "read".into(), detail: format!("{} values at {offset} of a buffer of {}", dst.len(), src.len()) })?;
        dst.copy_from_slice(piece);
        Ok(())
    }
    fn gemm_unchecked(&self, call: &ColumnMajorGemm, first: (&Vec<f32>, usize), second: (&Vec<f32>, usize), c: (&mut Vec<f32>, usize)) -> DeviceResult<()> {
        call.reference(&first.0[first.1..], &second.0[second.1..], &mut c.0[c.1..]);
        Ok(())
    }
    fn launch(&self, kernel: Kernel, work: usize, args: &mut [KernelArg<'_, Self>]) -> DeviceResult<()> {
        if work == 0 {
            return Ok(());
        }
        let f = self.lib.entries.iter().find(|(k, _)| *k == kernel).map(|(_, f)| *f).ok_or_else(|| CudaError::Kernel { name: kernel.name().into(), log: "not in the host library".into() })?;
        // Offsets were checked against the buffers' lengths by the typed methods of Device,
        // so every pointer below is in bounds (wrapping_add: no UB even for empty buffers).
        let mut values: Vec<Slot> = args
            .iter_mut()
            .map(|a| match a {
                KernelArg::In(b, off) => Slot::of(&(b.as_ptr().wrapping_add(*off) as usize).to_ne_bytes()),
                KernelArg::Out(b, off) => Slot::of(&(b.as_mut_ptr().wrapping_add(*off) as usize).to_ne_bytes()),
                KernelArg::InU32(b) => Slot::of(&(b.as_ptr() as usize).to_ne_bytes()),
                KernelArg::InU16(b) => Slot::of(&(b.as_ptr() as usize).to_ne_bytes()),
                KernelArg::OutU16(b) => Slot::of(&(b.as_mut_ptr() as usize).to_ne_bytes()),
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
                // SAFETY: the geometry pointers are the library's globals (see HostKernels),
                // written under the lock; `ptrs` holds one pointer per kernel parameter, in
                // order, to a value of the parameter's type (the typed Device methods build
                // `args` from the kernel's signature), and the buffers they point into are
                // borrowed by `args` for the whole call.
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
    fn synchronize(&self) -> DeviceResult<()> {
        Ok(())
    }
}

fn copy<T: Copy>(src: &[T], dst: &mut [T], offset: usize, what: &str) -> DeviceResult<()> {
    let n = src.len();
    let len = dst.len();
    let piece = dst.get_mut(offset..offset + n).ok_or_else(|| CudaError::Call { what: what.into(), detail: format!("{n} values at {offset} of a buffer of {len}") })?;
    piece.copy_from_slice(src);
    Ok(())
}

/// [`DeviceReducer`] for [`HostDevice`] over any CPU backend (tests of the device path
/// under mpirun); synchronous.
pub struct HostReducer {
    coll: Box<dyn Collectives>,
}

impl HostReducer {
    /// Reduces over `coll`'s ranks.
    pub fn new(coll: Box<dyn Collectives>) -> HostReducer {
        HostReducer { coll }
    }
}

impl DeviceReducer<HostDevice> for HostReducer {
    fn allreduce_sum(&mut self, _dev: &HostDevice, buf: &mut Vec<f32>) -> DeviceResult<()> {
        self.coll.allreduce(buf.as_mut_slice(), ReduceOp::Sum).map_err(|e| CudaError::Collective(e.to_string()))
    }
    fn allreduce_half_sum(&mut self, _dev: &HostDevice, buf: &mut Vec<u16>, bf16: bool) -> DeviceResult<()> {
        let dtype = if bf16 { DType::BF16 } else { DType::F16 };
        self.coll.allreduce_raw(bytemuck::cast_slice_mut(buf.as_mut_slice()), dtype, ReduceOp::Sum).map_err(|e| CudaError::Collective(e.to_string()))
    }
    fn wait(&mut self) -> DeviceResult<()> {
        Ok(())
    }
}
