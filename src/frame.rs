//! The frame of ringrec's small binary files (a checkpoint's or a bundle's `dense.bin`, a
//! sparse-parameter file) and its one error type, [`FrameError`]; the mapped files have
//! theirs in [`crate::header`].
//!
//! A framed file (little-endian):
//! ```text
//! offset   size  field
//! 0        8     magic: which format
//! 8        4     version (u32) of the payload's layout
//! 12       4     header length (u32): 32
//! 16       8     payload length n (u64)
//! 24       4     CRC-32 of bytes 0..24 (the header's own)
//! 28       4     zero
//! 32       n     payload: the format's own (8-aligned)
//! 32 + n   4     CRC-32 of every byte before it (header and payload)
//! ```
//! Every CRC-32 is IEEE's (zlib's, Python's `zlib.crc32`), so a reader without ringrec checks
//! a file with the standard library; the trailer repeats the CRC of everything before it, the
//! convention of every checksum an export bundle's `model.json` lists.
//!
//! [`Frame::head`] checks a file in a fixed order, each failure with its own error naming
//! the file and what to do: the magic (another kind of file: [`FrameError::BadMagic`]), a
//! layout older than the frame under the same magic ([`Head::Legacy`], for the format's own
//! reader of old files), the length of a header ([`FrameError::Truncated`]), the header's CRC
//! ([`FrameError::Corrupt`]), a version newer than this build's ([`FrameError::Newer`]), the
//! header length, then the file's length against the payload's (shorter:
//! [`FrameError::Truncated`]; longer: [`FrameError::BadLayout`]). [`Frame::decode`] then
//! checks the trailer ([`FrameError::Corrupt`]). Arbitrary bytes give an error, never a panic.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::fileio::{write_atomic, IoError};
use crate::hash::{crc32, Crc32};

/// Bytes of the frame's header; the payload starts here.
pub const FRAME_HEADER_LEN: u64 = 32;
/// Bytes of the frame's trailer (the CRC-32).
pub const TRAILER_LEN: u64 = 4;

/// A small-file format: its magic, its versions and the words its errors use.
#[derive(Debug)]
pub struct Frame {
    /// The first 8 bytes.
    pub magic: [u8; 8],
    /// The newest version this build reads (and the one it writes).
    pub version: u32,
    /// The first framed version: lower versions under the same magic (a version at byte 8)
    /// are the format's layouts from before the frame ([`Head::Legacy`]).
    pub framed_since: u32,
    /// What a file of the format is (`sparse-parameter file`).
    pub noun: &'static str,
    /// What to do with a file of another kind.
    pub not_this: &'static str,
    /// What to do with a damaged file.
    pub restore: &'static str,
}

/// A framed file that is not a valid file of its [`Frame`]. Every message names the file
/// and says what to do.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The file could not be read.
    #[error(transparent)]
    Io(#[from] IoError),
    /// The file is shorter than its header (or a header) says.
    #[error("{path} is truncated: {len} bytes, but a {} of its header needs {need}; the copy is incomplete, {}", .format.noun, .format.restore)]
    Truncated {
        /// The format.
        format: &'static Frame,
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
        format: &'static Frame,
        /// The file.
        path: PathBuf,
        /// Its first bytes (up to 8).
        found: Vec<u8>,
    },
    /// The file has a version newer than this build reads.
    #[error("{path} is a {} of format version {found}, newer than version {newest}, the newest this build reads; read it with the ringrec that wrote it (or a newer one)", .format.noun)]
    Newer {
        /// The format.
        format: &'static Frame,
        /// The file.
        path: PathBuf,
        /// Version in the file.
        found: u32,
        /// The newest version this build reads.
        newest: u32,
    },
    /// A CRC-32 does not match the bytes it covers.
    #[error("{path}: {part} checksum mismatch (CRC-32 stored {stored:#010x}, computed {computed:#010x}); the file was damaged after it was written, {}", .format.restore)]
    Corrupt {
        /// The format.
        format: &'static Frame,
        /// The file.
        path: PathBuf,
        /// `header` or `contents`.
        part: &'static str,
        /// The CRC in the file.
        stored: u32,
        /// The CRC of the bytes.
        computed: u32,
    },
    /// A header field has a value no file of this build has.
    #[error("{path}: invalid {} header field {field}: {detail}; the file is damaged or was not written by ringrec", .format.noun)]
    BadHeader {
        /// The format.
        format: &'static Frame,
        /// The file.
        path: PathBuf,
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// The file's length or its payload disagree with its header (checked payloads: a
    /// writer's bug or a foreign writer).
    #[error("{path}: not a valid {}: {detail}; the file is damaged or was not written by ringrec", .format.noun)]
    BadLayout {
        /// The format.
        format: &'static Frame,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
}

/// What [`Frame::head`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Head {
    /// A framed file with a valid header: its version and payload length.
    Framed {
        /// The payload's layout version.
        version: u32,
        /// Bytes of payload.
        payload_len: u64,
    },
    /// A file of the format's magic written before the frame (version below
    /// [`Frame::framed_since`]): nothing checked, for the format's reader of old files.
    Legacy {
        /// The version at byte 8.
        version: u32,
    },
}

impl Frame {
    /// The 32 header bytes of a file of `payload_len` bytes of payload (version
    /// [`Frame::version`]).
    pub fn header(&self, payload_len: u64) -> [u8; FRAME_HEADER_LEN as usize] {
        self.header_of(self.version, payload_len)
    }

    /// The 32 header bytes of a file of layout `version` (a format that writes each file
    /// at the oldest version that holds it) with `payload_len` bytes of payload.
    pub fn header_of(&self, version: u32, payload_len: u64) -> [u8; FRAME_HEADER_LEN as usize] {
        let mut h = [0u8; FRAME_HEADER_LEN as usize];
        h[..8].copy_from_slice(&self.magic);
        h[8..12].copy_from_slice(&version.to_le_bytes());
        h[12..16].copy_from_slice(&(FRAME_HEADER_LEN as u32).to_le_bytes());
        h[16..24].copy_from_slice(&payload_len.to_le_bytes());
        let sum = crc32(&h[..24]);
        h[24..28].copy_from_slice(&sum.to_le_bytes());
        h
    }

    /// Starts a framed file of `payload_len` bytes of payload on `w`: the header is written,
    /// the payload goes through the returned writer, [`FrameWriter::finish`] writes the CRC.
    pub fn writer<W: Write>(&self, w: W, payload_len: u64) -> std::io::Result<FrameWriter<W>> {
        self.writer_of(self.version, w, payload_len)
    }

    /// [`Frame::writer`] of a file of layout `version` ([`Frame::header_of`]).
    pub fn writer_of<W: Write>(&self, version: u32, mut w: W, payload_len: u64) -> std::io::Result<FrameWriter<W>> {
        let h = self.header_of(version, payload_len);
        w.write_all(&h)?;
        let mut crc = Crc32::new();
        crc.update(&h);
        Ok(FrameWriter { w, crc, left: payload_len })
    }

    /// The framed bytes of `payload`.
    pub fn encode(&self, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(payload.len() + (FRAME_HEADER_LEN + TRAILER_LEN) as usize);
        let mut w = self.writer(&mut out, payload.len() as u64).expect("writing to memory");
        w.write_all(payload).expect("writing to memory");
        w.finish().expect("the whole payload");
        out
    }

    /// Writes `payload` framed into `path`, atomically (mode 0600, [`write_atomic`]).
    pub fn write(&self, path: &Path, payload: &[u8]) -> Result<(), IoError> {
        write_atomic(path, 0o600, |w| {
            let mut f = self.writer(w, payload.len() as u64)?;
            f.write_all(payload)?;
            f.finish().map(|_| ())
        })
    }

    /// Checks the header of `bytes`, the start (at least [`FRAME_HEADER_LEN`] bytes where the
    /// file has them) of `path`, whose length is `file_len`, in the order of the module docs.
    pub fn head(&'static self, path: &Path, bytes: &[u8], file_len: u64) -> Result<Head, FrameError> {
        let start = &bytes[..bytes.len().min(8)];
        if start != &self.magic[..start.len()] {
            return Err(FrameError::BadMagic { format: self, path: path.to_path_buf(), found: start.to_vec() });
        }
        let need = FRAME_HEADER_LEN + TRAILER_LEN;
        let Some(version) = bytes.get(8..12).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes"))) else {
            return Err(self.truncated(path, file_len.min(bytes.len() as u64), need));
        };
        if version < self.framed_since {
            return Ok(Head::Legacy { version });
        }
        let Some(h) = bytes.get(..FRAME_HEADER_LEN as usize) else {
            return Err(self.truncated(path, file_len.min(bytes.len() as u64), need));
        };
        let (stored, computed) = (u32::from_le_bytes(h[24..28].try_into().expect("4 bytes")), crc32(&h[..24]));
        if stored != computed {
            return Err(FrameError::Corrupt { format: self, path: path.to_path_buf(), part: "header", stored, computed });
        }
        if version > self.version {
            return Err(FrameError::Newer { format: self, path: path.to_path_buf(), found: version, newest: self.version });
        }
        let header_len = u32::from_le_bytes(h[12..16].try_into().expect("4 bytes"));
        if header_len as u64 != FRAME_HEADER_LEN || h[28..32] != [0; 4] {
            return Err(FrameError::BadHeader { format: self, path: path.to_path_buf(), field: "header length", detail: format!("{header_len} (then {:02x?}), expected {FRAME_HEADER_LEN} (then zeros)", &h[28..32]) });
        }
        let payload_len = u64::from_le_bytes(h[16..24].try_into().expect("8 bytes"));
        let want = payload_len.checked_add(need);
        match want {
            Some(w) if file_len < w => Err(self.truncated(path, file_len, w)),
            Some(w) if file_len == w => Ok(Head::Framed { version, payload_len }),
            _ => Err(self.layout(
                path,
                format!(
                    "{file_len} bytes, but its header says {}: bytes were appended after its end",
                    want.map_or_else(|| "more than 2^64".to_string(), |w| w.to_string())
                ),
            )),
        }
    }

    /// Checks the whole file `bytes` read from `path` (header, length, trailer) and returns
    /// what [`Frame::head`] found with the payload (framed) or all of `bytes` (legacy,
    /// unchecked).
    pub fn decode<'a>(&'static self, path: &Path, bytes: &'a [u8]) -> Result<(Head, &'a [u8]), FrameError> {
        let head = self.head(path, bytes, bytes.len() as u64)?;
        let Head::Framed { .. } = head else { return Ok((head, bytes)) };
        let (body, trailer) = bytes.split_at(bytes.len() - TRAILER_LEN as usize);
        let (stored, computed) = (u32::from_le_bytes(trailer.try_into().expect("4 bytes")), crc32(body));
        if stored != computed {
            return Err(FrameError::Corrupt { format: self, path: path.to_path_buf(), part: "contents", stored, computed });
        }
        Ok((head, &body[FRAME_HEADER_LEN as usize..]))
    }

    /// Reads `path` and [`Frame::decode`]s it: the head and the payload (framed) or the
    /// whole file (legacy).
    pub fn read(&'static self, path: &Path) -> Result<(Head, Vec<u8>), FrameError> {
        let mut bytes = crate::fileio::read_input(path).map_err(|e| IoError::new(path, "read", e))?;
        let (head, _) = self.decode(path, &bytes)?;
        if let Head::Framed { .. } = head {
            bytes.truncate(bytes.len() - TRAILER_LEN as usize);
            bytes.drain(..FRAME_HEADER_LEN as usize);
        }
        Ok((head, bytes))
    }

    /// [`FrameError::Truncated`].
    pub fn truncated(&'static self, path: &Path, len: u64, need: u64) -> FrameError {
        FrameError::Truncated { format: self, path: path.to_path_buf(), len, need }
    }

    /// [`FrameError::BadLayout`]: the formats' own checks of their payloads.
    pub fn layout(&'static self, path: &Path, detail: impl Into<String>) -> FrameError {
        FrameError::BadLayout { format: self, path: path.to_path_buf(), detail: detail.into() }
    }

    /// [`FrameError::Corrupt`] of the contents: a CRC over them that does not match.
    pub fn corrupt(&'static self, path: &Path, stored: u32, computed: u32) -> FrameError {
        FrameError::Corrupt { format: self, path: path.to_path_buf(), part: "contents", stored, computed }
    }
}

/// The payload's writer of a framed file ([`Frame::writer`]): refuses more bytes than the
/// header announced; [`FrameWriter::finish`] refuses fewer.
pub struct FrameWriter<W: Write> {
    w: W,
    crc: Crc32,
    left: u64,
}

impl<W: Write> Write for FrameWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if buf.len() as u64 > self.left {
            return Err(std::io::Error::other(format!("{} payload bytes more than the frame's header announces", buf.len() as u64 - self.left)));
        }
        let n = self.w.write(buf)?;
        self.crc.update(&buf[..n]);
        self.left -= n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.w.flush()
    }
}

impl<W: Write> FrameWriter<W> {
    /// Writes the trailer after the whole payload; returns the underlying writer.
    pub fn finish(mut self) -> std::io::Result<W> {
        if self.left != 0 {
            return Err(std::io::Error::other(format!("{} payload bytes fewer than the frame's header announces", self.left)));
        }
        self.w.write_all(&self.crc.finish().to_le_bytes())?;
        Ok(self.w)
    }
}

/// A file whose last 4 bytes are the CRC-32 of every byte before them (a framed file, and
/// the older layouts of its formats), read once, streamed: its length, the CRC-32 of every
/// byte before the trailer, and the trailer.
pub fn trailer_sum(path: &Path) -> Result<(u64, u32, u32), IoError> {
    let mut f = crate::fileio::open_input(path).map_err(|e| IoError::new(path, "open", e))?;
    let len = f.metadata().map_err(|e| IoError::new(path, "stat", e))?.len();
    let mut left = len.checked_sub(TRAILER_LEN).ok_or_else(|| IoError::new(path, "read", std::io::Error::new(std::io::ErrorKind::UnexpectedEof, format!("{len} bytes, shorter than its checksum"))))?;
    let (mut crc, mut buf) = (Crc32::new(), vec![0u8; 1 << 20]);
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        f.read_exact(&mut buf[..n]).map_err(|e| IoError::new(path, "read", e))?;
        crc.update(&buf[..n]);
        left -= n as u64;
    }
    let mut t = [0u8; TRAILER_LEN as usize];
    f.read_exact(&mut t).map_err(|e| IoError::new(path, "read", e))?;
    Ok((len, crc.finish(), u32::from_le_bytes(t)))
}

#[cfg(test)]
mod tests {
    use super::*;

    static TEST: Frame = Frame { magic: *b"RRTEST\0\0", version: 3, framed_since: 2, noun: "test file", not_this: "pass a test file", restore: "write it again" };

    fn p() -> &'static Path {
        Path::new("dir/f.bin")
    }

    #[test]
    fn a_payload_round_trips_and_the_layout_is_the_documented_one() {
        let b = TEST.encode(b"hello, frame");
        assert_eq!(b.len(), 32 + 12 + 4);
        assert_eq!(&b[..8], b"RRTEST\0\0");
        assert_eq!(u32::from_le_bytes(b[8..12].try_into().unwrap()), 3);
        assert_eq!(u32::from_le_bytes(b[12..16].try_into().unwrap()), 32);
        assert_eq!(u64::from_le_bytes(b[16..24].try_into().unwrap()), 12);
        assert_eq!(u32::from_le_bytes(b[24..28].try_into().unwrap()), crc32(&b[..24]));
        assert_eq!(u32::from_le_bytes(b[44..48].try_into().unwrap()), crc32(&b[..44]));
        let (head, payload) = TEST.decode(p(), &b).unwrap();
        assert_eq!((head, payload), (Head::Framed { version: 3, payload_len: 12 }, &b"hello, frame"[..]));
        assert_eq!(TEST.decode(p(), &TEST.encode(b"")).unwrap().1, b"");
    }

    #[test]
    fn the_writer_and_reader_go_through_files() {
        let d = std::env::temp_dir().join(format!("ringrec-frame-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let f = d.join("x.bin");
        TEST.write(&f, b"0123456789").unwrap();
        assert_eq!(TEST.read(&f).unwrap(), (Head::Framed { version: 3, payload_len: 10 }, b"0123456789".to_vec()));
        let (len, computed, stored) = trailer_sum(&f).unwrap();
        assert_eq!((len, computed), (46, stored));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&f).unwrap().permissions().mode() & 0o777, 0o600);
        let e = TEST.read(&d.join("missing")).unwrap_err();
        assert!(matches!(e, FrameError::Io(_)) && e.to_string().contains("missing"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_writer_refuses_a_payload_of_another_length() {
        let mut v = Vec::new();
        let mut w = TEST.writer(&mut v, 3).unwrap();
        assert!(w.write_all(b"four").unwrap_err().to_string().contains("more than"));
        let mut w = TEST.writer(Vec::new(), 3).unwrap();
        w.write_all(b"ab").unwrap();
        assert!(w.finish().unwrap_err().to_string().contains("fewer than"));
    }

    #[test]
    fn each_damage_has_its_own_error() {
        let good = TEST.encode(b"payload bytes");
        let e = |b: &[u8]| TEST.decode(p(), b).unwrap_err();
        // Truncated: anywhere, including inside the header.
        for cut in [0, 5, 8, 12, 31, good.len() - 1] {
            let err = e(&good[..cut]);
            assert!(matches!(err, FrameError::Truncated { .. }), "cut at {cut}: {err}");
            assert!(err.to_string().contains("dir/f.bin is truncated") && err.to_string().contains("write it again"), "{err}");
        }
        // Foreign: another magic, even a short one.
        for other in [&b"RRSPARAM\x03\0\0\0"[..], b"PK\x03\x04", b"RRTEST\0X"] {
            let err = e(other);
            assert!(matches!(err, FrameError::BadMagic { .. }) && err.to_string().contains("is not a ringrec test file") && err.to_string().contains("pass a test file"), "{err}");
        }
        // Corrupt: a flipped byte of the header (version included), of the payload, of the trailer.
        for at in [9, 13, 17, 25, 40, good.len() - 1] {
            let mut b = good.clone();
            b[at] ^= 0x10;
            let err = e(&b);
            let part = if at < 32 { "header" } else { "contents" };
            assert!(matches!(err, FrameError::Corrupt { part: q, .. } if q == part), "byte {at}: {err}");
            assert!(err.to_string().contains(&format!("{part} checksum mismatch")) && err.to_string().contains("write it again"), "{err}");
        }
        // Appended bytes.
        let mut b = good.clone();
        b.push(0);
        let err = e(&b);
        assert!(matches!(err, FrameError::BadLayout { .. }) && err.to_string().contains("appended"), "{err}");
        // A newer version (a valid header of version 4) is refused naming both versions.
        let mut b = good.clone();
        b[8] = 4;
        let sum = crc32(&b[..24]);
        b[24..28].copy_from_slice(&sum.to_le_bytes());
        let err = e(&b);
        assert!(matches!(err, FrameError::Newer { found: 4, newest: 3, .. }), "{err}");
        assert!(err.to_string().contains("format version 4, newer than version 3"), "{err}");
    }

    #[test]
    fn older_layouts_under_the_magic_are_handed_back_unchecked() {
        let mut old = b"RRTEST\0\0".to_vec();
        old.extend(1u32.to_le_bytes());
        old.extend(b"anything");
        let (head, bytes) = TEST.decode(p(), &old).unwrap();
        assert_eq!((head, bytes), (Head::Legacy { version: 1 }, &old[..]));
        // A framed format with no older layout has none.
        static NEW: Frame = Frame { magic: *b"RRTEST\0\0", version: 1, framed_since: 1, noun: "test file", not_this: "", restore: "" };
        let mut zero = old.clone();
        zero[8] = 0;
        assert!(matches!(NEW.decode(p(), &zero), Ok((Head::Legacy { version: 0 }, _))));
    }

    #[test]
    fn random_bytes_give_errors_not_panics() {
        let good = TEST.encode(&[7u8; 40]);
        let mut s = crate::hash::Stream(5);
        for case in 0..2000u64 {
            let mut b = if case % 2 == 0 { good.clone() } else { (0..s.below(90)).map(|_| s.next_u64() as u8).collect() };
            if case % 2 == 0 {
                let at = s.below(b.len() as u64) as usize;
                b[at] ^= 1 + s.below(255) as u8;
                b.truncate(s.below(b.len() as u64 + 1) as usize);
            }
            if let Ok((Head::Framed { .. }, payload)) = TEST.decode(p(), &b) {
                assert_eq!(payload, &[7u8; 40][..], "case {case}: a damaged file read as other bytes");
            }
        }
    }
}
