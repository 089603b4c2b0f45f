//! [`CudaDevice`]: the [`Device`] trait on an NVIDIA GPU through cudarc — a context on the
//! rank's GPU, one stream per queue, cuBLAS bound to it (TF32 off: FP32 SGEMM, so the GPU
//! path rounds like the CPU path up to summation order), the NVRTC-compiled kernels of
//! kernels/*.cu, and page-locked staging buffers for asynchronous copies.
//!
//! At [`crate::device::GemmPrecision::Bf16`] a GEMM first casts its two operands to bf16
//! into the queue's scratch buffers (the `f32_to_bf16` kernel of kernels/cast.cu, round to
//! nearest even) and calls `cublasGemmEx` with bf16 inputs, f32 output and
//! `CUBLAS_COMPUTE_32F` (tensor cores on compute capability 8.0 and newer, which it
//! requires).
//!
//! cudarc runs in multi-stream mode (every queue has its own stream: [`Device::fork`]
//! makes one for the engine), so each buffer records events on use and a stream that
//! touches a buffer waits for the other streams' pending work on it: a gradient handed to
//! the engine is not read before backward wrote it, and the optimizer does not read it
//! before the allreduce finished.
//!
//! Without the `cuda` feature `CudaDevice` is an uninhabited type: [`CudaDevice::new`]
//! returns [`super::DeviceError::NotBuilt`], and callers need no `#[cfg]`.

#[cfg(feature = "cuda")]
pub use imp::CudaDevice;

#[cfg(not(feature = "cuda"))]
pub use dummy::CudaDevice;

#[cfg(feature = "cuda")]
mod imp {
    use std::sync::{Arc, Mutex};

    use half::bf16;

    use cudarc::cublas::{CudaBlas, Gemm as _, GemmConfig};
    use cudarc::driver::{CudaContext, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, HostSlice, LaunchConfig, PinnedHostSlice, PushKernelArg};

    use crate::device::kernels::{Kernel, Kernels};
    use crate::device::ops::{launch, launch_epilogue, Epilogue, Gemm, GemmPrecision, HalfMut, KernelArg, LaunchKernels, Op};
    use crate::device::plan::row_major;
    use crate::device::{Device, DeviceError, DeviceResult, Direction, Scalar};
    use crate::dtype::Element;
    use crate::tensor::{DeviceTensor, Tensor};

    /// Threads per block of every launch; grids are capped and loop (grid-stride).
    const THREADS: u32 = 256;
    const MAX_BLOCKS: usize = 65_535;

    /// One GPU as a [`Device`] (see the module docs).
    pub struct CudaDevice {
        ctx: Arc<CudaContext>,
        stream: Arc<CudaStream>,
        blas: CudaBlas,
        kernels: Arc<Kernels>,
        name: String,
        precision: GemmPrecision,
        /// The bf16 copies of a bf16 GEMM's operands (a, b), grown as needed.
        half_operands: Mutex<Option<(CudaSlice<bf16>, CudaSlice<bf16>)>>,
    }

    fn call<E: std::fmt::Debug>(what: &str) -> impl FnOnce(E) -> DeviceError + '_ {
        move |e| DeviceError::call(what, e)
    }

    /// cuBLAS on `stream` with TF32 off (FP32 math).
    fn blas_on(stream: &Arc<CudaStream>) -> DeviceResult<CudaBlas> {
        let blas = CudaBlas::new(stream.clone()).map_err(call("creating the cuBLAS handle"))?;
        // SAFETY: the handle is live; FP32 math without TF32 tensor cores.
        unsafe { cudarc::cublas::sys::cublasSetMathMode(*blas.handle(), cudarc::cublas::sys::cublasMath_t::CUBLAS_DEFAULT_MATH) }.result().map_err(call("setting cuBLAS math mode"))?;
        Ok(blas)
    }

    impl CudaDevice {
        /// A context on GPU `ordinal`, its stream, cuBLAS and the compiled kernels. Checks
        /// the CUDA libraries are present first ([`crate::device::probe_device`]).
        pub fn new(ordinal: usize) -> Result<CudaDevice, DeviceError> {
            let info = crate::device::probe_device()?;
            if ordinal >= info.devices {
                return Err(DeviceError::NoDevice(format!("GPU {ordinal} asked for, {} visible", info.devices)));
            }
            let ctx = CudaContext::new(ordinal).map_err(call("creating a CUDA context"))?;
            let stream = ctx.new_stream().map_err(call("creating the compute stream"))?;
            let blas = blas_on(&stream)?;
            let kernels = Arc::new(Kernels::load(&ctx)?);
            let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
            Ok(CudaDevice { ctx, stream, blas, kernels, name, precision: GemmPrecision::F32, half_operands: Mutex::new(None) })
        }

        /// The PCI bus id of the GPU (`0000:3b:00.0`): what tells two ranks' GPUs apart
        /// whatever `CUDA_VISIBLE_DEVICES` each rank sees.
        pub fn pci_bus_id(&self) -> DeviceResult<String> {
            let mut buf = [0 as std::ffi::c_char; 64];
            // SAFETY: the buffer holds `len` bytes; the device handle comes from a live context.
            unsafe { cudarc::driver::sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, self.ctx.cu_device()) }.result().map_err(call("reading the GPU's PCI bus id"))?;
            // SAFETY: the driver wrote a NUL-terminated string into `buf`.
            Ok(unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
        }

        /// Errors cudarc recorded while ordering this context's streams (the event waits it
        /// queues when a buffer moves between streams report failures there, not to their
        /// caller).
        fn checked(&self) -> DeviceResult<()> {
            self.ctx.check_err().map_err(call("an earlier stream-ordering call (event record or wait)"))
        }

        /// The context.
        pub fn context(&self) -> &Arc<CudaContext> {
            &self.ctx
        }
        /// This queue's stream.
        pub fn stream(&self) -> &Arc<CudaStream> {
            &self.stream
        }

        fn pinned<T: Scalar>(&self, n: usize, dir: Direction) -> DeviceResult<PinnedHostSlice<T>> {
            // Write-combined memory is fast to write from the CPU and slow to read back.
            let flags = match dir {
                Direction::ToDevice => cudarc::driver::sys::CU_MEMHOSTALLOC_WRITECOMBINED,
                Direction::FromDevice => 0,
            };
            // SAFETY: the memory is uninitialised; every user writes before reading (the
            // model stages a batch before uploading it, downloads before reading).
            unsafe { self.ctx.alloc_pinned_with_flags::<T>(n.max(1), flags) }.map_err(|e| DeviceError::call(format!("allocating {n} elements of page-locked host memory"), e))
        }
    }

    impl Device for CudaDevice {
        type Buf<T: Scalar> = CudaSlice<T>;
        type Staging<T: Scalar> = PinnedHostSlice<T>;
        type Mark = cudarc::driver::CudaEvent;

        fn describe(&self) -> String {
            format!("{} (GPU {})", self.name, self.ctx.ordinal())
        }
        fn kind(&self) -> &'static str {
            "cuda"
        }
        fn free_memory(&self) -> Option<u64> {
            self.ctx.mem_get_info().ok().map(|(free, _)| free as u64)
        }
        fn fork(&self) -> DeviceResult<CudaDevice> {
            let stream = self.ctx.new_stream().map_err(call("creating a stream"))?;
            let blas = blas_on(&stream)?;
            Ok(CudaDevice { ctx: self.ctx.clone(), stream, blas, kernels: self.kernels.clone(), name: self.name.clone(), precision: self.precision, half_operands: Mutex::new(None) })
        }
        fn gemm_precision(&self) -> GemmPrecision {
            self.precision
        }
        fn set_gemm_precision(&mut self, p: GemmPrecision) -> DeviceResult<()> {
            if p == GemmPrecision::Bf16 {
                let (major, minor) = self.ctx.compute_capability().map_err(call("reading the GPU's compute capability"))?;
                if major < 8 {
                    return Err(DeviceError::Precision { precision: p, needs: "bf16 tensor cores (compute capability 8.0 or newer)".into(), device: format!("{} (compute capability {major}.{minor})", self.name) });
                }
            }
            self.precision = p;
            Ok(())
        }
        fn alloc<T: Scalar>(&self, n: usize) -> DeviceResult<CudaSlice<T>> {
            // One element at least: a zero-size allocation is not a valid device pointer.
            self.stream.alloc_zeros(n.max(1)).map_err(|e| DeviceError::call(format!("allocating {n} elements on {} (out of GPU memory? lower --batch)", self.name), e))
        }
        fn len<T: Scalar>(&self, b: &CudaSlice<T>) -> usize {
            b.len()
        }
        fn staging<T: Scalar>(&self, n: usize, dir: Direction) -> DeviceResult<PinnedHostSlice<T>> {
            self.pinned(n, dir)
        }
        fn host<'a, T: Scalar>(&self, h: &'a mut PinnedHostSlice<T>) -> DeviceResult<&'a mut [T]> {
            self.checked()?;
            h.as_mut_slice().map_err(call("waiting for a copy"))
        }
        fn upload_unchecked<T: Scalar>(&self, src: &mut PinnedHostSlice<T>, n: usize, dst: &mut CudaSlice<T>) -> DeviceResult<()> {
            if n == 0 {
                return Ok(());
            }
            let stream = &self.stream;
            // SAFETY: `src` is used on `stream` only; its event is recorded when `_rs` drops,
            // after the copy is queued, so the host waits for the copy before writing it again.
            let (host, _rs) = unsafe { src.stream_synced_slice(stream) };
            let (dptr, _rd) = dst.device_ptr_mut(stream);
            // SAFETY: n values fit both buffers (checked by Device::upload); ordered on `stream`.
            unsafe { cudarc::driver::result::memcpy_htod_async(dptr, &host[..n], stream.cu_stream()) }.map_err(call("copying to the GPU"))
        }
        fn download_unchecked<T: Scalar>(&self, src: &mut CudaSlice<T>, n: usize, dst: &mut PinnedHostSlice<T>) -> DeviceResult<()> {
            if n == 0 {
                return Ok(());
            }
            let stream = &self.stream;
            let (dptr, _rs) = src.device_ptr(stream);
            // SAFETY: `dst` is used on `stream` only; its event is recorded after the copy
            // is queued, so `host` waits for the copy before the host reads it.
            let (host, _rd) = unsafe { dst.stream_synced_mut_slice(stream) };
            // SAFETY: n values fit both buffers (checked by Device::download).
            unsafe { cudarc::driver::result::memcpy_dtoh_async(&mut host[..n], dptr, stream.cu_stream()) }.map_err(call("copying from the GPU"))
        }
        fn write_unchecked<T: Scalar>(&self, src: &[T], dst: &mut CudaSlice<T>, at: usize) -> DeviceResult<()> {
            if src.is_empty() {
                return Ok(());
            }
            let mut view = dst.slice_mut(at..at + src.len());
            self.stream.memcpy_htod(src, &mut view).map_err(call("copying to the GPU"))?;
            self.stream.synchronize().map_err(call("waiting for the GPU"))?;
            self.checked()
        }
        fn read_unchecked<T: Scalar>(&self, src: &CudaSlice<T>, at: usize, dst: &mut [T]) -> DeviceResult<()> {
            if dst.is_empty() {
                return Ok(());
            }
            let view = src.slice(at..at + dst.len());
            self.stream.memcpy_dtoh(&view, dst).map_err(call("copying from the GPU"))?;
            self.stream.synchronize().map_err(call("waiting for the GPU"))?;
            self.checked()
        }
        fn copy_unchecked<T: Scalar>(&self, src: (&CudaSlice<T>, usize), dst: (&mut CudaSlice<T>, usize), n: usize) -> DeviceResult<()> {
            if n == 0 {
                return Ok(());
            }
            let from = src.0.slice(src.1..src.1 + n);
            let mut to = dst.0.slice_mut(dst.1..dst.1 + n);
            self.stream.memcpy_dtod(&from, &mut to).map_err(call("copying on the GPU"))
        }
        fn synchronize(&self) -> DeviceResult<()> {
            self.stream.synchronize().map_err(call("waiting for the GPU"))?;
            self.checked()
        }
        fn mark(&self) -> DeviceResult<cudarc::driver::CudaEvent> {
            // Timing on (cudarc's default turns it off).
            self.stream.record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT)).map_err(call("recording a timed event"))
        }
        fn seconds_between(&self, from: &cudarc::driver::CudaEvent, to: &cudarc::driver::CudaEvent) -> DeviceResult<f64> {
            Ok(f64::from(from.elapsed_ms(to).map_err(call("timing two events"))?) / 1e3)
        }
        fn host_memory<'a, T: Scalar>(&self, _b: &'a mut CudaSlice<T>) -> Option<&'a mut [T]> {
            None
        }
        fn gemm_unchecked(&self, g: &Gemm, a: (&CudaSlice<f32>, usize), b: (&CudaSlice<f32>, usize), c: (&mut CudaSlice<f32>, usize), epi: Epilogue<'_, Self>) -> DeviceResult<()> {
            use cudarc::cublas::sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
            if g.m > 0 && g.n > 0 {
                // cuBLAS is column-major: the row-major product is called with the operands
                // swapped (plan::row_major).
                let p = row_major(g);
                let op = |t: bool| if t { CUBLAS_OP_T } else { CUBLAS_OP_N };
                let int = |v: usize| i32::try_from(v).map_err(|_| DeviceError::refused("gemm", format!("dimension {v} exceeds cuBLAS's int")));
                let cfg = GemmConfig { transa: op(p.trans_first), transb: op(p.trans_second), m: int(p.m)?, n: int(p.n)?, k: int(p.k)?, alpha: 1.0f32, lda: int(p.ld_first)?, ldb: int(p.ld_second)?, beta: 0.0f32, ldc: int(p.ld_c)? };
                if self.precision == GemmPrecision::Bf16 {
                    self.gemm_bf16(g, cfg, a, b, (&mut *c.0, c.1))?;
                    return launch_epilogue(self, g, b, c.0, c.1, epi);
                }
                let first: CudaView<'_, f32> = b.0.slice(b.1..);
                let second: CudaView<'_, f32> = a.0.slice(a.1..);
                let mut cv: CudaViewMut<'_, f32> = c.0.slice_mut(c.1..);
                // SAFETY: Device::gemm checked that each operand's extent fits its buffer past
                // its offset; the views carry their buffers' stream events.
                unsafe { self.blas.gemm(cfg, &first, &second, &mut cv) }.map_err(call("cuBLAS SGEMM"))?;
            }
            launch_epilogue(self, g, b, c.0, c.1, epi)
        }
        fn exec_unchecked(&self, op: Op<'_, Self>) -> DeviceResult<()> {
            launch(self, op)
        }
        fn ordinal(&self) -> usize {
            self.ctx.ordinal()
        }
        unsafe fn borrow_unchecked<T: Scalar>(&self, address: usize, n: usize) -> DeviceResult<CudaSlice<T>> {
            use cudarc::driver::sys::{cuPointerGetAttribute, CUpointer_attribute};
            let what = "borrowing a tensor's GPU memory";
            self.ctx.bind_to_thread().map_err(call("binding the CUDA context"))?;
            let mut ordinal: std::ffi::c_int = -1;
            // SAFETY: the attribute is an int written into `ordinal`; the driver checks the
            // pointer itself (an error for memory it does not know).
            let known = unsafe { cuPointerGetAttribute((&mut ordinal as *mut std::ffi::c_int).cast(), CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, address as u64) }.result();
            if let Err(e) = known {
                return Err(DeviceError::refused(what, format!("{address:#x} is not memory the CUDA driver knows ({e:?}): not a CUDA tensor of this process")));
            }
            if usize::try_from(ordinal).ok() != Some(self.ctx.ordinal()) {
                return Err(DeviceError::refused(what, format!("the memory at {address:#x} is on GPU {ordinal}, this rank's engine on GPU {}; move the tensor to cuda:{} (torch.cuda.set_device(local_rank) before making it)", self.ctx.ordinal(), self.ctx.ordinal())));
            }
            // SAFETY: the caller's contract: `n` elements of `T` of this GPU's memory at
            // `address` until the slice is given up by `forget_borrowed` (`leak`: not freed).
            Ok(unsafe { self.stream.upgrade_device_ptr(address as u64, n) })
        }
        fn address<T: Scalar>(&self, b: &mut CudaSlice<T>) -> Option<usize> {
            b.stream().synchronize().ok()?;
            let (ptr, _read) = b.device_ptr(&self.stream);
            Some(ptr as usize)
        }
        fn stream_handle(&self) -> Option<usize> {
            Some(self.stream.cu_stream() as usize)
        }
        fn forget_borrowed<T: Scalar>(b: CudaSlice<T>) {
            // `leak` makes its stream wait for the work on the slice and frees nothing.
            let _ = b.leak();
        }
        fn lend<T: Scalar + Element>(&self, b: CudaSlice<T>) -> Tensor {
            let n = b.len();
            Tensor::on_device(DeviceTensor::new(b, T::DTYPE, n, self.kind()))
        }
        fn take_back<T: Scalar + Element>(&self, t: Tensor) -> DeviceResult<CudaSlice<T>> {
            let what = || DeviceError::refused("taking a tensor back", format!("not a {} buffer of a GPU", T::DTYPE));
            t.into_device().map_err(|_| what())?.into_buffer::<CudaSlice<T>>().map_err(|_| what())
        }
    }

    impl CudaDevice {
        /// The GEMM `cfg` (the column-major call of `g`) at bf16: both operands cast into
        /// the queue's scratch, then `cublasGemmEx` (bf16 in, f32 out, f32 compute).
        fn gemm_bf16(&self, g: &Gemm, cfg: GemmConfig<f32>, a: (&CudaSlice<f32>, usize), b: (&CudaSlice<f32>, usize), c: (&mut CudaSlice<f32>, usize)) -> DeviceResult<()> {
            use cudarc::cublas::sys::{cublasComputeType_t::CUBLAS_COMPUTE_32F, cublasGemmAlgo_t, cudaDataType_t};
            let (na, nb, _) = g.extents();
            let mut scratch = self.half_operands.lock().unwrap_or_else(|p| p.into_inner());
            if scratch.as_ref().is_none_or(|(ha, hb)| ha.len() < na || hb.len() < nb) {
                let (ha, hb) = scratch.as_ref().map_or((0, 0), |(ha, hb)| (ha.len(), hb.len()));
                *scratch = Some((self.alloc(na.max(ha))?, self.alloc(nb.max(hb))?));
            }
            let Some((ha, hb)) = scratch.as_mut() else {
                return Err(DeviceError::refused("bf16 gemm", "no scratch for the operands (a bug in ringrec: please report it)"));
            };
            launch(self, Op::ToHalf { src: a.0, src_at: a.1, dst: HalfMut::Bf16(ha), dst_at: 0, n: na })?;
            launch(self, Op::ToHalf { src: b.0, src_at: b.1, dst: HalfMut::Bf16(hb), dst_at: 0, n: nb })?;
            let (alpha, beta) = (1.0f32, 0.0f32);
            let mut cv: CudaViewMut<'_, f32> = c.0.slice_mut(c.1..);
            // cuBLAS's first operand is b, its second a (plan::row_major).
            let (first, _rf) = hb.device_ptr(&self.stream);
            let (second, _rs) = ha.device_ptr(&self.stream);
            let (out, _rc) = cv.device_ptr_mut(&self.stream);
            // SAFETY: the scratch buffers hold the operands' extents (grown above), c's extent
            // fits past its offset (Device::gemm checked it); the pointers stay valid while
            // their guards live, and the casts above are ordered before the GEMM on the stream.
            unsafe {
                cudarc::cublas::result::gemm_ex(
                    *self.blas.handle(),
                    cfg.transa,
                    cfg.transb,
                    cfg.m,
                    cfg.n,
                    cfg.k,
                    (&alpha) as *const f32 as *const _,
                    first as *const _,
                    cudaDataType_t::CUDA_R_16BF,
                    cfg.lda,
                    second as *const _,
                    cudaDataType_t::CUDA_R_16BF,
                    cfg.ldb,
                    (&beta) as *const f32 as *const _,
                    out as *mut _,
                    cudaDataType_t::CUDA_R_32F,
                    cfg.ldc,
                    CUBLAS_COMPUTE_32F,
                    cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            }
            .map_err(call("cuBLAS bf16 GEMM (cublasGemmEx)"))
        }
    }

    impl LaunchKernels for CudaDevice {
        fn launch(&self, kernel: Kernel, work: usize, args: &mut [KernelArg<'_, Self>]) -> DeviceResult<()> {
            if work == 0 {
                return Ok(());
            }
            enum Held<'v> {
                In(CudaView<'v, f32>),
                Out(CudaViewMut<'v, f32>),
                InU32(CudaView<'v, u32>),
                OutU32(CudaViewMut<'v, u32>),
                InF16(CudaView<'v, half::f16>),
                OutF16(CudaViewMut<'v, half::f16>),
                InBf16(CudaView<'v, half::bf16>),
                OutBf16(CudaViewMut<'v, half::bf16>),
                I32(i32),
                I64(i64),
                F32(f32),
            }
            let mut held: Vec<Held<'_>> = args
                .iter_mut()
                .map(|a| match a {
                    KernelArg::In(b, off) => Held::In(b.slice(*off..)),
                    KernelArg::Out(b, off) => Held::Out(b.slice_mut(*off..)),
                    KernelArg::InU32(b) => Held::InU32(b.slice(..)),
                    KernelArg::OutU32(b, off) => Held::OutU32(b.slice_mut(*off..)),
                    KernelArg::InF16(b, off) => Held::InF16(b.slice(*off..)),
                    KernelArg::OutF16(b, off) => Held::OutF16(b.slice_mut(*off..)),
                    KernelArg::InBf16(b, off) => Held::InBf16(b.slice(*off..)),
                    KernelArg::OutBf16(b, off) => Held::OutBf16(b.slice_mut(*off..)),
                    KernelArg::I32(v) => Held::I32(*v),
                    KernelArg::I64(v) => Held::I64(*v),
                    KernelArg::F32(v) => Held::F32(*v),
                })
                .collect();
            let f = self.kernels.get(kernel)?;
            let mut builder = self.stream.launch_builder(f);
            for h in held.iter_mut() {
                match h {
                    Held::In(v) => builder.arg(&*v),
                    Held::Out(v) => builder.arg(v),
                    Held::InU32(v) => builder.arg(&*v),
                    Held::OutU32(v) => builder.arg(v),
                    Held::InF16(v) => builder.arg(&*v),
                    Held::OutF16(v) => builder.arg(v),
                    Held::InBf16(v) => builder.arg(&*v),
                    Held::OutBf16(v) => builder.arg(v),
                    Held::I32(v) => builder.arg(&*v),
                    Held::I64(v) => builder.arg(&*v),
                    Held::F32(v) => builder.arg(&*v),
                };
            }
            let blocks = work.div_ceil(THREADS as usize).clamp(1, MAX_BLOCKS) as u32;
            let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: the arguments follow the kernel's parameter list (ops::launch builds them
            // from its signature), every buffer was checked to be large enough for `work`
            // (Op::check), and the views keep their buffers borrowed until the launch is
            // queued (with their stream events recorded).
            unsafe { builder.launch(cfg) }.map_err(|e| DeviceError::call(format!("launching kernel {}", kernel.name()), e))?;
            Ok(())
        }
    }
}

#[cfg(not(feature = "cuda"))]
mod dummy {
    use std::convert::Infallible;

    use crate::device::ops::{Epilogue, Gemm, GemmPrecision, Op};
    use crate::device::{Device, DeviceError, DeviceResult, Direction, Scalar};
    use crate::dtype::Element;
    use crate::tensor::Tensor;

    /// Stands in for the GPU device in builds without the `cuda` feature: it cannot be
    /// constructed ([`CudaDevice::new`] says how to get the GPU path), so its methods can
    /// never run.
    pub enum CudaDevice {}

    impl CudaDevice {
        /// Always [`DeviceError::NotBuilt`].
        pub fn new(_ordinal: usize) -> Result<CudaDevice, DeviceError> {
            Err(DeviceError::NotBuilt)
        }
        /// Unreachable: no `CudaDevice` exists without the feature.
        pub fn pci_bus_id(&self) -> DeviceResult<String> {
            match *self {}
        }
    }

    impl Device for CudaDevice {
        type Buf<T: Scalar> = Infallible;
        type Staging<T: Scalar> = Infallible;
        type Mark = Infallible;

        fn describe(&self) -> String {
            match *self {}
        }
        fn kind(&self) -> &'static str {
            match *self {}
        }
        fn fork(&self) -> DeviceResult<CudaDevice> {
            match *self {}
        }
        fn alloc<T: Scalar>(&self, _: usize) -> DeviceResult<Infallible> {
            match *self {}
        }
        fn len<T: Scalar>(&self, _: &Infallible) -> usize {
            match *self {}
        }
        fn staging<T: Scalar>(&self, _: usize, _: Direction) -> DeviceResult<Infallible> {
            match *self {}
        }
        fn host<'a, T: Scalar>(&self, _: &'a mut Infallible) -> DeviceResult<&'a mut [T]> {
            match *self {}
        }
        fn upload_unchecked<T: Scalar>(&self, _: &mut Infallible, _: usize, _: &mut Infallible) -> DeviceResult<()> {
            match *self {}
        }
        fn download_unchecked<T: Scalar>(&self, _: &mut Infallible, _: usize, _: &mut Infallible) -> DeviceResult<()> {
            match *self {}
        }
        fn write_unchecked<T: Scalar>(&self, _: &[T], _: &mut Infallible, _: usize) -> DeviceResult<()> {
            match *self {}
        }
        fn read_unchecked<T: Scalar>(&self, _: &Infallible, _: usize, _: &mut [T]) -> DeviceResult<()> {
            match *self {}
        }
        fn copy_unchecked<T: Scalar>(&self, _: (&Infallible, usize), _: (&mut Infallible, usize), _: usize) -> DeviceResult<()> {
            match *self {}
        }
        fn synchronize(&self) -> DeviceResult<()> {
            match *self {}
        }
        fn mark(&self) -> DeviceResult<Infallible> {
            match *self {}
        }
        fn seconds_between(&self, _: &Infallible, _: &Infallible) -> DeviceResult<f64> {
            match *self {}
        }
        fn host_memory<'a, T: Scalar>(&self, _: &'a mut Infallible) -> Option<&'a mut [T]> {
            match *self {}
        }
        fn gemm_unchecked(&self, _: &Gemm, _: (&Infallible, usize), _: (&Infallible, usize), _: (&mut Infallible, usize), _: Epilogue<'_, Self>) -> DeviceResult<()> {
            match *self {}
        }
        fn exec_unchecked(&self, _: Op<'_, Self>) -> DeviceResult<()> {
            match *self {}
        }
        fn gemm_precision(&self) -> GemmPrecision {
            match *self {}
        }
        fn set_gemm_precision(&mut self, _: GemmPrecision) -> DeviceResult<()> {
            match *self {}
        }
        fn lend<T: Scalar + Element>(&self, _: Infallible) -> Tensor {
            match *self {}
        }
        fn take_back<T: Scalar + Element>(&self, _: Tensor) -> DeviceResult<Infallible> {
            match *self {}
        }
    }
}
