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
pub mod control;
pub mod data;
pub mod device;
pub mod dtype;
pub mod embedding;
pub mod engine;
pub mod error;
pub mod fileio;
pub mod frame;
mod gather;
mod group;
pub mod hash;
pub mod header;
pub mod hostsync;
mod liveness;
pub mod model;
pub mod onebit;
pub mod partition;
pub mod settings;
pub mod shm;
pub mod signals;
pub mod sparse;
pub mod stale;
pub mod tensor;
pub mod topology;
pub mod watchdog;
pub mod train;

pub use engine::{init, Runtime};
pub use error::{CommError, CommResult};

/// Writes `line` and a newline to stderr in one write (`eprintln!` may write a line in
/// pieces, which interleave with other ranks' lines on a shared terminal).
pub fn eprint_line(line: &str) {
    use std::io::Write;
    let mut s = String::with_capacity(line.len() + 1);
    s.push_str(line);
    s.push('\n');
    let _ = std::io::stderr().lock().write_all(s.as_bytes());
}
