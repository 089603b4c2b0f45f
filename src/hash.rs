//! The hashes and the random stream every module shares: deterministic and the same on
//! every platform (data keys, initial rows and parameters, shuffles and checksums depend
//! on them).

/// 2^64 / golden ratio: splitmix64's increment, and the multiplier of multiply-shift hashing.
pub const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// splitmix64's finaliser of `z + GOLDEN` (Steele, Lea, Flood 2014): a bijection of u64.
#[inline]
pub fn splitmix64(z: u64) -> u64 {
    let mut z = z.wrapping_add(GOLDEN);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The f32 initial row of a table key (`embedding::init`: before rounding to the storage
/// dtype) into `out`: element j is `scale * (u / 2^23 - 1)`, u the top 24 bits of
/// `splitmix64(base + (j + 1) * GOLDEN)`, `base = splitmix64(seed ^ splitmix64(key))`.
/// kernels/cache.cu's `init_rows` computes the same bits (u / 2^23 - 1 is exact).
pub fn init_row_f32(key: u64, seed: u64, scale: f32, out: &mut [f32]) {
    let base = splitmix64(seed ^ splitmix64(key));
    for (j, o) in out.iter_mut().enumerate() {
        let u = splitmix64(base.wrapping_add((j as u64 + 1).wrapping_mul(GOLDEN))) >> 40;
        *o = scale * (u as f32 * (1.0 / (1u64 << 23) as f32) - 1.0);
    }
}

/// The splitmix64 generator: the next value of the stream whose state is `state`.
#[inline]
pub fn splitmix64_next(state: &mut u64) -> u64 {
    let z = splitmix64(*state);
    *state = state.wrapping_add(GOLDEN);
    z
}

/// A seeded random stream: value `i` (from 1) is `splitmix64(seed + i * GOLDEN)`.
pub struct Stream(pub u64);

impl Stream {
    /// The next value.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN);
        splitmix64(self.0)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `0..n` without bias (Lemire's multiply with rejection).
    pub fn below(&mut self, n: u64) -> u64 {
        let mut m = self.next_u64() as u128 * n as u128;
        if (m as u64) < n {
            let threshold = n.wrapping_neg() % n;
            while (m as u64) < threshold {
                m = self.next_u64() as u128 * n as u128;
            }
        }
        (m >> 64) as u64
    }
}

/// FNV-1a 64 of `bytes` (header checksums, identities; slow on large data: use [`crc32`]).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ *b as u64).wrapping_mul(0x100_0000_01b3))
}

/// CRC-32 (IEEE, the zlib polynomial; `crc32fast`, with the CPU's carry-less multiply where
/// it has one: several GB/s) of `bytes`: the checksum of file contents (sections, blocks).
pub fn crc32(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// Bytes per block of [`block_sums`]: a damaged file names the block (offset) that differs.
pub const CHECKSUM_BLOCK: usize = 1 << 20;

/// The CRC-32 of every [`CHECKSUM_BLOCK`]-byte block of `bytes` (the last one may be
/// shorter), computed in parallel on the rayon pool.
pub fn block_sums(bytes: &[u8]) -> Vec<u32> {
    use rayon::prelude::*;
    bytes.par_chunks(CHECKSUM_BLOCK).map(crc32).collect()
}

/// The first block of `bytes` whose CRC-32 differs from `sums` (its index), or `None`
/// when all match; a different number of blocks is reported as block `min(len)`.
pub fn first_bad_block(bytes: &[u8], sums: &[u32]) -> Option<usize> {
    use rayon::prelude::*;
    let n = bytes.len().div_ceil(CHECKSUM_BLOCK);
    if n != sums.len() {
        return Some(n.min(sums.len()));
    }
    bytes.par_chunks(CHECKSUM_BLOCK).zip(sums.par_iter()).position_first(|(b, s)| crc32(b) != *s)
}

/// FNV-1a 64 of `bytes`, as hex.
pub fn fnv_hex(bytes: &[u8]) -> String {
    format!("{:016x}", fnv1a64(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_is_the_zlib_checksum_and_blocks_name_the_damage() {
        // The standard check value of CRC-32/ISO-HDLC.
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        let mut data: Vec<u8> = (0..(CHECKSUM_BLOCK * 3 + 17)).map(|i| (i * 7 % 251) as u8).collect();
        let sums = block_sums(&data);
        assert_eq!(sums.len(), 4);
        assert_eq!(first_bad_block(&data, &sums), None);
        data[CHECKSUM_BLOCK * 2 + 5] ^= 1;
        assert_eq!(first_bad_block(&data, &sums), Some(2));
        assert_eq!(first_bad_block(&data[..CHECKSUM_BLOCK], &sums), Some(1));
    }
}

/// An incremental [`crc32`]: the CRC-32 of all the bytes given to [`Crc32::update`], in
/// order, as if they were one slice (a file's digest taken while it is read for another
/// purpose).
#[derive(Clone, Default)]
pub struct Crc32(crc32fast::Hasher);

impl Crc32 {
    /// The digest of nothing yet.
    pub fn new() -> Crc32 {
        Crc32::default()
    }

    /// Adds `bytes` after those given before.
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// Appends the digest of the bytes that follow those given here (taken apart, by
    /// another thread, say): the result is the digest of both, one after the other.
    pub fn combine(&mut self, next: &Crc32) {
        self.0.combine(&next.0);
    }

    /// The CRC-32 of everything given.
    pub fn finish(self) -> u32 {
        self.0.finalize()
    }
}

#[cfg(test)]
mod crc32_stream_tests {
    use super::*;

    #[test]
    fn the_incremental_digest_equals_the_one_shot_digest() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 31 % 253) as u8).collect();
        let mut c = Crc32::new();
        for piece in data.chunks(7777) {
            c.update(piece);
        }
        assert_eq!(c.finish(), crc32(&data));
        assert_eq!(Crc32::new().finish(), 0);
        // Pieces digested apart and combined in order: the same digest.
        let mut all = Crc32::new();
        for piece in data.chunks(30_001) {
            let mut c = Crc32::new();
            c.update(piece);
            all.combine(&c);
        }
        assert_eq!(all.finish(), crc32(&data));
    }
}
