//! Compressed Criteo TSVs read as they are published (`day_N.gz`, `.zst`): a streaming
//! decoder that counts the compressed bytes it has read and takes their CRC-32, so that a
//! file cut short or damaged is an error naming the file, the byte and the line, and the
//! cache's content digest is that of the file on disk (the one the reuse check reads again).
//!
//! gzip is read member after member (`MultiGzDecoder`: `pigz`/`bgzip` output and
//! concatenated files), zstd frame after frame. Decoding is one stream on one thread; the
//! text it yields is parsed by the other threads ([`mod@super::prepare`]).

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::error::{DataError, DataResult};
use crate::hash::Crc32;

/// A compression format ringrec decodes as it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    /// gzip (RFC 1952), one member or several.
    Gzip,
    /// Zstandard, one frame or several.
    Zstd,
}

impl Codec {
    /// The codec whose magic bytes `head` starts with.
    pub fn of_head(head: &[u8]) -> Option<Codec> {
        if head.starts_with(b"\x1f\x8b") {
            Some(Codec::Gzip)
        } else if head.starts_with(b"\x28\xb5\x2f\xfd") {
            Some(Codec::Zstd)
        } else {
            None
        }
    }

    /// Its name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Codec::Gzip => "gzip",
            Codec::Zstd => "zstd",
        }
    }
}

/// What has been read of the compressed file: its bytes and their CRC-32.
#[derive(Clone, Default)]
struct Tally {
    bytes: u64,
    digest: Crc32,
}

/// The compressed file, tallying what the decoder reads of it.
struct Tallied {
    file: File,
    tally: Arc<Mutex<Tally>>,
}

impl Read for Tallied {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read(buf)?;
        let mut t = self.tally.lock().unwrap_or_else(|p| p.into_inner());
        t.bytes += n as u64;
        t.digest.update(&buf[..n]);
        Ok(n)
    }
}

/// The text of a compressed TSV, decoded as it is read.
pub struct Decoder {
    path: PathBuf,
    codec: Codec,
    read: Box<dyn Read + Send>,
    tally: Arc<Mutex<Tally>>,
    /// Newlines of the text given so far (for messages).
    lines: u64,
}

impl Decoder {
    /// Opens `path`, compressed with `codec`.
    pub fn open(path: &Path, codec: Codec) -> DataResult<Decoder> {
        let file = crate::fileio::open_input(path).map_err(|e| DataError::io(path, "open", e))?;
        let tally = Arc::new(Mutex::new(Tally::default()));
        let raw = Tallied { file, tally: tally.clone() };
        let read: Box<dyn Read + Send> = match codec {
            Codec::Gzip => Box::new(flate2::read::MultiGzDecoder::new(raw)),
            Codec::Zstd => Box::new(zstd::stream::read::Decoder::new(raw).map_err(|e| DataError::io(path, "start decoding", e))?),
        };
        Ok(Decoder { path: path.to_path_buf(), codec, read, tally, lines: 0 })
    }

    /// Fills `buf` with text, short only at the end of the stream; returns the bytes given.
    /// A stream cut short or damaged is [`DataError::Compressed`].
    pub fn fill(&mut self, buf: &mut [u8]) -> DataResult<usize> {
        let mut n = 0;
        while n < buf.len() {
            match self.read.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => {
                    self.lines += super::prepare::count_newlines(&buf[n..n + k]);
                    n += k;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.damaged(e)),
            }
        }
        Ok(n)
    }

    fn damaged(&self, e: std::io::Error) -> DataError {
        let at = self.tally.lock().unwrap_or_else(|p| p.into_inner()).bytes;
        let what = if e.kind() == std::io::ErrorKind::UnexpectedEof { "cut short" } else { "damaged" };
        DataError::Compressed { path: self.path.clone(), codec: self.codec.name(), what, at, line: self.lines + 1, detail: e.to_string() }
    }

    /// The compressed bytes read so far and their CRC-32 (the whole file's, once the text
    /// has been read to its end).
    pub fn source_read(&self) -> (u64, u32) {
        let t = self.tally.lock().unwrap_or_else(|p| p.into_inner());
        (t.bytes, t.digest.clone().finish())
    }
}

/// Decodes the whole of `path`: its text's lines (newlines, plus one for a last line
/// without one), the text's CRC-32, and the compressed bytes and their CRC-32.
pub fn count_text(path: &Path, codec: Codec) -> DataResult<TextCount> {
    let mut d = Decoder::open(path, codec)?;
    let mut buf = vec![0u8; 1 << 20];
    let (mut lines, mut digest, mut last) = (0u64, Crc32::new(), b'\n');
    loop {
        let n = d.fill(&mut buf)?;
        if n == 0 {
            break;
        }
        lines += super::prepare::count_newlines(&buf[..n]);
        digest.update(&buf[..n]);
        last = buf[n - 1];
    }
    let (source_bytes, source_crc32) = d.source_read();
    Ok(TextCount { lines: lines + u64::from(last != b'\n'), text_crc32: digest.finish(), source_bytes, source_crc32 })
}

/// What [`count_text`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TextCount {
    /// Lines of the text.
    pub lines: u64,
    /// CRC-32 of the text.
    pub text_crc32: u32,
    /// Bytes of the compressed file read.
    pub source_bytes: u64,
    /// Their CRC-32.
    pub source_crc32: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("ringrec-compressed-unit-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn gzip(members: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for m in members {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(m).unwrap();
            out.extend(e.finish().unwrap());
        }
        out
    }

    #[test]
    fn gzip_members_and_zstd_frames_are_read_whole() {
        let d = dir();
        let text = b"a\nbb\nccc".to_vec();
        let gz = d.join("t.gz");
        std::fs::write(&gz, gzip(&[b"a\nb", b"b\nccc"])).unwrap();
        let c = count_text(&gz, Codec::Gzip).unwrap();
        assert_eq!((c.lines, c.text_crc32), (3, crate::hash::crc32(&text)));
        assert_eq!((c.source_bytes, c.source_crc32), (std::fs::metadata(&gz).unwrap().len(), crate::hash::crc32(&std::fs::read(&gz).unwrap())));
        let zst = d.join("t.zst");
        let mut z = zstd::stream::encode_all(&b"a\nb"[..], 3).unwrap();
        z.extend(zstd::stream::encode_all(&b"b\nccc"[..], 3).unwrap());
        std::fs::write(&zst, &z).unwrap();
        assert_eq!(Codec::of_head(&z), Some(Codec::Zstd));
        let c = count_text(&zst, Codec::Zstd).unwrap();
        assert_eq!((c.lines, c.text_crc32), (3, crate::hash::crc32(&text)));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_stream_cut_short_or_damaged_is_an_error_naming_the_file() {
        let d = dir().join("cut");
        std::fs::create_dir_all(&d).unwrap();
        let text: Vec<u8> = (0..20_000u32).flat_map(|i| format!("{i}\t{}\n", i * 7919).into_bytes()).collect();
        for codec in [Codec::Gzip, Codec::Zstd] {
            let whole = match codec {
                Codec::Gzip => gzip(&[&text]),
                Codec::Zstd => zstd::stream::encode_all(&text[..], 3).unwrap(),
            };
            let p = d.join(format!("t.{}", codec.name()));
            std::fs::write(&p, &whole[..whole.len() / 2]).unwrap();
            let e = count_text(&p, codec).unwrap_err().to_string();
            assert!(e.starts_with(&format!("{}: its {} stream is cut short at byte ", p.display(), codec.name())), "{e}");
            let mut bad = whole.clone();
            for b in &mut bad[whole.len() / 3..whole.len() / 3 + 64] {
                *b ^= 0x5a;
            }
            std::fs::write(&p, &bad).unwrap();
            let e = count_text(&p, codec).unwrap_err().to_string();
            assert!(e.starts_with(&format!("{}: its {} stream is ", p.display(), codec.name())) && e.contains("(line "), "{e}");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }
}
