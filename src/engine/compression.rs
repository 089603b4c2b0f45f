//! Gradient compression for allreduce: none, fp16, bf16 (the `half` crate), and 1-bit sign
//! with a scale (design 001) with error feedback.
//!
//! Compression applies to float32 tensors reduced with sum or average; any other tensor is
//! reduced as it is.
//!
//! **1-bit.** Per tensor, `v = x + residual`; the rank sends `sign(v)` as bits and one f32
//! scale `s = ||v||_2 / sqrt(n)`, so that `s * sign(v)` has the same L2 norm as `v`;
//! the residual `v - s * sign(v)` is kept and added to the tensor of the same name next
//! time (error feedback: what compression loses is not lost, only delayed). Ranks
//! allgather the encodings (1/32 of the float32 bytes) and every rank decodes and sums
//! them in rank order, so all ranks get the same result.

use std::collections::HashMap;

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::dtype::{DType, ReduceOp};

/// How a tensor travels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Compression {
    /// As it is.
    #[default]
    None,
    /// Cast to IEEE half precision for the reduction.
    Fp16,
    /// Cast to bfloat16 for the reduction.
    Bf16,
    /// Sign bits and one scale per tensor, with error feedback.
    OneBit,
}

impl Compression {
    /// Every choice.
    pub const ALL: [Compression; 4] = [Compression::None, Compression::Fp16, Compression::Bf16, Compression::OneBit];

    /// Its name (`RINGREC_COMPRESSION`, `--compression`).
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Fp16 => "fp16",
            Compression::Bf16 => "bf16",
            Compression::OneBit => "1bit",
        }
    }

    /// Parses a name.
    pub fn parse(s: &str) -> Option<Compression> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "none" => Some(Compression::None),
            "fp16" | "f16" | "half" => Some(Compression::Fp16),
            "bf16" => Some(Compression::Bf16),
            "1bit" | "onebit" | "sign" => Some(Compression::OneBit),
            _ => None,
        }
    }

    /// Wire code.
    pub fn code(self) -> u8 {
        Compression::ALL.iter().position(|c| *c == self).unwrap_or(0) as u8
    }

    /// Inverse of [`Compression::code`].
    pub fn from_code(c: u8) -> Option<Compression> {
        Compression::ALL.get(c as usize).copied()
    }

    /// What actually applies to a tensor of `dtype` reduced with `op`.
    pub fn effective(self, dtype: DType, op: ReduceOp) -> Compression {
        if dtype == DType::F32 && matches!(op, ReduceOp::Sum | ReduceOp::Average) {
            self
        } else {
            Compression::None
        }
    }

    /// The half dtype a cast compression reduces in.
    pub fn wire_dtype(self) -> Option<DType> {
        match self {
            Compression::Fp16 => Some(DType::F16),
            Compression::Bf16 => Some(DType::BF16),
            _ => None,
        }
    }
}

/// Casts `src` to the half type `wire` into `dst` (2 bytes per element).
pub fn to_half(src: &[f32], dst: &mut [u8], wire: DType) {
    match wire {
        DType::F16 => bytemuck::cast_slice_mut::<u8, f16>(dst).convert_from_f32_slice(src),
        _ => bytemuck::cast_slice_mut::<u8, bf16>(dst).convert_from_f32_slice(src),
    }
}

/// Widens half values of type `wire` back into `dst`.
pub fn from_half(src: &[u8], dst: &mut [f32], wire: DType) {
    match wire {
        DType::F16 => bytemuck::cast_slice::<u8, f16>(src).convert_to_f32_slice(dst),
        _ => bytemuck::cast_slice::<u8, bf16>(src).convert_to_f32_slice(dst),
    }
}

/// Bytes of the 1-bit encoding of `n` values: the scale, then the sign bits.
pub fn onebit_len(n: usize) -> usize {
    4 + n.div_ceil(8)
}

/// The error-feedback state of 1-bit compression: one residual per tensor name.
#[derive(Default)]
pub struct OneBit {
    residuals: HashMap<String, Vec<f32>>,
}

impl OneBit {
    /// Encodes `x` (plus the residual kept for `name`) onto `out` and keeps the new residual.
    pub fn encode(&mut self, name: &str, x: &[f32], out: &mut Vec<u8>) {
        let n = x.len();
        let r = self.residuals.entry(name.to_string()).or_default();
        if r.len() != n {
            *r = vec![0.0; n]; // a new tensor, or one whose size changed: no history
        }
        for (ri, xi) in r.iter_mut().zip(x) {
            *ri += *xi; // r now holds v = x + residual
        }
        let norm2: f64 = r.iter().map(|v| (*v as f64) * (*v as f64)).sum();
        let scale = if n == 0 { 0.0 } else { (norm2 / n as f64).sqrt() as f32 };
        out.extend_from_slice(&scale.to_le_bytes());
        let start = out.len();
        out.resize(start + n.div_ceil(8), 0);
        let bits = &mut out[start..];
        for (i, v) in r.iter_mut().enumerate() {
            let positive = *v >= 0.0;
            if positive {
                bits[i / 8] |= 1 << (i % 8);
                *v -= scale;
            } else {
                *v += scale;
            }
        }
    }

    /// Forgets every residual.
    pub fn reset(&mut self) {
        self.residuals.clear();
    }
}

/// Adds the decoded values of one encoding of `acc.len()` values to `acc`; returns the
/// bytes it used, or `None` when `enc` is too short.
pub fn onebit_decode_add(enc: &[u8], acc: &mut [f32]) -> Option<usize> {
    let n = acc.len();
    let len = onebit_len(n);
    if enc.len() < len {
        return None;
    }
    let scale = f32::from_le_bytes([enc[0], enc[1], enc[2], enc[3]]);
    let bits = &enc[4..len];
    for (i, a) in acc.iter_mut().enumerate() {
        if bits[i / 8] >> (i % 8) & 1 == 1 {
            *a += scale;
        } else {
            *a -= scale;
        }
    }
    Some(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_effective_rules() {
        for c in Compression::ALL {
            assert_eq!(Compression::parse(c.name()), Some(c));
            assert_eq!(Compression::from_code(c.code()), Some(c));
        }
        assert_eq!(Compression::parse("gzip"), None);
        assert_eq!(Compression::Fp16.effective(DType::F32, ReduceOp::Average), Compression::Fp16);
        assert_eq!(Compression::Fp16.effective(DType::I32, ReduceOp::Sum), Compression::None);
        assert_eq!(Compression::OneBit.effective(DType::F32, ReduceOp::Max), Compression::None);
    }

    #[test]
    fn half_casts_round_trip_representable_values() {
        let x = vec![1.0f32, -2.5, 0.125, 1024.0];
        for wire in [DType::F16, DType::BF16] {
            let mut b = vec![0u8; 8];
            to_half(&x, &mut b, wire);
            let mut y = vec![0f32; 4];
            from_half(&b, &mut y, wire);
            assert_eq!(x, y, "{wire}");
        }
    }

    #[test]
    fn onebit_keeps_the_norm_and_feeds_the_error_back() {
        let x = vec![3.0f32, -1.0, 0.5, -0.5, 2.0];
        let mut ob = OneBit::default();
        let mut enc = Vec::new();
        ob.encode("w", &x, &mut enc);
        assert_eq!(enc.len(), onebit_len(5));
        let mut dec = vec![0f32; 5];
        assert_eq!(onebit_decode_add(&enc, &mut dec), Some(onebit_len(5)));
        let norm = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>().sqrt();
        assert!((norm(&dec) - norm(&x)).abs() < 1e-5);
        assert_eq!(dec.iter().map(|d| d.signum()).collect::<Vec<_>>(), vec![1.0, -1.0, 1.0, -1.0, 1.0]);
        // residual = x - decoded; sent + residual reproduces the input exactly enough.
        let r = &ob.residuals["w"];
        for i in 0..5 {
            assert!((dec[i] + r[i] - x[i]).abs() < 1e-6);
        }
        // Over many steps of a constant input, the mean of what was sent approaches it.
        let mut sum = vec![0f32; 5];
        let steps = 2000;
        for _ in 0..steps {
            let mut e = Vec::new();
            ob.encode("w", &x, &mut e);
            onebit_decode_add(&e, &mut sum).unwrap();
        }
        for i in 0..5 {
            assert!((sum[i] / steps as f32 - x[i]).abs() < 0.01, "{i}: {}", sum[i] / steps as f32);
        }
        assert_eq!(onebit_decode_add(&enc[..3], &mut dec), None);
    }
}
