//! Converting a Criteo TSV into a cache file ([`prepare`]) on several threads, the file the
//! same byte for byte whatever their number.
//!
//! The TSV is read twice, as a whole number of byte ranges, each by one thread:
//!
//! 1. **Count.** The file is cut into one range per thread; each counts its newlines and
//!    takes its CRC-32, and the CRC-32s are combined in order. The line count sizes the
//!    column sections (the file is allocated in full before anything is written).
//! 2. **Parse.** The file is cut into chunks of [`PrepareOptions::chunk_bytes`] (2 MiB) at
//!    line boundaries: chunk `c` holds the lines that start in bytes `[c S, (c + 1) S)`. The
//!    threads take the chunks in order, each parsing one into columns in memory. A parsed
//!    chunk is *committed* in file order — its first row becomes known, its malformed lines
//!    join the report, `max_bad_lines` is checked, its CRC-32 joins the digest — and then
//!    written at its rows' offsets by the thread that parsed it, while the others parse on.
//!
//! So the report is the one a sequential read ([`crate::data::CriteoReader`]) gives: the
//! first malformed lines are the first in file order, the counts exact, and the limit
//! stops at the very line that exceeds it (the chunk that crosses it is parsed again, up to
//! that line). Memory: about two chunks per thread. Then the block sums of the sections
//! are read back (in parallel), the header written and the file renamed into place.
//!
//! A gzip- or zstd-compressed TSV ([`super::compressed`]) is decoded once, as one stream,
//! on this thread into chunks cut at line ends, which the other threads parse and commit
//! as above. Its lines are not known before the end, so the committed chunks' columns go
//! to a [`Spill`] (one temporary file per section beside the cache, each row at its
//! index), and once the stream ends the cache is allocated for the lines read and the
//! sections copied into it (in parallel, a chunk's bytes per thread at a time): the same
//! file as a plain TSV's. The spill takes the columns' bytes on disk beside the cache while
//! it is copied. Its content digest is the compressed file's, taken by the decoder as it
//! reads, and read again at the end (a cheap pass beside decoding). A zstd file of several
//! frames (a BGZF file) is decoded frame by frame on every thread, the stream the same
//! text, and then parsed on every thread too: the decoding threads are cheap beside the
//! parsing, and the feeding thread mostly waits.
//!
//! A source that changes while it is read (another line count, another CRC-32 in the two
//! reads, another stat after them) is [`DataError::SourceChanged`].

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex};

use super::cache::{now_ns, CacheHeader, CacheLayout, SourceStat, CACHE_MODE, DENSE_VALUE_BYTES, KEY_BYTES, LABEL_BYTES, WEIGHT_BYTES};
use super::compressed::{Codec, Decoder};
use super::criteo::{parse_text, BadLineReport, Columns};
use super::error::{DataError, DataResult};
use super::schema::ColumnSpec;
use crate::fileio::{reserve, AtomicFile};
use crate::hash::{crc32, Crc32, CHECKSUM_BLOCK};

/// Default [`PrepareOptions::chunk_bytes`]: 2 MiB of TSV (about 8,000 Criteo lines), so a
/// thread holds about 4 MiB (the text and its columns) and a file spreads evenly over the
/// threads.
pub const CHUNK_BYTES: u64 = 2 << 20;
/// Bytes read at a time where a whole chunk is not needed (counting, finding line starts).
const READ_BYTES: usize = 1 << 20;

/// How [`prepare_with`] converts a file.
#[derive(Clone, Debug)]
pub struct PrepareOptions {
    /// Malformed lines to skip (and count) before giving up; 0 accepts none.
    pub max_bad_lines: u64,
    /// Threads reading the TSV (at least 1).
    pub threads: usize,
    /// Bytes of TSV a thread parses at a time (the unit of work and of memory).
    pub chunk_bytes: u64,
    /// Set from another thread to stop the preparation ([`DataError::Cancelled`]).
    pub cancel: Option<Arc<AtomicBool>>,
    /// `--weight-column`: the 1-based field of the weight in lines of 41 fields (the cache
    /// is then version 3, with the weights); `None`: Criteo's 40 fields (version 2).
    pub weight_column: Option<u32>,
    /// A Parquet file's named columns: label, weight, features and their transforms (the
    /// default names none: see [`super::parquet_file`]).
    pub columns: ColumnSpec,
}

/// The weight column a cache's header records for weights read from a named column (a
/// Parquet file's `--weight-column NAME` or schema `weight`), not from a TSV's field.
pub const NAMED_WEIGHT_COLUMN: u32 = 0;

impl PrepareOptions {
    /// One thread per core, 2 MiB chunks, no cancellation.
    pub fn new(max_bad_lines: u64) -> PrepareOptions {
        PrepareOptions { max_bad_lines, threads: all_cores(), chunk_bytes: CHUNK_BYTES, cancel: None, weight_column: None, columns: ColumnSpec::default() }
    }

    /// The same reading lines with a weight in field `column` (or not).
    pub fn weight_column(self, column: Option<u32>) -> PrepareOptions {
        PrepareOptions { weight_column: column, ..self }
    }

    /// The same reading a Parquet file's columns as `columns` names them.
    pub fn columns(self, columns: ColumnSpec) -> PrepareOptions {
        PrepareOptions { columns, ..self }
    }

    /// The same with `threads` threads.
    pub fn threads(self, threads: usize) -> PrepareOptions {
        PrepareOptions { threads: threads.max(1), ..self }
    }

    /// The weight column the cache records: the TSV's field, or [`NAMED_WEIGHT_COLUMN`] for
    /// a named one; `None`: no weights (a version-2 cache).
    pub fn weights_field(&self) -> Option<u32> {
        self.weight_column.or(self.columns.weight.as_ref().map(|_| NAMED_WEIGHT_COLUMN))
    }

    fn cancelled(&self) -> bool {
        self.cancel.as_ref().is_some_and(|c| c.load(Ordering::Relaxed))
    }
}

/// The cores of this machine (1 when unknown): the default of `--threads`.
pub fn all_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// What [`prepare`] wrote.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PrepareSummary {
    /// The cache file.
    pub path: PathBuf,
    /// Rows written.
    pub rows: u64,
    /// Size of the cache file.
    pub bytes: u64,
    /// Size of the source TSV.
    pub source_bytes: u64,
    /// CRC-32 of the whole source TSV.
    pub source_crc32: u32,
    /// Threads that read it.
    pub threads: usize,
    /// Of those, the threads that parsed its text: all of them, but one for a compressed
    /// TSV decoded as one stream (that one decodes).
    pub parsing_threads: usize,
    /// Lines read, malformed lines by kind and the first of them.
    pub report: BadLineReport,
    /// Null values read as an empty field's (a Parquet file's; 0 for a TSV).
    pub nulls: u64,
    /// A Parquet file's nulls by column, in the order its schema reads them (empty for a TSV).
    pub column_nulls: Vec<(String, u64)>,
}

/// Runs `work(t)` for `t` in `0..threads`, on this thread when there is one, returning the
/// results in order.
pub(crate) fn on_threads<T: Send>(threads: usize, work: impl Fn(usize) -> T + Sync) -> Vec<T> {
    if threads <= 1 {
        return vec![work(0)];
    }
    std::thread::scope(|s| {
        let work = &work;
        let handles: Vec<_> = (0..threads).map(|t| s.spawn(move || work(t))).collect();
        // A panic in a worker is a bug: pass it on.
        handles.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
    })
}

/// Reads `buf.len()` bytes of `f` at `at`; a file shorter than that changed meanwhile.
fn read_at(f: &File, path: &Path, buf: &mut [u8], at: u64) -> DataResult<()> {
    f.read_exact_at(buf, at).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => DataError::SourceChanged { path: path.to_path_buf(), detail: format!("it became shorter than the {} bytes read", at + buf.len() as u64) },
        _ => DataError::io(path, "read", e),
    })
}

/// Newlines in `bytes`, counted in u8 lanes over runs of 255 bytes (which vectorises: a
/// tenth of the time of a filter and count).
pub(crate) fn count_newlines(bytes: &[u8]) -> u64 {
    bytes.chunks(255).map(|c| c.iter().fold(0u8, |n, &b| n + u8::from(b == b'\n')) as u64).sum()
}

/// Lines of the file `path` of `len` bytes (newlines, plus one for a last line without a
/// newline) and its CRC-32, read in `threads` ranges at once.
pub fn count_lines(path: &Path, len: u64, threads: usize) -> DataResult<(u64, u32)> {
    let f = crate::fileio::open_input(path).map_err(|e| DataError::io(path, "open", e))?;
    let threads = threads.max(1);
    let parts = on_threads(threads, |t| -> DataResult<(u64, Crc32)> {
        let (start, end) = (len * t as u64 / threads as u64, len * (t as u64 + 1) / threads as u64);
        let mut buf = vec![0u8; READ_BYTES.min((end - start) as usize)];
        let (mut lines, mut digest, mut at) = (0u64, Crc32::new(), start);
        while at < end {
            let n = (end - at).min(buf.len() as u64) as usize;
            read_at(&f, path, &mut buf[..n], at)?;
            lines += count_newlines(&buf[..n]);
            digest.update(&buf[..n]);
            at += n as u64;
        }
        Ok((lines, digest))
    });
    let (mut lines, mut digest) = (0u64, Crc32::new());
    for p in parts {
        let (l, d) = p?;
        lines += l;
        digest.combine(&d);
    }
    if len > 0 {
        let mut last = [0u8];
        read_at(&f, path, &mut last, len - 1)?;
        lines += u64::from(last[0] != b'\n');
    }
    Ok((lines, digest.finish()))
}

/// The first line start at or after byte `x` of a file of `len` bytes: `x` when a line
/// starts there, else one past the next newline (`len` when there is none).
fn line_start(f: &File, path: &Path, x: u64, len: u64) -> DataResult<u64> {
    if x == 0 || x >= len {
        return Ok(x.min(len));
    }
    // Lines are short: a few KiB at a time.
    let mut buf = vec![0u8; 4 << 10];
    let mut at = x - 1;
    while at < len {
        let n = (len - at).min(buf.len() as u64) as usize;
        read_at(f, path, &mut buf[..n], at)?;
        if let Some(p) = super::criteo::find_byte(&buf[..n], b'\n') {
            return Ok(at + p as u64 + 1);
        }
        at += n as u64;
    }
    Ok(len)
}

/// What the chunks committed so far add up to (see the module docs).
struct Committed {
    /// The next chunk to commit.
    next: usize,
    /// Rows written or being written.
    rows: u64,
    /// Lines, rows and malformed lines of the committed chunks.
    report: BadLineReport,
    /// CRC-32 of the committed chunks' bytes, in order.
    digest: Crc32,
    /// The first failure (in file order where it is a chunk's).
    failed: Option<DataError>,
}

/// Converts the Criteo TSV `tsv` into the cache file `out` (written atomically, mode 0600)
/// on one thread per core, skipping and counting malformed lines up to `max_bad_lines`
/// (see [`crate::data::criteo`]). [`prepare_with`] chooses the threads.
pub fn prepare(tsv: &Path, out: &Path, max_bad_lines: u64) -> DataResult<PrepareSummary> {
    prepare_with(tsv, out, &PrepareOptions::new(max_bad_lines))
}

/// Converts `tsv` into the cache file `out` as `opts` says (see the module docs).
///
/// The file is allocated in full before the columns are written (a compressed TSV's once
/// its text is read, its columns spilled until then: see the module docs), so a lack of
/// space is an error naming the directory and the bytes needed and free, and leaves no
/// temporary file. Memory use is about two chunks per thread, whatever the size of the file.
pub fn prepare_with(tsv: &Path, out: &Path, opts: &PrepareOptions) -> DataResult<PrepareSummary> {
    if let Some(c) = opts.weight_column {
        super::criteo::check_weight_column(c).map_err(DataError::InvalidArgument)?;
    }
    let codec = match classify(tsv)? {
        Source::Tsv => None,
        Source::Compressed(codec) => Some(codec),
        Source::Parquet => return super::parquet_file::prepare(tsv, out, opts),
    };
    if let Some(name) = &opts.columns.weight {
        return Err(DataError::InvalidArgument(format!("{}: the weight column `{name}` is a Parquet file's column; a TSV's weight is a field number (--weight-column N)", tsv.display())));
    }
    let threads = opts.threads.max(1);
    let weighted = opts.weight_column.is_some();
    let source = SourceStat::of(tsv)?;
    let len = source.size;
    let (tmp, st, counted, source_crc32, parsing_threads) = match codec {
        None => {
            // The lines size the sections; the text's CRC-32 is checked again as it is parsed.
            let (capacity, crc) = count_lines(tsv, len, threads)?;
            let layout0 = CacheLayout::compute(0, capacity, weighted).ok_or_else(|| source_changed(tsv, format!("{capacity} lines do not fit in the address space")))?;
            let tmp = allocate(out, &layout0)?;
            let src = crate::fileio::open_input(tsv).map_err(|e| DataError::io(tsv, "open", e))?;
            let chunk = opts.chunk_bytes.max(1);
            let count = len.div_ceil(chunk) as usize;
            let chunks = Chunks::new(tsv, Feed::File { src, len, chunk, count }, capacity, opts, Sink::Cache(&tmp, layout0));
            let parsers = threads.min(count.max(1));
            on_threads(parsers, |_| chunks.work());
            let st = chunks.committed()?;
            (tmp, st, Some((capacity, crc)), crc, parsers)
        }
        Some(codec) => {
            let (tx, rx) = sync_channel(2 * threads);
            let spill = Spill::create(out, weighted)?;
            let chunks = Chunks::new(tsv, Feed::Stream(Mutex::new(rx)), u64::MAX, opts, Sink::Spill(&spill));
            let dec = Decoder::open(tsv, codec, threads)?;
            // Parsing on the other cores while this thread decodes; on every core when the
            // frames are decoded on threads of their own (this thread then mostly waits,
            // and parsing, not decoding, is the bulk of the work).
            let parsers = if dec.is_parallel() { threads } else { threads.saturating_sub(1).max(1) };
            let (bytes, crc) = std::thread::scope(|s| {
                for _ in 0..parsers {
                    s.spawn(|| chunks.work());
                }
                chunks.feed(dec, tx)
            })?;
            let st = chunks.committed()?;
            // The compressed bytes read again: the file decoded is the file on disk.
            let (_, again) = count_lines(tsv, len, threads)?;
            if (bytes, crc) != (len, again) {
                return Err(source_changed(tsv, format!("{bytes} bytes of CRC-32 {crc:08x} decoded, {len} bytes of CRC-32 {again:08x} read again after")));
            }
            let capacity = st.report.lines;
            let layout = CacheLayout::compute(st.rows, capacity, weighted).ok_or_else(|| source_changed(tsv, format!("{capacity} lines do not fit in the address space")))?;
            let tmp = allocate(out, &layout)?;
            spill.copy_into(&tmp, &layout, threads, opts.chunk_bytes)?;
            (tmp, st, None, crc, parsers)
        }
    };
    let file = tmp.file();
    let prepared_ns = check_whole(tsv, &st, &source, counted)?;
    let capacity = counted.map_or(st.report.lines, |(lines, _)| lines);
    let (rows, report) = (st.rows, st.report);
    let layout = CacheLayout::compute(rows, capacity, weighted).ok_or_else(|| source_changed(tsv, "row count exceeds line count".into()))?;
    let sums_crc32 = write_sums(&tmp, &layout, threads)?;
    let header = CacheHeader {
        rows,
        row_capacity: capacity,
        lines: report.lines,
        bad_lines: report.bad(),
        bad_counts: report.counts,
        weight_column: opts.weight_column,
        list_fields: 0,
        fields: super::fields::Fields::CRITEO,
        source,
        source_crc32,
        prepared_ns,
        sums_crc32,
        layout,
    };
    file.write_all_at(&header.encode(), 0).map_err(|e| DataError::io(tmp.path(), "write", e))?;
    tmp.commit()?;
    Ok(PrepareSummary { path: out.to_path_buf(), rows, bytes: layout.file_len, source_bytes: len, source_crc32, threads, parsing_threads, report, nulls: 0, column_nulls: Vec::new() })
}

/// Compressed formats ringrec does not decode, by their magic bytes, with the command that
/// decompresses one.
const COMPRESSED: [(&[u8], &str, &str); 2] = [(b"BZh", "bzip2", "bunzip2 -k"), (b"\xfd7zXZ\0", "xz", "unxz -k")];

/// What an input to prepare is, by its first bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A plain Criteo TSV.
    Tsv,
    /// A Criteo TSV compressed with a codec ringrec decodes as it reads (gzip, zstd).
    Compressed(Codec),
    /// A Parquet file ([`super::parquet_file`]).
    Parquet,
}

/// What `tsv` is, by its first bytes; refuses an input that is not a TSV: a prepared cache
/// (its magic), or a file compressed in a format ringrec does not decode (bzip2, xz), each
/// saying what to do.
pub fn classify(tsv: &Path) -> DataResult<Source> {
    use std::io::Read;
    let mut head = Vec::with_capacity(8);
    crate::fileio::open_input(tsv).and_then(|f| f.take(8).read_to_end(&mut head)).map_err(|e| DataError::io(tsv, "read", e))?;
    let what = if head.starts_with(&super::cache::FORMAT.magic) {
        format!("it is already a prepared dataset cache; give it to `train --data` or `predict --data` as it is, or read it with `ringrec data inspect {}`", tsv.display())
    } else if let Some((_, name, undo)) = COMPRESSED.iter().find(|(magic, _, _)| head.starts_with(magic)) {
        format!("it is {name}-compressed, and ringrec reads plain, gzip- or zstd-compressed TSV: decompress it first ({undo} {})", tsv.display())
    } else if head.starts_with(super::parquet_file::MAGIC) {
        return Ok(Source::Parquet);
    } else if let Some(codec) = Codec::of_head(&head) {
        return Ok(Source::Compressed(codec));
    } else {
        return Ok(Source::Tsv);
    };
    Err(DataError::NotATsv { path: tsv.to_path_buf(), what })
}

/// The error of a source that changed while it was read.
fn source_changed(tsv: &Path, detail: String) -> DataError {
    DataError::SourceChanged { path: tsv.to_path_buf(), detail }
}

/// The temporary cache file of `layout` beside `out`, allocated in full (a lack of space is
/// an error naming the directory, the bytes needed and free).
fn allocate(out: &Path, layout: &CacheLayout) -> DataResult<AtomicFile> {
    let tmp = AtomicFile::create(out, CACHE_MODE)?;
    reserve(tmp.file(), tmp.path(), layout.file_len)?;
    // Where the filesystem cannot allocate ahead, reserve leaves the length to us.
    tmp.file().set_len(layout.file_len).map_err(|e| DataError::io(tmp.path(), "write", e))?;
    Ok(tmp)
}

/// Checks that the committed chunks `st` are the whole source, unchanged since it was
/// first read: not every line malformed, for a plain TSV (`counted`: its lines and their
/// CRC-32) as many lines as counted and the same CRC-32 of the text, and the same stat.
/// Returns when the cache was prepared (nanoseconds, read with the last stat).
fn check_whole(tsv: &Path, st: &Committed, source: &SourceStat, counted: Option<(u64, u32)>) -> DataResult<u64> {
    let report = &st.report;
    if st.rows == 0 && report.bad() == report.count(super::criteo::BadLineKind::Empty) {
        return Err(DataError::NoRows { path: tsv.to_path_buf(), lines: report.lines });
    }
    if st.rows == 0 && report.bad() > 0 {
        return Err(DataError::AllMalformed { path: tsv.to_path_buf(), lines: report.lines, kinds: report.kinds(), first: report.first_lines() });
    }
    if let Some((capacity, text_crc32)) = counted {
        if report.lines != capacity {
            return Err(source_changed(tsv, format!("{} lines parsed, {capacity} counted", report.lines)));
        }
        let parsed_crc32 = st.digest.clone().finish();
        if parsed_crc32 != text_crc32 {
            return Err(source_changed(tsv, format!("its CRC-32 was {text_crc32:08x} when its lines were counted and {parsed_crc32:08x} when they were parsed")));
        }
    }
    let now = SourceStat::of(tsv)?;
    let prepared_ns = now_ns();
    if now != *source {
        return Err(source_changed(tsv, format!("its stat was {source:?} before reading and is {now:?} after")));
    }
    Ok(prepared_ns)
}

/// One conversion's chunks, shared by its threads: each thread claims the next chunk,
/// parses it, commits it in file order (its rows placed, its lines checked against the
/// count and the bad-line limit) and writes its columns at the rows the commit gave it.
struct Chunks<'a> {
    tsv: &'a Path,
    /// Where the chunks' text comes from.
    feed: Feed,
    /// Lines counted before parsing.
    capacity: u64,
    opts: &'a PrepareOptions,
    /// Where the committed chunks' columns go.
    sink: Sink<'a>,
    /// The next chunk to claim.
    claim: AtomicUsize,
    state: Mutex<Committed>,
    /// Signalled at every commit and failure.
    turn: Condvar,
}

impl<'a> Chunks<'a> {
    fn new(tsv: &'a Path, feed: Feed, capacity: u64, opts: &'a PrepareOptions, sink: Sink<'a>) -> Chunks<'a> {
        let state = Mutex::new(Committed { next: 0, rows: 0, report: BadLineReport::default(), digest: Crc32::new(), failed: None });
        Chunks { tsv, feed, capacity, opts, sink, claim: AtomicUsize::new(0), state, turn: Condvar::new() }
    }

    /// What the threads committed, or the first failure.
    fn committed(self) -> DataResult<Committed> {
        let mut st = self.state.into_inner().unwrap_or_else(|p| p.into_inner());
        match st.failed.take() {
            Some(e) => Err(e),
            None => Ok(st),
        }
    }

    fn failed(&self) -> bool {
        self.state.lock().map_or(true, |st| st.failed.is_some())
    }

    /// One thread's work: chunks until none is left or the conversion failed.
    fn work(&self) {
        let (mut text, mut cols) = (Vec::new(), Columns::default());
        loop {
            let c = match &self.feed {
                Feed::File { count, .. } => {
                    let c = self.claim.fetch_add(1, Ordering::Relaxed);
                    if c >= *count || self.failed() {
                        return;
                    }
                    c
                }
                Feed::Stream(rx) => match rx.lock().unwrap_or_else(|p| p.into_inner()).recv() {
                    Ok((c, t)) => {
                        text = t;
                        c
                    }
                    Err(_) => return,
                },
            };
            if self.failed() {
                // A stream is drained, so that its decoder never waits on a full channel.
                continue;
            }
            if self.opts.cancelled() {
                return self.fail(None, DataError::Cancelled { path: self.tsv.to_path_buf() });
            }
            let (report, digest) = match self.parse(c, &mut text, &mut cols) {
                Ok(r) => r,
                Err(e) => return self.fail(Some(c), e),
            };
            let Some(at) = self.commit(c, &text, &cols, &report, &digest) else { return };
            if let Err(e) = self.write(at, &cols) {
                return self.fail(None, e);
            }
        }
    }

    /// Records a failure of chunk `c` once the chunks before it are committed (so the
    /// failure reported is the first in file order), or at once (`c = None`).
    fn fail(&self, c: Option<usize>, e: DataError) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        while let (Some(c), None) = (c, &st.failed) {
            if st.next == c {
                break;
            }
            st = self.turn.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        st.failed.get_or_insert(e);
        self.turn.notify_all();
    }

    /// Reads chunk `c` (its whole lines: from the first line start in it to the first in
    /// the next chunk) into `text` and parses it into `cols`: its report and its bytes'
    /// CRC-32 (a plain TSV's; a decoded stream's text is not read twice, nor summed).
    fn parse(&self, c: usize, text: &mut Vec<u8>, cols: &mut Columns) -> DataResult<(BadLineReport, Crc32)> {
        let mut digest = Crc32::new();
        if let Feed::File { src, len, chunk, .. } = &self.feed {
            let a = line_start(src, self.tsv, c as u64 * chunk, *len)?;
            let b = line_start(src, self.tsv, (c as u64 + 1) * chunk, *len)?;
            text.resize((b - a) as usize, 0);
            read_at(src, self.tsv, text, a)?;
            digest.update(text);
        }
        let mut report = BadLineReport::default();
        cols.clear();
        parse_text(text, self.opts.weight_column, cols, &mut report, u64::MAX);
        Ok((report, digest))
    }

    /// Commits chunk `c` in file order, once the chunks before it are: the first row it
    /// writes, or None when the conversion failed (before it, or at it).
    fn commit(&self, c: usize, text: &[u8], cols: &Columns, report: &BadLineReport, digest: &Crc32) -> Option<u64> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        while st.next != c && st.failed.is_none() {
            st = self.turn.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        if st.failed.is_some() {
            return None;
        }
        if let Some(e) = self.refusal(&mut st, text, report) {
            st.failed = Some(e);
            self.turn.notify_all();
            return None;
        }
        let at = st.rows;
        st.rows += cols.len() as u64;
        st.report.append(report);
        st.digest.combine(digest);
        st.next += 1;
        self.turn.notify_all();
        Some(at)
    }

    /// Why chunk `text` (parsed into `report`) cannot follow the chunks committed in `st`:
    /// more lines than counted, or the bad-line limit passed (then `st.report` takes the
    /// chunk's lines up to the one that passes it, for the error).
    fn refusal(&self, st: &mut Committed, text: &[u8], report: &BadLineReport) -> Option<DataError> {
        let (capacity, limit) = (self.capacity, self.opts.max_bad_lines);
        if st.report.lines + report.lines > capacity {
            return Some(source_changed(self.tsv, format!("it has more than the {capacity} lines counted a moment ago")));
        }
        if st.report.bad() + report.bad() <= limit {
            return None;
        }
        // Parsed again up to the line that exceeds the limit.
        let mut upto = BadLineReport::default();
        let stop = parse_text(text, self.opts.weight_column, &mut Columns::default(), &mut upto, limit - st.report.bad());
        let line = st.report.lines + stop.unwrap_or(upto.lines);
        st.report.append(&upto);
        Some(DataError::TooManyBadLines { path: self.tsv.to_path_buf(), count: st.report.bad(), limit, at_line: line, first: st.report.first_lines() })
    }

    /// Decodes the compressed source into chunks of whole lines (about
    /// [`PrepareOptions::chunk_bytes`] each) sent to the threads in order, until its end or
    /// a failure; returns the compressed bytes read and their CRC-32.
    fn feed(&self, mut dec: Decoder, tx: SyncSender<(usize, Vec<u8>)>) -> DataResult<(u64, u32)> {
        let size = self.opts.chunk_bytes.max(1) as usize;
        let (mut carry, mut c) = (Vec::new(), 0usize);
        while !self.failed() {
            let mut buf = std::mem::take(&mut carry);
            let start = buf.len();
            buf.resize(start + size, 0);
            let n = match dec.fill(&mut buf[start..]) {
                Ok(n) => n,
                Err(e) => {
                    self.fail(Some(c), e);
                    break;
                }
            };
            buf.truncate(start + n);
            if n == 0 {
                if !buf.is_empty() {
                    let _ = tx.send((c, buf));
                }
                break;
            }
            match buf.iter().rposition(|&b| b == b'\n') {
                Some(p) => carry = buf.split_off(p + 1),
                // A line longer than a chunk: read on.
                None => {
                    carry = buf;
                    continue;
                }
            }
            if tx.send((c, buf)).is_err() {
                break;
            }
            c += 1;
        }
        Ok(dec.source_read())
    }

    /// Writes the columns of a committed chunk from row `at` on.
    fn write(&self, at: u64, cols: &Columns) -> DataResult<()> {
        match &self.sink {
            Sink::Cache(out, layout) => write_columns(out, layout, at, cols),
            Sink::Spill(spill) => spill.write(at, cols),
        }
    }
}

/// Where a conversion's committed columns go.
enum Sink<'a> {
    /// The cache file, allocated for the lines counted, and its sections.
    Cache(&'a AtomicFile, CacheLayout),
    /// A [`Spill`], while the lines are not known.
    Spill(&'a Spill),
}

/// The pieces of `cols` (rows of `cols.fields`' shape) from row `at` on: labels, dense
/// features, keys and weights, each with its offset in its section (no weights: empty).
fn column_pieces(cols: &Columns, at: u64) -> [(&[u8], u64); 4] {
    let (dense_bytes, keys_bytes) = (DENSE_VALUE_BYTES * cols.fields.dense as u64, KEY_BYTES * cols.fields.sparse as u64);
    [
        (bytemuck::cast_slice(&cols.labels), at * LABEL_BYTES),
        (bytemuck::cast_slice(&cols.dense), at * dense_bytes),
        (bytemuck::cast_slice(&cols.keys), at * keys_bytes),
        (bytemuck::cast_slice(&cols.weights), at * WEIGHT_BYTES),
    ]
}

/// The offsets and lengths of the sections [`column_pieces`] writes in the cache of `l`.
fn column_sections(l: &CacheLayout) -> [(u64, u64); 4] {
    [(l.labels_offset, l.labels_len), (l.dense_offset, l.dense_len), (l.keys_offset, l.keys_len), (l.weights_offset, l.weights_len)]
}

/// Writes `cols` (rows of `cols.fields`' shape, the layout's) into the sections `l` of the
/// cache being written, from row `at` on, each piece started back to disk.
pub(crate) fn write_columns(out: &AtomicFile, l: &CacheLayout, at: u64, cols: &Columns) -> DataResult<()> {
    let file = out.file();
    for ((bytes, offset), (section, _)) in column_pieces(cols, at).into_iter().zip(column_sections(l)).filter(|((b, _), _)| !b.is_empty()) {
        file.write_all_at(bytes, section + offset).map_err(|e| DataError::io(out.path(), "write", e))?;
        write_back(file, section + offset, bytes.len() as u64);
    }
    Ok(())
}

/// The columns of a source whose lines are not known before its end (a compressed TSV,
/// see the module docs): one temporary file beside the cache per section (labels, dense
/// features, keys, weights), each row at its index, as the cache's sections hold them;
/// removed when dropped.
struct Spill {
    sections: Vec<AtomicFile>,
}

impl Spill {
    /// The temporary files beside `out` (no weights' when not `weighted`).
    fn create(out: &Path, weighted: bool) -> DataResult<Spill> {
        let n = if weighted { 4 } else { 3 };
        Ok(Spill { sections: (0..n).map(|_| AtomicFile::create(out, CACHE_MODE)).collect::<Result<_, _>>()? })
    }

    /// Writes `cols` from row `at` on.
    fn write(&self, at: u64, cols: &Columns) -> DataResult<()> {
        for ((bytes, offset), f) in column_pieces(cols, at).into_iter().zip(&self.sections).filter(|((b, _), _)| !b.is_empty()) {
            f.file().write_all_at(bytes, offset).map_err(|e| DataError::io(f.path(), "write", e))?;
        }
        Ok(())
    }

    /// Copies the sections into the cache `out` of layout `l` (its rows' bytes, on
    /// `threads` threads, `piece` bytes at a time), each piece started back to disk.
    fn copy_into(&self, out: &AtomicFile, l: &CacheLayout, threads: usize, piece: u64) -> DataResult<()> {
        // The temporaries are open for writing only: read them through second descriptors.
        let files = self.sections.iter().map(|s| File::open(s.path()).map_err(|e| DataError::io(s.path(), "open", e))).collect::<DataResult<Vec<File>>>()?;
        let piece = piece.max(1);
        let pieces: Vec<(usize, u64, u64)> = column_sections(l).iter().zip(0..files.len()).flat_map(|(&(_, len), s)| (0..len.div_ceil(piece)).map(move |p| (s, p * piece, (len - p * piece).min(piece)))).collect();
        let threads = threads.clamp(1, pieces.len().max(1));
        let sections = column_sections(l);
        let parts = on_threads(threads, |t| -> DataResult<()> {
            let mut buf = vec![0u8; piece.min(pieces.iter().map(|p| p.2).max().unwrap_or(0)) as usize];
            for &(s, at, n) in pieces.iter().skip(t).step_by(threads) {
                let buf = &mut buf[..n as usize];
                read_at(&files[s], self.sections[s].path(), buf, at)?;
                out.file().write_all_at(buf, sections[s].0 + at).map_err(|e| DataError::io(out.path(), "write", e))?;
                write_back(out.file(), sections[s].0 + at, n);
            }
            Ok(())
        });
        parts.into_iter().collect()
    }
}

/// Where a conversion's chunks come from.
enum Feed {
    /// A plain TSV, read by ranges.
    File {
        /// The source, open for reading.
        src: File,
        /// Its length in bytes.
        len: u64,
        /// Bytes per chunk (a chunk's lines are those that start in it).
        chunk: u64,
        /// Chunks in the source.
        count: usize,
    },
    /// A decoded stream: chunks of whole lines with their index, in order.
    Stream(Mutex<Receiver<(usize, Vec<u8>)>>),
}

/// Starts writing bytes `offset..offset + len` of `file` back to its disk, without waiting
/// (`sync_file_range`): the fsync at the end finds little left to write, and the disk
/// works while the threads parse. Best effort (a filesystem that cannot leaves it all
/// to the fsync).
fn write_back(file: &File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(len)) = (libc::off64_t::try_from(offset), libc::off64_t::try_from(len)) else { return };
    // SAFETY: sync_file_range on a descriptor this process holds open, with a valid range;
    // it touches no memory of the process.
    unsafe { libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE) };
}

/// Computes the block sums of the column sections of the temporary file `tmp` (columns
/// written, length set), reading it back on `threads` threads, and writes them at
/// `layout.sums_offset`; returns their CRC-32. Read with `pread`, not mapped: the pages
/// stay in the page cache, out of this process's resident set.
pub(crate) fn write_sums(tmp: &AtomicFile, layout: &CacheLayout, threads: usize) -> DataResult<u32> {
    // The AtomicFile is open for writing only: read it back through a second descriptor.
    let f = File::open(tmp.path()).map_err(|e| DataError::io(tmp.path(), "open", e))?;
    let block = CHECKSUM_BLOCK as u64;
    let blocks: Vec<(u64, usize)> = layout
        .checksummed()
        .iter()
        .flat_map(|&(_, offset, extent)| (0..extent.div_ceil(block)).map(move |b| (offset + b * block, (extent - b * block).min(block) as usize)))
        .collect();
    let threads = threads.clamp(1, blocks.len().max(1));
    let parts = on_threads(threads, |t| -> DataResult<Vec<u32>> {
        let mut buf = vec![0u8; CHECKSUM_BLOCK];
        let mut sums = Vec::new();
        for &(at, n) in blocks.iter().skip(t).step_by(threads) {
            f.read_exact_at(&mut buf[..n], at).map_err(|e| DataError::io(tmp.path(), "read back", e))?;
            sums.push(crc32(&buf[..n]));
        }
        Ok(sums)
    });
    let parts = parts.into_iter().collect::<DataResult<Vec<_>>>()?;
    // Block i was summed by thread i % threads, as its (i / threads)-th.
    let sums: Vec<u32> = (0..blocks.len()).map(|i| parts[i % threads][i / threads]).collect();
    let bytes: Vec<u8> = sums.iter().flat_map(|s| s.to_le_bytes()).collect();
    tmp.file().write_all_at(&bytes, layout.sums_offset).map_err(|e| DataError::io(tmp.path(), "write", e))?;
    Ok(crc32(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_start_after_newlines() {
        let dir = std::env::temp_dir().join(format!("ringrec-prepare-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("lines.txt");
        std::fs::write(&p, b"ab\ncd\n\nef").unwrap();
        let f = File::open(&p).unwrap();
        let starts: Vec<u64> = (0..=10).map(|x| line_start(&f, &p, x, 9).unwrap()).collect();
        assert_eq!(starts, [0, 3, 3, 3, 6, 6, 6, 7, 9, 9, 9]);
        assert_eq!(count_lines(&p, 9, 3).unwrap(), (4, crc32(b"ab\ncd\n\nef")));
        let text: Vec<u8> = (0..100_000u32).map(|i| if i % 7 == 0 || i % 255 == 0 { b'\n' } else { b'x' }).collect();
        assert_eq!(count_newlines(&text), text.iter().filter(|&&b| b == b'\n').count() as u64);
        std::fs::write(&p, b"ab\n").unwrap();
        assert_eq!(count_lines(&p, 3, 2).unwrap().0, 1);
        std::fs::write(&p, b"").unwrap();
        assert_eq!(count_lines(&p, 0, 2).unwrap(), (0, 0));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
