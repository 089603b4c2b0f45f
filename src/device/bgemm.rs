//! bf16 GEMM on the CPU (`--dense-precision bf16`): the operands rounded to bfloat16
//! (round to nearest even, as [`half::bf16::from_f32`]), the products accumulated in f32 by
//! AVX-512 BF16's `vdpbf16ps` (`_mm512_dpbf16_ps`: each f32 lane adds the products of one
//! pair of bf16 values, so the inner dimension runs in pairs).
//!
//! Each GEMM packs its operands once: `a`'s rows as pairs along k (one `u32` per pair, the
//! even element in the low half), `b` in panels of up to 64 columns, each k pair a row of
//! the panel's columns' pairs (zero-padded to the panel's width and to an even k). A
//! register tile of up to 6 rows x 64 columns (24 zmm accumulators) runs over all of k and
//! is stored once, masked at the right edge. Rows of `c` are cut into parts for the rank's
//! threads as the f32 path cuts them ([`crate::partition::part`]), the packed `b` shared.
//!
//! A product of two bf16 values is exact in f32, so the result equals the f32 sum of the
//! rounded operands' products up to summation order (`vdpbf16ps` flushes denormal inputs
//! and outputs to zero).

use std::cell::RefCell;
use std::ops::Range;

use rayon::prelude::*;

use crate::partition::part;

/// Rows of the register tile.
const MR: usize = 6;
/// f32 lanes of a zmm register.
const LANES: usize = 16;
/// zmm registers across a full panel.
const NV: usize = 4;

/// Whether this CPU has the instructions (AVX-512F and AVX-512 BF16).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `x` rounded to bfloat16 (nearest, ties to even; a NaN stays a quiet NaN), as bits: the
/// rounding of [`half::bf16::from_f32`], written so the packing loops vectorise.
#[inline(always)]
pub fn round(x: f32) -> u16 {
    let b = x.to_bits();
    if b & 0x7fff_ffff > 0x7f80_0000 {
        return ((b >> 16) | 0x40) as u16;
    }
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// `x` rounded to bfloat16 and widened back (what the GEMM multiplies).
pub fn rounded(x: f32) -> f32 {
    f32::from_bits((round(x) as u32) << 16)
}

fn pair(lo: f32, hi: f32) -> u32 {
    round(lo) as u32 | (round(hi) as u32) << 16
}

/// Columns of a panel of `b` for a product with `n` columns: 64, or fewer vectors' worth
/// when `n` is smaller (the last layer's single column).
fn panel_vectors(n: usize) -> usize {
    n.div_ceil(LANES).clamp(1, NV)
}

/// `b` packed: panels of `w` columns, in each a row of `w` pairs per k pair.
struct PackedB<'a> {
    data: &'a [u32],
    n: usize,
    kp: usize,
    vectors: usize,
}

/// Packs op(`b`) (k x n; `b_t`: stored n x k) into `out` (resized): panel `q`, pair `p`,
/// column `j` at `(q * kp + p) * w + j`.
fn pack_b(k: usize, n: usize, b: &[f32], b_t: bool, out: &mut Vec<u32>) -> usize {
    let (kp, vectors) = (k.div_ceil(2), panel_vectors(n));
    let w = vectors * LANES;
    let panels = n.div_ceil(w);
    out.clear();
    out.resize(panels * kp * w, 0);
    let at = |p: usize, j: usize| if p >= k { 0.0 } else if b_t { b[j * k + p] } else { b[p * n + j] };
    for q in 0..panels {
        let cols = q * w..((q + 1) * w).min(n);
        let panel = &mut out[q * kp * w..(q + 1) * kp * w];
        if b_t {
            for j in cols.clone() {
                for (p, row) in panel.chunks_exact_mut(w).enumerate() {
                    row[j - cols.start] = pair(at(2 * p, j), at(2 * p + 1, j));
                }
            }
        } else {
            for (p, row) in panel.chunks_exact_mut(w).enumerate() {
                if 2 * p + 1 < k {
                    let (lo, hi) = (&b[2 * p * n..][cols.clone()], &b[(2 * p + 1) * n..][cols.clone()]);
                    for ((o, l), h) in row.iter_mut().zip(lo).zip(hi) {
                        *o = pair(*l, *h);
                    }
                } else {
                    for (o, l) in row.iter_mut().zip(&b[2 * p * n..][cols.clone()]) {
                        *o = pair(*l, 0.0);
                    }
                }
            }
        }
    }
    kp
}

/// Packs rows `rows` of op(`a`) (m x k; `a_t`: stored k x m) into `out` (resized): row `i`
/// (from `rows.start`), pair `p` at `i * kp + p`.
fn pack_a(m: usize, k: usize, a: &[f32], a_t: bool, rows: Range<usize>, out: &mut Vec<u32>) {
    let kp = k.div_ceil(2);
    out.clear();
    out.resize(rows.len() * kp, 0);
    if a_t {
        for p in 0..kp {
            let lo = &a[2 * p * m..][rows.clone()];
            if 2 * p + 1 < k {
                let hi = &a[(2 * p + 1) * m..][rows.clone()];
                for (i, (l, h)) in lo.iter().zip(hi).enumerate() {
                    out[i * kp + p] = pair(*l, *h);
                }
            } else {
                for (i, l) in lo.iter().enumerate() {
                    out[i * kp + p] = pair(*l, 0.0);
                }
            }
        }
    } else {
        for (i, row) in out.chunks_exact_mut(kp.max(1)).take(rows.len()).enumerate() {
            let src = &a[(rows.start + i) * k..(rows.start + i + 1) * k];
            let mut pairs = src.chunks_exact(2);
            for (o, s) in row.iter_mut().zip(&mut pairs) {
                *o = pair(s[0], s[1]);
            }
            if let [last] = pairs.remainder() {
                row[kp - 1] = pair(*last, 0.0);
            }
        }
    }
}

thread_local! {
    /// Each thread's packed rows of `a`, reused from GEMM to GEMM.
    static PACKED_A: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
    /// The packed `b` of the GEMMs this thread starts, reused.
    static PACKED_B: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with this thread's buffer `key` (a fresh one if it is in use: a GEMM started
/// by a job stolen while this thread waited inside another).
fn with_buffer<R>(key: &'static std::thread::LocalKey<RefCell<Vec<u32>>>, f: impl FnOnce(&mut Vec<u32>) -> R) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut v) => f(&mut v),
        Err(_) => f(&mut Vec::new()),
    })
}

/// `c (m x n) = op(a) (m x k) * op(b) (k x n)` in bf16 with f32 accumulation, all
/// row-major (`a_t`: `a` stored k x m; `b_t`: `b` stored n x k), the rows of `c` cut into
/// `parts` (on the rayon pool when more than one); `epilogue(rows, c_rows)` runs on each
/// part once its rows are computed.
///
/// # Panics
/// When a slice is shorter than its shape says, or the CPU lacks the instructions
/// ([`available`]; the device checks that when the precision is set).
#[allow(clippy::too_many_arguments)]
pub fn gemm(m: usize, n: usize, k: usize, a: &[f32], a_t: bool, b: &[f32], b_t: bool, c: &mut [f32], parts: usize, epilogue: impl Fn(Range<usize>, &mut [f32]) + Sync) {
    assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n, "bf16 gemm: slices shorter than {m}x{k} * {k}x{n}");
    assert!(available(), "bf16 gemm: this CPU lacks AVX-512 BF16");
    if m == 0 || n == 0 {
        return;
    }
    let parts = parts.clamp(1, m);
    with_buffer(&PACKED_B, |packed| {
        let kp = pack_b(k, n, b, b_t, packed);
        let pb = PackedB { data: packed, n, kp, vectors: panel_vectors(n) };
        let run = |(i, c): (usize, &mut [f32])| {
            let rows = part(m, parts, i);
            with_buffer(&PACKED_A, |pa| {
                pack_a(m, k, a, a_t, rows.clone(), pa);
                product(rows.len(), pa, &pb, c);
            });
            epilogue(rows, c);
        };
        let mut chunks = Vec::with_capacity(parts);
        let mut rest = &mut c[..m * n];
        for i in 0..parts {
            let (x, y) = rest.split_at_mut(part(m, parts, i).len() * n);
            chunks.push(x);
            rest = y;
        }
        if parts == 1 {
            chunks.into_iter().enumerate().for_each(run);
        } else {
            chunks.into_par_iter().enumerate().for_each(run);
        }
    });
}

/// `c (rows x n) = a b` from packed operands.
fn product(rows: usize, pa: &[u32], pb: &PackedB<'_>, c: &mut [f32]) {
    let (n, kp, w) = (pb.n, pb.kp, pb.vectors * LANES);
    assert!(pa.len() >= rows * kp && c.len() >= rows * n && pb.data.len() >= n.div_ceil(w) * kp * w);
    for q in 0..n.div_ceil(w) {
        let panel = &pb.data[q * kp * w..];
        let cols = (n - q * w).min(w);
        for r0 in (0..rows).step_by(MR) {
            let mr = (rows - r0).min(MR);
            // SAFETY: the tile reads rows r0..r0+mr of `pa` (kp pairs each, inside it by the
            // assert), kp rows of w pairs of the panel (inside `pb.data`), and writes rows
            // r0..r0+mr, columns q*w..q*w+cols of `c` (row stride n; inside it by the assert);
            // `gemm` checked the CPU has the instructions.
            unsafe { tile_dispatch(mr, pb.vectors, kp, pa[r0 * kp..].as_ptr(), panel.as_ptr(), c[r0 * n + q * w..].as_mut_ptr(), n, cols) };
        }
    }
}

/// The tile for `mr` rows and `vectors` zmm columns.
///
/// # Safety
/// As [`tile`].
#[cfg(target_arch = "x86_64")]
unsafe fn tile_dispatch(mr: usize, vectors: usize, kp: usize, a: *const u32, b: *const u32, c: *mut f32, ldc: usize, cols: usize) {
    macro_rules! pick {
        ($($r:literal),*) => {
            match (mr, vectors) {
                $(($r, 1) => tile::<$r, 1>(kp, a, b, c, ldc, cols),
                  ($r, 2) => tile::<$r, 2>(kp, a, b, c, ldc, cols),
                  ($r, 3) => tile::<$r, 3>(kp, a, b, c, ldc, cols),
                  ($r, _) => tile::<$r, 4>(kp, a, b, c, ldc, cols),)*
                _ => unreachable!("tile rows 1..=6"),
            }
        };
    }
    // SAFETY: as the caller's.
    unsafe { pick!(1, 2, 3, 4, 5, 6) }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn tile_dispatch(_: usize, _: usize, _: usize, _: *const u32, _: *const u32, _: *mut f32, _: usize, _: usize) {
    unreachable!("bf16 gemm needs x86-64 with AVX-512 BF16 (checked by `available`)")
}

/// One register tile: `R` rows of packed `a` (row stride `kp`) times a panel of `V` zmm
/// columns of packed `b` (`kp` rows of `16 V` pairs), stored into `c` (row stride `ldc`),
/// its first `cols` columns.
///
/// # Safety
/// The CPU has AVX-512F and AVX-512 BF16; `a` holds `R * kp` pairs, `b` holds `kp * 16 V`,
/// `c` holds `R` rows of `ldc` values from the pointer with `cols <= 16 V` of them written.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
#[allow(clippy::needless_range_loop)] // indices keep the accumulators in registers
unsafe fn tile<const R: usize, const V: usize>(kp: usize, a: *const u32, b: *const u32, c: *mut f32, ldc: usize, cols: usize) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); V]; R];
    for p in 0..kp {
        // SAFETY (the pointer arithmetic and loads): inside the operands by the contract.
        let bp = unsafe { b.add(p * V * LANES) };
        let mut bv = [_mm512_setzero_si512(); V];
        for v in 0..V {
            bv[v] = unsafe { _mm512_loadu_si512(bp.add(v * LANES).cast()) };
        }
        for r in 0..R {
            let av: __m512bh = unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(*a.add(r * kp + p) as i32)) };
            for v in 0..V {
                let bh: __m512bh = unsafe { std::mem::transmute::<__m512i, __m512bh>(bv[v]) };
                acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bh);
            }
        }
    }
    for r in 0..R {
        for v in 0..V {
            let col = v * LANES;
            if col >= cols {
                break;
            }
            // SAFETY: row r, columns col.. of `c`: inside it by the contract (masked to cols).
            unsafe {
                let out = c.add(r * ldc + col);
                if cols - col >= LANES {
                    _mm512_storeu_ps(out, acc[r][v]);
                } else {
                    _mm512_mask_storeu_ps(out, ((1u32 << (cols - col)) - 1) as u16, acc[r][v]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::splitmix64_next;

    fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n).map(|_| (splitmix64_next(&mut s) >> 40) as f32 / (1u64 << 23) as f32 - 1.0).collect()
    }

    /// The f64 sum of the bf16-rounded operands' products, and the sum of their magnitudes.
    fn reference(m: usize, n: usize, k: usize, a: &[f32], a_t: bool, b: &[f32], b_t: bool) -> (Vec<f64>, Vec<f64>) {
        let (mut c, mut mag) = (vec![0f64; m * n], vec![0f64; m * n]);
        for i in 0..m {
            for j in 0..n {
                for p in 0..k {
                    let av = rounded(if a_t { a[p * m + i] } else { a[i * k + p] }) as f64;
                    let bv = rounded(if b_t { b[j * k + p] } else { b[p * n + j] }) as f64;
                    c[i * n + j] += av * bv;
                    mag[i * n + j] += (av * bv).abs();
                }
            }
        }
        (c, mag)
    }

    #[test]
    fn rounding_is_half_s_round_to_nearest_even() {
        let mut s = 3;
        let special = [0.0f32, -0.0, 1.0, f32::MAX, f32::MIN_POSITIVE, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, f32::from_bits(0x3f80_8000), f32::from_bits(0x3f81_8000), f32::from_bits(0x3f80_8001), f32::from_bits(0x7f7f_ffff)];
        let randoms = (0..100_000).map(|_| f32::from_bits(splitmix64_next(&mut s) as u32));
        for x in special.into_iter().chain(randoms) {
            let want = half::bf16::from_f32(x);
            if x.is_nan() {
                assert!(f32::from_bits((round(x) as u32) << 16).is_nan(), "{x}");
            } else {
                assert_eq!(round(x), want.to_bits(), "{x:e} ({:#x})", x.to_bits());
            }
        }
    }

    /// Every transpose combination, odd k, m and n off the tile, one and several parts:
    /// the f32 sums of the rounded products up to summation order, |c - ref| <= k 2^-24
    /// sum |a_p b_p| (the bound of k roundings of an f32 sum; products of bf16 values are
    /// exact in f32).
    #[test]
    fn equals_the_rounded_operands_f32_product_up_to_summation_order() {
        if !available() {
            eprintln!("skipped: this CPU lacks AVX-512 BF16");
            return;
        }
        for (m, n, k) in [(37, 19, 53), (13, 70, 429), (6, 64, 2), (7, 1, 128), (1, 129, 1), (64, 256, 31), (5, 3, 0)] {
            let a = random(m * k, 1 + k as u64);
            let b = random(k * n, 2 + n as u64);
            for a_t in [false, true] {
                for b_t in [false, true] {
                    for parts in [1, 3] {
                        let (want, mag) = reference(m, n, k, &a, a_t, &b, b_t);
                        let mut c = vec![f32::NAN; m * n + 1];
                        gemm(m, n, k, &a, a_t, &b, b_t, &mut c, parts, |_, _| {});
                        assert!(c[m * n].is_nan(), "wrote past the product");
                        for (i, (g, (w, s))) in c.iter().zip(want.iter().zip(&mag)).enumerate() {
                            let tol = k as f64 * f64::powi(2.0, -24) * s;
                            assert!((*g as f64 - w).abs() <= tol, "{m}x{n}x{k} a_t {a_t} b_t {b_t} parts {parts}: c[{i}] = {g}, want {w} +- {tol}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_epilogue_runs_once_on_each_part() {
        if !available() {
            return;
        }
        let (m, n, k) = (23, 5, 9);
        let (a, b) = (random(m * k, 5), random(k * n, 6));
        let mut plain = vec![0f32; m * n];
        gemm(m, n, k, &a, false, &b, false, &mut plain, 1, |_, _| {});
        let seen = std::sync::Mutex::new(Vec::new());
        let mut c = vec![0f32; m * n];
        gemm(m, n, k, &a, false, &b, false, &mut c, 4, |rows, c| {
            assert_eq!(c.len(), rows.len() * n);
            c.iter_mut().for_each(|v| *v += 1.0);
            seen.lock().unwrap().push(rows);
        });
        let mut seen = seen.into_inner().unwrap();
        seen.sort_by_key(|r| r.start);
        assert_eq!(seen, (0..4).map(|i| part(m, 4, i)).collect::<Vec<_>>());
        assert_eq!(c, plain.iter().map(|v| v + 1.0).collect::<Vec<_>>());
    }
}
