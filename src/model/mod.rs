//! The CTR model's dense part, written once over [`crate::device::Device`]: the input
//! assembled from embedding rows and dense features, an MLP to one logit, binary
//! cross-entropy, and the dense optimizers. The sparse part (embedding rows) lives in the
//! host-shared table ([`crate::embedding`]).

pub mod cross;
pub mod dense;
pub mod fields;
pub mod dense_bin;
pub mod fm;
pub mod input;
pub mod interaction;
pub mod layers;
pub mod mlp;
pub mod net;
#[cfg(feature = "onnx")]
pub mod onnx;
pub mod optim;
pub mod pooling;
pub mod spec;

pub use dense::{DenseModel, Part, StageMut};
pub use dense_bin::DenseWeights;
pub use input::InputLayout;
pub use layers::Layers;
pub use mlp::{Mlp, MlpShape};
pub use net::Net;
pub use optim::{DenseOptimState, DenseOptimizer, Optimizer};
pub use spec::{CrossStructure, Group, ModelKind, ModelSpec};
