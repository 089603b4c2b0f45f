//! Deterministic initial rows and the slot hash.
//!
//! A key that is not in the table reads as its *initial row*, a pure function of
//! `(key, seed, dim, init_scale)`, so every rank of every host sees the same values without
//! any communication, and inserting the key later (on the leader's first update) starts from
//! exactly those values.
//!
//! Element `j` of the row of `key`:
//! ```text
//! base = splitmix64(seed ^ splitmix64(key))
//! u    = splitmix64(base + (j + 1) * 0x9E3779B97F4A7C15) >> 40        // 24 random bits
//! x    = init_scale * (u / 2^23 - 1)                                   // uniform in [-s, s)
//! ```
//! then rounded to the storage dtype (so f16/bf16 tables read the same before and after
//! insertion). The default `init_scale` is `1 / sqrt(dim)`.

use half::{bf16, f16};
use half::slice::HalfFloatSliceExt;

use crate::hash::GOLDEN;

/// Home slot of `key` in a table of `2^(64 - shift)` slots: multiply-shift hashing (the
/// high bits of `(key ^ key >> 32) * golden`), one multiply per lookup.
#[inline(always)]
pub fn home_slot(key: u64, shift: u32) -> usize {
    ((key ^ (key >> 32)).wrapping_mul(GOLDEN) >> shift) as usize
}

/// Writes the f32 initial row of `key` (before rounding to the storage dtype) into `out`
/// (in the base layer, so the devices compute the same rows: `Op::InitRows`).
pub use crate::hash::init_row_f32;

/// A storage element type: converts between its stored form and f32.
pub trait Elem: bytemuck::Pod + Send + Sync + 'static {
    /// Widens `src` into `dst` (same length).
    fn load(src: &[Self], dst: &mut [f32]);
    /// Narrows `src` into `dst` (same length), round to nearest even.
    fn store(src: &[f32], dst: &mut [Self]);
    /// Rounds f32 values in place to what this type can hold.
    fn round(v: &mut [f32]);
}

impl Elem for f32 {
    #[inline]
    fn load(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    #[inline]
    fn store(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    #[inline]
    fn round(_: &mut [f32]) {}
}

impl Elem for f16 {
    #[inline]
    fn load(src: &[f16], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
    #[inline]
    fn store(src: &[f32], dst: &mut [f16]) {
        dst.convert_from_f32_slice(src);
    }
    #[inline]
    fn round(v: &mut [f32]) {
        for x in v {
            *x = f16::from_f32(*x).to_f32();
        }
    }
}

impl Elem for bf16 {
    #[inline]
    fn load(src: &[bf16], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
    #[inline]
    fn store(src: &[f32], dst: &mut [bf16]) {
        dst.convert_from_f32_slice(src);
    }
    #[inline]
    fn round(v: &mut [f32]) {
        for x in v {
            *x = bf16::from_f32(*x).to_f32();
        }
    }
}

/// The initial row of `key` as a table storing `T` returns it.
#[inline]
pub fn init_row<T: Elem>(key: u64, seed: u64, scale: f32, out: &mut [f32]) {
    init_row_f32(key, seed, scale, out);
    T::round(out);
}

/// The default init scale for `dim`: `1 / sqrt(dim)`.
pub fn default_init_scale(dim: u32) -> f32 {
    1.0 / (dim.max(1) as f32).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_rows_are_deterministic_and_in_range() {
        let mut a = [0f32; 64];
        let mut b = [0f32; 64];
        init_row_f32(12345, 7, 0.125, &mut a);
        init_row_f32(12345, 7, 0.125, &mut b);
        assert_eq!(a, b);
        assert!(a.iter().all(|x| (-0.125..0.125).contains(x)));
        init_row_f32(12345, 8, 0.125, &mut b);
        assert_ne!(a, b, "the seed changes the row");
        init_row_f32(12346, 7, 0.125, &mut b);
        assert_ne!(a, b, "the key changes the row");
        let mean: f32 = a.iter().sum::<f32>() / 64.0;
        assert!(mean.abs() < 0.05, "{mean}");
    }

    #[test]
    fn home_slots_spread_sequential_keys() {
        let shift = 64 - 10;
        let mut hits = vec![0u32; 1024];
        for k in 0..800u64 {
            hits[home_slot(k, shift)] += 1;
        }
        assert!(hits.iter().all(|h| *h <= 4), "max {}", hits.iter().max().unwrap());
    }
}
