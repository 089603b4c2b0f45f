//! The binary dataset cache: a Criteo TSV parsed once into column arrays that every rank maps
//! read-only, with a CRC-32 of every MiB so that damage is found before a row is used.
//!
//! # File format (versions 2 and 3, little-endian)
//!
//! ```text
//! [0, 4096)             header (fields below, then zero padding to one page)
//! [labels_offset, ..)   labels:  rows x f32 (0.0 or 1.0)
//! [dense_offset, ..)    dense:   rows x num_dense f32, row-major (a TSV's 13: ln(1 + max(x, 0)) of I1..I13)
//! [keys_offset, ..)     keys:    rows x num_sparse u64, row-major (a TSV's 26: field-salted keys of C1..C26)
//! [weights_offset, ..)  weights: rows x f32 (version 3 only: the `--weight-column` field)
//! [sums_offset, ..)     sums:    u32 CRC-32 of every block of the sections above
//! ```
//!
//! A TSV read without `--weight-column` is prepared into **version 2**, byte for byte what
//! this code wrote before version 3 existed (so every older cache stays valid); a TSV read
//! with one into **version 3**: the same sections plus the weights after the keys, covered
//! by the block sums like the others, with the weights' offset and length, the weight
//! column and a seventh malformed-line count (`weight`) in the header. The reader opens
//! both ([`FORMAT`], [`FORMAT_V3`]); the cache's name ([`cache_path_for`]) covers the weight
//! column, so a cache prepared with it never serves a run without it (or with another
//! column), and the other way round: each is prepared on its own.
//!
//! The column sections are sized for `row_capacity` rows (the TSV's line count, so a file
//! can be written in one pass before the number of malformed lines is known), start on
//! 4096-byte boundaries in the order above, and hold `rows <= row_capacity` rows. A
//! section's *extent* runs from its offset to the next section's (its zero padding
//! included); each extent is cut into blocks of [`CHECKSUM_BLOCK`] bytes (1 MiB, the last
//! one shorter) whose CRC-32s fill the sums section: the labels' blocks, then the dense
//! features', then the keys', then (version 3) the weights'. The file ends with the sums
//! (no padding after them).
//!
//! | offset | size | header field |
//! |---|---|---|
//! | 0   | 8 | magic `"RRDATA\0\0"` |
//! | 8   | 4 | format version (2) |
//! | 12  | 4 | header length (4096) |
//! | 16  | 4 | dense features per row, `num_dense` (a TSV's 13; a Parquet file's dense columns) |
//! | 20  | 4 | single-hot categorical features per row, `num_sparse` (a TSV's 26; a Parquet file's) |
//! | 24  | 4 | checksum block length (1048576) |
//! | 28  | 4 | CRC-32 of the sums section |
//! | 32  | 8 | rows |
//! | 40  | 8 | row capacity (lines of the source) |
//! | 48  | 8 | lines read from the source |
//! | 56  | 8 | malformed lines skipped |
//! | 64  | 8 | source size in bytes |
//! | 72  | 8 | source mtime, ns since the Unix epoch |
//! | 80  | 8 | source ctime, ns since the Unix epoch |
//! | 88  | 8 | source inode number |
//! | 96  | 4 | CRC-32 of the whole source (its content digest) |
//! | 100 | 4 | reserved (0) |
//! | 104 | 8 | when the source's identity was last checked by `prepare`, ns since the Unix epoch |
//! | 112 | 72 | labels offset, labels length, dense offset, dense length, keys offset, keys length, sums offset, sums length, file length (u64 each) |
//! | 184 | 48 | malformed lines per [`BadLineKind`](super::criteo::BadLineKind) (6 x u64, in [`BadLineKind::ALL`](super::criteo::BadLineKind::ALL) order, without `weight`) |
//! | 232 | 8 | FNV-1a 64 checksum of bytes 0..232 |
//!
//! Version 3 (format version 3 at byte 8) has the same fields up to byte 232, then:
//!
//! | offset | size | header field (version 3) |
//! |---|---|---|
//! | 184 | 56 | malformed lines per kind (7 x u64, in [`BadLineKind::ALL`](super::criteo::BadLineKind::ALL) order, `weight` last) |
//! | 240 | 16 | weights offset, weights length (u64 each) |
//! | 256 | 4 | the weight column (1-based field number, 1 to 41; 0: a named column, a Parquet file's) |
//! | 260 | 4 | reserved (0) |
//! | 264 | 8 | FNV-1a 64 checksum of bytes 0..264 |
//!
//! Version 4 (format version 4 at byte 8) is a version-2 file with **multi-hot lists** (a
//! Parquet file's list columns, [`super::parquet_file`]): after the keys (no weights), three
//! more sections, each page-aligned and under the block sums in this order —
//!
//! ```text
//! [spans_offset, ..)    spans: rows x list fields x (start, end) u64: the bag's ids are ids[start..end]
//! [ids_offset, ..)      ids:   room for the ids (u64 field-salted keys); row groups write theirs
//!                              at their own place, so a bag's span may skip unused room
//! [names_offset, ..)    names: the list fields' names, UTF-8, NUL-separated
//! ```
//!
//! | offset | size | header field (version 4) |
//! |---|---|---|
//! | 184 | 48 | malformed lines per kind (6 x u64, as version 2) |
//! | 232 | 4 | list fields per row (1 to [`MAX_LIST_FIELDS`]) |
//! | 236 | 4 | reserved (0) |
//! | 240 | 48 | spans offset, spans length, ids offset, ids length (the room, bytes), names offset, names length (u64 each) |
//! | 288 | 8 | FNV-1a 64 checksum of bytes 0..288 |
//!
//! The counts at 16 and 20 are the rows' shape ([`Fields`]): any number up to
//! [`MAX_FIELDS`](super::fields::MAX_FIELDS) each, at least one field (dense, single-hot or
//! list) in all; the sections' lengths follow from them.
//!
//! Version 5 (format version 5 at byte 8) is a version-4 file with **weights** too (a
//! Parquet file's list columns and its weight column): version 3's weights section between
//! the keys and the spans (the sections in the order of the first diagram, each under the
//! block sums), and after version 4's header fields:
//!
//! | offset | size | header field (version 5) |
//! |---|---|---|
//! | 288 | 16 | weights offset, weights length (u64 each) |
//! | 304 | 4 | the weight column (as version 3's) |
//! | 308 | 4 | reserved (0) |
//! | 312 | 8 | malformed lines of kind `weight` (the other 6 at 184, as version 4) |
//! | 320 | 8 | FNV-1a 64 checksum of bytes 0..320 |
//!
//! Versions 2, 3 and 4 are written and read as before: a file is version 5 only when it
//! has both.
//!
//! On open, besides the checksums, the names must be as many as the list fields and every
//! span must lie inside the ids' room (a forged file is an error naming the row and field,
//! never a panic).
//!
//! # Integrity
//!
//! Every byte of a cache is covered: the header fields by their FNV checksum, the rest of
//! the header page by being zero, the column sections (padding included) by their block
//! sums, and the sums by their CRC-32 in the header. [`Dataset::open`] checks all of it
//! before it returns: the header's frame, fields and section layout with the shared header
//! codec ([`crate::header`]), each failure its own [`crate::header::FormatError`] variant
//! (or `Truncated` when the file is shorter than the header says), then every block in
//! parallel ([`Dataset::verify`]), a mismatch being [`DataError::Damaged`] with the section
//! and the byte range. After that every access is a bounds-checked slice of the mapping.
//!
//! # Writing and reuse
//!
//! Files are created with mode 0600, allocated to their full length up front
//! ([`crate::fileio::reserve`]: a lack of space is an error before anything is written),
//! written atomically (temporary file in the same directory, fsync, rename, fsync of the
//! directory) and never modified in place, so a mapping always sees a complete file.
//! [`prepare`](super::prepare()) (on several threads: [`mod@super::prepare`]) reads the TSV
//! twice, taking its CRC-32 both times; different digests, or a different stat afterwards,
//! mean it changed meanwhile ([`DataError::SourceChanged`]).
//!
//! [`Dataset::from_tsv_cached`] reuses a cache only when the TSV's size, mtime, ctime and
//! inode are those recorded. ctime is set by the kernel on every write and cannot be set
//! back, so a TSV rewritten in place with its size and mtime restored is noticed. The kernel
//! stamps ctime from a clock of some milliseconds' resolution (some filesystems keep whole
//! seconds), so a rewrite in the same tick as the change before it keeps the ctime; a cache
//! whose check came less than [`RACY_NS`] after the source's ctime is therefore reused only
//! when the TSV's content digest still matches (git's "racily clean" rule). A large TSV
//! takes longer than that to prepare, so only small ones are read again.

use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use memmap2::{Mmap, UncheckedAdvice};

use super::criteo::BAD_LINE_KINDS;
use super::fields::Fields;
use super::error::{DataError, DataResult};
use super::prepare::{count_lines, prepare_with, PrepareOptions};
use crate::hash::{crc32, first_bad_block, fnv1a64, CHECKSUM_BLOCK};
use crate::header::{align_up, rd_u32, rd_u64, wr_u32, wr_u64, Format, HEADER_LEN};

/// Bytes of a version-2 header that carry fields (the rest of the header page is zero).
pub const HEADER_FIELDS: usize = 240;
/// Offset of a version-2 header's checksum: FNV-1a 64 over bytes `0..CHECKSUM_AT`.
pub const CHECKSUM_AT: usize = 232;
/// Bytes of a version-3 header (a cache with weights) that carry fields.
pub const HEADER_FIELDS_V3: usize = 272;
/// Offset of a version-3 header's checksum.
pub const CHECKSUM_AT_V3: usize = 264;
/// Bytes of a version-4 header (a cache with multi-hot lists) that carry fields.
pub const HEADER_FIELDS_V4: usize = 296;
/// Offset of a version-4 header's checksum.
pub const CHECKSUM_AT_V4: usize = 288;
/// Bytes of a version-5 header (a cache with multi-hot lists and weights) that carry fields.
pub const HEADER_FIELDS_V5: usize = 328;
/// Offset of a version-5 header's checksum.
pub const CHECKSUM_AT_V5: usize = 320;
/// Most list fields a version-4 header may declare (a sanity bound; the model pools fewer).
pub const MAX_LIST_FIELDS: u32 = 1024;
/// The dataset cache format without weights (magic `RRDATA`, version 2): what every TSV
/// without `--weight-column` is prepared into.
pub static FORMAT: Format = BASE_FORMAT;
/// The dataset cache format with a weight column (version 3: version 2 and a weights
/// section; see the module docs).
pub static FORMAT_V3: Format = Format { version: 3, checksum_at: CHECKSUM_AT_V3, ..BASE_FORMAT };
/// The dataset cache format with multi-hot list fields (version 4: version 2 and the
/// lists' spans, ids and names; see the module docs).
pub static FORMAT_V4: Format = Format { version: 4, checksum_at: CHECKSUM_AT_V4, ..BASE_FORMAT };
/// The dataset cache format with multi-hot list fields and a weight column (version 5:
/// version 4 and version 3's weights section; see the module docs).
pub static FORMAT_V5: Format = Format { version: 5, checksum_at: CHECKSUM_AT_V5, ..BASE_FORMAT };
const BASE_FORMAT: Format = Format {
    magic: *b"RRDATA\0\0",
    version: 2,
    header_len: HEADER_LEN,
    checksum_at: CHECKSUM_AT,
    noun: "dataset cache",
    this: "this dataset",
    not_this: "a Criteo TSV is converted with `ringrec data prepare`",
    on_version: "run `ringrec data prepare` on the TSV again",
    restore: "run `ringrec data prepare` again",
};
/// File name extension of caches made by [`Dataset::from_tsv_cached`].
pub const CACHE_EXT: &str = "rrdata";
/// Permissions of cache files and their temporary files: the owner's only (training data
/// may be private).
pub const CACHE_MODE: u32 = crate::fileio::PRIVATE;
/// A cache checked less than this long (2 s) after its source's ctime is "racy": the source
/// could have been rewritten within the same timestamp tick, so reusing it needs the content
/// digest to match (see the module docs).
pub const RACY_NS: u64 = 2_000_000_000;

/// Bytes of a row's label and weight, and of one dense feature and one key.
pub(crate) const LABEL_BYTES: u64 = 4;
pub(crate) const WEIGHT_BYTES: u64 = 4;
pub(crate) const DENSE_VALUE_BYTES: u64 = 4;
pub(crate) const KEY_BYTES: u64 = 8;
/// Bytes of one span (start and end of a bag among the ids, u64 each).
pub(crate) const SPAN_BYTES: u64 = 16;
/// Bytes of one list id.
pub(crate) const ID_BYTES: u64 = 8;
const BLOCK: u64 = CHECKSUM_BLOCK as u64;
/// Blocks [`Dataset::verify`] checks at a time (in parallel) before it hands their pages
/// back: at least this many, and one a thread of the rayon pool.
pub const VERIFY_WINDOW_BLOCKS: usize = 4;

/// Byte offsets and lengths of the sections of a cache file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CacheLayout {
    /// Start of the labels (f32 per row).
    pub labels_offset: u64,
    /// Their length (`rows * 4`).
    pub labels_len: u64,
    /// Start of the dense features (`num_dense` f32 per row: 13 for a TSV).
    pub dense_offset: u64,
    /// Their length (`rows * num_dense * 4`).
    pub dense_len: u64,
    /// Start of the keys (`num_sparse` u64 per row: 26 for a TSV).
    pub keys_offset: u64,
    /// Their length (`rows * num_sparse * 8`).
    pub keys_len: u64,
    /// Start of the weights (f32 per row; `sums_offset` in a cache without weights).
    pub weights_offset: u64,
    /// Their length (`rows * 4`; 0 without weights).
    pub weights_len: u64,
    /// Start of the lists' spans (version 4: per row and list field its ids' start and end
    /// among the ids, u64 each; `sums_offset` in a cache without lists).
    pub spans_offset: u64,
    /// Their length (`rows * list fields * 16`; 0 without lists).
    pub spans_len: u64,
    /// Start of the lists' ids (field-salted keys, u64 each; row groups' ids at their own
    /// places, with gaps).
    pub ids_offset: u64,
    /// Their length (room for the ids, `capacity * 8`; 0 without lists).
    pub ids_len: u64,
    /// Start of the list fields' names (UTF-8, separated by NUL bytes).
    pub names_offset: u64,
    /// Their length in bytes (0 without lists).
    pub names_len: u64,
    /// Start of the block sums (u32 per block of the column sections).
    pub sums_offset: u64,
    /// Their length (4 bytes per block).
    pub sums_len: u64,
    /// Length of the whole file (`sums_offset + sums_len`).
    pub file_len: u64,
}

impl CacheLayout {
    /// The one layout of a file sized for `row_capacity` rows and holding `rows`, with a
    /// weights section when `weighted` (version 3), of a TSV's rows (13 dense features, 26
    /// keys); `None` on overflow or when `rows > row_capacity`.
    pub fn compute(rows: u64, row_capacity: u64, weighted: bool) -> Option<CacheLayout> {
        CacheLayout::compute_with(rows, row_capacity, weighted, None, Fields::CRITEO)
    }

    /// [`CacheLayout::compute`] with the list sections of `lists` (version 4; version 5
    /// with weights too), of rows of `fields`' shape.
    pub fn compute_with(rows: u64, row_capacity: u64, weighted: bool, lists: Option<ListShape>, fields: Fields) -> Option<CacheLayout> {
        if rows > row_capacity {
            return None;
        }
        let dense_bytes = DENSE_VALUE_BYTES.checked_mul(fields.dense as u64)?;
        let keys_bytes = KEY_BYTES.checked_mul(fields.sparse as u64)?;
        let labels_offset = HEADER_LEN;
        let dense_offset = align_up(labels_offset.checked_add(row_capacity.checked_mul(LABEL_BYTES)?)?)?;
        let keys_offset = align_up(dense_offset.checked_add(row_capacity.checked_mul(dense_bytes)?)?)?;
        let weights_offset = align_up(keys_offset.checked_add(row_capacity.checked_mul(keys_bytes)?)?)?;
        let spans_offset = if weighted { align_up(weights_offset.checked_add(row_capacity.checked_mul(WEIGHT_BYTES)?)?)? } else { weights_offset };
        let (ids_offset, names_offset, sums_offset) = match lists {
            None => (spans_offset, spans_offset, spans_offset),
            Some(s) => {
                let ids_offset = align_up(spans_offset.checked_add(row_capacity.checked_mul(u64::from(s.fields))?.checked_mul(SPAN_BYTES)?)?)?;
                let names_offset = align_up(ids_offset.checked_add(s.id_capacity.checked_mul(ID_BYTES)?)?)?;
                (ids_offset, names_offset, align_up(names_offset.checked_add(s.names_len)?)?)
            }
        };
        // Each extent is under 2^64 bytes, so under 2^44 blocks: the sum and `* 4` cannot overflow.
        let extents = [dense_offset - labels_offset, keys_offset - dense_offset, weights_offset - keys_offset, spans_offset - weights_offset, ids_offset - spans_offset, names_offset - ids_offset, sums_offset - names_offset];
        let blocks: u64 = extents.iter().map(|e| e.div_ceil(BLOCK)).sum();
        let sums_len = blocks * 4;
        let file_len = sums_offset.checked_add(sums_len)?;
        if file_len > isize::MAX as u64 {
            return None;
        }
        let (fields, id_capacity, names_len) = lists.map_or((0, 0, 0), |s| (u64::from(s.fields), s.id_capacity, s.names_len));
        Some(CacheLayout {
            labels_offset,
            labels_len: rows * LABEL_BYTES,
            dense_offset,
            dense_len: rows * dense_bytes,
            keys_offset,
            keys_len: rows * keys_bytes,
            weights_offset,
            weights_len: if weighted { rows * WEIGHT_BYTES } else { 0 },
            spans_offset,
            spans_len: rows * fields * SPAN_BYTES,
            ids_offset,
            ids_len: id_capacity * ID_BYTES,
            names_offset,
            names_len,
            sums_offset,
            sums_len,
            file_len,
        })
    }

    /// The layout a header says (version 3 with weights, 4 with lists, 5 with both; a
    /// version-2 header's sections after the keys all start at its sums).
    fn stored(bytes: &[u8], weighted: bool, v4: bool) -> CacheLayout {
        let g = |i: usize| rd_u64(bytes, 112 + 8 * i);
        // Version 3's weights at 240, version 5's after the lists' fields.
        let (v3, v5) = (weighted && !v4, weighted && v4);
        CacheLayout {
            labels_offset: g(0),
            labels_len: g(1),
            dense_offset: g(2),
            dense_len: g(3),
            keys_offset: g(4),
            keys_len: g(5),
            weights_offset: if v5 { rd_u64(bytes, 288) } else if v3 || v4 { rd_u64(bytes, 240) } else { g(6) },
            weights_len: if v5 { rd_u64(bytes, 296) } else if v3 { rd_u64(bytes, 248) } else { 0 },
            spans_offset: if v4 { rd_u64(bytes, 240) } else { g(6) },
            spans_len: if v4 { rd_u64(bytes, 248) } else { 0 },
            ids_offset: if v4 { rd_u64(bytes, 256) } else { g(6) },
            ids_len: if v4 { rd_u64(bytes, 264) } else { 0 },
            names_offset: if v4 { rd_u64(bytes, 272) } else { g(6) },
            names_len: if v4 { rd_u64(bytes, 280) } else { 0 },
            sums_offset: g(6),
            sums_len: g(7),
            file_len: g(8),
        }
    }

    /// The checksummed sections in the order of their sums: name, offset and extent (bytes
    /// up to the next section, padding included; the weights' extent is 0 without weights,
    /// the lists' without lists, so a version-2 file has the sums of its three sections only).
    pub fn checksummed(&self) -> [(&'static str, u64, u64); 7] {
        [
            ("labels", self.labels_offset, self.dense_offset.saturating_sub(self.labels_offset)),
            ("dense", self.dense_offset, self.keys_offset.saturating_sub(self.dense_offset)),
            ("keys", self.keys_offset, self.weights_offset.saturating_sub(self.keys_offset)),
            ("weights", self.weights_offset, self.spans_offset.saturating_sub(self.weights_offset)),
            ("spans", self.spans_offset, self.ids_offset.saturating_sub(self.spans_offset)),
            ("ids", self.ids_offset, self.names_offset.saturating_sub(self.ids_offset)),
            ("names", self.names_offset, self.sums_offset.saturating_sub(self.names_offset)),
        ]
    }
}

/// The shape of a version-4 cache's list sections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ListShape {
    /// List (multi-hot) fields per row.
    pub fields: u32,
    /// Room for ids in the ids section.
    pub id_capacity: u64,
    /// Bytes of the fields' names (NUL-separated).
    pub names_len: u64,
}

/// The names section's bytes of list fields `names` (NUL-separated, UTF-8).
pub fn encode_list_names(names: &[String]) -> Vec<u8> {
    names.join("\0").into_bytes()
}

/// What `stat` says of a source TSV: the identity a cache is keyed and reused by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SourceStat {
    /// Size in bytes.
    pub size: u64,
    /// Modification time, ns since the Unix epoch (users can set it: `touch -d`, `cp -p`).
    pub mtime_ns: u64,
    /// Status change time, ns since the Unix epoch: set by the kernel on every write,
    /// rename or chmod, and never set back.
    pub ctime_ns: u64,
    /// Inode number (a file replaced by another one, by `mv` or `rsync`, has another).
    pub inode: u64,
}

impl SourceStat {
    /// The stat of `path`.
    pub fn of(path: &Path) -> DataResult<SourceStat> {
        let m = std::fs::metadata(path).map_err(|e| DataError::io(path, "stat", e))?;
        Ok(SourceStat { size: m.size(), mtime_ns: epoch_ns(m.mtime(), m.mtime_nsec()), ctime_ns: epoch_ns(m.ctime(), m.ctime_nsec()), inode: m.ino() })
    }
}

/// Seconds and nanoseconds since the Unix epoch as ns, clamped to u64.
fn epoch_ns(secs: i64, nsecs: i64) -> u64 {
    (secs as i128 * 1_000_000_000 + nsecs as i128).clamp(0, u64::MAX as i128) as u64
}

/// The wall clock, ns since the Unix epoch (0 before it).
pub(crate) fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos().min(u64::MAX as u128) as u64)
}

/// The decoded header of a cache file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CacheHeader {
    /// Rows in the file.
    pub rows: u64,
    /// Rows the sections have room for (the source's line count).
    pub row_capacity: u64,
    /// Lines read from the source.
    pub lines: u64,
    /// Malformed lines skipped (`lines - rows`).
    pub bad_lines: u64,
    /// Malformed lines per kind, in [`BadLineKind::ALL`](super::criteo::BadLineKind::ALL) order
    /// (a version-2 file records the first 6; its `weight` count is 0).
    pub bad_counts: [u64; 7],
    /// `--weight-column`: the 1-based field of each source line that held the row's weight
    /// (the file is then version 3, with a weights section; [`super::prepare::NAMED_WEIGHT_COLUMN`]:
    /// a Parquet file's named weight column); `None`: version 2.
    pub weight_column: Option<u32>,
    /// Multi-hot list fields per row (the file is then version 4, with spans, ids and
    /// names sections); 0: none.
    pub list_fields: u32,
    /// Dense features and single-hot fields per row (header words 16 and 20: a TSV's 13
    /// and 26, a Parquet file's its columns).
    pub fields: Fields,
    /// The source TSV's size, times and inode when it was read.
    pub source: SourceStat,
    /// CRC-32 of the whole source TSV (its content digest).
    pub source_crc32: u32,
    /// When `prepare` last checked the source's stat, ns since the Unix epoch.
    pub prepared_ns: u64,
    /// CRC-32 of the sums section.
    pub sums_crc32: u32,
    /// Section offsets.
    pub layout: CacheLayout,
}

/// The format of a cache with weights (version 3), with lists (version 4), with both
/// (version 5) or with neither (version 2).
fn format_of(weighted: bool, lists: bool) -> &'static Format {
    if weighted && lists {
        &FORMAT_V5
    } else if weighted {
        &FORMAT_V3
    } else if lists {
        &FORMAT_V4
    } else {
        &FORMAT
    }
}

/// Malformed-line kinds a header records: version 2 the first 6 (no `weight` kind).
fn bad_line_kinds(weighted: bool) -> usize {
    if weighted {
        BAD_LINE_KINDS
    } else {
        BAD_LINE_KINDS - 1
    }
}

impl CacheHeader {
    /// The format of the file: version 3 with a weight column, 4 with lists, 5 with both,
    /// else 2.
    pub fn format(&self) -> &'static Format {
        format_of(self.weight_column.is_some(), self.list_fields > 0)
    }

    /// The list sections' shape (`None` without lists).
    pub fn lists(&self) -> Option<ListShape> {
        let l = &self.layout;
        (self.list_fields > 0).then_some(ListShape { fields: self.list_fields, id_capacity: l.ids_len / ID_BYTES, names_len: l.names_len })
    }

    /// Encodes the header fields and their checksum (bytes `0..HEADER_FIELDS`, or
    /// `0..HEADER_FIELDS_V3` with a weight column). A version-2 header is that of the code
    /// before version 3 byte for byte.
    pub fn encode(&self) -> Vec<u8> {
        let format = self.format();
        let mut b = vec![0u8; format.fields_len()];
        wr_u32(&mut b, 16, self.fields.dense as u32);
        wr_u32(&mut b, 20, self.fields.sparse as u32);
        wr_u32(&mut b, 24, CHECKSUM_BLOCK as u32);
        wr_u32(&mut b, 28, self.sums_crc32);
        let s = &self.source;
        for (i, v) in [self.rows, self.row_capacity, self.lines, self.bad_lines, s.size, s.mtime_ns, s.ctime_ns, s.inode].into_iter().enumerate() {
            wr_u64(&mut b, 32 + 8 * i, v);
        }
        wr_u32(&mut b, 96, self.source_crc32);
        wr_u64(&mut b, 104, self.prepared_ns);
        let l = &self.layout;
        let sections = [l.labels_offset, l.labels_len, l.dense_offset, l.dense_len, l.keys_offset, l.keys_len, l.sums_offset, l.sums_len, l.file_len];
        for (i, v) in sections.into_iter().enumerate() {
            wr_u64(&mut b, 112 + 8 * i, v);
        }
        // Version 5 keeps version 4's fields where they are: its weights after them.
        let v5 = self.weight_column.is_some() && self.list_fields > 0;
        let kinds = bad_line_kinds(self.weight_column.is_some() && !v5);
        for (i, v) in self.bad_counts.into_iter().take(kinds).enumerate() {
            wr_u64(&mut b, 184 + 8 * i, v);
        }
        match self.weight_column {
            Some(column) if v5 => {
                wr_u64(&mut b, 288, l.weights_offset);
                wr_u64(&mut b, 296, l.weights_len);
                wr_u32(&mut b, 304, column);
                wr_u64(&mut b, 312, self.bad_counts[BAD_LINE_KINDS - 1]);
            }
            Some(column) => {
                wr_u64(&mut b, 240, l.weights_offset);
                wr_u64(&mut b, 248, l.weights_len);
                wr_u32(&mut b, 256, column);
            }
            None => {}
        }
        if self.list_fields > 0 {
            wr_u32(&mut b, 232, self.list_fields);
            let lists = [l.spans_offset, l.spans_len, l.ids_offset, l.ids_len, l.names_offset, l.names_len];
            for (i, v) in lists.into_iter().enumerate() {
                wr_u64(&mut b, 240 + 8 * i, v);
            }
        }
        format.seal(&mut b);
        b
    }

    /// Decodes and validates a header. `bytes` is (a prefix of) the file, `file_len` its
    /// real length. Arbitrary bytes give an error, never a panic.
    pub fn parse(path: &Path, bytes: &[u8], file_len: u64) -> DataResult<CacheHeader> {
        // Version 3, 4 or 5 (and a newer one, so that its error names the newest version read).
        let version = if bytes.len() >= 12 { rd_u32(bytes, 8) } else { 0 };
        let (v3, v4) = (version == FORMAT_V3.version || version >= FORMAT_V5.version, version >= FORMAT_V4.version);
        let v5 = v3 && v4;
        let format = format_of(v3, v4);
        format.check(path, bytes, file_len)?;
        let bad = |field: &'static str, detail: String| DataError::from(format.bad(path, field, detail));
        let expect_u32 = |at: usize, field: &'static str, want: u32| {
            let v = rd_u32(bytes, at);
            if v == want {
                Ok(())
            } else {
                Err(bad(field, format!("{v}, expected {want}")))
            }
        };
        let fields = Fields { dense: rd_u32(bytes, 16) as usize, sparse: rd_u32(bytes, 20) as usize };
        if let Some(e) = fields.check() {
            return Err(bad("num_dense", e));
        }
        expect_u32(24, "checksum_block", CHECKSUM_BLOCK as u32)?;
        expect_u32(100, "reserved", 0)?;
        let f = |i: usize| rd_u64(bytes, 32 + 8 * i);
        let (rows, row_capacity, lines, bad_lines) = (f(0), f(1), f(2), f(3));
        let source = SourceStat { size: f(4), mtime_ns: f(5), ctime_ns: f(6), inode: f(7) };
        let mut bad_counts = [0u64; BAD_LINE_KINDS];
        let kinds = bad_line_kinds(v3 && !v5);
        for (i, c) in bad_counts.iter_mut().take(kinds).enumerate() {
            *c = rd_u64(bytes, 184 + 8 * i);
        }
        if v5 {
            bad_counts[BAD_LINE_KINDS - 1] = rd_u64(bytes, 312);
        }
        let column_at = if v5 { 304 } else { 256 };
        let weight_column = if v3 {
            expect_u32(column_at + 4, "reserved", 0)?;
            let column = rd_u32(bytes, column_at);
            if column != super::prepare::NAMED_WEIGHT_COLUMN {
                super::criteo::check_weight_column(column).map_err(|e| bad("weight_column", e))?;
            }
            Some(column)
        } else {
            None
        };
        let list_fields = if v4 {
            expect_u32(236, "reserved", 0)?;
            let n = rd_u32(bytes, 232);
            if n == 0 || n > MAX_LIST_FIELDS {
                return Err(bad("list_fields", format!("{n}, expected 1 to {MAX_LIST_FIELDS}")));
            }
            if rd_u64(bytes, 264) % ID_BYTES != 0 {
                return Err(bad("ids_len", format!("{} bytes, not a whole number of ids", rd_u64(bytes, 264))));
            }
            n
        } else {
            0
        };
        if rows > row_capacity {
            return Err(bad("rows", format!("{rows} rows exceed the row capacity {row_capacity}")));
        }
        if rows.checked_add(bad_lines) != Some(lines) || lines > row_capacity {
            return Err(bad("lines", format!("{lines} lines read, but {rows} rows + {bad_lines} malformed (capacity {row_capacity})")));
        }
        if bad_counts.iter().try_fold(0u64, |a, &c| a.checked_add(c)) != Some(bad_lines) {
            return Err(bad("bad_counts", format!("{bad_counts:?} do not add up to {bad_lines} malformed lines")));
        }
        let stored_layout = CacheLayout::stored(bytes, v3, v4);
        let bad_layout = |detail: String| DataError::from(format.layout(path, detail));
        let lists = v4.then(|| ListShape { fields: list_fields, id_capacity: rd_u64(bytes, 264) / ID_BYTES, names_len: rd_u64(bytes, 280) });
        if fields.dense + fields.sparse + list_fields as usize == 0 {
            return Err(bad("num_sparse", "no dense, categorical or list field in a row".into()));
        }
        let want = CacheLayout::compute_with(rows, row_capacity, v3, lists, fields).ok_or_else(|| bad_layout(format!("{row_capacity} rows do not fit in the address space")))?;
        if stored_layout != want {
            return Err(bad_layout(format!("sections {stored_layout:?} differ from the layout of {rows} rows in room for {row_capacity}: {want:?}")));
        }
        if file_len < want.file_len {
            return Err(format.truncated(path, file_len, want.file_len).into());
        }
        if file_len > want.file_len {
            return Err(bad_layout(format!("file is {file_len} bytes, the header says {}", want.file_len)));
        }
        Ok(CacheHeader {
            rows,
            row_capacity,
            lines,
            bad_lines,
            bad_counts,
            weight_column,
            list_fields,
            fields,
            source,
            source_crc32: rd_u32(bytes, 96),
            prepared_ns: rd_u64(bytes, 104),
            sums_crc32: rd_u32(bytes, 28),
            layout: want,
        })
    }
}

/// Types usable as row indices in [`Dataset::fill_batch`] (`usize`, `u32`, `u64`).
pub trait RowIndex: Copy {
    /// The index as `usize` (saturating, so an impossible index is out of range, not wrapped).
    fn as_index(self) -> usize;
}
impl RowIndex for usize {
    #[inline]
    fn as_index(self) -> usize {
        self
    }
}
impl RowIndex for u32 {
    #[inline]
    fn as_index(self) -> usize {
        self as usize
    }
}
impl RowIndex for u64 {
    #[inline]
    fn as_index(self) -> usize {
        usize::try_from(self).unwrap_or(usize::MAX)
    }
}

/// Whether a valid cache may serve its source, whose stat is now `now`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reuse {
    /// Prepare it again: the source changed, or the cache breaks the bad-line rule.
    No,
    /// The stat matches and the cache is not racy.
    Yes,
    /// The stat matches but the cache is racy: only if the source's CRC-32 still matches.
    IfDigestMatches,
}

/// The reuse rule of [`Dataset::from_tsv_cached`] (see the module docs).
fn reuse(h: &CacheHeader, now: &SourceStat, opts: &PrepareOptions) -> Reuse {
    if h.source != *now || h.bad_lines > opts.max_bad_lines || h.rows == 0 || h.weight_column != opts.weights_field() {
        Reuse::No
    } else if h.prepared_ns < h.source.ctime_ns.saturating_add(RACY_NS) {
        Reuse::IfDigestMatches
    } else {
        Reuse::Yes
    }
}

/// A dataset cache mapped read-only: random access to rows, batch gathers.
pub struct Dataset {
    path: PathBuf,
    map: Mmap,
    header: CacheHeader,
    /// The list fields' names (version 4; empty without lists).
    list_names: Vec<String>,
}

impl std::fmt::Debug for Dataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dataset").field("path", &self.path).field("header", &self.header).finish()
    }
}

impl Dataset {
    /// Maps and validates a cache file written by [`prepare`](super::prepare()): its header, layout and every
    /// block's CRC-32 ([`Dataset::verify`]). A damaged file is an error naming it, the
    /// section and the bytes that differ.
    pub fn open(path: &Path) -> DataResult<Dataset> {
        let mut ds = Dataset::map(path)?;
        ds.verify()?;
        ds.list_names = ds.check_lists()?;
        Ok(ds)
    }

    /// A version-4 file's list names, after checking that they are as many as its list
    /// fields, and that every span lies inside the ids section (so that [`Dataset::bag`]
    /// slices in bounds). Checksummed sections can still be forged: this keeps such a file
    /// an error, never a panic.
    fn check_lists(&self) -> DataResult<Vec<String>> {
        let Some(shape) = self.header.lists() else { return Ok(Vec::new()) };
        let format = self.header.format();
        let l = &self.header.layout;
        let bad = |field: &'static str, detail: String| DataError::from(format.bad(&self.path, field, detail));
        let text = std::str::from_utf8(self.section(l.names_offset, l.names_len)).map_err(|e| bad("names", format!("not UTF-8: {e}")))?;
        let names: Vec<String> = text.split('\0').map(str::to_string).collect();
        if names.len() != shape.fields as usize || names.iter().any(String::is_empty) {
            return Err(bad("names", format!("{} names ({text:?}) for {} list fields", names.len(), shape.fields)));
        }
        let fields = shape.fields as usize;
        for (i, span) in self.spans_all().chunks_exact(2).enumerate() {
            if span[0] > span[1] || span[1] > shape.id_capacity {
                return Err(bad("spans", format!("row {} field `{}`: ids {}..{} outside the {} ids", i / fields, names[i % fields], span[0], span[1], shape.id_capacity)));
            }
        }
        Ok(names)
    }

    /// Maps `path` after checking its header and layout (not its sections' sums).
    fn map(path: &Path) -> DataResult<Dataset> {
        let file = crate::fileio::open_input(path).map_err(|e| DataError::io(path, "open", e))?;
        let len = file.metadata().map_err(|e| DataError::io(path, "stat", e))?.len();
        // Validate the header from a plain read first, so a short or foreign file is
        // reported before anything is mapped.
        let mut head = vec![0u8; HEADER_FIELDS_V5.min(len as usize)];
        file.read_exact_at(&mut head, 0).map_err(|e| DataError::io(path, "read", e))?;
        CacheHeader::parse(path, &head, len)?;
        // SAFETY: the mapping is read-only and cache files are never modified in place:
        // prepare() writes a temporary file and renames it over the old one, so this inode
        // keeps its contents for as long as it is mapped. (Truncation of the file by another
        // process would raise SIGBUS, as for any mapped file.)
        let map = unsafe { Mmap::map(&file) }.map_err(|e| DataError::io(path, "map", e))?;
        // Parse again from the mapping itself: the one the accessors trust.
        let header = CacheHeader::parse(path, &map, map.len() as u64)?;
        Ok(Dataset { path: path.to_path_buf(), map, header, list_names: Vec::new() })
    }

    /// Checks every byte after the header fields: the rest of the header page is zero, the
    /// sums match their CRC-32 in the header, and every block of the column sections
    /// matches its sum (blocks in parallel on the rayon pool). [`Dataset::open`] calls it;
    /// it reads the whole file, a few MiB at a time ([`VERIFY_WINDOW_BLOCKS`]), handing each
    /// window's pages back once checked ([`Dataset::release_pages`]): the file does not
    /// stay in this process's resident set.
    pub fn verify(&self) -> DataResult<()> {
        let damaged = |section: &'static str, start: u64, end: u64| DataError::Damaged { path: self.path.clone(), section, start, end };
        let fields = self.header.format().fields_len();
        if let Some(i) = self.map[fields..HEADER_LEN as usize].iter().position(|&b| b != 0) {
            let at = (fields + i) as u64;
            return Err(damaged("header", at, at + 1));
        }
        let l = &self.header.layout;
        let sums_bytes = self.section(l.sums_offset, l.sums_len);
        if crc32(sums_bytes) != self.header.sums_crc32 {
            return Err(damaged("checksums", l.sums_offset, l.sums_offset + l.sums_len));
        }
        let sums: Vec<u32> = sums_bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let mut first = 0usize;
        let window = VERIFY_WINDOW_BLOCKS.max(rayon::current_num_threads());
        for (name, offset, extent) in l.checksummed() {
            let blocks = extent.div_ceil(BLOCK) as usize;
            // The layout was validated, so the sums cover every block; were they short,
            // first_bad_block would report the first block without a sum.
            let mine = sums.get(first..first + blocks).unwrap_or(&[]);
            first += blocks;
            for w in (0..blocks).step_by(window) {
                let start = offset + w as u64 * BLOCK;
                let len = (extent - w as u64 * BLOCK).min(window as u64 * BLOCK);
                let bad = first_bad_block(self.section(start, len), mine.get(w..(w + window).min(blocks)).unwrap_or(&[]));
                self.release_range(start, len);
                if let Some(b) = bad {
                    let start = start + b as u64 * BLOCK;
                    return Err(damaged(name, start, (start + BLOCK).min(offset + extent)));
                }
            }
        }
        Ok(())
    }

    /// Hands the pages of the whole mapping back to the kernel (`MADV_DONTNEED`): they
    /// leave this process's resident set (they stay in the page cache) and are read again
    /// on the next access. For a file that training has moved past.
    pub fn release_pages(&self) {
        self.release_range(0, self.map.len() as u64);
    }

    /// [`Dataset::release_pages`] of bytes `start..start + len` of the mapping.
    fn release_range(&self, start: u64, len: u64) {
        // Best effort: a refusal leaves the pages where they are, which only costs memory.
        // SAFETY: the mapping is a read-only MAP_SHARED mapping of a file that is never
        // modified in place (see `map`): dropping its pages loses nothing, the next access
        // reads the same bytes again from the page cache or the file, and every slice
        // handed out keeps pointing at valid, unchanged memory.
        let _ = unsafe { self.map.unchecked_advise_range(UncheckedAdvice::DontNeed, start as usize, len as usize) };
    }

    /// Prepares (once) and opens the cache of `tsv` under `cache_dir` (one thread per
    /// core: [`Dataset::from_tsv_cached_with`] chooses).
    pub fn from_tsv_cached(tsv: &Path, cache_dir: &Path, max_bad_lines: u64) -> DataResult<Dataset> {
        Dataset::from_tsv_cached_with(tsv, cache_dir, &PrepareOptions::new(max_bad_lines))
    }

    /// Prepares (once) and opens the cache of `tsv` under `cache_dir`, preparing it as
    /// `opts` says.
    ///
    /// The cache is `cache_dir/<stem>.<hash>.rrdata`, the hash covering the TSV's canonical
    /// path, size and mtime, the format version and (version 3) `opts.weight_column`, so an
    /// edited TSV, or one read with another weight column, gets a fresh cache. An
    /// existing cache is reused when it opens (a damaged, foreign or older-version one is
    /// prepared again, like a missing one), the TSV's size, mtime, ctime and inode are the
    /// recorded ones (and, for a racy cache, its CRC-32: see the module docs), it skipped no
    /// more malformed lines than `max_bad_lines` allows, and it holds a row (an older
    /// version wrote caches of none; the TSV is read again, which reports them). Concurrent
    /// callers on one host (the local ranks of a job) serialise on a lock file, so the TSV
    /// is parsed once. Caches of the same TSV left by older format versions are removed.
    pub fn from_tsv_cached_with(tsv: &Path, cache_dir: &Path, opts: &PrepareOptions) -> DataResult<Dataset> {
        let (_lock, out, reused) = Dataset::cached(tsv, cache_dir, opts)?;
        match reused {
            Some(ds) => Ok(ds),
            None => Dataset::open(&out),
        }
    }

    /// Makes sure the cache of `tsv` under `cache_dir` is prepared (the rules of
    /// [`Dataset::from_tsv_cached_with`]), without opening a fresh one: ahead of its use,
    /// by another thread. Returns its path.
    pub fn prepare_cached(tsv: &Path, cache_dir: &Path, opts: &PrepareOptions) -> DataResult<PathBuf> {
        Ok(Dataset::cached(tsv, cache_dir, opts)?.1)
    }

    /// Under the cache's lock (returned, held until dropped): the cache of `tsv`, reused
    /// (`Some`) or prepared (`None`).
    fn cached(tsv: &Path, cache_dir: &Path, opts: &PrepareOptions) -> DataResult<(FileLock, PathBuf, Option<Dataset>)> {
        let out = cache_path_with(tsv, cache_dir, opts)?;
        std::fs::create_dir_all(cache_dir).map_err(|e| DataError::io(cache_dir, "create directory", e))?;
        let lock = lock_preparation(&out.with_extension("lock"))?;
        let now = SourceStat::of(tsv)?;
        if let Ok(ds) = Dataset::open(&out) {
            let h = ds.header();
            let serves = match reuse(h, &now, opts) {
                Reuse::Yes => true,
                Reuse::IfDigestMatches => count_lines(tsv, now.size, opts.threads)?.1 == h.source_crc32,
                Reuse::No => false,
            };
            if serves {
                return Ok((lock, out, Some(ds)));
            }
        }
        prepare_with(tsv, &out, opts)?;
        for version in 1..FORMAT.version {
            // Best effort: an old file that cannot be removed stays as it was.
            if let Ok(old) = cache_path_of(tsv, cache_dir, version, None, &[]) {
                let _ = std::fs::remove_file(old.with_extension("lock"));
                let _ = std::fs::remove_file(old);
            }
        }
        Ok((lock, out, None))
    }

    /// The cache file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The validated header.
    pub fn header(&self) -> &CacheHeader {
        &self.header
    }

    /// Rows in the dataset.
    pub fn len(&self) -> usize {
        self.header.rows as usize
    }

    /// Whether the dataset has no rows.
    pub fn is_empty(&self) -> bool {
        self.header.rows == 0
    }

    fn section(&self, offset: u64, len: u64) -> &[u8] {
        // In bounds and page-aligned: checked by CacheHeader::parse against the map length.
        &self.map[offset as usize..(offset + len) as usize]
    }
    /// All labels (`len()` values, 0.0 or 1.0).
    pub fn labels(&self) -> &[f32] {
        let l = &self.header.layout;
        bytemuck::cast_slice(self.section(l.labels_offset, l.labels_len))
    }

    /// Dense features and single-hot fields per row.
    pub fn fields(&self) -> Fields {
        self.header.fields
    }

    /// All dense features, row-major (`len() * fields().dense` values).
    pub fn dense_all(&self) -> &[f32] {
        let l = &self.header.layout;
        bytemuck::cast_slice(self.section(l.dense_offset, l.dense_len))
    }

    /// All keys, row-major (`len() * fields().sparse` values).
    pub fn keys_all(&self) -> &[u64] {
        let l = &self.header.layout;
        bytemuck::cast_slice(self.section(l.keys_offset, l.keys_len))
    }

    /// All weights (`len()` values), in a cache prepared with a weight column (version 3).
    pub fn weights(&self) -> Option<&[f32]> {
        let l = &self.header.layout;
        self.header.weight_column.map(|_| bytemuck::cast_slice(self.section(l.weights_offset, l.weights_len)))
    }

    /// Multi-hot list fields per row (version 4; 0 without lists).
    pub fn list_fields(&self) -> usize {
        self.list_names.len()
    }

    /// The list fields' names, in their order in each row (empty without lists).
    pub fn list_names(&self) -> &[String] {
        &self.list_names
    }

    /// Every row's spans, row-major: per row and list field its ids' start and end in
    /// [`Dataset::ids_all`] (`len() * list_fields() * 2` values).
    pub fn spans_all(&self) -> &[u64] {
        let l = &self.header.layout;
        bytemuck::cast_slice(self.section(l.spans_offset, l.spans_len))
    }

    /// The ids section (the lists' field-salted keys, with the gaps row groups left).
    pub fn ids_all(&self) -> &[u64] {
        let l = &self.header.layout;
        bytemuck::cast_slice(self.section(l.ids_offset, l.ids_len))
    }

    /// The most list ids any `rows` rows hold together, over every list field: the sum of
    /// the ids of the `rows` rows with the most (0 without lists). A batch of `rows` rows,
    /// drawn in any order, reads no more of the lists.
    pub fn most_ids(&self, rows: usize) -> u64 {
        let fields = self.list_fields();
        if fields == 0 || rows == 0 {
            return 0;
        }
        // Rows by their ids' count: a few distinct counts, however many rows.
        let mut by_count: std::collections::BTreeMap<u64, u64> = std::collections::BTreeMap::new();
        for row in self.spans_all().chunks_exact(2 * fields) {
            let n = row.chunks_exact(2).fold(0u64, |n, s| n.saturating_add(s[1].saturating_sub(s[0])));
            *by_count.entry(n).or_default() += 1;
        }
        let (mut left, mut ids) = (rows as u64, 0u64);
        for (&n, &count) in by_count.iter().rev() {
            let take = count.min(left);
            ids = ids.saturating_add(n.saturating_mul(take));
            left -= take;
            if left == 0 {
                break;
            }
        }
        ids
    }

    /// [`Dataset::most_ids`] of the cache that serves `input` without opening it for
    /// training: `input` itself when `is_cache`, else its cache under `cache_dir` prepared as
    /// `opts` says, when one is there and the source's stat is still the one it records.
    /// Cheap: the header and layout are checked and the spans and names sections alone are read
    /// (their pages released after), not every block's sum — a sizing hint; the file is verified when
    /// training opens it. `None` when no such cache is there yet: a TSV's or Parquet file's
    /// lists are known only once it is parsed (neither format records a row's list lengths
    /// anywhere cheaper), and that is the background preparation's work.
    pub fn prepared_most_ids(input: &Path, is_cache: bool, cache_dir: &Path, opts: &PrepareOptions, rows: usize) -> Option<u64> {
        let path = if is_cache { input.to_path_buf() } else { cache_path_with(input, cache_dir, opts).ok()? };
        let mut ds = Dataset::map(&path).ok()?;
        if !is_cache && reuse(&ds.header, &SourceStat::of(input).ok()?, opts) == Reuse::No {
            return None;
        }
        ds.list_names = ds.check_lists().ok()?;
        let most = ds.most_ids(rows);
        ds.release_pages();
        Some(most)
    }

    /// The keys of list field `g` of row `i`. Panics when `i >= len()` or `g >=
    /// list_fields()`.
    pub fn bag(&self, i: usize, g: usize) -> &[u64] {
        let at = 2 * (i * self.list_fields() + g);
        let span = &self.spans_all()[at..at + 2];
        // Spans were checked against the ids section when the file was opened.
        &self.ids_all()[span[0] as usize..span[1] as usize]
    }

    /// Appends the bags of rows `indices` (each row's list fields in order) to `keys`, and
    /// after each bag its end (the length of `keys`) to `ends`: the CSR of
    /// [`crate::train::batch::Batch`]. An index past the end gives
    /// [`DataError::RowOutOfRange`]; more than `u32::MAX` ids an error.
    pub fn append_bags<I: RowIndex>(&self, indices: &[I], ends: &mut Vec<u32>, keys: &mut Vec<u64>) -> DataResult<()> {
        let fields = self.list_fields();
        for &i in indices {
            let i = i.as_index();
            if i >= self.len() {
                return Err(DataError::RowOutOfRange { index: i, rows: self.len() });
            }
            for g in 0..fields {
                keys.extend_from_slice(self.bag(i, g));
                ends.push(u32::try_from(keys.len()).map_err(|_| DataError::InvalidArgument(format!("more than {} multi-hot ids in one batch", u32::MAX)))?);
            }
        }
        Ok(())
    }

    /// Label of row `i`. Panics when `i >= len()`, like slice indexing.
    pub fn label(&self, i: usize) -> f32 {
        self.labels()[i]
    }

    /// The dense features of row `i`. Panics when `i >= len()`.
    pub fn dense(&self, i: usize) -> &[f32] {
        let n = self.header.fields.dense;
        &self.dense_all()[i * n..(i + 1) * n]
    }

    /// The single-hot keys of row `i`. Panics when `i >= len()`.
    pub fn keys(&self, i: usize) -> &[u64] {
        let n = self.header.fields.sparse;
        &self.keys_all()[i * n..(i + 1) * n]
    }

    /// Gathers the rows `indices` (in that order) into `labels` (`n`), `dense` (`n *
    /// fields().dense`, row-major) and `keys` (`n * fields().sparse`), replacing their contents and reusing their
    /// allocations. An index past the end gives [`DataError::RowOutOfRange`] and leaves
    /// the buffers in an unspecified state.
    pub fn fill_batch<I: RowIndex>(&self, indices: &[I], labels: &mut Vec<f32>, dense: &mut Vec<f32>, keys: &mut Vec<u64>) -> DataResult<()> {
        labels.clear();
        dense.clear();
        keys.clear();
        self.append_rows(indices, labels, dense, keys)
    }

    /// [`Dataset::fill_batch`] after the rows the buffers hold: a batch drawn from several
    /// datasets.
    pub fn append_rows<I: RowIndex>(&self, indices: &[I], labels: &mut Vec<f32>, dense: &mut Vec<f32>, keys: &mut Vec<u64>) -> DataResult<()> {
        let (ls, ds, ks) = (self.labels(), self.dense_all(), self.keys_all());
        let Fields { dense: nd, sparse: ns } = self.header.fields;
        labels.reserve(indices.len());
        dense.reserve(indices.len() * nd);
        keys.reserve(indices.len() * ns);
        for &i in indices {
            let i = i.as_index();
            let Some(&l) = ls.get(i) else {
                return Err(DataError::RowOutOfRange { index: i, rows: ls.len() });
            };
            labels.push(l);
            dense.extend_from_slice(&ds[i * nd..(i + 1) * nd]);
            keys.extend_from_slice(&ks[i * ns..(i + 1) * ns]);
        }
        Ok(())
    }

    /// Rows labelled 1.
    pub fn positives(&self) -> u64 {
        self.labels().iter().filter(|&&l| l > 0.5).count() as u64
    }
}

/// The cache file [`Dataset::from_tsv_cached`] uses for `tsv` under `cache_dir`.
pub fn cache_path(tsv: &Path, cache_dir: &Path) -> DataResult<PathBuf> {
    cache_path_for(tsv, cache_dir, None)
}

/// The cache file of `tsv` under `cache_dir` read with `weight_column` (`None`: the
/// version-2 cache of [`cache_path`]; a column: a version-3 cache whose name also covers the
/// column, so caches of one TSV read with and without it, or with another, never meet).
pub fn cache_path_for(tsv: &Path, cache_dir: &Path, weight_column: Option<u32>) -> DataResult<PathBuf> {
    let version = format_of(weight_column.is_some(), false).version;
    cache_path_of(tsv, cache_dir, version, weight_column, &[])
}

/// The cache file of `tsv` under `cache_dir` prepared as `opts` says: [`cache_path_for`],
/// the name also covering a Parquet input's named columns when there are any
/// ([`ColumnSpec::cache_id`](super::schema::ColumnSpec::cache_id)), so a cache read with
/// other columns never serves the run. A Parquet input's name also says that its rows have
/// exactly its columns ([`Fields`]): a cache an older build padded to 13 dense and 26
/// single-hot fields is not taken for it (it still opens when named itself).
pub fn cache_path_with(tsv: &Path, cache_dir: &Path, opts: &PrepareOptions) -> DataResult<PathBuf> {
    let mut schema = opts.columns.cache_id();
    if super::parquet_file::is_parquet(tsv) {
        schema.extend_from_slice(b"\0fields: the file's own");
    }
    let version = format_of(opts.weights_field().is_some(), false).version;
    cache_path_of(tsv, cache_dir, version, opts.weights_field(), &schema)
}

/// The cache file of `tsv` under `cache_dir` in format `version` (with `weight_column`, and
/// the `schema` options' bytes).
fn cache_path_of(tsv: &Path, cache_dir: &Path, version: u32, weight_column: Option<u32>, schema: &[u8]) -> DataResult<PathBuf> {
    let canonical = std::fs::canonicalize(tsv).map_err(|e| DataError::io(tsv, "resolve", e))?;
    let source = SourceStat::of(&canonical)?;
    let mut id = canonical.as_os_str().as_encoded_bytes().to_vec();
    id.extend_from_slice(&source.size.to_le_bytes());
    id.extend_from_slice(&source.mtime_ns.to_le_bytes());
    id.extend_from_slice(&version.to_le_bytes());
    if let Some(column) = weight_column {
        id.extend_from_slice(&column.to_le_bytes());
    }
    id.extend_from_slice(schema);
    let stem: String = tsv
        .file_stem()
        .map(|s| s.to_string_lossy().chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect())
        .unwrap_or_else(|| "data".into());
    Ok(cache_dir.join(format!("{stem}.{:016x}.{CACHE_EXT}", fnv1a64(&id))))
}

/// The lock of a cache's preparation ([`crate::fileio::FileLock`]): held by one process of
/// a host at a time, its file removed when it is let go.
pub type FileLock = crate::fileio::FileLock;

/// Blocks until this process holds the lock file `path`, registered with the watchdog as a
/// wait on another rank's work (preparing a data file can take minutes).
pub fn lock_preparation(path: &Path) -> DataResult<FileLock> {
    let _w = crate::watchdog::waiting_on_work("a lock another rank holds (preparing a data file)");
    Ok(FileLock::exclusive(path)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::FormatError;

    fn header() -> CacheHeader {
        CacheHeader {
            rows: 9,
            row_capacity: 10,
            lines: 10,
            bad_lines: 1,
            bad_counts: [0, 1, 0, 0, 0, 0, 0],
            weight_column: None,
            list_fields: 0,
            fields: Fields::CRITEO,
            source: SourceStat { size: 1234, mtime_ns: 5678, ctime_ns: 10 * RACY_NS, inode: 42 },
            source_crc32: 0xdead_beef,
            prepared_ns: 12 * RACY_NS,
            sums_crc32: 0x1234_5678,
            layout: CacheLayout::compute(9, 10, false).unwrap(),
        }
    }

    #[test]
    fn layout_is_page_aligned_and_sums_cover_every_block() {
        let l = CacheLayout::compute(1000, 1000, false).unwrap();
        assert_eq!(l.labels_offset, 4096);
        assert_eq!(l.dense_offset, 8192);
        assert_eq!(l.keys_offset, 8192 + 53248);
        assert_eq!(l.sums_offset, 8192 + 53248 + 208_896);
        // One block per section (each under 1 MiB), 4 bytes each, and the file ends there.
        assert_eq!(l.sums_len, 12);
        assert_eq!(l.file_len, 8192 + 53248 + 208_896 + 12);
        assert_eq!(l.checksummed(), [("labels", 4096, 4096), ("dense", 8192, 53248), ("keys", 61440, 208_896), ("weights", 270_336, 0), ("spans", 270_336, 0), ("ids", 270_336, 0), ("names", 270_336, 0)]);
        // 10,000 rows: the keys' 2,080,768 bytes are two blocks.
        let l = CacheLayout::compute(10_000, 10_000, false).unwrap();
        assert_eq!(l.checksummed().map(|(_, _, e)| e), [40960, 520_192, 2_080_768, 0, 0, 0, 0]);
        assert_eq!(l.sums_len, 16);
        // With weights: one section more after the keys, one block more of sums.
        let w = CacheLayout::compute(10_000, 10_000, true).unwrap();
        assert_eq!(w.checksummed().map(|(_, _, e)| e), [40960, 520_192, 2_080_768, 40960, 0, 0, 0]);
        assert_eq!((w.weights_offset, w.weights_len, w.sums_offset, w.sums_len), (l.sums_offset, 40_000, l.sums_offset + 40960, 20));
        let empty = CacheLayout::compute(0, 0, false).unwrap();
        assert_eq!((empty.sums_offset, empty.sums_len, empty.file_len), (4096, 0, 4096));
        assert!(CacheLayout::compute(2, 1, false).is_none());
        assert!(CacheLayout::compute(0, u64::MAX / 8, false).is_none());
    }

    /// [`header`] of a cache with weights from field 41, and a malformed weight.
    fn header_v3() -> CacheHeader {
        CacheHeader { weight_column: Some(41), bad_counts: [0, 0, 0, 0, 0, 0, 1], layout: CacheLayout::compute(9, 10, true).unwrap(), ..header() }
    }

    #[test]
    fn header_round_trips() {
        let h = header();
        assert_eq!(h.encode().len(), HEADER_FIELDS);
        assert_eq!(CacheHeader::parse(Path::new("x"), &h.encode(), h.layout.file_len).unwrap(), h);
        let v3 = header_v3();
        let b = v3.encode();
        assert_eq!((b.len(), rd_u32(&b, 8), rd_u32(&b, 256)), (HEADER_FIELDS_V3, 3, 41));
        assert_eq!(CacheHeader::parse(Path::new("x"), &b, v3.layout.file_len).unwrap(), v3);
        // A version-3 header whose weight column is out of range.
        let mut bad = b.clone();
        wr_u32(&mut bad, 256, 42);
        FORMAT_V3.seal(&mut bad);
        let e = CacheHeader::parse(Path::new("x"), &bad, v3.layout.file_len).unwrap_err();
        assert!(matches!(e, DataError::Format(FormatError::BadHeader { field: "weight_column", .. })), "{e}");
        // The weights' offset in the header must be the layout's.
        let mut bad = b;
        wr_u64(&mut bad, 240, v3.layout.weights_offset + 4096);
        FORMAT_V3.seal(&mut bad);
        let e = CacheHeader::parse(Path::new("x"), &bad, v3.layout.file_len).unwrap_err();
        assert!(matches!(e, DataError::Format(FormatError::BadLayout { .. })), "{e}");
    }

    #[test]
    fn the_rows_shape_round_trips_and_a_damaged_one_is_refused() {
        // 2 dense and 30 single-hot fields; 0 dense and 3; lists only.
        let shaped = |fields: Fields, lists: Option<ListShape>| CacheHeader { fields, list_fields: lists.map_or(0, |l| l.fields), layout: CacheLayout::compute_with(9, 10, false, lists, fields).unwrap(), ..header() };
        let shape = ListShape { fields: 2, id_capacity: 100, names_len: 5 };
        for h in [shaped(Fields { dense: 2, sparse: 30 }, None), shaped(Fields { dense: 0, sparse: 3 }, None), shaped(Fields { dense: 0, sparse: 0 }, Some(shape)), shaped(Fields { dense: 2, sparse: 30 }, Some(shape))] {
            let b = h.encode();
            assert_eq!((rd_u32(&b, 16), rd_u32(&b, 20)), (h.fields.dense as u32, h.fields.sparse as u32));
            assert_eq!(CacheHeader::parse(Path::new("x"), &b, h.layout.file_len).unwrap(), h);
        }
        let wide = shaped(Fields { dense: 2, sparse: 30 }, None);
        assert_eq!((wide.layout.dense_len, wide.layout.keys_len), (9 * 8, 9 * 30 * 8));
        let tsv = header().encode();
        assert_eq!((rd_u32(&tsv, 16), rd_u32(&tsv, 20)), (13, 26), "a TSV's header keeps 13 and 26");
        // Counts that disagree with the sections, too many, or no field at all (checksum made good).
        let resealed = |h: &CacheHeader, dense: u32, sparse: u32| {
            let mut b = h.encode();
            wr_u32(&mut b, 16, dense);
            wr_u32(&mut b, 20, sparse);
            FORMAT.seal(&mut b);
            CacheHeader::parse(Path::new("x"), &b, h.layout.file_len).unwrap_err()
        };
        let e = resealed(&wide, 2, 29);
        assert!(matches!(e, DataError::Format(FormatError::BadLayout { .. })), "{e}");
        let e = resealed(&wide, 2, u32::MAX);
        assert!(matches!(e, DataError::Format(FormatError::BadHeader { field: "num_dense", .. })), "{e}");
        let none = CacheHeader { layout: CacheLayout::compute_with(9, 10, false, None, Fields { dense: 0, sparse: 0 }).unwrap(), fields: Fields { dense: 0, sparse: 0 }, ..header() };
        let e = CacheHeader::parse(Path::new("x"), &none.encode(), none.layout.file_len).unwrap_err();
        assert!(matches!(e, DataError::Format(FormatError::BadHeader { field: "num_sparse", .. })), "{e}");
        // A byte of the counts changed without resealing: the header's checksum finds it.
        let mut b = wide.encode();
        b[20] ^= 1;
        assert!(CacheHeader::parse(Path::new("x"), &b, wide.layout.file_len).is_err());
    }

    #[test]
    fn inconsistent_counts_are_refused() {
        let mut h = header();
        h.bad_counts = [0, 2, 0, 0, 0, 0, 0];
        let e = CacheHeader::parse(Path::new("x"), &h.encode(), h.layout.file_len).unwrap_err();
        assert!(matches!(e, DataError::Format(FormatError::BadHeader { field: "bad_counts", .. })), "{e}");
        let mut h = header();
        h.layout.keys_len += 208;
        let e = CacheHeader::parse(Path::new("x"), &h.encode(), h.layout.file_len).unwrap_err();
        assert!(matches!(e, DataError::Format(FormatError::BadLayout { .. })), "{e}");
        let mut h = header();
        h.layout.sums_len += 4;
        let e = CacheHeader::parse(Path::new("x"), &h.encode(), h.layout.file_len).unwrap_err();
        assert!(matches!(e, DataError::Format(FormatError::BadLayout { .. })), "{e}");
        // Another checksum block length, and a reserved field that is not zero.
        for (at, field) in [(24, "checksum_block"), (100, "reserved")] {
            let mut b = header().encode();
            b[at] ^= 1;
            let s = fnv1a64(&b[..CHECKSUM_AT]);
            b[CHECKSUM_AT..CHECKSUM_AT + 8].copy_from_slice(&s.to_le_bytes());
            let e = CacheHeader::parse(Path::new("x"), &b, header().layout.file_len).unwrap_err();
            assert!(matches!(e, DataError::Format(FormatError::BadHeader { field: f, .. }) if f == field), "{e}");
        }
    }

    #[test]
    fn a_cache_is_reused_only_for_the_same_stat_and_a_racy_one_only_by_its_digest() {
        let h = header();
        let same = h.source;
        let opts = |max_bad_lines: u64| PrepareOptions::new(max_bad_lines);
        assert_eq!(reuse(&h, &same, &opts(1)), Reuse::Yes);
        // A cache read with another weight column (or none) is prepared again.
        assert_eq!(reuse(&h, &same, &opts(1).weight_column(Some(41))), Reuse::No);
        assert_eq!(reuse(&header_v3(), &header_v3().source, &opts(1)), Reuse::No);
        assert_eq!(reuse(&header_v3(), &header_v3().source, &opts(1).weight_column(Some(41))), Reuse::Yes);
        assert_eq!(reuse(&header_v3(), &header_v3().source, &opts(1).weight_column(Some(2))), Reuse::No);
        // Any field of the stat differs: prepared again (a rewrite in place changes the ctime
        // even when the size and mtime are restored; a replaced file has another inode).
        for now in [
            SourceStat { size: 1235, ..same },
            SourceStat { mtime_ns: 5679, ..same },
            SourceStat { ctime_ns: same.ctime_ns + 1, ..same },
            SourceStat { inode: 43, ..same },
        ] {
            assert_eq!(reuse(&h, &now, &opts(1)), Reuse::No, "{now:?}");
        }
        // The bad-line rule, and caches of no row.
        assert_eq!(reuse(&h, &same, &opts(0)), Reuse::No);
        assert_eq!(reuse(&CacheHeader { rows: 0, lines: 1, ..h }, &same, &opts(1)), Reuse::No);
        // Checked within RACY_NS of the ctime (or before it: a clock set back): racy.
        assert_eq!(reuse(&CacheHeader { prepared_ns: same.ctime_ns + RACY_NS - 1, ..h }, &same, &opts(1)), Reuse::IfDigestMatches);
        assert_eq!(reuse(&CacheHeader { prepared_ns: same.ctime_ns - 1, ..h }, &same, &opts(1)), Reuse::IfDigestMatches);
        assert_eq!(reuse(&CacheHeader { prepared_ns: same.ctime_ns + RACY_NS, ..h }, &same, &opts(1)), Reuse::Yes);
    }

    #[test]
    fn a_cache_of_an_older_version_is_replaced() {
        let dir = std::env::temp_dir().join(format!("ringrec-cache-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let tsv = dir.join("old.tsv");
        crate::data::synth::synth(&tsv, 50, 1).unwrap();
        let cache_dir = dir.join("cache");
        std::fs::create_dir_all(&cache_dir).unwrap();
        let old = cache_path_of(&tsv, &cache_dir, 1, None, &[]).unwrap();
        assert_ne!(old, cache_path(&tsv, &cache_dir).unwrap());
        std::fs::write(&old, b"RRDATA\0\0 a version-1 cache").unwrap();
        std::fs::write(old.with_extension("lock"), b"").unwrap();
        let ds = Dataset::from_tsv_cached(&tsv, &cache_dir, 0).unwrap();
        assert_eq!(ds.len(), 50);
        let mut left: Vec<String> = std::fs::read_dir(&cache_dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        left.sort();
        let name = ds.path().file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(left, vec![name], "the version-1 cache and its lock are gone, and the new cache's lock went with its preparation");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_weight_column_gives_a_version_3_cache_beside_the_version_2_one() {
        let dir = std::env::temp_dir().join(format!("ringrec-cache-v3-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let plain = dir.join("plain.tsv");
        crate::data::synth::synth(&plain, 300, 7).unwrap();
        // The same rows with a weight in field 2 (row i weighs i / 4), and one bad weight.
        let text = std::fs::read_to_string(&plain).unwrap();
        let with_weight = |(i, l): (usize, &str)| {
            let (label, rest) = l.split_once('\t').unwrap();
            format!("{label}\t{}\t{rest}", i as f32 / 4.0)
        };
        let mut lines: Vec<String> = text.lines().enumerate().map(with_weight).collect();
        lines.push(lines[0].replacen("\t0\t", "\tnan\t", 1));
        let weighted = dir.join("weighted.tsv");
        std::fs::write(&weighted, lines.join("\n") + "\n").unwrap();
        let cache_dir = dir.join("cache");
        let v2 = Dataset::from_tsv_cached(&plain, &cache_dir, 0).unwrap();
        let opts = PrepareOptions::new(1).weight_column(Some(2));
        let v3 = Dataset::from_tsv_cached_with(&weighted, &cache_dir, &opts).unwrap();
        assert_eq!((v2.header().weight_column, v2.weights(), rd_u32(&std::fs::read(v2.path()).unwrap(), 8)), (None, None, 2));
        assert_eq!((v3.header().weight_column, rd_u32(&std::fs::read(v3.path()).unwrap(), 8)), (Some(2), 3));
        assert_eq!(v3.header().bad_counts, [0, 0, 0, 0, 0, 0, 1]);
        assert_eq!((v3.len(), v2.len()), (300, 300));
        let want: Vec<f32> = (0..300).map(|i| i as f32 / 4.0).collect();
        assert_eq!(v3.weights().unwrap(), &want[..]);
        assert_eq!((v3.labels(), v3.dense_all(), v3.keys_all()), (v2.labels(), v2.dense_all(), v2.keys_all()));
        // The names differ with and without the column, and with another column.
        let names = [cache_path(&weighted, &cache_dir).unwrap(), cache_path_for(&weighted, &cache_dir, Some(2)).unwrap(), cache_path_for(&weighted, &cache_dir, Some(41)).unwrap()];
        assert!(names[0] != names[1] && names[1] != names[2] && names[0] != names[2], "{names:?}");
        assert_eq!(names[1], v3.path());
        // A damaged weight is found, naming the section.
        let mut bytes = std::fs::read(v3.path()).unwrap();
        let at = v3.header().layout.weights_offset as usize + 40;
        bytes[at] ^= 1;
        let damaged = dir.join("damaged.rrdata");
        std::fs::write(&damaged, &bytes).unwrap();
        match Dataset::open(&damaged).unwrap_err() {
            DataError::Damaged { section, start, .. } => assert_eq!((section, start), ("weights", v3.header().layout.weights_offset)),
            e => panic!("{e}"),
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// [`header`] of a cache with 6 list fields.
    fn header_v4() -> CacheHeader {
        let shape = ListShape { fields: 6, id_capacity: 1000, names_len: 17 };
        CacheHeader { list_fields: 6, layout: CacheLayout::compute_with(9, 10, false, Some(shape), Fields::CRITEO).unwrap(), ..header() }
    }

    fn header_v5() -> CacheHeader {
        let shape = ListShape { fields: 6, id_capacity: 1000, names_len: 17 };
        CacheHeader { list_fields: 6, weight_column: Some(super::super::prepare::NAMED_WEIGHT_COLUMN), layout: CacheLayout::compute_with(9, 10, true, Some(shape), Fields::CRITEO).unwrap(), ..header() }
    }

    #[test]
    fn a_version_5_header_holds_the_lists_and_the_weights_and_versions_2_to_4_stay_as_they_were() {
        let h = header_v5();
        let b = h.encode();
        assert_eq!((b.len(), rd_u32(&b, 8), rd_u32(&b, 232)), (HEADER_FIELDS_V5, 5, 6));
        assert_eq!(CacheHeader::parse(Path::new("x"), &b, h.layout.file_len).unwrap(), h);
        let l = &h.layout;
        assert!(l.keys_offset < l.weights_offset && l.weights_offset < l.spans_offset && l.weights_len == 9 * 4, "{l:?}");
        assert_eq!((rd_u64(&b, 288), rd_u64(&b, 296)), (l.weights_offset, l.weights_len));
        assert_eq!(h.layout.checksummed().map(|(_, _, e)| e)[3..], [4096, 4096, 8192, 4096], "weights, spans, ids, names");
        // The weight's malformed-line count has its own place.
        let mut w = h;
        (w.bad_counts[6], w.bad_lines, w.rows, w.lines) = (1, 2, 8, 10);
        w.layout = CacheLayout::compute_with(8, 10, true, h.lists(), Fields::CRITEO).unwrap();
        let wb = w.encode();
        assert_eq!(rd_u64(&wb, 312), 1);
        assert_eq!(CacheHeader::parse(Path::new("x"), &wb, w.layout.file_len).unwrap(), w);
        // Versions 2, 3 and 4 encode as before.
        assert_eq!((header().encode().len(), header_v3().encode().len(), header_v4().encode().len()), (HEADER_FIELDS, HEADER_FIELDS_V3, HEADER_FIELDS_V4));
        crate::header::fuzz_headers(&FORMAT_V5, &b, 20_000, |b, len| {
            let _ = CacheHeader::parse(Path::new("fuzz"), b, len);
        });
    }

    #[test]
    fn a_version_4_cache_round_trips_its_lists_and_a_damaged_one_is_an_error_naming_it() {
        use crate::data::multihot::{synth_multi_hot, LIST_FIELDS, SINGLE_FIELDS};
        let h = header_v4();
        let b = h.encode();
        assert_eq!((b.len(), rd_u32(&b, 8), rd_u32(&b, 232)), (HEADER_FIELDS_V4, 4, 6));
        assert_eq!(CacheHeader::parse(Path::new("x"), &b, h.layout.file_len).unwrap(), h);
        assert_eq!(h.layout.checksummed().map(|(_, _, e)| e)[4..], [4096, 8192, 4096], "spans, ids, names: a page or two each");

        let dir = std::env::temp_dir().join(format!("ringrec-cache-v4-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("m.parquet");
        // Two row groups (32 Ki rows each), so the second group's ids start after the first's room.
        synth_multi_hot(&src, 40_000, 3).unwrap();
        let names: Vec<String> = (0..SINGLE_FIELDS).map(|f| format!("c{f}")).chain((0..LIST_FIELDS).map(|g| format!("l{g}"))).collect();
        let opts = PrepareOptions { columns: crate::data::ColumnSpec { sparse: names[..].to_vec(), ..Default::default() }, ..PrepareOptions::new(0) };
        let bags = crate::data::lists::read_bags(&src, &names[SINGLE_FIELDS..], Fields { dense: 0, sparse: SINGLE_FIELDS }).unwrap();
        let mut caches = Vec::new();
        for threads in [1, 3] {
            let out = dir.join(format!("m{threads}.rrdata"));
            crate::data::prepare::prepare_with(&src, &out, &opts.clone().threads(threads)).unwrap();
            let ds = Dataset::open(&out).unwrap();
            assert_eq!((ds.len(), ds.header().list_fields, ds.list_names()), (40_000, 6, &names[SINGLE_FIELDS..]));
            assert_eq!(rd_u32(&std::fs::read(&out).unwrap(), 8), 4);
            for i in [0, 1, 32_767, 32_768, 39_999] {
                for g in 0..LIST_FIELDS {
                    let b = i * LIST_FIELDS + g;
                    assert_eq!(ds.bag(i, g), &bags.keys[bags.offsets[b] as usize..bags.offsets[b + 1] as usize], "row {i} list {g}");
                }
            }
            let (mut ends, mut keys) = (vec![0u32], Vec::new());
            ds.append_bags(&[3u32, 32_770], &mut ends, &mut keys).unwrap();
            assert_eq!((ends.len(), keys[..ends[1] as usize].to_vec()), (1 + 2 * LIST_FIELDS, ds.bag(3, 0).to_vec()));
            assert!(ds.append_bags(&[40_000u32], &mut ends, &mut keys).is_err());
            // The most ids of any 256 rows: the 256 longest rows' (by a sort of every row's count).
            let mut per_row: Vec<u64> = (0..ds.len()).map(|i| (0..LIST_FIELDS).map(|g| ds.bag(i, g).len() as u64).sum()).collect();
            per_row.sort_unstable_by(|a, b| b.cmp(a));
            assert_eq!((ds.most_ids(256), ds.most_ids(0), ds.most_ids(1 << 20)), (per_row[..256].iter().sum(), 0, per_row.iter().sum()));
            caches.push((ds.labels().to_vec(), ds.keys_all().to_vec(), ds.spans_all().to_vec()));
        }
        assert!(caches[0] == caches[1], "the same cache on 1 and 3 threads");
        // Read cheaply: a cache itself; a source's prepared cache while its stat holds; none
        // before it is prepared.
        let most = Dataset::open(&dir.join("m1.rrdata")).unwrap().most_ids(256);
        let cache_dir = dir.join("cache");
        assert_eq!(Dataset::prepared_most_ids(&dir.join("m1.rrdata"), true, &cache_dir, &opts, 256), Some(most));
        assert_eq!(Dataset::prepared_most_ids(&src, false, &cache_dir, &opts, 256), None);
        Dataset::from_tsv_cached_with(&src, &cache_dir, &opts).unwrap();
        assert_eq!(Dataset::prepared_most_ids(&src, false, &cache_dir, &opts, 256), Some(most));

        let good = std::fs::read(dir.join("m1.rrdata")).unwrap();
        let ds = Dataset::open(&dir.join("m1.rrdata")).unwrap();
        let l = ds.header().layout;
        // Cut short: truncated, naming the file.
        let cut = dir.join("cut.rrdata");
        std::fs::write(&cut, &good[..good.len() - 100]).unwrap();
        let e = Dataset::open(&cut).unwrap_err().to_string();
        assert!(e.contains(&cut.display().to_string()) && e.contains("truncated"), "{e}");
        // A byte of each list section changed: damaged, naming the file and the section.
        for (section, at) in [("spans", l.spans_offset + 8), ("ids", l.ids_offset + 800), ("names", l.names_offset)] {
            let mut bytes = good.clone();
            bytes[at as usize] ^= 1;
            let bad = dir.join(format!("bad-{section}.rrdata"));
            std::fs::write(&bad, &bytes).unwrap();
            match Dataset::open(&bad).unwrap_err() {
                DataError::Damaged { path, section: s, .. } => assert_eq!((path, s), (bad.clone(), section)),
                e => panic!("{section}: {e}"),
            }
        }
        // A span past the ids, checksums made good again: refused, naming the row and field.
        let mut bytes = good.clone();
        let at = l.spans_offset as usize + 16 * 7 + 8;
        bytes[at..at + 8].copy_from_slice(&(l.ids_len / 8 + 1).to_le_bytes());
        let tmp = crate::fileio::AtomicFile::create(&dir.join("resummed.rrdata"), CACHE_MODE).unwrap();
        tmp.file().write_all_at(&bytes, 0).unwrap();
        let mut h = *ds.header();
        h.sums_crc32 = crate::data::prepare::write_sums(&tmp, &l, 1).unwrap();
        tmp.file().write_all_at(&h.encode(), 0).unwrap();
        tmp.commit().unwrap();
        let e = Dataset::open(&dir.join("resummed.rrdata")).unwrap_err().to_string();
        assert!(e.contains("resummed.rrdata") && e.contains("row 1 field `l1`"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        crate::header::fuzz_headers(&FORMAT, &header().encode(), 50_000, |b, len| {
            let _ = CacheHeader::parse(Path::new("fuzz"), b, len);
        });
        crate::header::fuzz_headers(&FORMAT_V3, &header_v3().encode(), 50_000, |b, len| {
            let _ = CacheHeader::parse(Path::new("fuzz"), b, len);
        });
        crate::header::fuzz_headers(&FORMAT_V4, &header_v4().encode(), 50_000, |b, len| {
            let _ = CacheHeader::parse(Path::new("fuzz"), b, len);
        });
    }
}
