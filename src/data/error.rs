//! Typed errors of the data layer. Every message names the file and says what to do next.

use std::path::PathBuf;

/// Errors of [`crate::data`].
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// An operating-system call on a data file failed.
    #[error("{path}: cannot {op}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done (`open`, `read`, `map`, `write`...).
        op: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
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
    /// The TSV file changed while it was being converted.
    #[error("{path} changed while it was being read ({detail}); convert it again once it is complete")]
    SourceChanged {
        /// The TSV file.
        path: PathBuf,
        /// What differs.
        detail: String,
    },
    /// The cache file is shorter than its header says (or shorter than a header).
    #[error("{path} is truncated: {len} bytes, but this dataset needs {need}; the copy is incomplete, run `ringrec data prepare` again")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Its length.
        len: u64,
        /// The length it needs.
        need: u64,
    },
    /// The file does not start with the dataset magic.
    #[error("{path} is not a ringrec dataset cache (magic {found:02x?}, expected \"RRDATA\\0\\0\"); a Criteo TSV is converted with `ringrec data prepare`")]
    BadMagic {
        /// The file.
        path: PathBuf,
        /// The first 8 bytes.
        found: [u8; 8],
    },
    /// The file was written by an unsupported format version.
    #[error("{path} has dataset format version {found}, this build reads version {supported}; run `ringrec data prepare` on the TSV again")]
    BadVersion {
        /// The file.
        path: PathBuf,
        /// Version in the file.
        found: u32,
        /// Version this build reads.
        supported: u32,
    },
    /// The header checksum does not match the header bytes.
    #[error("{path}: header checksum mismatch (stored {stored:#018x}, computed {computed:#018x}); the header was damaged, run `ringrec data prepare` again")]
    BadChecksum {
        /// The file.
        path: PathBuf,
        /// Checksum stored in the header.
        stored: u64,
        /// Checksum of the header bytes.
        computed: u64,
    },
    /// A header field has a value no valid cache has.
    #[error("{path}: invalid header field {field}: {detail}; the file is damaged or was not written by ringrec")]
    BadHeader {
        /// The file.
        path: PathBuf,
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// Section offsets or lengths disagree with the row count or the file length.
    #[error("{path}: bad section layout: {detail}; the file is damaged or was not written by ringrec")]
    BadLayout {
        /// The file.
        path: PathBuf,
        /// Which section and how.
        detail: String,
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
}

/// Result alias of the data layer.
pub type DataResult<T> = Result<T, DataError>;

impl DataError {
    /// Wraps an I/O error with the file and the operation.
    pub(crate) fn io(path: &std::path::Path, op: &'static str, source: std::io::Error) -> DataError {
        DataError::Io { path: path.to_path_buf(), op, source }
    }
}
