//! The host-shared sparse embedding table (design 003).
//!
//! A CTR model's embedding table is held **once per host** in a memory-mapped file
//! (`/dev/shm/ringrec-<job>-h<host>-table`, see [`host`]). The host leader (local rank 0) is
//! the only writer; every local rank reads rows in place through a key index stored in the
//! same file, so no rank keeps a private copy and no pointer ever crosses a process.
//!
//! # File format (version 1, little-endian)
//!
//! ```text
//! [0, 4096)                 header (fields below, then zero padding to one page)
//! [4096, +capacity*8)       index: capacity x u64 key, u64::MAX = empty slot
//! [rows_offset, ...)        rows: capacity x dim x storage dtype (f32, f16 or bf16);
//!                           slot i of the index owns row i
//! [state_offset, ...)       optimizer state: capacity x f32 Adagrad accumulator (empty for SGD)
//! ```
//! Every section starts on a 4096-byte boundary; the file length is a multiple of 4096.
//!
//! | offset | size | header field |
//! |---|---|---|
//! | 0   | 8 | magic `"RRTABLE\0"` |
//! | 8   | 4 | format version (1) |
//! | 12  | 4 | header length (4096) |
//! | 16  | 4 | dim (values per row, 1..=65536) |
//! | 20  | 4 | storage dtype: 0 f32, 1 f16, 2 bf16 |
//! | 24  | 4 | optimizer: 0 SGD, 1 row-wise Adagrad |
//! | 28  | 4 | flags (0) |
//! | 32  | 8 | capacity in slots (power of two, 16..=2^36) |
//! | 40  | 8 | live rows (occupied slots, at most 0.8 x capacity) |
//! | 48  | 8 | update generation (+1 per update batch) |
//! | 56  | 8 | seed of the initial rows |
//! | 64  | 4 | init scale (f32): initial rows are uniform in [-s, s] |
//! | 68  | 4 | Adagrad epsilon (f32) |
//! | 72  | 4 | Adagrad initial accumulator (f32) |
//! | 76  | 4 | reserved (0) |
//! | 80  | 56 | index offset, index length, rows offset, rows length, state offset, state length, file length (u64 each) |
//! | 136 | 8 | FNV-1a 64 checksum of bytes 0..136 |
//!
//! **Index.** Open addressing with linear probing. The home slot of a key is
//! `((k ^ k >> 32) * 0x9E3779B97F4A7C15) >> (64 - log2 capacity)` (multiply-shift); a probe
//! walks forward to the key or to the first empty slot. Keys are never deleted, so no
//! tombstones. Inserting beyond 80% load fails with [`TableError::Full`], which names the
//! capacity and the `--table-capacity` flag.
//!
//! **Validation.** Opening checks, each with its own error: the owner is this user
//! ([`TableError::WrongOwner`]), the header's frame and fields and the section layout (the
//! shared header codec, [`crate::header`]: one [`crate::header::FormatError`] variant each,
//! or `Truncated` when the file is short), and the index holds exactly `live rows` keys
//! ([`TableError::CorruptIndex`]), which also guarantees every probe ends. After that every
//! access is a bounds-checked slice: a hostile file gives an error, never a panic or an
//! out-of-bounds read. (A file truncated by another process *while mapped* would still
//! raise SIGBUS; the 0600 mode and the owner check keep other users out.)
//!
//! **Arithmetic** is always f32; f16/bf16 only change the storage (round to nearest even
//! on store). Unseen keys read as a deterministic initial row ([`init`]), rounded to the
//! storage dtype, so a lookup before and after the key's insertion agrees.
//!
//! **Optimizers.** SGD: `w -= lr * g`. Row-wise Adagrad: `acc += mean_j(g_j^2)`, then
//! `w_j -= lr * g_j / (sqrt(acc) + eps)`. Updates are applied in the order given, so every
//! host applying the same list produces a byte-identical file.
//!
//! The sparse-parameter file (import/export) is described in [`params`].

pub mod error;
pub mod format;
pub mod host;
pub mod index;
pub mod init;
pub mod params;
pub mod table;
pub mod update;

pub use error::{TableError, TableResult};
pub use format::{Header, Layout, OptimizerKind, StorageDtype, EMPTY_KEY};
pub use host::{host_table_path, HostTable, SegmentGuard, TableSource};
pub use params::{read_params_header, write_params, ParamsHeader};
pub use table::{EmbeddingTable, TableConfig, TableInfo};
pub use update::UpdateStats;

