//! [`Batch`]: one batch of this rank on the host — its rows' labels, dense features and
//! keys, with the keys deduplicated: `uniq` (first-seen order) and `inverse[s * 26 + f]`
//! naming sample s's field f among them. Reused from step to step.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::data::cache::Dataset;
use crate::data::DataResult;

/// A fast hasher for u64 keys that are already well mixed (field-salted hashes).
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ *b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, k: u64) {
        self.0 = (k ^ (k >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A batch with its keys deduplicated (see the module docs).
#[derive(Default)]
pub struct Batch {
    /// Rows of the data set, in batch order.
    pub rows: Vec<u32>,
    /// Labels (0/1), one per sample.
    pub labels: Vec<f32>,
    /// Dense features, 13 per sample.
    pub dense: Vec<f32>,
    keys: Vec<u64>,
    /// The batch's distinct keys.
    pub uniq: Vec<u64>,
    /// Per (sample, field): the position of its key in `uniq`.
    pub inverse: Vec<u32>,
    index: HashMap<u64, u32, BuildHasherDefault<KeyHasher>>,
}

impl Batch {
    /// Samples in the batch.
    pub fn len(&self) -> usize {
        self.labels.len()
    }
    /// True for an empty batch.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Reads `rows` of `ds` and deduplicates their keys.
    pub fn load(&mut self, ds: &Dataset, rows: impl Iterator<Item = u32>) -> DataResult<()> {
        self.rows.clear();
        self.rows.extend(rows);
        ds.fill_batch(&self.rows, &mut self.labels, &mut self.dense, &mut self.keys)?;
        self.uniq.clear();
        self.index.clear();
        self.inverse.clear();
        for k in &self.keys {
            let next = self.uniq.len() as u32;
            let i = *self.index.entry(*k).or_insert(next);
            if i == next {
                self.uniq.push(*k);
            }
            self.inverse.push(i);
        }
        Ok(())
    }
}
