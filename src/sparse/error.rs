//! Typed errors of the sparse exchange. Every message says what went wrong and what to do.

use crate::embedding::TableError;
use crate::CommError;

/// How a [`SparseError::NonFinite`] message starts (also as another rank reports it in a
/// [`SparseError::Peer`]).
pub const NON_FINITE: &str = "non-finite sparse gradient";

/// Errors of [`crate::sparse`].
///
/// The exchange never leaves a rank waiting for a peer that gave up: a rank whose input is
/// invalid still takes part and sends an error instead of its list, so every rank of the job
/// returns an error in the same step. The rank at fault gets the precise error (e.g.
/// [`SparseError::Shape`]); the others get [`SparseError::Peer`] naming it.
#[derive(Debug, thiserror::Error)]
pub enum SparseError {
    /// The gradient values do not make one row of `dim` values per key.
    #[error("sparse gradient: {grads} values for {keys} keys do not make rows of dim {dim} (expected {expected}); pass keys.len() * dim values, one row per key in key order")]
    Shape {
        /// Keys given.
        keys: usize,
        /// Values per row the exchanger was built for.
        dim: usize,
        /// Values expected.
        expected: usize,
        /// Values given.
        grads: usize,
    },
    /// The reserved key `u64::MAX` (it marks empty slots of the table) was given.
    #[error("sparse gradient: key {key:#x} is reserved (it marks empty table slots); map feature ids into 0..u64::MAX")]
    ReservedKey {
        /// The key.
        key: u64,
    },
    /// Ranks were configured differently (dim, mode or normalisation).
    #[error("sparse exchange: ranks disagree on the configuration ({detail}); every rank must use the same embedding dim, --sparse-exchange and --sparse-normalize")]
    Mismatch {
        /// Which ranks differ from rank 0, and how.
        detail: String,
    },
    /// A rank sent rows of another dim than this rank's.
    #[error("sparse exchange: rank {rank} sent rows of dim {theirs}, this rank uses dim {ours}; every rank must use the same embedding dim")]
    DimMismatch {
        /// World rank whose list differs.
        rank: usize,
        /// This rank's dim.
        ours: usize,
        /// The other rank's dim.
        theirs: usize,
    },
    /// A serialized list is malformed (truncated, bad magic, unsorted keys...).
    #[error("sparse exchange: the list from rank {rank} is malformed: {reason}; this is a bug or memory corruption (ranks running different ringrec builds?), restart the job")]
    Corrupt {
        /// World rank that sent it (the host leader for host lists).
        rank: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// Another rank could not take part in this step; its error, as it reported it.
    #[error("sparse exchange: rank {rank} failed in this step: {message}")]
    Peer {
        /// World rank where the error happened.
        rank: usize,
        /// Its error message.
        message: String,
    },
    /// The merged gradient of a key holds a NaN or an infinity (every host merges the same
    /// list, so every leader finds it in the same step); nothing was applied.
    #[error("{NON_FINITE}: the merged gradient of key {key:#x} holds {value} at position {at}; nothing of this step was applied to the table")]
    NonFinite {
        /// The first key whose row is not finite.
        key: u64,
        /// Its position in the row.
        at: usize,
        /// The value.
        value: f32,
    },
    /// An argument is invalid regardless of the other ranks.
    #[error("sparse exchange: {0}")]
    Invalid(String),
    /// A collective failed.
    #[error("sparse exchange: {0}")]
    Comm(#[from] CommError),
    /// Applying the update to the host table failed.
    #[error("sparse update of the host table: {0}")]
    Table(#[from] TableError),
}

impl SparseError {
    /// The world rank where the error happened and its message, as forwarded to other
    /// ranks: a [`SparseError::Peer`] keeps its origin, anything else is `me`'s.
    pub fn origin(&self, me: usize) -> (usize, String) {
        match self {
            SparseError::Peer { rank, message } => (*rank, message.clone()),
            e => (me, e.to_string()),
        }
    }
}

/// Result alias of [`crate::sparse`].
pub type SparseResult<T> = Result<T, SparseError>;

/// Why a serialized list was rejected ([`super::list::decode`]); the exchange adds the sender.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The list holds rows of another dim.
    #[error("rows of dim {theirs}, expected {ours}")]
    Dim {
        /// The expected dim.
        ours: usize,
        /// The list's dim.
        theirs: usize,
    },
    /// Anything else: the reason.
    #[error("{0}")]
    Corrupt(String),
}

impl DecodeError {
    /// Adds the sender's world rank.
    pub fn from_rank(self, rank: usize) -> SparseError {
        match self {
            DecodeError::Dim { ours, theirs } => SparseError::DimMismatch { rank, ours, theirs },
            DecodeError::Corrupt(reason) => SparseError::Corrupt { rank, reason },
        }
    }
}
