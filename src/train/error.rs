//! Errors of a training run.

use crate::data::DataError;
use crate::device::DeviceError;
use crate::embedding::TableError;
use crate::engine::EngineError;
use crate::sparse::SparseError;
use crate::CommError;

/// Why a training run stopped. Every variant says what to do; wrapped errors print as
/// themselves (no repeated sentences).
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A setting no run can use.
    #[error("{0}")]
    Config(String),
    /// The data set.
    #[error(transparent)]
    Data(#[from] DataError),
    /// The host-shared embedding table.
    #[error("host-shared embedding table: {0}")]
    Table(TableError),
    /// The sparse gradient exchange.
    #[error(transparent)]
    Sparse(#[from] SparseError),
    /// A collective, or a step every rank had to take.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// The engine that reduces the dense gradients.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The device the dense model runs on.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// A checkpoint could not be read, written or used.
    #[error("{0}")]
    Checkpoint(String),
    /// A loss, gradient or parameter is not finite (`--nan-policy stop`): every rank stops
    /// at the same step; nothing of it was checkpointed.
    #[error("step {step}: {what} is not finite (NaN or infinity); the run stops here (--nan-policy stop) and the last checkpoint stays the newest: lower the learning rates, check the data, or pass --nan-policy skip-step to skip such updates")]
    NonFinite {
        /// The global step (1-based: the step being taken).
        step: u64,
        /// Which tensor.
        what: String,
    },
    /// A SIGTERM/SIGINT stopped the run after a step, every rank at the same one.
    #[error("stopped by {} after step {step}{}", crate::signals::name(*signal), match checkpoint { Some(d) => format!("; checkpoint of step {step} written in {} (continue with --resume)", d.display()), None => "; no checkpoint (no --checkpoint-dir): the steps since the start are lost".into() })]
    Stopped {
        /// The signal.
        signal: i32,
        /// Global steps completed.
        step: u64,
        /// Where the checkpoint was written.
        checkpoint: Option<std::path::PathBuf>,
    },
}

impl From<super::checkpoint::CheckpointError> for TrainError {
    fn from(e: super::checkpoint::CheckpointError) -> Self {
        TrainError::Checkpoint(e.to_string())
    }
}

impl From<TableError> for TrainError {
    fn from(e: TableError) -> Self {
        TrainError::Table(e)
    }
}

/// Result alias of training.
pub type TrainResult<T> = Result<T, TrainError>;
