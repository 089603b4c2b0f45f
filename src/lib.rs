//! # ringrec
//!
//! A Horovod-style runtime for synchronous data-parallel training of click-through-rate
//! models. Dense gradients are allreduced (ring / shared memory / hierarchical, or NCCL on
//! GPUs); the huge sparse embedding table is held once per host in shared memory, read by
//! every local rank and written only by the host leader.
//!
//! As a library for any model: [`init`] starts the Horovod-style [`engine`] (named async
//! collectives with fusion). Lower level: [`topology::Topology::init`] and [`comm::build`].
//! See ARCHITECTURE.md.

pub mod comm;
pub mod config;
pub mod data;
pub mod device;
pub mod dtype;
pub mod embedding;
pub mod engine;
pub mod error;
pub mod fileio;
pub mod hash;
pub mod header;
pub mod hostsync;
pub mod model;
pub mod shm;
pub mod sparse;
pub mod tensor;
pub mod topology;
pub mod train;

pub use engine::{init, Runtime};
pub use error::{CommError, CommResult};
