//! [`CudaDevice`]: the [`Device`] trait on an NVIDIA GPU through cudarc — a context on the
//! rank's GPU, one compute stream, cuBLAS bound to it (TF32 off: FP32 SGEMM, so the GPU
//! path rounds like the CPU path up to summation order), the NVRTC-compiled kernels, and
//! page-locked staging buffers for asynchronous copies.
//!
//! cudarc runs in multi-stream mode (the compute stream and NCCL's stream are both
//! created with `new_stream`), so each buffer records events on use and a stream that
//! touches a buffer waits for the other stream's pending work on it: the gradient a layer
//! hands to NCCL is not read before backward wrote it, and the optimizer does not read it
//! before the allreduce finished.
//!
//! Without the `cuda` feature `CudaDevice` is an uninhabited type: [`CudaDevice::new`]
//! returns [`CudaError::NotBuilt`], and callers need no `#[cfg]`.

#[cfg(feature = "cuda")]
pub use imp::CudaDevice;

#[cfg(not(feature = "cuda"))]
pub use dummy::CudaDevice;

#[cfg(feature = "cuda")]
mod imp {
    use std::sync::Arc;

    use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
    use cudarc::driver::{CudaContext, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, HostSlice, LaunchConfig, PinnedHostSlice, PushKernelArg};

    use crate::cuda::device::{Device, DeviceResult, Direction, KernelArg};
    use crate::cuda::kernels::{Kernel, Kernels};
    use crate::cuda::plan::ColumnMajorGemm;
    use crate::cuda::CudaError;

    /// Threads per block of every launch; grids are capped and loop (grid-stride).
    const THREADS: u32 = 256;
    const MAX_BLOCKS: usize = 65_535;

    /// One GPU as a [`Device`] (see the module docs).
    pub struct CudaDevice {
        ctx: Arc<CudaContext>,
        stream: Arc<CudaStream>,
        blas: CudaBlas,
        kernels: Kernels,
        name: String,
    }

    fn call<E: std::fmt::Debug>(what: &str) -> impl FnOnce(E) -> CudaError + '_ {
        move |e| CudaError::call(what, e)
    }

    impl CudaDevice {
        /// A context on GPU `ordinal`, its compute stream, cuBLAS and the compiled kernels.
        /// Checks the CUDA libraries are present first ([`crate::cuda::probe_device`]).
        pub fn new(ordinal: usize) -> Result<CudaDevice, CudaError> {
            let info = crate::cuda::probe_device()?;
            if ordinal >= info.devices {
                return Err(CudaError::NoDevice(format!("GPU {ordinal} asked for, {} visible", info.devices)));
            }
            let ctx = CudaContext::new(ordinal).map_err(call("creating a CUDA context"))?;
            let stream = ctx.new_stream().map_err(call("creating the compute stream"))?;
            let blas = CudaBlas::new(stream.clone()).map_err(call("creating the cuBLAS handle"))?;
            // SAFETY: the handle is live; FP32 math without TF32 tensor cores.
            unsafe { cudarc::cublas::sys::cublasSetMathMode(*blas.handle(), cudarc::cublas::sys::cublasMath_t::CUBLAS_DEFAULT_MATH) }
                .result()
                .map_err(call("setting cuBLAS math mode"))?;
            let kernels = Kernels::load(&ctx)?;
            let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
            Ok(CudaDevice { ctx, stream, blas, kernels, name })
        }

        /// The context.
        pub fn context(&self) -> &Arc<CudaContext> {
            &self.ctx
        }
        /// The compute stream.
        pub fn stream(&self) -> &Arc<CudaStream> {
            &self.stream
        }

        fn alloc<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(&self, n: usize) -> DeviceResult<CudaSlice<T>> {
            if n == 0 {
                return self.stream.null().map_err(call("allocating an empty buffer"));
            }
            self.stream.alloc_zeros(n).map_err(|e| CudaError::call(format!("allocating {n} elements on {} (out of GPU memory? lower --batch)", self.name), e))
        }

        fn pinned<T: cudarc::driver::DeviceRepr>(&self, n: usize, dir: Direction) -> DeviceResult<PinnedHostSlice<T>> {
            // Write-combined memory is fast to write from the CPU and slow to read back.
            let flags = match dir {
                Direction::ToDevice => cudarc::driver::sys::CU_MEMHOSTALLOC_WRITECOMBINED,
                Direction::FromDevice => 0,
            };
            // SAFETY: the memory is uninitialised; every user writes before reading (the
            // model stages a batch before uploading it, downloads before reading).
            unsafe { self.ctx.alloc_pinned_with_flags::<T>(n.max(1), flags) }.map_err(|e| CudaError::call(format!("allocating {n} elements of page-locked host memory"), e))
        }
    }

    fn host_len<T>(h: &PinnedHostSlice<T>, n: usize, what: &str) -> DeviceResult<()> {
        if h.len() < n {
            return Err(CudaError::Call { what: what.into(), detail: format!("{n} values from a staging buffer of {}", h.len()) });
        }
        Ok(())
    }

    fn upload<T: cudarc::driver::DeviceRepr>(stream: &Arc<CudaStream>, src: &PinnedHostSlice<T>, n: usize, dst: &mut CudaSlice<T>) -> DeviceResult<()> {
        host_len(src, n, "upload")?;
        if dst.len() < n {
            return Err(CudaError::Call { what: "upload".into(), detail: format!("{n} values into a buffer of {}", dst.len()) });
        }
        if n == 0 {
            return Ok(());
        }
        // SAFETY: `src` is used on `stream` only; its event is recorded when `_rs` drops,
        // after the copy is queued, so the host waits for the copy before writing it again.
        let (host, _rs) = unsafe { src.stream_synced_slice(stream) };
        let (dptr, _rd) = dst.device_ptr_mut(stream);
        // SAFETY: n values fit both buffers (checked above); the copy is ordered on `stream`.
        unsafe { cudarc::driver::result::memcpy_htod_async(dptr, &host[..n], stream.cu_stream()) }.map_err(call("copying to the GPU"))
    }

    impl Device for CudaDevice {
        type F32 = CudaSlice<f32>;
        type U32 = CudaSlice<u32>;
        type U16 = CudaSlice<u16>;
        type HostF32 = PinnedHostSlice<f32>;
        type HostU32 = PinnedHostSlice<u32>;

        fn describe(&self) -> String {
            format!("{} (GPU {})", self.name, self.ctx.ordinal())
        }
        fn zeros_f32(&self, n: usize) -> DeviceResult<CudaSlice<f32>> {
            self.alloc(n)
        }
        fn zeros_u32(&self, n: usize) -> DeviceResult<CudaSlice<u32>> {
            self.alloc(n)
        }
        fn zeros_u16(&self, n: usize) -> DeviceResult<CudaSlice<u16>> {
            self.alloc(n)
        }
        fn len_u16(&self, b: &CudaSlice<u16>) -> usize {
            b.len()
        }
        fn read_u16(&self, src: &CudaSlice<u16>, dst: &mut [u16]) -> DeviceResult<()> {
            if dst.is_empty() {
                return Ok(());
            }
            let view = src.try_slice(..dst.len()).ok_or_else(|| CudaError::Call { what: "read".into(), detail: format!("{} values of a buffer of {}", dst.len(), src.len()) })?;
            self.stream.memcpy_dtoh(&view, dst).map_err(call("copying from the GPU"))?;
            self.stream.synchronize().map_err(call("waiting for the GPU"))
        }
        fn len_f32(&self, b: &CudaSlice<f32>) -> usize {
            b.len()
        }
        fn len_u32(&self, b: &CudaSlice<u32>) -> usize {
            b.len()
        }
        fn staging_f32(&self, n: usize, dir: Direction) -> DeviceResult<PinnedHostSlice<f32>> {
            self.pinned(n, dir)
        }
        fn staging_u32(&self, n: usize) -> DeviceResult<PinnedHostSlice<u32>> {
            // Not write-combined: the host reads the index lists back (DeviceMlp builds the
            // per-key CSR lists from `inverse` in place).
            self.pinned(n, Direction::FromDevice)
        }
        fn host_f32<'a>(&self, h: &'a mut PinnedHostSlice<f32>) -> DeviceResult<&'a mut [f32]> {
            h.as_mut_slice().map_err(call("waiting for a copy"))
        }
        fn host_u32<'a>(&self, h: &'a mut PinnedHostSlice<u32>) -> DeviceResult<&'a mut [u32]> {
            h.as_mut_slice().map_err(call("waiting for a copy"))
        }
        fn upload_f32(&self, src: &PinnedHostSlice<f32>, n: usize, dst: &mut CudaSlice<f32>) -> DeviceResult<()> {
            upload(&self.stream, src, n, dst)
        }
        fn upload_u32(&self, src: &PinnedHostSlice<u32>, n: usize, dst: &mut CudaSlice<u32>) -> DeviceResult<()> {
            upload(&self.stream, src, n, dst)
        }
        fn download_f32(&self, src: &CudaSlice<f32>, n: usize, dst: &mut PinnedHostSlice<f32>) -> DeviceResult<()> {
            host_len(dst, n, "download")?;
            if src.len() < n {
                return Err(CudaError::Call { what: "download".into(), detail: format!("{n} values from a buffer of {}", src.len()) });
            }
            if n == 0 {
                return Ok(());
            }
            let stream = &self.stream;
            let (dptr, _rs) = src.device_ptr(stream);
            // SAFETY: `dst` is used on `stream` only; its event is recorded after the copy
            // is queued, so `host_f32` waits for the copy before the host reads it.
            let (host, _rd) = unsafe { dst.stream_synced_mut_slice(stream) };
            // SAFETY: n values fit both buffers (checked above).
            unsafe { cudarc::driver::result::memcpy_dtoh_async(&mut host[..n], dptr, stream.cu_stream()) }.map_err(call("copying from the GPU"))
        }
        fn write_f32(&self, src: &[f32], dst: &mut CudaSlice<f32>, offset: usize) -> DeviceResult<()> {
            if src.is_empty() {
                return Ok(());
            }
            let len = dst.len();
            let mut view = dst.try_slice_mut(offset..offset + src.len()).ok_or_else(|| CudaError::Call { what: "write".into(), detail: format!("{} values at {offset} of a buffer of {len}", src.len()) })?;
            self.stream.memcpy_htod(src, &mut view).map_err(call("copying to the GPU"))?;
            self.stream.synchronize().map_err(call("waiting for the GPU"))
        }
        fn read_f32(&self, src: &CudaSlice<f32>, offset: usize, dst: &mut [f32]) -> DeviceResult<()> {
            if dst.is_empty() {
                return Ok(());
            }
            let view = src.try_slice(offset..offset + dst.len()).ok_or_else(|| CudaError::Call { what: "read".into(), detail: format!("{} values at {offset} of a buffer of {}", dst.len(), src.len()) })?;
            self.stream.memcpy_dtoh(&view, dst).map_err(call("copying from the GPU"))?;
            self.stream.synchronize().map_err(call("waiting for the GPU"))
        }
        fn gemm_unchecked(&self, g: &ColumnMajorGemm, first: (&CudaSlice<f32>, usize), second: (&CudaSlice<f32>, usize), c: (&mut CudaSlice<f32>, usize)) -> DeviceResult<()> {
            use cudarc::cublas::sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
            let op = |t: bool| if t { CUBLAS_OP_T } else { CUBLAS_OP_N };
            let int = |v: usize| i32::try_from(v).map_err(|_| CudaError::Call { what: "gemm".into(), detail: format!("dimension {v} exceeds cuBLAS's int") });
            let cfg = GemmConfig { transa: op(g.trans_first), transb: op(g.trans_second), m: int(g.m)?, n: int(g.n)?, k: int(g.k)?, alpha: 1.0f32, lda: int(g.ld_first)?, ldb: int(g.ld_second)?, beta: 0.0f32, ldc: int(g.ld_c)? };
            let a: CudaView<'_, f32> = first.0.slice(first.1..);
            let b: CudaView<'_, f32> = second.0.slice(second.1..);
            let mut cv: CudaViewMut<'_, f32> = c.0.slice_mut(c.1..);
            // SAFETY: Device::gemm checked that each operand's extent fits its buffer past
            // its offset; the views carry their buffers' stream events.
            unsafe { self.blas.gemm(cfg, &a, &b, &mut cv) }.map_err(call("cuBLAS SGEMM"))
        }
        fn launch(&self, kernel: Kernel, work: usize, args: &mut [KernelArg<'_, Self>]) -> DeviceResult<()> {
            if work == 0 {
                return Ok(());
            }
            enum Held<'v> {
                In(CudaView<'v, f32>),
                Out(CudaViewMut<'v, f32>),
                InU32(CudaView<'v, u32>),
                InU16(CudaView<'v, u16>),
                OutU16(CudaViewMut<'v, u16>),
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
                    KernelArg::InU16(b) => Held::InU16(b.slice(..)),
                    KernelArg::OutU16(b) => Held::OutU16(b.slice_mut(..)),
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
                    Held::InU16(v) => builder.arg(&*v),
                    Held::OutU16(v) => builder.arg(v),
                    Held::I32(v) => builder.arg(&*v),
                    Held::I64(v) => builder.arg(&*v),
                    Held::F32(v) => builder.arg(&*v),
                };
            }
            let blocks = work.div_ceil(THREADS as usize).clamp(1, MAX_BLOCKS) as u32;
            let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: the arguments follow the kernel's parameter list (built by the typed
            // Device methods from its signature), every buffer was checked to be large
            // enough for `work`, and the views keep their buffers borrowed until the launch
            // is queued (with their stream events recorded).
            unsafe { builder.launch(cfg) }.map_err(|e| CudaError::call(format!("launching kernel {}", kernel.name()), e))?;
            Ok(())
        }
        fn synchronize(&self) -> DeviceResult<()> {
            self.stream.synchronize().map_err(call("waiting for the GPU"))
        }
    }
}

#[cfg(not(feature = "cuda"))]
mod dummy {
    use crate::cuda::device::{Device, DeviceResult, Direction, KernelArg};
    use crate::cuda::kernels::Kernel;
    use crate::cuda::plan::ColumnMajorGemm;
    use crate::cuda::CudaError;

    /// Stands in for the GPU device in builds without the `cuda` feature: it cannot be
    /// constructed ([`CudaDevice::new`] says how to get the GPU path), so its methods can
    /// never run.
    pub enum CudaDevice {}

    impl CudaDevice {
        /// Always [`CudaError::NotBuilt`].
        pub fn new(_ordinal: usize) -> Result<CudaDevice, CudaError> {
            Err(CudaError::NotBuilt)
        }
    }

    impl Device for CudaDevice {
        type F32 = ();
        type U32 = ();
        type U16 = ();
        type HostF32 = ();
        type HostU32 = ();
        fn describe(&self) -> String {
            match *self {}
        }
        fn zeros_f32(&self, _: usize) -> DeviceResult<()> {
            match *self {}
        }
        fn zeros_u32(&self, _: usize) -> DeviceResult<()> {
            match *self {}
        }
        fn zeros_u16(&self, _: usize) -> DeviceResult<()> {
            match *self {}
        }
        fn len_u16(&self, _: &()) -> usize {
            match *self {}
        }
        fn read_u16(&self, _: &(), _: &mut [u16]) -> DeviceResult<()> {
            match *self {}
        }
        fn len_f32(&self, _: &()) -> usize {
            match *self {}
        }
        fn len_u32(&self, _: &()) -> usize {
            match *self {}
        }
        fn staging_f32(&self, _: usize, _: Direction) -> DeviceResult<()> {
            match *self {}
        }
        fn staging_u32(&self, _: usize) -> DeviceResult<()> {
            match *self {}
        }
        fn host_f32<'a>(&self, _: &'a mut ()) -> DeviceResult<&'a mut [f32]> {
            match *self {}
        }
        fn host_u32<'a>(&self, _: &'a mut ()) -> DeviceResult<&'a mut [u32]> {
            match *self {}
        }
        fn upload_f32(&self, _: &(), _: usize, _: &mut ()) -> DeviceResult<()> {
            match *self {}
        }
        fn upload_u32(&self, _: &(), _: usize, _: &mut ()) -> DeviceResult<()> {
            match *self {}
        }
        fn download_f32(&self, _: &(), _: usize, _: &mut ()) -> DeviceResult<()> {
            match *self {}
        }
        fn write_f32(&self, _: &[f32], _: &mut (), _: usize) -> DeviceResult<()> {
            match *self {}
        }
        fn read_f32(&self, _: &(), _: usize, _: &mut [f32]) -> DeviceResult<()> {
            match *self {}
        }
        fn gemm_unchecked(&self, _: &ColumnMajorGemm, _: (&(), usize), _: (&(), usize), _: (&mut (), usize)) -> DeviceResult<()> {
            match *self {}
        }
        fn launch(&self, _: Kernel, _: usize, _: &mut [KernelArg<'_, Self>]) -> DeviceResult<()> {
            match *self {}
        }
        fn synchronize(&self) -> DeviceResult<()> {
            match *self {}
        }
    }
}
