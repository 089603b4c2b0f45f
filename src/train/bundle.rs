//! The serving bundle (`ringrec export --model DIR --out BUNDLE`): a trained model in a
//! directory that a reader with no ringrec code can load and score with
//! (`scripts/bundle_predict.py` does, with numpy only).
//!
//! ```text
//! BUNDLE/model.json   what the model is: format name and version (2 for an mlp, 3 for the
//!                     other models), the checkpoint it
//!                     was exported from and the step it was trained to (and newer
//!                     checkpoints skipped as damaged, `export --allow-older`), the input (how a Criteo TSV line becomes the model's
//!                     input, every constant included), the model (`model`: its kind and
//!                     shape, its parameter groups and tensors, the order of its inputs and
//!                     how the logit is formed, [`super::describe`]), the table's dtype
//!                     and the rule of the initial rows of keys it does not hold, each file's
//!                     size and CRC-32 (zlib's, of its bytes before its own 4-byte CRC trailer)
//! BUNDLE/dense.bin    the model's parameters: [`crate::model::dense_bin`]'s layout
//!                     (version 2 for an mlp, 3 for the others; no optimizer moments),
//!                     framed ([`crate::frame`])
//! BUNDLE/table.bin    the table's live rows: a sparse-parameter file (RRSPARAM version 3,
//!                     framed, keys ascending, values as f32; see [`crate::embedding::params`]);
//!                     rows of `row_width` values (deepfm, wide-deep: the embedding, then the
//!                     key's first-order weight)
//! BUNDLE/table.NAME.bin  a `--table` model's named table NAME, as table.bin; model.json's
//!                     `tables` records the layout: every categorical field's table and
//!                     width, in the order of the model's input (version 4)
//! BUNDLE/model.onnx   with `--format onnx` only: the dense model as an ONNX graph (inputs
//!                     the transformed dense features and the fields' table rows, output
//!                     the click probability; `crate::model::onnx`, feature `onnx`),
//!                     listed in model.json's `onnx` with its size and CRC-32
//! ```
//! A bundle is written at the oldest version that holds its model: an mlp's is version 2,
//! which earlier ringrec builds and scorers read (they ignore the `model` section); another
//! model's is version 3, a `--table` model's version 4, which they refuse by its version
//! rather than misread.
//! Both binary files are framed: a 32-byte header (magic, version, header length, payload
//! length, the header's CRC-32), the payload, and the CRC-32 of every byte before it;
//! `model.json` spells out both layouts for a reader without ringrec. Bundles of version 1
//! (`dense.bin` RRMLP version 1, `table.bin` RRSPARAM version 2, both unframed) and bundles
//! of version 2 without a `model` section (an mlp: `dense.widths` gives it) still open.
//!
//! The mlp: `h_0 = x`; `h_{l+1} = relu(h_l W_l + b_l)` for the hidden layers; the last
//! layer gives one logit `z = h_{L-1} W_{L-1} + b_{L-1}`; the score is `1 / (1 + exp(-z))`.
//! `x` is the 26 fields' embedding rows (C1..C26, `dim` values each) then the 13 transformed
//! integer features, as `model.json`'s `input` says. The other models: `model.logit`.
//!
//! **Keys the table does not hold** (never seen in training, or seen only in the held-out
//! rows) are scored with the deterministic initial row ringrec gives them
//! ([`crate::embedding::init`]; the formula and its seed are in `model.json`), exactly as
//! `train`'s evaluation and `ringrec predict` do: the bundle stays as small as the live rows.
//!
//! A bundle is published as one directory ([`crate::fileio::AtomicDir`]: built in
//! `.BUNDLE.tmp-<pid>-<n>` beside `BUNDLE`, every file and the directory fsynced, renamed
//! into place, the parent fsynced), so a crash leaves no half bundle under the name (only
//! that temporary, which `ringrec clean PARENT` removes); an existing `BUNDLE` is never
//! overwritten.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::data::ColumnSpec;
use crate::embedding::{EmbeddingTable, StorageDtype, TableError};
use crate::fileio::{write_atomic, AtomicDir, IoError};
use crate::frame::FrameError;
use super::describe::ModelDescription;
use super::source::NamedTables;
use super::tables::TableLayout;
use crate::model::dense_bin::{mlp_widths, MLP_VERSION};
use crate::model::DenseWeights;

/// `model.json`.
pub const MODEL_JSON: &str = "model.json";
/// The MLP's weights.
pub const DENSE_BIN: &str = "dense.bin";
/// The table's live rows (a sparse-parameter file).
pub const TABLE_BIN: &str = "table.bin";
/// The dense model as an ONNX graph (`--format onnx`).
pub const MODEL_ONNX: &str = "model.onnx";
/// `model.json`'s format name.
pub const FORMAT: &str = "ringrec-bundle";
/// `model.json`'s newest version (this build writes it for a `--table` model, whose
/// `tables` older readers would not see, and reads it and every older one).
pub const VERSION: u32 = 4;
/// The version of a bundle of one table and a model other than an mlp (whose bundle stays
/// version [`MLP_VERSION`]).
pub const MODELS_VERSION: u32 = 3;

/// Errors of writing or reading a bundle (or a `dense.bin`); each names the file and what
/// to do.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// A file operation failed.
    #[error(transparent)]
    Io(#[from] IoError),
    /// `dense.bin` is damaged (or not one).
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// A file of the bundle is damaged, missing or not what `model.json` says.
    #[error("{path}: {detail}; export the model again (ringrec export --model CHECKPOINT_DIR --out BUNDLE)")]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The table could not be read or written.
    #[error(transparent)]
    Table(#[from] TableError),
    /// The output exists.
    #[error("{0}: exists; remove it or choose another --out (a bundle is never overwritten)")]
    Exists(PathBuf),
    /// The checkpoint does not record what the bundle must say (its multi-hot fields:
    /// [`super::source::ModelSource::unrecorded_fields`]); the message says how to go on.
    #[error("{0}")]
    Unrecorded(String),
    /// `--format onnx` in a build without feature `onnx`.
    #[error("this ringrec was built without the ONNX export (feature onnx, part of the default feature cli); export --format bundle, or build with --features onnx")]
    NoOnnx,
}

/// What an export writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Format {
    /// model.json, dense.bin, table.bin.
    #[default]
    Bundle,
    /// The bundle and model.onnx, the dense model as an ONNX graph.
    Onnx,
}

impl std::str::FromStr for Format {
    type Err = String;

    /// `bundle` or `onnx` (`ringrec export --format`).
    fn from_str(s: &str) -> Result<Format, String> {
        match s {
            "bundle" => Ok(Format::Bundle),
            "onnx" => Ok(Format::Onnx),
            _ => Err(format!("`{s}` is not an export format; choose from bundle, onnx")),
        }
    }
}

/// The frame of both binary files, as `model.json` spells it out.
const FRAME_LAYOUT: &str = "little-endian; a 32-byte header: 8-byte magic, u32 version, u32 header length (32), u64 payload length n, the CRC-32 of the header's first 24 bytes, 4 zero bytes; then the n-byte payload, then the CRC-32 of every byte before it";

/// Result alias of bundles.
pub type BundleResult<T> = Result<T, BundleError>;

fn damaged(path: &Path, detail: impl Into<String>) -> BundleError {
    BundleError::Damaged { path: path.to_path_buf(), detail: detail.into() }
}

fn io<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(std::io::Error) -> BundleError + 'a {
    move |e| BundleError::Io(IoError::new(path, op, e))
}

/// A file of the bundle as `model.json` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Its name in the bundle.
    pub name: String,
    /// Its length.
    pub bytes: u64,
    /// CRC-32 (zlib's) of every byte before the file's 4-byte trailer (which repeats it: a
    /// CRC over a whole file that ends in its own CRC is a constant).
    pub crc32: u32,
}

/// How a Criteo TSV line becomes the model's input (`model.json`'s `input`): every rule
/// and constant of [`crate::data::criteo`], so that a reader needs nothing else.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InputSpec {
    /// The line format.
    pub line: String,
    /// The label field.
    pub label: String,
    /// Integer features (I1..I13).
    pub dense_features: usize,
    /// What an integer feature must look like and what it becomes.
    pub dense_transform: String,
    /// Categorical features (C1..C26).
    pub categorical_features: usize,
    /// What a categorical value must look like and what number it is.
    pub categorical_value: String,
    /// The value a missing categorical stands for (hex).
    pub missing_value: String,
    /// Base of the per-field salt (hex).
    pub field_salt_base: String,
    /// How a (field, value) becomes a table key.
    pub key: String,
    /// The splitmix64 function the key and the initial rows use.
    pub splitmix64: String,
    /// The order of the model's input vector.
    pub order: String,
    /// How a Parquet file's single-hot columns become the same input (empty in bundles
    /// written before Parquet inputs).
    #[serde(default)]
    pub parquet: String,
    /// The Parquet columns the model was trained with, when its run named them (`--schema`
    /// or the column flags): label, dense columns with their explicit transforms, sparse
    /// columns; absent when they were inferred.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<ColumnSpec>,
    /// The multi-hot fields (Parquet list columns), in the order their pooled vectors follow
    /// the single-hot fields' rows, each with its pooling; absent without them (and in
    /// bundles written before them, whose models summed any).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub multi_hot: Vec<MultiHotField>,
}

/// A multi-hot field of `model.json`'s `input`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MultiHotField {
    /// The list column.
    pub name: String,
    /// The categorical field whose salt its ids' keys take (`key` of `input`).
    pub field: usize,
    /// How its bag of rows becomes one vector: `sum` or `mean` (an empty bag: zeros).
    pub pooling: String,
}

impl InputSpec {
    /// The input of a model of `spec` trained on data whose Parquet `columns` were named
    /// (`None`: inferred, or a TSV) and that recorded `pooling` (its multi-hot fields by
    /// name): a TSV's rules ([`InputSpec::criteo`]) with the model's counts of dense
    /// features and single-hot categorical fields, its multi-hot fields after them.
    pub fn of(spec: &crate::model::ModelSpec, columns: Option<&ColumnSpec>, pooling: Option<&str>) -> InputSpec {
        InputSpec::of_fields(spec, None, columns, pooling)
    }

    /// [`InputSpec::of`] with `single` single-hot categorical fields where the model's
    /// fields do not give them (a `--table` model's: [`TablesSpec`]).
    pub fn of_fields(spec: &crate::model::ModelSpec, single: Option<usize>, columns: Option<&ColumnSpec>, pooling: Option<&str>) -> InputSpec {
        let criteo = InputSpec::criteo();
        let lists = pooling.and_then(|p| crate::model::pooling::recorded_fields(p).ok()).unwrap_or_default();
        let fields = crate::data::Fields { dense: spec.ndense, sparse: single.unwrap_or(spec.fields.saturating_sub(lists.len())) };
        let order = match (fields == crate::data::Fields::CRITEO, lists.len()) {
            (true, 0) => criteo.order.clone(),
            (_, 0) => format!("x = [row(key of field 0), ..., row(key of field {}), dense feature 0, ..., dense feature {}]: {} x dim + {} binary32 values", fields.sparse as i64 - 1, fields.dense as i64 - 1, fields.sparse, fields.dense),
            (_, l) => format!(
                "x = [row(key of field 0), ..., row(key of field {}), pooled row of multi_hot[0], ..., pooled row of multi_hot[{}], dense feature 0, ..., dense feature {}]: {} x dim + {} binary32 values",
                fields.sparse as i64 - 1,
                l - 1,
                fields.dense as i64 - 1,
                spec.fields,
                fields.dense
            ),
        };
        let multi_hot = lists.into_iter().enumerate().map(|(g, (name, mode))| MultiHotField { name, field: fields.list_field(g), pooling: mode.to_string() }).collect();
        InputSpec { dense_features: fields.dense, categorical_features: fields.sparse, order, schema: columns.map(|c| ColumnSpec { file: None, ..c.clone() }), multi_hot, ..criteo }
    }

    /// The pooling its model records ([`crate::model::pooling::describe_pooling`]).
    pub fn pooling(&self) -> String {
        match self.multi_hot.is_empty() {
            true => "sum".into(),
            false => self.multi_hot.iter().map(|f| format!("{}={}", f.name, f.pooling)).collect::<Vec<_>>().join(","),
        }
    }

    /// ringrec's input, as [`crate::data::criteo`] parses it.
    pub fn criteo() -> InputSpec {
        use crate::data::criteo::{FIELD_SALT, MISSING_VALUE, NUM_DENSE, NUM_SPARSE};
        InputSpec {
            line: "40 tab-separated fields: label, I1..I13, C1..C26; LF or CRLF line ends; a line that breaks a rule below (or is empty, or is not UTF-8) is skipped, and ringrec counts it".into(),
            label: "exactly 0 or 1".into(),
            dense_features: NUM_DENSE,
            dense_transform: "empty (missing) or -?[0-9]+ within a signed 64-bit integer; becomes ln(1 + max(x, 0)) computed in binary64 (log1p) and rounded to binary32; missing is 0".into(),
            categorical_features: NUM_SPARSE,
            categorical_value: "empty (missing) or 1 to 16 hex digits in either case, read as the unsigned 64-bit number they spell (so 00ab and ab are equal)".into(),
            missing_value: format!("{MISSING_VALUE:#018x}"),
            field_salt_base: format!("{FIELD_SALT:#018x}"),
            key: "for categorical field f (C1 is f = 0): key = splitmix64(splitmix64(field_salt_base + f) ^ value) (mod 2^64), the missing value standing for an empty field; a key equal to 0xffffffffffffffff becomes 0xfffffffffffffffe".into(),
            splitmix64: "z = x + 0x9e3779b97f4a7c15; z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9; z = (z ^ (z >> 27)) * 0x94d049bb133111eb; return z ^ (z >> 31); every operation mod 2^64".into(),
            order: "x = [row(key of C1), ..., row(key of C26), I1, ..., I13]: 26 x dim + 13 binary32 values".into(),
            parquet: "a Parquet file's label is the column `label` (or `--label-column`), boolean or number, 0 or 1, never null; its features are every other column by type (integer or boolean: dense, ln(1 + max(x, 0)) as for I1..I13; float: dense as it is, rounded to binary32; string or binary, dictionary-encoded or not: categorical) or exactly the columns --dense-columns and --sparse-columns name (an integer there: categorical, its value as an unsigned 64-bit number), in column order: the dense columns are the dense features (dense_features of them), the others the categorical fields (categorical_features of them; a Criteo-shaped file's fill I1..I13 and C1..C26); a categorical string of 1 to 16 hex digits is the number it spells, another string its FNV-1a 64 (offset 0xcbf29ce484222325, prime 0x100000001b3) over its bytes; an empty string or a null is the missing value, a null dense value 0; a list column of `multi_hot` (a multi-hot field) is read as its ids (a null list is empty, a null id or an empty string left out), each id keyed by `key` with f = the field's `field` and as value the id (an integer as an unsigned 64-bit number; a string as a categorical string above: its hex digits' number or its FNV-1a 64), the rows of a list's keys pooled in list order in binary32 by the field's `pooling` (sum; mean: that sum divided by the list's length; an empty list: zeros), the pooled vectors following the single-hot fields' rows in `multi_hot`'s order (x = [single-hot rows, pooled rows, dense features]); other list columns are not read; `schema`, when present, names the columns as --label-column, --dense-columns and --sparse-columns would, and `transforms` gives a dense column's transform where it was chosen (log: ln(1 + max(x, 0)); none: as it is), the others taking the default above".into(),
            schema: None,
            multi_hot: Vec::new(),
        }
    }
}

/// The table part of `model.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TableSpec {
    /// The file (`table.bin`).
    pub file: String,
    /// `RRSPARAM version 2`.
    pub format: String,
    /// Values per row.
    pub dim: u32,
    /// Rows in the file (the table's live rows).
    pub rows: u64,
    /// The storage dtype the model was trained with (`f32`, `f16`, `bf16`); the file holds
    /// its values widened to f32, exactly.
    pub dtype: String,
    /// Keys in the file are in ascending order.
    pub key_order: String,
    /// Seed of the initial rows.
    pub init_seed: u64,
    /// Initial rows are uniform in `[-init_scale, init_scale)`.
    pub init_scale: f32,
    /// How the row of a key absent from the file is made.
    pub unseen_keys: String,
}

/// A named table of a `--table` model (`model.json`'s `tables.named`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NamedTableSpec {
    /// Its name (`--table FIELDS=NAME`).
    pub name: String,
    /// Its file (`table.NAME.bin`) and what it holds, as `table` describes the default
    /// table's.
    #[serde(flatten)]
    pub table: TableSpec,
}

/// A categorical field of a `--table` model (`model.json`'s `tables.fields`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldLayout {
    /// Its name as the data names it (a Parquet column; `C1`..`Cn` for a TSV's fields).
    pub name: String,
    /// A list field (one of `input.multi_hot`, which gives its pooling).
    pub multi_hot: bool,
    /// The file of the table its keys are looked up in (`table.bin`: the default table).
    pub table: String,
    /// Values of its row (a list field: its pooled row) in the model's input.
    pub width: usize,
}

/// `model.json`'s `tables` (bundle version 4): a model whose fields keep tables of their
/// own (`train --table`), the layout that says where each field's row comes from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TablesSpec {
    /// The `--table` flags of its run.
    pub flags: String,
    /// Every categorical field in the order of the model's input: the single-hot fields,
    /// then the list fields.
    pub fields: Vec<FieldLayout>,
    /// The named tables, in flag order (the default table is `table`).
    pub named: Vec<NamedTableSpec>,
    /// How the model's input is formed from the fields' rows.
    pub input: String,
}

impl TablesSpec {
    /// The file of table `t` of a layout (0: the default table's, `table.bin`).
    pub fn file_of(&self, t: usize) -> &str {
        match t {
            0 => TABLE_BIN,
            t => self.named.get(t - 1).map_or("", |n| n.table.file.as_str()),
        }
    }
}

/// The dense part of `model.json` (`dense`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DenseSpec {
    /// The file (`dense.bin`).
    pub file: String,
    /// An mlp's widths: input, hidden widths..., 1 (absent for the other models: `model`
    /// describes them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub widths: Vec<usize>,
    /// The hidden widths.
    pub hidden: Vec<usize>,
    /// The hidden layers' activation (`relu`).
    pub hidden_activation: String,
    /// What the last layer gives and how it becomes a score.
    pub output: String,
    /// Parameters.
    pub params: usize,
    /// The byte layout of `dense.bin`.
    pub layout: String,
}

/// The ONNX part of `model.json` (`--format onnx`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OnnxSpec {
    /// The file (`model.onnx`).
    pub file: String,
    /// Its length.
    pub bytes: u64,
    /// CRC-32 (zlib's) of the whole file (an ONNX file has no trailer).
    pub crc32: u32,
    /// The ONNX IR version.
    pub ir_version: i64,
    /// The default operator set's version.
    pub opset: i64,
    /// The model (`--model`).
    pub model: String,
    /// The graph's inputs: name, type, shape and what a server feeds.
    pub inputs: Vec<String>,
    /// The graph's output.
    pub output: String,
}

/// `model.json`: everything a reader needs, and the checksums of the other files.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelJson {
    /// `ringrec-bundle`.
    pub format: String,
    /// Its version (2; 1 for a bundle of an older ringrec).
    pub version: u32,
    /// The checkpoint it was exported from.
    pub source: String,
    /// Global training steps the model was trained for.
    pub step: u64,
    /// Newer checkpoints of the directory that were skipped as damaged (`export
    /// --allow-older`), each with why; absent when the newest was exported.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
    /// Values per table row (the embedding dimension; deepfm and wide-deep: one more, the
    /// key's first-order weight).
    pub dim: u32,
    /// The input.
    pub input: InputSpec,
    /// The model: kind, shape, parameter groups, how the logit is formed (absent in bundles
    /// of older ringrec builds: an mlp of `dense.widths`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelDescription>,
    /// The dense parameters' file.
    pub dense: DenseSpec,
    /// The table (a `--table` model's default table).
    pub table: TableSpec,
    /// A `--table` model's layout and named tables (version 4); absent for one table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tables: Option<TablesSpec>,
    /// The files with their sizes and CRC-32s.
    pub files: Vec<FileEntry>,
    /// `model.onnx` (`--format onnx`); absent from a bundle without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub onnx: Option<OnnxSpec>,
}

/// What an export wrote.
#[derive(Clone, Debug, Serialize)]
pub struct ExportSummary {
    /// The bundle.
    pub bundle: PathBuf,
    /// The checkpoint it came from.
    pub source: PathBuf,
    /// The step it was trained to.
    pub step: u64,
    /// Newer checkpoints skipped as damaged (`--allow-older`), each with why.
    pub skipped: Vec<String>,
    /// The model (`dlrm (bottom 13-64-16, ...)`).
    pub model: String,
    /// Table rows written (over every table).
    pub rows: u64,
    /// Dense parameters written.
    pub params: usize,
    /// Bytes of the files (three, four with model.onnx).
    pub bytes: u64,
    /// model.onnx was written (`--format onnx`).
    pub onnx: bool,
    /// A `--table` model's named tables' files (`table.NAME.bin`), in flag order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tables: Vec<String>,
}

/// A file of the bundle checked in one streamed read: its length, the CRC-32 of every
/// byte before its 4-byte trailer, and that trailer (which must repeat that CRC).
fn file_sum(path: &Path) -> BundleResult<(u64, u32)> {
    let (len, crc, stored) = crate::frame::trailer_sum(path)?;
    if crc != stored {
        return Err(damaged(path, format!("checksum mismatch: its contents have CRC-32 {crc:#010x}, its trailer records {stored:#010x}")));
    }
    Ok((len, crc))
}

/// Where a bundle's model comes from: the checkpoint, the step it was trained to, and the
/// newer checkpoints skipped as damaged (each with why).
#[derive(Clone, Copy, Debug)]
pub struct Provenance<'a> {
    /// The checkpoint.
    pub source: &'a Path,
    /// Its step.
    pub step: u64,
    /// The newer checkpoints skipped.
    pub skipped: &'a [String],
}

/// Writes `model.onnx` of `dense` (embeddings of `dim`) into `dir`; gives its model.json entry.
#[cfg(feature = "onnx")]
fn write_onnx(dir: &Path, source: &Path, dense: &DenseWeights, split: bool) -> BundleResult<OnnxSpec> {
    use crate::model::onnx;
    let (net, s) = onnx::Net::of_spec(&dense.spec);
    let bytes = onnx::encode(&net, s, &dense.params).map_err(|e| damaged(source, format!("the ONNX graph: {e}")))?;
    write_atomic(&dir.join(MODEL_ONNX), 0o600, |w| w.write_all(&bytes))?;
    let row = net.row_width(s.dim);
    Ok(OnnxSpec {
        file: MODEL_ONNX.into(),
        bytes: bytes.len() as u64,
        crc32: crate::hash::crc32(&bytes),
        ir_version: onnx::IR_VERSION,
        opset: onnx::OPSET,
        model: net.name().into(),
        inputs: vec![
            format!("{} f32 [batch, {}]: the dense features as input.dense_transform makes them (ln(1 + max(x, 0)), missing 0), I1..I13", onnx::INPUT_DENSE, s.dense),
            match split {
                false => format!("{} f32 [batch, {}, {row}]: per field C1..C26 in order, the row of its key in table.bin (a key absent from it: its initial row, table.unseen_keys)", onnx::INPUT_EMB, s.fields),
                true => format!("{} f32 [batch, {}, {row}]: the fields' rows as tables.input lays them out (tables.fields in order, each the row of its key in its table, a multi-hot field's pooled; a key absent from its table: its initial row, by that table's unseen_keys)", onnx::INPUT_EMB, s.fields),
            },
        ],
        output: format!("{} f32 [batch, 1]: the click probability (the score ringrec predict gives)", onnx::OUTPUT),
    })
}

/// Without feature `onnx`: refused.
#[cfg(not(feature = "onnx"))]
fn write_onnx(_dir: &Path, _source: &Path, _dense: &DenseWeights, _split: bool) -> BundleResult<OnnxSpec> {
    Err(BundleError::NoOnnx)
}

/// Writes the bundle of a model — its `dense` weights, its `table` (a verified, opened table
/// file), from `from` — into `out` (which must not exist); with [`Format::Onnx`] also
/// `model.onnx`.
pub fn write(out: &Path, from: Provenance<'_>, dense: &DenseWeights, table: &EmbeddingTable, format: Format) -> BundleResult<ExportSummary> {
    write_with(out, from, Recorded::default(), dense, table, format)
}

/// What `model.json` records of a model beside its weights and its table.
#[derive(Clone, Copy, Default)]
pub struct Recorded<'a> {
    /// The Parquet columns it was trained with.
    pub columns: Option<&'a ColumnSpec>,
    /// The pooling of its multi-hot fields, as recorded ([`super::source::ModelSource::pooling`]).
    pub pooling: Option<&'a str>,
    /// A `--table` model's named tables, each opened (in flag order).
    pub tables: Option<(&'a NamedTables, &'a [EmbeddingTable])>,
}

/// The file of named table `name` in a bundle.
pub fn named_table_file(name: &str) -> String {
    format!("table.{name}.bin")
}

/// `model.json`'s description of the table file `file`: rows of the table of header `h`.
fn table_spec(file: &str, h: &crate::embedding::Header, rows: u64) -> TableSpec {
    TableSpec {
        file: file.into(),
        format: format!("RRSPARAM version 3: magic \"RRSPARAM\", version 3; {FRAME_LAYOUT}; the payload: u32 dim, u32 zero, u64 count, count records of (u64 key, dim f32)"),
        dim: h.dim,
        rows,
        dtype: h.dtype.name().into(),
        key_order: "ascending".into(),
        init_seed: h.seed,
        init_scale: h.init_scale,
        unseen_keys: format!("a key absent from {file} reads as its initial row: base = splitmix64(init_seed ^ splitmix64(key)); for j = 0..dim: u = splitmix64(base + (j + 1) * 0x9e3779b97f4a7c15) >> 40 (mod 2^64); value_j = init_scale * (u * 2^-23 - 1) in binary32 arithmetic (u exact, one rounding, in the product); then rounded to dtype (f16 or bf16: to nearest, ties to even)"),
    }
}

/// The layout of a `--table` model's tables `named` (the default one's rows of
/// `default_dim` values) for its weights `dense`, checked: the model reads the fields'
/// rows as the tables give them.
fn split_layout(source: &Path, named: &NamedTables, opened: &[EmbeddingTable], default_dim: u32, dense: &DenseWeights) -> BundleResult<TableLayout> {
    if opened.len() != named.files.len() || opened.iter().zip(&named.files).any(|(t, f)| t.header().dim != f.dim) {
        return Err(damaged(source, format!("its tables ({}) are not the ones --table {} names", opened.len(), named.flags)));
    }
    let layout = named.layout(default_dim, "export").map_err(BundleError::Unrecorded)?;
    if let Some(e) = super::source::layout_mismatch(&dense.spec, &layout) {
        return Err(damaged(source, e));
    }
    Ok(layout)
}

/// [`write`], `model.json` recording what `recorded` holds.
pub fn write_with(out: &Path, from: Provenance<'_>, recorded: Recorded<'_>, dense: &DenseWeights, table: &EmbeddingTable, format: Format) -> BundleResult<ExportSummary> {
    let Provenance { source, step, skipped } = from;
    if out.exists() {
        return Err(BundleError::Exists(out.to_path_buf()));
    }
    let h = *table.header();
    let split = match recorded.tables {
        Some((named, opened)) => Some((named, opened, split_layout(source, named, opened, h.dim, dense)?)),
        None => {
            if let Some(e) = super::source::row_mismatch(&dense.spec, h.dim) {
                return Err(damaged(source, e));
            }
            None
        }
    };
    let spec = &dense.spec;
    let widths = mlp_widths(spec);
    let name = out.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_else(|| "bundle".into());
    let parent = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(io(parent, "create the output's directory"))?;
    let dir = AtomicDir::create(&parent.join(name))?;
    let tmp = dir.path();
    let summary = {
        let default_rows = table.export_params(&tmp.join(TABLE_BIN))?;
        let mut rows = default_rows;
        let bin = dense.encode(step).map_err(|e| damaged(source, format!("the dense model is not one model: {e}")))?;
        write_atomic(&tmp.join(DENSE_BIN), 0o600, |w| w.write_all(&bin))?;
        let onnx = match format {
            Format::Bundle => None,
            Format::Onnx => Some(write_onnx(tmp, source, dense, split.is_some())?),
        };
        let tables = match &split {
            Some((named, opened, layout)) => {
                let mut tables = Vec::with_capacity(opened.len());
                for (t, tab) in named.specs().map_err(|e| damaged(source, e))?.iter().zip(opened.iter()) {
                    let file = named_table_file(&t.name);
                    let n = tab.export_params(&tmp.join(&file))?;
                    rows += n;
                    tables.push(NamedTableSpec { name: t.name.clone(), table: table_spec(&file, tab.header(), n) });
                }
                Some(tables_spec(named, layout, tables, spec.ndense))
            }
            None => None,
        };
        let mut files = Vec::new();
        let named_files = tables.iter().flat_map(|t| t.named.iter().map(|n| n.table.file.as_str()));
        for f in [DENSE_BIN, TABLE_BIN].into_iter().chain(named_files) {
            let (bytes, crc32) = file_sum(&tmp.join(f))?;
            files.push(FileEntry { name: f.into(), bytes, crc32 });
        }
        let mut input = InputSpec::of_fields(spec, split.as_ref().map(|(_, _, l)| l.single), recorded.columns, recorded.pooling);
        if let Some(t) = &tables {
            input.order = t.input.clone();
        }
        let json = ModelJson {
            format: FORMAT.into(),
            version: match (&tables, &widths) {
                (Some(_), _) => VERSION,
                (None, Some(_)) => MLP_VERSION,
                (None, None) => MODELS_VERSION,
            },
            source: source.display().to_string(),
            step,
            skipped: skipped.to_vec(),
            dim: h.dim,
            input,
            model: Some(ModelDescription::of(spec)),
            dense: DenseSpec {
                file: DENSE_BIN.into(),
                widths: widths.clone().unwrap_or_default(),
                hidden: dense.hidden().to_vec(),
                hidden_activation: "relu".into(),
                output: "one logit z (identity activation); score = 1 / (1 + exp(-z))".into(),
                params: dense.params.len(),
                layout: match widths {
                    Some(_) => format!("magic \"RRMLP\\0\\0\\0\", version 2; {FRAME_LAYOUT}; the payload: u64 step, u32 layers L, L + 1 u32 widths, u32 moments K (0 here), then per layer W (in x out, row-major) and b (out) as f32"),
                    None => format!("magic \"RRMLP\\0\\0\\0\", version 3; {FRAME_LAYOUT}; the payload: u64 step; u32 model kind (0 mlp, 1 dlrm, 2 dcn, 3 deepfm, 4 wide-deep), u32 fields, u32 dim, u32 dense features, u32 H, u32 B, u32 interaction_self (0/1), u32 cross layers, u32 cross rank, u32 cross structure (0 stacked, 1 parallel); H u32 hidden widths; B u32 bottom widths; u32 moments K (0 here); u64 parameter count P; then the P parameters as f32 in the order of model.groups (each group's tensors one after the other, row-major)"),
                },
            },
            table: table_spec(TABLE_BIN, &h, default_rows),
            tables,
            files,
            onnx,
        };
        let text = serde_json::to_vec_pretty(&json).map_err(|e| damaged(&tmp.join(MODEL_JSON), format!("encoding: {e}")))?;
        write_atomic(&tmp.join(MODEL_JSON), 0o600, |w| w.write_all(&text).and_then(|_| w.write_all(b"\n")))?;
        let onnx_bytes = json.onnx.as_ref().map_or(0, |o| o.bytes);
        let bytes = json.files.iter().map(|f| f.bytes).sum::<u64>() + onnx_bytes + text.len() as u64 + 1;
        let tables = json.tables.iter().flat_map(|t| t.named.iter().map(|n| n.table.file.clone())).collect();
        ExportSummary { bundle: out.to_path_buf(), source: source.to_path_buf(), step, skipped: skipped.to_vec(), model: spec.describe(), rows, params: dense.params.len(), bytes, onnx: json.onnx.is_some(), tables }
    };
    dir.publish(false).map_err(|e| if e.source.kind() == std::io::ErrorKind::AlreadyExists { BundleError::Exists(out.to_path_buf()) } else { e.into() })?;
    Ok(summary)
}

/// `model.json`'s `tables` of the tables `named` laid out as `layout` (the named tables'
/// descriptions `tables`), before `ndense` dense features.
fn tables_spec(named: &NamedTables, layout: &TableLayout, tables: Vec<NamedTableSpec>, ndense: usize) -> TablesSpec {
    let names = named.fields.as_ref().map(|(n, _)| n.as_slice()).unwrap_or_default();
    let mut spec = TablesSpec { flags: named.flags.clone(), fields: Vec::new(), named: tables, input: String::new() };
    spec.fields = (0..layout.table_of.len()).map(|f| FieldLayout { name: names.get(f).cloned().unwrap_or_default(), multi_hot: f >= layout.single, table: spec.file_of(layout.table_of[f]).to_string(), width: layout.width(f) }).collect();
    let sum: usize = spec.fields.iter().map(|f| f.width).sum();
    let input = format!(
        "x = [for each field of tables.fields in order: the row of its key in its table (a single-hot field f keyed as input.key says; a multi-hot field: its ids' rows pooled as input.multi_hot says), width values; then dense feature 0, ..., dense feature {}]: {sum} + {ndense} binary32 values; with every width equal the model reads them as model.fields fields of that width, else as one field of their {sum} values (a wide-deep: field f's width is its model.field_dims[f] values then its first-order weight)",
        ndense as i64 - 1
    );
    TablesSpec { input, ..spec }
}

/// Exports the checkpoint `m` ([`super::source::ModelSource`], resolved from `ringrec
/// export --model`) into the bundle `out` (which must not exist), as `format` says. Its
/// table file is opened (every block checked against its checksum) and its live rows
/// written in key order.
pub fn export(m: &super::source::ModelSource, out: &Path, format: Format) -> BundleResult<ExportSummary> {
    use super::source::SourceKind;
    let refuse = |detail: &str| Err(damaged(&m.given, detail));
    let dense = match (m.kind, &m.dense) {
        (SourceKind::Checkpoint, Some(d)) => d,
        (SourceKind::Bundle, _) => return refuse("an export bundle already (copy the directory to copy it)"),
        _ => return refuse("holds no dense weights: export a checkpoint directory (train --checkpoint-dir)"),
    };
    if let Some(why) = m.unrecorded_fields("export") {
        return Err(BundleError::Unrecorded(why));
    }
    let table = EmbeddingTable::open_readonly(&m.table.path)?;
    let named = match &m.tables {
        Some(t) => t.files.iter().map(|f| EmbeddingTable::open_readonly(&f.path)).collect::<Result<Vec<_>, _>>()?,
        None => Vec::new(),
    };
    let recorded = Recorded { columns: m.columns.as_ref(), pooling: m.pooling.as_deref(), tables: m.tables.as_ref().map(|t| (t, named.as_slice())) };
    write_with(out, Provenance { source: &m.path, step: m.step.unwrap_or(0), skipped: &m.skipped }, recorded, dense, &table, format)
}

/// A bundle that passed every check.
#[derive(Clone, Debug)]
pub struct Bundle {
    /// Its directory.
    pub dir: PathBuf,
    /// Its `model.json`.
    pub json: ModelJson,
    /// Its weights.
    pub dense: DenseWeights,
}

impl Bundle {
    /// Its table file.
    pub fn table(&self) -> PathBuf {
        self.dir.join(&self.json.table.file)
    }

    /// The table's storage dtype.
    pub fn dtype(&self) -> BundleResult<StorageDtype> {
        self.dtype_of(&self.json.table)
    }

    /// The storage dtype of its table `t` (the default table, or a named one).
    pub fn dtype_of(&self, t: &TableSpec) -> BundleResult<StorageDtype> {
        StorageDtype::parse(&t.dtype).ok_or_else(|| damaged(&self.dir.join(MODEL_JSON), format!("{}: dtype {:?} is not f32, f16 or bf16", t.file, t.dtype)))
    }

    /// Opens the bundle in `dir` and checks all of it: `model.json`'s format and version,
    /// every file's size and CRC-32, `dense.bin`'s own checks and its agreement with
    /// `model.json`, `table.bin`'s header against `model.json`.
    pub fn open(dir: &Path) -> BundleResult<Bundle> {
        let mp = dir.join(MODEL_JSON);
        let text = crate::fileio::read_input(&mp).map_err(io(&mp, "read"))?;
        let json: ModelJson = serde_json::from_slice(&text).map_err(|e| damaged(&mp, format!("not a bundle's model.json ({e})")))?;
        if json.format != FORMAT || !(1..=VERSION).contains(&json.version) {
            return Err(damaged(&mp, format!("format {} version {}, this build reads {FORMAT} versions 1 to {VERSION}", json.format, json.version)));
        }
        let named = json.tables.iter().flat_map(|t| t.named.iter().map(|n| &n.table));
        for name in [&json.dense.file, &json.table.file].into_iter().chain(named.clone().map(|t| &t.file)) {
            let f = json.files.iter().find(|f| &f.name == name).ok_or_else(|| damaged(&mp, format!("lists no checksum for {name}")))?;
            let p = dir.join(name);
            let (bytes, crc) = file_sum(&p)?;
            if bytes != f.bytes {
                return Err(damaged(&p, format!("{bytes} bytes, model.json says {}", f.bytes)));
            }
            if crc != f.crc32 {
                return Err(damaged(&p, format!("its CRC-32 is {crc:#010x}, model.json records {:#010x}", f.crc32)));
            }
        }
        let dp = dir.join(&json.dense.file);
        let dense = DenseWeights::read(&dp)?;
        match &json.model {
            Some(m) => {
                let described = m.spec.spec().map_err(|e| damaged(&mp, format!("its model is not one: {e}")))?;
                if described != dense.spec.normalized() {
                    return Err(damaged(&dp, format!("it holds the {}, model.json describes the {}", dense.spec.describe(), described.describe())));
                }
            }
            None if mlp_widths(&dense.spec).as_ref() != Some(&json.dense.widths) => {
                return Err(damaged(&dp, format!("it holds the {}, model.json says widths {:?}", dense.spec.describe(), json.dense.widths)));
            }
            None => {}
        }
        if let Some(o) = &json.onnx {
            let p = dir.join(&o.file);
            let bytes = crate::fileio::read_input(&p).map_err(io(&p, "read"))?;
            let crc = crate::hash::crc32(&bytes);
            if bytes.len() as u64 != o.bytes || crc != o.crc32 {
                return Err(damaged(&p, format!("{} bytes of CRC-32 {crc:#010x}, model.json says {} bytes of {:#010x}", bytes.len(), o.bytes, o.crc32)));
            }
        }
        if json.dim != json.table.dim {
            return Err(damaged(&mp, format!("dim {} and a table of dim {}", json.dim, json.table.dim)));
        }
        for t in std::iter::once(&json.table).chain(named) {
            let tp = dir.join(&t.file);
            let (ph, _) = crate::embedding::read_params_header(&tp)?;
            if ph.dim != t.dim || ph.count != t.rows {
                return Err(damaged(&tp, format!("{} rows of dim {}, model.json says {} rows of dim {}", ph.count, ph.dim, t.rows, t.dim)));
            }
        }
        let b = Bundle { dir: dir.to_path_buf(), json, dense };
        for t in std::iter::once(&b.json.table).chain(b.json.tables.iter().flat_map(|t| t.named.iter().map(|n| &n.table))) {
            b.dtype_of(t)?;
        }
        Ok(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ringrec-bundle-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// A model of dim 1: 26 + 13 inputs, one logit.
    fn weights() -> DenseWeights {
        DenseWeights { spec: crate::model::ModelSpec::mlp(26, 1, 13, vec![]), params: (0..40).map(|i| i as f32 * 0.01).collect() }
    }

    #[test]
    fn a_bundle_is_published_whole_and_never_overwritten() {
        use crate::embedding::TableConfig;
        let d = scratch("new");
        let mut t = EmbeddingTable::create(&d.join("live"), &TableConfig::new(1, 64)).unwrap();
        t.put_rows(&[1, 2], &[0.5, -0.5]).unwrap();
        let out = d.join("out").join("bundle");
        let s = write(&out, Provenance { source: Path::new("ck"), step: 7, skipped: &[] }, &weights(), &t, Format::Bundle).unwrap();
        assert_eq!((s.rows, s.params), (2, 40));
        let b = Bundle::open(&out).unwrap();
        assert_eq!((b.json.version, b.json.step, &b.dense), (2, 7, &weights()));
        let f = crate::model::dense_bin::read(&out.join(DENSE_BIN)).unwrap();
        assert_eq!((f.step, f.moments.len()), (Some(7), 0));
        let ph = crate::embedding::read_params_header(&b.table()).unwrap().0;
        assert_eq!((ph.version, ph.count), (3, 2));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&out).unwrap().permissions().mode() & 0o777, 0o700);
        let names: Vec<String> = std::fs::read_dir(d.join("out")).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        assert_eq!(names, vec!["bundle".to_string()], "no temporary left");
        assert!(matches!(write(&out, Provenance { source: Path::new("ck"), step: 7, skipped: &[] }, &weights(), &t, Format::Bundle), Err(BundleError::Exists(_))));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn every_model_is_bundled_with_its_description_and_version() {
        use crate::embedding::TableConfig;
        use crate::model::{ModelKind, ModelSpec};
        let d = scratch("models");
        let base = ModelSpec::mlp(26, 2, 13, vec![4]);
        for (i, spec) in [base.clone(), ModelSpec { kind: ModelKind::Dlrm, bottom: vec![3], ..base.clone() }, ModelSpec { kind: ModelKind::Dcn, cross_rank: 2, ..base.clone() }, ModelSpec { kind: ModelKind::DeepFm, ..base.clone() }].into_iter().enumerate() {
            let dim = spec.row_width() as u32;
            let mut t = EmbeddingTable::create(&d.join(format!("live{i}")), &TableConfig::new(dim, 64)).unwrap();
            t.put_rows(&[1, 2], &vec![0.25; 2 * dim as usize]).unwrap();
            let w = DenseWeights { params: (0..spec.num_params()).map(|i| i as f32 * 1e-3).collect(), spec: spec.clone() };
            let out = d.join(format!("b{i}"));
            let s = write(&out, Provenance { source: Path::new("ck"), step: 5, skipped: &[] }, &w, &t, Format::Bundle).unwrap();
            assert_eq!(s.model, spec.describe());
            let b = Bundle::open(&out).unwrap();
            assert_eq!(b.dense, w);
            let m = b.json.model.as_ref().expect("a model section");
            assert_eq!((m.spec.kind.as_str(), m.row_width, m.params), (spec.kind.name(), spec.row_width(), spec.num_params()));
            // An mlp stays version 2 (dense.bin and model.json), the others are version 3.
            let v = if spec.kind == ModelKind::Mlp { 2 } else { 3 };
            assert_eq!(b.json.version, v, "{}", spec.describe());
            assert_eq!(b.json.dense.widths.is_empty(), v == 3);
            let bin = std::fs::read(out.join(DENSE_BIN)).unwrap();
            assert_eq!(u32::from_le_bytes(bin[8..12].try_into().unwrap()), v);
            // model.json describing another model than dense.bin holds is refused.
            let mut json = b.json.clone();
            json.model = Some(ModelDescription::of(&ModelSpec { hidden: vec![5], ..spec.clone() }));
            std::fs::write(out.join(MODEL_JSON), serde_json::to_vec(&json).unwrap()).unwrap();
            let e = Bundle::open(&out).unwrap_err().to_string();
            assert!(e.contains("dense.bin: it holds the") && e.contains("model.json describes the"), "{e}");
        }
        // A table whose rows are not as wide as the model reads is refused.
        let t = EmbeddingTable::create(&d.join("live9"), &TableConfig::new(2, 64)).unwrap();
        let fm = DenseWeights { spec: ModelSpec { kind: ModelKind::DeepFm, ..base.clone() }, params: vec![0.0; ModelSpec { kind: ModelKind::DeepFm, ..base }.num_params()] };
        let e = write(&d.join("bad"), Provenance { source: Path::new("ck"), step: 5, skipped: &[] }, &fm, &t, Format::Bundle).unwrap_err().to_string();
        assert!(e.contains("reads table rows of 3 values, its table's rows have 2"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_table_models_bundle_holds_every_table_and_its_layout() {
        use crate::embedding::TableConfig;
        use crate::model::ModelSpec;
        use crate::train::source::{Fallback, ModelSource, NamedTables, TableFile};
        let d = scratch("tables");
        // C1 in the default table (dim 2), C2 and C3 in table `a` (dim 3): an mlp over one
        // field of 8 values.
        let mut t0 = EmbeddingTable::create(&d.join("t0"), &TableConfig::new(2, 64)).unwrap();
        t0.put_rows(&[1], &[0.5, 0.25]).unwrap();
        let mut ta = EmbeddingTable::create(&d.join("ta"), &TableConfig::new(3, 64)).unwrap();
        ta.put_rows(&[2, 3], &[0.125; 6]).unwrap();
        let file = TableFile { path: d.join("ta"), dim: 3, rows: 2, dtype: None, init: None, saved: None };
        let named = NamedTables { flags: "C2,C3=a:dim=3".into(), fields: Some((vec!["C1".into(), "C2".into(), "C3".into()], 3)), files: vec![file] };
        let weights = |dim: usize| {
            let spec = ModelSpec::mlp(1, dim, 13, vec![4]);
            DenseWeights { params: vec![0.01; spec.num_params()], spec }
        };
        let from = Provenance { source: Path::new("ck"), step: 7, skipped: &[] };
        let recorded = Recorded { tables: Some((&named, std::slice::from_ref(&ta))), ..Recorded::default() };
        let out = d.join("b");
        assert_eq!(write_with(&out, from, recorded, &weights(8), &t0, Format::Bundle).unwrap().rows, 3);
        let b = Bundle::open(&out).unwrap();
        assert_eq!((b.json.version, b.json.table.rows), (VERSION, 1));
        let t = b.json.tables.as_ref().unwrap();
        let fields: Vec<(&str, &str, usize)> = t.fields.iter().map(|f| (f.name.as_str(), f.table.as_str(), f.width)).collect();
        assert_eq!(fields, [("C1", TABLE_BIN, 2), ("C2", "table.a.bin", 3), ("C3", "table.a.bin", 3)]);
        assert_eq!((t.named[0].name.as_str(), t.named[0].table.rows, t.named[0].table.dim), ("a", 2, 3));
        let m = ModelSource::open(&out, Fallback::Allow).unwrap();
        let n = m.tables.unwrap();
        assert_eq!((n.files[0].rows, n.fields.unwrap().1), (2, 3));
        // A model that reads other widths is refused; so is a bundle missing a table file.
        let e = write_with(&d.join("wide"), from, recorded, &weights(9), &t0, Format::Bundle).unwrap_err().to_string();
        assert!(e.contains("reads 1 field(s) of 9 values, its tables give 3 fields of [2, 3, 3] values"), "{e}");
        std::fs::remove_file(out.join("table.a.bin")).unwrap();
        assert!(Bundle::open(&out).unwrap_err().to_string().contains("table.a.bin"));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_bundle_of_an_older_ringrec_still_opens() {
        let d = scratch("v1");
        let w = weights();
        // dense.bin, RRMLP version 1: magic, u32 version, u32 layers, widths, the
        // parameters, the CRC-32 of every byte before it.
        let mut dense = b"RRMLP\0\0\0".to_vec();
        [1u32, 1, 39, 1].iter().for_each(|x| dense.extend(x.to_le_bytes()));
        w.params.iter().for_each(|x| dense.extend(x.to_le_bytes()));
        let crc = crate::hash::crc32(&dense);
        dense.extend(crc.to_le_bytes());
        // table.bin, RRSPARAM version 2: magic, u32 version, u32 dim, u64 count, records, CRC.
        let mut table = b"RRSPARAM".to_vec();
        table.extend(2u32.to_le_bytes());
        table.extend(1u32.to_le_bytes());
        table.extend(2u64.to_le_bytes());
        for (k, v) in [(1u64, 0.5f32), (2, -0.5)] {
            table.extend(k.to_le_bytes());
            table.extend(v.to_le_bytes());
        }
        let crc = crate::hash::crc32(&table);
        table.extend(crc.to_le_bytes());
        let entry = |name: &str, b: &[u8]| FileEntry { name: name.into(), bytes: b.len() as u64, crc32: crate::hash::crc32(&b[..b.len() - 4]) };
        let json = ModelJson {
            format: FORMAT.into(),
            version: 1,
            source: "ck".into(),
            step: 3,
            skipped: Vec::new(),
            dim: 1,
            input: InputSpec::criteo(),
            model: None,
            dense: DenseSpec { file: DENSE_BIN.into(), widths: vec![39, 1], hidden: vec![], hidden_activation: "relu".into(), output: String::new(), params: 40, layout: String::new() },
            table: TableSpec { file: TABLE_BIN.into(), format: String::new(), dim: 1, rows: 2, dtype: "f32".into(), key_order: "ascending".into(), init_seed: 1, init_scale: 0.05, unseen_keys: String::new() },
            tables: None,
            files: vec![entry(DENSE_BIN, &dense), entry(TABLE_BIN, &table)],
            onnx: None,
        };
        std::fs::write(d.join(DENSE_BIN), &dense).unwrap();
        std::fs::write(d.join(TABLE_BIN), &table).unwrap();
        std::fs::write(d.join(MODEL_JSON), serde_json::to_vec(&json).unwrap()).unwrap();
        let b = Bundle::open(&d).unwrap();
        assert_eq!((b.json.version, &b.dense), (1, &w));
        let s = crate::train::source::ModelSource::open(&d, crate::train::source::Fallback::Allow).unwrap();
        assert_eq!((s.step, s.table.rows), (Some(3), 2));
        // A model.json of a newer ringrec is refused naming its version.
        let newer = ModelJson { version: VERSION + 1, ..json };
        std::fs::write(d.join(MODEL_JSON), serde_json::to_vec(&newer).unwrap()).unwrap();
        assert!(Bundle::open(&d).unwrap_err().to_string().contains("version 5, this build reads ringrec-bundle versions 1 to 4"));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_input_spec_holds_the_parser_constants() {
        let s = InputSpec::criteo();
        assert_eq!(s.field_salt_base, "0x52494e4752454300");
        assert_eq!(s.missing_value, "0x6d697373696e6700");
        assert_eq!((s.dense_features, s.categorical_features), (13, 26));
    }
}
