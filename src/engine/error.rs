//! Errors of the engine. Cloneable: one failure (a fused reduction, a shutdown) completes
//! many handles.

/// What a submitted operation, or the engine itself, can fail with.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// Ranks submitted the same name with different operations, dtypes, shapes or roots.
    #[error("tensor '{name}': ranks submitted it differently ({detail}); every rank must submit the same name with the same operation, dtype, shape and root")]
    Mismatch {
        /// The tensor name.
        name: String,
        /// Which ranks submitted what.
        detail: String,
    },
    /// Some ranks never submitted a tensor that others wait for, for longer than
    /// `RINGREC_STALL_SHUTDOWN_TIME_SECONDS`.
    #[error("{0}")]
    Stalled(String),
    /// The name is already in flight on this rank.
    #[error("tensor '{0}' is already in flight on this rank; wait for its handle before submitting the same name again")]
    Duplicate(String),
    /// The request is invalid whatever the other ranks do.
    #[error("tensor '{name}': {reason}")]
    Invalid {
        /// The tensor name.
        name: String,
        /// What is wrong and what to do.
        reason: String,
    },
    /// The engine stopped (a rank shut it down, or it failed earlier).
    #[error("the ringrec engine has stopped: {0}")]
    ShutDown(String),
    /// The collective that carried the tensor failed.
    #[error("collective failed: {0}")]
    Comm(String),
    /// A setting (environment variable) has a value the engine cannot use.
    #[error("{0}")]
    Config(String),
}

impl From<crate::CommError> for EngineError {
    fn from(e: crate::CommError) -> Self {
        EngineError::Comm(e.to_string())
    }
}

/// Result alias of the engine.
pub type EngineResult<T> = Result<T, EngineError>;
