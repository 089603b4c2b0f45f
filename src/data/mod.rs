//! Training data: Criteo reader (plain, gzip, zstd), Parquet reader, binary cache, sharding,
//! synthetic generator.
//!
//! ```text
//! --data / --eval-data inputs ──inputs::resolve──> files, in order (dirs, globs: natural order)
//! Criteo TSV ──criteo::parse_text──> Sample {label, 13 dense, 26 keys}
//!     │                                   (malformed lines counted, --max-bad-lines)
//!     └─prepare (N threads, chunks committed in order)──> .rrdata file (header + label/dense/key
//!                              │         columns, page-aligned, a CRC-32 per MiB; mode 0600)
//!                              │
//!                    cache::Dataset::open (mmap, read-only, every block verified)
//!                              │
//!   shard::epoch_order / global_batch_range / rank_slice ──> Dataset::fill_batch
//!   EvalSet (held-out rows of one or more datasets) ──> batches of (dataset, rows)
//! ```
//!
//! - [`inputs`]: files, directories and globs turned into the list of data files.
//! - [`fields`]: [`Fields`], a row's shape (dense features, single-hot fields): a TSV's
//!   13 and 26, a Parquet file's its columns; the list fields' salt.
//! - [`criteo`]: the text format, the feature transform (`ln(1 + max(x, 0))`) and the
//!   field-salted key hash; malformed lines are never dropped silently.
//! - [`prepare`](mod@prepare): a TSV converted on several threads, the cache the same byte
//!   for byte whatever their number.
//! - [`compressed`]: gzip and zstd TSVs decoded as they are read (a file cut short or
//!   damaged named with its byte and line).
//! - [`parquet_file`]: Parquet files, their columns mapped onto the model's inputs (a
//!   schema), row groups read on every core into the same cache; [`parquet_write`]: a
//!   TSV's rows written as a Criteo-shaped Parquet file; [`multihot`]: a generated multi-hot
//!   set (list columns) as Parquet, for the multi-hot pooling to come; [`schema`]: the
//!   columns a user names (`--label-column` and the other column flags, or a schema file).
//! - [`cache`]: the binary format; [`Dataset::from_tsv_cached`] parses a TSV once per host
//!   and every later run (and every local rank) maps the cache, until the TSV's stat
//!   (size, mtime, ctime, inode) changes or the cache is damaged.
//! - [`shard`]: global batches cut into per-rank slices, so results do not depend on the
//!   number of ranks; a deterministic per-epoch shuffle; the train/test split.
//! - [`evalset`]: [`EvalSet`], rows to score over one or more datasets, in batches.
//! - [`synth`](mod@synth): a synthetic TSV with a planted logistic model and its Bayes AUC;
//!   its values' vocabularies and skew can be scaled (`ValueShape`: Zipf ranks from [`zipf`]).
//! - `ringrec data prepare | synth | inspect` is the binary's (`src/cli/data.rs`).

pub mod cache;
pub mod compressed;
pub mod criteo;
pub mod error;
pub mod evalset;
pub mod fields;
pub mod inputs;
pub mod lists;
pub mod multihot;
pub mod parquet_file;
pub mod parquet_write;
pub mod prepare;
pub mod schema;
pub mod shard;
pub mod synth;
pub mod weights;
pub mod zipf;

pub use cache::{CacheHeader, Dataset, SourceStat};
pub use criteo::{BadLine, BadLineKind, BadLineReport, Columns, CriteoReader, Sample, NUM_DENSE, NUM_SPARSE};
pub use error::{DataError, DataResult};
pub use evalset::EvalSet;
pub use fields::Fields;
pub use inputs::{natural_cmp, resolve};
pub use prepare::{prepare, prepare_with, PrepareOptions, PrepareSummary};
pub use schema::{ColumnSpec, Transform};
pub use shard::{epoch_order, global_batch_range, rank_slice, split, steps_per_epoch};
pub use synth::{synth, synth_shaped, synth_with, PlantedModel, SynthSummary, ValueShape};

/// A data file's identity for comparing ranks' inputs: its size and an FNV-1a digest of
/// its first and last 64 KiB (a copy of the file on another host gets the same one;
/// a file of another length or content almost surely not), or why it cannot be read.
pub fn identity(path: &std::path::Path) -> String {
    use std::io::{Read, Seek, SeekFrom};
    const EDGE: u64 = 64 << 10;
    let digest = (|| -> std::io::Result<(u64, u64)> {
        let mut f = std::fs::File::open(path)?;
        let len = f.metadata()?.len();
        let mut buf = Vec::with_capacity(2 * EDGE as usize);
        (&mut f).take(EDGE).read_to_end(&mut buf)?;
        if len > EDGE {
            f.seek(SeekFrom::Start(len.saturating_sub(EDGE).max(EDGE)))?;
            f.take(EDGE).read_to_end(&mut buf)?;
        }
        Ok((len, crate::hash::fnv1a64(&buf)))
    })();
    match digest {
        Ok((len, h)) => format!("{len} bytes, digest {h:016x}"),
        Err(e) => format!("unreadable: {e}"),
    }
}
