//! bf16 GEMM on the CPU (`--dense-precision bf16`): the operands rounded to bfloat16
//! (round to nearest even, as [`half::bf16::from_f32`]), the products accumulated in f32 by
//! AVX-512 BF16's `vdpbf16ps` (`_mm512_dpbf16_ps`: each f32 lane adds the products of one
//! pair of bf16 values, so the inner dimension runs in pairs).
//!
//! Each GEMM packs its operands once: `a`'s rows as pairs along k (one `u32` per pair, the
//! even element in the low half), `b` in panels of up to 64 columns, each k pair a row of
//! the panel's columns' pairs (zero-padded to the panel's width and to an even k). A
//! register tile of up to 6 rows x 64 columns (24 zmm accumulators) runs over a block of 96
//! k pairs (the panel's block stays in L1) and is stored, masked at the right edge, then
//! added to by the next block. Rows of `c` are cut into parts for the rank's
//! threads as the f32 path cuts them ([`crate::partition::part`]), the packed `b` shared.
//!
//! A product of two bf16 values is exact in f32, so the result equals the f32 sum of the
//! rounded operands' products up to summation order (`vdpbf16ps` flushes denormal inputs
//! and outputs to zero).
//!
//! The AVX-512 intrinsics and target features are stable since Rust 1.89, above the crate's
//! declared `rust-version`: clippy's MSRV checks take this module at 1.89 (its `mod` line).

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
/// k pairs per block: a full panel's block (96 x 64 pairs, 24 KiB) stays in L1 while the
/// row tiles run over it.
const KC: usize = 96;

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
///
/// # Safety
/// The CPU has AVX-512F and AVX-512BW ([`available`] checks more).
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx512f,avx512bw"))]
unsafe fn pack_b(k: usize, n: usize, b: &[f32], b_t: bool, out: &mut Vec<u32>) -> usize {
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

/// Rows of a block of packed `a`: row `r`'s pair `p` is at `((r / ABLK) * kp + p) * ABLK + r %
/// ABLK`, so the tiles' broadcasts of one pair read one cache line, and packing `a`
/// stored k x m (a weight gradient's `x^T`) is a contiguous, vectorised interleave.
const ABLK: usize = 16;

/// Packs rows `rows` of op(`a`) (m x k; `a_t`: stored k x m) into `out` (resized) in blocks
/// of [`ABLK`] rows (the last one zero-padded).
///
/// # Safety
/// The CPU has AVX-512F and AVX-512BW ([`available`] checks more).
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx512f,avx512bw"))]
unsafe fn pack_a(m: usize, k: usize, a: &[f32], a_t: bool, rows: Range<usize>, out: &mut Vec<u32>) {
    let kp = k.div_ceil(2);
    out.clear();
    out.resize(rows.len().div_ceil(ABLK) * ABLK * kp, 0);
    if kp == 0 {
        return;
    }
    let mut line = vec![0u32; kp];
    for (b, block) in out.chunks_exact_mut(ABLK * kp).enumerate() {
        let first = rows.start + b * ABLK;
        let height = (rows.end - first).min(ABLK);
        if a_t {
            // Pair p of the block's rows: two rows of the stored matrix, interleaved.
            for (p, dst) in block.chunks_exact_mut(ABLK).enumerate() {
                let lo = &a[2 * p * m + first..][..height];
                if 2 * p + 1 < k {
                    let hi = &a[(2 * p + 1) * m + first..][..height];
                    for ((o, l), h) in dst.iter_mut().zip(lo).zip(hi) {
                        *o = pair(*l, *h);
                    }
                } else {
                    for (o, l) in dst.iter_mut().zip(lo) {
                        *o = pair(*l, 0.0);
                    }
                }
            }
        } else {
            // Each row's pairs (contiguous in a) into `line`, then spread at stride ABLK.
            for j in 0..height {
                let src = &a[(first + j) * k..(first + j + 1) * k];
                let mut pairs = src.chunks_exact(2);
                for (o, s) in line.iter_mut().zip(&mut pairs) {
                    *o = pair(s[0], s[1]);
                }
                if let [last] = pairs.remainder() {
                    line[kp - 1] = pair(*last, 0.0);
                }
                for (p, v) in line.iter().enumerate() {
                    block[p * ABLK + j] = *v;
                }
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
        // SAFETY: `available` checked the CPU's AVX-512 above.
        let kp = unsafe { pack_b(k, n, b, b_t, packed) };
        let pb = PackedB { data: packed, n, kp, vectors: panel_vectors(n) };
        let run = |(i, c): (usize, &mut [f32])| {
            let rows = part(m, parts, i);
            with_buffer(&PACKED_A, |pa| {
                // SAFETY: `available` checked the CPU's AVX-512 above.
                unsafe { pack_a(m, k, a, a_t, rows.clone(), pa) };
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
    assert!(pa.len() >= rows.div_ceil(ABLK) * ABLK * kp && c.len() >= rows * n && pb.data.len() >= n.div_ceil(w) * kp * w);
    let mut p0 = 0;
    loop {
        let kc = (kp - p0).min(KC);
        for q in 0..n.div_ceil(w) {
            let panel = &pb.data[(q * kp + p0) * w..];
            let cols = (n - q * w).min(w);
            for r0 in (0..rows).step_by(ABLK) {
                let block = &pa[((r0 / ABLK) * kp + p0) * ABLK..];
                for sub in (0..(rows - r0).min(ABLK)).step_by(MR) {
                    let t = Tile { rows: (rows - r0 - sub).min(MR).min(ABLK - sub), vectors: pb.vectors, kc, ldc: n, cols, accumulate: p0 > 0 };
                    // SAFETY: the tile reads pairs p0..p0+kc of rows r0+sub.. of `pa` (inside
                    // its block, inside `pa` by the assert), kc rows of w pairs of the panel
                    // from pair p0 (inside `pb.data`), and reads and writes rows r0+sub..,
                    // columns q*w..q*w+cols of `c` (row stride n; inside it by the assert);
                    // `gemm` checked the CPU has the instructions.
                    unsafe { t.run(block[sub..].as_ptr(), panel.as_ptr(), c[(r0 + sub) * n + q * w..].as_mut_ptr()) };
                }
            }
        }
        p0 += kc;
        if p0 >= kp {
            break;
        }
    }
}

/// One register tile's shape: `rows` rows of a block of packed `a` times `kc`
/// rows of a panel of `vectors` zmm columns, into `cols` columns of `c` (row stride `ldc`),
/// overwriting them or (`accumulate`) adding to them.
struct Tile {
    rows: usize,
    vectors: usize,
    kc: usize,
    ldc: usize,
    cols: usize,
    accumulate: bool,
}

impl Tile {
    /// Runs the tile's kernel for its rows and vectors.
    ///
    /// # Safety
    /// As [`tile`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn run(&self, a: *const u32, b: *const u32, c: *mut f32) {
        macro_rules! pick {
            ($($r:literal),*) => {
                match (self.rows, self.vectors) {
                    $(($r, 1) => tile::<$r, 1>(self, a, b, c),
                      ($r, 2) => tile::<$r, 2>(self, a, b, c),
                      ($r, 3) => tile::<$r, 3>(self, a, b, c),
                      ($r, _) => tile::<$r, 4>(self, a, b, c),)*
                    _ => unreachable!("tile rows 1..=6"),
                }
            };
        }
        // SAFETY: as the caller's.
        unsafe { pick!(1, 2, 3, 4, 5, 6) }
    }

    #[cfg(not(target_arch = "x86_64"))]
    unsafe fn run(&self, _: *const u32, _: *const u32, _: *mut f32) {
        unreachable!("bf16 gemm needs x86-64 with AVX-512 BF16 (checked by `available`)")
    }
}

/// One register tile ([`Tile`]) of `R` rows and `V` zmm columns.
///
/// # Safety
/// The CPU has AVX-512F and AVX-512 BF16; `a` holds `t.kc` pairs of `R` rows in a block's
/// layout (pair p of row r at `p * ABLK + r`), `b` holds `t.kc * 16 V` pairs, `c` holds `R` rows of `t.ldc` values from the
/// pointer with `t.cols <= 16 V` of them read and written.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
#[allow(clippy::needless_range_loop)] // indices keep the accumulators in registers
unsafe fn tile<const R: usize, const V: usize>(t: &Tile, a: *const u32, b: *const u32, c: *mut f32) {
    use std::arch::x86_64::*;
    let (ldc, cols) = (t.ldc, t.cols);
    let mask = |col: usize| if cols - col >= LANES { u16::MAX } else { ((1u32 << (cols - col)) - 1) as u16 };
    let mut acc = [[_mm512_setzero_ps(); V]; R];
    if t.accumulate {
        for r in 0..R {
            for v in 0..V {
                if v * LANES < cols {
                    // SAFETY: row r, columns v*16.. of `c`, masked to cols: inside it by the contract.
                    acc[r][v] = unsafe { _mm512_maskz_loadu_ps(mask(v * LANES), c.add(r * ldc + v * LANES)) };
                }
            }
        }
    }
    for p in 0..t.kc {
        // SAFETY (the pointer arithmetic and loads): inside the operands by the contract.
        let bp = unsafe { b.add(p * V * LANES) };
        let mut bv = [_mm512_setzero_si512(); V];
        for v in 0..V {
            bv[v] = unsafe { _mm512_loadu_si512(bp.add(v * LANES).cast()) };
        }
        for r in 0..R {
            let av: __m512bh = unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(*a.add(p * ABLK + r) as i32)) };
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
            unsafe { _mm512_mask_storeu_ps(c.add(r * ldc + col), mask(col), acc[r][v]) };
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
