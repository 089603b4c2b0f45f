//! The serving bundle (`ringrec export --model DIR --out BUNDLE`): a trained model in a
//! directory that a reader with no ringrec code can load and score with
//! (`scripts/bundle_predict.py` does, with numpy only).
//!
//! ```text
//! BUNDLE/model.json   what the model is: format name and version, the step it was trained
//!                     to, the input (how a Criteo TSV line becomes the model's input, every
//!                     constant included), the MLP's shape, the table's dtype and the rule
//!                     of the initial rows of keys it does not hold, each file's size and
//!                     CRC-32 (zlib's, of its bytes before its own 4-byte CRC trailer)
//! BUNDLE/dense.bin    the MLP's weights and biases (layout below)
//! BUNDLE/table.bin    the table's live rows: a sparse-parameter file (RRSPARAM version 2,
//!                     keys ascending, values as f32, its own CRC-32 trailer; see
//!                     [`crate::embedding::params`])
//! ```
//!
//! `dense.bin` (little-endian):
//! ```text
//! offset        size       field
//! 0             8          magic "RRMLP\0\0\0"
//! 8             4          version (1)
//! 12            4          layers L (hidden layers + 1)
//! 16            4 (L + 1)  widths u32: input, hidden..., 1
//! 20 + 4L       4 P        parameters f32, layer by layer (l = 0..L): W_l, widths[l] x
//!                          widths[l+1] row-major (W_l[i][o] at i * widths[l+1] + o), then
//!                          b_l (widths[l+1] values); P = sum of widths[l] * widths[l+1] + widths[l+1]
//! 20 + 4L + 4P  4          CRC-32 (zlib's) of every byte before it
//! ```
//! The model: `h_0 = x`; `h_{l+1} = relu(h_l W_l + b_l)` for the hidden layers; the last
//! layer gives one logit `z = h_{L-1} W_{L-1} + b_{L-1}`; the score is `1 / (1 + exp(-z))`.
//! `x` is the 26 fields' embedding rows (C1..C26, `dim` values each) then the 13 transformed
//! integer features, as `model.json`'s `input` says.
//!
//! **Keys the table does not hold** (never seen in training, or seen only in the held-out
//! rows) are scored with the deterministic initial row ringrec gives them
//! ([`crate::embedding::init`]; the formula and its seed are in `model.json`), exactly as
//! `train`'s evaluation and `ringrec predict` do: the bundle stays as small as the live rows.
//!
//! A bundle is written under a temporary name beside `BUNDLE` (`.BUNDLE.tmp-<pid>`) and
//! renamed into place, so a crash leaves no half bundle under the name (only that temporary,
//! to remove); an existing `BUNDLE` is never overwritten.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::embedding::{EmbeddingTable, StorageDtype, TableError};
use crate::fileio::{write_atomic, IoError};
use crate::hash::Crc32;

/// `model.json`.
pub const MODEL_JSON: &str = "model.json";
/// The MLP's weights.
pub const DENSE_BIN: &str = "dense.bin";
/// The table's live rows (a sparse-parameter file).
pub const TABLE_BIN: &str = "table.bin";
/// `model.json`'s format name.
pub const FORMAT: &str = "ringrec-bundle";
/// `model.json`'s version.
pub const VERSION: u32 = 1;
/// First 8 bytes of `dense.bin`.
pub const DENSE_MAGIC: [u8; 8] = *b"RRMLP\0\0\0";
/// `dense.bin`'s version.
pub const DENSE_VERSION: u32 = 1;

/// Errors of writing or reading a bundle (or a `dense.bin`); each names the file and what
/// to do.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// A file operation failed.
    #[error(transparent)]
    Io(#[from] IoError),
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
}

/// Result alias of bundles.
pub type BundleResult<T> = Result<T, BundleError>;

fn damaged(path: &Path, detail: impl Into<String>) -> BundleError {
    BundleError::Damaged { path: path.to_path_buf(), detail: detail.into() }
}

fn io<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(std::io::Error) -> BundleError + 'a {
    move |e| BundleError::Io(IoError::new(path, op, e))
}

/// The MLP's layer widths and flat parameters (the layout of [`crate::model::Mlp`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DenseWeights {
    /// Input, hidden widths..., 1.
    pub widths: Vec<usize>,
    /// Per layer W (row-major, in x out) then b.
    pub params: Vec<f32>,
}

impl DenseWeights {
    /// The hidden widths (between the input and the logit).
    pub fn hidden(&self) -> &[usize] {
        self.widths.get(1..self.widths.len().saturating_sub(1)).unwrap_or(&[])
    }

    /// The input width.
    pub fn input(&self) -> usize {
        self.widths.first().copied().unwrap_or(0)
    }

    /// Parameters a model of `widths` has.
    pub fn count(widths: &[usize]) -> Option<usize> {
        widths.windows(2).try_fold(0usize, |n, p| n.checked_add(p[0].checked_mul(p[1])?.checked_add(p[1])?))
    }

    /// The `dense.bin` bytes (see the module docs).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(24 + 4 * (self.widths.len() + self.params.len()));
        b.extend_from_slice(&DENSE_MAGIC);
        b.extend_from_slice(&DENSE_VERSION.to_le_bytes());
        b.extend_from_slice(&(self.widths.len().saturating_sub(1) as u32).to_le_bytes());
        for w in &self.widths {
            b.extend_from_slice(&(*w as u32).to_le_bytes());
        }
        b.extend_from_slice(bytemuck::cast_slice(&self.params));
        let crc = crate::hash::crc32(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and checks `dense.bin` bytes read from `path`: magic, version, a shape that
    /// ends in one logit, the length, the CRC-32, finite values.
    pub fn decode(path: &Path, b: &[u8]) -> BundleResult<DenseWeights> {
        let word = |at: usize| b.get(at..at + 4).map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]));
        if b.get(..8) != Some(&DENSE_MAGIC[..]) {
            return Err(damaged(path, format!("not a dense weight file (magic {:02x?}, expected \"RRMLP\\0\\0\\0\")", &b[..b.len().min(8)])));
        }
        match word(8) {
            Some(DENSE_VERSION) => {}
            Some(v) => return Err(damaged(path, format!("version {v}, this build reads version {DENSE_VERSION}"))),
            None => return Err(damaged(path, "truncated in its header")),
        }
        let layers = word(12).ok_or_else(|| damaged(path, "truncated in its header"))? as usize;
        if layers == 0 || layers > 64 {
            return Err(damaged(path, format!("{layers} layers, expected 1..=64")));
        }
        let widths: Vec<usize> = (0..=layers).map(|i| word(16 + 4 * i).map(|w| w as usize)).collect::<Option<_>>().ok_or_else(|| damaged(path, "truncated in its widths"))?;
        if widths.contains(&0) || widths.last() != Some(&1) {
            return Err(damaged(path, format!("widths {widths:?}: every width must be positive and the last 1 (one logit)")));
        }
        let n = DenseWeights::count(&widths).ok_or_else(|| damaged(path, format!("widths {widths:?} overflow")))?;
        let at = 20 + 4 * layers;
        let want = n.checked_mul(4).and_then(|p| p.checked_add(at + 4));
        if want != Some(b.len()) {
            return Err(damaged(path, format!("{} bytes, but widths {widths:?} need {} ({n} parameters and the checksum); the file is truncated or its header is damaged", b.len(), want.map_or("more than 2^64".into(), |w| w.to_string()))));
        }
        let (body, trailer) = b.split_at(b.len() - 4);
        let stored = u32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);
        let computed = crate::hash::crc32(body);
        if stored != computed {
            return Err(damaged(path, format!("checksum mismatch: the contents have CRC-32 {computed:#010x}, the file records {stored:#010x}")));
        }
        let params: Vec<f32> = bytemuck::pod_collect_to_vec(&body[at..]);
        if let Some(i) = super::checkpoint::first_non_finite(&params) {
            return Err(damaged(path, format!("parameter {i} is {} (not finite)", params[i])));
        }
        Ok(DenseWeights { widths, params })
    }

    /// Reads and decodes a `dense.bin` (`--init-dense`).
    pub fn read(path: &Path) -> BundleResult<DenseWeights> {
        let b = std::fs::read(path).map_err(io(path, "read"))?;
        DenseWeights::decode(path, &b)
    }
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
}

impl InputSpec {
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

/// The MLP part of `model.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DenseSpec {
    /// The file (`dense.bin`).
    pub file: String,
    /// Input, hidden widths..., 1.
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

/// `model.json`: everything a reader needs, and the checksums of the other files.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelJson {
    /// `ringrec-bundle`.
    pub format: String,
    /// Its version (1).
    pub version: u32,
    /// The checkpoint it was exported from.
    pub source: String,
    /// Global training steps the model was trained for.
    pub step: u64,
    /// Embedding values per field.
    pub dim: u32,
    /// The input.
    pub input: InputSpec,
    /// The MLP.
    pub dense: DenseSpec,
    /// The table.
    pub table: TableSpec,
    /// The files with their sizes and CRC-32s.
    pub files: Vec<FileEntry>,
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
    /// Table rows written.
    pub rows: u64,
    /// Dense parameters written.
    pub params: usize,
    /// Bytes of the three files.
    pub bytes: u64,
}

/// A file of the bundle checked in one streamed read: its length, the CRC-32 of every
/// byte before its 4-byte trailer, and that trailer (which must repeat that CRC).
fn file_sum(path: &Path) -> BundleResult<(u64, u32)> {
    let mut f = std::fs::File::open(path).map_err(io(path, "open"))?;
    let len = f.metadata().map_err(io(path, "stat"))?.len();
    let mut left = len.checked_sub(4).ok_or_else(|| damaged(path, format!("{len} bytes, shorter than its checksum")))?;
    let (mut crc, mut buf) = (Crc32::new(), vec![0u8; 1 << 20]);
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        f.read_exact(&mut buf[..n]).map_err(io(path, "read"))?;
        crc.update(&buf[..n]);
        left -= n as u64;
    }
    let mut t = [0u8; 4];
    f.read_exact(&mut t).map_err(io(path, "read"))?;
    let (crc, stored) = (crc.finish(), u32::from_le_bytes(t));
    if crc != stored {
        return Err(damaged(path, format!("checksum mismatch: its contents have CRC-32 {crc:#010x}, its trailer records {stored:#010x}")));
    }
    Ok((len, crc))
}

/// Writes the bundle of a model — its `dense` weights, its `table` (a verified, opened table
/// file), trained to `step`, exported from `source` — into `out` (which must not exist).
pub fn write(out: &Path, source: &Path, step: u64, dense: &DenseWeights, table: &EmbeddingTable) -> BundleResult<ExportSummary> {
    if out.exists() {
        return Err(BundleError::Exists(out.to_path_buf()));
    }
    let h = *table.header();
    let want_input = crate::data::criteo::NUM_SPARSE * h.dim as usize + crate::data::criteo::NUM_DENSE;
    if dense.input() != want_input {
        return Err(damaged(source, format!("the dense model's input is {} wide, the table's dim {} needs {want_input}", dense.input(), h.dim)));
    }
    let name = out.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_else(|| "bundle".into());
    let parent = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(io(parent, "create the output's directory"))?;
    let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let made = (|| -> BundleResult<ExportSummary> {
        std::fs::create_dir(&tmp).map_err(io(&tmp, "create"))?;
        let rows = table.export_params(&tmp.join(TABLE_BIN))?;
        let bin = dense.encode();
        write_atomic(&tmp.join(DENSE_BIN), 0o600, |w| w.write_all(&bin))?;
        let mut files = Vec::new();
        for f in [DENSE_BIN, TABLE_BIN] {
            let (bytes, crc32) = file_sum(&tmp.join(f))?;
            files.push(FileEntry { name: f.into(), bytes, crc32 });
        }
        let json = ModelJson {
            format: FORMAT.into(),
            version: VERSION,
            source: source.display().to_string(),
            step,
            dim: h.dim,
            input: InputSpec::criteo(),
            dense: DenseSpec {
                file: DENSE_BIN.into(),
                widths: dense.widths.clone(),
                hidden: dense.hidden().to_vec(),
                hidden_activation: "relu".into(),
                output: "one logit z (identity activation); score = 1 / (1 + exp(-z))".into(),
                params: dense.params.len(),
                layout: "magic \"RRMLP\\0\\0\\0\", u32 version 1, u32 layers L, L + 1 u32 widths, then per layer W (in x out, row-major) and b (out) as f32, then the CRC-32 of every byte before it; little-endian".into(),
            },
            table: TableSpec {
                file: TABLE_BIN.into(),
                format: "RRSPARAM version 2: magic \"RRSPARAM\", u32 version 2, u32 dim, u64 count, count records of (u64 key, dim f32), then the CRC-32 of every byte before it; little-endian".into(),
                dim: h.dim,
                rows,
                dtype: h.dtype.name().into(),
                key_order: "ascending".into(),
                init_seed: h.seed,
                init_scale: h.init_scale,
                unseen_keys: "a key absent from table.bin reads as its initial row: base = splitmix64(init_seed ^ splitmix64(key)); for j = 0..dim: u = splitmix64(base + (j + 1) * 0x9e3779b97f4a7c15) >> 40 (mod 2^64); value_j = init_scale * (u * 2^-23 - 1) in binary32 arithmetic (u exact, one rounding, in the product); then rounded to dtype (f16 or bf16: to nearest, ties to even)".into(),
            },
            files,
        };
        let text = serde_json::to_vec_pretty(&json).map_err(|e| damaged(&tmp.join(MODEL_JSON), format!("encoding: {e}")))?;
        write_atomic(&tmp.join(MODEL_JSON), 0o600, |w| w.write_all(&text).and_then(|_| w.write_all(b"\n")))?;
        let bytes = json.files.iter().map(|f| f.bytes).sum::<u64>() + text.len() as u64 + 1;
        Ok(ExportSummary { bundle: out.to_path_buf(), source: source.to_path_buf(), step, rows, params: dense.params.len(), bytes })
    })();
    let summary = match made {
        Ok(s) => s,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
    };
    std::fs::rename(&tmp, out).map_err(|e| {
        let _ = std::fs::remove_dir_all(&tmp);
        BundleError::Io(IoError::new(out, "rename into place", e))
    })?;
    Ok(summary)
}

/// Exports the checkpoint `m` ([`super::source::ModelSource`], resolved from `ringrec
/// export --model`) into the bundle `out` (which must not exist). Its table file is opened
/// (every block checked against its checksum) and its live rows written in key order.
pub fn export(m: &super::source::ModelSource, out: &Path) -> BundleResult<ExportSummary> {
    use super::source::SourceKind;
    let refuse = |detail: &str| Err(damaged(&m.given, detail));
    let dense = match (m.kind, &m.dense) {
        (SourceKind::Checkpoint, Some(d)) => d,
        (SourceKind::Bundle, _) => return refuse("an export bundle already (copy the directory to copy it)"),
        _ => return refuse("holds no dense weights: export a checkpoint directory (train --checkpoint-dir)"),
    };
    let table = EmbeddingTable::open_readonly(&m.table.path)?;
    write(out, &m.path, m.step.unwrap_or(0), dense, &table)
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
        StorageDtype::parse(&self.json.table.dtype).ok_or_else(|| damaged(&self.dir.join(MODEL_JSON), format!("table dtype {:?} is not f32, f16 or bf16", self.json.table.dtype)))
    }

    /// Opens the bundle in `dir` and checks all of it: `model.json`'s format and version,
    /// every file's size and CRC-32, `dense.bin`'s own checks and its agreement with
    /// `model.json`, `table.bin`'s header against `model.json`.
    pub fn open(dir: &Path) -> BundleResult<Bundle> {
        let mp = dir.join(MODEL_JSON);
        let text = std::fs::read(&mp).map_err(io(&mp, "read"))?;
        let json: ModelJson = serde_json::from_slice(&text).map_err(|e| damaged(&mp, format!("not a bundle's model.json ({e})")))?;
        if json.format != FORMAT || json.version != VERSION {
            return Err(damaged(&mp, format!("format {} version {}, this build reads {FORMAT} version {VERSION}", json.format, json.version)));
        }
        for name in [&json.dense.file, &json.table.file] {
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
        let dense = DenseWeights::read(&dir.join(&json.dense.file))?;
        if dense.widths != json.dense.widths {
            return Err(damaged(&dir.join(&json.dense.file), format!("widths {:?}, model.json says {:?}", dense.widths, json.dense.widths)));
        }
        let tp = dir.join(&json.table.file);
        let (ph, _) = crate::embedding::read_params_header(&tp)?;
        if ph.dim != json.table.dim || ph.count != json.table.rows || json.dim != ph.dim {
            return Err(damaged(&tp, format!("{} rows of dim {}, model.json says {} rows of dim {}", ph.count, ph.dim, json.table.rows, json.table.dim)));
        }
        let b = Bundle { dir: dir.to_path_buf(), json, dense };
        b.dtype()?;
        Ok(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_weights_round_trip_and_damage_is_named() {
        let w = DenseWeights { widths: vec![3, 2, 1], params: (0..(3 * 2 + 2 + 2 + 1)).map(|i| i as f32 * 0.5 - 1.0).collect() };
        let b = w.encode();
        assert_eq!(b.len(), 20 + 4 * 2 + 4 * 11 + 4);
        assert_eq!(&b[..8], b"RRMLP\0\0\0");
        assert_eq!(DenseWeights::decode(Path::new("d"), &b).unwrap(), w);
        assert_eq!(w.hidden(), &[2]);
        let mut bad = b.clone();
        bad[30] ^= 1;
        assert!(DenseWeights::decode(Path::new("d"), &bad).unwrap_err().to_string().contains("checksum mismatch"));
        assert!(DenseWeights::decode(Path::new("d"), &b[..b.len() - 1]).unwrap_err().to_string().contains("truncated or its header is damaged"));
        let mut two = b.clone();
        two[24] = 2; // last width 2: not one logit
        assert!(DenseWeights::decode(Path::new("d"), &two).unwrap_err().to_string().contains("the last 1"));
        assert!(DenseWeights::decode(Path::new("d"), b"RRDENSE2xxxxxxxx").unwrap_err().to_string().contains("not a dense weight file"));
    }

    #[test]
    fn the_input_spec_holds_the_parser_constants() {
        let s = InputSpec::criteo();
        assert_eq!(s.field_salt_base, "0x52494e4752454300");
        assert_eq!(s.missing_value, "0x6d697373696e6700");
        assert_eq!((s.dense_features, s.categorical_features), (13, 26));
    }
}
