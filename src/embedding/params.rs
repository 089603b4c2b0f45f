//! The binary sparse-parameter file (what the host leader imports, design 003 step 1), the
//! TSV export, and atomic file writes.
//!
//! Sparse-parameter file, little-endian:
//! ```text
//! offset  size  field
//! 0       8     magic "RRSPARAM"
//! 8       4     version (1)
//! 12      4     dim
//! 16      8     count (records)
//! 24      ...   count records of { key: u64, values: dim x f32 }
//! ```
//! The file length must be exactly `24 + count * (8 + 4 * dim)`. Keys are in any order; a
//! key given twice takes its last record. Export writes keys in ascending order.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

use super::error::{TableError, TableResult};
use super::format::{self, EMPTY_KEY};
use super::table::{EmbeddingTable, TableConfig};

/// First 8 bytes of a sparse-parameter file.
pub const PARAMS_MAGIC: [u8; 8] = *b"RRSPARAM";
/// Sparse-parameter file version.
pub const PARAMS_VERSION: u32 = 1;
/// Bytes before the first record.
pub const PARAMS_HEADER_LEN: u64 = 24;
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
}

/// Opens a sparse-parameter file and validates its header against its length.
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
    let want = ph.count.checked_mul(ph.record_bytes()).and_then(|b| b.checked_add(PARAMS_HEADER_LEN));
    if want != Some(len) {
        return Err(bad(format!(
            "{len} bytes, but {} records of dim {dim} need {}; the file is truncated or its header is damaged",
            ph.count,
            want.map_or("more than 2^64".to_string(), |w| w.to_string())
        )));
    }
    Ok((ph, r))
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
    /// writable table, in batches. The file's shape is checked before anything is written; a
    /// batch that would exceed the load limit fails with [`TableError::Full`] (earlier batches
    /// stay written). Returns the number of records read.
    pub fn load_params(&mut self, params: &Path) -> TableResult<u64> {
        let (ph, mut r) = read_params_header(params)?;
        if ph.dim as usize != self.dim() {
            return Err(TableError::BadParams { path: params.to_path_buf(), detail: format!("dim {}, the table has dim {}", ph.dim, self.dim()) });
        }
        if !self.is_writable() {
            return Err(TableError::ReadOnly);
        }
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
        Ok(ph.count)
    }

    /// Writes every row (keys ascending, values widened to f32) as a sparse-parameter file,
    /// atomically. Returns the number of records.
    pub fn export_params(&self, path: &Path) -> TableResult<u64> {
        let live = self.live_keys();
        let d = self.dim();
        write_atomic(path, |w| {
            w.write_all(&PARAMS_MAGIC)?;
            w.write_all(&PARAMS_VERSION.to_le_bytes())?;
            w.write_all(&(d as u32).to_le_bytes())?;
            w.write_all(&(live.len() as u64).to_le_bytes())?;
            self.for_each_row(&live, |k, row| {
                w.write_all(&k.to_le_bytes())?;
                for x in row {
                    w.write_all(&x.to_le_bytes())?;
                }
                Ok(())
            })
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

/// Writes a sparse-parameter file from `(key, row)` pairs (used by tests and benchmarks).
pub fn write_params(path: &Path, dim: u32, keys: &[u64], values: &[f32]) -> TableResult<()> {
    if values.len() != keys.len() * dim as usize {
        return Err(TableError::Shape { what: "parameter values", keys: keys.len(), dim: dim as usize, expected: keys.len() * dim as usize, got: values.len() });
    }
    write_atomic(path, |w| {
        w.write_all(&PARAMS_MAGIC)?;
        w.write_all(&PARAMS_VERSION.to_le_bytes())?;
        w.write_all(&dim.to_le_bytes())?;
        w.write_all(&(keys.len() as u64).to_le_bytes())?;
        for (k, row) in keys.iter().zip(values.chunks_exact(dim.max(1) as usize)) {
            w.write_all(&k.to_le_bytes())?;
            for x in row {
                w.write_all(&x.to_le_bytes())?;
            }
        }
        Ok(())
    })
}
