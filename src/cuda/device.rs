//! [`Device`]: what the dense model needs from an accelerator, as one trait (candle's
//! `BackendDevice` in small): buffers, page-locked staging, copies, one GEMM and the
//! kernels of kernels/*.cu.
//!
//! Two implementations: [`super::gpu::CudaDevice`] (cudarc: cuBLAS, NVRTC-compiled kernels,
//! streams; feature `cuda`, an uninhabited stand-in without it) and
//! [`super::host::HostDevice`], which runs the *same* kernel sources compiled as host C++
//! and cuBLAS's column-major GEMM semantics on the CPU. The model code
//! ([`super::mlp::DeviceMlp`]) is generic over the trait, so every line of it — buffer
//! sizes, offsets, GEMM transposes, kernel arguments — is tested on machines without a GPU.
//!
//! Every kernel call goes through a typed method here that checks the buffers are large
//! enough for the launch before anything runs (an out-of-bounds write on a GPU corrupts
//! silently), then hands the arguments, as `cuLaunchKernel` takes them, to
//! [`Device::launch`].

use super::kernels::Kernel;
use super::plan::ColumnMajorGemm;
use super::CudaError;

/// Results of device operations.
pub type DeviceResult<T> = Result<T, CudaError>;

/// Which way a staging buffer's copies go (a GPU allocates write-combined page-locked memory
/// for uploads, which the CPU writes fast but reads slowly, and plain page-locked memory for
/// downloads).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Host writes, device reads.
    ToDevice,
    /// Device writes, host reads.
    FromDevice,
}

/// One kernel argument, in the kernel's parameter order.
pub enum KernelArg<'a, D: Device + ?Sized> {
    /// A `const float*` into a buffer, at an element offset.
    In(&'a D::F32, usize),
    /// A `float*` into a buffer, at an element offset.
    Out(&'a mut D::F32, usize),
    /// A `const u32*` to a whole buffer.
    InU32(&'a D::U32),
    /// A `const u16*` to a whole buffer (f16/bf16 bits).
    InU16(&'a D::U16),
    /// A `u16*` to a whole buffer (f16/bf16 bits).
    OutU16(&'a mut D::U16),
    /// An `int`.
    I32(i32),
    /// A `long long`.
    I64(i64),
    /// A `float`.
    F32(f32),
}

/// What the dense model needs from a device. Buffers are zero-initialised; operations on a
/// GPU are asynchronous and ordered (one compute stream); `host_*` views wait for the copies
/// that use the staging buffer.
pub trait Device {
    /// A buffer of f32 in device memory.
    type F32;
    /// A buffer of u32 in device memory.
    type U32;
    /// A buffer of u16 in device memory (f16 or bf16 bits).
    type U16;
    /// A page-locked host buffer of f32 for asynchronous copies.
    type HostF32;
    /// A page-locked host buffer of u32 for asynchronous copies.
    type HostU32;

    /// The device, in words (model, ordinal).
    fn describe(&self) -> String;
    /// A zeroed f32 buffer of `n` elements.
    fn zeros_f32(&self, n: usize) -> DeviceResult<Self::F32>;
    /// A zeroed u32 buffer of `n` elements.
    fn zeros_u32(&self, n: usize) -> DeviceResult<Self::U32>;
    /// A zeroed u16 buffer of `n` elements.
    fn zeros_u16(&self, n: usize) -> DeviceResult<Self::U16>;
    /// Elements of a u16 buffer.
    fn len_u16(&self, b: &Self::U16) -> usize;
    /// Copies `dst.len()` values of `src` into `dst` and waits.
    fn read_u16(&self, src: &Self::U16, dst: &mut [u16]) -> DeviceResult<()>;
    /// Elements of an f32 buffer.
    fn len_f32(&self, b: &Self::F32) -> usize;
    /// Elements of a u32 buffer.
    fn len_u32(&self, b: &Self::U32) -> usize;
    /// A staging buffer of `n` f32.
    fn staging_f32(&self, n: usize, dir: Direction) -> DeviceResult<Self::HostF32>;
    /// A staging buffer of `n` u32.
    fn staging_u32(&self, n: usize) -> DeviceResult<Self::HostU32>;
    /// The staging buffer's memory, after every copy that uses it has finished.
    fn host_f32<'a>(&self, h: &'a mut Self::HostF32) -> DeviceResult<&'a mut [f32]>;
    /// The staging buffer's memory, after every copy that uses it has finished.
    fn host_u32<'a>(&self, h: &'a mut Self::HostU32) -> DeviceResult<&'a mut [u32]>;
    /// Starts copying the first `n` values of `src` to the start of `dst`.
    fn upload_f32(&self, src: &Self::HostF32, n: usize, dst: &mut Self::F32) -> DeviceResult<()>;
    /// Starts copying the first `n` values of `src` to the start of `dst`.
    fn upload_u32(&self, src: &Self::HostU32, n: usize, dst: &mut Self::U32) -> DeviceResult<()>;
    /// Starts copying the first `n` values of `src` to the start of `dst`.
    fn download_f32(&self, src: &Self::F32, n: usize, dst: &mut Self::HostF32) -> DeviceResult<()>;
    /// Copies `src` into `dst` at `offset` and waits (parameters, checkpoints: not per step).
    fn write_f32(&self, src: &[f32], dst: &mut Self::F32, offset: usize) -> DeviceResult<()>;
    /// Copies `dst.len()` values of `src` from `offset` into `dst` and waits.
    fn read_f32(&self, src: &Self::F32, offset: usize, dst: &mut [f32]) -> DeviceResult<()>;
    /// `c = op(first) op(second)`, column-major (cuBLAS SGEMM, TF32 off), each operand at an
    /// element offset of its buffer. Called through [`Device::gemm`], which checks bounds.
    fn gemm_unchecked(&self, call: &ColumnMajorGemm, first: (&Self::F32, usize), second: (&Self::F32, usize), c: (&mut Self::F32, usize)) -> DeviceResult<()>;
    /// Runs `kernel` over `work` independent outputs (the grid-stride loop's extent) with
    /// `args`. Called through the typed methods below, which check bounds.
    fn launch(&self, kernel: Kernel, work: usize, args: &mut [KernelArg<'_, Self>]) -> DeviceResult<()>;
    /// Waits for everything queued on the device.
    fn synchronize(&self) -> DeviceResult<()>;

    /// Checked [`Device::gemm_unchecked`].
    fn gemm(&self, call: &ColumnMajorGemm, first: (&Self::F32, usize), second: (&Self::F32, usize), c: (&mut Self::F32, usize)) -> DeviceResult<()> {
        let (nf, ns, nc) = call.extents();
        self.fits("gemm: first operand", self.len_f32(first.0), first.1 + nf)?;
        self.fits("gemm: second operand", self.len_f32(second.0), second.1 + ns)?;
        self.fits("gemm: output", self.len_f32(c.0), c.1 + nc)?;
        if call.m == 0 || call.n == 0 {
            return Ok(());
        }
        self.gemm_unchecked(call, first, second, c)
    }

    /// `x[s] = [emb rows of the sample's fields, dense features]` for `batch` samples
    /// (`inverse[s*fields+f]` is the row of field f's key in `emb`).
    #[allow(clippy::too_many_arguments)]
    fn gather_input(&self, emb: &Self::F32, inverse: &Self::U32, dense: &Self::F32, x: &mut Self::F32, batch: usize, fields: usize, dim: usize, ndense: usize) -> DeviceResult<()> {
        self.fits("gather_input: inverse", self.len_u32(inverse), batch * fields)?;
        self.fits("gather_input: dense", self.len_f32(dense), batch * ndense)?;
        let width = fields * dim + ndense;
        self.fits("gather_input: x", self.len_f32(x), batch * width)?;
        // emb's rows are named by inverse's values: DeviceMlp checks them when it uploads a batch.
        self.launch(Kernel::GatherInput, batch * width, &mut [KernelArg::In(emb, 0), KernelArg::InU32(inverse), KernelArg::In(dense, 0), KernelArg::Out(x, 0), i32a(batch)?, i32a(fields)?, i32a(dim)?, i32a(ndense)?])
    }

    /// `z[r, c] += bias[c]`, then ReLU when `relu`.
    fn bias_act(&self, z: &mut Self::F32, bias: (&Self::F32, usize), rows: usize, cols: usize, relu: bool) -> DeviceResult<()> {
        self.fits("bias_act: z", self.len_f32(z), rows * cols)?;
        self.fits("bias_act: bias", self.len_f32(bias.0), bias.1 + cols)?;
        self.launch(Kernel::BiasAct, rows * cols, &mut [KernelArg::Out(z, 0), KernelArg::In(bias.0, bias.1), i32a(rows)?, i32a(cols)?, KernelArg::I32(relu as i32)])
    }

    /// `delta[i] = 0` where `act[i] <= 0`, for `n` elements.
    fn relu_backward(&self, delta: &mut Self::F32, act: &Self::F32, n: usize) -> DeviceResult<()> {
        self.fits("relu_backward: delta", self.len_f32(delta), n)?;
        self.fits("relu_backward: act", self.len_f32(act), n)?;
        self.launch(Kernel::ReluBackward, n, &mut [KernelArg::Out(delta, 0), KernelArg::In(act, 0), KernelArg::I64(n as i64)])
    }

    /// `db[c] = sum over rows of delta[r, c]`, rows in order.
    fn bias_grad(&self, delta: &Self::F32, db: (&mut Self::F32, usize), rows: usize, cols: usize) -> DeviceResult<()> {
        self.fits("bias_grad: delta", self.len_f32(delta), rows * cols)?;
        self.fits("bias_grad: db", self.len_f32(db.0), db.1 + cols)?;
        self.launch(Kernel::BiasGrad, cols, &mut [KernelArg::In(delta, 0), KernelArg::Out(db.0, db.1), i32a(rows)?, i32a(cols)?])
    }

    /// Binary cross-entropy of `n` logits against labels; `delta = (sigmoid(z) - y) * scale`.
    fn bce_loss(&self, z: &Self::F32, y: &Self::F32, loss: &mut Self::F32, delta: &mut Self::F32, n: usize, scale: f32) -> DeviceResult<()> {
        for (what, len) in [("bce_loss: z", self.len_f32(z)), ("bce_loss: labels", self.len_f32(y)), ("bce_loss: loss", self.len_f32(loss)), ("bce_loss: delta", self.len_f32(delta))] {
            self.fits(what, len, n)?;
        }
        self.launch(Kernel::BceLoss, n, &mut [KernelArg::In(z, 0), KernelArg::In(y, 0), KernelArg::Out(loss, 0), KernelArg::Out(delta, 0), i32a(n)?, KernelArg::F32(scale)])
    }

    /// `out[at] = sum of loss[0..n)` (in order, double accumulation).
    fn loss_sum(&self, loss: &Self::F32, n: usize, out: (&mut Self::F32, usize)) -> DeviceResult<()> {
        self.fits("loss_sum: loss", self.len_f32(loss), n)?;
        self.fits("loss_sum: out", self.len_f32(out.0), out.1 + 1)?;
        self.launch(Kernel::LossSum, 1, &mut [KernelArg::In(loss, 0), KernelArg::Out(out.0, out.1), i32a(n)?])
    }

    /// Per-key sum of the embedding slots' input gradients: `out[u] = sum of dx slots listed
    /// in slots[offsets[u]..offsets[u+1]]` (CSR; slot p = sample * fields + field).
    #[allow(clippy::too_many_arguments)]
    fn key_grad_reduce(&self, dx: &Self::F32, offsets: &Self::U32, slots: &Self::U32, out: &mut Self::F32, keys: usize, batch: usize, fields: usize, dim: usize, width: usize) -> DeviceResult<()> {
        self.fits("key_grad_reduce: dx", self.len_f32(dx), batch * width)?;
        self.fits("key_grad_reduce: offsets", self.len_u32(offsets), keys + 1)?;
        self.fits("key_grad_reduce: slots", self.len_u32(slots), batch * fields)?;
        self.fits("key_grad_reduce: out", self.len_f32(out), keys * dim)?;
        self.launch(Kernel::KeyGradReduce, keys * dim, &mut [KernelArg::In(dx, 0), KernelArg::InU32(offsets), KernelArg::InU32(slots), KernelArg::Out(out, 0), i32a(keys)?, i32a(fields)?, i32a(dim)?, i32a(width)?])
    }

    /// `p -= lr * g` over `n` parameters from `p.1`.
    fn sgd_update(&self, p: (&mut Self::F32, usize), g: &Self::F32, lr: f32, n: usize) -> DeviceResult<()> {
        self.fits("sgd_update: params", self.len_f32(p.0), p.1 + n)?;
        self.fits("sgd_update: grad", self.len_f32(g), n)?;
        self.launch(Kernel::SgdUpdate, n, &mut [KernelArg::Out(p.0, p.1), KernelArg::In(g, 0), KernelArg::F32(lr), KernelArg::I64(n as i64)])
    }

    /// Adam over `n` parameters from `p.1` (moments at the same offset); `alpha` and `eps_hat`
    /// carry the bias correction, as [`crate::model::DenseOptimState`] computes them.
    #[allow(clippy::too_many_arguments)]
    fn adam_update(&self, p: (&mut Self::F32, usize), g: &Self::F32, m: &mut Self::F32, v: &mut Self::F32, alpha: f32, beta1: f32, beta2: f32, eps_hat: f32, n: usize) -> DeviceResult<()> {
        let at = p.1;
        self.fits("adam_update: params", self.len_f32(p.0), at + n)?;
        self.fits("adam_update: grad", self.len_f32(g), n)?;
        self.fits("adam_update: m", self.len_f32(m), at + n)?;
        self.fits("adam_update: v", self.len_f32(v), at + n)?;
        self.launch(
            Kernel::AdamUpdate,
            n,
            &mut [KernelArg::Out(p.0, at), KernelArg::In(g, 0), KernelArg::Out(m, at), KernelArg::Out(v, at), KernelArg::F32(alpha), KernelArg::F32(beta1), KernelArg::F32(beta2), KernelArg::F32(eps_hat), KernelArg::I64(n as i64)],
        )
    }

    /// `dst[i] = f16 or bf16 bits of src[i]` (round to nearest even) for `n` values.
    fn cast_to_half(&self, src: &Self::F32, dst: &mut Self::U16, n: usize, bf16: bool) -> DeviceResult<()> {
        self.fits("cast_to_half: src", self.len_f32(src), n)?;
        self.fits("cast_to_half: dst", self.len_u16(dst), n)?;
        let k = if bf16 { Kernel::F32ToBf16 } else { Kernel::F32ToF16 };
        self.launch(k, n, &mut [KernelArg::In(src, 0), KernelArg::OutU16(dst), KernelArg::I64(n as i64)])
    }

    /// `dst[i] = f32 of the f16 or bf16 bits src[i]` for `n` values.
    fn cast_from_half(&self, src: &Self::U16, dst: &mut Self::F32, n: usize, bf16: bool) -> DeviceResult<()> {
        self.fits("cast_from_half: src", self.len_u16(src), n)?;
        self.fits("cast_from_half: dst", self.len_f32(dst), n)?;
        let k = if bf16 { Kernel::Bf16ToF32 } else { Kernel::F16ToF32 };
        self.launch(k, n, &mut [KernelArg::InU16(src), KernelArg::Out(dst, 0), KernelArg::I64(n as i64)])
    }

    /// An error unless `have >= need`.
    fn fits(&self, what: &str, have: usize, need: usize) -> DeviceResult<()> {
        if have < need {
            return Err(CudaError::Call { what: what.to_string(), detail: format!("buffer of {have} elements, the launch needs {need} (a bug in ringrec: please report it)") });
        }
        Ok(())
    }
}

/// An `int` kernel argument; sizes past `i32::MAX` are refused rather than wrapped.
fn i32a<'a, D: Device + ?Sized>(v: usize) -> DeviceResult<KernelArg<'a, D>> {
    i32::try_from(v).map(KernelArg::I32).map_err(|_| CudaError::Call { what: "kernel launch".into(), detail: format!("size {v} does not fit the kernel's int argument; use a smaller --batch") })
}

/// Reduces a device's gradient buffers over the ranks: NCCL on GPUs
/// ([`super::NcclComm`]), the CPU collectives for [`super::HostDevice`]
/// ([`super::host::HostReducer`]). Calls may only queue the work; [`DeviceReducer::wait`]
/// waits for all of it.
pub trait DeviceReducer<D: Device> {
    /// Queues an in-place sum of `buf` over the ranks.
    fn allreduce_sum(&mut self, dev: &D, buf: &mut D::F32) -> DeviceResult<()>;
    /// Queues an in-place sum of f16 (`bf16 == false`) or bf16 values over the ranks
    /// (accumulated in f32 by the CPU backends; NCCL accumulates in the type).
    fn allreduce_half_sum(&mut self, dev: &D, buf: &mut D::U16, bf16: bool) -> DeviceResult<()>;
    /// Waits for everything queued (with a deadline where a peer could hang it).
    fn wait(&mut self) -> DeviceResult<()>;
}

/// The [`DeviceReducer`] of a world of one rank: nothing to reduce, no NCCL needed.
pub struct SingleRank;

impl<D: Device> DeviceReducer<D> for SingleRank {
    fn allreduce_sum(&mut self, _dev: &D, _buf: &mut D::F32) -> DeviceResult<()> {
        Ok(())
    }
    fn allreduce_half_sum(&mut self, _dev: &D, _buf: &mut D::U16, _bf16: bool) -> DeviceResult<()> {
        Ok(())
    }
    fn wait(&mut self) -> DeviceResult<()> {
        Ok(())
    }
}
