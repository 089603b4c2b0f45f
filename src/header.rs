//! The header codec of ringrec's memory-mapped files (embedding tables, data caches) and its
//! one error type, [`FormatError`].
//!
//! Every such file starts with a header of its [`Format`]: 8 bytes of magic, the format
//! version (u32 at 8), the header length (u32 at 12), the format's own little-endian fields
//! from byte 16, and the FNV-1a 64 checksum of everything before it at `checksum_at`.
//! [`Format::check`] validates that frame in a fixed order, each failure with its own
//! error: magic (when there are 8 bytes: a short file of another kind is "not a table"
//! rather than "truncated"), length, version, checksum, header length. The formats then
//! check their fields ([`FormatError::BadHeader`]) and section layout
//! ([`FormatError::BadLayout`], or `Truncated` when the file is shorter than it).

use std::path::{Path, PathBuf};

use crate::hash::fnv1a64;

/// Bytes reserved for the header of every mapped-file format; the first section starts here.
pub const HEADER_LEN: u64 = 4096;
/// Sections start at multiples of this (a page), so every section is aligned for its type.
pub const SECTION_ALIGN: u64 = 4096;

/// `x` rounded up to the next section boundary; `None` on overflow.
pub fn align_up(x: u64) -> Option<u64> {
    x.checked_add(SECTION_ALIGN - 1).map(|v| v / SECTION_ALIGN * SECTION_ALIGN)
}

/// A mapped-file format: its frame and the words its errors use.
#[derive(Debug)]
pub struct Format {
    /// The first 8 bytes.
    pub magic: [u8; 8],
    /// The version this build reads and writes.
    pub version: u32,
    /// Bytes reserved for the header (sections start after it).
    pub header_len: u64,
    /// Offset of the checksum (the fields end there).
    pub checksum_at: usize,
    /// What a file of the format is (`embedding table`).
    pub noun: &'static str,
    /// The file as its sections' owner (`a table of this shape`).
    pub this: &'static str,
    /// What to do with a file of another kind.
    pub not_this: &'static str,
    /// What to do with a file of another version.
    pub on_version: &'static str,
    /// What to do with a damaged file.
    pub restore: &'static str,
}

/// A file that is not a valid file of its [`Format`]. Every message names the file and
/// says what to do.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// The file is shorter than its header says (or shorter than a header).
    #[error("{path} is truncated: {len} bytes, but {} needs {need}; the copy is incomplete, {}", .format.this, .format.restore)]
    Truncated {
        /// The format.
        format: &'static Format,
        /// The file.
        path: PathBuf,
        /// Its length.
        len: u64,
        /// The length it needs.
        need: u64,
    },
    /// The file does not start with the format's magic.
    #[error("{path} is not a ringrec {} (magic {found:02x?}, expected {:?}); {}", .format.noun, String::from_utf8_lossy(&.format.magic), .format.not_this)]
    BadMagic {
        /// The format.
        format: &'static Format,
        /// The file.
        path: PathBuf,
        /// The first 8 bytes.
        found: [u8; 8],
    },
    /// The file was written by an unsupported format version.
    #[error("{path} has {} format version {found}, this build reads version {supported}; {}", .format.noun, .format.on_version)]
    BadVersion {
        /// The format.
        format: &'static Format,
        /// The file.
        path: PathBuf,
        /// Version in the file.
        found: u32,
        /// Version this build reads.
        supported: u32,
    },
    /// The header checksum does not match the header bytes.
    #[error("{path}: header checksum mismatch (stored {stored:#018x}, computed {computed:#018x}); the header was damaged, {}", .format.restore)]
    BadChecksum {
        /// The format.
        format: &'static Format,
        /// The file.
        path: PathBuf,
        /// Checksum stored in the header.
        stored: u64,
        /// Checksum of the header bytes.
        computed: u64,
    },
    /// A header field has a value no valid file has.
    #[error("{path}: invalid header field {field}: {detail}; the file is damaged or was not written by ringrec")]
    BadHeader {
        /// The format.
        format: &'static Format,
        /// The file.
        path: PathBuf,
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// Section offsets or lengths disagree with the header or the file length.
    #[error("{path}: bad section layout: {detail}; the file is damaged or was not written by ringrec")]
    BadLayout {
        /// The format.
        format: &'static Format,
        /// The file.
        path: PathBuf,
        /// Which section and how.
        detail: String,
    },
}

impl Format {
    /// Bytes of the header that carry fields and the checksum.
    pub const fn fields_len(&self) -> usize {
        self.checksum_at + 8
    }

    /// Writes the frame (magic, version, header length) into `b` and, last, the checksum
    /// of the fields the caller wrote from byte 16.
    pub fn seal(&self, b: &mut [u8]) {
        b[0..8].copy_from_slice(&self.magic);
        wr_u32(b, 8, self.version);
        wr_u32(b, 12, self.header_len as u32);
        let sum = fnv1a64(&b[..self.checksum_at]);
        wr_u64(b, self.checksum_at, sum);
    }

    /// Validates the frame of `bytes`, (a prefix of) `path`, whose real length is
    /// `file_len`, in the order of the module docs. Arbitrary bytes give an error, never a
    /// panic.
    pub fn check(&'static self, path: &Path, bytes: &[u8], file_len: u64) -> Result<(), FormatError> {
        if let Some(m) = bytes.get(0..8) {
            let found: [u8; 8] = m.try_into().expect("8 bytes");
            if found != self.magic {
                return Err(FormatError::BadMagic { format: self, path: path.to_path_buf(), found });
            }
        }
        if bytes.len() < self.fields_len() || file_len < self.header_len {
            return Err(self.truncated(path, file_len.min(bytes.len() as u64), self.header_len));
        }
        let found = rd_u32(bytes, 8);
        if found != self.version {
            return Err(FormatError::BadVersion { format: self, path: path.to_path_buf(), found, supported: self.version });
        }
        let (stored, computed) = (rd_u64(bytes, self.checksum_at), fnv1a64(&bytes[..self.checksum_at]));
        if stored != computed {
            return Err(FormatError::BadChecksum { format: self, path: path.to_path_buf(), stored, computed });
        }
        let header_len = rd_u32(bytes, 12);
        if header_len as u64 != self.header_len {
            return Err(self.bad(path, "header_len", format!("{header_len}, expected {}", self.header_len)));
        }
        Ok(())
    }

    /// [`FormatError::Truncated`].
    pub fn truncated(&'static self, path: &Path, len: u64, need: u64) -> FormatError {
        FormatError::Truncated { format: self, path: path.to_path_buf(), len, need }
    }

    /// [`FormatError::BadHeader`].
    pub fn bad(&'static self, path: &Path, field: &'static str, detail: String) -> FormatError {
        FormatError::BadHeader { format: self, path: path.to_path_buf(), field, detail }
    }

    /// [`FormatError::BadLayout`].
    pub fn layout(&'static self, path: &Path, detail: impl Into<String>) -> FormatError {
        FormatError::BadLayout { format: self, path: path.to_path_buf(), detail: detail.into() }
    }
}

/// The little-endian u32 at `at`.
pub fn rd_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// The little-endian u64 at `at`.
pub fn rd_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Writes `v` little-endian at `at`.
pub fn wr_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// Writes `v` little-endian at `at`.
pub fn wr_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Feeds `cases` random and mutated headers of `format` (from `valid`, the encoded fields)
/// with random file lengths to `parse`, which must never panic (tests of the formats).
#[cfg(test)]
pub(crate) fn fuzz_headers(format: &Format, valid: &[u8], cases: u64, parse: impl Fn(&[u8], u64)) {
    let mut x: u64 = 0x1234_5678_9abc_def1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (fields, at) = (valid.len(), format.checksum_at);
    for case in 0..cases {
        let len = (next() % (fields as u64 + 30)) as usize;
        let mut b: Vec<u8> = if case % 2 == 0 { (0..len).map(|_| next() as u8).collect() } else { valid[..len.min(fields)].to_vec() };
        if case % 2 == 1 && !b.is_empty() {
            let i = (next() as usize) % b.len();
            b[i] ^= (next() as u8) | 1;
            if b.len() >= fields && case % 4 == 1 {
                // Keep the checksum valid so the field checks are reached too.
                let s = fnv1a64(&b[..at]);
                b[at..at + 8].copy_from_slice(&s.to_le_bytes());
            }
        }
        parse(&b, next() % (1 << 40));
    }
}
