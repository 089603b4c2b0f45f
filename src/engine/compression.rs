//! Gradient compression for allreduce: none, fp16, bf16 (the `half` crate), and 1-bit sign
//! with a scale (design 001) with error feedback, in its two forms.
//!
//! Compression applies to float32 tensors reduced with sum or average; any other tensor is
//! reduced as it is.
//!
//! **1-bit.** Per tensor of `d` values, `v = x + residual`; the rank sends `sign(v)` as bits
//! and one f32 scale `s`, and keeps the residual `v - s * sign(v)`, added to the tensor of
//! the same name next time (error feedback: what compression loses is not lost, only
//! delayed). Ranks allgather the encodings (1/32 of the float32 bytes, plus 4 bytes of
//! scale per tensor) and every rank decodes and sums them in rank order, so all ranks get
//! the same result.
//!
//! **Blocks.** Design 001 states one scale per tensor; `RINGREC_ONEBIT_BLOCK` (`train
//! --onebit-block`, default [`DEFAULT_BLOCK`] values) gives every block of that many
//! consecutive values its own scale (0: one per tensor, the design's literal form), for 4
//! more bytes per block: 1/32 + 1/256 of the float32 bytes at 256. A tensor's values differ
//! in size by layer row and between weights and biases, and Adam divides each update by
//! the compressed gradient's second moment, which one scale per tensor flattens: measured
//! in docs/BENCHMARKS.md, one scale per tensor costs 0.05 AUC after an epoch with Adam where
//! blocks of 256 cost 0.001. Everything below holds per block, `d` its length.
//!
//! The two forms of design 001 ([`OneBitForm`]):
//!
//! - **L1** (`1bit-l1`, the original): `s = ||v||_1 / d`. `C[v] = s sign(v)` is the
//!   closest multiple of `sign(v)` to `v`, and `||C[v] - v||^2 = ||v||^2 - ||v||_1^2 / d
//!   <= (1 - 1/d) ||v||^2`: it always shrinks the error.
//! - **L2 with a factor lambda** (`1bit`, `RINGREC_ONEBIT_LAMBDA`, `0 < lambda <= 1`):
//!   `s = lambda ||v||_2 / sqrt(d)`. With `rho = ||v||_1 / (sqrt(d) ||v||_2)` (in
//!   `[1/sqrt(d), 1]`, 1 when every `|v_i|` is equal), `||C[v] - v||^2 = (1 + lambda^2 -
//!   2 lambda rho) ||v||^2`, which is at most `(1 - lambda^2) ||v||^2` whenever `lambda <=
//!   rho`: the bound [`onebit_error_bound`] checks. `lambda = 1` (the default) keeps the
//!   norm of `v` — but for a spiky `v` (`rho < 1/2`) it sends more error than it removes,
//!   which is what `lambda < 1` mends.

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
    /// Sign bits and one L2 scale (times lambda) per tensor, with error feedback.
    OneBit,
    /// Sign bits and one L1 scale per tensor, with error feedback.
    OneBitL1,
}

impl Compression {
    /// Every choice.
    pub const ALL: [Compression; 5] = [Compression::None, Compression::Fp16, Compression::Bf16, Compression::OneBit, Compression::OneBitL1];

    /// Its name (`RINGREC_COMPRESSION`, `--compression`).
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Fp16 => "fp16",
            Compression::Bf16 => "bf16",
            Compression::OneBit => "1bit",
            Compression::OneBitL1 => "1bit-l1",
        }
    }

    /// Parses a name.
    pub fn parse(s: &str) -> Option<Compression> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "none" => Some(Compression::None),
            "fp16" | "f16" | "half" => Some(Compression::Fp16),
            "bf16" => Some(Compression::Bf16),
            "1bit" | "onebit" | "sign" | "1bit-l2" => Some(Compression::OneBit),
            "1bit-l1" | "onebit-l1" => Some(Compression::OneBitL1),
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

    /// Whether it is a 1-bit form (sent by allgather, with error feedback).
    pub fn is_onebit(self) -> bool {
        matches!(self, Compression::OneBit | Compression::OneBitL1)
    }

    /// The 1-bit form, with the L2 form's `lambda`; `None` for the other compressions.
    pub fn onebit_form(self, lambda: f32) -> Option<OneBitForm> {
        match self {
            Compression::OneBit => Some(OneBitForm::L2 { lambda }),
            Compression::OneBitL1 => Some(OneBitForm::L1),
            _ => None,
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

impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

crate::settings::word_enum!(Compression, "compression", "none, fp16, bf16, 1bit, 1bit-l1");

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

/// The default `RINGREC_ONEBIT_BLOCK`: values per scale.
pub const DEFAULT_BLOCK: usize = 256;

pub use crate::onebit::scales as onebit_scales;

/// The values per scale of `n` values in blocks of `block` (0: all of them, at least 1).
fn block_len(n: usize, block: usize) -> usize {
    if block == 0 {
        n.max(1)
    } else {
        block
    }
}

/// Bytes of the 1-bit encoding of `n` values in blocks of `block`: the scales, then the
/// sign bits.
pub fn onebit_len(n: usize, block: usize) -> usize {
    4 * onebit_scales(n, block) + n.div_ceil(8)
}

pub use crate::onebit::{check_lambda, onebit_error_bound, OneBitForm, DEFAULT_LAMBDA};

/// The error-feedback state of 1-bit compression: one residual per tensor name.
pub struct OneBit {
    residuals: HashMap<String, Vec<f32>>,
    /// The L2 form's lambda.
    pub lambda: f32,
    /// Values per scale (0: one scale per tensor).
    pub block: usize,
}

impl Default for OneBit {
    fn default() -> OneBit {
        OneBit { residuals: HashMap::new(), lambda: DEFAULT_LAMBDA, block: DEFAULT_BLOCK }
    }
}

impl OneBit {
    /// Encodes `x` (plus the residual kept for `name`) in the L2 form onto `out` and keeps
    /// the new residual.
    pub fn encode(&mut self, name: &str, x: &[f32], out: &mut Vec<u8>) {
        let form = OneBitForm::L2 { lambda: self.lambda };
        self.encode_form(name, x, form, out)
    }

    /// Encodes `x` (plus the residual kept for `name`) in `form` onto `out` and keeps the
    /// new residual.
    pub fn encode_form(&mut self, name: &str, x: &[f32], form: OneBitForm, out: &mut Vec<u8>) {
        let n = x.len();
        let r = self.residuals.entry(name.to_string()).or_default();
        if r.len() != n {
            *r = vec![0.0; n]; // a new tensor, or one whose size changed: no history
        }
        for (ri, xi) in r.iter_mut().zip(x) {
            *ri += *xi; // r now holds v = x + residual
        }
        let bs = block_len(n, self.block);
        let scales_at = out.len();
        if n == 0 {
            out.extend_from_slice(&0f32.to_le_bytes());
        }
        for b in r.chunks(bs) {
            out.extend_from_slice(&form.scale_of(b).to_le_bytes());
        }
        let start = out.len();
        out.resize(start + n.div_ceil(8), 0);
        let (scales, bits) = out[scales_at..].split_at_mut(start - scales_at);
        for (i, v) in r.iter_mut().enumerate() {
            let o = 4 * (i / bs);
            let scale = f32::from_le_bytes([scales[o], scales[o + 1], scales[o + 2], scales[o + 3]]);
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

/// Adds the decoded values of one encoding of `acc.len()` values in blocks of `block` to
/// `acc`; returns the bytes it used, or `None` when `enc` is too short.
pub fn onebit_decode_add(enc: &[u8], acc: &mut [f32], block: usize) -> Option<usize> {
    let n = acc.len();
    let len = onebit_len(n, block);
    if enc.len() < len {
        return None;
    }
    let (bs, nb) = (block_len(n, block), onebit_scales(n, block));
    let bits = &enc[4 * nb..len];
    for (i, a) in acc.iter_mut().enumerate() {
        let o = 4 * (i / bs);
        let scale = f32::from_le_bytes([enc[o], enc[o + 1], enc[o + 2], enc[o + 3]]);
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
        assert_eq!(enc.len(), onebit_len(5, DEFAULT_BLOCK));
        let mut dec = vec![0f32; 5];
        assert_eq!(onebit_decode_add(&enc, &mut dec, DEFAULT_BLOCK), Some(onebit_len(5, DEFAULT_BLOCK)));
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
            onebit_decode_add(&e, &mut sum, DEFAULT_BLOCK).unwrap();
        }
        for i in 0..5 {
            assert!((sum[i] / steps as f32 - x[i]).abs() < 0.01, "{i}: {}", sum[i] / steps as f32);
        }
        assert_eq!(onebit_decode_add(&enc[..3], &mut dec, DEFAULT_BLOCK), None);
    }

    /// ||C[v] - v||^2 of one encoding of `v` in `form` (no history).
    fn error_of(form: OneBitForm, v: &[f32]) -> f64 {
        let mut ob = OneBit::default();
        let mut enc = Vec::new();
        ob.encode_form("v", v, form, &mut enc);
        let mut dec = vec![0f32; v.len()];
        onebit_decode_add(&enc, &mut dec, DEFAULT_BLOCK).unwrap();
        // The residual is exactly what was not sent.
        for i in 0..v.len() {
            assert!((ob.residuals["v"][i] - (v[i] - dec[i])).abs() <= 1e-6 * v[i].abs().max(1.0));
        }
        v.iter().zip(&dec).map(|(a, b)| ((*a - *b) as f64).powi(2)).sum()
    }

    #[test]
    fn each_form_meets_its_error_bound() {
        let mut rng = 0x1234_5678_u64;
        let mut next = || {
            rng = crate::hash::splitmix64(rng);
            (rng >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        let mut checked_l2 = 0;
        for case in 0..200 {
            let d = 1 + case % 37;
            // Half the cases spiky (one large value), so rho(v) spans its range.
            let mut v: Vec<f32> = (0..d).map(|_| next()).collect();
            if case % 2 == 1 {
                v[case % d] *= 50.0;
            }
            let norm2: f64 = v.iter().map(|x| (*x as f64).powi(2)).sum();
            let l1: f64 = v.iter().map(|x| x.abs() as f64).sum();
            // L1: the exact error and its bound.
            let e1 = error_of(OneBitForm::L1, &v);
            assert!((e1 - (norm2 - l1 * l1 / d as f64)).abs() <= 1e-4 * norm2, "case {case}");
            assert!(e1 <= onebit_error_bound(OneBitForm::L1, &v).unwrap() * (1.0 + 1e-5) + 1e-12, "case {case}");
            for lambda in [0.1f32, 0.3, 0.5, 0.9, 1.0] {
                let form = OneBitForm::L2 { lambda };
                let e = error_of(form, &v);
                let rho = l1 / ((d as f64).sqrt() * norm2.sqrt());
                let exact = (1.0 + (lambda as f64).powi(2) - 2.0 * lambda as f64 * rho) * norm2;
                assert!((e - exact).abs() <= 1e-4 * norm2, "case {case} lambda {lambda}: {e} vs {exact}");
                if let Some(bound) = onebit_error_bound(form, &v) {
                    assert!(e <= bound * (1.0 + 1e-5) + 1e-12, "case {case} lambda {lambda}: {e} > {bound}");
                    checked_l2 += 1;
                }
            }
        }
        assert!(checked_l2 > 300, "the L2 bound applied in only {checked_l2} cases");
        // A spiky vector: lambda = 1 sends more error than it removes, lambda = rho does not.
        let mut spiky = vec![0.01f32; 64];
        spiky[0] = 10.0;
        let n2: f64 = spiky.iter().map(|x| (*x as f64).powi(2)).sum();
        assert!(error_of(OneBitForm::L2 { lambda: 1.0 }, &spiky) > n2);
        assert!(error_of(OneBitForm::L2 { lambda: 0.1 }, &spiky) < n2);
        assert!(error_of(OneBitForm::L1, &spiky) < n2);
        assert!(check_lambda(0.0).is_err() && check_lambda(1.5).is_err() && check_lambda(0.5).is_ok());
    }

    #[test]
    fn blocks_scale_each_run_of_values_alone() {
        // Two blocks of 4 of very different sizes, and a short last block of 2.
        let x = [1.0f32, -1.0, 3.0, -3.0, 100.0, -100.0, 100.0, 100.0, 0.5, -0.25];
        for (form, want) in [(OneBitForm::L1, [2.0f32, 100.0, 0.375]), (OneBitForm::L2 { lambda: 0.5 }, [0.5 * 5f32.sqrt(), 50.0, 0.5 * (0.3125f32 / 2.0).sqrt()])] {
            let mut ob = OneBit { block: 4, ..OneBit::default() };
            let mut enc = Vec::new();
            ob.encode_form("b", &x, form, &mut enc);
            assert_eq!(enc.len(), onebit_len(10, 4));
            assert_eq!(onebit_len(10, 4), 3 * 4 + 2);
            let scales: Vec<f32> = enc[..12].chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
            for (g, w) in scales.iter().zip(want) {
                assert!((g - w).abs() < 1e-5, "{form:?}: {scales:?} vs {want:?}");
            }
            let mut dec = vec![0f32; 10];
            assert_eq!(onebit_decode_add(&enc, &mut dec, 4), Some(14));
            for (i, d) in dec.iter().enumerate() {
                assert_eq!(*d, want[i / 4] * x[i].signum(), "{form:?} value {i}");
            }
        }
        // One scale per tensor (block 0) is the design's literal form.
        let mut ob = OneBit { block: 0, ..OneBit::default() };
        let mut enc = Vec::new();
        ob.encode_form("t", &x, OneBitForm::L1, &mut enc);
        assert_eq!(enc.len(), 4 + 2);
        assert_eq!(onebit_scales(10, 0), 1);
    }
}
