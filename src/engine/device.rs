//! The executor of responses whose tensors live in a device's memory (horovod/common's
//! `ops/nccl_operations` in ringrec's shape): negotiation, fusion planning, the response
//! cache, the timeline and stall checks are the engine's, written once; this file moves the
//! bytes — fused tensors through a fusion buffer on the device (laid out for the collectives,
//! [`FusedLayout`]: over a ringrec CPU backend a fused tensor's sum has the bits of the tensor
//! reduced alone; NCCL's algorithm is its own, see [`DeviceCollectives::fusion_levels`]), fp16/bf16 compression with
//! the device's cast kernels, 1-bit compression with the kernels of kernels/compress.cu
//! (each tensor encoded with its own scale and residual, the encodings allgathered, every
//! rank decoding and summing them in rank order) — and reduces them with the device's collectives
//! ([`DeviceCollectives`]: NCCL on GPUs, a CPU backend for the host-kernels test device).
//!
//! It runs on its own queue of the device (a [`Device::fork`]: a second stream on a GPU),
//! so a layer's allreduce overlaps the backward of the layers below; a response counts as
//! done once its collective and copies have finished (waited with the collectives'
//! deadline), and the handles are answered then.

use std::any::Any;
use std::collections::HashMap;
use std::time::Instant;

use half::{bf16, f16};

use super::compression::Compression;
use super::error::{EngineError, EngineResult};
use super::fusion::Step;
use super::message::{OpKind, Response};
use crate::comm::device::DeviceCollectives;
use crate::comm::FusedLayout;
use crate::device::lent::device_buffer_mut;
use crate::device::ops::{onebit_parts, onebit_words};
use crate::device::{Device, DeviceError, Half, Op, Scalar};
use crate::dtype::ReduceOp;
use crate::dtype::{DType, Element};
use crate::tensor::{DeviceTensor, Tensor};

/// What the engine's background thread needs from a device executor (object-safe, so the
/// engine does not depend on the device type).
pub trait ExecuteDevice: Send {
    /// The collectives and the device, in words (`nccl on <GPU>`).
    fn describe(&self) -> String;
    /// Runs `resp` over `tensors` (device tensors, in the response's entry order) in place;
    /// returns the steps it took, with their times.
    fn execute(&mut self, resp: &Response, tensors: &mut [Tensor]) -> EngineResult<Vec<Step>>;
    /// Sets the factor of 1-bit compression's L2 form and its values per scale (0: one
    /// scale per tensor).
    fn set_onebit(&mut self, lambda: f32, block: usize);
}

/// 1-bit compression's state on a device: a residual per tensor name, the encoding, the
/// gathered encodings and the norm's parts (buffers grown as needed and reused).
struct OneBitState<D: Device> {
    lambda: f32,
    block: usize,
    residuals: HashMap<String, D::Buf<f32>>,
    enc: Option<D::Buf<u32>>,
    gathered: Option<D::Buf<u32>>,
    partial: Option<D::Buf<u32>>,
}

/// Runs responses on device `D` with collectives `C` (see the module docs).
pub struct DeviceExecutor<D: Device, C: DeviceCollectives<D>> {
    dev: D,
    coll: C,
    /// One fusion buffer per dtype (a `D::Buf<T>`), grown as needed and reused.
    fusion: HashMap<DType, Box<dyn Any + Send>>,
    onebit: OneBitState<D>,
}

fn device_err(e: DeviceError) -> EngineError {
    EngineError::Comm(e.to_string())
}

impl<D: Device, C: DeviceCollectives<D>> DeviceExecutor<D, C> {
    /// An executor queueing on `dev` (a fork of the model's device) and reducing with `coll`.
    pub fn new(dev: D, coll: C) -> Self {
        let onebit = OneBitState { lambda: super::compression::DEFAULT_LAMBDA, block: super::compression::DEFAULT_BLOCK, residuals: HashMap::new(), enc: None, gathered: None, partial: None };
        DeviceExecutor { dev, coll, fusion: HashMap::new(), onebit }
    }

    fn buffers<T: Scalar>(tensors: &mut [Tensor]) -> EngineResult<Vec<&mut D::Buf<T>>> {
        tensors
            .iter_mut()
            .map(|t| {
                let dtype = t.dtype();
                t.device_mut().and_then(device_buffer_mut::<D, T>).ok_or_else(|| EngineError::Comm(format!("a {dtype} tensor of this response is not a buffer of this rank's device")))
            })
            .collect()
    }

    /// The fusion buffer of `T`, holding at least `n` elements (taken out; put it back).
    fn take_fusion<T: Scalar>(&mut self, dtype: DType, n: usize) -> EngineResult<D::Buf<T>> {
        match self.fusion.remove(&dtype).and_then(|b| b.downcast::<D::Buf<T>>().ok()) {
            Some(b) if self.dev.len(&*b) >= n => Ok(*b),
            _ => self.dev.alloc(n).map_err(device_err),
        }
    }

    fn put_fusion<T: Scalar>(&mut self, dtype: DType, b: D::Buf<T>) {
        self.fusion.insert(dtype, Box::new(b));
    }

    fn wait(&mut self) -> EngineResult<()> {
        self.coll.wait(&self.dev)?;
        self.dev.synchronize().map_err(device_err)
    }

    fn allreduce<T: Scalar + Element>(&mut self, resp: &Response, tensors: &mut [Tensor]) -> EngineResult<Vec<Step>> {
        let t0 = Instant::now();
        let mut bufs = Self::buffers::<T>(tensors)?;
        let lens: Vec<usize> = resp.entries.iter().map(|e| e.count as usize).collect();
        if let [b] = bufs.as_mut_slice() {
            self.coll.allreduce(&self.dev, b, 0, lens[0], resp.op)?;
            self.wait()?;
            return Ok(vec![("ALLREDUCE", t0, Instant::now())]);
        }
        let layout = FusedLayout::new(&lens, &self.coll.fusion_levels());
        let mut fused = self.take_fusion::<T>(T::DTYPE, layout.len())?;
        for k in layout.blocks() {
            self.dev.copy((&*bufs[k.member], k.range.start), (&mut fused, k.at), k.range.len()).map_err(device_err)?;
        }
        self.dev.synchronize().map_err(device_err)?;
        let t1 = Instant::now();
        self.coll.allreduce_fused(&self.dev, &mut fused, &layout, resp.op)?;
        self.wait()?;
        let t2 = Instant::now();
        for k in layout.blocks() {
            self.dev.copy((&fused, k.at), (&mut *bufs[k.member], k.range.start), k.range.len()).map_err(device_err)?;
        }
        self.dev.synchronize().map_err(device_err)?;
        self.put_fusion(T::DTYPE, fused);
        Ok(vec![("MEMCPY_IN_FUSION_BUFFER", t0, t1), ("ALLREDUCE", t1, t2), ("MEMCPY_OUT_FUSION_BUFFER", t2, Instant::now())])
    }

    /// Allreduce of f32 tensors through half-precision copies of them (`H` on the wire).
    fn allreduce_cast<H: Half>(&mut self, resp: &Response, tensors: &mut [Tensor]) -> EngineResult<Vec<Step>> {
        let t0 = Instant::now();
        let mut bufs = Self::buffers::<f32>(tensors)?;
        let lens: Vec<usize> = resp.entries.iter().map(|e| e.count as usize).collect();
        let layout = FusedLayout::new(&lens, &self.coll.fusion_levels());
        let mut wire = self.take_fusion::<H>(H::DTYPE, layout.len())?;
        for k in layout.blocks() {
            self.dev.exec(Op::ToHalf { src: &*bufs[k.member], src_at: k.range.start, dst: H::as_mut::<D>(&mut wire), dst_at: k.at, n: k.range.len() }).map_err(device_err)?;
        }
        self.dev.synchronize().map_err(device_err)?;
        let t1 = Instant::now();
        self.coll.allreduce_fused(&self.dev, &mut wire, &layout, resp.op)?;
        self.wait()?;
        let t2 = Instant::now();
        for k in layout.blocks() {
            self.dev.exec(Op::FromHalf { src: H::as_ref::<D>(&wire), src_at: k.at, dst: &mut *bufs[k.member], dst_at: k.range.start, n: k.range.len() }).map_err(device_err)?;
        }
        self.dev.synchronize().map_err(device_err)?;
        self.put_fusion(H::DTYPE, wire);
        Ok(vec![("COMPRESS", t0, t1), ("ALLREDUCE", t1, t2), ("DECOMPRESS", t2, Instant::now())])
    }

    /// A buffer of at least `n` words: `slot`'s, or a new one.
    fn words(dev: &D, slot: &mut Option<D::Buf<u32>>, n: usize) -> EngineResult<D::Buf<u32>> {
        match slot.take() {
            Some(b) if dev.len(&b) >= n => Ok(b),
            _ => dev.alloc(n).map_err(device_err),
        }
    }

    /// 1-bit allreduce of f32 tensors (see the module docs).
    fn allreduce_onebit(&mut self, resp: &Response, tensors: &mut [Tensor]) -> EngineResult<Vec<Step>> {
        let t0 = Instant::now();
        let (l1, lambda, block) = (resp.compression == Compression::OneBitL1, self.onebit.lambda, self.onebit.block);
        let mut bufs = Self::buffers::<f32>(tensors)?;
        let lens: Vec<usize> = resp.entries.iter().map(|e| e.count as usize).collect();
        let stride: usize = lens.iter().map(|n| onebit_words(*n, block)).sum();
        let parts = lens.iter().map(|n| onebit_parts(*n, block)).max().unwrap_or(1);
        let ob = &mut self.onebit;
        let mut enc = Self::words(&self.dev, &mut ob.enc, stride)?;
        let mut partial = Self::words(&self.dev, &mut ob.partial, 2 * parts)?;
        let mut at = 0;
        for ((b, n), e) in bufs.iter().zip(&lens).zip(&resp.entries) {
            let residual = match ob.residuals.remove(&e.name) {
                Some(r) if self.dev.len(&r) == *n => r,
                _ => self.dev.alloc(*n).map_err(device_err)?, // new, or resized: no history
            };
            let mut residual = residual;
            self.dev.exec(Op::OneBitEncode { x: &**b, residual: &mut residual, n: *n, l1, lambda, block, partial: &mut partial, enc: &mut enc, at }).map_err(device_err)?;
            ob.residuals.insert(e.name.clone(), residual);
            at += onebit_words(*n, block);
        }
        self.dev.synchronize().map_err(device_err)?;
        let t1 = Instant::now();
        let size = self.coll.size();
        let mut gathered = Self::words(&self.dev, &mut ob.gathered, size * stride)?;
        self.coll.allgather_words(&self.dev, &mut enc, stride, &mut gathered)?;
        self.wait()?;
        let t2 = Instant::now();
        let average = resp.op == ReduceOp::Average;
        let mut at = 0;
        for (b, n) in bufs.iter_mut().zip(&lens) {
            self.dev.exec(Op::OneBitDecodeSum { gathered: &gathered, stride, at, ranks: size, x: &mut **b, n: *n, block, average }).map_err(device_err)?;
            at += onebit_words(*n, block);
        }
        self.dev.synchronize().map_err(device_err)?;
        let ob = &mut self.onebit;
        (ob.enc, ob.gathered, ob.partial) = (Some(enc), Some(gathered), Some(partial));
        Ok(vec![("COMPRESS", t0, t1), ("ALLGATHER", t1, t2), ("DECOMPRESS", t2, Instant::now())])
    }

    /// Replaces each tensor with every rank's, concatenated along the first dimension in rank
    /// order: a new buffer of this device (NCCL: one broadcast per rank in a group).
    fn allgather<T: Scalar + Element>(&mut self, tensors: &mut [Tensor]) -> EngineResult<Vec<Step>> {
        let t0 = Instant::now();
        for t in tensors.iter_mut() {
            let (n, mut shape) = (t.len(), t.shape().to_vec());
            let row: usize = shape.iter().skip(1).product();
            let (recv, counts) = {
                let b = Self::buffers::<T>(std::slice::from_mut(t))?.pop().ok_or_else(|| EngineError::Comm("an allgather without its tensor (engine bug)".into()))?;
                self.coll.allgatherv(&self.dev, b, n)?
            };
            self.wait()?;
            let total: usize = counts.iter().sum();
            if shape.is_empty() {
                shape.push(counts.len()); // scalars gather into a vector
            } else if let Some(rows) = total.checked_div(row) {
                shape[0] = rows;
            }
            // `total` elements: a GPU's buffer of none holds one (a valid device pointer).
            *t = Tensor::on_device(DeviceTensor::new(recv, T::DTYPE, total, self.dev.kind())).with_shape(&shape).map_err(|_| EngineError::Comm("allgather returned a ragged result".into()))?;
        }
        Ok(vec![("ALLGATHER", t0, Instant::now())])
    }

    fn broadcast<T: Scalar + Element>(&mut self, resp: &Response, tensors: &mut [Tensor]) -> EngineResult<Vec<Step>> {
        let t0 = Instant::now();
        for (b, e) in Self::buffers::<T>(tensors)?.into_iter().zip(&resp.entries).filter(|(_, e)| e.count > 0) {
            self.coll.broadcast(&self.dev, b, 0, e.count as usize, resp.root as usize)?;
        }
        self.wait()?;
        Ok(vec![("BROADCAST", t0, Instant::now())])
    }
}

impl<D: Device, C: DeviceCollectives<D>> ExecuteDevice for DeviceExecutor<D, C> {
    fn describe(&self) -> String {
        format!("{} on {}", self.coll.name(), self.dev.describe())
    }

    fn execute(&mut self, resp: &Response, tensors: &mut [Tensor]) -> EngineResult<Vec<Step>> {
        if resp.kind != OpKind::Allgather && resp.entries.iter().all(|e| e.count == 0) {
            return Ok(Vec::new()); // empty tensors (the same on every rank): nothing to run
        }
        match resp.kind {
            OpKind::Allreduce => match resp.compression {
                Compression::None => by_dtype!(self, allreduce, resp.dtype, resp, tensors),
                Compression::Fp16 => self.allreduce_cast::<f16>(resp, tensors),
                Compression::Bf16 => self.allreduce_cast::<bf16>(resp, tensors),
                Compression::OneBit | Compression::OneBitL1 => self.allreduce_onebit(resp, tensors),
            },
            OpKind::Broadcast => by_dtype!(self, broadcast, resp.dtype, resp, tensors),
            OpKind::Allgather => by_dtype!(self, allgather, resp.dtype, tensors),
        }
    }

    fn set_onebit(&mut self, lambda: f32, block: usize) {
        self.onebit.lambda = lambda;
        self.onebit.block = block;
    }
}
