//! The binary's commands: flags (clap), printing and progress; the work is the library's.

pub mod bench;
pub mod data;
pub mod info;
pub mod table;
pub mod train;
