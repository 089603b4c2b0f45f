//! Row-major GEMMs expressed as the column-major calls cuBLAS takes.
//!
//! A row-major `r x c` matrix is, read column-major, its `c x r` transpose. So the row-major
//! product `C = op(A) op(B)` is the column-major `C^T = op(B)^T op(A)^T`: cuBLAS is called
//! with the operands swapped, `m` and `n` swapped, and each operand's transpose flag kept.
//! Pure arithmetic, checked on the CPU against [`super::sgemm::sgemm`].

use super::ops::Gemm;

/// One `cublasSgemm` call: `C = op(first) op(second)`, column-major.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColumnMajorGemm {
    /// `first` is used transposed.
    pub trans_first: bool,
    /// `second` is used transposed.
    pub trans_second: bool,
    /// Rows of column-major C (and of op(first)).
    pub m: usize,
    /// Columns of column-major C (and of op(second)).
    pub n: usize,
    /// The inner dimension.
    pub k: usize,
    /// Leading dimension of `first`.
    pub ld_first: usize,
    /// Leading dimension of `second`.
    pub ld_second: usize,
    /// Leading dimension of C.
    pub ld_c: usize,
}

/// The call computing the row-major [`Gemm`] `c (m x n) = op(a) (m x k) * op(b) (k x n)`
/// (`a_t`: `a` stored k x m; `b_t`: `b` stored n x k). cuBLAS's `first` operand is `b`,
/// its `second` is `a`.
pub fn row_major(g: &Gemm) -> ColumnMajorGemm {
    let Gemm { m, n, k, a_t, b_t } = *g;
    ColumnMajorGemm {
        trans_first: b_t,
        trans_second: a_t,
        m: n,
        n: m,
        k,
        ld_first: if b_t { k } else { n },
        ld_second: if a_t { m } else { k },
        ld_c: n,
    }
    .at_least_one()
}

impl ColumnMajorGemm {
    /// cuBLAS rejects leading dimensions of 0 (empty matrices); 1 is valid for them.
    fn at_least_one(mut self) -> Self {
        self.ld_first = self.ld_first.max(1);
        self.ld_second = self.ld_second.max(1);
        self.ld_c = self.ld_c.max(1);
        self
    }

    /// Runs the call on the CPU with column-major semantics, as cuBLAS would (tests, and
    /// [`super::HostKernels`]).
    pub fn reference(&self, first: &[f32], second: &[f32], c: &mut [f32]) {
        let at = |x: &[f32], ld: usize, t: bool, r: usize, col: usize| if t { x[col + r * ld] } else { x[r + col * ld] };
        for j in 0..self.n {
            for i in 0..self.m {
                let mut acc = 0f32;
                for p in 0..self.k {
                    acc += at(first, self.ld_first, self.trans_first, i, p) * at(second, self.ld_second, self.trans_second, p, j);
                }
                c[i + j * self.ld_c] = acc;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::sgemm::sgemm;
    use crate::hash::splitmix64_next;

    fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n).map(|_| (splitmix64_next(&mut s) >> 40) as f32 / (1u64 << 24) as f32 - 0.5).collect()
    }

    #[test]
    fn the_mlp_gemms_planned_for_cublas_equal_the_cpu_sgemm() {
        let (batch, fan_in, fan_out) = (7, 5, 3);
        // forward z = x W; weight gradient dW = x^T delta; input gradient dx = delta W^T.
        let cases = [(batch, fan_out, fan_in, false, false, batch * fan_in, fan_in * fan_out), (fan_in, fan_out, batch, true, false, batch * fan_in, batch * fan_out), (batch, fan_in, fan_out, false, true, batch * fan_out, fan_in * fan_out)];
        for (i, (m, n, k, a_t, b_t, a_len, b_len)) in cases.into_iter().enumerate() {
            let a = random(a_len, 1 + i as u64);
            let b = random(b_len, 10 + i as u64);
            let mut want = vec![0f32; m * n];
            sgemm(m, n, k, &a, a_t, &b, b_t, &mut want, false, 1);
            let call = row_major(&Gemm { m, n, k, a_t, b_t });
            let mut got = vec![0f32; m * n];
            call.reference(&b, &a, &mut got);
            for (w, g) in want.iter().zip(&got) {
                assert!((w - g).abs() < 1e-5, "case {i}: {want:?} vs {got:?}");
            }
        }
        assert_eq!(row_major(&Gemm { m: 0, n: 3, k: 0, a_t: false, b_t: false }).ld_second, 1);
    }
}
