//! [`Batch`]: one batch of this rank on the host — its rows' labels, dense features and
//! keys, with the keys deduplicated once for the whole step: `uniq` (sorted by key, as the
//! sparse exchange wants them: it takes them as they are) and `inverse[s * 26 + f]` naming
//! sample s's field f among them. Reused from step to step.

use crate::data::cache::Dataset;
use crate::data::criteo::Sample;
use crate::data::{DataError, DataResult};
use crate::sparse::Deduper;

/// A batch with its keys deduplicated (see the module docs).
#[derive(Default)]
pub struct Batch {
    /// Rows of the data set(s), in batch order.
    pub rows: Vec<u32>,
    /// Labels (0/1), one per sample.
    pub labels: Vec<f32>,
    /// Dense features, 13 per sample.
    pub dense: Vec<f32>,
    keys: Vec<u64>,
    /// The batch's distinct keys, in key order.
    pub uniq: Vec<u64>,
    /// Per (sample, field): the position of its key in `uniq`.
    pub inverse: Vec<u32>,
    deduper: Deduper,
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
        self.load_pieces([(ds, rows)])
    }

    /// Reads the rows of each piece (a dataset and rows of it) in turn — a batch that
    /// spans files — and deduplicates their keys.
    pub fn load_pieces<'d, R: Iterator<Item = u32>>(&mut self, pieces: impl IntoIterator<Item = (&'d Dataset, R)>) -> DataResult<()> {
        self.rows.clear();
        self.labels.clear();
        self.dense.clear();
        self.keys.clear();
        for (ds, rows) in pieces {
            let at = self.rows.len();
            self.rows.extend(rows);
            ds.append_rows(&self.rows[at..], &mut self.labels, &mut self.dense, &mut self.keys)?;
        }
        self.index_keys()
    }

    /// Takes `samples` (parsed lines or rows of a request, `ringrec serve-model`) as the
    /// batch, numbered 0.. in `rows`, and deduplicates their keys.
    pub fn load_samples(&mut self, samples: &[Sample]) -> DataResult<()> {
        self.rows.clear();
        self.labels.clear();
        self.dense.clear();
        self.keys.clear();
        for (i, s) in samples.iter().enumerate() {
            self.rows.push(i as u32);
            self.labels.push(s.label);
            self.dense.extend_from_slice(&s.dense);
            self.keys.extend_from_slice(&s.keys);
        }
        self.index_keys()
    }

    /// `uniq` and `inverse` of the loaded keys.
    fn index_keys(&mut self) -> DataResult<()> {
        self.deduper.index_keys(&self.keys).map_err(|e| DataError::InvalidArgument(e.to_string()))?;
        self.uniq.clear();
        self.uniq.extend(self.deduper.sorted_keys());
        self.inverse.clear();
        self.inverse.extend(self.deduper.places());
        Ok(())
    }
}
