//! [`HostKernels`]: the [`Device`] trait on the CPU, running the kernels of kernels/*.cu
//! compiled as host C++ (kernels/host_shim.h) and cuBLAS's column-major SGEMM semantics
//! ([`super::plan::ColumnMajorGemm::reference`]; at [`GemmPrecision::Bf16`] on operands
//! rounded to bf16 first, as `cublasGemmEx` multiplies them), **asynchronously, like a GPU**.
//!
//! It exists for tests: the GPU code path — the dense model over the kernels, its tensors
//! handed to the engine's device executor on a second queue — and every kernel run through
//! it on machines without a GPU, and are compared with the CPU device.
//!
//! **Kernels.** Each launch walks a small grid (2 blocks of 3 threads) one thread at a
//! time, so the kernels' grid-stride indexing is exercised; one thread owns each output, so
//! the sequential walk computes what the GPU computes. The first use compiles the kernels
//! with the system's C++ compiler (`$CXX`, else `c++`) into a temporary shared library and
//! loads it.
//!
//! **Streams.** As [`super::CudaDevice`] does, every operation is queued and runs later:
//! each queue (the device, and each [`Device::fork`]) is a worker thread running its
//! operations in order ([`super::host_stream`]). Uploads, downloads, copies, GEMMs and
//! kernel launches return at once; buffers record the jobs that read and write them, and a
//! queue that uses a buffer first waits for the other queue's pending work on it (cudarc's
//! multi-stream events); [`Device::synchronize`] waits for the queue; [`Device::host`] and
//! [`Device::host_memory`] wait for every queued use of the memory; `read`, `write` and
//! `to_vec` queue a copy and wait for it, as on a GPU. Memory is reference-counted, so a
//! buffer reallocated or dropped while work on it is queued lives until that work ran.
//! [`HostOptions`] add random delays before each operation (seeded), so a missing wait, a
//! staging slot reused too early or a buffer freed too soon changes the results, and
//! [`HostFault`]s remove a wait on purpose, to prove that such a bug is caught.

use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::host_stream::{Access, Mem, Queue, Stamp};
pub use super::host_stream::{HostDelay, HostFault};
use super::kernels::{host_source, Kernel};
use super::ops::{launch, launch_epilogue, Epilogue, Gemm, GemmPrecision, KernelArg, LaunchKernels, Op};
use super::plan::row_major;
use super::{Device, DeviceError, DeviceResult, Direction, Scalar};
use crate::dtype::Element;
use crate::hash::splitmix64_next;
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


/// How a [`HostKernels`] device misbehaves on purpose (tests; the default: it does not).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostOptions {
    /// Random delays before each queued operation.
    pub delay: Option<HostDelay>,
    /// A wait removed on purpose.
    pub fault: Option<HostFault>,
}

/// The longest delay when `RINGREC_HOST_DELAY_MAX_US` is not set.
pub const DEFAULT_MAX_DELAY_US: u64 = 200;

impl HostOptions {
    /// The options from `RINGREC_HOST_DELAY_SEED` (a u64: delays on),
    /// `RINGREC_HOST_DELAY_MAX_US` (the longest delay, default 200) and `RINGREC_HOST_FAULT`
    /// (`no-stream-waits`, `no-staging-wait` or `no-write-back-wait`), for rank `rank` (its delays differ from
    /// the other ranks'). A bad value is an error naming the variable.
    pub fn from_env(rank: usize) -> Result<HostOptions, String> {
        use crate::config::parse;
        let seed = parse("RINGREC_HOST_DELAY_SEED", "a u64 seed, e.g. 7", |s| s.parse::<u64>().ok())?;
        let max_us = parse("RINGREC_HOST_DELAY_MAX_US", "microseconds, e.g. 200", |s| s.parse::<u64>().ok().filter(|m| *m <= 1_000_000))?.unwrap_or(DEFAULT_MAX_DELAY_US);
        let fault = parse("RINGREC_HOST_FAULT", "no-stream-waits, no-staging-wait or no-write-back-wait", |s| s.parse::<HostFault>().ok())?;
        let mut rank_seed = rank as u64;
        let delay = seed.map(|seed| HostDelay { seed: seed ^ splitmix64_next(&mut rank_seed), max_us });
        Ok(HostOptions { delay, fault })
    }
}

/// What the queues of one device (it and its forks) share.
struct Family {
    options: HostOptions,
    /// Queues made so far (each draws its own delays).
    queues: AtomicU64,
}

/// The [`Device`] trait on the CPU with the real kernel sources, asynchronous like a GPU
/// (tests; see the module docs).
pub struct HostKernels {
    lib: Arc<Library>,
    family: Arc<Family>,
    queue: Queue,
    precision: GemmPrecision,
}

/// A buffer of the host-kernels device (memory shared with the operations queued on it).
pub struct HostBuf<T: Scalar> {
    mem: Arc<Mem<T>>,
}

/// Staging memory of the host-kernels device.
pub struct HostStaging<T: Scalar> {
    mem: Arc<Mem<T>>,
    /// With [`HostFault::NoStagingWait`]: the memory that uploads still queued read, while
    /// the host writes a fresh copy (`mem`); the host's writes reach it at the next use.
    shadowed: Option<Arc<Mem<T>>>,
}

impl<T: Scalar> HostStaging<T> {
    /// With [`HostFault::NoStagingWait`]: the host's writes since it got its view reach the
    /// memory that uploads still queued read, as they would have on a GPU had those uploads
    /// run late. `done`: the host hands the buffer to the device (or the uploads ran), so the
    /// old memory is let go.
    fn settle(&mut self, done: bool) {
        if let Some(old) = &self.shadowed {
            old.overwrite_from(&self.mem);
            if done || old.idle() {
                self.shadowed = None;
            }
        }
    }
}

fn queue(family: &Family) -> DeviceResult<Queue> {
    let mut n = family.queues.fetch_add(1, Ordering::Relaxed);
    let delays = family.options.delay.map(|d| (d.seed ^ splitmix64_next(&mut n), d.max_us));
    Queue::new(delays, family.options.fault == Some(HostFault::NoStreamWaits))
}

impl HostKernels {
    /// Compiles (once per process) and loads the kernels; no delays, no faults.
    pub fn new() -> Result<HostKernels, DeviceError> {
        HostKernels::with_options(HostOptions::default())
    }

    /// As [`HostKernels::new`], misbehaving as `options` say.
    pub fn with_options(options: HostOptions) -> Result<HostKernels, DeviceError> {
        let family = Arc::new(Family { options, queues: AtomicU64::new(0) });
        Ok(HostKernels { lib: library()?, queue: queue(&family)?, family, precision: GemmPrecision::F32 })
    }

    /// The options it runs with.
    pub fn options(&self) -> HostOptions {
        self.family.options
    }
}

impl Device for HostKernels {
    type Buf<T: Scalar> = HostBuf<T>;
    type Staging<T: Scalar> = HostStaging<T>;
    type Mark = Stamp;

    fn describe(&self) -> String {
        let mut s = String::from("host-kernels (kernels/*.cu compiled as C++ for the CPU, asynchronous queues");
        if let Some(d) = self.family.options.delay {
            s.push_str(&format!(", random delays up to {} us", d.max_us));
        }
        if let Some(f) = self.family.options.fault {
            s.push_str(&format!(", fault {f}"));
        }
        s.push(')');
        s
    }
    fn kind(&self) -> &'static str {
        "host-kernels"
    }
    fn fork(&self) -> DeviceResult<HostKernels> {
        Ok(HostKernels { lib: self.lib.clone(), queue: queue(&self.family)?, family: self.family.clone(), precision: self.precision })
    }
    fn gemm_precision(&self) -> GemmPrecision {
        self.precision
    }
    fn set_gemm_precision(&mut self, p: GemmPrecision) -> DeviceResult<()> {
        self.precision = p;
        Ok(())
    }
    fn alloc<T: Scalar>(&self, n: usize) -> DeviceResult<HostBuf<T>> {
        Ok(HostBuf { mem: Mem::zeroed(n) })
    }
    fn len<T: Scalar>(&self, b: &HostBuf<T>) -> usize {
        b.mem.elements()
    }
    fn staging<T: Scalar>(&self, n: usize, _dir: Direction) -> DeviceResult<HostStaging<T>> {
        Ok(HostStaging { mem: Mem::zeroed(n), shadowed: None })
    }
    fn host<'a, T: Scalar>(&self, h: &'a mut HostStaging<T>) -> DeviceResult<&'a mut [T]> {
        if self.family.options.fault == Some(HostFault::NoStagingWait) {
            // The fault: downloads into the buffer are still waited for, the uploads out of
            // it are not. They keep the old memory, which gets the host's writes (settle).
            h.settle(false);
            h.mem.wait_writes();
            if h.shadowed.is_none() && !h.mem.idle() {
                let fresh = h.mem.duplicate();
                h.shadowed = Some(std::mem::replace(&mut h.mem, fresh));
            }
        } else {
            h.mem.wait_idle();
        }
        // A failed operation is reported at the next wait (CudaDevice: the context's errors).
        self.queue.check()?;
        // SAFETY: no queued job uses `h.mem` any more (waited for above; or, with the fault,
        // it is a fresh copy no job has seen), and none can be queued while the returned
        // slice borrows `h` exclusively; the memory lives as long as `h` (its `Arc`).
        Ok(unsafe { std::slice::from_raw_parts_mut(h.mem.ptr(), h.mem.elements()) })
    }
    fn host_memory<'a, T: Scalar>(&self, b: &'a mut HostBuf<T>) -> Option<&'a mut [T]> {
        b.mem.wait_idle();
        // SAFETY: as in `host`: every job using the memory has run, and none can be queued
        // while the slice borrows `b` exclusively.
        Some(unsafe { std::slice::from_raw_parts_mut(b.mem.ptr(), b.mem.elements()) })
    }
    fn upload_unchecked<T: Scalar>(&self, src: &mut HostStaging<T>, n: usize, dst: &mut HostBuf<T>) -> DeviceResult<()> {
        src.settle(true);
        copy_job(&self.queue, (&src.mem, 0), (&dst.mem, 0), n)
    }
    fn download_unchecked<T: Scalar>(&self, src: &mut HostBuf<T>, n: usize, dst: &mut HostStaging<T>) -> DeviceResult<()> {
        dst.settle(true);
        copy_job(&self.queue, (&src.mem, 0), (&dst.mem, 0), n)
    }
    fn write_unchecked<T: Scalar>(&self, src: &[T], dst: &mut HostBuf<T>, at: usize) -> DeviceResult<()> {
        // A copy from pageable memory, then a wait (CudaDevice: memcpy_htod, synchronize).
        let data = src.to_vec();
        let to = dst.mem.addr(at);
        // SAFETY (inside the job): `dst` holds `at + data.len()` elements (Device::write
        // checked it), the job holds it exclusively while it runs, and `data` is its own.
        self.queue.submit(vec![Access::write(&dst.mem)], move || unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), to as *mut T, data.len()) })?;
        self.queue.synchronize()
    }
    fn read_unchecked<T: Scalar>(&self, src: &HostBuf<T>, at: usize, dst: &mut [T]) -> DeviceResult<()> {
        let out: Arc<Mutex<Vec<T>>> = Arc::new(Mutex::new(Vec::new()));
        let (from, n, o) = (src.mem.addr(at), dst.len(), out.clone());
        // SAFETY (inside the job): `src` holds `at + n` elements (Device::read checked it) and
        // the job holds it shared while it runs.
        self.queue.submit(vec![Access::read(&src.mem)], move || *o.lock().unwrap_or_else(|p| p.into_inner()) = unsafe { std::slice::from_raw_parts(from as *const T, n) }.to_vec())?;
        self.queue.synchronize()?;
        let got = out.lock().unwrap_or_else(|p| p.into_inner());
        if got.len() != n {
            return Err(DeviceError::refused("reading from the host-kernels device", "the queued copy did not run"));
        }
        dst.copy_from_slice(&got);
        Ok(())
    }
    fn copy_unchecked<T: Scalar>(&self, src: (&HostBuf<T>, usize), dst: (&mut HostBuf<T>, usize), n: usize) -> DeviceResult<()> {
        copy_job(&self.queue, (&src.0.mem, src.1), (&dst.0.mem, dst.1), n)
    }
    fn synchronize(&self) -> DeviceResult<()> {
        self.queue.synchronize()
    }
    fn mark(&self) -> DeviceResult<Stamp> {
        self.queue.stamp()
    }
    fn seconds_between(&self, from: &Stamp, to: &Stamp) -> DeviceResult<f64> {
        match (from.wait(), to.wait()) {
            (Some(a), Some(b)) => Ok(b.saturating_duration_since(a).as_secs_f64()),
            _ => self.queue.check().and(Err(DeviceError::refused("timing the host-kernels queue", "its worker thread stopped before a mark"))),
        }
    }
    fn gemm_unchecked(&self, g: &Gemm, a: (&HostBuf<f32>, usize), b: (&HostBuf<f32>, usize), c: (&mut HostBuf<f32>, usize), epi: Epilogue<'_, Self>) -> DeviceResult<()> {
        // cuBLAS's column-major call on the CPU: the GPU path's operand swap is tested too.
        if g.m > 0 && g.n > 0 {
            let plan = row_major(g);
            let (na, nb, nc) = g.extents();
            let (pa, pb, pc) = (a.0.mem.addr(a.1), b.0.mem.addr(b.1), c.0.mem.addr(c.1));
            let accesses = vec![Access::read(&a.0.mem), Access::read(&b.0.mem), Access::write(&c.0.mem)];
            let bf16 = self.precision == GemmPrecision::Bf16;
            self.queue.submit(accesses, move || {
                // SAFETY: Device::gemm checked that each operand's extent fits its buffer past
                // its offset; the job holds a and b shared and c exclusively while it runs (c
                // is another buffer than a and b: the caller borrows it mutably).
                let (a, b, c) = unsafe { (std::slice::from_raw_parts(pa as *const f32, na), std::slice::from_raw_parts(pb as *const f32, nb), std::slice::from_raw_parts_mut(pc as *mut f32, nc)) };
                if bf16 {
                    let round = |x: &[f32]| x.iter().map(|v| super::bgemm::rounded(*v)).collect::<Vec<f32>>();
                    plan.reference(&round(b), &round(a), c);
                } else {
                    plan.reference(b, a, c);
                }
            })?;
        }
        launch_epilogue(self, g, b, c.0, c.1, epi)
    }
    fn exec_unchecked(&self, op: Op<'_, Self>) -> DeviceResult<()> {
        launch(self, op)
    }
    unsafe fn borrow_unchecked<T: Scalar>(&self, address: usize, n: usize) -> DeviceResult<HostBuf<T>> {
        let ptr = std::ptr::NonNull::new(address as *mut T).ok_or_else(|| DeviceError::refused("borrowing a tensor's memory", "a null pointer"))?;
        // SAFETY: the caller's contract (Device::borrow_unchecked): `n` elements of host
        // memory, the "device memory" of this device, lent to the buffer alone until it is
        // given up (forget_borrowed waits for its jobs first).
        Ok(HostBuf { mem: unsafe { Mem::borrowed(ptr, n) } })
    }
    fn address<T: Scalar>(&self, b: &mut HostBuf<T>) -> Option<usize> {
        b.mem.wait_idle();
        Some(b.mem.ptr() as usize)
    }
    fn forget_borrowed<T: Scalar>(b: HostBuf<T>) {
        // Not freed (`Mem::borrowed`); no job may touch the memory once it is handed back.
        b.mem.wait_idle();
    }
    fn lend<T: Scalar + Element>(&self, b: HostBuf<T>) -> Tensor {
        let n = b.mem.elements();
        Tensor::on_device(DeviceTensor::new(b, T::DTYPE, n, self.kind()))
    }
    fn take_back<T: Scalar + Element>(&self, t: Tensor) -> DeviceResult<HostBuf<T>> {
        let what = || DeviceError::refused("taking a tensor back", format!("not a {} buffer of the host-kernels device", T::DTYPE));
        t.into_device().map_err(|_| what())?.into_buffer::<HostBuf<T>>().map_err(|_| what())
    }
}

/// Queues a copy of `n` elements between two memories (an upload, a download, a copy).
fn copy_job<T: Scalar>(q: &Queue, src: (&Arc<Mem<T>>, usize), dst: (&Arc<Mem<T>>, usize), n: usize) -> DeviceResult<()> {
    if n == 0 {
        return Ok(());
    }
    let (from, to) = (src.0.addr(src.1), dst.0.addr(dst.1));
    // SAFETY (inside the job): both ranges were checked against the buffers (Device::upload,
    // download, copy); the job holds src shared and dst exclusively while it runs; they are
    // distinct memories (the caller borrows dst mutably and src immutably, or they are a
    // staging buffer and a device buffer).
    q.submit(vec![Access::read(src.0), Access::write(dst.0)], move || unsafe { std::ptr::copy_nonoverlapping(from as *const T, to as *mut T, n) })?;
    Ok(())
}

impl LaunchKernels for HostKernels {
    fn launch(&self, kernel: Kernel, work: usize, args: &mut [KernelArg<'_, Self>]) -> DeviceResult<()> {
        if work == 0 {
            return Ok(());
        }
        let f = self.lib.entries.iter().find(|(k, _)| *k == kernel).map(|(_, f)| *f).ok_or_else(|| DeviceError::Kernel { name: kernel.name().into(), log: "not in the host library".into() })?;
        // Offsets were checked against the buffers' lengths (Op::check), so every address
        // below is in bounds (wrapping_add: no UB even for empty buffers).
        let mut accesses = Vec::new();
        let mut values: Vec<Slot> = Vec::with_capacity(args.len());
        for a in args.iter() {
            let (access, addr) = match a {
                KernelArg::In(b, off) => (Access::read(&b.mem), b.mem.addr(*off)),
                KernelArg::Out(b, off) => (Access::write(&b.mem), b.mem.addr(*off)),
                KernelArg::InU32(b) => (Access::read(&b.mem), b.mem.addr(0)),
                KernelArg::OutU32(b, off) => (Access::write(&b.mem), b.mem.addr(*off)),
                KernelArg::InF16(b, off) => (Access::read(&b.mem), b.mem.addr(*off)),
                KernelArg::OutF16(b, off) => (Access::write(&b.mem), b.mem.addr(*off)),
                KernelArg::InBf16(b, off) => (Access::read(&b.mem), b.mem.addr(*off)),
                KernelArg::OutBf16(b, off) => (Access::write(&b.mem), b.mem.addr(*off)),
                KernelArg::I32(v) => {
                    values.push(Slot::of(&v.to_ne_bytes()));
                    continue;
                }
                KernelArg::I64(v) => {
                    values.push(Slot::of(&v.to_ne_bytes()));
                    continue;
                }
                KernelArg::F32(v) => {
                    values.push(Slot::of(&v.to_ne_bytes()));
                    continue;
                }
            };
            accesses.push(access);
            values.push(Slot::of(&addr.to_ne_bytes()));
        }
        let lib = self.lib.clone();
        self.queue.submit(accesses, move || {
            let mut values = values;
            let mut ptrs: Vec<*mut c_void> = values.iter_mut().map(|s| s as *mut Slot as *mut c_void).collect();
            let _one_at_a_time = lib.lock.lock().unwrap_or_else(|p| p.into_inner());
            let [thread, block, block_dim, grid_dim] = lib.geometry;
            for b in 0..GRID.0 {
                for t in 0..GRID.1 {
                    // SAFETY: the geometry pointers are the library's globals (see Library),
                    // written under the lock; `ptrs` holds one pointer per kernel parameter, in
                    // order, to a value of the parameter's type (ops::launch builds `args`
                    // from the kernel's signature); the buffers the values point into are
                    // held by this job (shared for inputs, exclusively for outputs) while it
                    // runs, and each output is another buffer than every input (the caller
                    // borrows outputs mutably).
                    unsafe {
                        *grid_dim = Dim3 { x: GRID.0, y: 1, z: 1 };
                        *block_dim = Dim3 { x: GRID.1, y: 1, z: 1 };
                        *block = Dim3 { x: b, y: 0, z: 0 };
                        *thread = Dim3 { x: t, y: 0, z: 0 };
                        f(ptrs.as_mut_ptr());
                    }
                }
            }
        })?;
        Ok(())
    }
}
