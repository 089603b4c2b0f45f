//! The `ringrec bench ...` subcommands: each measures ringrec against a reference in the
//! same run and prints the ratio.

pub mod allreduce;
pub mod checkpoint;
pub mod embedding;
pub mod engine;
pub mod gemm;
pub mod growth;
pub mod sparse;
pub mod step;
