//! [`Scorer`]: a trained model loaded for online scoring in one process (`ringrec
//! serve-model`), on the CPU, scoring through `predict`'s one scoring step
//! ([`super::predict::score_batch`]), so its scores are `ringrec predict`'s for the same
//! rows cut into the same batches.
//!
//! [`Scorer::open`] resolves the model as `predict` does ([`ModelSource`]: a checkpoint
//! directory's newest good checkpoint, one checkpoint, or an export bundle) and checks every
//! checksum. A checkpoint's table is mapped read-only where it lies (no copy); a bundle's
//! rows are imported into a private table under the shared-memory directory, whose name is
//! unlinked as soon as it is filled (the mapping lives on; nothing is left behind). Keys a
//! table lacks read as their initial rows, as in training.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use super::batch::Batch;
use super::predict::{score_batch, scoring_model};
use super::source::{Fallback, ModelSource, SourceKind};
use super::{TrainError, TrainResult};
use crate::data::criteo::{Columns, Sample};
use crate::data::Fields;
use crate::device::{CpuDevice, Device};
use crate::embedding::{EmbeddingTable, SegmentGuard};
use crate::model::DenseModel;

/// A model ready to score (see the module docs).
pub struct Scorer {
    /// What was loaded (its dense weights are in the model).
    pub source: ModelSource,
    table: EmbeddingTable,
    model: DenseModel<CpuDevice>,
    batch: Batch,
    logits: Vec<f32>,
}

impl std::fmt::Debug for Scorer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scorer").field("model", &self.source.describe()).field("table_rows", &self.table.live_rows()).finish()
    }
}

/// Numbers the private tables of one process.
static NEXT_TABLE: AtomicU64 = AtomicU64::new(0);

impl Scorer {
    /// Loads `path` (see the module docs) to score on `threads` threads; a bundle's table is
    /// imported under `shm_dir`. Newer checkpoints skipped as damaged are listed in
    /// `source.skipped`.
    pub fn open(path: &Path, fallback: Fallback, shm_dir: &Path, threads: usize) -> TrainResult<Scorer> {
        let mut source = ModelSource::open(path, fallback).map_err(|e| TrainError::Config(e.to_string()))?;
        if source.kind == SourceKind::Params {
            return Err(TrainError::Config(format!("{}: a sparse-parameter file holds no dense weights; serving needs a checkpoint directory or an export bundle (ringrec export)", path.display())));
        }
        let t = &source.table;
        let cfg = t.scoring_config();
        let table = match t.saved {
            Some(_) => {
                let table = EmbeddingTable::open_readonly(&t.path)?;
                table.check_matches(&cfg)?;
                table
            }
            None => {
                let n = NEXT_TABLE.fetch_add(1, Ordering::Relaxed);
                let seg = shm_dir.join(format!("ringrec-serve-{}-{n}-table", std::process::id()));
                let mut guard = SegmentGuard::new(&seg);
                let mut table = EmbeddingTable::create(&seg, &cfg)?;
                table.load_params(&t.path)?;
                guard.remove_now().map_err(|e| TrainError::Config(format!("removing the name of the scoring table {}: {e}", seg.display())))?;
                table
            }
        };
        let model = scoring_model(CpuDevice::new(threads), &source)?;
        if let Some(d) = source.dense.as_mut() {
            d.params = Vec::new();
        }
        Ok(Scorer { source, table, model, batch: Batch::default(), logits: Vec::new() })
    }

    /// Appends the scores of `samples` to `out`, in batches of `batch_rows` from the first
    /// (the cut `ringrec predict --batch` makes of its rows).
    pub fn score(&mut self, samples: &[Sample], batch_rows: usize, out: &mut Vec<f32>) -> TrainResult<()> {
        for part in samples.chunks(batch_rows.max(1)) {
            self.batch.load_samples(part)?;
            score_batch(&mut self.model, &self.table, &self.batch, &mut self.logits, out)?;
        }
        Ok(())
    }

    /// [`Scorer::score`] of rows of any shape (the model's: [`Scorer::fields`]).
    pub fn score_columns(&mut self, cols: &Columns, batch_rows: usize, out: &mut Vec<f32>) -> TrainResult<()> {
        let n = cols.len();
        for start in (0..n).step_by(batch_rows.max(1)) {
            self.batch.load_columns(cols, start..n.min(start + batch_rows.max(1)))?;
            score_batch(&mut self.model, &self.table, &self.batch, &mut self.logits, out)?;
        }
        Ok(())
    }

    /// The rows the model takes: its dense features and categorical fields.
    pub fn fields(&self) -> Fields {
        let spec = self.model.spec();
        Fields { dense: spec.ndense, sparse: spec.fields - self.model.multi_hot_fields() }
    }

    /// Rows of its table.
    pub fn table_rows(&self) -> u64 {
        self.table.live_rows()
    }

    /// The device it scores on, in words.
    pub fn device(&self) -> String {
        self.model.device().describe()
    }
}
