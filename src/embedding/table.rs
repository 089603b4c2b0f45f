//! [`EmbeddingTable`]: one memory-mapped table file, read in place.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use memmap2::{Mmap, MmapMut};
use rayon::prelude::*;

use super::error::{TableError, TableResult};
use super::format::{self, Header, Layout, OptimizerKind, StorageDtype, EMPTY_KEY, FORMAT, HEADER_FIELDS, HEADER_LEN};
use super::init::{self, home_slot, Elem};

/// Batches at least this long are gathered with rayon; shorter ones on the calling thread.
pub const PAR_MIN_KEYS: usize = 16 * 1024;
/// Keys per rayon task in a parallel gather.
const PAR_CHUNK_KEYS: usize = 2048;
/// Distinct, sorted update lists at least this long are applied in parallel.
pub const PAR_MIN_UPDATES: usize = 2048;
/// How many keys ahead a gather prefetches the index slot and row.
const PREFETCH_AHEAD: usize = 8;

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
}

impl TableConfig {
    /// An f32, SGD table of `dim` values per row and `capacity` slots, seed 0.
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
        }
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
        let layout = Layout::compute(self.dim, self.dtype, capacity, self.optimizer)
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
            layout,
        })
    }
}

impl Default for TableConfig {
    fn default() -> Self {
        TableConfig::new(16, 1 << 20)
    }
}

enum Mapping {
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
    map: Mapping,
    header: Header,
    path: PathBuf,
    shift: u32,
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
        writeln!(
            f,
            "memory      {:.2} MiB total: index {:.2} MiB, rows {:.2} MiB, optimizer state {:.2} MiB",
            mib(self.file_bytes),
            mib(self.index_bytes),
            mib(self.rows_bytes),
            mib(self.state_bytes)
        )
    }
}

/// What an update batch did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UpdateStats {
    /// Keys inserted by this batch.
    pub inserted: u64,
    /// Row updates applied (one per key occurrence).
    pub updated: u64,
    /// The table's generation after the batch.
    pub generation: u64,
}

fn range(off: u64, len: u64) -> std::ops::Range<usize> {
    off as usize..(off + len) as usize
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Read-side view of a table's sections, typed by the storage element.
struct View<'a, T> {
    index: &'a [u64],
    rows: &'a [T],
    dim: usize,
    mask: usize,
    shift: u32,
    seed: u64,
    scale: f32,
}

impl<T> View<'_, T> {
    /// Slot of `key`, or `None`. Terminates even on a full (hostile) index.
    #[inline(always)]
    fn find(&self, key: u64) -> Option<usize> {
        let mut i = home_slot(key, self.shift) & self.mask;
        for _ in 0..self.index.len() {
            let k = *self.index.get(i)?;
            if k == key {
                return Some(i);
            }
            if k == EMPTY_KEY {
                return None;
            }
            i = (i + 1) & self.mask;
        }
        None
    }

    #[inline(always)]
    fn prefetch(&self, key: u64) {
        #[cfg(target_arch = "x86_64")]
        {
            let i = home_slot(key, self.shift) & self.mask;
            let p = self.index.as_ptr().wrapping_add(i) as *const i8;
            // SAFETY: prefetch is a hint that never faults, whatever the address; `p` is in
            // bounds of the index anyway (i <= mask < len).
            unsafe { std::arch::x86_64::_mm_prefetch(p, std::arch::x86_64::_MM_HINT_T0) };
            let r = self.rows.as_ptr().wrapping_add(i * self.dim) as *const i8;
            // SAFETY: as above; the home slot's row is where the key's row most likely is.
            unsafe { std::arch::x86_64::_mm_prefetch(r, std::arch::x86_64::_MM_HINT_T0) };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = key;
    }
}

impl<T: Elem> View<'_, T> {
    fn gather(&self, keys: &[u64], out: &mut [f32]) {
        let d = self.dim;
        for (n, (k, o)) in keys.iter().zip(out.chunks_exact_mut(d)).enumerate() {
            if let Some(next) = keys.get(n + PREFETCH_AHEAD) {
                self.prefetch(*next);
            }
            match self.find(*k).and_then(|s| self.rows.get(s * d..s * d + d)) {
                Some(row) => T::load(row, o),
                None => init::init_row::<T>(*k, self.seed, self.scale, o),
            }
        }
    }
}

/// Sub-slice `[off, off + len)` of `b`, or a layout error instead of a panic.
fn sub<'a>(path: &Path, b: &'a [u8], off: u64, len: u64) -> TableResult<&'a [u8]> {
    b.get(range(off, len)).ok_or_else(|| TableError::from(FORMAT.layout(path, format!("section [{off}, +{len}) outside the mapping"))))
}

fn cast<'a, T: bytemuck::Pod>(path: &Path, b: &'a [u8]) -> TableResult<&'a [T]> {
    bytemuck::try_cast_slice(b).map_err(|e| TableError::from(FORMAT.layout(path, format!("misaligned section: {e:?}"))))
}

fn cast_mut<'a, T: bytemuck::Pod>(path: &Path, b: &'a mut [u8]) -> TableResult<&'a mut [T]> {
    bytemuck::try_cast_slice_mut(b).map_err(|e| TableError::from(FORMAT.layout(path, format!("misaligned section: {e:?}"))))
}

/// `b.split_at_mut(n)` without the panic.
fn split_mut(b: &mut [u8], n: usize) -> Option<(&mut [u8], &mut [u8])> {
    if n <= b.len() {
        Some(b.split_at_mut(n))
    } else {
        None
    }
}

/// Mutable sections of a writable table.
struct Parts<'a, T> {
    header: &'a mut [u8],
    index: &'a mut [u64],
    rows: &'a mut [T],
    state: &'a mut [f32],
}

/// One row's change in f32: assignment, an SGD step, or (with `acc`, the row's Adagrad
/// accumulator) a row-wise Adagrad step. The sequential and parallel update paths share it,
/// so they compute every row identically.
fn step_row(w: &mut [f32], v: &[f32], op: RowOp, acc: Option<&mut f32>, eps: f32) {
    match (op, acc) {
        (RowOp::Assign, _) => w.copy_from_slice(v),
        (RowOp::Step(lr), None) => {
            for (x, g) in w.iter_mut().zip(v) {
                *x -= lr * g;
            }
        }
        (RowOp::Step(lr), Some(acc)) => {
            *acc += v.iter().map(|g| g * g).sum::<f32>() / v.len() as f32;
            let denom = acc.sqrt() + eps;
            for (x, g) in w.iter_mut().zip(v) {
                *x -= lr * g / denom;
            }
        }
    }
}

/// How `write_rows` changes a row.
#[derive(Clone, Copy)]
enum RowOp {
    /// Apply an optimizer step with this learning rate to the given gradient.
    Step(f32),
    /// Overwrite the row with the given values.
    Assign,
}

impl EmbeddingTable {
    /// Creates a new table file (exclusively: `O_EXCL`, mode 0600) and maps it read-write.
    pub fn create(path: &Path, cfg: &TableConfig) -> TableResult<EmbeddingTable> {
        let header = cfg.header()?;
        let file = OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                TableError::Exists { path: path.to_path_buf() }
            } else {
                TableError::io(path, "create", e)
            }
        })?;
        let made = Self::init_file(path, &file, &header);
        if made.is_err() {
            let _ = std::fs::remove_file(path);
        }
        made
    }

    fn init_file(path: &Path, file: &File, header: &Header) -> TableResult<EmbeddingTable> {
        let l = header.layout;
        file.set_len(l.file_len).map_err(|e| TableError::io(path, "size", e))?;
        // SAFETY: we just created this file exclusively with mode 0600; no other process
        // maps it until we return, and its length is fixed from here on. MAP_POPULATE
        // allocates every page now: the table's memory is committed up front and training
        // steps never stall on first-touch page faults of new rows.
        let mut map = unsafe { memmap2::MmapOptions::new().populate().map_mut(file) }.map_err(|e| TableError::io(path, "map", e))?;
        let ok = map.len() as u64 == l.file_len;
        if !ok {
            return Err(TableError::from(FORMAT.truncated(path, map.len() as u64, l.file_len)));
        }
        map[..HEADER_FIELDS].copy_from_slice(&header.encode());
        map[range(l.index_offset, l.index_len)].fill(0xff);
        if header.optimizer == OptimizerKind::Adagrad && header.adagrad_init != 0.0 {
            let state: &mut [f32] = cast_mut(path, &mut map[range(l.state_offset, l.state_len)])?;
            state.fill(header.adagrad_init);
        }
        Ok(EmbeddingTable { map: Mapping::Rw(map), header: *header, path: path.to_path_buf(), shift: 64 - header.capacity.trailing_zeros() })
    }

    /// Opens a table read-only (`PROT_READ` mapping), as every non-leader rank does.
    pub fn open_readonly(path: &Path) -> TableResult<EmbeddingTable> {
        Self::open(path, false)
    }

    /// Opens a table read-write, as the host leader does.
    pub fn open_readwrite(path: &Path) -> TableResult<EmbeddingTable> {
        Self::open(path, true)
    }

    fn open(path: &Path, writable: bool) -> TableResult<EmbeddingTable> {
        let file = OpenOptions::new().read(true).write(writable).open(path).map_err(|e| TableError::io(path, "open", e))?;
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
        let table = EmbeddingTable { header, path: path.to_path_buf(), shift: 64 - header.capacity.trailing_zeros(), map };
        table.check_index()?;
        Ok(table)
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

    /// Copies a saved table file to `dst` (exclusive create) and opens the copy read-write.
    /// The copy is byte-identical to `saved`.
    pub fn load(saved: &Path, dst: &Path) -> TableResult<EmbeddingTable> {
        let src = EmbeddingTable::open_readonly(saved)?;
        let mut file = OpenOptions::new().write(true).create_new(true).mode(0o600).open(dst).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                TableError::Exists { path: dst.to_path_buf() }
            } else {
                TableError::io(dst, "create", e)
            }
        })?;
        let copied = file.write_all(src.as_bytes()).map_err(|e| TableError::io(dst, "write", e));
        drop(file);
        match copied.and_then(|_| EmbeddingTable::open_readwrite(dst)) {
            Ok(t) => Ok(t),
            Err(e) => {
                let _ = std::fs::remove_file(dst);
                Err(e)
            }
        }
    }

    /// Writes the whole table to `path` atomically: a temporary file in the same directory,
    /// fsync, rename over `path`, fsync of the directory.
    pub fn save(&self, path: &Path) -> TableResult<()> {
        super::params::write_atomic(path, |w| w.write_all(self.as_bytes()))
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
            version: format::VERSION,
            header: h,
            max_rows: h.max_rows(),
            load_factor: h.live_rows as f64 / h.capacity as f64,
            file_bytes: h.layout.file_len,
            index_bytes: h.layout.index_len,
            rows_bytes: h.layout.rows_len,
            state_bytes: h.layout.state_len,
            writable: self.is_writable(),
        }
    }

    fn view<T: bytemuck::Pod>(&self) -> TableResult<View<'_, T>> {
        let l = self.header.layout;
        let b = self.as_bytes();
        Ok(View {
            index: cast(&self.path, sub(&self.path, b, l.index_offset, l.index_len)?)?,
            rows: cast(&self.path, sub(&self.path, b, l.rows_offset, l.rows_len)?)?,
            dim: self.dim(),
            mask: (self.header.capacity - 1) as usize,
            shift: self.shift,
            seed: self.header.seed,
            scale: self.header.init_scale,
        })
    }

    fn check_keys(keys: &[u64]) -> TableResult<()> {
        match keys.iter().find(|k| **k == EMPTY_KEY) {
            Some(k) => Err(TableError::ReservedKey { key: *k }),
            None => Ok(()),
        }
    }

    fn check_len(&self, what: &'static str, keys: usize, got: usize) -> TableResult<()> {
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

    /// Every `(key, slot)` in the table, sorted by key.
    pub fn live_keys(&self) -> Vec<(u64, usize)> {
        let Ok(v) = self.view::<u8>() else { return Vec::new() };
        let mut out: Vec<(u64, usize)> = v.index.iter().enumerate().filter(|(_, k)| **k != EMPTY_KEY).map(|(s, k)| (*k, s)).collect();
        out.sort_unstable();
        out
    }

    /// Number of distinct keys of `keys` not yet in the table.
    /// The slot of every key already in the table (`usize::MAX` for absent ones) and the
    /// number of distinct absent keys. Prefetches the index `PREFETCH_AHEAD` keys ahead:
    /// updates are bound by memory latency, not arithmetic.
    fn resolve_slots(&self, keys: &[u64]) -> TableResult<(Vec<usize>, u64)> {
        let v = self.view::<u8>()?;
        let find_all = |chunk: &[u64], out: &mut Vec<usize>| {
            for (n, k) in chunk.iter().enumerate() {
                if let Some(next) = chunk.get(n + PREFETCH_AHEAD) {
                    v.prefetch(*next);
                }
                out.push(v.find(*k).unwrap_or(usize::MAX));
            }
        };
        let mut slots = Vec::with_capacity(keys.len());
        if keys.len() >= PAR_MIN_UPDATES && rayon::current_num_threads() > 1 {
            // Read-only lookups: independent, so split over the pool (order kept).
            use rayon::prelude::*;
            let parts: Vec<Vec<usize>> = keys
                .par_chunks(PAR_CHUNK_KEYS)
                .map(|c| {
                    let mut out = Vec::with_capacity(c.len());
                    find_all(c, &mut out);
                    out
                })
                .collect();
            for p in parts {
                slots.extend(p);
            }
        } else {
            find_all(keys, &mut slots);
        }
        let mut new: Option<HashSet<u64>> = None;
        for (k, s) in keys.iter().zip(&slots) {
            if *s == usize::MAX {
                new.get_or_insert_with(HashSet::new).insert(*k);
            }
        }
        Ok((slots, new.map_or(0, |n| n.len() as u64)))
    }

    /// Applies one optimizer step per `(key, gradient row)` in the given order (a key given
    /// twice is stepped twice), inserting keys not yet present; a new row starts from the
    /// key's initial row, so it reads the same before and after insertion. Deterministic:
    /// every host applying the same list gets a byte-identical file. Bumps the generation.
    ///
    /// Fails without changing anything on a read-only handle ([`TableError::ReadOnly`]), on
    /// the reserved key, on a wrong `grads` length, or when the new keys would exceed the
    /// load limit ([`TableError::Full`]).
    pub fn apply_updates(&mut self, keys: &[u64], grads: &[f32], lr: f32) -> TableResult<UpdateStats> {
        if !lr.is_finite() {
            return Err(TableError::Config(format!("learning rate {lr} is not finite")));
        }
        self.write_rows(keys, grads, RowOp::Step(lr))
    }

    /// Sets the rows of `keys` to `values` (inserting absent keys; the Adagrad accumulator of a
    /// new row starts at its initial value, that of an existing row is kept). Values are
    /// rounded to the storage dtype. Same rules and errors as [`EmbeddingTable::apply_updates`].
    pub fn put_rows(&mut self, keys: &[u64], values: &[f32]) -> TableResult<UpdateStats> {
        self.write_rows(keys, values, RowOp::Assign)
    }

    fn write_rows(&mut self, keys: &[u64], vals: &[f32], op: RowOp) -> TableResult<UpdateStats> {
        if !self.is_writable() {
            return Err(TableError::ReadOnly);
        }
        self.check_len(if matches!(op, RowOp::Assign) { "row values" } else { "gradients" }, keys.len(), vals.len())?;
        Self::check_keys(keys)?;
        let (slots, new) = self.resolve_slots(keys)?;
        let h = self.header;
        let max_rows = h.max_rows();
        if h.live_rows + new > max_rows {
            return Err(TableError::Full {
                capacity: h.capacity,
                live: h.live_rows,
                new,
                max_rows,
                load: format::LOAD_NUM as f64 / format::LOAD_DEN as f64,
                suggest: format::capacity_for_rows(h.live_rows + new),
            });
        }
        let stats = match h.dtype {
            StorageDtype::F32 => self.write_rows_t::<f32>(keys, vals, op, &slots),
            StorageDtype::F16 => self.write_rows_t::<f16>(keys, vals, op, &slots),
            StorageDtype::Bf16 => self.write_rows_t::<bf16>(keys, vals, op, &slots),
        }?;
        Ok(stats)
    }

    fn parts_mut<T: Elem>(&mut self) -> TableResult<Parts<'_, T>> {
        let l = self.header.layout;
        let path = self.path.clone();
        let Mapping::Rw(map) = &mut self.map else { return Err(TableError::ReadOnly) };
        let bad = || TableError::from(FORMAT.layout(&path, "section outside the mapping"));
        let b: &mut [u8] = map;
        let (header, rest) = split_mut(b, l.index_offset as usize).ok_or_else(bad)?;
        let (index, rest) = split_mut(rest, l.index_len as usize).ok_or_else(bad)?;
        let rest = rest.get_mut((l.rows_offset - l.index_offset - l.index_len) as usize..).ok_or_else(bad)?;
        let (rows, rest) = split_mut(rest, l.rows_len as usize).ok_or_else(bad)?;
        let rest = rest.get_mut((l.state_offset - l.rows_offset - l.rows_len) as usize..).ok_or_else(bad)?;
        let state = rest.get_mut(..l.state_len as usize).ok_or_else(bad)?;
        Ok(Parts { header, index: cast_mut(&path, index)?, rows: cast_mut(&path, rows)?, state: cast_mut(&path, state)? })
    }

    /// `slots[n]`: the slot of `keys[n]` if it was present before this call (keys never
    /// move, so it stays valid while other keys are inserted), `usize::MAX` otherwise.
    fn write_rows_t<T: Elem>(&mut self, keys: &[u64], vals: &[f32], op: RowOp, slots: &[usize]) -> TableResult<UpdateStats> {
        // Strictly increasing keys (what the sparse exchange hands the leader) are distinct,
        // so their rows are disjoint and can be stepped in parallel with the same result.
        if keys.len() >= PAR_MIN_UPDATES && rayon::current_num_threads() > 1 && keys.windows(2).all(|w| w[0] < w[1]) {
            return self.write_rows_par::<T>(keys, vals, op, slots);
        }
        let mut h = self.header;
        let d = h.dim as usize;
        let mask = (h.capacity - 1) as usize;
        let shift = self.shift;
        let path = self.path.clone();
        let p = self.parts_mut::<T>()?;
        let mut w = vec![0f32; d];
        let mut stats = UpdateStats::default();
        for (n, (key, v)) in keys.iter().zip(vals.chunks_exact(d)).enumerate() {
            #[cfg(target_arch = "x86_64")]
            if let Some(&ahead) = slots.get(n + PREFETCH_AHEAD) {
                if ahead != usize::MAX {
                    let r = p.rows.as_ptr().wrapping_add(ahead * d) as *const i8;
                    // SAFETY: prefetch is a hint that never faults, whatever the address.
                    unsafe { std::arch::x86_64::_mm_prefetch(r, std::arch::x86_64::_MM_HINT_T0) };
                }
            }
            // The known slot, or find the key (inserted earlier in this list) or the empty
            // slot that ends its probe sequence.
            let mut found = match slots.get(n) {
                Some(&s) if s != usize::MAX && p.index.get(s) == Some(key) => Some((s, false)),
                _ => None,
            };
            if found.is_none() {
                let mut i = home_slot(*key, shift) & mask;
                for _ in 0..p.index.len() {
                    let k = p.index[i];
                    if k == *key || k == EMPTY_KEY {
                        found = Some((i, k == EMPTY_KEY));
                        break;
                    }
                    i = (i + 1) & mask;
                }
            }
            let Some((slot, insert)) = found else {
                return Err(TableError::CorruptIndex { path, detail: "no free slot although the load limit holds".into() });
            };
            let row = p.rows.get_mut(slot * d..slot * d + d).ok_or_else(|| TableError::from(FORMAT.layout(&path, "row outside the rows section")))?;
            if insert {
                p.index[slot] = *key;
                h.live_rows += 1;
                stats.inserted += 1;
                init::init_row::<T>(*key, h.seed, h.init_scale, &mut w);
                if let Some(a) = p.state.get_mut(slot) {
                    *a = h.adagrad_init;
                }
            } else {
                T::load(row, &mut w);
            }
            let acc = match (op, h.optimizer) {
                (RowOp::Step(_), OptimizerKind::Adagrad) => {
                    Some(p.state.get_mut(slot).ok_or_else(|| TableError::from(FORMAT.layout(&path, "state outside its section")))?)
                }
                _ => None,
            };
            step_row(&mut w, v, op, acc, h.adagrad_eps);
            T::store(&w, row);
            stats.updated += 1;
        }
        h.generation = h.generation.wrapping_add(1);
        stats.generation = h.generation;
        p.header[..HEADER_FIELDS].copy_from_slice(&h.encode());
        self.header = h;
        Ok(stats)
    }

    /// [`EmbeddingTable::write_rows_t`] for distinct keys: inserts the new keys sequentially in
    /// list order (so slots, and the file, are the same as the sequential path's), then steps
    /// every row in parallel, each row computed exactly as the sequential path computes it.
    fn write_rows_par<T: Elem>(&mut self, keys: &[u64], vals: &[f32], op: RowOp, slots: &[usize]) -> TableResult<UpdateStats> {
        use rayon::prelude::*;
        let mut h = self.header;
        let d = h.dim as usize;
        let mask = (h.capacity - 1) as usize;
        let shift = self.shift;
        let path = self.path.clone();
        let p = self.parts_mut::<T>()?;
        let mut slots = slots.to_vec();
        let mut inserted = vec![false; keys.len()];
        let mut stats = UpdateStats::default();
        // Pass 1 (sequential): insert absent keys in list order.
        for (n, key) in keys.iter().enumerate() {
            if slots[n] != usize::MAX && p.index.get(slots[n]) == Some(key) {
                continue;
            }
            let mut i = home_slot(*key, shift) & mask;
            let mut found = None;
            for _ in 0..p.index.len() {
                let k = p.index[i];
                if k == *key || k == EMPTY_KEY {
                    found = Some((i, k == EMPTY_KEY));
                    break;
                }
                i = (i + 1) & mask;
            }
            let Some((slot, insert)) = found else {
                return Err(TableError::CorruptIndex { path, detail: "no free slot although the load limit holds".into() });
            };
            if insert {
                p.index[slot] = *key;
                h.live_rows += 1;
                stats.inserted += 1;
                inserted[n] = true;
                if let Some(a) = p.state.get_mut(slot) {
                    *a = h.adagrad_init;
                }
            }
            slots[n] = slot;
        }
        let adagrad = matches!(op, RowOp::Step(_)) && h.optimizer == OptimizerKind::Adagrad;
        if slots.iter().any(|s| (s + 1) * d > p.rows.len() || (adagrad && *s >= p.state.len())) {
            return Err(TableError::from(FORMAT.layout(&path, "row or state outside its section")));
        }
        // Pass 2 (parallel): one optimizer step per row.
        struct Shared<T>(*mut T, *mut f32);
        // SAFETY: the pointers are only used for rows/states of distinct slots (below).
        unsafe impl<T> Sync for Shared<T> {}
        let shared = Shared(p.rows.as_mut_ptr(), p.state.as_mut_ptr());
        let shared = &shared;
        let (seed, scale, eps) = (h.seed, h.init_scale, h.adagrad_eps);
        (0..keys.len()).into_par_iter().with_min_len(256).for_each_init(
            || vec![0f32; d],
            |w, n| {
                let slot = slots[n];
                // SAFETY: keys are strictly increasing, hence distinct, hence their slots are
                // distinct: no two tasks touch the same row or state; bounds checked above.
                let row = unsafe { std::slice::from_raw_parts_mut(shared.0.add(slot * d), d) };
                if inserted[n] {
                    init::init_row::<T>(keys[n], seed, scale, w);
                } else {
                    T::load(row, w);
                }
                let v = &vals[n * d..(n + 1) * d];
                // SAFETY: as for the row; slot < state.len() checked above.
                let acc = adagrad.then(|| unsafe { &mut *shared.1.add(slot) });
                step_row(w, v, op, acc, eps);
                T::store(w, row);
            },
        );
        stats.updated = keys.len() as u64;
        h.generation = h.generation.wrapping_add(1);
        stats.generation = h.generation;
        p.header[..HEADER_FIELDS].copy_from_slice(&h.encode());
        self.header = h;
        Ok(stats)
    }

    /// Flushes the mapping to its file (only matters for tables on disk, not in /dev/shm).
    pub fn flush(&self) -> TableResult<()> {
        match &self.map {
            Mapping::Rw(m) => m.flush().map_err(|e| TableError::io(&self.path, "flush", e)),
            Mapping::Ro(_) => Ok(()),
        }
    }
}
