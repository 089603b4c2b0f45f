//! Typed errors of the data layer. Every message names the file and says what to do next.

use std::path::PathBuf;

use crate::fileio::IoError;
use crate::header::FormatError;

/// Errors of [`crate::data`].
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// An operating-system call on a file failed.
    #[error(transparent)]
    Io(#[from] IoError),
    /// More malformed lines than `--max-bad-lines` allows; reading stopped at the last one.
    #[error(
        "{path}: {count} malformed line(s) by line {at_line}, more than --max-bad-lines {limit} allows; {first}; \
         fix the input or raise --max-bad-lines (or RINGREC_MAX_BAD_LINES) to skip and count them"
    )]
    TooManyBadLines {
        /// The TSV file.
        path: PathBuf,
        /// Malformed lines seen (`limit + 1`).
        count: u64,
        /// The limit that was exceeded.
        limit: u64,
        /// The 1-based line number where reading stopped.
        at_line: u64,
        /// The first malformed lines with their reasons, already formatted
        /// (`first: line 3: wrong field count ...; line 9: ...`).
        first: String,
    },
    /// Not one line of the file is a sample: it is not a Criteo TSV (or the wrong file).
    #[error(
        "{path}: every one of its {lines} line(s) is malformed ({kinds}); {first}; \
         a Criteo TSV line is a 0/1 label, 13 integer and 26 hexadecimal categorical fields, tab-separated"
    )]
    AllMalformed {
        /// The TSV file.
        path: PathBuf,
        /// Lines read.
        lines: u64,
        /// Malformed lines per kind (`field_count 3, label 1`).
        kinds: String,
        /// The first malformed lines with their reasons.
        first: String,
    },
    /// The input is not a TSV ringrec reads: a prepared cache, or a compressed file.
    #[error("{path}: {what}")]
    NotATsv {
        /// The input.
        path: PathBuf,
        /// What it is and what to do.
        what: String,
    },
    /// A compressed input (gzip, zstd) is cut short or damaged: its text cannot be decoded
    /// past `line`.
    #[error("{path}: its {codec} stream is {what} at byte {at} of the file (line {line} of its text): {detail}; fetch or compress the file again")]
    Compressed {
        /// The compressed file.
        path: PathBuf,
        /// Its codec (`gzip`, `zstd`).
        codec: &'static str,
        /// `cut short` or `damaged`.
        what: &'static str,
        /// Compressed bytes read when decoding failed.
        at: u64,
        /// The 1-based line of the text being decoded.
        line: u64,
        /// The decoder's message.
        detail: String,
    },
    /// A Parquet input cannot be read as the model's inputs: cut short, damaged, a column
    /// of a type or with values ringrec cannot take.
    #[error("{path}: {at}: {detail}")]
    Parquet {
        /// The Parquet file.
        path: PathBuf,
        /// Where: `footer`, `row group G`, `row group G, column `name``, `column `name``.
        at: String,
        /// What is wrong and what to do.
        detail: String,
    },
    /// A schema file (`--schema`) ringrec cannot use: its syntax, a key it does not know, a
    /// value of the wrong type, a column named twice.
    #[error("{path}: key `{key}`: {detail}")]
    Schema {
        /// The schema file.
        path: PathBuf,
        /// The key (`dense.price`, `sparse[1]`; `(syntax)` for a file that is not TOML).
        key: String,
        /// What is wrong and what to do.
        detail: String,
    },
    /// The input holds no rows: it is empty, or all its lines are.
    #[error("{path}: holds no rows ({}); a data file needs at least one Criteo TSV line", if *.lines == 0 { "the file is empty".to_string() } else { format!("its {} line(s) are all empty", .lines) })]
    NoRows {
        /// The input.
        path: PathBuf,
        /// Its lines (all empty).
        lines: u64,
    },
    /// The TSV file changed while it was being converted.
    #[error("{path} changed while it was being read ({detail}); convert it again once it is complete")]
    SourceChanged {
        /// The TSV file.
        path: PathBuf,
        /// What differs.
        detail: String,
    },
    /// The cache file is not a valid cache (truncated, foreign, another version, damaged).
    #[error(transparent)]
    Format(#[from] FormatError),
    /// Bytes of a cache file differ from the CRC-32 written with them: the file was damaged
    /// after it was written (disk, copy, or another program).
    #[error(
        "{path}: the {section} section is damaged: bytes {start}..{end} do not match the CRC-32 written with them; \
         delete the file (a cache made from a TSV is prepared again on the next run) or run `ringrec data prepare` on its TSV again"
    )]
    Damaged {
        /// The cache file.
        path: PathBuf,
        /// The section (`header`, `labels`, `dense`, `keys`, `weights`, `checksums`).
        section: &'static str,
        /// First byte of the damaged block (offset in the file).
        start: u64,
        /// One past its last byte.
        end: u64,
    },
    /// A row index past the end of the dataset.
    #[error("row {index} is out of range: the dataset has {rows} rows")]
    RowOutOfRange {
        /// The index asked for.
        index: usize,
        /// Rows in the dataset.
        rows: usize,
    },
    /// An argument is invalid regardless of the data (e.g. a test fraction outside [0, 1]).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// An input of `--data` or `--eval-data` names no data file: a path that does not
    /// exist, a glob that matches nothing, a directory without a data file.
    #[error("{flag} {spec}: {reason}")]
    Input {
        /// The flag (`--data`, `--eval-data`).
        flag: &'static str,
        /// The input as given.
        spec: PathBuf,
        /// What is wrong and what to do.
        reason: String,
    },
    /// The preparation of a cache was stopped before it ended (the run ended first); no
    /// file was left behind.
    #[error("{path}: its preparation was cancelled; it is prepared again when it is needed")]
    Cancelled {
        /// The TSV file.
        path: PathBuf,
    },
}

/// Result alias of the data layer.
pub type DataResult<T> = Result<T, DataError>;

impl DataError {
    /// Wraps an I/O error with the file and the operation.
    pub(crate) fn io(path: &std::path::Path, op: &'static str, source: std::io::Error) -> DataError {
        DataError::Io(IoError::new(path, op, source))
    }
}
