//! Compression of sparse rows (`--sparse-compression`) on the cross-host leg of the
//! hierarchical exchange, the leg that crosses the network: each key range owner sends its
//! host's list with every row in a smaller form, and every host merges the *decoded*
//! lists, its own included, so the hosts' tables stay identical.
//!
//! Forms ([`RowForm`]):
//! - **1-bit** (design 001's forms, see [`crate::onebit`]): one f32 scale and `dim` sign
//!   bits per row instead of `dim` f32s, keeping what that loses per key (error feedback:
//!   the residual of a key is added to its row the next time the key is sent). Memory: one
//!   residual row per key this rank has sent across hosts (its key range of the keys the
//!   job has trained), [`RowCompressor::residual_rows`].
//! - **fp16 / bf16**: each value rounded to half precision (TorchRec's quantized
//!   communication of embedding gradients), no residual. fp16 keeps 11 significant bits
//!   up to 65504 (a larger value becomes infinite and is caught as non-finite on the
//!   leader, `--nan-policy`); bf16 keeps 8 bits over f32's range.
//!
//! # Wire format (little-endian)
//!
//! ```text
//! offset  size             field
//! 0       4                magic "RRS1"
//! 4       2                version (1)
//! 6       2                form: 0 = 1-bit L1, 1 = 1-bit L2 (lambda applied by the sender), 2 = fp16, 3 = bf16
//! 8       4                dim
//! 12      4                n (rows)
//! 16      8n               keys, strictly increasing, never u64::MAX
//! ..      4n               counts, in 1..=max count
//! 1-bit:  4n               scales, f32, finite and >= 0
//!         n * ceil(dim/8)  sign bits of each row (bit i: value i, set when >= 0)
//! half:   2 n dim          the rows' values, row after row
//! ```

use std::collections::HashMap;

use half::{bf16, f16};

use super::error::DecodeError;
use super::list::{check_counts, check_keys, ListRef, SparseList};
use crate::onebit::OneBitForm;

/// The first four bytes of a compressed list.
pub const MAGIC: [u8; 4] = *b"RRS1";
/// Bytes of the header.
pub const HEADER_LEN: usize = 16;

/// How the rows of a list travel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RowForm {
    /// A scale and sign bits per row, with error feedback per key.
    OneBit(OneBitForm),
    /// Each value as an IEEE half (fp16).
    Fp16,
    /// Each value as a bfloat16.
    Bf16,
}

impl RowForm {
    fn code(self) -> u16 {
        match self {
            RowForm::OneBit(OneBitForm::L1) => 0,
            RowForm::OneBit(OneBitForm::L2 { .. }) => 1,
            RowForm::Fp16 => 2,
            RowForm::Bf16 => 3,
        }
    }

    /// Bytes of one row of `dim` values on the wire (key and count not included).
    fn row_bytes(self, dim: usize) -> usize {
        match self {
            RowForm::OneBit(_) => 4 + dim.div_ceil(8),
            RowForm::Fp16 | RowForm::Bf16 => 2 * dim,
        }
    }
}

/// Bytes of a list of `n` rows of `dim` values compressed in `form`.
pub fn encoded_len(n: usize, dim: usize, form: RowForm) -> usize {
    HEADER_LEN + n * (8 + 4 + form.row_bytes(dim))
}

/// Whether `bytes` hold a compressed list (else a list or error piece of
/// [`super::list`]'s format).
pub fn is_compressed(bytes: &[u8]) -> bool {
    bytes.len() >= 4 && bytes[..4] == MAGIC
}

/// The sender's side: the form and, for 1-bit, the residual of every key sent.
pub struct RowCompressor {
    form: RowForm,
    residuals: HashMap<u64, Box<[f32]>>,
}

impl RowCompressor {
    /// Compresses rows in `form`.
    pub fn new(form: RowForm) -> RowCompressor {
        RowCompressor { form, residuals: HashMap::new() }
    }

    /// The form.
    pub fn form(&self) -> RowForm {
        self.form
    }

    /// Keys whose residual is kept (1-bit only).
    pub fn residual_rows(&self) -> usize {
        self.residuals.len()
    }

    /// Encodes `list` (keys, counts, rows) onto `out` (cleared first): 1-bit, each row plus
    /// its key's residual as a scale and sign bits, keeping the new residuals; half, each
    /// value rounded.
    pub fn encode(&mut self, list: ListRef<'_>, out: &mut Vec<u8>) {
        let (n, dim) = (list.len(), list.dim);
        out.clear();
        out.reserve(encoded_len(n, dim, self.form));
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&1u16.to_le_bytes());
        out.extend_from_slice(&self.form.code().to_le_bytes());
        out.extend_from_slice(&(dim as u32).to_le_bytes());
        out.extend_from_slice(&(n as u32).to_le_bytes());
        for k in list.keys {
            out.extend_from_slice(&k.to_le_bytes());
        }
        for i in 0..n {
            out.extend_from_slice(&list.count(i).to_le_bytes());
        }
        match self.form {
            RowForm::OneBit(form) => self.encode_onebit(form, list, out),
            RowForm::Fp16 => (0..n).for_each(|i| list.row(i).iter().for_each(|v| out.extend_from_slice(&f16::from_f32(*v).to_le_bytes()))),
            RowForm::Bf16 => (0..n).for_each(|i| list.row(i).iter().for_each(|v| out.extend_from_slice(&bf16::from_f32(*v).to_le_bytes()))),
        }
    }

    fn encode_onebit(&mut self, form: OneBitForm, list: ListRef<'_>, out: &mut Vec<u8>) {
        let (n, dim) = (list.len(), list.dim);
        let bits_len = dim.div_ceil(8);
        let scales_at = out.len();
        out.resize(scales_at + 4 * n + bits_len * n, 0);
        let (scales, bits) = out[scales_at..].split_at_mut(4 * n);
        let mut v = vec![0f32; dim];
        for (i, k) in list.keys.iter().enumerate() {
            let r = self.residuals.entry(*k).or_insert_with(|| vec![0f32; dim].into_boxed_slice());
            for ((vj, gj), rj) in v.iter_mut().zip(list.row(i)).zip(r.iter()) {
                *vj = gj + rj;
            }
            let s = form.scale_of(&v);
            scales[4 * i..4 * i + 4].copy_from_slice(&s.to_le_bytes());
            let row_bits = &mut bits[i * bits_len..(i + 1) * bits_len];
            for (j, (vj, rj)) in v.iter().zip(r.iter_mut()).enumerate() {
                if *vj >= 0.0 {
                    row_bits[j / 8] |= 1 << (j % 8);
                    *rj = vj - s;
                } else {
                    *rj = vj + s;
                }
            }
        }
    }
}

fn corrupt(why: impl Into<String>) -> DecodeError {
    DecodeError::Corrupt(format!("compressed sparse list: {}", why.into()))
}

/// Decodes a compressed list of rows of `dim` values into `out` (cleared first), checking
/// every field (a hostile or truncated piece is an error, never a panic).
pub fn decode_into(bytes: &[u8], dim: usize, max_count: u32, out: &mut SparseList) -> Result<(), DecodeError> {
    if bytes.len() < HEADER_LEN || !is_compressed(bytes) {
        return Err(corrupt(format!("{} bytes without the RRS1 header", bytes.len())));
    }
    let u16_at = |o: usize| u16::from_le_bytes([bytes[o], bytes[o + 1]]);
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().expect("4 bytes"));
    if u16_at(4) != 1 {
        return Err(corrupt(format!("version {} (this ringrec reads 1)", u16_at(4))));
    }
    let theirs = u32_at(8) as usize;
    if theirs != dim {
        return Err(DecodeError::Dim { ours: dim, theirs });
    }
    let form = match u16_at(6) {
        0 => RowForm::OneBit(OneBitForm::L1),
        1 => RowForm::OneBit(OneBitForm::L2 { lambda: 1.0 }),
        2 => RowForm::Fp16,
        3 => RowForm::Bf16,
        f => return Err(corrupt(format!("form {f} (this ringrec reads 0 to 3)"))),
    };
    let n = u32_at(12) as usize;
    if bytes.len() != encoded_len(n, dim, form) {
        return Err(corrupt(format!("{} bytes for {n} rows of {dim} (expected {})", bytes.len(), encoded_len(n, dim, form))));
    }
    out.clear(dim);
    let keys = &bytes[HEADER_LEN..HEADER_LEN + 8 * n];
    out.keys.extend(keys.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))));
    check_keys(&out.keys)?;
    let counts = &bytes[HEADER_LEN + 8 * n..HEADER_LEN + 12 * n];
    out.counts.extend(counts.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes"))));
    check_counts(&out.counts, max_count)?;
    let rows = &bytes[HEADER_LEN + 12 * n..];
    out.grads.reserve(n * dim);
    let half = |c: &[u8]| u16::from_le_bytes([c[0], c[1]]);
    match form {
        RowForm::OneBit(_) => decode_onebit(rows, n, dim, out)?,
        RowForm::Fp16 => out.grads.extend(rows.chunks_exact(2).map(|c| f16::from_bits(half(c)).to_f32())),
        RowForm::Bf16 => out.grads.extend(rows.chunks_exact(2).map(|c| bf16::from_bits(half(c)).to_f32())),
    }
    Ok(())
}

/// The rows of a 1-bit list: `n` scales, then the sign bits of each row.
fn decode_onebit(rows: &[u8], n: usize, dim: usize, out: &mut SparseList) -> Result<(), DecodeError> {
    let (scales, bits) = rows.split_at(4 * n);
    let bits_len = dim.div_ceil(8);
    for i in 0..n {
        let s = f32::from_le_bytes(scales[4 * i..4 * i + 4].try_into().expect("4 bytes"));
        if !s.is_finite() || s < 0.0 {
            return Err(corrupt(format!("scale {s} of row {i} (key {})", out.keys[i])));
        }
        let row_bits = &bits[i * bits_len..(i + 1) * bits_len];
        out.grads.extend((0..dim).map(|j| if row_bits[j / 8] >> (j % 8) & 1 == 1 { s } else { -s }));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sparse::list::tests::list;

    #[test]
    fn rows_round_trip_as_scale_and_signs_and_the_residual_feeds_back() {
        let dim = 5;
        let keys = [3u64, 9, 40];
        let rows: Vec<f32> = vec![1.0, -2.0, 3.0, -4.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0, -1.0, 2.0, 2.0, -0.25];
        let l = list(&keys, &rows, &[1, 2, 3], dim);
        for form in [OneBitForm::L1, OneBitForm::L2 { lambda: 1.0 }, OneBitForm::L2 { lambda: 0.5 }] {
            let mut c = RowCompressor::new(RowForm::OneBit(form));
            let mut wire = Vec::new();
            c.encode(l.view(), &mut wire);
            assert_eq!(wire.len(), encoded_len(3, dim, RowForm::OneBit(form)));
            let mut back = SparseList::default();
            decode_into(&wire, dim, 3, &mut back).unwrap();
            assert_eq!(back.keys, keys);
            assert_eq!(back.counts, [1, 2, 3]);
            for i in 0..3 {
                let row = &rows[i * dim..(i + 1) * dim];
                let s = form.scale_of(row);
                let want: Vec<f32> = row.iter().map(|v| if *v >= 0.0 { s } else { -s }).collect();
                assert_eq!(back.row(i), &want[..], "{form:?} row {i}");
                // The residual is what was not sent.
                let r = &c.residuals[&keys[i]];
                for j in 0..dim {
                    assert!((r[j] - (row[j] - want[j])).abs() < 1e-6);
                }
            }
            assert_eq!(c.residual_rows(), 3);
            // Sent again and again, a constant row's decoded mean approaches it.
            let mut sum = vec![0f32; 3 * dim];
            for _ in 0..400 {
                c.encode(l.view(), &mut wire);
                decode_into(&wire, dim, 3, &mut back).unwrap();
                sum.iter_mut().zip(&back.grads).for_each(|(a, b)| *a += b);
            }
            for (j, (a, b)) in sum.iter().zip(&rows).enumerate() {
                assert!((a / 400.0 - b).abs() < 0.05, "{form:?} value {j}: {} vs {b}", a / 400.0);
            }
        }
    }

    #[test]
    fn hostile_pieces_are_errors() {
        let l = list(&[1, 2], &[1.0, -1.0, 2.0, 0.5], &[1, 1], 2);
        let mut c = RowCompressor::new(RowForm::OneBit(OneBitForm::L1));
        let mut wire = Vec::new();
        c.encode(l.view(), &mut wire);
        let mut out = SparseList::default();
        let bad = |w: &[u8], dim: usize| decode_into(w, dim, 2, &mut SparseList::default()).unwrap_err().to_string();
        assert!(bad(&wire[..wire.len() - 1], 2).contains("bytes for 2 rows"));
        assert!(matches!(decode_into(&wire, 3, 2, &mut out), Err(DecodeError::Dim { ours: 3, theirs: 2 })));
        let mut w = wire.clone();
        w[16..24].copy_from_slice(&5u64.to_le_bytes()); // keys 5, 2: not increasing
        assert!(bad(&w, 2).contains("strictly increasing"));
        let mut w = wire.clone();
        w[32..36].copy_from_slice(&7u32.to_le_bytes()); // count 7 > 2
        assert!(bad(&w, 2).contains("count 7"));
        let mut w = wire.clone();
        w[40..44].copy_from_slice(&f32::NAN.to_le_bytes());
        assert!(bad(&w, 2).contains("scale NaN"));
        assert!(bad(b"RRSG", 2).contains("without the RRS1 header"));
        let mut w = wire.clone();
        w[6] = 9;
        assert!(bad(&w, 2).contains("form 9"));
        // A half list cut short.
        let mut h = RowCompressor::new(RowForm::Fp16);
        h.encode(l.view(), &mut w);
        assert!(bad(&w[..w.len() - 2], 2).contains("bytes for 2 rows"));
    }

    #[test]
    fn half_rows_round_to_the_nearest_half_without_residuals() {
        let dim = 3;
        let keys = [7u64, 8];
        let rows = vec![1.0f32 / 3.0, -70000.0, 1e-9, 2.5, -0.1, 65504.0];
        let l = list(&keys, &rows, &[2, 1], dim);
        for (form, round) in [(RowForm::Fp16, (|v: f32| f16::from_f32(v).to_f32()) as fn(f32) -> f32), (RowForm::Bf16, |v: f32| bf16::from_f32(v).to_f32())] {
            let mut c = RowCompressor::new(form);
            let mut wire = Vec::new();
            c.encode(l.view(), &mut wire);
            assert_eq!(wire.len(), HEADER_LEN + 2 * (8 + 4 + 2 * dim), "{form:?}");
            let mut back = SparseList::default();
            decode_into(&wire, dim, 2, &mut back).unwrap();
            assert_eq!(back.keys, keys);
            assert_eq!(back.counts, [2, 1]);
            let want: Vec<f32> = rows.iter().map(|v| round(*v)).collect();
            assert_eq!(back.grads.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{form:?}");
            assert_eq!(c.residual_rows(), 0, "{form:?}: no error feedback");
        }
        // fp16 overflows to infinity (the leader's non-finite check catches it); bf16 does not.
        let mut c = RowCompressor::new(RowForm::Fp16);
        let mut wire = Vec::new();
        c.encode(l.view(), &mut wire);
        let mut back = SparseList::default();
        decode_into(&wire, dim, 2, &mut back).unwrap();
        assert_eq!(back.grads[1], f32::NEG_INFINITY);
        assert!((back.grads[0] - 1.0 / 3.0).abs() < 1e-3 && back.grads[2] == 0.0, "1e-9 is below fp16's smallest subnormal");
    }
}
