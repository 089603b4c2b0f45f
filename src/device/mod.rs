//! The device layer: one trait, [`Device`], for what a compute device does with tensors —
//! memory, copies, a GEMM with epilogues and a small set of element-wise, reduction and
//! gather/scatter kernels ([`Op`]) — shaped like candle's backends. Nothing in it is
//! about one model: the dense model ([`crate::model`]) is written once over it.
//!
//! | backend | memory | kernels |
//! |---|---|---|
//! | [`CpuDevice`] | `Vec<T>` | Rust loops and the `gemm` crate (bf16: [`bgemm`], AVX-512 BF16), split over the rank's threads |
//! | [`CudaDevice`] | `cudarc` device buffers, page-locked staging | cuBLAS (bf16: `cublasGemmEx` on tensor cores) and kernels/*.cu compiled by NVRTC; an uninhabited stand-in without the `cuda` feature |
//! | [`HostKernels`] | reference-counted host memory | the same kernels/*.cu compiled as host C++, queued on worker threads like CUDA streams ([`host_stream`]; tests of the GPU code path on machines without a GPU) |
//!
//! Every operation is checked before it runs: [`Device::gemm`] and [`Device::exec`] verify
//! that each buffer holds what the operation touches (an out-of-bounds write on a GPU
//! corrupts silently), then call the backend's unchecked implementation. On a GPU (and on
//! [`HostKernels`], which mirrors it) operations are asynchronous and ordered on the
//! device's stream, buffers used by two queues order them with events, and
//! [`Device::host`] views of staging memory wait for the copies that use it.

// AVX-512 intrinsics: stable since 1.89 (see the module's docs).
#[clippy::msrv = "1.89"]
pub mod bgemm;
pub mod cpu;
mod cpu_cache;
pub mod csr;
mod cpu_models;
mod cpu_pooling;
pub mod cuda;
pub mod host_kernels;
pub mod host_stream;
pub mod kernels;
pub mod lent;
pub mod libs;
pub mod ops;
pub mod plan;
pub mod select;
pub mod sgemm;

use half::{bf16, f16};

pub use cpu::CpuDevice;
pub use csr::CsrScratch;
pub use cuda::CudaDevice;
pub use host_kernels::{HostBuf, HostDelay, HostFault, HostKernels, HostOptions, HostStaging};
pub use ops::{Activation, Epilogue, FieldCols, Gemm, GemmPrecision, HalfMut, HalfRef, Op};
pub use lent::LentBuf;
pub use libs::CudaLib;
pub use select::{probe, probe_device, probe_nccl, probe_nvrtc, DeviceInfo, Placement};

/// The top bit of a hot-row cache source ([`Op::GatherSourced`]): the row is not cached but
/// staged, at the index in the low 31 bits.
pub const CACHE_MISS: u32 = 1 << 31;

use crate::dtype::Element;
use crate::tensor::Tensor;

/// Results of device operations.
pub type DeviceResult<T> = Result<T, DeviceError>;

/// Why a device (or the GPU path) cannot do what was asked.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum DeviceError {
    /// ringrec was built without `--features cuda`.
    #[error("this ringrec was built without CUDA support; rebuild with `cargo build --release --features cuda`, or use --device cpu")]
    NotBuilt,
    /// A CUDA library was not found, or what was found cannot be used ([`libs`]).
    #[error("{lib} is not available: {detail}; use --device cpu")]
    MissingLibrary {
        /// The library.
        lib: CudaLib,
        /// Where it was looked for and what to install, or what was found and why it
        /// cannot be used.
        detail: String,
    },
    /// The driver loaded but reports no usable device.
    #[error("no CUDA device available ({0}); use --device cpu")]
    NoDevice(String),
    /// Ranks of one machine would share a GPU (same PCI bus id).
    #[error(
        "ranks {ranks:?} on {host} would share GPU {bus_id}: NCCL cannot run two ranks of a job on one GPU; start at most as many ranks per host as GPUs (e.g. mpirun --map-by ppr:<GPUs>:node), give each rank its own GPU (CUDA_VISIBLE_DEVICES per rank, srun --gpus-per-task=1), or use --device cpu"
    )]
    SharedGpu {
        /// The machine.
        host: String,
        /// The GPU's PCI bus id.
        bus_id: String,
        /// World ranks that picked it.
        ranks: Vec<usize>,
    },
    /// A kernel source failed to compile; the compiler's log follows.
    #[error("NVRTC could not compile kernels/{name}.cu:\n{log}")]
    Kernel {
        /// The source's name.
        name: String,
        /// The compiler's log.
        log: String,
    },
    /// The driver refused the compiled kernels (an NVRTC newer than the driver, a GPU it
    /// does not know); says which NVRTC and driver, and what to install.
    #[error("{0}")]
    KernelLoad(Box<KernelLoadError>),
    /// The device cannot run its GEMMs at the precision asked for (`--dense-precision`).
    #[error("--dense-precision {precision} needs {needs}, which {device} lacks; use f32")]
    Precision {
        /// The precision asked for.
        precision: GemmPrecision,
        /// What it needs (`AVX-512 BF16 (avx512_bf16)`).
        needs: String,
        /// The device (`this CPU`).
        device: String,
    },
    /// A driver, cuBLAS or kernel call failed, or an operation was refused.
    #[error("{what} failed: {detail}")]
    Call {
        /// What was being done.
        what: String,
        /// The library's error, or why it was refused.
        detail: String,
    },
}

/// The driver refused a module NVRTC compiled ([`DeviceError::KernelLoad`]).
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("the driver could not load kernels/{name}.cu ({target} from NVRTC {nvrtc}; driver for CUDA {driver}): {error}. {advice}")]
pub struct KernelLoadError {
    /// The source's name.
    pub name: String,
    /// What NVRTC produced (`SASS for sm_90`, `PTX for compute_90`).
    pub target: String,
    /// NVRTC's version and file.
    pub nvrtc: String,
    /// The driver's CUDA version and file.
    pub driver: String,
    /// The driver's error.
    pub error: String,
    /// What to do.
    pub advice: String,
}

impl DeviceError {
    /// A failed call, from any of the libraries' error types.
    pub fn call(what: impl Into<String>, e: impl std::fmt::Debug) -> DeviceError {
        DeviceError::Call { what: what.into(), detail: format!("{e:?}") }
    }
    /// A refused request (`detail` says why and what to do).
    pub fn refused(what: impl Into<String>, detail: impl Into<String>) -> DeviceError {
        DeviceError::Call { what: what.into(), detail: detail.into() }
    }
}

/// What a GPU build needs of an element type to hold it in device memory (cudarc's traits);
/// nothing without the `cuda` feature.
#[cfg(feature = "cuda")]
pub trait CudaRepr: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits {}
#[cfg(feature = "cuda")]
impl<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits> CudaRepr for T {}
/// What a GPU build needs of an element type (nothing without the `cuda` feature).
#[cfg(not(feature = "cuda"))]
pub trait CudaRepr {}
#[cfg(not(feature = "cuda"))]
impl<T> CudaRepr for T {}

/// An element type device memory holds.
pub trait Scalar: bytemuck::Pod + Send + Sync + std::fmt::Debug + CudaRepr + 'static {}
impl Scalar for f32 {}
impl Scalar for f64 {}
impl Scalar for u32 {}
impl Scalar for i32 {}
impl Scalar for i64 {}
impl Scalar for u8 {}
impl Scalar for f16 {}
impl Scalar for bf16 {}

/// A half-precision dtype the cast kernels convert f32 to and from.
pub trait Half: Scalar + Element {
    /// The nearest value (ties to even), as the cast kernels round.
    fn from_f32(v: f32) -> Self;
    /// The value, widened exactly.
    fn to_f32(self) -> f32;
    /// `b` as a cast destination.
    fn as_mut<D: Device>(b: &mut D::Buf<Self>) -> HalfMut<'_, D>;
    /// `b` as a cast source.
    fn as_ref<D: Device>(b: &D::Buf<Self>) -> HalfRef<'_, D>;
}
impl Half for f16 {
    fn from_f32(v: f32) -> f16 {
        f16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn as_mut<D: Device>(b: &mut D::Buf<f16>) -> HalfMut<'_, D> {
        HalfMut::F16(b)
    }
    fn as_ref<D: Device>(b: &D::Buf<f16>) -> HalfRef<'_, D> {
        HalfRef::F16(b)
    }
}
impl Half for bf16 {
    fn from_f32(v: f32) -> bf16 {
        bf16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn as_mut<D: Device>(b: &mut D::Buf<bf16>) -> HalfMut<'_, D> {
        HalfMut::Bf16(b)
    }
    fn as_ref<D: Device>(b: &D::Buf<bf16>) -> HalfRef<'_, D> {
        HalfRef::Bf16(b)
    }
}

/// Which way a staging buffer's copies go (a GPU allocates write-combined page-locked memory
/// for uploads, which the CPU writes fast but reads slowly, and plain page-locked memory for
/// downloads and for what the host reads back).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Host writes, device reads.
    ToDevice,
    /// Device writes (or the host reads back what it wrote).
    FromDevice,
}

/// A compute device: memory, copies, a GEMM and the kernels of [`Op`] (see the module docs).
/// Buffers are zero-initialised; a device's operations run in the order they are queued.
pub trait Device: Send + Sync + Sized + 'static {
    /// Device memory holding elements of `T`.
    type Buf<T: Scalar>: Send + Sync + 'static;
    /// Host memory for asynchronous copies (page-locked on a GPU).
    type Staging<T: Scalar>: Send + 'static;
    /// A point in this queue's work, timed when the queue reaches it ([`Device::mark`]): a
    /// CUDA event with timing, the moment a host-kernels queue's worker ran it, on the CPU
    /// the moment it was taken (its work runs on the host thread as it is called).
    type Mark: Send + 'static;

    /// The device, in words (model, ordinal).
    fn describe(&self) -> String;
    /// The device type's short name (`cpu`, `cuda`, `host-kernels`).
    fn kind(&self) -> &'static str;
    /// Bytes of device memory free now, where the device has memory of its own (a GPU);
    /// `None` for devices whose memory is the host's.
    fn free_memory(&self) -> Option<u64> {
        None
    }
    /// Another queue on the same device (a second stream on a GPU): work queued on it runs
    /// concurrently with this queue's, ordered by the buffers both touch. The engine moves
    /// gradients on a fork while backward continues on the original.
    fn fork(&self) -> DeviceResult<Self>;
    /// Scoring mode: `Some(rows)` makes each GEMM whose rows are the batch's rows compute
    /// in tiles of exactly `rows` rows (the last padded), so a row's result depends on that
    /// row alone, not on which rows share its batch or how many threads split it; `None`
    /// returns to the default cut (training). [`crate::model::DenseModel::predict`] sets it
    /// around its forward pass. Devices whose results do not follow the batch this way, or
    /// that promise nothing, ignore it (the default).
    fn set_row_tile(&self, _rows: Option<usize>) {}

    /// A zeroed buffer of `n` elements.
    fn alloc<T: Scalar>(&self, n: usize) -> DeviceResult<Self::Buf<T>>;
    /// Elements of a buffer.
    fn len<T: Scalar>(&self, b: &Self::Buf<T>) -> usize;
    /// A staging buffer of `n` elements.
    fn staging<T: Scalar>(&self, n: usize, dir: Direction) -> DeviceResult<Self::Staging<T>>;
    /// The staging buffer's memory, once every copy that uses it has finished.
    fn host<'a, T: Scalar>(&self, h: &'a mut Self::Staging<T>) -> DeviceResult<&'a mut [T]>;
    /// Starts moving the first `n` values of `src` to the start of `dst`. `src`'s contents
    /// are unspecified afterwards (the CPU device swaps the buffers) until written again.
    fn upload_unchecked<T: Scalar>(&self, src: &mut Self::Staging<T>, n: usize, dst: &mut Self::Buf<T>) -> DeviceResult<()>;
    /// Starts moving the first `n` values of `src` into `dst` (read it with
    /// [`Device::host`]). `src`'s contents are unspecified afterwards (the CPU device swaps
    /// the buffers) until written again.
    fn download_unchecked<T: Scalar>(&self, src: &mut Self::Buf<T>, n: usize, dst: &mut Self::Staging<T>) -> DeviceResult<()>;
    /// Copies `src` into `dst` from element `at`, and waits (parameters, checkpoints).
    fn write_unchecked<T: Scalar>(&self, src: &[T], dst: &mut Self::Buf<T>, at: usize) -> DeviceResult<()>;
    /// Copies `dst.len()` values of `src` from element `at` into `dst`, and waits.
    fn read_unchecked<T: Scalar>(&self, src: &Self::Buf<T>, at: usize, dst: &mut [T]) -> DeviceResult<()>;
    /// Queues a copy of `n` elements between device buffers.
    fn copy_unchecked<T: Scalar>(&self, src: (&Self::Buf<T>, usize), dst: (&mut Self::Buf<T>, usize), n: usize) -> DeviceResult<()>;
    /// Waits for everything queued on this queue.
    fn synchronize(&self) -> DeviceResult<()>;
    /// Queues a timed mark after the work queued so far (the training step's GPU-wait
    /// counter: a mark after a step's last work and one before the next step's first).
    fn mark(&self) -> DeviceResult<Self::Mark>;
    /// Seconds from the queue reaching `from` to it reaching `to` (a later mark of this
    /// queue); waits for `to`. With no work queued between them, the time the queue stood
    /// idle waiting for the host.
    fn seconds_between(&self, from: &Self::Mark, to: &Self::Mark) -> DeviceResult<f64>;
    /// The buffer's elements when the device's memory is the host's (CPU, host kernels), once
    /// every operation queued on it (on any queue) has run.
    fn host_memory<'a, T: Scalar>(&self, b: &'a mut Self::Buf<T>) -> Option<&'a mut [T]>;

    /// The precision of this queue's GEMMs (f32 until set).
    fn gemm_precision(&self) -> GemmPrecision;
    /// Runs this queue's later GEMMs (and its forks') at `p`; [`DeviceError::Precision`]
    /// when the device cannot, never a silent fallback.
    fn set_gemm_precision(&mut self, p: GemmPrecision) -> DeviceResult<()>;

    /// `c = op(a) op(b)` (row-major, see [`Gemm`]) at [`Device::gemm_precision`], then the
    /// epilogue. Called through
    /// [`Device::gemm`], which checks bounds.
    fn gemm_unchecked(&self, g: &Gemm, a: (&Self::Buf<f32>, usize), b: (&Self::Buf<f32>, usize), c: (&mut Self::Buf<f32>, usize), epi: Epilogue<'_, Self>) -> DeviceResult<()>;
    /// Runs `op`. Called through [`Device::exec`], which checks bounds.
    fn exec_unchecked(&self, op: Op<'_, Self>) -> DeviceResult<()>;

    /// The device's ordinal: the GPU's index among those this process sees
    /// (`CUDA_VISIBLE_DEVICES`), as DLPack's `device_id` names it; 0 for host devices.
    fn ordinal(&self) -> usize {
        0
    }
    /// A buffer over `n` elements of `T` at `address` in this device's memory that the device
    /// does not own (a framework's tensor lent through DLPack, [`lent::LentBuf`]); give it up
    /// with [`Device::forget_borrowed`], never by dropping it. Called through
    /// [`lent::LentBuf::new`], which checks the pointer, its alignment and the ordinal. The
    /// default refuses: the device cannot reduce memory it does not own.
    ///
    /// # Safety
    /// `address` holds `n` elements of `T` in this device's memory until the buffer is given
    /// up, and nothing else reads or writes them meanwhile.
    unsafe fn borrow_unchecked<T: Scalar>(&self, _address: usize, _n: usize) -> DeviceResult<Self::Buf<T>> {
        Err(DeviceError::refused("borrowing a tensor's memory", format!("a {} device reduces only its own buffers; copy the tensor into one", self.kind())))
    }
    /// The address of a buffer's first element in the device's memory, once the work queued
    /// on it has run: what DLPack hands a framework (an allgather's result); `None` where
    /// the device has none to hand.
    fn address<T: Scalar>(&self, _b: &mut Self::Buf<T>) -> Option<usize> {
        None
    }
    /// This queue's stream as a CUDA stream handle (DLPack's `stream` argument: the stream
    /// a producer makes wait for its work); `None` for devices without CUDA streams.
    fn stream_handle(&self) -> Option<usize> {
        None
    }
    /// Gives up a buffer made by [`Device::borrow_unchecked`] without freeing its memory,
    /// once the work queued on it has run.
    fn forget_borrowed<T: Scalar>(b: Self::Buf<T>) {
        std::mem::forget(b);
    }

    /// Lends a buffer to the engine as a tensor: host memory for the CPU device (the
    /// engine's host collectives reduce it in place), a [`crate::tensor::DeviceTensor`]
    /// elsewhere (the engine's device executor reduces it).
    fn lend<T: Scalar + Element>(&self, b: Self::Buf<T>) -> Tensor;
    /// Takes a buffer back from the engine tensor [`Device::lend`] made of it.
    fn take_back<T: Scalar + Element>(&self, t: Tensor) -> DeviceResult<Self::Buf<T>>;

    /// Checked [`Device::gemm_unchecked`].
    fn gemm(&self, g: &Gemm, a: (&Self::Buf<f32>, usize), b: (&Self::Buf<f32>, usize), c: (&mut Self::Buf<f32>, usize), epi: Epilogue<'_, Self>) -> DeviceResult<()> {
        let (na, nb, nc) = g.extents();
        fits("gemm: a", self.len(a.0), a.1 + na)?;
        fits("gemm: b", self.len(b.0), b.1 + nb)?;
        fits("gemm: c", self.len(c.0), c.1 + nc)?;
        epi.check(self, g, (self.len(c.0), c.1))?;
        self.gemm_unchecked(g, a, b, c, epi)
    }
    /// Checked [`Device::exec_unchecked`].
    fn exec(&self, op: Op<'_, Self>) -> DeviceResult<()> {
        op.check(self)?;
        self.exec_unchecked(op)
    }
    /// Checked [`Device::upload_unchecked`].
    fn upload<T: Scalar>(&self, src: &mut Self::Staging<T>, n: usize, dst: &mut Self::Buf<T>) -> DeviceResult<()> {
        fits("upload: source", self.host(src)?.len(), n)?;
        fits("upload: destination", self.len(dst), n)?;
        self.upload_unchecked(src, n, dst)
    }
    /// Checked [`Device::download_unchecked`].
    fn download<T: Scalar>(&self, src: &mut Self::Buf<T>, n: usize, dst: &mut Self::Staging<T>) -> DeviceResult<()> {
        fits("download: source", self.len(src), n)?;
        fits("download: destination", self.host(dst)?.len(), n)?;
        self.download_unchecked(src, n, dst)
    }
    /// Checked [`Device::write_unchecked`].
    fn write<T: Scalar>(&self, src: &[T], dst: &mut Self::Buf<T>, at: usize) -> DeviceResult<()> {
        fits("write", self.len(dst), at + src.len())?;
        self.write_unchecked(src, dst, at)
    }
    /// Checked [`Device::read_unchecked`].
    fn read<T: Scalar>(&self, src: &Self::Buf<T>, at: usize, dst: &mut [T]) -> DeviceResult<()> {
        fits("read", self.len(src), at + dst.len())?;
        self.read_unchecked(src, at, dst)
    }
    /// Checked [`Device::copy_unchecked`].
    fn copy<T: Scalar>(&self, src: (&Self::Buf<T>, usize), dst: (&mut Self::Buf<T>, usize), n: usize) -> DeviceResult<()> {
        fits("copy: source", self.len(src.0), src.1 + n)?;
        fits("copy: destination", self.len(dst.0), dst.1 + n)?;
        self.copy_unchecked(src, dst, n)
    }
    /// A buffer holding a copy of `v` (waits).
    fn buffer_from<T: Scalar>(&self, v: &[T]) -> DeviceResult<Self::Buf<T>> {
        let mut b = self.alloc(v.len())?;
        self.write(v, &mut b, 0)?;
        Ok(b)
    }
    /// The first `n` elements of `b`, copied to the host (waits).
    fn to_vec<T: Scalar>(&self, b: &Self::Buf<T>, n: usize) -> DeviceResult<Vec<T>> {
        let mut v = vec![T::zeroed(); n];
        self.read(b, 0, &mut v)?;
        Ok(v)
    }
}

/// The memory methods of a [`Device`] whose buffers and staging are `Vec<T>` in host
/// memory (the CPU device and the host-kernels device), inside its `impl Device`.
macro_rules! vec_memory {
    () => {
        fn alloc<T: Scalar>(&self, n: usize) -> DeviceResult<Vec<T>> {
            Ok(vec![T::zeroed(); n])
        }
        fn len<T: Scalar>(&self, b: &Vec<T>) -> usize {
            b.len()
        }
        fn staging<T: Scalar>(&self, n: usize, _dir: Direction) -> DeviceResult<Vec<T>> {
            self.alloc(n)
        }
        fn host<'a, T: Scalar>(&self, h: &'a mut Vec<T>) -> DeviceResult<&'a mut [T]> {
            Ok(h)
        }
        fn write_unchecked<T: Scalar>(&self, src: &[T], dst: &mut Vec<T>, at: usize) -> DeviceResult<()> {
            dst[at..at + src.len()].copy_from_slice(src);
            Ok(())
        }
        fn read_unchecked<T: Scalar>(&self, src: &Vec<T>, at: usize, dst: &mut [T]) -> DeviceResult<()> {
            dst.copy_from_slice(&src[at..at + dst.len()]);
            Ok(())
        }
        fn copy_unchecked<T: Scalar>(&self, src: (&Vec<T>, usize), dst: (&mut Vec<T>, usize), n: usize) -> DeviceResult<()> {
            dst.0[dst.1..dst.1 + n].copy_from_slice(&src.0[src.1..src.1 + n]);
            Ok(())
        }
        fn synchronize(&self) -> DeviceResult<()> {
            Ok(())
        }
        fn host_memory<'a, T: Scalar>(&self, b: &'a mut Vec<T>) -> Option<&'a mut [T]> {
            Some(b)
        }
    };
}
pub(crate) use vec_memory;

/// An error unless a buffer of `have` elements holds the `need` an operation touches.
pub fn fits(what: &str, have: usize, need: usize) -> DeviceResult<()> {
    if have < need {
        return Err(DeviceError::refused(what, format!("buffer of {have} elements, the launch needs {need} (a bug in ringrec: please report it)")));
    }
    Ok(())
}
