//! Sparse gradient lists, their normalisation and the wire format. No communication here,
//! so everything is unit-tested.
//!
//! # Wire format (version 1, little-endian)
//!
//! ```text
//! offset  size        field
//! 0       4           magic "RRSG"
//! 4       2           version (1)
//! 6       2           flags: 1 = counts present (host lists), 2 = error (see below)
//! 8       4           dim (values per row)
//! 12      4           n (rows; for an error: payload bytes)
//! 16      8n          keys, u64, strictly increasing, never u64::MAX
//! ..      4n          counts, u32 in 1..=world size (only with flag 1; else every count is 1)
//! ..      4n*dim      rows, f32, row i belongs to key i
//! ```
//! The length must be exactly `16 + n * (8 + 4 * has_counts + 4 * dim)`.
//!
//! An **error piece** (flags = 2) replaces a list when a rank cannot take part in a step:
//! `n` payload bytes follow the header, a u32 world rank where the error happened, then
//! the UTF-8 message. Receivers turn it into [`SparseError::Peer`].

use std::ops::Range;

use super::error::{DecodeError, SparseError, SparseResult};
use super::merge::Finish;
use super::SparseNormalize;
use crate::embedding::EMPTY_KEY;

/// The first four bytes of every serialized list.
pub const MAGIC: [u8; 4] = *b"RRSG";
/// Wire format version.
pub const VERSION: u16 = 1;
/// Flag: per-key contributor counts follow the keys.
pub const FLAG_COUNTS: u16 = 1;
/// Flag: the piece is an error report, not a list.
pub const FLAG_ERROR: u16 = 2;
/// Bytes of the header.
pub const HEADER_LEN: usize = 16;

/// A sparse gradient: distinct keys in increasing order, one row of `dim` values per key,
/// and per key the number of ranks whose batch held it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SparseList {
    /// Values per row.
    pub dim: usize,
    /// Distinct keys, increasing.
    pub keys: Vec<u64>,
    /// `keys.len() * dim` values, row after row.
    pub grads: Vec<f32>,
    /// Ranks that contributed each row (1 for a rank's own list).
    pub counts: Vec<u32>,
}

impl SparseList {
    /// An empty list of rows of `dim` values.
    pub fn empty(dim: usize) -> SparseList {
        SparseList { dim, ..SparseList::default() }
    }
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.keys.len()
    }
    /// True when there are no rows.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
    /// Empties the list, keeping its memory (lists are reused from step to step: fresh
    /// multi-megabyte buffers cost more in page faults than the merge itself).
    pub fn clear(&mut self, dim: usize) {
        self.dim = dim;
        self.keys.clear();
        self.grads.clear();
        self.counts.clear();
    }
    /// Row `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.grads[i * self.dim..(i + 1) * self.dim]
    }
    /// Serialized length with or without counts.
    pub fn encoded_len(&self, with_counts: bool) -> usize {
        self.view().encoded_len(with_counts)
    }
    /// Appends the serialized list to `out`; `with_counts` keeps the per-key counts (host
    /// lists), without them every count reads back as 1 (a rank's own list).
    pub fn encode_into(&self, with_counts: bool, out: &mut Vec<u8>) -> SparseResult<()> {
        self.view().encode_into(with_counts, out)
    }
    /// The list, borrowed.
    pub fn view(&self) -> ListRef<'_> {
        ListRef { dim: self.dim, keys: &self.keys, counts: Some(&self.counts), grads: &self.grads }
    }
}

/// A borrowed sparse list, laid out like [`SparseList`]: in a `SparseList`, in received
/// bytes or in the host's shared segment ([`view`] reads the wire format in place).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ListRef<'a> {
    /// Values per row.
    pub dim: usize,
    /// Distinct keys, increasing.
    pub keys: &'a [u64],
    /// Ranks that contributed each row; `None` when every count is 1 (a rank's own list).
    pub counts: Option<&'a [u32]>,
    /// `keys.len() * dim` values, row after row.
    pub grads: &'a [f32],
}

impl<'a> ListRef<'a> {
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.keys.len()
    }
    /// True when there are no rows.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
    /// Row `i`.
    pub fn row(&self, i: usize) -> &'a [f32] {
        &self.grads[i * self.dim..(i + 1) * self.dim]
    }
    /// The count of row `i`.
    pub fn count(&self, i: usize) -> u32 {
        self.counts.map_or(1, |c| c[i])
    }
    /// The rows whose keys lie in `range` (keys are sorted: two binary searches).
    pub fn within(&self, range: KeyRange) -> ListRef<'a> {
        let start = self.keys.partition_point(|k| *k < range.start);
        let end = range.end.map_or(self.len(), |e| self.keys.partition_point(|k| *k < e));
        self.rows(start..end)
    }
    /// Rows `r` of the list.
    pub fn rows(&self, r: std::ops::Range<usize>) -> ListRef<'a> {
        ListRef {
            dim: self.dim,
            keys: &self.keys[r.clone()],
            counts: self.counts.map(|c| &c[r.clone()]),
            grads: &self.grads[r.start * self.dim..r.end * self.dim],
        }
    }
    /// Appends the rows to `out` (whose last key must be smaller than the first one here).
    pub fn append_to(&self, out: &mut SparseList) {
        out.keys.extend_from_slice(self.keys);
        match self.counts {
            Some(c) => out.counts.extend_from_slice(c),
            None => out.counts.resize(out.counts.len() + self.len(), 1),
        }
        out.grads.extend_from_slice(self.grads);
    }
    /// Serialized length with or without counts.
    pub fn encoded_len(&self, with_counts: bool) -> usize {
        encoded_len(self.len(), self.dim, with_counts)
    }
    /// Appends the serialized list to `out` (see [`SparseList::encode_into`]).
    pub fn encode_into(&self, with_counts: bool, out: &mut Vec<u8>) -> SparseResult<()> {
        out.reserve(self.encoded_len(with_counts));
        self.encode(with_counts, out)
    }
    /// Serializes the list into `out`, which must be exactly [`ListRef::encoded_len`] bytes
    /// long (a place in shared memory, say).
    pub fn encode_to(&self, with_counts: bool, out: &mut [u8]) -> SparseResult<()> {
        if out.len() != self.encoded_len(with_counts) {
            return Err(SparseError::Invalid(format!("{} bytes of room for a list of {} bytes", out.len(), self.encoded_len(with_counts))));
        }
        self.encode(with_counts, &mut SliceSink { buf: out, at: 0 })
    }
    fn encode(&self, with_counts: bool, out: &mut impl Sink) -> SparseResult<()> {
        out.put(&header(self.len(), self.dim, with_counts)?);
        put_le(out, self.keys);
        if with_counts {
            match self.counts {
                Some(c) => put_le(out, c),
                None => (0..self.len()).for_each(|_| out.put(&1u32.to_le_bytes())),
            }
        }
        put_le(out, self.grads);
        Ok(())
    }
}

/// Serialized length of a list of `n` rows of `dim` values, with or without counts.
pub fn encoded_len(n: usize, dim: usize, with_counts: bool) -> usize {
    HEADER_LEN + n * (8 + if with_counts { 4 } else { 0 } + 4 * dim)
}

/// A part of the key space, `start..end` (`None`: up to and including `u64::MAX - 1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyRange {
    /// First key in the range.
    pub start: u64,
    /// First key after the range, `None` for the last range.
    pub end: Option<u64>,
}

impl KeyRange {
    /// Part `i` of the key space cut into `parts` equal ranges (keys are hashed ids, so
    /// equal ranges hold about equal numbers of keys).
    pub fn part(i: usize, parts: usize) -> KeyRange {
        let bound = |j: usize| ((j as u128) << 64) / parts.max(1) as u128;
        let end = bound(i + 1);
        KeyRange { start: bound(i) as u64, end: (end <= u64::MAX as u128).then_some(end as u64) }
    }
}

/// Where serialized bytes go: a growing `Vec` or a slice of exactly the right size.
trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

struct SliceSink<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl Sink for SliceSink<'_> {
    fn put(&mut self, bytes: &[u8]) {
        self.buf[self.at..self.at + bytes.len()].copy_from_slice(bytes);
        self.at += bytes.len();
    }
}

/// The header of a list of `n` rows of `dim` values; fails where they do not fit the format
/// (more than `u32::MAX` rows, or values per row).
pub(crate) fn header(n: usize, dim: usize, with_counts: bool) -> SparseResult<[u8; HEADER_LEN]> {
    let n32 = u32::try_from(n).map_err(|_| SparseError::Invalid(format!("{n} rows do not fit one sparse list (at most {})", u32::MAX)))?;
    let dim32 = u32::try_from(dim).map_err(|_| SparseError::Invalid(format!("dim {dim} is too large")))?;
    let mut h = [0u8; HEADER_LEN];
    put_header(&mut SliceSink { buf: &mut h, at: 0 }, if with_counts { FLAG_COUNTS } else { 0 }, dim32, n32);
    Ok(h)
}

fn put_header(out: &mut impl Sink, flags: u16, dim: u32, n: u32) {
    out.put(&MAGIC);
    out.put(&VERSION.to_le_bytes());
    out.put(&flags.to_le_bytes());
    out.put(&dim.to_le_bytes());
    out.put(&n.to_le_bytes());
}

/// Puts scalars (u64, u32, f32) little-endian: one copy on little-endian machines.
fn put_le<T: bytemuck::Pod>(out: &mut impl Sink, v: &[T]) {
    if cfg!(target_endian = "little") {
        out.put(bytemuck::cast_slice(v));
    } else {
        for x in v {
            let mut b = bytemuck::bytes_of(x).to_vec();
            b.reverse();
            out.put(&b);
        }
    }
}

/// Appends an error piece: `origin` (world rank where the error happened) and `message`,
/// cut (at a character boundary) so the piece is at most `max_len` bytes.
pub fn encode_error(origin: usize, dim: usize, message: &str, max_len: usize, out: &mut Vec<u8>) {
    let room = max_len.saturating_sub(HEADER_LEN + 4);
    let mut cut = message.len().min(room);
    while !message.is_char_boundary(cut) {
        cut -= 1;
    }
    let msg = &message.as_bytes()[..cut];
    put_header(out, FLAG_ERROR, dim.min(u32::MAX as usize) as u32, (4 + msg.len()) as u32);
    out.put(&(origin.min(u32::MAX as usize) as u32).to_le_bytes());
    out.put(msg);
}

/// A decoded piece: a list, or another rank's error report.
#[derive(Clone, Debug, PartialEq)]
pub enum Piece {
    /// A valid list.
    List(SparseList),
    /// The world rank where an error happened, and its message.
    Error {
        /// World rank.
        rank: usize,
        /// Message.
        message: String,
    },
}

fn corrupt(reason: impl Into<String>) -> DecodeError {
    DecodeError::Corrupt(reason.into())
}

fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// What [`decode_into`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decoded {
    /// A valid list, now in `out`.
    List,
    /// Another rank's error report: the world rank where it happened and its message.
    Error {
        /// World rank.
        rank: usize,
        /// Message.
        message: String,
    },
}

/// Parses and validates a serialized piece: rows must have `dim` values and counts lie in
/// `1..=max_count`. Never panics, whatever the bytes.
pub fn decode(bytes: &[u8], dim: usize, max_count: u32) -> Result<Piece, DecodeError> {
    let mut out = SparseList::empty(dim);
    Ok(match decode_into(bytes, dim, max_count, &mut out)? {
        Decoded::List => Piece::List(out),
        Decoded::Error { rank, message } => Piece::Error { rank, message },
    })
}

/// [`decode`] into `out`, reusing its memory (`out` is unspecified after an error).
pub fn decode_into(bytes: &[u8], dim: usize, max_count: u32, out: &mut SparseList) -> Result<Decoded, DecodeError> {
    let (keys, counts, rows) = match parse(bytes, dim)? {
        Parsed::Error { rank, message } => return Ok(Decoded::Error { rank, message }),
        Parsed::List { keys, counts, rows } => (keys, counts, rows),
    };
    out.clear(dim);
    copy_le(keys, &mut out.keys, u64::from_le);
    check_keys(&out.keys)?;
    match counts {
        Some(c) => {
            copy_le(c, &mut out.counts, u32::from_le);
            check_counts(&out.counts, max_count)?;
        }
        None => out.counts.resize(out.keys.len(), 1),
    }
    copy_le(rows, &mut out.grads, |g: f32| f32::from_bits(u32::from_le(g.to_bits())));
    Ok(Decoded::List)
}

/// What [`view`] found.
#[derive(Clone, Debug, PartialEq)]
pub enum Viewed<'a> {
    /// A valid list.
    List(ListRef<'a>),
    /// Another rank's error report: the world rank where it happened and its message.
    Error {
        /// World rank.
        rank: usize,
        /// Message.
        message: String,
    },
}

/// [`decode`] without a copy where it can: on a little-endian machine, with `bytes` 8-byte
/// aligned, the list is read where it lies (validated the same way); otherwise it is
/// decoded into `scratch` and borrowed from there.
pub fn view<'a>(bytes: &'a [u8], dim: usize, max_count: u32, scratch: &'a mut SparseList) -> Result<Viewed<'a>, DecodeError> {
    match in_place_unchecked(bytes, dim)? {
        Some(Viewed::List(l)) => {
            check_keys(l.keys)?;
            if let Some(c) = l.counts {
                check_counts(c, max_count)?;
            }
            Ok(Viewed::List(l))
        }
        Some(error) => Ok(error),
        None => copy_then_view(bytes, dim, max_count, scratch),
    }
}

/// A list that [`view`] has read in place and checked before (and nobody has written since),
/// read in place again without the checks; `None` where [`view`] would not read it in place.
pub(crate) fn view_checked(bytes: &[u8], dim: usize) -> Option<ListRef<'_>> {
    match in_place_unchecked(bytes, dim) {
        Ok(Some(Viewed::List(l))) => Some(l),
        _ => None,
    }
}

/// The piece in `bytes` where it lies, with a valid header and length but its keys and
/// counts not checked; `None` where it cannot be read in place.
fn in_place_unchecked(bytes: &[u8], dim: usize) -> Result<Option<Viewed<'_>>, DecodeError> {
    let (keys, counts, rows) = match parse(bytes, dim)? {
        Parsed::Error { rank, message } => return Ok(Some(Viewed::Error { rank, message })),
        Parsed::List { keys, counts, rows } => (keys, counts, rows),
    };
    let (Some(keys), Some(grads)) = (in_place::<u64>(keys), in_place::<f32>(rows)) else { return Ok(None) };
    let counts = match counts.map(in_place::<u32>) {
        Some(None) => return Ok(None),
        Some(Some(c)) => Some(c),
        None => None,
    };
    Ok(Some(Viewed::List(ListRef { dim, keys, counts, grads })))
}

/// `bytes` as little-endian `T`s where they lie: `None` on a big-endian machine or when
/// `bytes` is not aligned for `T`.
fn in_place<T: bytemuck::Pod>(bytes: &[u8]) -> Option<&[T]> {
    if cfg!(target_endian = "little") {
        bytemuck::try_cast_slice(bytes).ok()
    } else {
        None
    }
}

fn copy_then_view<'a>(bytes: &[u8], dim: usize, max_count: u32, scratch: &'a mut SparseList) -> Result<Viewed<'a>, DecodeError> {
    Ok(match decode_into(bytes, dim, max_count, scratch)? {
        Decoded::List => Viewed::List(scratch.view()),
        Decoded::Error { rank, message } => Viewed::Error { rank, message },
    })
}

/// A piece whose header and length are valid: a list's sections (not yet checked), or
/// an error report.
enum Parsed<'a> {
    List { keys: &'a [u8], counts: Option<&'a [u8]>, rows: &'a [u8] },
    Error { rank: usize, message: String },
}

/// Checks the header and the length (never panics, whatever the bytes).
fn parse(bytes: &[u8], dim: usize) -> Result<Parsed<'_>, DecodeError> {
    if bytes.len() < HEADER_LEN {
        return Err(corrupt(format!("truncated: {} bytes, shorter than the {HEADER_LEN}-byte header", bytes.len())));
    }
    if bytes[..4] != MAGIC {
        return Err(corrupt(format!("bad magic {:02x?}, expected \"RRSG\"", &bytes[..4])));
    }
    let version = le_u16(bytes, 4);
    if version != VERSION {
        return Err(corrupt(format!("format version {version}, this build reads version {VERSION}")));
    }
    let flags = le_u16(bytes, 6);
    let their_dim = le_u32(bytes, 8) as usize;
    let n = le_u32(bytes, 12) as usize;
    if flags == FLAG_ERROR {
        if n < 4 || bytes.len() != HEADER_LEN + n {
            return Err(corrupt(format!("error report of {} bytes, header says {} payload bytes", bytes.len(), n)));
        }
        let rank = le_u32(bytes, HEADER_LEN) as usize;
        let message = String::from_utf8_lossy(&bytes[HEADER_LEN + 4..]).into_owned();
        return Ok(Parsed::Error { rank, message });
    }
    if flags & !FLAG_COUNTS != 0 {
        return Err(corrupt(format!("unknown flags {flags:#x}")));
    }
    if their_dim != dim {
        return Err(DecodeError::Dim { ours: dim, theirs: their_dim });
    }
    let with_counts = flags & FLAG_COUNTS != 0;
    let row_bytes = 8 + if with_counts { 4 } else { 0 } + dim.checked_mul(4).ok_or_else(|| corrupt("dim overflows"))?;
    let want = n.checked_mul(row_bytes).and_then(|b| b.checked_add(HEADER_LEN)).ok_or_else(|| corrupt(format!("{n} rows overflow the address space")))?;
    if bytes.len() != want {
        let what = if bytes.len() < want { "truncated" } else { "trailing bytes" };
        return Err(corrupt(format!("{what}: {} bytes, but {n} rows of dim {dim}{} need {want}", bytes.len(), if with_counts { " with counts" } else { "" })));
    }
    let keys_end = HEADER_LEN + 8 * n;
    let counts_end = keys_end + if with_counts { 4 * n } else { 0 };
    Ok(Parsed::List { keys: &bytes[HEADER_LEN..keys_end], counts: with_counts.then(|| &bytes[keys_end..counts_end]), rows: &bytes[counts_end..] })
}

pub(crate) fn check_keys(keys: &[u64]) -> Result<(), DecodeError> {
    if let Some(i) = keys.windows(2).position(|w| w[0] >= w[1]) {
        return Err(corrupt(format!("keys not strictly increasing at row {} ({} then {})", i + 1, keys[i], keys[i + 1])));
    }
    if keys.last() == Some(&EMPTY_KEY) {
        return Err(corrupt("holds the reserved key u64::MAX"));
    }
    Ok(())
}

pub(crate) fn check_counts(c: &[u32], max_count: u32) -> Result<(), DecodeError> {
    match c.iter().position(|x| *x == 0 || *x > max_count) {
        Some(i) => Err(corrupt(format!("count {} of row {i} is outside 1..={max_count}", c[i]))),
        None => Ok(()),
    }
}

/// Appends the little-endian values in `bytes` (a whole number of `T`, any alignment) to
/// `out`: one memcpy, then `from_le` (a no-op on little-endian machines).
fn copy_le<T: bytemuck::Pod>(bytes: &[u8], out: &mut Vec<T>, from_le: impl Fn(T) -> T) {
    let start = out.len();
    out.resize(start + bytes.len() / std::mem::size_of::<T>(), T::zeroed());
    let dst = &mut out[start..];
    bytemuck::cast_slice_mut::<T, u8>(dst).copy_from_slice(bytes);
    if cfg!(target_endian = "big") {
        dst.iter_mut().for_each(|x| *x = from_le(*x));
    }
}

/// Checks one rank's input: `grads` holds one row of `dim` values per key, and no key is
/// the reserved `u64::MAX`.
pub fn check_input(keys: &[u64], grads: &[f32], dim: usize) -> SparseResult<()> {
    let expected = keys.len().saturating_mul(dim);
    if grads.len() != expected {
        return Err(SparseError::Shape { keys: keys.len(), dim, expected, grads: grads.len() });
    }
    if let Some(k) = keys.iter().find(|k| **k == EMPTY_KEY) {
        return Err(SparseError::ReservedKey { key: *k });
    }
    Ok(())
}

/// Turns summed rows into the final gradient: `/ count` (frequency), `/ world` (Horovod's
/// average) or unchanged (`none`). One f32 division per value, the same on every rank.
pub fn normalise(list: &mut SparseList, how: SparseNormalize, world: usize) {
    normalise_with(list, Finish::normalise(how, world))
}

/// Finishes every row of `list` with `finish` (the rule [`normalise`] picks, or the
/// exchanger's, which knows the ranks' weights).
pub fn normalise_with(list: &mut SparseList, finish: Finish) {
    let dim = list.dim;
    if dim == 0 {
        return;
    }
    if finish == Finish::Sum {
        return;
    }
    for (row, c) in list.grads.chunks_exact_mut(dim).zip(&list.counts) {
        finish.apply(row, *c);
    }
}

/// The keys, counts and rows of a serialized list, or of some of its rows, to be filled in
/// place (counts empty for a list without them).
pub type Sections<'a> = (&'a mut [u64], &'a mut [u32], &'a mut [f32]);

/// Where rows `rows` of a serialized list of `n` rows of `dim` values lie: the byte ranges
/// of their keys, counts (empty without counts) and values.
pub(crate) fn row_spans(n: usize, dim: usize, with_counts: bool, rows: Range<usize>) -> [Range<usize>; 3] {
    let count_bytes = if with_counts { 4 } else { 0 };
    let keys = HEADER_LEN;
    let counts = keys + 8 * n;
    let values = counts + count_bytes * n;
    [keys + 8 * rows.start..keys + 8 * rows.end, counts + count_bytes * rows.start..counts + count_bytes * rows.end, values + 4 * dim * rows.start..values + 4 * dim * rows.end]
}

/// Writes the header of a list of `n` rows of `dim` values, with or without counts, into
/// `out` (exactly its serialized length) and returns the keys, counts and rows sections to
/// fill in place; `None` where they cannot be written in place (a big-endian machine, `out`
/// not 8-byte aligned).
pub(crate) fn wire_sections(out: &mut [u8], n: usize, dim: usize, with_counts: bool) -> SparseResult<Option<Sections<'_>>> {
    let want = encoded_len(n, dim, with_counts);
    if out.len() != want {
        return Err(SparseError::Invalid(format!("{} bytes of room for a list of {want} bytes", out.len())));
    }
    out[..HEADER_LEN].copy_from_slice(&header(n, dim, with_counts)?);
    let [keys, counts, _] = row_spans(n, dim, with_counts, 0..n);
    let (keys, rest) = out[keys.start..].split_at_mut(keys.len());
    let (counts, rows) = rest.split_at_mut(counts.len());
    if cfg!(target_endian = "big") {
        return Ok(None);
    }
    Ok(match (bytemuck::try_cast_slice_mut(keys), bytemuck::try_cast_slice_mut(counts), bytemuck::try_cast_slice_mut(rows)) {
        (Ok(k), Ok(c), Ok(r)) => Some((k, c, r)),
        _ => None,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The bit patterns of `v` (exact comparisons, -0.0 included).
    pub(crate) fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// A list of `dim`-wide rows.
    pub(crate) fn list(keys: &[u64], rows: &[f32], counts: &[u32], dim: usize) -> SparseList {
        SparseList { dim, keys: keys.to_vec(), grads: rows.to_vec(), counts: counts.to_vec() }
    }

    #[test]
    fn normalise_divides_by_count_world_or_nothing() {
        let base = list(&[1, 2], &[6.0, 9.0, 3.0, 4.0], &[3, 1], 2);
        let mut f = base.clone();
        normalise(&mut f, SparseNormalize::Frequency, 4);
        assert_eq!(f.grads, vec![2.0, 3.0, 3.0, 4.0]);
        let mut w = base.clone();
        normalise(&mut w, SparseNormalize::World, 4);
        assert_eq!(w.grads, vec![1.5, 2.25, 0.75, 1.0]);
        let mut n = base.clone();
        normalise(&mut n, SparseNormalize::None, 4);
        assert_eq!(n, base);
    }

    #[test]
    fn lists_round_trip_with_and_without_counts() {
        let l = list(&[1, 5, u64::MAX - 1], &[1.5, -0.0, f32::MIN_POSITIVE, 3.0, f32::NAN, 1e30], &[2, 1, 3], 2);
        for with_counts in [false, true] {
            let mut b = Vec::new();
            l.encode_into(with_counts, &mut b).unwrap();
            assert_eq!(b.len(), l.encoded_len(with_counts));
            let Piece::List(back) = decode(&b, 2, 3).unwrap() else { panic!("not a list") };
            assert_eq!(back.keys, l.keys);
            assert_eq!(bits(&back.grads), bits(&l.grads));
            assert_eq!(back.counts, if with_counts { l.counts.clone() } else { vec![1, 1, 1] });
        }
        let mut b = Vec::new();
        SparseList::empty(7).encode_into(true, &mut b).unwrap();
        assert_eq!(decode(&b, 7, 1).unwrap(), Piece::List(SparseList::empty(7)));
    }

    #[test]
    fn error_pieces_carry_rank_and_message_and_fit() {
        let mut b = Vec::new();
        encode_error(3, 16, "bad input é", 1024, &mut b);
        assert_eq!(decode(&b, 16, 4).unwrap(), Piece::Error { rank: 3, message: "bad input é".into() });
        // A long message is cut at a character boundary to fit the limit; dim is not checked.
        let mut b = Vec::new();
        encode_error(1, 8, &"é".repeat(1000), 64, &mut b);
        assert!(b.len() <= 64);
        match decode(&b, 16, 4).unwrap() {
            Piece::Error { rank: 1, message } => assert!(message.chars().all(|c| c == 'é') && !message.is_empty()),
            p => panic!("{p:?}"),
        }
    }

    #[test]
    fn corrupt_and_truncated_lists_are_rejected() {
        let l = list(&[1, 5, 9], &[1.0; 6], &[1, 2, 1], 2);
        let mut good = Vec::new();
        l.encode_into(true, &mut good).unwrap();
        let reason = |b: &[u8]| match decode(b, 2, 2) {
            Err(DecodeError::Corrupt(r)) => r,
            other => panic!("expected a rejection, got {other:?}"),
        };
        // Every truncation, including inside the header.
        for cut in 0..good.len() {
            let r = reason(&good[..cut]);
            assert!(r.contains("truncated"), "cut {cut}: {r}");
        }
        let mut longer = good.clone();
        longer.push(0);
        assert!(reason(&longer).contains("trailing bytes"));
        let mut bad = good.clone();
        bad[0] = b'X';
        assert!(reason(&bad).contains("bad magic"));
        let mut bad = good.clone();
        bad[4] = 9;
        assert!(reason(&bad).contains("version 9"));
        let mut bad = good.clone();
        bad[6] = 0x81;
        assert!(reason(&bad).contains("unknown flags"));
        // Keys out of order (swap keys 1 and 5).
        let mut bad = good.clone();
        bad[16..24].copy_from_slice(&5u64.to_le_bytes());
        bad[24..32].copy_from_slice(&1u64.to_le_bytes());
        assert!(reason(&bad).contains("strictly increasing"));
        // The reserved key.
        let mut bad = good.clone();
        bad[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(reason(&bad).contains("reserved"));
        // A count of 0 or above the world size.
        let mut bad = good.clone();
        bad[40..44].copy_from_slice(&0u32.to_le_bytes());
        assert!(reason(&bad).contains("outside 1..=2"));
        let mut bad = good.clone();
        bad[44..48].copy_from_slice(&3u32.to_le_bytes());
        assert!(reason(&bad).contains("outside 1..=2"));
        // A huge row count in the header must not allocate or overflow.
        let mut bad = good.clone();
        bad[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(reason(&bad).contains("truncated"));
        // Another dim is its own error.
        assert_eq!(decode(&good, 3, 2), Err(DecodeError::Dim { ours: 3, theirs: 2 }));
        // An error piece whose length disagrees with its header.
        let mut e = Vec::new();
        encode_error(0, 2, "x", 100, &mut e);
        e.pop();
        assert!(reason(&e).contains("error report"));
    }
}
