//! The binary dataset cache: a Criteo TSV parsed once into column arrays that every rank maps
//! read-only.
//!
//! # File format (version 1, little-endian)
//!
//! ```text
//! [0, 4096)            header (fields below, then zero padding to one page)
//! [labels_offset, ..)  labels: rows x f32 (0.0 or 1.0)
//! [dense_offset, ..)   dense:  rows x 13 f32, row-major (ln(1 + max(x, 0)) of I1..I13)
//! [keys_offset, ..)    keys:   rows x 26 u64, row-major (field-salted keys of C1..C26)
//! ```
//!
//! Sections are sized for `row_capacity` rows (the TSV's line count, so a file can be
//! written in one pass before the number of malformed lines is known), start on 4096-byte
//! boundaries in the order above, and hold `rows <= row_capacity` rows; the file length is
//! a multiple of 4096.
//!
//! | offset | size | header field |
//! |---|---|---|
//! | 0   | 8 | magic `"RRDATA\0\0"` |
//! | 8   | 4 | format version (1) |
//! | 12  | 4 | header length (4096) |
//! | 16  | 4 | dense features per row (13) |
//! | 20  | 4 | categorical features per row (26) |
//! | 24  | 8 | reserved (0) |
//! | 32  | 8 | rows |
//! | 40  | 8 | row capacity (lines of the source) |
//! | 48  | 8 | lines read from the source |
//! | 56  | 8 | malformed lines skipped |
//! | 64  | 8 | source size in bytes |
//! | 72  | 8 | source mtime, ns since the Unix epoch |
//! | 80  | 56 | labels offset, labels length, dense offset, dense length, keys offset, keys length, file length (u64 each) |
//! | 136 | 48 | malformed lines per [`BadLineKind`](super::criteo::BadLineKind) (6 x u64, in [`BadLineKind::ALL`](super::criteo::BadLineKind::ALL) order) |
//! | 184 | 8 | FNV-1a 64 checksum of bytes 0..184 |
//!
//! Opening checks the header's frame, fields and section layout with the shared header
//! codec ([`crate::header`]), each failure its own [`crate::header::FormatError`] variant (or
//! `Truncated` when the file is shorter than the header
//! says). After that every access is a bounds-checked slice of the mapping.
//!
//! Files are written atomically (temporary file in the same directory, fsync, rename, fsync
//! of the directory) and never modified in place, so a mapping always sees a complete file.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::criteo::{BadLineReport, CriteoReader, NUM_DENSE, NUM_SPARSE};
use super::error::{DataError, DataResult};
use crate::fileio::AtomicFile;
use crate::hash::fnv1a64;
use crate::header::{align_up, rd_u32, rd_u64, wr_u32, wr_u64, Format, HEADER_LEN};

/// Bytes of the header that carry fields (the rest of the header page is zero).
pub const HEADER_FIELDS: usize = 192;
/// Offset of the checksum: FNV-1a 64 over bytes `0..CHECKSUM_AT`.
pub const CHECKSUM_AT: usize = 184;
/// The dataset cache format (magic `RRDATA`, version 1).
pub static FORMAT: Format = Format {
    magic: *b"RRDATA\0\0",
    version: 1,
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

const LABEL_BYTES: u64 = 4;
const DENSE_BYTES: u64 = 4 * NUM_DENSE as u64;
const KEYS_BYTES: u64 = 8 * NUM_SPARSE as u64;
/// Rows parsed before their columns are written out.
const WRITE_CHUNK: usize = 16 * 1024;

/// Byte offsets and lengths of the sections of a cache file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CacheLayout {
    /// Start of the labels (f32 per row).
    pub labels_offset: u64,
    /// Their length (`rows * 4`).
    pub labels_len: u64,
    /// Start of the dense features (13 f32 per row).
    pub dense_offset: u64,
    /// Their length (`rows * 52`).
    pub dense_len: u64,
    /// Start of the keys (26 u64 per row).
    pub keys_offset: u64,
    /// Their length (`rows * 208`).
    pub keys_len: u64,
    /// Length of the whole file.
    pub file_len: u64,
}

impl CacheLayout {
    /// The one layout of a file sized for `row_capacity` rows and holding `rows`; `None` on
    /// overflow or when `rows > row_capacity`.
    pub fn compute(rows: u64, row_capacity: u64) -> Option<CacheLayout> {
        if rows > row_capacity {
            return None;
        }
        let labels_offset = HEADER_LEN;
        let dense_offset = align_up(labels_offset.checked_add(row_capacity.checked_mul(LABEL_BYTES)?)?)?;
        let keys_offset = align_up(dense_offset.checked_add(row_capacity.checked_mul(DENSE_BYTES)?)?)?;
        let file_len = align_up(keys_offset.checked_add(row_capacity.checked_mul(KEYS_BYTES)?)?)?;
        if file_len > isize::MAX as u64 {
            return None;
        }
        Some(CacheLayout {
            labels_offset,
            labels_len: rows * LABEL_BYTES,
            dense_offset,
            dense_len: rows * DENSE_BYTES,
            keys_offset,
            keys_len: rows * KEYS_BYTES,
            file_len,
        })
    }
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
    /// Malformed lines per kind, in [`BadLineKind::ALL`](super::criteo::BadLineKind::ALL) order.
    pub bad_counts: [u64; 6],
    /// Size of the source TSV in bytes.
    pub source_size: u64,
    /// Modification time of the source TSV, ns since the Unix epoch.
    pub source_mtime_ns: u64,
    /// Section offsets.
    pub layout: CacheLayout,
}

impl CacheHeader {
    /// Encodes the header fields and their checksum (bytes `0..HEADER_FIELDS`).
    pub fn encode(&self) -> [u8; HEADER_FIELDS] {
        let mut b = [0u8; HEADER_FIELDS];
        wr_u32(&mut b, 16, NUM_DENSE as u32);
        wr_u32(&mut b, 20, NUM_SPARSE as u32);
        for (i, v) in [self.rows, self.row_capacity, self.lines, self.bad_lines, self.source_size, self.source_mtime_ns].into_iter().enumerate() {
            wr_u64(&mut b, 32 + 8 * i, v);
        }
        let l = &self.layout;
        for (i, v) in [l.labels_offset, l.labels_len, l.dense_offset, l.dense_len, l.keys_offset, l.keys_len, l.file_len].into_iter().enumerate() {
            wr_u64(&mut b, 80 + 8 * i, v);
        }
        for (i, v) in self.bad_counts.into_iter().enumerate() {
            wr_u64(&mut b, 136 + 8 * i, v);
        }
        FORMAT.seal(&mut b);
        b
    }

    /// Decodes and validates a header. `bytes` is (a prefix of) the file, `file_len` its
    /// real length. Arbitrary bytes give an error, never a panic.
    pub fn parse(path: &Path, bytes: &[u8], file_len: u64) -> DataResult<CacheHeader> {
        FORMAT.check(path, bytes, file_len)?;
        let bad = |field: &'static str, detail: String| DataError::from(FORMAT.bad(path, field, detail));
        let expect_u32 = |at: usize, field: &'static str, want: u32| {
            let v = rd_u32(bytes, at);
            if v == want {
                Ok(())
            } else {
                Err(bad(field, format!("{v}, expected {want}")))
            }
        };
        expect_u32(16, "num_dense", NUM_DENSE as u32)?;
        expect_u32(20, "num_sparse", NUM_SPARSE as u32)?;
        if rd_u64(bytes, 24) != 0 {
            return Err(bad("reserved", "not zero".into()));
        }
        let f = |i: usize| rd_u64(bytes, 32 + 8 * i);
        let (rows, row_capacity, lines, bad_lines, source_size, source_mtime_ns) = (f(0), f(1), f(2), f(3), f(4), f(5));
        let mut bad_counts = [0u64; 6];
        for (i, c) in bad_counts.iter_mut().enumerate() {
            *c = rd_u64(bytes, 136 + 8 * i);
        }
        if rows > row_capacity {
            return Err(bad("rows", format!("{rows} rows exceed the row capacity {row_capacity}")));
        }
        if rows.checked_add(bad_lines) != Some(lines) || lines > row_capacity {
            return Err(bad("lines", format!("{lines} lines read, but {rows} rows + {bad_lines} malformed (capacity {row_capacity})")));
        }
        if bad_counts.iter().try_fold(0u64, |a, &c| a.checked_add(c)) != Some(bad_lines) {
            return Err(bad("bad_counts", format!("{bad_counts:?} do not add up to {bad_lines} malformed lines")));
        }
        let g = |i: usize| rd_u64(bytes, 80 + 8 * i);
        let stored_layout =
            CacheLayout { labels_offset: g(0), labels_len: g(1), dense_offset: g(2), dense_len: g(3), keys_offset: g(4), keys_len: g(5), file_len: g(6) };
        let bad_layout = |detail: String| DataError::from(FORMAT.layout(path, detail));
        let want = CacheLayout::compute(rows, row_capacity).ok_or_else(|| bad_layout(format!("{row_capacity} rows do not fit in the address space")))?;
        if stored_layout != want {
            return Err(bad_layout(format!("sections {stored_layout:?} differ from the layout of {rows} rows in room for {row_capacity}: {want:?}")));
        }
        if file_len < want.file_len {
            return Err(FORMAT.truncated(path, file_len, want.file_len).into());
        }
        if file_len > want.file_len {
            return Err(bad_layout(format!("file is {file_len} bytes, the header says {}", want.file_len)));
        }
        Ok(CacheHeader { rows, row_capacity, lines, bad_lines, bad_counts, source_size, source_mtime_ns, layout: want })
    }
}

/// What [`prepare`] wrote.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PrepareSummary {
    /// The cache file.
    pub path: PathBuf,
    /// Rows written.
    pub rows: u64,
    /// Size of the cache file.
    pub bytes: u64,
    /// Lines read, malformed lines by kind and the first of them.
    pub report: BadLineReport,
}

/// Size and mtime (ns) of a file, the identity a cache is keyed by.
fn source_identity(path: &Path) -> DataResult<(u64, u64)> {
    let m = std::fs::metadata(path).map_err(|e| DataError::io(path, "stat", e))?;
    let ns = (m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128).clamp(0, u64::MAX as i128) as u64;
    Ok((m.size(), ns))
}

/// Lines of a file: newlines, plus one for a last line without a newline.
fn count_lines(path: &Path) -> DataResult<u64> {
    let mut f = File::open(path).map_err(|e| DataError::io(path, "open", e))?;
    let mut buf = vec![0u8; 1 << 20];
    let (mut lines, mut last) = (0u64, b'\n');
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(DataError::io(path, "read", e)),
        };
        lines += buf[..n].iter().filter(|&&b| b == b'\n').count() as u64;
        last = buf[n - 1];
    }
    Ok(lines + u64::from(last != b'\n'))
}

/// Converts the Criteo TSV `tsv` into the cache file `out` (written atomically), skipping
/// and counting malformed lines up to `max_bad_lines` (see [`crate::data::criteo`]).
///
/// Reads the TSV twice: once to count its lines (which sizes the sections), once to parse.
/// Memory use is constant (a few MiB).
pub fn prepare(tsv: &Path, out: &Path, max_bad_lines: u64) -> DataResult<PrepareSummary> {
    let (size, mtime) = source_identity(tsv)?;
    let capacity = count_lines(tsv)?;
    let changed = |detail: String| DataError::SourceChanged { path: tsv.to_path_buf(), detail };
    let layout0 = CacheLayout::compute(0, capacity).ok_or_else(|| changed(format!("{capacity} lines do not fit in the address space")))?;

    let tmp = AtomicFile::create(out, 0o644)?;
    let file = tmp.file();
    let werr = |e| DataError::io(tmp.path(), "write", e);
    file.set_len(layout0.file_len).map_err(werr)?;

    let mut reader = CriteoReader::open(tsv, max_bad_lines)?;
    let mut labels: Vec<f32> = Vec::with_capacity(WRITE_CHUNK);
    let mut dense: Vec<f32> = Vec::with_capacity(WRITE_CHUNK * NUM_DENSE);
    let mut keys: Vec<u64> = Vec::with_capacity(WRITE_CHUNK * NUM_SPARSE);
    let mut rows: u64 = 0;
    let flush = |rows: u64, labels: &mut Vec<f32>, dense: &mut Vec<f32>, keys: &mut Vec<u64>| -> DataResult<()> {
        let at = rows - labels.len() as u64;
        file.write_all_at(bytemuck::cast_slice(labels), layout0.labels_offset + at * LABEL_BYTES).map_err(werr)?;
        file.write_all_at(bytemuck::cast_slice(dense), layout0.dense_offset + at * DENSE_BYTES).map_err(werr)?;
        file.write_all_at(bytemuck::cast_slice(keys), layout0.keys_offset + at * KEYS_BYTES).map_err(werr)?;
        labels.clear();
        dense.clear();
        keys.clear();
        Ok(())
    };
    while let Some(s) = reader.next_sample()? {
        if rows == capacity {
            return Err(changed(format!("it has more than the {capacity} lines counted a moment ago")));
        }
        labels.push(s.label);
        dense.extend_from_slice(&s.dense);
        keys.extend_from_slice(&s.keys);
        rows += 1;
        if labels.len() == WRITE_CHUNK {
            flush(rows, &mut labels, &mut dense, &mut keys)?;
        }
    }
    flush(rows, &mut labels, &mut dense, &mut keys)?;
    let report = reader.into_report();
    if rows == 0 && report.bad() > 0 {
        return Err(DataError::AllMalformed { path: tsv.to_path_buf(), lines: report.lines, kinds: report.kinds(), first: report.first_lines() });
    }
    if report.lines != capacity || source_identity(tsv)? != (size, mtime) {
        return Err(changed(format!("{} lines parsed, {capacity} counted", report.lines)));
    }
    let layout = CacheLayout::compute(rows, capacity).ok_or_else(|| changed("row count exceeds line count".into()))?;
    let header = CacheHeader {
        rows,
        row_capacity: capacity,
        lines: report.lines,
        bad_lines: report.bad(),
        bad_counts: report.counts,
        source_size: size,
        source_mtime_ns: mtime,
        layout,
    };
    file.write_all_at(&header.encode(), 0).map_err(werr)?;
    tmp.commit()?;
    Ok(PrepareSummary { path: out.to_path_buf(), rows, bytes: layout.file_len, report })
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

/// A dataset cache mapped read-only: random access to rows, batch gathers.
pub struct Dataset {
    path: PathBuf,
    map: Mmap,
    header: CacheHeader,
}

impl std::fmt::Debug for Dataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dataset").field("path", &self.path).field("header", &self.header).finish()
    }
}

impl Dataset {
    /// Maps and validates a cache file written by [`prepare`].
    pub fn open(path: &Path) -> DataResult<Dataset> {
        let file = File::open(path).map_err(|e| DataError::io(path, "open", e))?;
        let len = file.metadata().map_err(|e| DataError::io(path, "stat", e))?.len();
        // Validate the header from a plain read first, so a short or foreign file is
        // reported before anything is mapped.
        let mut head = vec![0u8; HEADER_FIELDS.min(len as usize)];
        file.read_exact_at(&mut head, 0).map_err(|e| DataError::io(path, "read", e))?;
        CacheHeader::parse(path, &head, len)?;
        // SAFETY: the mapping is read-only and cache files are never modified in place:
        // prepare() writes a temporary file and renames it over the old one, so this inode
        // keeps its contents for as long as it is mapped. (Truncation of the file by another
        // process would raise SIGBUS, as for any mapped file.)
        let map = unsafe { Mmap::map(&file) }.map_err(|e| DataError::io(path, "map", e))?;
        // Parse again from the mapping itself: the one the accessors trust.
        let header = CacheHeader::parse(path, &map, map.len() as u64)?;
        Ok(Dataset { path: path.to_path_buf(), map, header })
    }

    /// Prepares (once) and opens the cache of `tsv` under `cache_dir`.
    ///
    /// The cache is `cache_dir/<stem>.<hash>.rrdata`, the hash covering the TSV's canonical
    /// path, size and mtime, so an edited TSV gets a fresh cache. An existing valid cache of
    /// the same source is reused, unless it skipped more malformed lines than
    /// `max_bad_lines` allows or holds no row at all (an older version wrote such caches; the
    /// TSV is read again, which reports them). Concurrent
    /// callers on one host (the local ranks of a job) serialise on a lock file, so the TSV is
    /// parsed once.
    pub fn from_tsv_cached(tsv: &Path, cache_dir: &Path, max_bad_lines: u64) -> DataResult<Dataset> {
        let out = cache_path(tsv, cache_dir)?;
        std::fs::create_dir_all(cache_dir).map_err(|e| DataError::io(cache_dir, "create directory", e))?;
        let _lock = FileLock::exclusive(&out.with_extension("lock"))?;
        let (size, mtime) = source_identity(tsv)?;
        if let Ok(ds) = Dataset::open(&out) {
            let h = ds.header();
            if h.source_size == size && h.source_mtime_ns == mtime && h.bad_lines <= max_bad_lines && h.rows > 0 {
                return Ok(ds);
            }
        }
        prepare(tsv, &out, max_bad_lines)?;
        Dataset::open(&out)
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

    /// All dense features, row-major (`len() * 13` values).
    pub fn dense_all(&self) -> &[f32] {
        let l = &self.header.layout;
        bytemuck::cast_slice(self.section(l.dense_offset, l.dense_len))
    }

    /// All keys, row-major (`len() * 26` values).
    pub fn keys_all(&self) -> &[u64] {
        let l = &self.header.layout;
        bytemuck::cast_slice(self.section(l.keys_offset, l.keys_len))
    }

    /// Label of row `i`. Panics when `i >= len()`, like slice indexing.
    pub fn label(&self, i: usize) -> f32 {
        self.labels()[i]
    }

    /// The 13 dense features of row `i`. Panics when `i >= len()`.
    pub fn dense(&self, i: usize) -> &[f32] {
        &self.dense_all()[i * NUM_DENSE..(i + 1) * NUM_DENSE]
    }

    /// The 26 keys of row `i`. Panics when `i >= len()`.
    pub fn keys(&self, i: usize) -> &[u64] {
        &self.keys_all()[i * NUM_SPARSE..(i + 1) * NUM_SPARSE]
    }

    /// Gathers the rows `indices` (in that order) into `labels` (`n`), `dense` (`n * 13`,
    /// row-major) and `keys` (`n * 26`), replacing their contents and reusing their
    /// allocations. An index past the end gives [`DataError::RowOutOfRange`] and leaves
    /// the buffers in an unspecified state.
    pub fn fill_batch<I: RowIndex>(&self, indices: &[I], labels: &mut Vec<f32>, dense: &mut Vec<f32>, keys: &mut Vec<u64>) -> DataResult<()> {
        let (ls, ds, ks) = (self.labels(), self.dense_all(), self.keys_all());
        labels.clear();
        dense.clear();
        keys.clear();
        labels.reserve(indices.len());
        dense.reserve(indices.len() * NUM_DENSE);
        keys.reserve(indices.len() * NUM_SPARSE);
        for &i in indices {
            let i = i.as_index();
            let Some(&l) = ls.get(i) else {
                return Err(DataError::RowOutOfRange { index: i, rows: ls.len() });
            };
            labels.push(l);
            dense.extend_from_slice(&ds[i * NUM_DENSE..(i + 1) * NUM_DENSE]);
            keys.extend_from_slice(&ks[i * NUM_SPARSE..(i + 1) * NUM_SPARSE]);
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
    let canonical = std::fs::canonicalize(tsv).map_err(|e| DataError::io(tsv, "resolve", e))?;
    let (size, mtime) = source_identity(&canonical)?;
    let mut id = canonical.as_os_str().as_encoded_bytes().to_vec();
    id.extend_from_slice(&size.to_le_bytes());
    id.extend_from_slice(&mtime.to_le_bytes());
    id.extend_from_slice(&FORMAT.version.to_le_bytes());
    let stem: String = tsv
        .file_stem()
        .map(|s| s.to_string_lossy().chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect())
        .unwrap_or_else(|| "data".into());
    Ok(cache_dir.join(format!("{stem}.{:016x}.{CACHE_EXT}", fnv1a64(&id))))
}

/// An exclusive `flock`, released when the descriptor closes (on drop).
pub struct FileLock(#[allow(dead_code)] File);

impl FileLock {
    /// Blocks until this process holds the lock on `path` (created if missing).
    pub fn exclusive(path: &Path) -> DataResult<FileLock> {
        use std::os::fd::AsRawFd;
        let f = OpenOptions::new().create(true).truncate(false).write(true).mode(0o644).open(path).map_err(|e| DataError::io(path, "create lock file", e))?;
        // Another rank may hold it for minutes (preparing a cache); ended only if it stops.
        let _w = crate::watchdog::waiting_on_work("a lock another rank holds (preparing a data file)");
        loop {
            // SAFETY: flock on a file descriptor this function owns and keeps open; it touches
            // no memory.
            let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
            if rc == 0 {
                return Ok(FileLock(f));
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(DataError::io(path, "lock", e));
            }
        }
    }
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
            bad_counts: [0, 1, 0, 0, 0, 0],
            source_size: 1234,
            source_mtime_ns: 5678,
            layout: CacheLayout::compute(9, 10).unwrap(),
        }
    }

    #[test]
    fn layout_is_page_aligned() {
        let l = CacheLayout::compute(1000, 1000).unwrap();
        assert_eq!(l.labels_offset, 4096);
        assert_eq!(l.dense_offset, 8192);
        assert_eq!(l.keys_offset, 8192 + 53248);
        assert_eq!(l.file_len, 8192 + 53248 + 208_896);
        assert_eq!(CacheLayout::compute(0, 0).unwrap().file_len, 4096);
        assert!(CacheLayout::compute(2, 1).is_none());
        assert!(CacheLayout::compute(0, u64::MAX / 8).is_none());
    }

    #[test]
    fn header_round_trips() {
        let h = header();
        assert_eq!(CacheHeader::parse(Path::new("x"), &h.encode(), h.layout.file_len).unwrap(), h);
    }

    #[test]
    fn inconsistent_counts_are_refused() {
        let mut h = header();
        h.bad_counts = [0, 2, 0, 0, 0, 0];
        let e = CacheHeader::parse(Path::new("x"), &h.encode(), h.layout.file_len).unwrap_err();
        assert!(matches!(e, DataError::Format(FormatError::BadHeader { field: "bad_counts", .. })), "{e}");
        let mut h = header();
        h.layout.keys_len += 208;
        let e = CacheHeader::parse(Path::new("x"), &h.encode(), h.layout.file_len).unwrap_err();
        assert!(matches!(e, DataError::Format(FormatError::BadLayout { .. })), "{e}");
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        crate::header::fuzz_headers(&FORMAT, &header().encode(), 50_000, |b, len| {
            let _ = CacheHeader::parse(Path::new("fuzz"), b, len);
        });
    }
}
