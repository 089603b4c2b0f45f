//! Tensor fusion and the execution of responses.
//!
//! [`fuse`] packs ready allreduce responses of the same dtype, op and compression into
//! fused responses of at most the fusion threshold, identically on every rank (Horovod's
//! rule: take the first unassigned response, then every later compatible one that still
//! fits). [`Executor`] runs a response over the tensors it names: one tensor is reduced
//! where it lies; several are reduced as one buffer — in place when the backend can
//! ([`Collectives::zero_copy_fusion`]), else through a fusion buffer laid out for the
//! backend ([`FusedLayout`], also the fp16/bf16 wire buffer), so that a fused tensor's sum
//! has the bits of the tensor reduced alone on ringrec's own backends.

use std::time::Instant;

use super::compression::{self, Compression, OneBit};
use super::error::{EngineError, EngineResult};
use super::message::{OpKind, Response};
use crate::tensor::Tensor;
use crate::comm::scattered::{aligned_bytes, layout_of};
use crate::comm::{Collectives, FusedLayout, Scattered};
use crate::dtype::{DType, ReduceOp};

/// Fuses `responses` (in order) under `threshold` bytes; 0 disables fusion.
pub fn fuse(responses: Vec<Response>, threshold: usize) -> Vec<Response> {
    let mut taken = vec![false; responses.len()];
    let mut out = Vec::new();
    for i in 0..responses.len() {
        if taken[i] {
            continue;
        }
        taken[i] = true;
        let mut f = responses[i].clone();
        let fusable = |r: &Response| r.kind == OpKind::Allreduce && r.error.is_none();
        if threshold > 0 && fusable(&f) {
            let mut bytes = f.bytes();
            for j in i + 1..responses.len() {
                let r = &responses[j];
                if !taken[j] && fusable(r) && r.dtype == f.dtype && r.location == f.location && r.op == f.op && r.compression == f.compression && bytes + r.bytes() <= threshold {
                    bytes += r.bytes();
                    f.entries.extend(r.entries.iter().cloned());
                    taken[j] = true;
                }
            }
        }
        out.push(f);
    }
    out
}

/// One timed step of a collective, for the timeline.
pub type Step = (&'static str, Instant, Instant);

/// The host bytes of a tensor the host executor was handed.
fn host(t: &mut Tensor) -> EngineResult<&mut [u8]> {
    t.host_bytes_mut().ok_or_else(|| EngineError::Comm("a device tensor reached the host executor (engine bug)".into()))
}

/// Runs responses over tensors in host memory on a CPU backend.
pub struct Executor {
    /// The data backend.
    pub backend: Box<dyn Collectives>,
    /// 1-bit compression's error feedback.
    pub onebit: OneBit,
    fusion: Vec<u64>,
}

impl Executor {
    /// An executor on `backend`.
    pub fn new(backend: Box<dyn Collectives>) -> Executor {
        Executor { backend, onebit: OneBit::default(), fusion: Vec::new() }
    }

    /// An executor on `backend` whose 1-bit L2 form scales by `lambda`, one scale per
    /// `block` values (0: per tensor).
    pub fn with_onebit(backend: Box<dyn Collectives>, lambda: f32, block: usize) -> Executor {
        let mut e = Executor::new(backend);
        e.onebit.lambda = lambda;
        e.onebit.block = block;
        e
    }

    /// Runs `resp` over `tensors` (in the response's entry order) in place; returns the
    /// steps it took, with their times.
    pub fn execute(&mut self, resp: &Response, tensors: &mut [Tensor]) -> EngineResult<Vec<Step>> {
        match resp.kind {
            OpKind::Allreduce => match resp.compression {
                Compression::None => self.allreduce(resp, tensors),
                Compression::Fp16 | Compression::Bf16 => self.allreduce_cast(resp, tensors),
                Compression::OneBit | Compression::OneBitL1 => self.allreduce_onebit(resp, tensors),
            },
            OpKind::Broadcast => {
                let t0 = Instant::now();
                for t in tensors.iter_mut() {
                    self.backend.broadcast_raw(host(t)?, resp.root as usize)?;
                }
                Ok(vec![("BROADCAST", t0, Instant::now())])
            }
            OpKind::Allgather => {
                let t0 = Instant::now();
                for t in tensors.iter_mut() {
                    *t = self.allgather(t)?;
                }
                Ok(vec![("ALLGATHER", t0, Instant::now())])
            }
        }
    }

    fn allreduce(&mut self, resp: &Response, tensors: &mut [Tensor]) -> EngineResult<Vec<Step>> {
        let t0 = Instant::now();
        if let [t] = tensors {
            self.backend.allreduce_raw(host(t)?, resp.dtype, resp.op)?;
            return Ok(vec![("ALLREDUCE", t0, Instant::now())]);
        }
        let mut view = Scattered::new(tensors.iter_mut().map(host).collect::<EngineResult<Vec<_>>>()?);
        if self.backend.zero_copy_fusion() {
            self.backend.allreduce_scattered(&mut view, resp.dtype, resp.op)?;
            return Ok(vec![("ALLREDUCE", t0, Instant::now())]);
        }
        let len = view.len();
        let layout = layout_of(&view, resp.dtype, &self.backend.fusion_levels());
        if self.fusion.len() * 8 < len {
            self.fusion = aligned_bytes(len);
        }
        let buf = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut self.fusion)[..len];
        layout.pack(&view, resp.dtype.size(), buf);
        let t1 = Instant::now();
        self.backend.allreduce_fused(buf, &layout, resp.dtype, resp.op)?;
        let t2 = Instant::now();
        layout.unpack(buf, resp.dtype.size(), &mut view);
        Ok(vec![("MEMCPY_IN_FUSION_BUFFER", t0, t1), ("ALLREDUCE", t1, t2), ("MEMCPY_OUT_FUSION_BUFFER", t2, Instant::now())])
    }

    fn f32s(t: &mut Tensor) -> EngineResult<&mut [f32]> {
        let dtype = t.dtype();
        t.as_mut_slice::<f32>().ok_or_else(|| EngineError::Invalid { name: String::new(), reason: format!("compression needs float32 tensors, got {dtype}") })
    }

    fn allreduce_cast(&mut self, resp: &Response, tensors: &mut [Tensor]) -> EngineResult<Vec<Step>> {
        let wire = resp.compression.wire_dtype().unwrap_or(DType::F16);
        let t0 = Instant::now();
        let lens: Vec<usize> = tensors.iter().map(|t| t.len()).collect();
        let layout = FusedLayout::new(&lens, &self.backend.fusion_levels());
        let n = layout.len();
        if self.fusion.len() * 8 < 2 * n {
            self.fusion = aligned_bytes(2 * n);
        }
        let buf = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut self.fusion)[..2 * n];
        for b in layout.blocks() {
            let x = Self::f32s(&mut tensors[b.member])?;
            compression::to_half(&x[b.range.clone()], &mut buf[2 * b.at..2 * (b.at + b.range.len())], wire);
        }
        let t1 = Instant::now();
        self.backend.allreduce_fused(buf, &layout, wire, resp.op)?;
        let t2 = Instant::now();
        for b in layout.blocks() {
            let x = Self::f32s(&mut tensors[b.member])?;
            compression::from_half(&buf[2 * b.at..2 * (b.at + b.range.len())], &mut x[b.range.clone()], wire);
        }
        Ok(vec![("COMPRESS", t0, t1), ("ALLREDUCE", t1, t2), ("DECOMPRESS", t2, Instant::now())])
    }

    fn allreduce_onebit(&mut self, resp: &Response, tensors: &mut [Tensor]) -> EngineResult<Vec<Step>> {
        let t0 = Instant::now();
        let mut enc = Vec::new();
        let form = resp.compression.onebit_form(self.onebit.lambda).ok_or_else(|| EngineError::Comm("a 1-bit allreduce without a 1-bit form (engine bug)".into()))?;
        for (t, e) in tensors.iter_mut().zip(&resp.entries) {
            let x = Self::f32s(t)?;
            self.onebit.encode_form(&e.name, x, form, &mut enc);
        }
        let t1 = Instant::now();
        let g = self.backend.allgatherv_raw(&enc)?;
        let t2 = Instant::now();
        for t in tensors.iter_mut() {
            Self::f32s(t)?.fill(0.0);
        }
        let size = g.counts.len();
        for r in 0..size {
            let mut piece = g.piece(r);
            for t in tensors.iter_mut() {
                let x = Self::f32s(t)?;
                let used = compression::onebit_decode_add(piece, x, self.onebit.block).ok_or_else(|| EngineError::Comm(format!("rank {r} sent a short 1-bit encoding")))?;
                piece = &piece[used..];
            }
        }
        if resp.op == ReduceOp::Average {
            for t in tensors.iter_mut() {
                for v in Self::f32s(t)? {
                    *v /= size as f32;
                }
            }
        }
        Ok(vec![("COMPRESS", t0, t1), ("ALLGATHER", t1, t2), ("DECOMPRESS", t2, Instant::now())])
    }

    fn allgather(&mut self, t: &Tensor) -> EngineResult<Tensor> {
        let g = self.backend.allgatherv_raw(t.host_bytes().ok_or_else(|| EngineError::Comm("a device tensor reached the host executor (engine bug)".into()))?)?;
        let row: usize = t.shape().iter().skip(1).product::<usize>() * t.dtype().size();
        let mut shape = t.shape().to_vec();
        if shape.is_empty() {
            shape.push(g.counts.len()); // scalars gather into a vector
        } else if let Some(rows) = g.data.len().checked_div(row) {
            shape[0] = rows;
        }
        Tensor::from_bytes(t.dtype(), &shape, &g.data).ok_or_else(|| EngineError::Comm("allgather returned a ragged result".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::super::message::Entry;
    use super::*;

    fn resp(name: &str, count: u64, dtype: DType) -> Response {
        Response { kind: OpKind::Allreduce, dtype, location: crate::tensor::Location::Host, op: ReduceOp::Sum, root: 0, compression: Compression::None, entries: vec![Entry { name: name.into(), count }], error: None }
    }

    #[test]
    fn fuses_compatible_responses_under_the_threshold() {
        let rs = vec![resp("a", 10, DType::F32), resp("b", 10, DType::F64), resp("c", 10, DType::F32), resp("d", 100, DType::F32), resp("e", 5, DType::F32)];
        let names = |v: &[Response]| v.iter().map(|r| r.entries.iter().map(|e| e.name.as_str()).collect::<Vec<_>>().join("+")).collect::<Vec<_>>();
        assert_eq!(names(&fuse(rs.clone(), 100)), vec!["a+c+e", "b", "d"]);
        assert_eq!(names(&fuse(rs.clone(), 0)), vec!["a", "b", "c", "d", "e"]);
        assert_eq!(names(&fuse(rs.clone(), 1 << 20)), vec!["a+c+d+e", "b"]);
        // Tensors on a device are never fused with tensors in host memory.
        let on_device = Response { location: crate::tensor::Location::Device, ..resp("g", 10, DType::F32) };
        assert_eq!(names(&fuse(vec![resp("f", 10, DType::F32), on_device, resp("h", 10, DType::F32)], 100)), vec!["f+h", "g"]);
        let mut err = resp("x", 1, DType::F32);
        err.error = Some("bad".into());
        assert_eq!(names(&fuse(vec![err, resp("y", 1, DType::F32)], 100)), vec!["x", "y"]);
    }
}
