//! A generated multi-hot data set (issue 33), written as Parquet: 10 single-hot fields
//! (`c0`..`c9`, int64 ids) and 6 multi-hot fields (`l0`..`l5`, lists of int64 ids of mean
//! length 20, empty lists among them), ids drawn from a Zipf-like law (log-uniform over
//! 100,000 ids, so a few ids are everywhere and most are rare), labelled by a planted
//! model that uses the lists:
//!
//! ```text
//! logit = bias + 0.5 Σ_f w(c_f, f) + Σ_g (1 / sqrt(len_g)) Σ_{id in l_g} w(id, 10 + g)
//! label ~ Bernoulli(sigmoid(logit))
//! ```
//!
//! with `w(id, field)` a fixed pseudo-random weight of standard deviation about 0.5 — an
//! `EmbeddingBag(mode=sum)` over each list (scaled) sees the signal; the first id of each
//! list alone sees a fraction of it. Deterministic for a seed. `ringrec data synth --format
//! parquet --multi-hot` writes it (`--max-list-len N`: each list cut to its first N ids,
//! the same labels); `data prepare` turns it into a version-4 cache that `train` pools.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ::parquet::basic::Compression;
use ::parquet::column::writer::ColumnWriter;
use ::parquet::file::properties::WriterProperties;
use ::parquet::file::writer::SerializedFileWriter;
use ::parquet::schema::parser::parse_message_type;

use super::error::{DataError, DataResult};
use super::synth::{histogram_auc, AUC_BINS};
use crate::fileio::AtomicFile;
use crate::hash::splitmix64;

/// Single-hot fields (`c0`..`c9`).
pub const SINGLE_FIELDS: usize = 10;
/// Multi-hot fields (`l0`..`l5`).
pub const LIST_FIELDS: usize = 6;
/// Mean length of a list (lengths uniform in `0..=2 * MEAN_LIST_LEN`).
pub const MEAN_LIST_LEN: u64 = 20;
/// Ids per field.
pub const VOCABULARY: u64 = 100_000;
/// Rows of one row group.
const ROWS_PER_GROUP: usize = 32 << 10;
/// The planted model's bias.
const BIAS: f64 = -1.5;

/// What [`synth_multi_hot`] wrote.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct MultiHotSummary {
    /// The Parquet file.
    pub path: PathBuf,
    /// Rows written.
    pub rows: u64,
    /// Positive labels.
    pub positives: u64,
    /// Ids in all the lists.
    pub list_ids: u64,
    /// AUC of the planted model's own probabilities on the labels (the Bayes AUC).
    pub bayes_auc: f64,
    /// AUC of the planted model's probabilities with every list cut to its first id (what
    /// a single-hot reading of the lists could reach at best, about).
    pub first_id_auc: f64,
    /// Size of the file.
    pub bytes: u64,
    /// The seed.
    pub seed: u64,
}

/// A uniform number in [0, 1) from a hash.
fn unit(h: u64) -> f64 {
    (h >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// The planted weight of `id` in field `field`: a sum of four uniforms, centred (standard
/// deviation about 0.58).
fn weight(seed: u64, field: usize, id: u64) -> f64 {
    let mut h = splitmix64(seed ^ splitmix64(((field as u64) << 40) ^ id));
    let mut s = 0.0;
    for _ in 0..4 {
        h = splitmix64(h);
        s += unit(h);
    }
    s - 2.0
}

/// A Zipf-like id (log-uniform over `0..VOCABULARY`) from a hash.
fn zipf_id(h: u64) -> u64 {
    ((VOCABULARY as f64).powf(unit(h)) as u64).saturating_sub(1).min(VOCABULARY - 1)
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// The Parquet schema: the label, the single-hot ids, the lists (3-level LIST groups).
fn schema() -> String {
    let mut s = String::from("message multihot { required int32 label; ");
    for f in 0..SINGLE_FIELDS {
        s += &format!("required int64 c{f}; ");
    }
    for g in 0..LIST_FIELDS {
        s += &format!("optional group l{g} (LIST) {{ repeated group list {{ required int64 element; }} }} ");
    }
    s + "}"
}

/// One row group's columns.
#[derive(Default)]
struct Group {
    labels: Vec<i32>,
    singles: Vec<Vec<i64>>,
    /// Per list field: ids, definition levels, repetition levels.
    lists: Vec<(Vec<i64>, Vec<i16>, Vec<i16>)>,
}

/// Writes `rows` rows of the multi-hot set (see the module docs) to the Parquet file `out`
/// (atomically, mode 0600), deterministic for `seed`.
pub fn synth_multi_hot(out: &Path, rows: u64, seed: u64) -> DataResult<MultiHotSummary> {
    synth_multi_hot_cut(out, rows, seed, None)
}

/// [`synth_multi_hot`] with every list written cut to its first `max_len` ids (at least
/// one; `None`: whole): the same rows and labels (drawn from the whole lists), `list_ids` counting the
/// ids written.
pub fn synth_multi_hot_cut(out: &Path, rows: u64, seed: u64, max_len: Option<u64>) -> DataResult<MultiHotSummary> {
    // A list keeps at least its first id (a cut to none would change no label either).
    let max_len = max_len.map(|m| m.max(1));
    let fail = |e: ::parquet::errors::ParquetError| DataError::InvalidArgument(format!("{}: writing Parquet: {e}", out.display()));
    let schema = Arc::new(parse_message_type(&schema()).map_err(fail)?);
    let props = Arc::new(WriterProperties::builder().set_compression(Compression::SNAPPY).set_max_row_group_row_count(Some(ROWS_PER_GROUP)).build());
    let tmp = AtomicFile::create(out, crate::fileio::PRIVATE)?;
    let mut writer = SerializedFileWriter::new(tmp.file(), schema, props).map_err(fail)?;
    let (mut pos, mut neg) = (vec![0u64; AUC_BINS], vec![0u64; AUC_BINS]);
    let (mut pos1, mut neg1) = (vec![0u64; AUC_BINS], vec![0u64; AUC_BINS]);
    let bin = |p: f64| ((p * AUC_BINS as f64) as usize).min(AUC_BINS - 1);
    let (mut positives, mut list_ids) = (0u64, 0u64);
    let mut start = 0u64;
    while start < rows {
        let n = (rows - start).min(ROWS_PER_GROUP as u64);
        let mut g = Group { singles: vec![Vec::new(); SINGLE_FIELDS], lists: vec![Default::default(); LIST_FIELDS], ..Default::default() };
        for r in start..start + n {
            let mut h = splitmix64(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ r);
            let (mut logit, mut logit1) = (BIAS, BIAS);
            for (f, col) in g.singles.iter_mut().enumerate() {
                h = splitmix64(h);
                let id = zipf_id(h);
                col.push(id as i64);
                let w = 0.5 * weight(seed, f, id);
                logit += w;
                logit1 += w;
            }
            for (k, (ids, defs, reps)) in g.lists.iter_mut().enumerate() {
                h = splitmix64(h);
                let len = h % (2 * MEAN_LIST_LEN + 1);
                if len == 0 {
                    defs.push(1);
                    reps.push(0);
                    continue;
                }
                let scale = 1.0 / (len as f64).sqrt();
                for i in 0..len {
                    h = splitmix64(h);
                    let id = zipf_id(h);
                    if max_len.is_none_or(|m| i < m) {
                        ids.push(id as i64);
                        defs.push(2);
                        reps.push(i16::from(i > 0));
                    }
                    let w = scale * weight(seed, SINGLE_FIELDS + k, id);
                    logit += w;
                    if i == 0 {
                        logit1 += w;
                    }
                }
                list_ids += max_len.map_or(len, |m| len.min(m));
            }
            let p = sigmoid(logit);
            h = splitmix64(h);
            let label = unit(h) < p;
            positives += u64::from(label);
            g.labels.push(i32::from(label));
            let (all, first) = if label { (&mut pos, &mut pos1) } else { (&mut neg, &mut neg1) };
            all[bin(p)] += 1;
            first[bin(sigmoid(logit1))] += 1;
        }
        let mut rg = writer.next_row_group().map_err(fail)?;
        let (mut single, mut list) = (0, 0);
        while let Some(mut col) = rg.next_column().map_err(fail)? {
            match col.untyped() {
                ColumnWriter::Int32ColumnWriter(w) => w.write_batch(&g.labels, None, None),
                ColumnWriter::Int64ColumnWriter(w) if single < SINGLE_FIELDS => {
                    single += 1;
                    w.write_batch(&g.singles[single - 1], None, None)
                }
                ColumnWriter::Int64ColumnWriter(w) => {
                    list += 1;
                    let (ids, defs, reps) = &g.lists[list - 1];
                    w.write_batch(ids, Some(defs), Some(reps))
                }
                _ => Err(::parquet::errors::ParquetError::General("unexpected column type".into())),
            }
            .map_err(fail)?;
            col.close().map_err(fail)?;
        }
        rg.close().map_err(fail)?;
        start += n;
    }
    writer.close().map_err(fail)?;
    tmp.commit()?;
    let bytes = std::fs::metadata(out).map_err(|e| DataError::io(out, "stat", e))?.len();
    Ok(MultiHotSummary { path: out.to_path_buf(), rows, positives, list_ids, bayes_auc: histogram_auc(&pos, &neg), first_id_auc: histogram_auc(&pos1, &neg1), bytes, seed })
}
