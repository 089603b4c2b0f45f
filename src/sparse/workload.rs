//! Synthetic sparse workloads for benchmarks and tests: Zipf or uniform ids, scrambled
//! into keys, and per-rank batches of (key, gradient row). Deterministic from their seeds.

use crate::data::zipf::ZipfRanks;
use crate::hash::splitmix64;

/// `len` Zipf-distributed ids in `0..n` (id r drawn with probability ~ 1/(r+1)^s:
/// [`ZipfRanks`]), from `seed`.
pub fn zipf_ids(n: u64, len: usize, s: f64, seed: u64) -> Vec<u64> {
    let z = ZipfRanks::new(n, s);
    unit_stream(seed).take(len).map(|u| z.rank(u)).collect()
}

/// `len` uniformly distributed ids in `0..n`, from `seed` (the same stream as [`zipf_ids`]).
pub fn uniform_ids(n: u64, len: usize, seed: u64) -> Vec<u64> {
    let nf = n.max(1) as f64;
    unit_stream(seed).take(len).map(|u| ((u * nf) as u64).min(n.max(1) - 1)).collect()
}

/// Uniform numbers in [0, 1) from a xorshift stream seeded by `seed`.
fn unit_stream(seed: u64) -> impl Iterator<Item = f64> {
    let mut x = splitmix64(seed) | 1;
    std::iter::repeat_with(move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 11) as f64 / (1u64 << 53) as f64
    })
}

/// The key of id `i`: scrambled so hot keys are not neighbours, never the reserved u64::MAX.
pub fn key_of(i: u64) -> u64 {
    splitmix64(i).min(u64::MAX - 1)
}

/// A rank's batch for `step`: `len` Zipf keys and one row of `dim` values per key.
pub fn batch(rank: usize, step: usize, len: usize, dim: usize, vocab: u64, s: f64) -> (Vec<u64>, Vec<f32>) {
    let seed = ((step as u64) << 20) ^ rank as u64 ^ 0x5EED;
    let keys: Vec<u64> = zipf_ids(vocab, len, s, seed).into_iter().map(key_of).collect();
    let mut grads = Vec::with_capacity(len * dim);
    for (i, k) in keys.iter().enumerate() {
        let h = splitmix64(k ^ seed.wrapping_add(i as u64));
        grads.extend((0..dim).map(|j| (((h >> (j % 48)) & 0xffff) as f32 / 65536.0 - 0.5) * 0.01));
    }
    (keys, grads)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_ids_are_skewed_in_range_and_deterministic() {
        let ids = zipf_ids(1000, 20_000, 1.05, 7);
        assert!(ids.iter().all(|i| *i < 1000));
        assert_eq!(ids, zipf_ids(1000, 20_000, 1.05, 7));
        let hot = ids.iter().filter(|i| **i < 10).count();
        let cold = ids.iter().filter(|i| (500..510).contains(*i)).count();
        assert!(hot > 20 * cold.max(1), "hot {hot} cold {cold}");
        assert!(zipf_ids(1, 10, 1.0, 1).iter().all(|i| *i == 0));
        let (k, g) = batch(0, 0, 100, 4, 1000, 1.05);
        assert_eq!((k.len(), g.len()), (100, 400));
        assert!(k.iter().all(|k| *k != u64::MAX));
    }
}
