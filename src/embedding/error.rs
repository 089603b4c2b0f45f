//! Typed errors of the embedding table. Every message says what went wrong and what to do.

use std::path::PathBuf;

/// Errors of [`crate::embedding`].
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// An operating-system call on a table or parameter file failed.
    #[error("{path}: cannot {op}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done (`open`, `map`, `write`...).
        op: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// `create` found a file already there (tables are created exclusively).
    #[error("{path} already exists and tables are created exclusively; choose another path or remove it (under /dev/shm: a leftover of a crashed job with the same RINGREC_JOB_ID)")]
    Exists {
        /// The file.
        path: PathBuf,
    },
    /// The file is shorter than its header says (or shorter than a header).
    #[error("{path} is truncated: {len} bytes, but a table of this shape needs {need}; the copy is incomplete, restore it from a saved table")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Its length.
        len: u64,
        /// The length it needs.
        need: u64,
    },
    /// The file does not start with the table magic.
    #[error("{path} is not a ringrec embedding table (magic {found:02x?}, expected \"RRTABLE\\0\"); check the path, a sparse-parameter file is loaded with `ringrec table import`")]
    BadMagic {
        /// The file.
        path: PathBuf,
        /// The first 8 bytes.
        found: [u8; 8],
    },
    /// The file was written by an unsupported format version.
    #[error("{path} has table format version {found}, this build reads version {supported}; export it with the ringrec that wrote it and import it here")]
    BadVersion {
        /// The file.
        path: PathBuf,
        /// Version in the file.
        found: u32,
        /// Version this build reads.
        supported: u32,
    },
    /// The header checksum does not match the header bytes.
    #[error("{path}: header checksum mismatch (stored {stored:#018x}, computed {computed:#018x}); the header was damaged, restore the table from a saved copy")]
    BadChecksum {
        /// The file.
        path: PathBuf,
        /// Checksum stored in the header.
        stored: u64,
        /// Checksum of the header bytes.
        computed: u64,
    },
    /// A header field has a value no valid table has.
    #[error("{path}: invalid header field {field}: {detail}; the file is damaged or was not written by ringrec")]
    BadHeader {
        /// The file.
        path: PathBuf,
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// Section offsets or lengths are inconsistent with the table shape or the file length.
    #[error("{path}: bad section layout: {detail}; the file is damaged or was not written by ringrec")]
    BadLayout {
        /// The file.
        path: PathBuf,
        /// Which section and how.
        detail: String,
    },
    /// The index does not agree with the header (e.g. live row count).
    #[error("{path}: corrupt index: {detail}; restore the table from a saved copy")]
    CorruptIndex {
        /// The file.
        path: PathBuf,
        /// What disagrees.
        detail: String,
    },
    /// The file belongs to another user: a shared table is only trusted from this user.
    #[error("{path} is owned by uid {owner}, not by this user (uid {euid}); refusing to map another user's table, remove it or run as its owner")]
    WrongOwner {
        /// The file.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// This process' effective uid.
        euid: u32,
    },
    /// A write was attempted through a read-only handle.
    #[error("this table handle is read-only (opened with open_readonly, as every non-leader local rank does); only the host leader's read-write handle applies updates")]
    ReadOnly,
    /// Inserting the new keys would exceed the load limit.
    #[error("embedding table is full: {live} rows + {new} new keys > {max_rows} allowed ({capacity} slots at load factor {load:.2}); raise --table-capacity to at least {suggest}")]
    Full {
        /// Slots in the table.
        capacity: u64,
        /// Rows already present.
        live: u64,
        /// Distinct new keys in the batch.
        new: u64,
        /// Row limit (`capacity * load`).
        max_rows: u64,
        /// The maximum load factor.
        load: f64,
        /// A capacity that would fit.
        suggest: u64,
    },
    /// The key `u64::MAX` marks empty index slots and cannot be stored.
    #[error("key {key:#x} is reserved (it marks empty slots in the index); remap it in the input pipeline")]
    ReservedKey {
        /// The key.
        key: u64,
    },
    /// A buffer has the wrong length for the keys and the table's dimension.
    #[error("{what}: expected {expected} values ({keys} keys x dim {dim}), got {got}")]
    Shape {
        /// Which argument.
        what: &'static str,
        /// Keys given.
        keys: usize,
        /// The table's dimension.
        dim: usize,
        /// Expected length.
        expected: usize,
        /// Given length.
        got: usize,
    },
    /// A table configuration or argument is invalid.
    #[error("invalid table configuration: {0}")]
    Config(String),
    /// A sparse-parameter file is malformed.
    #[error("{path}: not a valid sparse-parameter file: {detail}")]
    BadParams {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The host leader failed to create the host table; every local rank gets this.
    #[error("the host leader could not set up the shared table: {0}")]
    Leader(String),
    /// A local rank other than the leader failed to open the host table.
    #[error("{0}")]
    Peer(String),
}

/// Result alias of the embedding table.
pub type TableResult<T> = Result<T, TableError>;

impl TableError {
    /// Wraps an I/O error with the file and the operation.
    pub(crate) fn io(path: &std::path::Path, op: &'static str, source: std::io::Error) -> TableError {
        TableError::Io { path: path.to_path_buf(), op, source }
    }
}
