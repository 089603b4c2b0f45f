//! Typed errors of the embedding table. Every message says what went wrong and what to do.

use std::path::PathBuf;

use crate::fileio::IoError;
use crate::header::FormatError;

/// Errors of [`crate::embedding`].
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// An operating-system call on a file failed.
    #[error(transparent)]
    Io(#[from] IoError),
    /// `create` found a file already there (tables are created exclusively).
    #[error("{path} already exists and tables are created exclusively; choose another path or remove it (under /dev/shm: a leftover of a crashed job with the same RINGREC_JOB_ID)")]
    Exists {
        /// The file.
        path: PathBuf,
    },
    /// The file is not a valid table file (truncated, foreign, another version, damaged).
    #[error(transparent)]
    Format(#[from] FormatError),
    /// A sparse-parameter file is not a valid framed file (truncated, foreign, newer,
    /// damaged).
    #[error(transparent)]
    Frame(#[from] crate::frame::FrameError),
    /// The index does not agree with the header (e.g. live row count).
    #[error("{path}: corrupt index: {detail}; restore the table from a saved copy")]
    CorruptIndex {
        /// The file.
        path: PathBuf,
        /// What disagrees.
        detail: String,
    },
    /// A saved table's bytes differ from its checksums (or a byte that must be zero is not):
    /// the copy was damaged after it was written.
    #[error("{path}: the {section} section is damaged at byte {offset}: {detail}; this copy cannot be trusted: resume from the previous checkpoint, or restore the file from a saved copy")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Which section(s) the damaged bytes belong to (`index`, `rows`, `state`, ...).
        section: String,
        /// Byte offset in the file where the damaged block starts.
        offset: u64,
        /// What differs.
        detail: String,
    },
    /// A table's shape or initialisation differs from what this run asks for.
    #[error("{path} does not match this run: {flag}: {detail}; run with the table's {flag}, or start without this table")]
    Mismatch {
        /// The table file.
        path: PathBuf,
        /// The command-line flag (or setting) that differs.
        flag: &'static str,
        /// Both values, in words (`the table has 8, this run asks for 16`).
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
    /// A wait on the other ranks of the host failed (a dead or stuck rank).
    #[error(transparent)]
    Comm(#[from] crate::CommError),
    /// A local rank other than the leader failed to open the host table.
    #[error("{0}")]
    Peer(String),
}

/// Result alias of the embedding table.
pub type TableResult<T> = Result<T, TableError>;

impl TableError {
    /// Wraps an I/O error with the file and the operation.
    pub(crate) fn io(path: &std::path::Path, op: &'static str, source: std::io::Error) -> TableError {
        TableError::Io(IoError::new(path, op, source))
    }
}
