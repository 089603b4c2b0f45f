//! Zipf-distributed ranks from one uniform draw each: the continuous power law's CDF
//! inverted and floored, so rank `r` (0-based) of `n` comes with probability close to
//! `1 / (r + 1)^s` (normalised). O(1) per draw and no table, so vocabularies of tens of
//! millions cost nothing to set up. Shared by the synthetic data set ([`super::synth`]) and
//! the sparse workloads of the benchmarks (`sparse::workload`).

/// Zipf(`s`) ranks in `0..n`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ZipfRanks {
    n: u64,
    s: f64,
    /// `n^(1 - s) - 1`, the CDF's scale.
    a: f64,
}

impl ZipfRanks {
    /// Ranks in `0..n` (at least one) with exponent `s`.
    pub fn new(n: u64, s: f64) -> ZipfRanks {
        let n = n.max(1);
        ZipfRanks { n, s, a: (n as f64).powf(1.0 - s) - 1.0 }
    }

    /// How many ranks there are.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// Never: there is at least one rank.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The rank of the uniform draw `u` in [0, 1).
    #[inline]
    pub fn rank(&self, u: f64) -> u64 {
        let nf = self.n as f64;
        let r = if (self.s - 1.0).abs() < 1e-9 { nf.powf(u) - 1.0 } else { (self.a * u + 1.0).powf(1.0 / (1.0 - self.s)) - 1.0 };
        (r.max(0.0) as u64).min(self.n - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_stay_in_range_and_the_head_is_heavy() {
        let z = ZipfRanks::new(1_000_000, 1.05);
        let draws: Vec<u64> = (0..100_000).map(|i| z.rank((i as f64 + 0.5) / 100_000.0)).collect();
        assert!(draws.iter().all(|&r| r < 1_000_000));
        assert_eq!(z.rank(0.0), 0);
        assert!(z.rank(1.0 - 1e-12) > 990_000, "the top of [0, 1) reaches the tail");
        // P(rank 0) = P(r < 1) = (1 - 2^(1-s)) / (1 - n^(1-s)) = 0.0683 for n = 1e6, s = 1.05.
        let zeros = draws.iter().filter(|&&r| r == 0).count() as f64 / draws.len() as f64;
        assert!((zeros - 0.0683).abs() < 0.001, "share of rank 0: {zeros}");
        // Monotone in u: a larger draw never gives a smaller rank.
        assert!(draws.windows(2).all(|w| w[0] <= w[1]));
        assert!(ZipfRanks::new(0, 1.0).rank(0.7) == 0 && ZipfRanks::new(1, 2.0).len() == 1);
    }
}
