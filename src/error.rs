//! Typed errors of the library. The binary adds context with `anyhow`.

use std::path::PathBuf;

/// Errors of the collective layer (`comm`) and the process topology.
#[derive(Debug, thiserror::Error)]
pub enum CommError {
    /// Ranks called a collective with different element counts, dtypes, ops, roots
    /// or different collectives altogether. Every rank of the group gets this error.
    #[error("{collective}: ranks disagree ({detail}); every rank must call the same collective with the same count, dtype and op")]
    Mismatch {
        /// The collective this rank called.
        collective: &'static str,
        /// Which ranks disagree with rank 0 of the group, and on what.
        detail: String,
        /// Group ranks whose call differs from the group's rank 0.
        ranks: Vec<usize>,
    },
    /// A peer did not arrive in time (it is stuck, or called a different number of collectives).
    #[error("{collective}: timed out after {seconds:.0}s waiting for rank(s) {ranks:?}; raise RINGREC_COMM_TIMEOUT_SECONDS if they are just slow, otherwise check that every rank makes the same sequence of collective calls")]
    Timeout {
        /// The collective that waited.
        collective: &'static str,
        /// Seconds waited.
        seconds: f64,
        /// Group ranks that had not arrived.
        ranks: Vec<usize>,
    },
    /// A peer process on this host exited while others waited for it.
    #[error("{collective}: rank {rank} (pid {pid}) on this host exited while this rank waited for it; the job cannot continue, look at that rank's output for the cause")]
    PeerDied {
        /// The collective that waited.
        collective: &'static str,
        /// Group rank of the dead peer.
        rank: usize,
        /// Its process id.
        pid: i32,
    },
    /// This rank failed at something every rank had to do (see `Topology::agree`).
    #[error("{0}")]
    Failed(String),
    /// Another rank failed at something every rank had to do; its message.
    #[error("rank {rank} failed: {message}")]
    RankFailed {
        /// The lowest failing rank.
        rank: usize,
        /// Its message.
        message: String,
    },
    /// A previous failure left this communicator in an unknown state.
    #[error("communicator is unusable after an earlier failure ({0}); restart the job")]
    Poisoned(String),
    /// The buffer is not aligned for its dtype or its length is not a whole number of elements.
    #[error("buffer of {len} bytes is not a whole, aligned array of {dtype}")]
    BadBuffer {
        /// Byte length given.
        len: usize,
        /// The dtype it was supposed to hold.
        dtype: &'static str,
    },
    /// The argument is invalid regardless of the other ranks (e.g. a root out of range).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// The backend cannot run on this topology.
    #[error("backend `{backend}` cannot run here: {reason}")]
    Unsupported {
        /// Backend name.
        backend: &'static str,
        /// Why, and what to use instead.
        reason: String,
    },
    /// A shared-memory segment could not be created, opened or mapped.
    #[error("shared memory {path}: {source} (shared segments live in RINGREC_SHM_DIR, default /dev/shm: check its free space, or set it to another directory)")]
    Shm {
        /// The segment path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// MPI could not be initialised (e.g. initialised twice in one process).
    #[error("MPI: {0}")]
    Mpi(String),
}

/// Result alias for the collective layer.
pub type CommResult<T> = Result<T, CommError>;
