//! [`EvalSet`]: rows to score — held-out rows of one or more datasets — read in batches.
//! `train`'s evaluation reads it; so can anything that scores rows the same way.
//!
//! ```text
//! EvalSet [(day_23.rrdata, 0..n23), (day_24.rrdata, 0..n24)]   positions 0..n23+n24
//!   rank r scores  shard::rank_slice(0..len, r, size)
//!   in batches of  batches(slice, batch) -> [(dataset, rows), ...] per batch
//! ```

use std::ops::Range;
use std::sync::Arc;

use super::cache::Dataset;
use super::error::{DataError, DataResult};

/// Rows of one or more datasets, one after the other (see the module docs). Cloning it is
/// cheap: the datasets are shared.
#[derive(Clone, Debug, Default)]
pub struct EvalSet {
    parts: Vec<(Arc<Dataset>, Range<usize>)>,
    len: usize,
}

impl EvalSet {
    /// No rows.
    pub fn new() -> EvalSet {
        EvalSet::default()
    }

    /// Appends the rows `rows` of `ds`; a range past its end is [`DataError::RowOutOfRange`].
    pub fn push(&mut self, ds: Arc<Dataset>, rows: Range<usize>) -> DataResult<()> {
        if rows.end > ds.len() || rows.start > rows.end {
            return Err(DataError::RowOutOfRange { index: rows.end.max(rows.start), rows: ds.len() });
        }
        self.len += rows.len();
        self.parts.push((ds, rows));
        Ok(())
    }

    /// Rows in the set.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the set has no row.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The datasets and their rows, in order.
    pub fn parts(&self) -> impl Iterator<Item = (&Dataset, Range<usize>)> {
        self.parts.iter().map(|(ds, r)| (&**ds, r.clone()))
    }

    /// The rows at positions `range` of the set, as pieces (a dataset and rows of it) in
    /// order; positions past the end are left out.
    pub fn pieces(&self, range: Range<usize>) -> Vec<(&Dataset, Range<usize>)> {
        let mut out = Vec::new();
        let mut start = 0;
        for (ds, rows) in &self.parts {
            let end = start + rows.len();
            let (a, b) = (range.start.max(start), range.end.min(end));
            if a < b {
                out.push((&**ds, rows.start + (a - start)..rows.start + (b - start)));
            }
            start = end;
        }
        out
    }

    /// The positions `range` cut into batches of `batch` rows (the last one shorter), each
    /// as its [`EvalSet::pieces`]: the order in which `train` scores a rank's slice.
    pub fn batches(&self, range: Range<usize>, batch: usize) -> impl Iterator<Item = Vec<(&Dataset, Range<usize>)>> + '_ {
        let batch = batch.max(1);
        let end = range.end.min(self.len);
        (range.start..end).step_by(batch).map(move |a| self.pieces(a..(a + batch).min(end)))
    }

    /// The labels of every row, in order.
    pub fn labels(&self) -> Vec<f32> {
        self.parts.iter().flat_map(|(ds, r)| ds.labels()[r.clone()].iter().copied()).collect()
    }

    /// Hands the pages of every dataset back ([`Dataset::release_pages`]): after a pass.
    pub fn release_pages(&self) {
        for (ds, _) in &self.parts {
            ds.release_pages();
        }
    }
}
