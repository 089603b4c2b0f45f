//! The host-shared sparse embedding table (design 003).
//!
//! A CTR model's embedding table is held **once per host** in a memory-mapped file
//! (`/dev/shm/ringrec-<job>-h<host>-table`, see [`host`]). The host leader (local rank 0) is
//! the only writer; every local rank reads rows in place through a key index stored in the
//! same file, so no rank keeps a private copy and no pointer ever crosses a process.
//!
//! # File format (version 3, little-endian)
//!
//! ```text
//! [0, 4096)                 header (fields below, then zero padding to one page)
//! [4096, +capacity*8)       index: capacity x u64 key, u64::MAX = empty slot
//! [rows_offset, ...)        rows: capacity x dim x storage dtype (f32, f16 or bf16);
//!                           slot i of the index owns row i
//! [state_offset, ...)       optimizer state: capacity x f32 Adagrad accumulator (empty for SGD)
//! [usage_offset, ...)       usage: capacity x (u32 last update, u32 updates) — the table's
//!                           generation at the row's last update (low 32 bits) and how many
//!                           updates it had (saturating); empty unless flag bit 1 is set
//! [sketch_offset, ...)      admission sketch: depth x width u8 counters ([`admit`]); empty
//!                           unless `admit_after` > 1
//! [sums_offset, ...)        block checksums: one u32 CRC-32 per 1 MiB block of the body
//!                           [4096, sums_offset) (index, rows, state, usage, sketch and their
//!                           padding; the last block may be shorter), then zero padding
//! ```
//! Every section starts on a 4096-byte boundary; the file length is a multiple of 4096. A
//! slot without a key has a zero row, the initial accumulator and zero usage.
//!
//! | offset | size | header field |
//! |---|---|---|
//! | 0   | 8 | magic `"RRTABLE\0"` |
//! | 8   | 4 | format version (3) |
//! | 12  | 4 | header length (4096) |
//! | 16  | 4 | dim (values per row, 1..=65536) |
//! | 20  | 4 | storage dtype: 0 f32, 1 f16, 2 bf16 |
//! | 24  | 4 | optimizer: 0 SGD, 1 row-wise Adagrad |
//! | 28  | 4 | flags: bit 0 = the sums section holds the checksums of the body; bit 1 = the table keeps usage; bit 2 = replaced: a live table that a grown copy replaced (its readers move to the new one); other bits 0 |
//! | 32  | 8 | capacity in slots (power of two, 16..=2^36) |
//! | 40  | 8 | live rows (occupied slots, at most 0.8 x capacity) |
//! | 48  | 8 | update generation (+1 per update batch) |
//! | 56  | 8 | seed of the initial rows |
//! | 64  | 4 | init scale (f32): initial rows are uniform in [-s, s] |
//! | 68  | 4 | Adagrad epsilon (f32) |
//! | 72  | 4 | Adagrad initial accumulator (f32) |
//! | 76  | 4 | CRC-32 of the sums section's `sums length` bytes (0 when flag bit 0 is clear) |
//! | 80  | 72 | index offset, index length, rows offset, rows length, state offset, state length, file length, sums offset, sums length (u64 each) |
//! | 152 | 32 | usage offset, usage length, sketch offset, sketch length (u64 each) |
//! | 184 | 4 | admit after K (1..=255; 1: every key at once) |
//! | 188 | 4 | sketch depth (0 when K = 1, else 1..=8) |
//! | 192 | 8 | sketch width (0 when K = 1, else a power of two in 64..=2^36) |
//! | 200 | 40 | rows inserted, evicted, expired; gradients refused (key not admitted, or no room); growths (u64 each, over the table's life) |
//! | 248 | 8 | FNV-1a 64 checksum of bytes 0..248 |
//!
//! **Checksums.** A live table (the one in `/dev/shm` that the leader updates in place) has
//! flag bit 0 clear and a zero sums section: its body changes every step. [`EmbeddingTable::save`]
//! writes the CRC-32 ([`crate::hash::block_sums`], in parallel) of every block of the bytes
//! it saves, their own CRC into the header and sets the flag; every open of a file with the
//! flag set (resume through [`EmbeddingTable::load`], `ringrec table import/export/inspect/verify`)
//! compares every block first, and a difference is [`TableError::Corrupt`], naming the
//! section (index, rows, state, usage, sketch, checksums, header padding) and the byte offset
//! of the block.
//! The copy `load` makes is a live table again (flag clear, sums zero): byte-identical to the
//! live table that was saved. [`EmbeddingTable::seal`] writes the checksums into a table's own
//! file (`ringrec table create/import` do); an update through a read-write handle clears
//! the flag again.
//! Files of versions 1 and 2 are refused with the version error.
//!
//! **Index.** Open addressing with linear probing. The home slot of a key is
//! `((k ^ k >> 32) * 0x9E3779B97F4A7C15) >> (64 - log2 capacity)` (multiply-shift); a probe
//! walks forward to the key or to the first empty slot. A removed key (expiry, eviction)
//! leaves no tombstone: the keys after it in its cluster shift back ([`index::remove_at`]),
//! with their rows, state and usage. Inserting beyond 80% load fails with
//! [`TableError::Full`], which names the capacity and the `--table-capacity` flag — unless
//! the table is managed.
//!
//! **A table that never stops the job** ([`manage`], what `train` runs): before an update
//! that would pass 70% load the host leader grows the table into a new file of double
//! capacity ([`grow`], every key rehashed; the host's other ranks remap it at the barrier,
//! [`HostTable::sync`]), up to a byte limit, where it evicts the least recently or least
//! frequently updated rows instead ([`evict`]); rows not updated for a number of updates
//! expire; new keys can be admitted only after K batches ([`admit`]). A row's values never
//! depend on its slot, so none of this changes what a lookup of a live key returns, and
//! every decision depends only on the table and the update list: every host's table stays
//! byte-identical.
//!
//! **Validation.** Opening checks, each with its own error: the owner is this user
//! ([`TableError::WrongOwner`]), the header's frame and fields and the section layout (the
//! shared header codec, [`crate::header`]: one [`crate::header::FormatError`] variant each,
//! or `Truncated` when the file is short), the checksums when the flag is set (above), and
//! the index holds exactly `live rows` keys ([`TableError::CorruptIndex`]), which also
//! guarantees every probe ends. [`EmbeddingTable::verify`] (`ringrec table verify`) adds
//! that every key sits where a lookup finds it, once. After that every
//! access is a bounds-checked slice: a hostile file gives an error, never a panic or an
//! out-of-bounds read. (A file truncated by another process *while mapped* would still
//! raise SIGBUS; the 0600 mode and the owner check keep other users out.)
//!
//! **Files.** `create`, `load` and `grow_into` create their file exclusively (mode 0600) and allocate
//! all of it before mapping ([`crate::fileio::reserve`]): a full `/dev/shm` (or
//! `RINGREC_SHM_DIR`) is an error naming the directory, the bytes needed and free, never a
//! SIGBUS, and nothing is left behind. Every handle holds a shared `flock` on its file for
//! its lifetime ([`crate::fileio::lock_shared`]): a file nobody locks belongs to no live
//! process.
//!
//! **Arithmetic** is always f32; f16/bf16 only change the storage (round to nearest even
//! on store). Unseen keys read as a deterministic initial row ([`init`]), rounded to the
//! storage dtype, so a lookup before and after the key's insertion agrees.
//!
//! **Optimizers.** SGD: `w -= lr * g`. Row-wise Adagrad: `acc += mean_j(g_j^2)`, then
//! `w_j -= lr * g_j / (sqrt(acc) + eps)`. Updates are applied in the order given, so every
//! host applying the same list produces a byte-identical file.
//!
//! Removed rows are gone from the file: a saved table (a checkpoint) carries the live rows
//! only, with the usage and the admission counts, so a resume continues bit-identically.
//!
//! The sparse-parameter file (import/export) is described in [`params`].

pub mod admit;
pub mod cache;
pub mod error;
pub mod evict;
pub mod format;
pub mod grow;
pub mod host;
pub mod index;
pub mod init;
pub mod manage;
pub mod params;
pub mod snapshot;
pub mod table;
pub mod update;

pub use cache::{CacheCounters, CacheDirectory, Refresh, StagingPlan};
pub use error::{TableError, TableResult};
pub use evict::Evict;
pub use format::{Extras, Header, Layout, OptimizerKind, RowCounts, StorageDtype, EMPTY_KEY};
pub use host::{host_table_path, HostTable, SegmentGuard, TableSource};
pub use grow::Spare;
pub use manage::{apply_managed, Ahead, Growth, Managed, TablePolicy};
pub use params::{read_params_header, write_params, ParamsHeader};
pub use snapshot::{TableImage, TableSnapshot};
pub use table::{EmbeddingTable, TableConfig, TableInfo, VerifyReport};
pub use update::UpdateStats;

