//! The binary sparse-parameter file (what the host leader imports, design 003 step 1), the
//! TSV export, and atomic file writes.
//!
//! Sparse-parameter file (version 2), little-endian:
//! ```text
//! offset            size  field
//! 0                 8     magic "RRSPARAM"
//! 8                 4     version (2)
//! 12                4     dim (1..=65536)
//! 16                8     count (records)
//! 24                ...   count records of { key: u64, values: dim x f32 }
//! 24 + count * rec  4     CRC-32 of every byte before it (IEEE, zlib's: Python's zlib.crc32)
//! ```
//! The file length must be exactly `28 + count * (8 + 4 * dim)`. Keys are in any order; a
//! key given twice takes its last record; the key `u64::MAX` is refused. Export writes keys
//! in ascending order. Importing checks the length first, then the CRC over the whole file
//! before a single row is written (a damaged file names itself and changes nothing), and
//! again while reading the records (a file changed in between is refused too). Version 1
//! (no CRC) is refused: write the trailer (or export again with this ringrec).

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

use super::error::{TableError, TableResult};
use super::format::{self, EMPTY_KEY};
use super::table::{EmbeddingTable, TableConfig};
use crate::hash::Crc32;

/// First 8 bytes of a sparse-parameter file.
pub const PARAMS_MAGIC: [u8; 8] = *b"RRSPARAM";
/// Sparse-parameter file version.
pub const PARAMS_VERSION: u32 = 2;
/// Bytes before the first record.
pub const PARAMS_HEADER_LEN: u64 = 24;
/// Bytes after the last record: the CRC-32.
pub const PARAMS_TRAILER_LEN: u64 = 4;
/// Records per `put_rows` batch while importing.
const IMPORT_BATCH: usize = 64 * 1024;

/// The header of a sparse-parameter file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamsHeader {
    /// Values per record.
    pub dim: u32,
    /// Records.
    pub count: u64,
}

impl ParamsHeader {
    /// Bytes of one record.
    pub fn record_bytes(&self) -> u64 {
        8 + 4 * self.dim as u64
    }

    /// The header's bytes.
    fn encode(&self) -> [u8; PARAMS_HEADER_LEN as usize] {
        let mut h = [0u8; PARAMS_HEADER_LEN as usize];
        h[..8].copy_from_slice(&PARAMS_MAGIC);
        h[8..12].copy_from_slice(&PARAMS_VERSION.to_le_bytes());
        h[12..16].copy_from_slice(&self.dim.to_le_bytes());
        h[16..24].copy_from_slice(&self.count.to_le_bytes());
        h
    }

    /// The length of a file with this header, if it fits in a u64.
    fn file_len(&self) -> Option<u64> {
        self.count.checked_mul(self.record_bytes())?.checked_add(PARAMS_HEADER_LEN + PARAMS_TRAILER_LEN)
    }
}

/// Opens a sparse-parameter file and validates its header against its length (not the
/// CRC: [`EmbeddingTable::load_params`] checks that). The reader is at the first record.
pub fn read_params_header(path: &Path) -> TableResult<(ParamsHeader, BufReader<File>)> {
    let bad = |detail: String| TableError::BadParams { path: path.to_path_buf(), detail };
    let file = File::open(path).map_err(|e| TableError::io(path, "open", e))?;
    let len = file.metadata().map_err(|e| TableError::io(path, "stat", e))?.len();
    let mut r = BufReader::with_capacity(1 << 20, file);
    if len < PARAMS_HEADER_LEN {
        return Err(bad(format!("{len} bytes, shorter than the {PARAMS_HEADER_LEN}-byte header")));
    }
    let mut h = [0u8; PARAMS_HEADER_LEN as usize];
    r.read_exact(&mut h).map_err(|e| TableError::io(path, "read", e))?;
    if h[..8] != PARAMS_MAGIC {
        return Err(bad(format!("magic {:02x?}, expected \"RRSPARAM\" (is it a table file? open those with `ringrec table inspect`)", &h[..8])));
    }
    let word = |a: usize| u32::from_le_bytes([h[a], h[a + 1], h[a + 2], h[a + 3]]);
    let version = word(8);
    if version == 1 {
        return Err(bad(format!("version 1 has no checksum, this build reads version {PARAMS_VERSION}: append the CRC-32 of the file (zlib's) and set the version to 2, or export it again with this ringrec")));
    }
    if version != PARAMS_VERSION {
        return Err(bad(format!("version {version}, this build reads version {PARAMS_VERSION}")));
    }
    let dim = word(12);
    if dim == 0 || dim > format::MAX_DIM {
        return Err(bad(format!("dim {dim}, expected 1..={}", format::MAX_DIM)));
    }
    let mut c = [0u8; 8];
    c.copy_from_slice(&h[16..24]);
    let ph = ParamsHeader { dim, count: u64::from_le_bytes(c) };
    let want = ph.file_len();
    if want != Some(len) {
        return Err(bad(format!(
            "{len} bytes, but {} records of dim {dim} and the checksum need {}; the file is truncated or its header is damaged",
            ph.count,
            want.map_or("more than 2^64".to_string(), |w| w.to_string())
        )));
    }
    Ok((ph, r))
}

/// The CRC-32 `r` computes over the rest of a file of `ph`'s length after the header (and
/// the header itself), and the CRC stored at its end.
fn params_sums(path: &Path, ph: &ParamsHeader, r: &mut impl Read) -> TableResult<(u32, u32)> {
    let mut crc = Crc32::new();
    crc.update(&ph.encode());
    let mut left = ph.count * ph.record_bytes();
    let mut buf = vec![0u8; 1 << 20];
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        r.read_exact(&mut buf[..n]).map_err(|e| TableError::io(path, "read", e))?;
        crc.update(&buf[..n]);
        left -= n as u64;
    }
    Ok((crc.finish(), read_trailer(path, r)?))
}

/// The CRC stored after the last record.
fn read_trailer(path: &Path, r: &mut impl Read) -> TableResult<u32> {
    let mut t = [0u8; PARAMS_TRAILER_LEN as usize];
    r.read_exact(&mut t).map_err(|e| TableError::io(path, "read", e))?;
    Ok(u32::from_le_bytes(t))
}

/// The error of a CRC mismatch.
fn damaged(path: &Path, computed: u32, stored: u32, when: &str) -> TableError {
    TableError::BadParams {
        path: path.to_path_buf(),
        detail: format!(
            "checksum mismatch{when}: the header and records have CRC-32 {computed:#010x}, the file records {stored:#010x}; the file was damaged after it was written, export it again or restore it from a saved copy"
        ),
    }
}

/// Writes the sparse-parameter frame around the records handed to [`ParamsWriter::record`],
/// with their CRC-32.
struct ParamsWriter<'a, W: Write> {
    w: &'a mut W,
    crc: Crc32,
    left: u64,
    rec: Vec<u8>,
}

impl<'a, W: Write> ParamsWriter<'a, W> {
    /// Writes the header of `count` records of `dim` values.
    fn start(w: &'a mut W, dim: u32, count: u64) -> std::io::Result<Self> {
        let h = ParamsHeader { dim, count }.encode();
        let mut crc = Crc32::new();
        crc.update(&h);
        w.write_all(&h)?;
        Ok(ParamsWriter { w, crc, left: count, rec: Vec::with_capacity(8 + 4 * dim as usize) })
    }

    /// Writes one record.
    fn record(&mut self, key: u64, row: &[f32]) -> std::io::Result<()> {
        self.left = self.left.checked_sub(1).ok_or_else(|| std::io::Error::other("more records than the header announces"))?;
        self.rec.clear();
        self.rec.extend_from_slice(&key.to_le_bytes());
        row.iter().for_each(|x| self.rec.extend_from_slice(&x.to_le_bytes()));
        self.crc.update(&self.rec);
        self.w.write_all(&self.rec)
    }

    /// Writes the CRC after the last record.
    fn finish(self) -> std::io::Result<()> {
        if self.left != 0 {
            return Err(std::io::Error::other(format!("{} records fewer than the header announces", self.left)));
        }
        self.w.write_all(&self.crc.finish().to_le_bytes())
    }
}

/// Writes `path` atomically (mode 0600, [`crate::fileio::write_atomic`]).
pub fn write_atomic(path: &Path, fill: impl FnOnce(&mut BufWriter<&File>) -> std::io::Result<()>) -> TableResult<()> {
    Ok(crate::fileio::write_atomic(path, 0o600, fill)?)
}

impl EmbeddingTable {
    /// Creates a fresh table at `table_path` from `cfg` and fills it from the sparse-parameter
    /// file `params`. `cfg.dim` must equal the file's dim; the capacity must hold its records.
    /// On any error the new table file is removed.
    pub fn import_params(params: &Path, table_path: &Path, cfg: &TableConfig) -> TableResult<EmbeddingTable> {
        let (ph, _) = read_params_header(params)?;
        if ph.dim != cfg.dim {
            return Err(TableError::Config(format!("{} has dim {}, the table is configured with dim {}; pass --dim {}", params.display(), ph.dim, cfg.dim, ph.dim)));
        }
        let mut t = EmbeddingTable::create(table_path, cfg)?;
        match t.load_params(params) {
            Ok(_) => Ok(t),
            Err(e) => {
                drop(t);
                let _ = std::fs::remove_file(table_path);
                Err(e)
            }
        }
    }

    /// Inserts (or overwrites) every record of the sparse-parameter file `params` into this
    /// writable table, in batches. The file's shape and its CRC are checked before anything
    /// is written (a damaged file is a [`TableError::BadParams`] naming it); a batch that
    /// would exceed the load limit fails with [`TableError::Full`] (earlier batches stay
    /// written). Returns the number of records read.
    pub fn load_params(&mut self, params: &Path) -> TableResult<u64> {
        let (ph, mut r) = read_params_header(params)?;
        if ph.dim as usize != self.dim() {
            return Err(TableError::BadParams { path: params.to_path_buf(), detail: format!("dim {}, the table has dim {}", ph.dim, self.dim()) });
        }
        if !self.is_writable() {
            return Err(TableError::ReadOnly);
        }
        let (computed, stored) = params_sums(params, &ph, &mut read_params_header(params)?.1)?;
        if computed != stored {
            return Err(damaged(params, computed, stored, ""));
        }
        let mut crc = Crc32::new();
        crc.update(&ph.encode());
        let d = ph.dim as usize;
        let mut rec = vec![0u8; ph.record_bytes() as usize];
        let mut keys = Vec::with_capacity(IMPORT_BATCH);
        let mut vals = Vec::with_capacity(IMPORT_BATCH * d);
        let mut left = ph.count;
        while left > 0 {
            keys.clear();
            vals.clear();
            while left > 0 && keys.len() < IMPORT_BATCH {
                r.read_exact(&mut rec).map_err(|e| TableError::io(params, "read", e))?;
                crc.update(&rec);
                let mut k = [0u8; 8];
                k.copy_from_slice(&rec[..8]);
                let key = u64::from_le_bytes(k);
                if key == EMPTY_KEY {
                    return Err(TableError::BadParams { path: params.to_path_buf(), detail: format!("record {} has the reserved key {key:#x}", ph.count - left) });
                }
                keys.push(key);
                vals.extend(rec[8..].chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])));
                left -= 1;
            }
            self.put_rows(&keys, &vals)?;
        }
        let (computed, stored) = (crc.finish(), read_trailer(params, &mut r)?);
        if computed != stored {
            return Err(damaged(params, computed, stored, " (the file changed while it was imported; rows already written stay)"));
        }
        Ok(ph.count)
    }

    /// Writes every row (keys ascending, values widened to f32) as a sparse-parameter file,
    /// atomically. Returns the number of records.
    pub fn export_params(&self, path: &Path) -> TableResult<u64> {
        let live = self.live_keys();
        let d = self.dim();
        write_atomic(path, |w| {
            let mut pw = ParamsWriter::start(w, d as u32, live.len() as u64)?;
            self.for_each_row(&live, |k, row| pw.record(k, row))?;
            pw.finish()
        })?;
        Ok(live.len() as u64)
    }

    /// Writes every row as TSV, `key<TAB>v0<TAB>v1...`, keys ascending. Values print in
    /// Rust's shortest round-trip form, so parsing them back gives the same f32 bits.
    pub fn write_tsv<W: Write>(&self, w: &mut W) -> std::io::Result<u64> {
        let live = self.live_keys();
        self.for_each_row(&live, |k, row| {
            write!(w, "{k}")?;
            for x in row {
                write!(w, "\t{x}")?;
            }
            writeln!(w)
        })?;
        Ok(live.len() as u64)
    }

    /// [`EmbeddingTable::write_tsv`] into `path`, atomically.
    pub fn export_tsv(&self, path: &Path) -> TableResult<u64> {
        let mut n = 0;
        write_atomic(path, |w| {
            n = self.write_tsv(w)?;
            Ok(())
        })?;
        Ok(n)
    }

    fn for_each_row(&self, live: &[(u64, usize)], mut f: impl FnMut(u64, &[f32]) -> std::io::Result<()>) -> std::io::Result<()> {
        let d = self.dim();
        let mut buf = vec![0f32; d * 1024];
        for chunk in live.chunks(1024) {
            let keys: Vec<u64> = chunk.iter().map(|(k, _)| *k).collect();
            let out = &mut buf[..keys.len() * d];
            self.lookup(&keys, out).map_err(std::io::Error::other)?;
            for (k, row) in keys.iter().zip(out.chunks_exact(d)) {
                f(*k, row)?;
            }
        }
        Ok(())
    }
}

/// Writes a sparse-parameter file (version 2, with its CRC) from `(key, row)` pairs (used by
/// tests and benchmarks).
pub fn write_params(path: &Path, dim: u32, keys: &[u64], values: &[f32]) -> TableResult<()> {
    if values.len() != keys.len() * dim as usize {
        return Err(TableError::Shape { what: "parameter values", keys: keys.len(), dim: dim as usize, expected: keys.len() * dim as usize, got: values.len() });
    }
    write_atomic(path, |w| {
        let mut pw = ParamsWriter::start(w, dim, keys.len() as u64)?;
        for (k, row) in keys.iter().zip(values.chunks_exact(dim.max(1) as usize)) {
            pw.record(*k, row)?;
        }
        pw.finish()
    })
}
