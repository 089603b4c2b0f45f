//! The CTR model's dense part: an MLP over [embeddings of the 26 fields, 13 dense features]
//! to one logit, binary cross-entropy; SGEMM; dense optimizers. The sparse part (embedding
//! rows) lives in the host-shared table (`embedding`).

pub mod gemm;
pub mod input;
pub mod mlp;
pub mod optim;

pub use mlp::{Mlp, MlpShape};
pub use optim::{DenseOptimState, DenseOptimizer};
