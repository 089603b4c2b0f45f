//! The on-disk (and in-`/dev/shm`) layout of a table: header encoding, section layout and
//! the validation that makes any file, however hostile, safe to map.
//!
//! See the [module docs](crate::embedding) for the byte layout. Everything here works on
//! byte slices; nothing indexes without a length check first, so arbitrary bytes give an
//! error, never a panic.

use std::path::Path;

use super::error::{TableError, TableResult};
pub use crate::header::HEADER_LEN;
use crate::hash::CHECKSUM_BLOCK;
use crate::header::{align_up, rd_u32, rd_u64, wr_u32, wr_u64, Format};

/// Bytes of the header that carry fields (the rest of the header page is zero).
pub const HEADER_FIELDS: usize = 256;
/// Offset of the checksum: FNV-1a 64 over bytes `0..CHECKSUM_AT`.
pub const CHECKSUM_AT: usize = 248;
/// Bit of the header's flags word: the sums section holds the block checksums of the body
/// (set by [`crate::embedding::EmbeddingTable::save`]; clear in a live table).
pub const FLAG_SUMS_VALID: u32 = 1;
/// Bit of the header's flags word: the table keeps a usage section (each row's last update
/// and update count), what expiry and LRU/LFU eviction read.
pub const FLAG_USAGE: u32 = 2;
/// Bit of the header's flags word: this live table was replaced by a larger copy (growth);
/// its readers must map the new one ([`crate::embedding::HostTable::sync`] does).
pub const FLAG_REPLACED: u32 = 4;
/// Every flag bit this build knows.
const KNOWN_FLAGS: u32 = FLAG_SUMS_VALID | FLAG_USAGE | FLAG_REPLACED;
/// The table file format (magic `RRTABLE`, version 3).
pub static FORMAT: Format = Format {
    magic: *b"RRTABLE\0",
    version: 3,
    header_len: HEADER_LEN,
    checksum_at: CHECKSUM_AT,
    noun: "embedding table",
    this: "a table of this shape",
    not_this: "check the path, a sparse-parameter file is loaded with `ringrec table import`",
    on_version: "export it with the ringrec that wrote it and import it here",
    restore: "restore it from a saved copy",
};
/// The index value of an empty slot; the one key a table cannot hold (defined with the
/// key hash, which never returns it).
pub use crate::data::criteo::EMPTY_KEY;
/// Largest embedding dimension accepted.
pub const MAX_DIM: u32 = 1 << 16;
/// Smallest capacity in slots.
pub const MIN_CAPACITY: u64 = 16;
/// Largest capacity in slots (2^36, 64 Gi slots).
pub const MAX_CAPACITY: u64 = 1 << 36;
/// Maximum load factor, as the fraction `LOAD_NUM / LOAD_DEN` (0.8).
pub const LOAD_NUM: u64 = 4;
/// See [`LOAD_NUM`].
pub const LOAD_DEN: u64 = 5;
/// High-water mark of a managed table, tenths of its capacity (0.7): an update that would
/// pass it first grows the table, or at its largest size evicts rows.
pub const HIGH_WATER_TENTHS: u64 = 7;
/// Where eviction brings a table at its largest size, tenths of its capacity (0.6): room
/// for many steps' new keys per eviction pass.
pub const LOW_WATER_TENTHS: u64 = 6;
/// Largest number of hashes (rows) of an admission sketch.
pub const MAX_SKETCH_DEPTH: u32 = 8;
/// Smallest width of an admission sketch (counters per row).
pub const MIN_SKETCH_WIDTH: u64 = 64;
/// Largest width of an admission sketch.
pub const MAX_SKETCH_WIDTH: u64 = 1 << 36;
/// Largest `--admit-after`: the sketch's counters are bytes.
pub const MAX_ADMIT_AFTER: u32 = 255;

/// `floor(capacity * num / den)` without overflow.
fn fraction(capacity: u64, num: u64, den: u64) -> u64 {
    capacity / den * num + capacity % den * num / den
}

/// Most rows a table of `capacity` slots may hold (`floor(0.8 * capacity)`).
pub fn max_rows(capacity: u64) -> u64 {
    fraction(capacity, LOAD_NUM, LOAD_DEN)
}

/// Rows a managed table of `capacity` slots holds before it grows or evicts
/// (`floor(0.7 * capacity)`).
pub fn high_water(capacity: u64) -> u64 {
    fraction(capacity, HIGH_WATER_TENTHS, 10)
}

/// Rows an eviction pass leaves room for in a table of `capacity` slots at its largest size
/// (`floor(0.6 * capacity)`, new keys of the update included).
pub fn low_water(capacity: u64) -> u64 {
    fraction(capacity, LOW_WATER_TENTHS, 10)
}

/// The smallest valid capacity (power of two, >= [`MIN_CAPACITY`]) that holds `rows` rows.
pub fn capacity_for_rows(rows: u64) -> u64 {
    let need = rows.saturating_mul(LOAD_DEN).div_ceil(LOAD_NUM).max(MIN_CAPACITY);
    let mut cap = need.checked_next_power_of_two().unwrap_or(MAX_CAPACITY);
    while max_rows(cap) < rows && cap < MAX_CAPACITY {
        cap *= 2;
    }
    cap
}

/// How rows are stored. Arithmetic is always f32; this is only the storage width.
///
/// The codes are part of the file format and independent of [`crate::dtype::DType`]'s wire
/// codes, so the two can evolve separately.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StorageDtype {
    /// IEEE binary32 (code 0).
    F32,
    /// IEEE binary16 (code 1), round-to-nearest-even on store.
    F16,
    /// bfloat16 (code 2), round-to-nearest-even on store.
    Bf16,
}

impl StorageDtype {
    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            StorageDtype::F32 => 4,
            StorageDtype::F16 | StorageDtype::Bf16 => 2,
        }
    }
    /// Its name on the command line and in `inspect`.
    pub fn name(self) -> &'static str {
        match self {
            StorageDtype::F32 => "f32",
            StorageDtype::F16 => "f16",
            StorageDtype::Bf16 => "bf16",
        }
    }
    /// Parses `f32`, `f16` or `bf16`.
    pub fn parse(s: &str) -> Option<StorageDtype> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" | "float" => Some(StorageDtype::F32),
            "f16" | "float16" | "half" => Some(StorageDtype::F16),
            "bf16" | "bfloat16" => Some(StorageDtype::Bf16),
            _ => None,
        }
    }
    /// Its code in the header.
    pub fn code(self) -> u32 {
        match self {
            StorageDtype::F32 => 0,
            StorageDtype::F16 => 1,
            StorageDtype::Bf16 => 2,
        }
    }
    /// Decodes a header code.
    pub fn from_code(c: u32) -> Option<StorageDtype> {
        [StorageDtype::F32, StorageDtype::F16, StorageDtype::Bf16].into_iter().find(|d| d.code() == c)
    }
}

impl std::str::FromStr for StorageDtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        StorageDtype::parse(s).ok_or_else(|| format!("unknown storage dtype {s:?}; use f32, f16 or bf16"))
    }
}

impl std::fmt::Display for StorageDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

crate::settings::word_enum!(StorageDtype, "storage dtype", "f32, f16, bf16");

/// The sparse optimizer whose state the table carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    /// Plain SGD: `w -= lr * g` (code 0, no state).
    Sgd,
    /// Row-wise Adagrad (code 1): one f32 accumulator per row,
    /// `acc += mean(g^2); w -= lr * g / (sqrt(acc) + eps)`.
    Adagrad,
}

crate::config::named_enum!(OptimizerKind { Sgd => "sgd", Adagrad => "adagrad" });

impl OptimizerKind {
    /// Its code in the header.
    pub fn code(self) -> u32 {
        match self {
            OptimizerKind::Sgd => 0,
            OptimizerKind::Adagrad => 1,
        }
    }
    /// Decodes a header code.
    pub fn from_code(c: u32) -> Option<OptimizerKind> {
        match c {
            0 => Some(OptimizerKind::Sgd),
            1 => Some(OptimizerKind::Adagrad),
            _ => None,
        }
    }
    /// Bytes of optimizer state per row.
    pub fn state_bytes_per_row(self) -> u64 {
        match self {
            OptimizerKind::Sgd => 0,
            OptimizerKind::Adagrad => 4,
        }
    }
}

/// Byte offsets and lengths of the sections of a table file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Layout {
    /// Start of the key index (`capacity` x u64).
    pub index_offset: u64,
    /// Its length.
    pub index_len: u64,
    /// Start of the rows (`capacity` x `dim` x dtype).
    pub rows_offset: u64,
    /// Their length.
    pub rows_len: u64,
    /// Start of the optimizer state (`capacity` x f32 for Adagrad, empty for SGD).
    pub state_offset: u64,
    /// Its length.
    pub state_len: u64,
    /// Start of the usage section (`capacity` x (u32 last update, u32 updates); empty when
    /// the table keeps no usage).
    pub usage_offset: u64,
    /// Its length.
    pub usage_len: u64,
    /// Start of the admission sketch (`depth` x `width` u8 counters; empty without admission).
    pub sketch_offset: u64,
    /// Its length.
    pub sketch_len: u64,
    /// Start of the block checksums; the body they cover is `[HEADER_LEN, sums_offset)`.
    pub sums_offset: u64,
    /// Their length: 4 bytes (a CRC-32) per [`CHECKSUM_BLOCK`] bytes of the body.
    pub sums_len: u64,
    /// Length of the whole file.
    pub file_len: u64,
}

/// Bytes of one slot's usage: u32 last update (the table's generation), u32 updates.
pub const USAGE_BYTES_PER_SLOT: u64 = 8;

/// What a table keeps besides its rows: the usage section and the admission sketch (their
/// sizes are part of the layout).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Extras {
    /// The table keeps each row's last update and update count (expiry, LRU/LFU eviction).
    pub usage: bool,
    /// Hashes (rows) of the admission sketch; 0 without admission.
    pub sketch_depth: u32,
    /// Counters per sketch row (a power of two); 0 without admission.
    pub sketch_width: u64,
}

impl Extras {
    /// Bytes of the sketch.
    pub fn sketch_bytes(&self) -> Option<u64> {
        (self.sketch_depth as u64).checked_mul(self.sketch_width)
    }
}

impl Layout {
    /// The one layout a table of this shape has; `None` on arithmetic overflow.
    pub fn compute(dim: u32, dtype: StorageDtype, capacity: u64, opt: OptimizerKind, extras: Extras) -> Option<Layout> {
        let index_offset = HEADER_LEN;
        let index_len = capacity.checked_mul(8)?;
        let rows_offset = align_up(index_offset.checked_add(index_len)?)?;
        let rows_len = capacity.checked_mul(dim as u64)?.checked_mul(dtype.size())?;
        let state_offset = align_up(rows_offset.checked_add(rows_len)?)?;
        let state_len = capacity.checked_mul(opt.state_bytes_per_row())?;
        let usage_offset = align_up(state_offset.checked_add(state_len)?)?;
        let usage_len = if extras.usage { capacity.checked_mul(USAGE_BYTES_PER_SLOT)? } else { 0 };
        let sketch_offset = align_up(usage_offset.checked_add(usage_len)?)?;
        let sketch_len = extras.sketch_bytes()?;
        let sums_offset = align_up(sketch_offset.checked_add(sketch_len)?)?;
        let sums_len = (sums_offset - index_offset).div_ceil(CHECKSUM_BLOCK as u64).checked_mul(4)?;
        let file_len = align_up(sums_offset.checked_add(sums_len)?)?;
        if file_len > isize::MAX as u64 {
            return None;
        }
        Some(Layout { index_offset, index_len, rows_offset, rows_len, state_offset, state_len, usage_offset, usage_len, sketch_offset, sketch_len, sums_offset, sums_len, file_len })
    }

    /// Every section in file order: (name, offset, length).
    pub fn sections(&self) -> [(&'static str, u64, u64); 6] {
        [
            ("index", self.index_offset, self.index_len),
            ("rows", self.rows_offset, self.rows_len),
            ("state", self.state_offset, self.state_len),
            ("usage", self.usage_offset, self.usage_len),
            ("sketch", self.sketch_offset, self.sketch_len),
            ("sums", self.sums_offset, self.sums_len),
        ]
    }

    /// The bytes the block checksums cover: index, rows, state, usage, sketch and their
    /// padding.
    pub fn body(&self) -> std::ops::Range<u64> {
        self.index_offset..self.sums_offset
    }

    /// The sections that bytes `[start, end)` of the body belong to (each section with the
    /// padding after it), as in an error message: `"index"`, `"rows and state"`.
    pub fn sections_of(&self, start: u64, end: u64) -> String {
        let named = self.sections();
        let body = named.windows(2).map(|w| (w[0].0, w[0].1, w[1].1));
        let hit: Vec<&str> = body.filter(|(_, a, b)| start < *b && *a < end).map(|(n, _, _)| n).collect();
        match hit.as_slice() {
            [] => "body".into(),
            [one] => (*one).into(),
            [init @ .., last] => format!("{} and {last}", init.join(", ")),
        }
    }
}

/// The decoded header of a table.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Header {
    /// Values per row.
    pub dim: u32,
    /// Storage type of the rows.
    pub dtype: StorageDtype,
    /// Optimizer whose state the file holds.
    pub optimizer: OptimizerKind,
    /// Slots in the index (a power of two).
    pub capacity: u64,
    /// Occupied slots.
    pub live_rows: u64,
    /// Incremented by every `apply_updates`/`put_rows` batch.
    pub generation: u64,
    /// Seed of the initial rows of unseen keys.
    pub seed: u64,
    /// Initial rows are uniform in `[-init_scale, init_scale]`.
    pub init_scale: f32,
    /// Adagrad's epsilon.
    pub adagrad_eps: f32,
    /// Adagrad's initial accumulator.
    pub adagrad_init: f32,
    /// Whether the sums section holds the checksums of the body (a saved table); clear in a
    /// live table, whose body changes every step.
    pub sums_valid: bool,
    /// CRC-32 of the sums section itself (0 while `sums_valid` is clear).
    pub sums_crc: u32,
    /// A live table replaced by a larger copy (growth): readers map the new one.
    pub replaced: bool,
    /// The usage section and the admission sketch.
    pub extras: Extras,
    /// A new key gets a row once it was in this many update batches (1: at once).
    pub admit_after: u32,
    /// What happened to rows over the table's life.
    pub counts: RowCounts,
    /// Section offsets.
    pub layout: Layout,
}

/// What happened to a table's rows over its life (header fields; a grown or loaded copy
/// carries them on).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RowCounts {
    /// Rows inserted (keys admitted).
    pub inserted: u64,
    /// Rows removed by eviction (the table at its largest size).
    pub evicted: u64,
    /// Rows removed by expiry (not updated for `--expire-after-steps` updates).
    pub expired: u64,
    /// Gradient rows of keys without a row that were dropped: not admitted yet
    /// (`--admit-after`), or no room left at the largest size.
    pub refused: u64,
    /// Times the table was rebuilt at a larger capacity.
    pub growths: u64,
}

impl RowCounts {
    /// `self - earlier`, field by field (what happened since `earlier`).
    pub fn since(&self, earlier: &RowCounts) -> RowCounts {
        RowCounts {
            inserted: self.inserted.wrapping_sub(earlier.inserted),
            evicted: self.evicted.wrapping_sub(earlier.evicted),
            expired: self.expired.wrapping_sub(earlier.expired),
            refused: self.refused.wrapping_sub(earlier.refused),
            growths: self.growths.wrapping_sub(earlier.growths),
        }
    }
}


impl Header {
    /// Encodes the header fields and their checksum (bytes `0..HEADER_FIELDS`).
    pub fn encode(&self) -> [u8; HEADER_FIELDS] {
        let mut b = [0u8; HEADER_FIELDS];
        wr_u32(&mut b, 16, self.dim);
        wr_u32(&mut b, 20, self.dtype.code());
        wr_u32(&mut b, 24, self.optimizer.code());
        wr_u32(&mut b, 28, self.flags());
        wr_u64(&mut b, 32, self.capacity);
        wr_u64(&mut b, 40, self.live_rows);
        wr_u64(&mut b, 48, self.generation);
        wr_u64(&mut b, 56, self.seed);
        wr_u32(&mut b, 64, self.init_scale.to_bits());
        wr_u32(&mut b, 68, self.adagrad_eps.to_bits());
        wr_u32(&mut b, 72, self.adagrad_init.to_bits());
        wr_u32(&mut b, 76, self.sums_crc);
        let l = &self.layout;
        for (i, v) in [l.index_offset, l.index_len, l.rows_offset, l.rows_len, l.state_offset, l.state_len, l.file_len, l.sums_offset, l.sums_len].into_iter().enumerate() {
            wr_u64(&mut b, 80 + 8 * i, v);
        }
        for (i, v) in [l.usage_offset, l.usage_len, l.sketch_offset, l.sketch_len].into_iter().enumerate() {
            wr_u64(&mut b, 152 + 8 * i, v);
        }
        wr_u32(&mut b, 184, self.admit_after);
        wr_u32(&mut b, 188, self.extras.sketch_depth);
        wr_u64(&mut b, 192, self.extras.sketch_width);
        let c = &self.counts;
        for (i, v) in [c.inserted, c.evicted, c.expired, c.refused, c.growths].into_iter().enumerate() {
            wr_u64(&mut b, 200 + 8 * i, v);
        }
        FORMAT.seal(&mut b);
        b
    }

    /// The flags word.
    fn flags(&self) -> u32 {
        let bit = |on: bool, f: u32| if on { f } else { 0 };
        bit(self.sums_valid, FLAG_SUMS_VALID) | bit(self.extras.usage, FLAG_USAGE) | bit(self.replaced, FLAG_REPLACED)
    }

    /// Rows this table holds before it grows or evicts (see [`high_water`]).
    pub fn high_water(&self) -> u64 {
        high_water(self.capacity)
    }

    /// Most rows this table may hold.
    pub fn max_rows(&self) -> u64 {
        max_rows(self.capacity)
    }

    /// Bytes of one stored row.
    pub fn row_bytes(&self) -> u64 {
        self.dim as u64 * self.dtype.size()
    }

    /// Decodes and validates a header. `bytes` is (a prefix of) the file, `file_len` the
    /// file's real length. Checks the frame ([`Format::check`]), then the field values
    /// (BadHeader) and the section layout (BadLayout / Truncated).
    pub fn parse(path: &Path, bytes: &[u8], file_len: u64) -> TableResult<Header> {
        FORMAT.check(path, bytes, file_len)?;
        let bad = |field: &'static str, detail: String| TableError::from(FORMAT.bad(path, field, detail));
        let dim = rd_u32(bytes, 16);
        if dim == 0 || dim > MAX_DIM {
            return Err(bad("dim", format!("{dim}, expected 1..={MAX_DIM}")));
        }
        let dtype = StorageDtype::from_code(rd_u32(bytes, 20)).ok_or_else(|| bad("dtype", format!("unknown code {}", rd_u32(bytes, 20))))?;
        let optimizer =
            OptimizerKind::from_code(rd_u32(bytes, 24)).ok_or_else(|| bad("optimizer", format!("unknown code {}", rd_u32(bytes, 24))))?;
        let flags = rd_u32(bytes, 28);
        if flags & !KNOWN_FLAGS != 0 {
            return Err(bad("flags", format!("{flags:#x}, only bits 0 (checksums valid), 1 (usage kept) and 2 (replaced) are defined")));
        }
        let sums_valid = flags & FLAG_SUMS_VALID != 0;
        let replaced = flags & FLAG_REPLACED != 0;
        let sums_crc = rd_u32(bytes, 76);
        if !sums_valid && sums_crc != 0 {
            return Err(bad("sums_crc", format!("{sums_crc:#010x} while the checksums are marked invalid (expected 0)")));
        }
        let capacity = rd_u64(bytes, 32);
        if !capacity.is_power_of_two() || !(MIN_CAPACITY..=MAX_CAPACITY).contains(&capacity) {
            return Err(bad("capacity", format!("{capacity}, expected a power of two in {MIN_CAPACITY}..={MAX_CAPACITY}")));
        }
        let live_rows = rd_u64(bytes, 40);
        if live_rows > max_rows(capacity) {
            return Err(bad("live_rows", format!("{live_rows} exceeds the load limit {} of {capacity} slots", max_rows(capacity))));
        }
        let generation = rd_u64(bytes, 48);
        let seed = rd_u64(bytes, 56);
        let init_scale = f32::from_bits(rd_u32(bytes, 64));
        if !(init_scale.is_finite() && init_scale >= 0.0) {
            return Err(bad("init_scale", format!("{init_scale}, expected a finite value >= 0")));
        }
        let adagrad_eps = f32::from_bits(rd_u32(bytes, 68));
        if !(adagrad_eps.is_finite() && adagrad_eps > 0.0) {
            return Err(bad("adagrad_eps", format!("{adagrad_eps}, expected a finite value > 0")));
        }
        let adagrad_init = f32::from_bits(rd_u32(bytes, 72));
        if !(adagrad_init.is_finite() && adagrad_init >= 0.0) {
            return Err(bad("adagrad_init", format!("{adagrad_init}, expected a finite value >= 0")));
        }
        let admit_after = rd_u32(bytes, 184);
        if !(1..=MAX_ADMIT_AFTER).contains(&admit_after) {
            return Err(bad("admit_after", format!("{admit_after}, expected 1..={MAX_ADMIT_AFTER}")));
        }
        let extras = Extras { usage: flags & FLAG_USAGE != 0, sketch_depth: rd_u32(bytes, 188), sketch_width: rd_u64(bytes, 192) };
        check_sketch(extras.sketch_depth, extras.sketch_width, admit_after).map_err(|d| bad("sketch", d))?;
        let f = |i: usize| rd_u64(bytes, 80 + 8 * i);
        let stored_layout = Layout {
            index_offset: f(0),
            index_len: f(1),
            rows_offset: f(2),
            rows_len: f(3),
            state_offset: f(4),
            state_len: f(5),
            file_len: f(6),
            sums_offset: f(7),
            sums_len: f(8),
            usage_offset: f(9),
            usage_len: f(10),
            sketch_offset: f(11),
            sketch_len: f(12),
        };
        let layout = check_layout(path, &stored_layout, dim, dtype, capacity, optimizer, extras, file_len)?;
        let c = |i: usize| rd_u64(bytes, 200 + 8 * i);
        let counts = RowCounts { inserted: c(0), evicted: c(1), expired: c(2), refused: c(3), growths: c(4) };
        Ok(Header {
            dim,
            dtype,
            optimizer,
            capacity,
            live_rows,
            generation,
            seed,
            init_scale,
            adagrad_eps,
            adagrad_init,
            sums_valid,
            sums_crc,
            replaced,
            extras,
            admit_after,
            counts,
            layout,
        })
    }
}

/// A sketch shape is valid: none (depth and width 0) exactly when every key is admitted at
/// once (`admit_after` 1); else 1..=[`MAX_SKETCH_DEPTH`] rows of a power-of-two width.
pub fn check_sketch(depth: u32, width: u64, admit_after: u32) -> Result<(), String> {
    match (admit_after, depth, width) {
        (1, 0, 0) => Ok(()),
        (1, _, _) => Err(format!("depth {depth} x width {width}, but admit_after 1 keeps no sketch")),
        (_, 1..=MAX_SKETCH_DEPTH, w) if w.is_power_of_two() && (MIN_SKETCH_WIDTH..=MAX_SKETCH_WIDTH).contains(&w) => Ok(()),
        _ => Err(format!("depth {depth} x width {width}, expected 1..={MAX_SKETCH_DEPTH} rows of a power of two in {MIN_SKETCH_WIDTH}..={MAX_SKETCH_WIDTH}")),
    }
}

/// Every section must lie inside the file and sit exactly where a table of this shape puts
/// it; the stored file length must be the real one.
#[allow(clippy::too_many_arguments)]
fn check_layout(path: &Path, s: &Layout, dim: u32, dtype: StorageDtype, capacity: u64, opt: OptimizerKind, extras: Extras, file_len: u64) -> TableResult<Layout> {
    let bad = |detail: String| TableError::from(FORMAT.layout(path, detail));
    for (name, off, len) in s.sections() {
        match off.checked_add(len) {
            Some(end) if end <= s.file_len => {}
            _ => return Err(bad(format!("{name} section [{off}, +{len}) ends past the recorded file length {}", s.file_len))),
        }
    }
    let want = Layout::compute(dim, dtype, capacity, opt, extras)
        .ok_or_else(|| bad(format!("a table of {capacity} slots x dim {dim} does not fit in the address space")))?;
    if *s != want {
        return Err(bad(format!("sections {s:?} differ from the layout of a {capacity}-slot dim-{dim} {dtype} {opt} table {want:?}")));
    }
    if file_len < want.file_len {
        return Err(FORMAT.truncated(path, file_len, want.file_len).into());
    }
    if file_len > want.file_len {
        return Err(bad(format!("file is {file_len} bytes, the header says {}", want.file_len)));
    }
    Ok(want)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_limit_is_four_fifths() {
        assert_eq!(max_rows(16), 12);
        assert_eq!(max_rows(1 << 20), 838_860);
        assert_eq!(capacity_for_rows(0), MIN_CAPACITY);
        assert_eq!(capacity_for_rows(838_860), 1 << 20);
        assert_eq!(capacity_for_rows(838_861), 1 << 21);
        assert_eq!((high_water(1024), low_water(1024)), (716, 614));
        assert_eq!((high_water(16), low_water(16)), (11, 9));
        assert_eq!(high_water(1 << 36), (1u64 << 36) / 10 * 7 + (1u64 << 36) % 10 * 7 / 10);
    }

    #[test]
    fn header_round_trips() {
        let layout = Layout::compute(16, StorageDtype::Bf16, 1024, OptimizerKind::Adagrad, Extras::default()).unwrap();
        assert_eq!(layout.index_offset, 4096);
        assert_eq!(layout.rows_offset, 4096 + 8192);
        assert_eq!(layout.state_offset, 4096 + 8192 + 32768);
        // Body [4096, 49152 + 4096): one 1 MiB block, one CRC-32, one page.
        assert_eq!((layout.sums_offset, layout.sums_len, layout.file_len), (4096 + 8192 + 32768 + 4096, 4, 4096 + 8192 + 32768 + 4096 + 4096));
        assert_eq!(layout.sections_of(4096, 4096 + 8192 + 1), "index and rows");
        assert_eq!(layout.sections_of(4096, layout.sums_offset), "index, rows and state");
        assert_eq!(layout.sections_of(layout.state_offset + 5, layout.state_offset + 6), "state");
        // 3 GiB of body: three thousand and seventy-two CRC-32s, still one page.
        let big = Layout::compute(16, StorageDtype::F32, 1 << 24, OptimizerKind::Adagrad, Extras::default()).unwrap();
        let body = big.sums_offset - 4096;
        assert_eq!(body, (1 << 27) + (1 << 30) + (1 << 26));
        assert_eq!(big.sums_len, body.div_ceil(1 << 20) * 4);
        assert_eq!(big.file_len, big.sums_offset + 8192);
        let h = Header {
            dim: 16,
            dtype: StorageDtype::Bf16,
            optimizer: OptimizerKind::Adagrad,
            capacity: 1024,
            live_rows: 7,
            generation: 3,
            seed: 42,
            init_scale: 0.25,
            adagrad_eps: 1e-8,
            adagrad_init: 0.0,
            sums_valid: true,
            sums_crc: 0xdead_beef,
            replaced: false,
            extras: Extras::default(),
            admit_after: 1,
            counts: RowCounts { inserted: 9, evicted: 1, expired: 1, refused: 4, growths: 2 },
            layout,
        };
        let b = h.encode();
        assert_eq!(super::rd_u32(&b, 28), FLAG_SUMS_VALID);
        assert_eq!(super::rd_u64(&b, 136), layout.sums_offset);
        assert_eq!(super::rd_u64(&b, 232), 2, "growths");
        assert_eq!(Header::parse(Path::new("x"), &b, layout.file_len).unwrap(), h);
        // A live table: flag clear, and then a stray sums CRC is an error.
        let live = Header { sums_valid: false, sums_crc: 0, ..h };
        assert_eq!(Header::parse(Path::new("x"), &live.encode(), layout.file_len).unwrap(), live);
        let stray = Header { sums_valid: false, ..h }.encode();
        let e = Header::parse(Path::new("x"), &stray, layout.file_len).unwrap_err();
        assert!(e.to_string().contains("sums_crc"), "{e}");
        // Usage and a sketch: two more sections between the state and the sums.
        let extras = Extras { usage: true, sketch_depth: 4, sketch_width: 1024 };
        let l = Layout::compute(16, StorageDtype::Bf16, 1024, OptimizerKind::Adagrad, extras).unwrap();
        assert_eq!((l.usage_offset, l.usage_len), (layout.sums_offset, 8192));
        assert_eq!((l.sketch_offset, l.sketch_len), (l.usage_offset + 8192, 4096));
        assert_eq!(l.sums_offset, l.sketch_offset + 4096);
        assert_eq!(l.sections_of(l.usage_offset, l.sketch_offset + 1), "usage and sketch");
        let u = Header { extras, admit_after: 3, replaced: true, sums_valid: false, sums_crc: 0, layout: l, ..h };
        let b = u.encode();
        assert_eq!(super::rd_u32(&b, 28), FLAG_USAGE | FLAG_REPLACED);
        assert_eq!(Header::parse(Path::new("x"), &b, l.file_len).unwrap(), u);
        // A sketch without admission, or admission without a sketch, is not a table.
        for (k, d, w) in [(1, 4, 1024), (3, 0, 0), (3, 4, 1000), (3, 9, 1024), (0, 0, 0), (256, 4, 1024)] {
            let x = Header { admit_after: k, extras: Extras { sketch_depth: d, sketch_width: w, ..extras }, ..u };
            let e = Header::parse(Path::new("x"), &x.encode(), l.file_len).unwrap_err();
            assert!(matches!(e, TableError::Format(crate::header::FormatError::BadHeader { .. })), "{k} {d} {w}: {e}");
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        for sums_valid in [false, true] {
            let valid = Header {
            dim: 4,
            dtype: StorageDtype::F32,
            optimizer: OptimizerKind::Sgd,
            capacity: 16,
            live_rows: 0,
            generation: 0,
            seed: 1,
            init_scale: 0.5,
            adagrad_eps: 1e-8,
            adagrad_init: 0.0,
            sums_valid,
            sums_crc: if sums_valid { 0x1234_5678 } else { 0 },
            replaced: false,
            extras: Extras { usage: sums_valid, sketch_depth: 2, sketch_width: 64 },
            admit_after: 2,
            counts: RowCounts::default(),
            layout: Layout::compute(4, StorageDtype::F32, 16, OptimizerKind::Sgd, Extras { usage: sums_valid, sketch_depth: 2, sketch_width: 64 }).unwrap(),
        }
        .encode();
            crate::header::fuzz_headers(&FORMAT, &valid, 50_000, |b, len| {
                let _ = Header::parse(Path::new("fuzz"), b, len);
            });
        }
    }
}
