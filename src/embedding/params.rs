//! The binary sparse-parameter file (what the host leader imports, design 003 step 1), the
//! TSV export, and atomic file writes.
//!
//! Sparse-parameter file (version 3): a framed file ([`crate::frame`]: a 32-byte header
//! with magic `"RRSPARAM"`, version, payload length and the header's CRC-32; the payload;
//! the CRC-32 of every byte before it). The payload, little-endian:
//! ```text
//! offset            size  field
//! 0                 4     dim (1..=65536)
//! 4                 4     zero
//! 8                 8     count (records)
//! 16                ...   count records of { key: u64, values: dim x f32 }
//! ```
//! The payload length must be exactly `16 + count * (8 + 4 * dim)`. Keys are in any order;
//! a key given twice takes its last record; the key `u64::MAX` is refused. Export writes keys
//! in ascending order. Importing checks the header and the length first, then the CRC over
//! the whole file before a single row is written (a damaged file names itself and changes
//! nothing), and again while reading the records (a file changed in between is refused
//! too).
//!
//! Version 2 (written before the frame) still reads: magic, u32 version 2, u32 dim, u64
//! count, the records, then the CRC-32 of every byte before it (length
//! `28 + count * (8 + 4 * dim)`). Version 1 (no CRC) is refused: write the trailer (or
//! export again with this ringrec).

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, Write};
use std::path::Path;

use super::error::{TableError, TableResult};
use super::format::{self, EMPTY_KEY};
use super::table::{EmbeddingTable, TableConfig};
use crate::frame::{Frame, FrameWriter, Head, FRAME_HEADER_LEN};
use crate::hash::Crc32;

/// First 8 bytes of a sparse-parameter file.
pub const PARAMS_MAGIC: [u8; 8] = *b"RRSPARAM";
/// Sparse-parameter file version this build writes (and the newest it reads).
pub const PARAMS_VERSION: u32 = 3;
/// The frame of sparse-parameter files.
pub static PARAMS_FRAME: Frame = Frame {
    magic: PARAMS_MAGIC,
    version: PARAMS_VERSION,
    framed_since: 3,
    noun: "sparse-parameter file",
    not_this: "is it a table file? open those with `ringrec table inspect`",
    restore: "export it again or restore it from a saved copy",
};
/// Bytes of the payload before the first record (version 3).
const PAYLOAD_HEADER_LEN: u64 = 16;
/// Bytes before the first record of version 2.
const V2_HEADER_LEN: u64 = 24;
/// Records per `put_rows` batch while importing.
const IMPORT_BATCH: usize = 64 * 1024;

/// The header of a sparse-parameter file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamsHeader {
    /// Values per record.
    pub dim: u32,
    /// Records.
    pub count: u64,
    /// The file's version (2 or 3).
    pub version: u32,
    /// Offset of the first record.
    pub records_at: u64,
}

impl ParamsHeader {
    /// Bytes of one record.
    pub fn record_bytes(&self) -> u64 {
        8 + 4 * self.dim as u64
    }

    /// Bytes of `count` records of `dim` values, if it fits in a u64.
    fn records_len(dim: u32, count: u64) -> Option<u64> {
        count.checked_mul(8 + 4 * dim as u64)
    }
}

/// Opens a sparse-parameter file and validates its header against its length (not the
/// CRC: [`EmbeddingTable::load_params`] checks that). The reader is at the first record.
pub fn read_params_header(path: &Path) -> TableResult<(ParamsHeader, BufReader<File>)> {
    let bad = |detail: String| TableError::BadParams { path: path.to_path_buf(), detail };
    let file = crate::fileio::open_input(path).map_err(|e| TableError::io(path, "open", e))?;
    let len = file.metadata().map_err(|e| TableError::io(path, "stat", e))?.len();
    let mut r = BufReader::with_capacity(1 << 20, file);
    let mut h = Vec::with_capacity((FRAME_HEADER_LEN + PAYLOAD_HEADER_LEN) as usize);
    (&mut r).take(FRAME_HEADER_LEN + PAYLOAD_HEADER_LEN).read_to_end(&mut h).map_err(|e| TableError::io(path, "read", e))?;
    let word = |a: usize| u32::from_le_bytes([h[a], h[a + 1], h[a + 2], h[a + 3]]);
    let long = |a: usize| u64::from_le_bytes(h[a..a + 8].try_into().expect("8 bytes"));
    // (dim, count, records_at, the bytes the records take by the header)
    let (version, dim, count, records_at, room) = match PARAMS_FRAME.head(path, &h, len)? {
        Head::Legacy { version: 1 } => {
            return Err(bad(format!("version 1 has no checksum, this build reads versions 2 and {PARAMS_VERSION}: append the CRC-32 of the file (zlib's) and set the version to 2, or export it again with this ringrec")));
        }
        Head::Legacy { version: 2 } => {
            if len < V2_HEADER_LEN {
                return Err(bad(format!("{len} bytes, shorter than the {V2_HEADER_LEN}-byte header")));
            }
            (2, word(12), long(16), V2_HEADER_LEN, len.checked_sub(V2_HEADER_LEN + 4))
        }
        Head::Legacy { version } => return Err(bad(format!("version {version}, this build reads versions 2 and {PARAMS_VERSION}"))),
        Head::Framed { version, payload_len } => {
            if payload_len < PAYLOAD_HEADER_LEN {
                return Err(PARAMS_FRAME.layout(path, format!("a payload of {payload_len} bytes, shorter than its {PAYLOAD_HEADER_LEN}-byte header")).into());
            }
            if word(36) != 0 {
                return Err(PARAMS_FRAME.layout(path, format!("the word after dim is {:#x}, expected 0", word(36))).into());
            }
            let at = (FRAME_HEADER_LEN + PAYLOAD_HEADER_LEN) as usize;
            (version, word(32), long(40), at as u64, Some(payload_len - PAYLOAD_HEADER_LEN))
        }
    };
    if dim == 0 || dim > format::MAX_DIM {
        return Err(bad(format!("dim {dim}, expected 1..={}", format::MAX_DIM)));
    }
    let need = ParamsHeader::records_len(dim, count);
    if need != room {
        return Err(bad(format!(
            "{len} bytes, but {count} records of dim {dim} need {} bytes of records, the file has room for {}; the file is truncated or its header is damaged",
            need.map_or("more than 2^64".to_string(), |w| w.to_string()),
            room.map_or("none".to_string(), |w| w.to_string())
        )));
    }
    r.seek(std::io::SeekFrom::Start(records_at)).map_err(|e| TableError::io(path, "seek", e))?;
    Ok((ParamsHeader { dim, count, version, records_at }, r))
}

/// The error of a CRC mismatch found while importing.
fn changed(path: &Path, computed: u32, stored: u32) -> TableError {
    TableError::BadParams {
        path: path.to_path_buf(),
        detail: format!(
            "checksum mismatch (the file changed while it was imported; rows already written stay): the header and records have CRC-32 {computed:#010x}, the file records {stored:#010x}; export it again or restore it from a saved copy"
        ),
    }
}

/// Writes the sparse-parameter frame around the records handed to [`ParamsWriter::record`].
struct ParamsWriter<'a, W: Write> {
    w: FrameWriter<&'a mut W>,
    rec: Vec<u8>,
}

impl<'a, W: Write> ParamsWriter<'a, W> {
    /// Writes the header of `count` records of `dim` values.
    fn start(w: &'a mut W, dim: u32, count: u64) -> std::io::Result<Self> {
        let len = ParamsHeader::records_len(dim, count).and_then(|l| l.checked_add(PAYLOAD_HEADER_LEN)).ok_or_else(|| std::io::Error::other(format!("{count} records of dim {dim} exceed 2^64 bytes")))?;
        let mut w = PARAMS_FRAME.writer(w, len)?;
        w.write_all(&dim.to_le_bytes())?;
        w.write_all(&[0u8; 4])?;
        w.write_all(&count.to_le_bytes())?;
        Ok(ParamsWriter { w, rec: Vec::with_capacity(8 + 4 * dim as usize) })
    }

    /// Writes one record.
    fn record(&mut self, key: u64, row: &[f32]) -> std::io::Result<()> {
        self.rec.clear();
        self.rec.extend_from_slice(&key.to_le_bytes());
        row.iter().for_each(|x| self.rec.extend_from_slice(&x.to_le_bytes()));
        self.w.write_all(&self.rec)
    }

    /// Writes the CRC after the last record.
    fn finish(self) -> std::io::Result<()> {
        self.w.finish().map(|_| ())
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
        let (ph, _) = read_params_header(params)?;
        if ph.dim as usize != self.dim() {
            return Err(TableError::BadParams { path: params.to_path_buf(), detail: format!("dim {}, the table has dim {}", ph.dim, self.dim()) });
        }
        if !self.is_writable() {
            return Err(TableError::ReadOnly);
        }
        let (_, computed, stored) = crate::frame::trailer_sum(params)?;
        if computed != stored {
            return Err(PARAMS_FRAME.corrupt(params, stored, computed).into());
        }
        // Read again, from the start: the CRC of what is imported.
        let mut r = BufReader::with_capacity(1 << 20, crate::fileio::open_input(params).map_err(|e| TableError::io(params, "open", e))?);
        let mut crc = Crc32::new();
        let mut head = vec![0u8; ph.records_at as usize];
        r.read_exact(&mut head).map_err(|e| TableError::io(params, "read", e))?;
        crc.update(&head);
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
        let mut t = [0u8; crate::frame::TRAILER_LEN as usize];
        r.read_exact(&mut t).map_err(|e| TableError::io(params, "read", e))?;
        let (computed, stored) = (crc.finish(), u32::from_le_bytes(t));
        if computed != stored {
            return Err(changed(params, computed, stored));
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

/// Writes a sparse-parameter file (version 3, framed) from `(key, row)` pairs (used by
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

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("ringrec-params-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// The rows of `keys` in `t`.
    fn rows(t: &EmbeddingTable, keys: &[u64]) -> Vec<f32> {
        let mut out = vec![0f32; keys.len() * t.dim()];
        t.lookup(keys, &mut out).unwrap();
        out
    }

    #[test]
    fn version_3_is_framed_as_documented_and_round_trips() {
        let d = scratch("v3");
        let p = d.join("rows.params");
        write_params(&p, 2, &[9, 4], &[1.0, 2.0, 3.0, 4.0]).unwrap();
        let b = std::fs::read(&p).unwrap();
        assert_eq!(b.len(), 32 + 16 + 2 * (8 + 8) + 4);
        assert_eq!((&b[..8], u32::from_le_bytes(b[8..12].try_into().unwrap())), (&b"RRSPARAM"[..], 3));
        assert_eq!(u64::from_le_bytes(b[16..24].try_into().unwrap()), 16 + 32);
        assert_eq!((u32::from_le_bytes(b[32..36].try_into().unwrap()), u64::from_le_bytes(b[40..48].try_into().unwrap())), (2, 2));
        assert_eq!(u64::from_le_bytes(b[48..56].try_into().unwrap()), 9);
        assert_eq!(read_params_header(&p).unwrap().0, ParamsHeader { dim: 2, count: 2, version: 3, records_at: 48 });
        let t = EmbeddingTable::import_params(&p, &d.join("t"), &TableConfig::new(2, 64)).unwrap();
        assert_eq!(rows(&t, &[9, 4]), vec![1.0, 2.0, 3.0, 4.0]);
        // Exported again: the same bytes but for the key order (ascending).
        t.export_params(&d.join("again")).unwrap();
        let again = std::fs::read(d.join("again")).unwrap();
        assert_eq!((again.len(), u64::from_le_bytes(again[48..56].try_into().unwrap())), (b.len(), 4));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn version_2_files_still_import() {
        let d = scratch("v2");
        let p = d.join("rows.params");
        // As version 2 was written: magic, u32 version 2, u32 dim, u64 count, the records,
        // then the CRC-32 of every byte before it.
        let mut b = b"RRSPARAM".to_vec();
        b.extend(2u32.to_le_bytes());
        b.extend(2u32.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        for (k, v) in [(9u64, [1.0f32, 2.0]), (4, [3.0, 4.0])] {
            b.extend(k.to_le_bytes());
            v.iter().for_each(|x| b.extend(x.to_le_bytes()));
        }
        let crc = crate::hash::crc32(&b);
        b.extend(crc.to_le_bytes());
        std::fs::write(&p, &b).unwrap();
        assert_eq!(read_params_header(&p).unwrap().0, ParamsHeader { dim: 2, count: 2, version: 2, records_at: 24 });
        let t = EmbeddingTable::import_params(&p, &d.join("t"), &TableConfig::new(2, 64)).unwrap();
        assert_eq!(rows(&t, &[9, 4]), vec![1.0, 2.0, 3.0, 4.0]);
        drop(t);
        // Damaged, it is refused before a row is written.
        b[30] ^= 1;
        std::fs::write(&p, &b).unwrap();
        let e = EmbeddingTable::import_params(&p, &d.join("u"), &TableConfig::new(2, 64)).unwrap_err().to_string();
        assert!(e.contains("checksum mismatch") && e.contains("rows.params"), "{e}");
        assert!(!d.join("u").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_newer_version_and_a_foreign_file_are_refused_naming_why() {
        let d = scratch("newer");
        let p = d.join("rows.params");
        write_params(&p, 1, &[1], &[0.5]).unwrap();
        let mut b = std::fs::read(&p).unwrap();
        b[8] = 4;
        let sum = crate::hash::crc32(&b[..24]);
        b[24..28].copy_from_slice(&sum.to_le_bytes());
        std::fs::write(&p, &b).unwrap();
        let e = read_params_header(&p).unwrap_err();
        assert!(matches!(e, TableError::Frame(crate::frame::FrameError::Newer { found: 4, newest: 3, .. })), "{e}");
        assert!(e.to_string().contains("sparse-parameter file of format version 4, newer than version 3"), "{e}");
        std::fs::write(&p, b"RRTABLE\0 a table").unwrap();
        let e = read_params_header(&p).unwrap_err().to_string();
        assert!(e.contains("is not a ringrec sparse-parameter file") && e.contains("ringrec table inspect"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
