//! Row-major SGEMM on top of the `gemm` crate (pure Rust, runtime-dispatched AVX2/AVX-512
//! kernels). Chosen over OpenBLAS after measuring both on the MLP's shapes in one run
//! (`ringrec bench gemm`; figures in docs/BENCHMARKS.md): equal or faster on one thread, no
//! system library to install.

/// `c (m x n) = [c +] op(a) (m x k) * op(b) (k x n)`, all row-major. `a_t`: `a` is stored
/// k x m and used transposed; `b_t`: `b` is stored n x k and used transposed.
/// `threads > 1` splits the work over the rayon pool.
///
/// # Panics
/// When a slice is shorter than its shape says (a programming error, not input data).
#[allow(clippy::too_many_arguments)]
pub fn sgemm(m: usize, n: usize, k: usize, a: &[f32], a_t: bool, b: &[f32], b_t: bool, c: &mut [f32], accumulate: bool, threads: usize) {
    assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n, "sgemm: slices shorter than {m}x{k} * {k}x{n}");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            c[..m * n].fill(0.0);
        }
        return;
    }
    let (a_rs, a_cs) = if a_t { (1, m as isize) } else { (k as isize, 1) };
    let (b_rs, b_cs) = if b_t { (1, k as isize) } else { (n as isize, 1) };
    let par = if threads > 1 { gemm::Parallelism::Rayon(threads) } else { gemm::Parallelism::None };
    // SAFETY: the assert above guarantees every index the strides reach lies inside the
    // slices (a: m*k, b: k*n, c: m*n elements); c does not alias a or b (&mut vs &).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.as_ptr(),
            a_cs,
            a_rs,
            b.as_ptr(),
            b_cs,
            b_rs,
            if accumulate { 1.0f32 } else { 0.0 },
            1.0f32,
            false,
            false,
            false,
            par,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(m: usize, n: usize, k: usize, a: &[f32], a_t: bool, b: &[f32], b_t: bool) -> Vec<f32> {
        let mut c = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = 0f64;
                for p in 0..k {
                    let av = if a_t { a[p * m + i] } else { a[i * k + p] };
                    let bv = if b_t { b[j * k + p] } else { b[p * n + j] };
                    s += av as f64 * bv as f64;
                }
                c[i * n + j] = s as f32;
            }
        }
        c
    }

    #[test]
    fn every_transpose_combination_matches_naive() {
        let (m, n, k) = (37, 19, 53);
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 11) as f32 - 5.0).collect();
        for a_t in [false, true] {
            for b_t in [false, true] {
                for threads in [1, 2] {
                    let want = naive(m, n, k, &a, a_t, &b, b_t);
                    let mut c = vec![1f32; m * n];
                    sgemm(m, n, k, &a, a_t, &b, b_t, &mut c, false, threads);
                    assert_eq!(c, want, "a_t {a_t} b_t {b_t}");
                    sgemm(m, n, k, &a, a_t, &b, b_t, &mut c, true, threads);
                    let twice: Vec<f32> = want.iter().map(|x| 2.0 * x).collect();
                    assert_eq!(c, twice);
                }
            }
        }
    }
}
