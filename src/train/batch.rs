//! [`Batch`]: one batch of this rank on the host — its rows' labels, dense features and
//! keys, with the keys deduplicated once for the whole step: `uniq` (sorted by key, as the
//! sparse exchange wants them: it takes them as they are) and `inverse[s * n + f]` naming
//! sample s's field f among them (`n` the data's single-hot fields, [`Batch::fields`]: a
//! TSV's 26). Reused from step to step.
//!
//! A batch of a multi-hot set also carries each multi-hot field's ids per sample in CSR
//! form (`bags` fields; bag `b` = field `b % bags` of sample `b / bags`, its ids
//! `bag_index[bag_offsets[b]..bag_offsets[b + 1]]`), deduplicated with the single-hot keys
//! in the same `uniq`: a key met in both is one row of the step
//! ([`crate::model::pooling`] pools them).

use crate::data::cache::Dataset;
use crate::data::criteo::Columns;
use crate::data::Fields;
use crate::data::{DataError, DataResult};
use crate::sparse::Deduper;

/// A batch with its keys deduplicated (see the module docs).
#[derive(Default)]
pub struct Batch {
    /// Rows of the data set(s), in batch order.
    pub rows: Vec<u32>,
    /// The rows' shape: dense features and single-hot keys per sample.
    pub fields: Fields,
    /// Labels (0/1), one per sample.
    pub labels: Vec<f32>,
    /// Dense features, `fields.dense` per sample.
    pub dense: Vec<f32>,
    keys: Vec<u64>,
    /// The batch's distinct keys, in key order.
    pub uniq: Vec<u64>,
    /// Per (sample, field): the position of its key in `uniq`.
    pub inverse: Vec<u32>,
    /// Multi-hot fields per sample (0: a single-hot batch).
    pub bags: usize,
    /// Per bag, where its ids start in `bag_index` (`len() * bags + 1` entries, from 0).
    pub bag_offsets: Vec<u32>,
    /// Per id of a bag, in bag order: the position of its key in `uniq`.
    pub bag_index: Vec<u32>,
    /// The bags' keys as read (scratch of [`Batch::load_pieces`]).
    bag_keys: Vec<u64>,
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
    /// spans files — and deduplicates their keys. The rows of a dataset with list fields
    /// (a version-4 cache) bring their bags; every piece must have the same fields.
    pub fn load_pieces<'d, R: Iterator<Item = u32>>(&mut self, pieces: impl IntoIterator<Item = (&'d Dataset, R)>) -> DataResult<()> {
        self.clear();
        self.bag_keys.clear();
        for (i, (ds, rows)) in pieces.into_iter().enumerate() {
            let at = self.rows.len();
            self.rows.extend(rows);
            ds.append_rows(&self.rows[at..], &mut self.labels, &mut self.dense, &mut self.keys)?;
            if i == 0 {
                self.bags = ds.list_fields();
                self.fields = ds.fields();
            } else if ds.fields() != self.fields {
                return Err(DataError::InvalidArgument(format!("{} has {}, and the batch's rows before it {}: every input of a run must have the same columns", ds.path().display(), ds.fields(), self.fields)));
            } else if ds.list_fields() != self.bags {
                return Err(DataError::InvalidArgument(format!("{} has {} multi-hot fields, and the batch's rows before it {}: every input of a run must have the same list columns", ds.path().display(), ds.list_fields(), self.bags)));
            }
            ds.append_bags(&self.rows[at..], &mut self.bag_offsets, &mut self.bag_keys)?;
        }
        self.keys.extend_from_slice(&self.bag_keys);
        self.index_keys()
    }

    /// Takes rows `rows` of `cols` (rows of any shape: `ringrec serve-model`'s requests) as
    /// the batch, numbered 0.. in `rows`, and deduplicates their keys.
    pub fn load_columns(&mut self, cols: &Columns, rows: std::ops::Range<usize>) -> DataResult<()> {
        self.load_columns_with_bags(cols, rows, 0, &[0], &[])
    }

    /// [`Batch::load_columns`] with `bags` multi-hot fields per row: bag `b`'s keys
    /// (field-salted like the single-hot ones) are `keys[offsets[b]..offsets[b + 1]]`
    /// (`offsets` and `keys` of the rows taken). All keys are deduplicated together. An
    /// error when the offsets do not cover `rows.len() * bags` bags rising from 0 to
    /// `keys.len()`.
    pub fn load_columns_with_bags(&mut self, cols: &Columns, rows: std::ops::Range<usize>, bags: usize, offsets: &[u32], keys: &[u64]) -> DataResult<()> {
        check_bags(rows.len(), bags, offsets, keys)?;
        self.clear();
        let Fields { dense, sparse } = cols.fields;
        self.fields = cols.fields;
        self.rows.extend((0..rows.len()).map(|i| i as u32));
        self.labels.extend_from_slice(&cols.labels[rows.clone()]);
        self.dense.extend_from_slice(&cols.dense[rows.start * dense..rows.end * dense]);
        self.keys.extend_from_slice(&cols.keys[rows.start * sparse..rows.end * sparse]);
        self.bags = bags;
        self.bag_offsets.clear();
        self.bag_offsets.extend_from_slice(offsets);
        self.keys.extend_from_slice(keys);
        self.index_keys()
    }

    /// Empties the batch (no multi-hot fields).
    fn clear(&mut self) {
        self.rows.clear();
        self.labels.clear();
        self.dense.clear();
        self.keys.clear();
        self.bags = 0;
        self.bag_offsets.clear();
        self.bag_offsets.push(0);
    }

    /// `uniq`, `inverse` and `bag_index` of the loaded keys (the single-hot keys first,
    /// then the bags' keys, deduplicated together).
    fn index_keys(&mut self) -> DataResult<()> {
        self.deduper.index_keys(&self.keys).map_err(|e| DataError::InvalidArgument(e.to_string()))?;
        self.uniq.clear();
        self.uniq.extend(self.deduper.sorted_keys());
        let single = self.keys.len() - self.bag_offsets.last().map_or(0, |n| *n as usize);
        let mut places = self.deduper.places();
        self.inverse.clear();
        self.inverse.extend(places.by_ref().take(single));
        self.bag_index.clear();
        self.bag_index.extend(places);
        Ok(())
    }
}

/// An error when `offsets` do not cover `rows * bags` bags rising from 0 to `keys.len()`.
fn check_bags(rows: usize, bags: usize, offsets: &[u32], keys: &[u64]) -> DataResult<()> {
    let spans_all = offsets.len() == rows * bags + 1 && offsets[0] == 0 && offsets.windows(2).all(|w| w[0] <= w[1]) && offsets.last().is_some_and(|l| *l as usize == keys.len());
    if !spans_all {
        return Err(DataError::InvalidArgument(format!("multi-hot offsets: {} entries for {rows} samples of {bags} bags, rising from 0 to the {} keys, expected", offsets.len(), keys.len())));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::criteo::{Sample, NUM_DENSE, NUM_SPARSE};

    /// Rows whose keys are `first + field` for each `first` (dense features 0).
    fn rows(firsts: &[u64]) -> Columns {
        let mut cols = Columns::default();
        for first in firsts {
            let mut keys = [0u64; NUM_SPARSE];
            for (f, k) in keys.iter_mut().enumerate() {
                *k = first + f as u64;
            }
            cols.push(&Sample { label: 1.0, dense: [0.0; NUM_DENSE], keys });
        }
        cols
    }

    #[test]
    fn bag_keys_are_deduplicated_with_the_single_hot_keys() {
        // Rows with keys 100..126 and 200..226; bags [5, 100], [], [5], [300, 5, 300].
        let cols = rows(&[100, 200]);
        let (offsets, keys) = ([0u32, 2, 2, 3, 6], [5u64, 100, 5, 300, 5, 300]);
        let mut b = Batch::default();
        b.load_columns_with_bags(&cols, 0..2, 2, &offsets, &keys).unwrap();
        assert_eq!(b.uniq.len(), 2 * NUM_SPARSE + 2, "5 and 300 are new; 100 is row 0's first key");
        assert_eq!(b.inverse.len(), 2 * NUM_SPARSE);
        let named: Vec<u64> = b.bag_index.iter().map(|u| b.uniq[*u as usize]).collect();
        assert_eq!(named, keys);
        assert_eq!(b.bag_index[1], b.inverse[0], "a key in a bag and a single-hot field is one row");
        assert_eq!(b.bag_offsets, offsets);
        // A plain batch after it carries no bags.
        b.load_columns(&cols, 0..2).unwrap();
        assert_eq!((b.bags, b.bag_offsets.as_slice(), b.bag_index.len()), (0, &[0u32][..], 0));
        assert!(b.load_columns_with_bags(&cols, 0..2, 2, &[0, 2, 2], &keys).is_err());
        assert!(b.load_columns_with_bags(&cols, 0..2, 2, &[0, 2, 1, 3, 6], &keys).is_err());
        // Rows taken from the middle: row 1 alone, its bags [5], [300, 5, 300].
        b.load_columns_with_bags(&cols, 1..2, 2, &[0, 1, 4], &keys[2..]).unwrap();
        assert_eq!((b.rows.as_slice(), b.uniq.len()), (&[0u32][..], NUM_SPARSE + 2));
        assert_eq!(b.uniq[b.inverse[0] as usize], 200);
    }
}
