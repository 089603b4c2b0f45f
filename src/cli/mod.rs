//! The binary's commands: flags (clap), printing and progress; the work is the library's.

pub mod train;
