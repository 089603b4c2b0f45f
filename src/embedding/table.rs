//! [`EmbeddingTable`]: one memory-mapped table file, read in place; saving it with block
//! checksums and verifying them.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use memmap2::{Mmap, MmapMut};
use rayon::prelude::*;

use super::error::{TableError, TableResult};
use super::format::{self, Extras, Header, Layout, OptimizerKind, RowCounts, StorageDtype, EMPTY_KEY, FORMAT, HEADER_FIELDS, HEADER_LEN};
use super::index;
use super::init::{self, Elem};
use crate::fileio;
use crate::hash::{self, CHECKSUM_BLOCK};

/// Batches at least this long are gathered with rayon; shorter ones on the calling thread.
pub const PAR_MIN_KEYS: usize = 16 * 1024;
/// Keys per rayon task in a parallel gather.
pub(super) const PAR_CHUNK_KEYS: usize = 2048;
/// Distinct, sorted update lists at least this long are applied in parallel.
pub const PAR_MIN_UPDATES: usize = 2048;
/// How many keys ahead a gather prefetches the index slot and row.
pub(super) const PREFETCH_AHEAD: usize = 8;

/// The shape and initialisation of a new table.
#[derive(Clone, Debug, PartialEq)]
pub struct TableConfig {
    /// Values per row.
    pub dim: u32,
    /// Slots; rounded up to a power of two (at least 16). At most 80% of them hold rows.
    pub capacity: u64,
    /// Storage type of the rows.
    pub dtype: StorageDtype,
    /// Optimizer whose state the table keeps.
    pub optimizer: OptimizerKind,
    /// Seed of the initial rows of unseen keys.
    pub seed: u64,
    /// Initial rows are uniform in `[-s, s]`; `None` means `1 / sqrt(dim)`.
    pub init_scale: Option<f32>,
    /// Adagrad's epsilon.
    pub adagrad_eps: f32,
    /// Adagrad's initial accumulator.
    pub adagrad_init: f32,
    /// Keep each row's last update and update count (what expiry and LRU/LFU eviction
    /// read; 8 bytes per slot).
    pub track_usage: bool,
    /// A new key gets a row once it was in this many update batches (1: at once, no sketch).
    pub admit_after: u32,
    /// Bytes of the admission sketch when `admit_after > 1` (rounded down to
    /// [`admit::DEPTH`](super::admit::DEPTH) power-of-two rows).
    pub sketch_bytes: u64,
}

impl TableConfig {
    /// An f32, SGD table of `dim` values per row and `capacity` slots, seed 0, every key
    /// admitted at once, no usage kept.
    pub fn new(dim: u32, capacity: u64) -> TableConfig {
        TableConfig {
            dim,
            capacity,
            dtype: StorageDtype::F32,
            optimizer: OptimizerKind::Sgd,
            seed: 0,
            init_scale: None,
            adagrad_eps: 1e-8,
            adagrad_init: 0.0,
            track_usage: false,
            admit_after: 1,
            sketch_bytes: super::admit::DEFAULT_SKETCH_BYTES,
        }
    }

    /// The usage section and sketch this configuration asks for.
    pub fn extras(&self) -> TableResult<Extras> {
        let (sketch_depth, sketch_width) = super::admit::shape(self.admit_after, self.sketch_bytes)?;
        Ok(Extras { usage: self.track_usage, sketch_depth, sketch_width })
    }

    /// The header of a new, empty table with this configuration.
    pub fn header(&self) -> TableResult<Header> {
        let bad = |m: String| Err(TableError::Config(m));
        if self.dim == 0 || self.dim > format::MAX_DIM {
            return bad(format!("dim {} must be in 1..={}", self.dim, format::MAX_DIM));
        }
        let capacity = self.capacity.max(format::MIN_CAPACITY).checked_next_power_of_two().unwrap_or(u64::MAX);
        if capacity > format::MAX_CAPACITY {
            return bad(format!("--table-capacity {} exceeds the maximum {}", self.capacity, format::MAX_CAPACITY));
        }
        let init_scale = self.init_scale.unwrap_or_else(|| init::default_init_scale(self.dim));
        if !(init_scale.is_finite() && init_scale >= 0.0) {
            return bad(format!("init scale {init_scale} must be finite and >= 0"));
        }
        if !(self.adagrad_eps.is_finite() && self.adagrad_eps > 0.0) {
            return bad(format!("adagrad epsilon {} must be finite and > 0", self.adagrad_eps));
        }
        if !(self.adagrad_init.is_finite() && self.adagrad_init >= 0.0) {
            return bad(format!("adagrad initial accumulator {} must be finite and >= 0", self.adagrad_init));
        }
        let extras = self.extras()?;
        let layout = Layout::compute(self.dim, self.dtype, capacity, self.optimizer, extras)
            .ok_or_else(|| TableError::Config(format!("{capacity} slots x dim {} does not fit in memory", self.dim)))?;
        Ok(Header {
            dim: self.dim,
            dtype: self.dtype,
            optimizer: self.optimizer,
            capacity,
            live_rows: 0,
            generation: 0,
            seed: self.seed,
            init_scale,
            adagrad_eps: self.adagrad_eps,
            adagrad_init: self.adagrad_init,
            sums_valid: false,
            sums_crc: 0,
            replaced: false,
            extras,
            admit_after: self.admit_after,
            counts: RowCounts::default(),
            layout,
        })
    }
}

impl Default for TableConfig {
    fn default() -> Self {
        TableConfig::new(16, 1 << 20)
    }
}

pub(super) enum Mapping {
    /// `PROT_READ` only: a stray write through a bug faults instead of corrupting the table.
    Ro(Mmap),
    /// The host leader's writable mapping.
    Rw(MmapMut),
}

/// A sparse embedding table held in one memory-mapped file (see [`crate::embedding`]).
///
/// Readers and the writer may live in different processes; the caller separates update
/// phases from lookup phases (a host barrier), the table itself takes no locks.
pub struct EmbeddingTable {
    pub(super) map: Mapping,
    pub(super) header: Header,
    pub(super) path: PathBuf,
    pub(super) shift: u32,
    /// The open file: it holds the shared liveness lock ([`fileio::lock_shared`]) for the
    /// handle's lifetime, so a sweep of stale files never takes a table in use.
    _file: File,
}

impl std::fmt::Debug for EmbeddingTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddingTable").field("path", &self.path).field("header", &self.header).field("writable", &self.is_writable()).finish()
    }
}

/// Summary of a table, as `ringrec table inspect` prints it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TableInfo {
    /// The file.
    pub path: PathBuf,
    /// Format version.
    pub version: u32,
    /// The decoded header.
    pub header: Header,
    /// Most rows the table may hold.
    pub max_rows: u64,
    /// `live_rows / capacity`.
    pub load_factor: f64,
    /// Bytes of the whole file (the mapping).
    pub file_bytes: u64,
    /// Bytes of the key index.
    pub index_bytes: u64,
    /// Bytes of the rows.
    pub rows_bytes: u64,
    /// Bytes of the optimizer state.
    pub state_bytes: u64,
    /// Bytes of the usage section (each row's last update and update count).
    pub usage_bytes: u64,
    /// Bytes of the admission sketch.
    pub sketch_bytes: u64,
    /// Whether the file carries valid block checksums (a saved or sealed table; an open
    /// verifies them all). A live table has none.
    pub checksums: bool,
    /// Blocks of [`CHECKSUM_BLOCK`] bytes the checksums cover.
    pub checksum_blocks: u64,
    /// Whether this handle may write.
    pub writable: bool,
}

impl std::fmt::Display for TableInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let h = &self.header;
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        writeln!(f, "table       {}", self.path.display())?;
        writeln!(f, "format      v{}, dim {}, storage {}, optimizer {}", self.version, h.dim, h.dtype, h.optimizer)?;
        writeln!(f, "rows        {} live / {} max / {} slots (load factor {:.4})", h.live_rows, self.max_rows, h.capacity, self.load_factor)?;
        writeln!(f, "generation  {}", h.generation)?;
        writeln!(f, "init        seed {}, uniform in [-{}, {}]", h.seed, h.init_scale, h.init_scale)?;
        if h.optimizer == OptimizerKind::Adagrad {
            writeln!(f, "adagrad     eps {}, initial accumulator {}", h.adagrad_eps, h.adagrad_init)?;
        }
        match h.admit_after {
            1 => writeln!(f, "admission   every key at once")?,
            k => writeln!(f, "admission   after {k} updates, counted in a {}-row x {} count-min sketch ({:.2} MiB)", h.extras.sketch_depth, h.extras.sketch_width, mib(self.sketch_bytes))?,
        }
        writeln!(f, "usage       {}", if h.extras.usage { "last update and update count of every row (expiry, LRU/LFU eviction)" } else { "not kept" })?;
        let c = &h.counts;
        writeln!(f, "history     {} rows inserted, {} evicted, {} expired, {} gradients of unadmitted keys dropped, grown {} times", c.inserted, c.evicted, c.expired, c.refused, c.growths)?;
        if h.replaced {
            writeln!(f, "replaced    a larger copy replaced this live table (growth)")?;
        }
        if self.checksums {
            writeln!(f, "checksums   CRC-32 of {} blocks of {} MiB (every open compares them all)", self.checksum_blocks, CHECKSUM_BLOCK >> 20)?;
        } else {
            writeln!(f, "checksums   none: a live table (`save` writes them)")?;
        }
        writeln!(
            f,
            "memory      {:.2} MiB total: index {:.2} MiB, rows {:.2} MiB, optimizer state {:.2} MiB, usage {:.2} MiB, sketch {:.2} MiB",
            mib(self.file_bytes),
            mib(self.index_bytes),
            mib(self.rows_bytes),
            mib(self.state_bytes),
            mib(self.usage_bytes),
            mib(self.sketch_bytes)
        )
    }
}

fn range(off: u64, len: u64) -> std::ops::Range<usize> {
    off as usize..(off + len) as usize
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Read-side view of a table's sections, typed by the storage element.
pub(super) struct View<'a, T> {
    pub(super) index: &'a [u64],
    pub(super) rows: &'a [T],
    pub(super) dim: usize,
    pub(super) shift: u32,
    seed: u64,
    scale: f32,
}

impl<T> View<'_, T> {
    /// Slot of `key`, or `None`. Terminates even on a full (hostile) index.
    #[inline(always)]
    pub(super) fn find(&self, key: u64) -> Option<usize> {
        self.probe(key).and_then(|(s, vacant)| (!vacant).then_some(s))
    }

    /// [`index::probe`] of `key`.
    #[inline(always)]
    pub(super) fn probe(&self, key: u64) -> Option<(usize, bool)> {
        index::probe(self.index, key, self.shift)
    }

    #[inline(always)]
    pub(super) fn prefetch(&self, key: u64) {
        index::prefetch_slot(self.index, self.rows, self.dim, key, self.shift);
    }
}

impl<T: Elem> View<'_, T> {
    /// Calls `on(n, row)` for each of `keys` in order with its stored row, or `None` when
    /// it is absent (prefetched ahead).
    #[inline(always)]
    fn each_row(&self, keys: &[u64], mut on: impl FnMut(usize, Option<&[T]>)) {
        let d = self.dim;
        for (n, k) in keys.iter().enumerate() {
            if let Some(next) = keys.get(n + PREFETCH_AHEAD) {
                self.prefetch(*next);
            }
            on(n, self.find(*k).and_then(|s| self.rows.get(s * d..s * d + d)));
        }
    }

    fn gather(&self, keys: &[u64], out: &mut [f32]) {
        let d = self.dim;
        self.each_row(keys, |n, row| {
            let o = &mut out[n * d..(n + 1) * d];
            match row {
                Some(row) => T::load(row, o),
                None => init::init_row::<T>(keys[n], self.seed, self.scale, o),
            }
        });
    }

    /// The present keys' rows packed from the start of `out`, the absent keys' positions
    /// pushed to `absent`; returns the present keys' count.
    fn gather_present(&self, keys: &[u64], out: &mut [f32], absent: &mut Vec<u32>) -> usize {
        let (d, mut w) = (self.dim, 0);
        self.each_row(keys, |n, row| match row {
            Some(row) => {
                T::load(row, &mut out[w * d..(w + 1) * d]);
                w += 1;
            }
            None => absent.push(n as u32),
        });
        w
    }
}

/// Sub-slice `[off, off + len)` of `b`, or a layout error instead of a panic.
pub(super) fn sub<'a>(path: &Path, b: &'a [u8], off: u64, len: u64) -> TableResult<&'a [u8]> {
    b.get(range(off, len)).ok_or_else(|| TableError::from(FORMAT.layout(path, format!("section [{off}, +{len}) outside the mapping"))))
}

fn cast<'a, T: bytemuck::Pod>(path: &Path, b: &'a [u8]) -> TableResult<&'a [T]> {
    bytemuck::try_cast_slice(b).map_err(|e| TableError::from(FORMAT.layout(path, format!("misaligned section: {e:?}"))))
}

pub(super) fn cast_mut<'a, T: bytemuck::Pod>(path: &Path, b: &'a mut [u8]) -> TableResult<&'a mut [T]> {
    bytemuck::try_cast_slice_mut(b).map_err(|e| TableError::from(FORMAT.layout(path, format!("misaligned section: {e:?}"))))
}

impl EmbeddingTable {
    /// Creates a new table file (exclusively: `O_EXCL`, mode 0600, holding the liveness
    /// lock), allocates all of it up front and maps it read-write. A directory without room
    /// for it is an error naming the directory and the bytes (never a SIGBUS later); nothing
    /// is left behind on any error.
    pub fn create(path: &Path, cfg: &TableConfig) -> TableResult<EmbeddingTable> {
        let header = cfg.header()?;
        Self::make(path, &header, |map| {
            let l = header.layout;
            map[..HEADER_FIELDS].copy_from_slice(&header.encode());
            map[range(l.index_offset, l.index_len)].fill(0xff);
            if header.optimizer == OptimizerKind::Adagrad && header.adagrad_init != 0.0 {
                let state: &mut [f32] = cast_mut(path, &mut map[range(l.state_offset, l.state_len)])?;
                state.fill(header.adagrad_init);
            }
            Ok(())
        })
    }

    /// A new file at `path` of `header`'s length, written by `fill`, as a read-write table;
    /// on any error the file is removed.
    pub(super) fn make(path: &Path, header: &Header, fill: impl FnOnce(&mut [u8]) -> TableResult<()>) -> TableResult<EmbeddingTable> {
        let (file, map) = Self::new_file(path, header.layout.file_len)?;
        Self::fill_new(path, file, map, header, fill)
    }

    /// Creates `path` exclusively (mode 0600, holding the liveness lock), reserves `len`
    /// bytes and maps them read-write; on any error the file is removed.
    pub(super) fn new_file(path: &Path, len: u64) -> TableResult<(File, MmapMut)> {
        let file = fileio::create_locked(path, 0o600).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                TableError::Exists { path: path.to_path_buf() }
            } else {
                TableError::io(path, "create", e)
            }
        })?;
        match Self::map_new(path, &file, len) {
            Ok(map) => Ok((file, map)),
            Err(e) => {
                drop(file);
                let _ = std::fs::remove_file(path);
                Err(e)
            }
        }
    }

    /// The table `header` describes in the new file `path` ([`EmbeddingTable::new_file`]),
    /// written by `fill`; on any error the file is removed.
    pub(super) fn fill_new(path: &Path, file: File, mut map: MmapMut, header: &Header, fill: impl FnOnce(&mut [u8]) -> TableResult<()>) -> TableResult<EmbeddingTable> {
        let made = if map.len() as u64 == header.layout.file_len { fill(&mut map) } else { Err(FORMAT.truncated(path, map.len() as u64, header.layout.file_len).into()) };
        match made {
            Ok(()) => Ok(EmbeddingTable { map: Mapping::Rw(map), header: *header, path: path.to_path_buf(), shift: 64 - header.capacity.trailing_zeros(), _file: file }),
            Err(e) => {
                drop(map);
                drop(file);
                let _ = std::fs::remove_file(path);
                Err(e)
            }
        }
    }

    /// Reserves `len` bytes of the new, empty `file` and maps them read-write.
    fn map_new(path: &Path, file: &File, len: u64) -> TableResult<MmapMut> {
        fileio::reserve(file, path, len)?;
        file.set_len(len).map_err(|e| TableError::io(path, "size", e))?;
        // SAFETY: we just created this file exclusively with mode 0600; no other process
        // maps it until we return, and its length is fixed from here on. Its blocks are
        // allocated (reserve), so touching a page cannot fail for lack of space. MAP_POPULATE
        // maps every page now: the table's memory is committed up front and training steps
        // never stall on first-touch page faults of new rows.
        let map = unsafe { memmap2::MmapOptions::new().populate().map_mut(file) }.map_err(|e| TableError::io(path, "map", e))?;
        if map.len() as u64 != len {
            return Err(TableError::from(FORMAT.truncated(path, map.len() as u64, len)));
        }
        Ok(map)
    }

    /// Opens a table read-only (`PROT_READ` mapping), as every non-leader rank does.
    pub fn open_readonly(path: &Path) -> TableResult<EmbeddingTable> {
        Self::open(path, false)
    }

    /// Opens a table read-write, as the host leader does.
    pub fn open_readwrite(path: &Path) -> TableResult<EmbeddingTable> {
        Self::open(path, true)
    }

    /// Opens, takes the liveness lock, maps, and validates: header, layout, the index's
    /// row count and, when the file carries checksums (a saved table), every block of it.
    fn open(path: &Path, writable: bool) -> TableResult<EmbeddingTable> {
        let file = fileio::open_regular(OpenOptions::new().read(true).write(writable), path).map_err(|e| TableError::io(path, "open", e))?;
        fileio::lock_shared(&file, path)?;
        let meta = file.metadata().map_err(|e| TableError::io(path, "stat", e))?;
        if !meta.is_file() {
            return Err(TableError::from(FORMAT.layout(path, "not a regular file")));
        }
        let me = euid();
        if meta.uid() != me {
            return Err(TableError::WrongOwner { path: path.to_path_buf(), owner: meta.uid(), euid: me });
        }
        let len = meta.len();
        if len < HEADER_LEN {
            let mut head = Vec::with_capacity(HEADER_LEN as usize);
            let _ = std::io::Read::read_to_end(&mut std::io::Read::take(&file, HEADER_LEN), &mut head);
            return Err(Header::parse(path, &head, len).err().unwrap_or(TableError::from(FORMAT.truncated(path, len, HEADER_LEN))));
        }
        let map = if writable {
            // SAFETY: the file is ours (owner checked); the protocol of the host table is that
            // only this (leader) handle writes and nobody truncates it. Every offset used
            // later is validated against the mapping's length first.
            Mapping::Rw(unsafe { memmap2::MmapOptions::new().populate().map_mut(&file) }.map_err(|e| TableError::io(path, "map", e))?)
        } else {
            // SAFETY: as above; a read-only mapping, the contents are validated before use
            // and all reads are bounds-checked slices. Populated: page-table entries for the
            // leader's pages are set up now, not on each first lookup.
            Mapping::Ro(unsafe { memmap2::MmapOptions::new().populate().map(&file) }.map_err(|e| TableError::io(path, "map", e))?)
        };
        let bytes: &[u8] = match &map {
            Mapping::Ro(m) => m,
            Mapping::Rw(m) => m,
        };
        let header = Header::parse(path, bytes, bytes.len() as u64)?;
        let table = EmbeddingTable { header, path: path.to_path_buf(), shift: 64 - header.capacity.trailing_zeros(), map, _file: file };
        if header.sums_valid {
            table.check_sums()?;
        }
        table.check_index()?;
        Ok(table)
    }

    /// A saved table's integrity: the header page's padding is zero, the sums section
    /// matches its CRC in the header, the padding after it is zero, and every block of the
    /// body matches its sum (computed in parallel). The first damaged place is a
    /// [`TableError::Corrupt`] naming its section and byte offset.
    fn check_sums(&self) -> TableResult<()> {
        let (path, l, b) = (&self.path, self.header.layout, self.as_bytes());
        let corrupt = |section: &str, offset: u64, detail: String| TableError::Corrupt { path: path.clone(), section: section.into(), offset, detail };
        let nonzero = |off: u64, len: u64| -> TableResult<Option<u64>> { Ok(sub(path, b, off, len)?.iter().position(|x| *x != 0).map(|i| off + i as u64)) };
        if let Some(at) = nonzero(HEADER_FIELDS as u64, HEADER_LEN - HEADER_FIELDS as u64)? {
            return Err(corrupt("header", at, "the padding after the header fields is not zero".into()));
        }
        let sums = sub(path, b, l.sums_offset, l.sums_len)?;
        let crc = hash::crc32(sums);
        if crc != self.header.sums_crc {
            return Err(corrupt("checksums", l.sums_offset, format!("their CRC-32 is {crc:#010x}, the header records {:#010x}", self.header.sums_crc)));
        }
        let tail = l.sums_offset + l.sums_len;
        if let Some(at) = nonzero(tail, l.file_len - tail)? {
            return Err(corrupt("checksums", at, "the padding after the checksums is not zero".into()));
        }
        let body = sub(path, b, l.index_offset, l.sums_offset - l.index_offset)?;
        let computed = hash::block_sums(body);
        let stored: Vec<u32> = sums.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let bad: Vec<usize> = (0..computed.len().max(stored.len())).filter(|i| computed.get(*i) != stored.get(*i)).collect();
        let Some(&first) = bad.first() else { return Ok(()) };
        let start = l.index_offset + (first * CHECKSUM_BLOCK) as u64;
        let end = (start + CHECKSUM_BLOCK as u64).min(l.sums_offset);
        let word = |x: Option<&u32>| x.map_or_else(|| "none".to_string(), |v| format!("{v:#010x}"));
        Err(corrupt(
            &l.sections_of(start, end),
            start,
            format!(
                "the {}-byte block there does not match its checksum (stored {}, computed {}); {} of {} blocks differ",
                end - start,
                word(stored.get(first)),
                word(computed.get(first)),
                bad.len(),
                computed.len()
            ),
        ))
    }

    /// The index must hold exactly `live_rows` keys, which guarantees free slots (so probes
    /// end) and that the header's count is right.
    fn check_index(&self) -> TableResult<()> {
        let l = self.header.layout;
        let index: &[u64] = cast(&self.path, sub(&self.path, self.as_bytes(), l.index_offset, l.index_len)?)?;
        let live: u64 = index.par_chunks(1 << 16).map(|c| c.iter().filter(|k| **k != EMPTY_KEY).count() as u64).sum();
        if live != self.header.live_rows {
            return Err(TableError::CorruptIndex {
                path: self.path.clone(),
                detail: format!("{live} occupied slots but the header says {} live rows", self.header.live_rows),
            });
        }
        Ok(())
    }

    /// Copies a saved table file to `dst` and returns the copy, read-write: `saved` is
    /// verified first (every block against its checksum, see [`EmbeddingTable::open_readonly`]);
    /// `dst` is created like [`EmbeddingTable::create`] (exclusive, locked, its space
    /// reserved; removed on any error). The copy is a live table: the saved bytes with the
    /// checksums flag clear and the sums section zero (so the copy of a saved live table is
    /// byte-identical to that table).
    pub fn load(saved: &Path, dst: &Path) -> TableResult<EmbeddingTable> {
        let src = EmbeddingTable::open_readonly(saved)?;
        let header = Header { sums_valid: false, sums_crc: 0, ..src.header };
        let l = header.layout;
        Self::make(dst, &header, |map| {
            let from = src.as_bytes();
            if from.len() != map.len() {
                return Err(TableError::from(FORMAT.layout(saved, format!("the mapping is {} bytes, the header says {}", from.len(), map.len()))));
            }
            map.par_chunks_mut(1 << 24).zip(from.par_chunks(1 << 24)).for_each(|(d, s)| d.copy_from_slice(s));
            map[..HEADER_FIELDS].copy_from_slice(&header.encode());
            map[range(l.sums_offset, l.file_len - l.sums_offset)].fill(0);
            Ok(())
        })
    }

    /// Writes the whole table to `path` atomically, with the CRC-32 of every block (see
    /// [`super::snapshot::TableImage::save`], the one writer of a saved table).
    pub fn save(&self, path: &Path) -> TableResult<()> {
        self.image()?.save(path)
    }

    /// Writes the checksums of the body into this writable table's own file and sets the
    /// flag, in place: a table file made to be kept (`ringrec table create/import`) is then
    /// verified by every open, like a saved one. The next update clears the flag.
    pub fn seal(&mut self) -> TableResult<()> {
        let l = self.header.layout;
        let body = sub(&self.path, self.as_bytes(), l.index_offset, l.sums_offset - l.index_offset)?;
        let (tail, header) = sealed(&self.header, hash::block_sums(body));
        let Mapping::Rw(map) = &mut self.map else { return Err(TableError::ReadOnly) };
        let sums = map.get_mut(range(l.sums_offset, l.file_len - l.sums_offset)).ok_or_else(|| TableError::from(FORMAT.layout(&self.path, "the sums section is outside the mapping")))?;
        sums.copy_from_slice(&tail);
        map[..HEADER_FIELDS].copy_from_slice(&header.encode());
        self.header = header;
        Ok(())
    }

    /// Checks `path` in full, as `ringrec table verify` does: header and layout, the index
    /// (its row count, and every key reachable by a lookup from its home slot, once), and,
    /// when the file carries checksums (a saved table), every block of it. The first damage
    /// found is the error.
    pub fn verify(path: &Path) -> TableResult<VerifyReport> {
        let t = EmbeddingTable::open_readonly(path)?;
        t.check_probes()?;
        let l = t.header.layout;
        Ok(VerifyReport {
            path: path.to_path_buf(),
            checksums: t.header.sums_valid,
            blocks: l.sums_len / 4,
            body_bytes: l.sums_offset - l.index_offset,
            live_rows: t.header.live_rows,
            capacity: t.header.capacity,
        })
    }

    /// Every occupied slot holds a key that a lookup reaches there: no key stranded behind
    /// an empty slot, none stored twice.
    fn check_probes(&self) -> TableResult<()> {
        let v = self.view::<u8>()?;
        let stray = v.index.par_iter().enumerate().find_first(|(s, k)| **k != EMPTY_KEY && v.probe(**k) != Some((*s, false)));
        let Some((slot, key)) = stray else { return Ok(()) };
        let detail = match v.probe(*key) {
            Some((other, false)) => format!("key {key:#x} is stored twice, in slots {other} and {slot}"),
            _ => format!("slot {slot} holds key {key:#x}, which a lookup from its home slot does not reach"),
        };
        Err(TableError::CorruptIndex { path: self.path.clone(), detail })
    }

    /// Checks that this table has the shape and initialisation a run asks for (`want`):
    /// dim, storage dtype, optimizer, capacity (at least the run's, rounded up to a power
    /// of two: a table may have grown), seed and init scale of the initial rows, for
    /// Adagrad its epsilon and initial accumulator, the usage section when the run keeps
    /// one, and the admission threshold and sketch. The first difference is a
    /// [`TableError::Mismatch`] naming the flag and both values.
    pub fn check_matches(&self, want: &TableConfig) -> TableResult<()> {
        let (h, w) = (&self.header, want.header()?);
        let differ = |flag: &'static str, detail: String| Err(TableError::Mismatch { path: self.path.clone(), flag, detail });
        let has = |what: &str, a: &dyn std::fmt::Display, b: &dyn std::fmt::Display| format!("the table has {what}{a}, this run asks for {what}{b}");
        if h.dim != w.dim {
            return differ("--dim", has("", &h.dim, &w.dim));
        }
        if h.dtype != w.dtype {
            return differ("--table-dtype", format!("the table stores {}, this run uses {}", h.dtype, w.dtype));
        }
        if h.optimizer != w.optimizer {
            let holds = |o: OptimizerKind| if o == OptimizerKind::Sgd { "no optimizer state (sgd)".to_string() } else { format!("{o} state") };
            return differ("--sparse-optimizer", format!("the table holds {}, this run uses {}", holds(h.optimizer), w.optimizer));
        }
        if h.capacity < w.capacity {
            return differ("--table-capacity", format!("the table has {} slots, this run asks for {} (rounded up to a power of two)", h.capacity, w.capacity));
        }
        if h.seed != w.seed {
            return differ("--seed", format!("the table's initial rows come from seed {}, this run uses seed {}", h.seed, w.seed));
        }
        if h.init_scale.to_bits() != w.init_scale.to_bits() {
            return differ("--init-scale", has("initial rows in +-", &h.init_scale, &w.init_scale));
        }
        if h.optimizer == OptimizerKind::Adagrad {
            if h.adagrad_eps.to_bits() != w.adagrad_eps.to_bits() {
                return differ("Adagrad epsilon", has("", &h.adagrad_eps, &w.adagrad_eps));
            }
            if h.adagrad_init.to_bits() != w.adagrad_init.to_bits() {
                return differ("Adagrad initial accumulator", has("", &h.adagrad_init, &w.adagrad_init));
            }
        }
        if w.extras.usage && !h.extras.usage {
            return differ("--evict/--expire-after-steps", "the table keeps no usage (last update of each row), this run needs it".into());
        }
        if h.admit_after != w.admit_after {
            return differ("--admit-after", has("admission after ", &h.admit_after, &w.admit_after));
        }
        if (h.extras.sketch_depth, h.extras.sketch_width) != (w.extras.sketch_depth, w.extras.sketch_width) {
            let sk = |e: &Extras| format!("a {} x {} sketch", e.sketch_depth, e.sketch_width);
            return differ("--admit-sketch-mib", format!("the table counts keys in {}, this run asks for {}", sk(&h.extras), sk(&w.extras)));
        }
        Ok(())
    }

    /// The table file's bytes (the whole mapping).
    pub fn as_bytes(&self) -> &[u8] {
        match &self.map {
            Mapping::Ro(m) => m,
            Mapping::Rw(m) => m,
        }
    }

    /// The decoded header.
    pub fn header(&self) -> &Header {
        &self.header
    }
    /// Values per row.
    pub fn dim(&self) -> usize {
        self.header.dim as usize
    }
    /// Rows present.
    pub fn live_rows(&self) -> u64 {
        self.header.live_rows
    }
    /// Update batches applied so far.
    pub fn generation(&self) -> u64 {
        self.header.generation
    }
    /// Slots in the index.
    pub fn capacity(&self) -> u64 {
        self.header.capacity
    }
    /// What happened to the rows over the table's life (insertions, evictions, ...).
    pub fn counts(&self) -> RowCounts {
        self.header.counts
    }
    /// The file this table was opened or created from.
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// Whether this handle may write (the leader's handle).
    pub fn is_writable(&self) -> bool {
        matches!(self.map, Mapping::Rw(_))
    }

    /// Re-reads the header from the mapping: a reader calls this after the writer's update
    /// phase (behind a barrier) to see the new row count and generation.
    pub fn refresh(&mut self) -> TableResult<()> {
        let h = Header::parse(&self.path, self.as_bytes(), self.as_bytes().len() as u64)?;
        if h.layout != self.header.layout {
            return Err(TableError::from(FORMAT.layout(&self.path, "the layout changed under this handle")));
        }
        self.header = h;
        Ok(())
    }

    /// Summary for `inspect`.
    pub fn inspect(&self) -> TableInfo {
        let h = self.header;
        TableInfo {
            path: self.path.clone(),
            version: format::FORMAT.version,
            header: h,
            max_rows: h.max_rows(),
            load_factor: h.live_rows as f64 / h.capacity as f64,
            file_bytes: h.layout.file_len,
            index_bytes: h.layout.index_len,
            rows_bytes: h.layout.rows_len,
            state_bytes: h.layout.state_len,
            usage_bytes: h.layout.usage_len,
            sketch_bytes: h.layout.sketch_len,
            checksums: h.sums_valid,
            checksum_blocks: h.layout.sums_len / 4,
            writable: self.is_writable(),
        }
    }

    pub(super) fn view<T: bytemuck::Pod>(&self) -> TableResult<View<'_, T>> {
        let l = self.header.layout;
        let b = self.as_bytes();
        Ok(View {
            index: cast(&self.path, sub(&self.path, b, l.index_offset, l.index_len)?)?,
            rows: cast(&self.path, sub(&self.path, b, l.rows_offset, l.rows_len)?)?,
            dim: self.dim(),
            shift: self.shift,
            seed: self.header.seed,
            scale: self.header.init_scale,
        })
    }

    /// Writes `h` into the header of this writable table (the body changed: the
    /// checksums of a saved table no longer hold, so they are marked invalid).
    pub(super) fn write_header(&mut self, h: Header) -> TableResult<()> {
        let h = Header { sums_valid: false, sums_crc: 0, ..h };
        let Mapping::Rw(map) = &mut self.map else { return Err(TableError::ReadOnly) };
        let head = map.get_mut(..HEADER_FIELDS).ok_or_else(|| TableError::from(FORMAT.layout(&self.path, "the header is outside the mapping")))?;
        head.copy_from_slice(&h.encode());
        self.header = h;
        Ok(())
    }

    /// Bytes `[off, off + len)` of the file, or a layout error.
    pub(super) fn section(&self, off: u64, len: u64) -> TableResult<&[u8]> {
        sub(&self.path, self.as_bytes(), off, len)
    }

    pub(super) fn check_keys(keys: &[u64]) -> TableResult<()> {
        match keys.iter().find(|k| **k == EMPTY_KEY) {
            Some(k) => Err(TableError::ReservedKey { key: *k }),
            None => Ok(()),
        }
    }

    pub(super) fn check_len(&self, what: &'static str, keys: usize, got: usize) -> TableResult<()> {
        let dim = self.dim();
        let expected = keys.saturating_mul(dim);
        if got != expected {
            return Err(TableError::Shape { what, keys, dim, expected, got });
        }
        Ok(())
    }

    /// Gathers the rows of `keys` into `out` (`keys.len() * dim` f32, row after row).
    /// A key not in the table reads as its deterministic initial row; nothing is written.
    /// Large batches (>= [`PAR_MIN_KEYS`]) are gathered on the rayon pool.
    pub fn lookup(&self, keys: &[u64], out: &mut [f32]) -> TableResult<()> {
        self.check_len("lookup output", keys.len(), out.len())?;
        Self::check_keys(keys)?;
        match self.header.dtype {
            StorageDtype::F32 => self.lookup_t::<f32>(keys, out),
            StorageDtype::F16 => self.lookup_t::<f16>(keys, out),
            StorageDtype::Bf16 => self.lookup_t::<bf16>(keys, out),
        }
    }

    fn lookup_t<T: Elem>(&self, keys: &[u64], out: &mut [f32]) -> TableResult<()> {
        let v = self.view::<T>()?;
        if keys.len() >= PAR_MIN_KEYS {
            out.par_chunks_mut(PAR_CHUNK_KEYS * v.dim).zip(keys.par_chunks(PAR_CHUNK_KEYS)).for_each(|(o, k)| v.gather(k, o));
        } else {
            v.gather(keys, out);
        }
        Ok(())
    }

    /// [`EmbeddingTable::lookup`] without the keys absent from the table (which read as
    /// their initial rows, [`EmbeddingTable::init_row`]: a device can make those from the
    /// key, `Op::InitRows`): the present keys' rows, in order, into the first `present *
    /// dim` values of `out`, and the absent keys' positions in `keys`, in order, into
    /// `absent` (cleared first). Returns `present`.
    pub fn lookup_present(&self, keys: &[u64], out: &mut [f32], absent: &mut Vec<u32>) -> TableResult<usize> {
        self.check_len("lookup output", keys.len(), out.len())?;
        Self::check_keys(keys)?;
        absent.clear();
        match self.header.dtype {
            StorageDtype::F32 => self.lookup_present_t::<f32>(keys, out, absent),
            StorageDtype::F16 => self.lookup_present_t::<f16>(keys, out, absent),
            StorageDtype::Bf16 => self.lookup_present_t::<bf16>(keys, out, absent),
        }
    }

    fn lookup_present_t<T: Elem>(&self, keys: &[u64], out: &mut [f32], absent: &mut Vec<u32>) -> TableResult<usize> {
        let v = self.view::<T>()?;
        if keys.len() < PAR_MIN_KEYS {
            return Ok(v.gather_present(keys, out, absent));
        }
        // Each chunk packs its own rows on the pool; then the chunks' rows close up.
        let d = v.dim;
        let parts: Vec<(usize, Vec<u32>)> = out
            .par_chunks_mut(PAR_CHUNK_KEYS * d)
            .zip(keys.par_chunks(PAR_CHUNK_KEYS))
            .map(|(o, k)| {
                let mut a = Vec::new();
                (v.gather_present(k, o, &mut a), a)
            })
            .collect();
        let mut w = 0;
        for (c, (present, a)) in parts.into_iter().enumerate() {
            let at = c * PAR_CHUNK_KEYS;
            out.copy_within(at * d..(at + present) * d, w * d);
            absent.extend(a.into_iter().map(|n| n + at as u32));
            w += present;
        }
        Ok(w)
    }

    /// Slot of `key` in the index, if present.
    pub fn slot_of(&self, key: u64) -> Option<usize> {
        self.view::<u8>().ok().and_then(|v| v.find(key))
    }

    /// Whether `key` has a row in the table.
    pub fn contains(&self, key: u64) -> bool {
        self.slot_of(key).is_some()
    }

    /// The initial row `key` reads as while it is not in the table.
    pub fn init_row(&self, key: u64, out: &mut [f32]) {
        let (seed, scale) = (self.header.seed, self.header.init_scale);
        match self.header.dtype {
            StorageDtype::F32 => init::init_row::<f32>(key, seed, scale, out),
            StorageDtype::F16 => init::init_row::<f16>(key, seed, scale, out),
            StorageDtype::Bf16 => init::init_row::<bf16>(key, seed, scale, out),
        }
    }

    /// The Adagrad accumulator of `key`'s row (`None` for SGD tables or absent keys).
    pub fn accumulator(&self, key: u64) -> Option<f32> {
        if self.header.optimizer != OptimizerKind::Adagrad {
            return None;
        }
        let slot = self.slot_of(key)?;
        let l = self.header.layout;
        let state: &[f32] = cast(&self.path, sub(&self.path, self.as_bytes(), l.state_offset, l.state_len).ok()?).ok()?;
        state.get(slot).copied()
    }

    /// The usage of `key`'s row: its last update (the table's generation then, low 32 bits)
    /// and how many updates it had (`None` for absent keys or a table without usage).
    pub fn usage(&self, key: u64) -> Option<(u32, u32)> {
        let l = self.header.layout;
        let usage: &[u32] = cast(&self.path, self.section(l.usage_offset, l.usage_len).ok()?).ok()?;
        let slot = self.slot_of(key)?;
        Some((*usage.get(2 * slot)?, *usage.get(2 * slot + 1)?))
    }

    /// Every `(key, slot)` in the table, sorted by key.
    pub fn live_keys(&self) -> Vec<(u64, usize)> {
        let Ok(v) = self.view::<u8>() else { return Vec::new() };
        let mut out: Vec<(u64, usize)> = v.index.iter().enumerate().filter(|(_, k)| **k != EMPTY_KEY).map(|(s, k)| (*k, s)).collect();
        out.sort_unstable();
        out
    }

    /// Flushes the mapping to its file (only matters for tables on disk, not in /dev/shm).
    pub fn flush(&self) -> TableResult<()> {
        match &self.map {
            Mapping::Rw(m) => m.flush().map_err(|e| TableError::io(&self.path, "flush", e)),
            Mapping::Ro(_) => Ok(()),
        }
    }
}

/// The sums section (with its zero padding) holding the block checksums `sums` of a table
/// whose header is `h`, and the header that records them (flag set, their CRC).
pub(super) fn sealed(h: &Header, sums: Vec<u32>) -> (Vec<u8>, Header) {
    let l = h.layout;
    let mut tail = vec![0u8; (l.file_len - l.sums_offset) as usize];
    for (t, s) in tail.chunks_exact_mut(4).zip(sums) {
        t.copy_from_slice(&s.to_le_bytes());
    }
    let sums_crc = hash::crc32(tail.get(..l.sums_len as usize).unwrap_or(&[]));
    (tail, Header { sums_valid: true, sums_crc, ..*h })
}

/// What [`EmbeddingTable::verify`] checked in a sound table.
#[derive(Clone, Debug, serde::Serialize)]
pub struct VerifyReport {
    /// The file.
    pub path: PathBuf,
    /// Whether it carries checksums (a saved table) and every block was compared.
    pub checksums: bool,
    /// Blocks of [`CHECKSUM_BLOCK`] bytes in the body.
    pub blocks: u64,
    /// Bytes of the body (index, rows, state and their padding).
    pub body_bytes: u64,
    /// Keys in the index, each found where a lookup looks.
    pub live_rows: u64,
    /// Slots in the index.
    pub capacity: u64,
}

impl std::fmt::Display for VerifyReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: ok: header, layout, index ({} keys in {} slots, each where a lookup finds it)", self.path.display(), self.live_rows, self.capacity)?;
        if self.checksums {
            writeln!(f, ", and all {} blocks ({} bytes) match their checksums", self.blocks, self.body_bytes)
        } else {
            writeln!(f, "; no checksums: a live table (its rows change every step; `save` writes them), rows and state not checked")
        }
    }
}
