//! Compressed Criteo TSVs read as they are published (`day_N.gz`, `.zst`): a streaming
//! decoder that counts the compressed bytes it has read and takes their CRC-32, so that a
//! file cut short or damaged is an error naming the file, the byte and the line, and the
//! cache's content digest is that of the file on disk (the one the reuse check reads again).
//!
//! gzip is read member after member (`MultiGzDecoder`: `pigz`/`bgzip` output and
//! concatenated files), zstd frame after frame; the text they yield is parsed by the other
//! threads ([`mod@super::prepare`]).
//!
//! A gzip file, and a zstd file of one frame, are decoded as one stream on one thread: a
//! deflate or zstd stream cannot be entered in its middle. A zstd file of several frames
//! (`pzstd`, `zstd -T0 --long`'s jobs do not make frames, but `pzstd` and `zstd` on
//! concatenated chunks do) is decoded on several threads: its frames are found by walking
//! the frame and block headers (RFC 8878; a block header gives its block's size) without
//! decoding ([`zstd_frames`]), each frame is decoded apart ([`FrameReader`]) and the text
//! given in file order, the same bytes as one stream's. So is a BGZF file (`bgzip`: gzip
//! members whose header gives their size, [`bgzf_blocks`]); any other gzip file is one
//! stream. A file whose headers do not walk to its end (cut short, damaged) is read as one
//! stream, whose error names the byte.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};

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
        } else if head.starts_with(b"\x28\xb5\x2f\xfd") || (head.len() >= 4 && head[0] & 0xf0 == 0x50 && head[1..4] == *b"\x2a\x4d\x18") {
            // A zstd frame, or a skippable frame (`pzstd` starts with one).
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
    /// Whether its frames are decoded on threads of their own ([`FrameReader`]).
    parallel: bool,
}

impl Decoder {
    /// Opens `path`, compressed with `codec`, to be decoded on up to `threads` threads (a
    /// zstd file of several frames; see the module docs).
    pub fn open(path: &Path, codec: Codec, threads: usize) -> DataResult<Decoder> {
        let file = crate::fileio::open_input(path).map_err(|e| DataError::io(path, "open", e))?;
        let tally = Arc::new(Mutex::new(Tally::default()));
        if threads > 1 {
            let len = file.metadata().map_err(|e| DataError::io(path, "read the size of", e))?.len();
            let frames = match codec {
                Codec::Gzip => bgzf_blocks(&file, len),
                Codec::Zstd => zstd_frames(&file, len),
            };
            if let Some(frames) = frames.filter(|f| f.iter().filter(|f| !f.skippable).count() > 1) {
                let read = Box::new(FrameReader::start(file, codec, frames, threads, tally.clone()));
                return Ok(Decoder { path: path.to_path_buf(), codec, read, tally, lines: 0, parallel: true });
            }
        }
        let raw = Tallied { file, tally: tally.clone() };
        let read: Box<dyn Read + Send> = match codec {
            Codec::Gzip => Box::new(flate2::read::MultiGzDecoder::new(raw)),
            Codec::Zstd => Box::new(zstd::stream::read::Decoder::new(raw).map_err(|e| DataError::io(path, "start decoding", e))?),
        };
        Ok(Decoder { path: path.to_path_buf(), codec, read, tally, lines: 0, parallel: false })
    }

    /// Whether its frames are decoded on threads of their own, so that the thread reading
    /// it mostly waits (a zstd file of several frames, a BGZF file): a prepare then parses
    /// on every thread beside it.
    pub fn is_parallel(&self) -> bool {
        self.parallel
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

/// One frame of a zstd file: its bytes `start..end`; a skippable frame holds no text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    /// Its first byte in the file.
    pub start: u64,
    /// The byte after its last.
    pub end: u64,
    /// A skippable frame (magic 0x184D2A5?): user data, no text.
    pub skippable: bool,
}

/// The frames of the zstd file `file` of `len` bytes, found by walking the frame headers
/// and the block headers (RFC 8878) without decoding; `None` when they do not walk to its
/// end exactly (a file cut short or damaged, or not zstd).
pub fn zstd_frames(file: &File, len: u64) -> Option<Vec<Frame>> {
    let read = |at: u64, n: usize| -> Option<u32> {
        let mut b = [0u8; 4];
        file.read_exact_at(&mut b[..n], at).ok()?;
        Some(u32::from_le_bytes(b))
    };
    let (mut at, mut frames) = (0u64, Vec::new());
    while at < len {
        let start = at;
        let magic = read(at, 4)?;
        if magic & 0xFFFF_FFF0 == 0x184D_2A50 {
            at = at.checked_add(8)?.checked_add(u64::from(read(at + 4, 4)?))?;
            frames.push(Frame { start, end: at, skippable: true });
            continue;
        }
        if magic != 0xFD2F_B528 {
            return None;
        }
        let fhd = read(at + 4, 1)?;
        if fhd & 0x08 != 0 {
            return None; // the reserved bit
        }
        let single_segment = fhd & 0x20 != 0;
        let window = u64::from(!single_segment);
        let dictionary = [0, 1, 2, 4][(fhd & 3) as usize];
        let content_size = match fhd >> 6 {
            0 => u64::from(single_segment),
            1 => 2,
            2 => 4,
            _ => 8,
        };
        at += 5 + window + dictionary + content_size;
        loop {
            let h = read(at, 3)?;
            let size = u64::from(h >> 3);
            at += 3 + match (h >> 1) & 3 {
                0 | 2 => size, // raw, compressed: the block's bytes
                1 => 1,        // RLE: one byte, repeated
                _ => return None,
            };
            if at > len {
                return None;
            }
            if h & 1 == 1 {
                break;
            }
        }
        if fhd & 0x04 != 0 {
            at += 4; // the content checksum
        }
        if at > len {
            return None;
        }
        frames.push(Frame { start, end: at, skippable: false });
    }
    Some(frames)
}

/// The members of the BGZF file `file` of `len` bytes (`bgzip`'s gzip: each member's
/// header has the extra subfield `BC` giving its size), found by walking the headers without
/// decoding; `None` when a member lacks the subfield or they do not walk to the end.
pub fn bgzf_blocks(file: &File, len: u64) -> Option<Vec<Frame>> {
    let (mut at, mut blocks) = (0u64, Vec::new());
    let mut head = [0u8; 12];
    while at < len {
        file.read_exact_at(&mut head, at).ok()?;
        // ID1 ID2, deflate, FLG = FEXTRA alone, MTIME, XFL, OS, XLEN.
        if head[..4] != [0x1f, 0x8b, 8, 4] {
            return None;
        }
        let xlen = usize::from(u16::from_le_bytes([head[10], head[11]]));
        let mut extra = vec![0u8; xlen];
        file.read_exact_at(&mut extra, at + 12).ok()?;
        let mut size = None;
        let mut sub = &extra[..];
        while sub.len() >= 4 {
            let slen = usize::from(u16::from_le_bytes([sub[2], sub[3]]));
            let data = sub.get(4..4 + slen)?;
            if sub[..2] == *b"BC" && slen == 2 {
                size = Some(u64::from(u16::from_le_bytes([data[0], data[1]])) + 1);
            }
            sub = &sub[4 + slen..];
        }
        let end = at.checked_add(size?)?;
        if end > len || end < at + 12 + xlen as u64 + 8 {
            return None;
        }
        blocks.push(Frame { start: at, end, skippable: false });
        at = end;
    }
    Some(blocks)
}

/// What the frame readers share.
struct FrameWork {
    file: File,
    codec: Codec,
    frames: Vec<Frame>,
    state: Mutex<FrameState>,
    /// Signalled when a frame is decoded, given, or the reader is dropped.
    turn: Condvar,
    /// Frames decoded ahead of the one being given, at most.
    ahead: usize,
}

/// The frames claimed, given and decoded (not yet given).
#[derive(Default)]
struct FrameState {
    claimed: usize,
    given: usize,
    decoded: BTreeMap<usize, std::io::Result<(Vec<u8>, Crc32)>>,
    stop: bool,
}

/// The text of a zstd file's frames (a BGZF file's members), each decoded on one of several threads, given in file
/// order (see the module docs); the compressed bytes are tallied frame by frame as their
/// text is given, so that an error names the first byte of the frame it is in.
pub struct FrameReader {
    work: Arc<FrameWork>,
    threads: Vec<std::thread::JoinHandle<()>>,
    text: Vec<u8>,
    at: usize,
    tally: Arc<Mutex<Tally>>,
}

impl FrameReader {
    /// Starts `threads` threads decoding `frames` of `file`, compressed with `codec`.
    fn start(file: File, codec: Codec, frames: Vec<Frame>, threads: usize, tally: Arc<Mutex<Tally>>) -> FrameReader {
        let work = Arc::new(FrameWork { file, codec, frames, state: Mutex::new(FrameState::default()), turn: Condvar::new(), ahead: 2 * threads });
        let threads = (0..threads.min(work.frames.len()))
            .map(|_| {
                let work = work.clone();
                std::thread::spawn(move || work.decode_frames())
            })
            .collect();
        FrameReader { work, threads, text: Vec::new(), at: 0, tally }
    }

    /// The text of the next frame, once decoded; `None` after the last.
    fn next_frame(&mut self) -> Option<std::io::Result<Vec<u8>>> {
        let w = &self.work;
        let mut st = w.state.lock().unwrap_or_else(|p| p.into_inner());
        let i = st.given;
        let frame = *w.frames.get(i)?;
        let decoded = loop {
            if let Some(d) = st.decoded.remove(&i) {
                break d;
            }
            st = w.turn.wait(st).unwrap_or_else(|p| p.into_inner());
        };
        st.given += 1;
        w.turn.notify_all();
        drop(st);
        Some(decoded.map(|(text, digest)| {
            let mut t = self.tally.lock().unwrap_or_else(|p| p.into_inner());
            t.bytes += frame.end - frame.start;
            t.digest.combine(&digest);
            text
        }))
    }
}

impl FrameWork {
    /// One thread's work: the next frame not claimed, decoded, while the reader needs it.
    fn decode_frames(&self) {
        loop {
            let i = {
                let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                while !st.stop && st.claimed < self.frames.len() && st.claimed >= st.given + self.ahead {
                    st = self.turn.wait(st).unwrap_or_else(|p| p.into_inner());
                }
                if st.stop || st.claimed >= self.frames.len() {
                    return;
                }
                st.claimed += 1;
                st.claimed - 1
            };
            let decoded = self.decode(self.frames[i]);
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            st.decoded.insert(i, decoded);
            self.turn.notify_all();
        }
    }

    /// A frame's text and the CRC-32 of its compressed bytes.
    fn decode(&self, f: Frame) -> std::io::Result<(Vec<u8>, Crc32)> {
        let len = usize::try_from(f.end - f.start).map_err(|_| std::io::Error::other("a frame larger than the address space"))?;
        let mut bytes = vec![0u8; len];
        self.file.read_exact_at(&mut bytes, f.start)?;
        let mut digest = Crc32::new();
        digest.update(&bytes);
        let text = match (f.skippable, self.codec) {
            (true, _) => Vec::new(),
            (false, Codec::Zstd) => zstd::stream::decode_all(&bytes[..])?,
            (false, Codec::Gzip) => {
                let mut text = Vec::new();
                flate2::read::GzDecoder::new(&bytes[..]).read_to_end(&mut text)?;
                text
            }
        };
        Ok((text, digest))
    }
}

impl Read for FrameReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.at == self.text.len() {
            match self.next_frame() {
                None => return Ok(0),
                Some(text) => (self.text, self.at) = (text?, 0),
            }
        }
        let n = buf.len().min(self.text.len() - self.at);
        buf[..n].copy_from_slice(&self.text[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

impl Drop for FrameReader {
    fn drop(&mut self) {
        self.work.state.lock().unwrap_or_else(|p| p.into_inner()).stop = true;
        self.work.turn.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// The tests' reference (prepare decodes once, counting as it parses): decodes the whole
    /// of `path` on up to `threads` threads: its text's lines (newlines, plus one for a last
    /// line without one), the text's CRC-32, and the compressed bytes and their CRC-32.
    fn count_text(path: &Path, codec: Codec, threads: usize) -> DataResult<TextCount> {
        let mut d = Decoder::open(path, codec, threads)?;
        let mut buf = vec![0u8; 1 << 20];
        let (mut lines, mut digest, mut last) = (0u64, Crc32::new(), b'\n');
        loop {
            let n = d.fill(&mut buf)?;
            if n == 0 {
                break;
            }
            lines += crate::data::prepare::count_newlines(&buf[..n]);
            digest.update(&buf[..n]);
            last = buf[n - 1];
        }
        let (source_bytes, source_crc32) = d.source_read();
        Ok(TextCount { lines: lines + u64::from(last != b'\n'), text_crc32: digest.finish(), source_bytes, source_crc32 })
    }

    /// What [`count_text`] found.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    struct TextCount {
        /// Lines of the text.
        lines: u64,
        /// CRC-32 of the text.
        text_crc32: u32,
        /// Bytes of the compressed file read.
        source_bytes: u64,
        /// Their CRC-32.
        source_crc32: u32,
    }

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
        let c = count_text(&gz, Codec::Gzip, 2).unwrap();
        assert_eq!((c.lines, c.text_crc32), (3, crate::hash::crc32(&text)));
        assert_eq!((c.source_bytes, c.source_crc32), (std::fs::metadata(&gz).unwrap().len(), crate::hash::crc32(&std::fs::read(&gz).unwrap())));
        let zst = d.join("t.zst");
        let mut z = zstd::stream::encode_all(&b"a\nb"[..], 3).unwrap();
        z.extend(zstd::stream::encode_all(&b"b\nccc"[..], 3).unwrap());
        std::fs::write(&zst, &z).unwrap();
        assert_eq!(Codec::of_head(&z), Some(Codec::Zstd));
        let c = count_text(&zst, Codec::Zstd, 2).unwrap();
        assert_eq!((c.lines, c.text_crc32), (3, crate::hash::crc32(&text)));
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// The text `count_text` and a [`Decoder`] give of `p` on `threads` threads.
    fn decoded(p: &Path, codec: Codec, threads: usize) -> (TextCount, Vec<u8>) {
        let mut d = Decoder::open(p, codec, threads).unwrap();
        let (mut text, mut buf) = (Vec::new(), vec![0u8; 1000]);
        while let n @ 1.. = d.fill(&mut buf).unwrap() {
            text.extend_from_slice(&buf[..n]);
        }
        (count_text(p, codec, threads).unwrap(), text)
    }

    /// `parts` as BGZF members (`bgzip`'s: the extra subfield `BC` gives each one's size).
    fn bgzf(parts: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in parts {
            let mut e = flate2::GzBuilder::new().extra(b"BC\x02\x00\x00\x00".to_vec()).write(Vec::new(), flate2::Compression::fast());
            e.write_all(p).unwrap();
            let mut m = e.finish().unwrap();
            let size = u16::try_from(m.len() - 1).unwrap().to_le_bytes();
            m[16..18].copy_from_slice(&size);
            out.extend(m);
        }
        out
    }

    #[test]
    fn a_bgzf_file_is_decoded_member_by_member_and_other_gzip_as_one_stream() {
        let d = std::env::temp_dir().join(format!("ringrec-bgzf-unit-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let text: Vec<u8> = (0..30_000u32).flat_map(|i| format!("{}\t{}\n", i % 89, i.wrapping_mul(2_654_435_761)).into_bytes()).collect();
        let parts: Vec<&[u8]> = text.chunks(60_000).chain([&[][..]]).collect(); // and the EOF marker
        let z = bgzf(&parts);
        let p = d.join("t.gz");
        std::fs::write(&p, &z).unwrap();
        let blocks = bgzf_blocks(&File::open(&p).unwrap(), z.len() as u64).unwrap();
        assert_eq!((blocks.len(), blocks.last().map(|b| b.end)), (parts.len(), Some(z.len() as u64)));
        let (one, text1) = decoded(&p, Codec::Gzip, 1);
        let (four, text4) = decoded(&p, Codec::Gzip, 4);
        assert!(text1 == text && text4 == text);
        assert_eq!((one, four.source_crc32), (four, crate::hash::crc32(&z)));
        // A member without the subfield: the file is one stream.
        let plain = [gzip(&[&text[..1000]]), z.clone()].concat();
        std::fs::write(&p, &plain).unwrap();
        assert_eq!(bgzf_blocks(&File::open(&p).unwrap(), plain.len() as u64), None);
        assert_eq!(decoded(&p, Codec::Gzip, 4).1, [&text[..1000], &text].concat());
        // A damaged member of several: the error names its first byte.
        let mut bad = z.clone();
        let b = blocks[3];
        bad[(b.start + 40) as usize..][..64].fill(0x55);
        std::fs::write(&p, &bad).unwrap();
        let e = count_text(&p, Codec::Gzip, 4).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{}: its gzip stream is damaged at byte {} of the file", p.display(), b.start)), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_zstd_file_of_several_frames_is_walked_and_decoded_frame_by_frame_to_the_same_text() {
        let d = std::env::temp_dir().join(format!("ringrec-zstd-frames-unit-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        // Frames of every block kind and header: compressed blocks (several a frame), raw
        // blocks (incompressible bytes), RLE blocks (a run), with and without a content
        // size and a checksum, a skippable frame, an empty frame.
        let lines: Vec<u8> = (0..40_000u32).flat_map(|i| format!("{}\t{}\n", i % 97, i.wrapping_mul(2_654_435_761)).into_bytes()).collect();
        let noise: Vec<u8> = (0..300_000u64).map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8).collect();
        let run = vec![b'a'; 500_000];
        let mut z = Vec::new();
        for (k, part) in [&lines[..], &noise, &run, &lines[..10], &[][..]].into_iter().enumerate() {
            let mut e = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
            e.include_checksum(k % 2 == 0).unwrap();
            e.include_contentsize(k % 3 != 1).unwrap();
            e.set_pledged_src_size(if k % 3 != 1 { Some(part.len() as u64) } else { None }).unwrap();
            e.write_all(part).unwrap();
            z.extend(e.finish().unwrap());
            if k == 1 {
                z.extend([0x5a, 0x2a, 0x4d, 0x18, 3, 0, 0, 0, 1, 2, 3]); // skippable, 3 bytes
            }
        }
        let text = [&lines[..], &noise, &run, &lines[..10]].concat();
        let p = d.join("t.zst");
        std::fs::write(&p, &z).unwrap();
        let frames = zstd_frames(&File::open(&p).unwrap(), z.len() as u64).unwrap();
        assert_eq!((frames.len(), frames.iter().filter(|f| f.skippable).count(), frames[0].start, frames[5].end), (6, 1, 0, z.len() as u64));
        assert!(frames.windows(2).all(|w| w[0].end == w[1].start));
        let (one, text1) = decoded(&p, Codec::Zstd, 1);
        let (four, text4) = decoded(&p, Codec::Zstd, 4);
        assert!(text1 == text && text4 == text, "the text of one stream, and of the frames");
        assert_eq!(one, four);
        assert_eq!((four.text_crc32, four.source_bytes, four.source_crc32), (crate::hash::crc32(&text), z.len() as u64, crate::hash::crc32(&z)));
        // A file that starts with a skippable frame (as `pzstd` writes them) is zstd.
        let pz = [&[0x50, 0x2a, 0x4d, 0x18, 4, 0, 0, 0, 9, 9, 9, 9][..], &z].concat();
        assert_eq!(Codec::of_head(&pz), Some(Codec::Zstd));
        std::fs::write(&p, &pz).unwrap();
        assert_eq!(zstd_frames(&File::open(&p).unwrap(), pz.len() as u64).map(|f| f.len()), Some(7));
        assert!(decoded(&p, Codec::Zstd, 1).1 == text && decoded(&p, Codec::Zstd, 3).1 == text);
        // Headers that do not walk to the end: read as one stream.
        assert_eq!(zstd_frames(&File::open(&p).unwrap(), z.len() as u64 + 1), None);
        std::fs::write(&p, &z[..z.len() - 1]).unwrap();
        assert_eq!(zstd_frames(&File::open(&p).unwrap(), z.len() as u64 - 1), None);
        std::fs::write(&p, &text[..100]).unwrap();
        assert_eq!(zstd_frames(&File::open(&p).unwrap(), 100), None);
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
            let e = count_text(&p, codec, 2).unwrap_err().to_string();
            assert!(e.starts_with(&format!("{}: its {} stream is cut short at byte ", p.display(), codec.name())), "{e}");
            let mut bad = whole.clone();
            for b in &mut bad[whole.len() / 3..whole.len() / 3 + 64] {
                *b ^= 0x5a;
            }
            std::fs::write(&p, &bad).unwrap();
            let e = count_text(&p, codec, 2).unwrap_err().to_string();
            assert!(e.starts_with(&format!("{}: its {} stream is ", p.display(), codec.name())) && e.contains("(line "), "{e}");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }
}
