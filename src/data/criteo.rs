//! The Criteo click-log reader: tab-separated lines of 40 fields, parsed at byte level.
//!
//! # Format
//!
//! ```text
//! label \t I1 .. I13 \t C1 .. C26 \n        (40 fields, 39 tabs, LF or CRLF)
//! ```
//!
//! | field | accepted | becomes |
//! |---|---|---|
//! | label | exactly `0` or `1` | `0.0` / `1.0` |
//! | I1..I13 | empty (missing) or `-?[0-9]+` fitting in i64 | `ln(1 + max(x, 0))` as f32; missing is `0.0` |
//! | C1..C26 | empty (missing) or 1 to 16 hex digits, either case | a u64 key, [`category_key`] / [`missing_key`] |
//!
//! Criteo's own values are always 8 lowercase hex digits; any length from 1 to 16 is accepted
//! and read as the number the digits spell (so `00ab` and `ab` are the same value).
//!
//! **Keys.** `key = splitmix64(splitmix64(SALT + field) ^ value)`: for a fixed field this is
//! a bijection of the value, so two values of one field never share a key, and the field salt
//! keeps equal hex strings in different fields apart. A missing value is the value
//! [`MISSING_VALUE`] of its field (a 16-digit number no 8-digit Criteo value can equal). The
//! result [`EMPTY_KEY`] (`u64::MAX`) marks empty slots in the embedding table, so it is
//! remapped to `u64::MAX - 1`.
//!
//! **Malformed lines** are never dropped silently. Each is counted by [`BadLineKind`] in a
//! [`BadLineReport`] that keeps the first [`BAD_LINE_EXAMPLES`] line numbers (1-based) and
//! reasons; once more than `max_bad_lines` were seen, reading stops with
//! [`DataError::TooManyBadLines`], which names the file, the count, the first lines and the
//! `--max-bad-lines` flag. `max_bad_lines = 0` accepts no bad line at all. A line is
//! classified as [`BadLineKind::Utf8`] when it is not valid UTF-8, otherwise by the first
//! failing check in this order: empty line, field count, label, integers, categoricals.
//! A file that ends without a final newline still has its last line read; a final newline
//! does not start an extra (empty) line.
//!
//! **A weight column** (`--weight-column N`, [`parse_weighted_line`]): lines of 41 fields,
//! field N (1-based, 1 to 41, like `cut -f`) the sample's weight, a finite decimal >= 0
//! (`1`, `0.25`, `3e-2`; Rust's `f32` syntax, `-0` read as 0), the other 40 Criteo's in
//! order. Checked in the order empty line, field count (41 expected: a 40-field line is
//! [`BadLineKind::FieldCount`] naming the weight column), the weight
//! ([`BadLineKind::Weight`]: empty, negative, NaN, infinite, or not a number), then the
//! Criteo fields, whose messages number the fields of the 41-field line. Without the flag, a
//! line of 41 fields is a field-count error that suggests `--weight-column`.
//! [`CriteoReader`] and [`read_tsv`] read Criteo's 40 fields only; [`parse_text`] (what
//! [`prepare`](super::prepare()) uses) reads either.

use std::fmt;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use super::error::{DataError, DataResult};
use super::fields::Fields;
use crate::hash::splitmix64;

/// Integer features per line (I1..I13).
pub const NUM_DENSE: usize = 13;
/// Categorical features per line (C1..C26).
pub const NUM_SPARSE: usize = 26;
/// Fields per line: label, integers, categoricals.
pub const NUM_FIELDS: usize = 1 + NUM_DENSE + NUM_SPARSE;
/// The one key no sample carries: the embedding table marks its empty slots with it
/// (re-exported as `embedding::EMPTY_KEY`), so the key hash never returns it.
pub const EMPTY_KEY: u64 = u64::MAX;
/// Default for `--max-bad-lines`.
pub const DEFAULT_MAX_BAD_LINES: u64 = 1000;
/// Kinds of malformed line ([`BadLineKind::ALL`]; the arrays of counts are typed with the
/// literal, which a test keeps equal to this).
pub const BAD_LINE_KINDS: usize = 7;
/// The largest `--weight-column`: a line with a weight has one field more than Criteo's.
pub const MAX_WEIGHT_COLUMN: u32 = NUM_FIELDS as u32 + 1;
/// Malformed lines whose number and reason a [`BadLineReport`] keeps.
pub const BAD_LINE_EXAMPLES: usize = 5;
/// The value a missing categorical hashes as (the bytes of `"missing\0"`).
pub const MISSING_VALUE: u64 = 0x6d69_7373_696e_6700;
/// Base of the per-field salt of [`category_key`].
pub const FIELD_SALT: u64 = 0x5249_4e47_5245_4300; // "RINGREC\0"

/// One parsed line.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Sample {
    /// Click label, 0.0 or 1.0.
    pub label: f32,
    /// `ln(1 + max(x, 0))` of I1..I13; 0.0 when missing.
    pub dense: [f32; NUM_DENSE],
    /// Field-salted keys of C1..C26 (never `u64::MAX`).
    pub keys: [u64; NUM_SPARSE],
}

/// Integers below this take `ln(1 + x)` from a table.
const LN1P_TABLE: usize = 4096;

/// Field salts precomputed (the fields past them compute theirs).
const SALTS: usize = 256;

/// Precomputed values of the hot path: `ln(1 + x)` of small integers and the field salts.
struct Tables {
    ln1p: Vec<f32>,
    salt: Vec<u64>,
}

/// The salt of categorical field `field`.
fn field_salt(field: usize) -> u64 {
    splitmix64(FIELD_SALT.wrapping_add(field as u64))
}

fn tables() -> &'static Tables {
    static T: std::sync::OnceLock<Tables> = std::sync::OnceLock::new();
    T.get_or_init(|| Tables {
        ln1p: (0..LN1P_TABLE).map(|x| (x as f64).ln_1p() as f32).collect(),
        salt: (0..SALTS).map(field_salt).collect(),
    })
}

/// The dense value of integer feature `x`: `ln(1 + max(x, 0))`.
#[inline]
pub fn dense_value(x: i64) -> f32 {
    if x <= 0 {
        0.0
    } else if let Some(&v) = tables().ln1p.get(x as usize) {
        v
    } else {
        (x as f64).ln_1p() as f32
    }
}

/// The key of categorical field `field` (0-based, any number: a Criteo line's are 0..26) with
/// value `value`.
#[inline]
pub fn category_key(field: usize, value: u64) -> u64 {
    let salt = match tables().salt.get(field) {
        Some(&s) => s,
        None => field_salt(field),
    };
    let k = splitmix64(salt ^ value);
    if k == EMPTY_KEY {
        EMPTY_KEY - 1
    } else {
        k
    }
}

/// The key of a missing value of categorical field `field` (0-based).
#[inline]
pub fn missing_key(field: usize) -> u64 {
    category_key(field, MISSING_VALUE)
}

/// Why a line was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BadLineKind {
    /// The line is empty (or only `\r`).
    Empty,
    /// Not exactly 40 tab-separated fields.
    FieldCount,
    /// The label is not `0` or `1`.
    Label,
    /// An integer feature is not `-?[0-9]+` within i64.
    Integer,
    /// A categorical feature is not 1 to 16 hex digits.
    Categorical,
    /// The line is not valid UTF-8.
    Utf8,
    /// The weight field (`--weight-column`) is not a finite decimal number >= 0.
    Weight,
}

impl BadLineKind {
    /// Every kind, in report order.
    pub const ALL: [BadLineKind; 7] =
        [BadLineKind::Empty, BadLineKind::FieldCount, BadLineKind::Label, BadLineKind::Integer, BadLineKind::Categorical, BadLineKind::Utf8, BadLineKind::Weight];

    /// Short name, as in reports and JSON.
    pub fn name(self) -> &'static str {
        match self {
            BadLineKind::Empty => "empty",
            BadLineKind::FieldCount => "field_count",
            BadLineKind::Label => "label",
            BadLineKind::Integer => "integer",
            BadLineKind::Categorical => "categorical",
            BadLineKind::Utf8 => "utf8",
            BadLineKind::Weight => "weight",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for BadLineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why one line failed to parse (without its line number).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineError {
    /// The kind, counted in [`BadLineReport`].
    pub kind: BadLineKind,
    /// A human-readable reason naming the field and showing its value.
    pub detail: String,
}

/// One rejected line.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BadLine {
    /// 1-based line number.
    pub line: u64,
    /// Why.
    pub kind: BadLineKind,
    /// The reason in words.
    pub detail: String,
}

impl fmt::Display for BadLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.detail)
    }
}

/// What a read saw: lines, rows kept, malformed lines by kind and the first few of them.
///
/// Invariant: `lines == rows + bad()`.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct BadLineReport {
    /// Lines read (including malformed ones).
    pub lines: u64,
    /// Lines parsed into samples.
    pub rows: u64,
    /// Malformed lines per kind, indexed like [`BadLineKind::ALL`].
    pub counts: [u64; 7],
    /// The first [`BAD_LINE_EXAMPLES`] malformed lines.
    pub first: Vec<BadLine>,
}

impl BadLineReport {
    /// Malformed lines in all.
    pub fn bad(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Malformed lines of one kind.
    pub fn count(&self, kind: BadLineKind) -> u64 {
        self.counts[kind.index()]
    }

    fn record(&mut self, line: u64, e: LineError) {
        self.counts[e.kind.index()] += 1;
        if self.first.len() < BAD_LINE_EXAMPLES {
            self.first.push(BadLine { line, kind: e.kind, detail: e.detail });
        }
    }

    /// Adds the report of the lines that follow those of this one (`later`, its line
    /// numbers counted from 1 at its own first line): the result is the report of one read
    /// of both, the first malformed lines still the first in order.
    pub fn append(&mut self, later: &BadLineReport) {
        let before = self.lines;
        self.lines += later.lines;
        self.rows += later.rows;
        for (c, l) in self.counts.iter_mut().zip(later.counts) {
            *c += l;
        }
        let room = BAD_LINE_EXAMPLES.saturating_sub(self.first.len());
        self.first.extend(later.first.iter().take(room).map(|b| BadLine { line: before + b.line, ..b.clone() }));
    }

    /// Malformed lines per kind: `field_count 3, label 1`.
    pub fn kinds(&self) -> String {
        let kinds: Vec<String> = BadLineKind::ALL.iter().filter(|k| self.count(**k) > 0).map(|k| format!("{} {}", k.name(), self.count(*k))).collect();
        kinds.join(", ")
    }

    /// `first: line 3: ...; line 9: ...` (or `no malformed line`).
    pub fn first_lines(&self) -> String {
        if self.first.is_empty() {
            return "no malformed line".into();
        }
        let list: Vec<String> = self.first.iter().map(|b| b.to_string()).collect();
        let more = if self.bad() > self.first.len() as u64 { "; ..." } else { "" };
        format!("first: {}{more}", list.join("; "))
    }
}

impl fmt::Display for BadLineReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} lines: {} rows, {} malformed", self.lines, self.rows, self.bad())?;
        if self.bad() > 0 {
            write!(f, " ({}); {}", self.kinds(), self.first_lines())?;
        }
        Ok(())
    }
}

/// Name of field `i` (0-based) of a line: `label`, `I1`..`I13`, `C1`..`C26`.
pub fn field_name(i: usize) -> String {
    match i {
        0 => "label".into(),
        i if i <= NUM_DENSE => format!("I{i}"),
        i => format!("C{}", i - NUM_DENSE),
    }
}

/// At most 24 characters of a field, escaped, for messages.
fn show(field: &[u8]) -> String {
    let s = String::from_utf8_lossy(&field[..field.len().min(24)]).escape_debug().to_string();
    if field.len() > 24 {
        format!("\"{s}...\"")
    } else {
        format!("\"{s}\"")
    }
}

/// Hex digit values, 0xFF for a non-digit.
static HEX: [u8; 256] = {
    let mut t = [0xFFu8; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        t[b'A' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};

/// `Some(x)` for `-?[0-9]+` within i64, `None` otherwise. The field is not empty.
#[inline]
fn parse_int(f: &[u8]) -> Option<i64> {
    let (neg, digits) = match f.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, f),
    };
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    let mut v: u64 = 0;
    for &b in digits {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        v = v * 10 + d as u64; // 19 digits < 2^64: no overflow
    }
    if neg {
        if v > i64::MAX as u64 + 1 {
            return None;
        }
        Some((v as i64).wrapping_neg())
    } else {
        i64::try_from(v).ok()
    }
}

/// `Some(v)` for 1 to 16 hex digits.
#[inline]
pub(crate) fn parse_hex(f: &[u8]) -> Option<u64> {
    if f.is_empty() || f.len() > 16 {
        return None;
    }
    let mut v: u64 = 0;
    let mut bad = 0u8;
    for &b in f {
        let d = HEX[b as usize];
        bad |= d;
        v = (v << 4) | (d & 0xF) as u64;
    }
    // A digit is at most 0x0F; 0xFF marks a non-digit, so any bit above the low nibble is bad.
    if bad & 0xF0 != 0 {
        None
    } else {
        Some(v)
    }
}

/// Position of the first `needle` in `hay`, eight bytes at a time.
#[inline]
pub(crate) fn find_byte(hay: &[u8], needle: u8) -> Option<usize> {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    let rep = LO.wrapping_mul(needle as u64);
    let mut chunks = hay.chunks_exact(8);
    let mut at = 0;
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        let x = u64::from_le_bytes(w) ^ rep;
        // The lowest byte of x that is zero sets the lowest bit of t (borrows only move up).
        let t = x.wrapping_sub(LO) & !x & HI;
        if t != 0 {
            return Some(at + (t.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    chunks.remainder().iter().position(|&b| b == needle).map(|p| at + p)
}

/// Parses one line (without its `\n`; one trailing `\r` is ignored).
pub fn parse_line(line: &[u8]) -> Result<Sample, LineError> {
    utf8_first(line, parse_fields(line))
}

/// A malformed `line`'s error: [`BadLineKind::Utf8`] when it is not valid UTF-8, else
/// `parsed`'s own (a parsed line is not checked again: UTF-8 is looked at only on failure).
fn utf8_first<T>(line: &[u8], parsed: Result<T, LineError>) -> Result<T, LineError> {
    parsed.map_err(|e| match std::str::from_utf8(line) {
        Err(u) => LineError { kind: BadLineKind::Utf8, detail: format!("not valid UTF-8 (bad byte at offset {})", u.valid_up_to()) },
        Ok(_) => e,
    })
}

/// The common case in one pass: `None` on anything unusual (malformed, or integers of more
/// than 18 digits), which [`parse_fields`] then parses or classifies.
#[inline]
fn parse_fast(line: &[u8]) -> Option<Sample> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let t = tables();
    let n = line.len();
    let label = match line.get(..2)? {
        b"0\t" => 0.0,
        b"1\t" => 1.0,
        _ => return None,
    };
    let mut s = Sample { label, ..Sample::default() };
    let mut i = 2;
    for j in 0..NUM_DENSE {
        let neg = line.get(i) == Some(&b'-');
        i += usize::from(neg);
        let start = i;
        let mut v: u64 = 0;
        let mut bad = 0u8;
        while i < n && line[i] != b'\t' {
            let d = line[i].wrapping_sub(b'0');
            bad |= u8::from(d > 9);
            v = v.wrapping_mul(10).wrapping_add(d as u64);
            i += 1;
        }
        let len = i - start;
        if bad != 0 || len > 18 || (neg && len == 0) || i >= n {
            return None;
        }
        if !neg && len > 0 {
            s.dense[j] = match t.ln1p.get(v as usize) {
                Some(&x) => x,
                None => (v as f64).ln_1p() as f32,
            };
        }
        i += 1; // the tab
    }
    for j in 0..NUM_SPARSE {
        let start = i;
        let mut v: u64 = 0;
        let mut bad = 0u8;
        while i < n && line[i] != b'\t' {
            let d = HEX[line[i] as usize];
            bad |= d;
            v = (v << 4) | (d & 0xF) as u64;
            i += 1;
        }
        let len = i - start;
        if bad & 0xF0 != 0 || len > 16 {
            return None;
        }
        let value = if len == 0 { MISSING_VALUE } else { v };
        let k = splitmix64(t.salt[j] ^ value);
        s.keys[j] = if k == EMPTY_KEY { EMPTY_KEY - 1 } else { k };
        if j + 1 < NUM_SPARSE {
            if i >= n {
                return None;
            }
            i += 1;
        }
    }
    if i == n {
        Some(s)
    } else {
        None
    }
}

fn parse_fields(line: &[u8]) -> Result<Sample, LineError> {
    match parse_fast(line) {
        Some(s) => Ok(s),
        None => parse_careful(line, None),
    }
}

/// The 1-based number, in the file's line, of Criteo field `n` (1-based among the 40):
/// one more from the weight's column on.
fn field_number(n: usize, weight_column: Option<usize>) -> usize {
    if weight_column.is_some_and(|c| n >= c) {
        n + 1
    } else {
        n
    }
}

/// Field by field, with a reason for every failure: the reference that the fast path
/// must agree with. `weight_column`: the line came from a line with a weight there (the
/// messages number the fields of that line).
fn parse_careful(line: &[u8], weight_column: Option<usize>) -> Result<Sample, LineError> {
    let line = match line.split_last() {
        Some((b'\r', rest)) => rest,
        _ => line,
    };
    if line.is_empty() {
        return Err(LineError { kind: BadLineKind::Empty, detail: "empty line".into() });
    }
    // Field i is line[starts[i]..starts[i + 1] - 1].
    let mut starts = [0usize; NUM_FIELDS + 1];
    let mut n = 1;
    for (i, &b) in line.iter().enumerate() {
        if b == b'\t' {
            if n < NUM_FIELDS {
                starts[n] = i + 1;
            }
            n += 1;
        }
    }
    if n != NUM_FIELDS {
        let hint = if n == NUM_FIELDS + 1 && weight_column.is_none() { "; if one field is a sample weight, give its field number with --weight-column N" } else { "" };
        return Err(LineError { kind: BadLineKind::FieldCount, detail: format!("wrong field count: found {n}, expected {NUM_FIELDS} tab-separated fields{hint}") });
    }
    starts[NUM_FIELDS] = line.len() + 1;
    let field = |i: usize| &line[starts[i]..starts[i + 1] - 1];

    let label = match field(0) {
        b"0" => 0.0,
        b"1" => 1.0,
        f => return Err(LineError { kind: BadLineKind::Label, detail: format!("label {} is not 0 or 1", show(f)) }),
    };
    let mut s = Sample { label, ..Sample::default() };
    for j in 0..NUM_DENSE {
        let f = field(1 + j);
        if f.is_empty() {
            continue;
        }
        match parse_int(f) {
            Some(x) => s.dense[j] = dense_value(x),
            None => {
                return Err(LineError { kind: BadLineKind::Integer, detail: format!("field {} ({}) {} is not an integer", field_number(2 + j, weight_column), field_name(1 + j), show(f)) })
            }
        }
    }
    for j in 0..NUM_SPARSE {
        let f = field(1 + NUM_DENSE + j);
        s.keys[j] = if f.is_empty() {
            missing_key(j)
        } else {
            match parse_hex(f) {
                Some(v) => category_key(j, v),
                None => {
                    return Err(LineError {
                        kind: BadLineKind::Categorical,
                        detail: format!("field {} ({}) {} is not 1 to 16 hex digits", field_number(2 + NUM_DENSE + j, weight_column), field_name(1 + NUM_DENSE + j), show(f)),
                    })
                }
            }
        };
    }
    Ok(s)
}

/// Checks a `--weight-column` value: a field number of a line of 41 fields, 1 to 41.
pub fn check_weight_column(column: u32) -> Result<(), String> {
    if (1..=MAX_WEIGHT_COLUMN).contains(&column) {
        Ok(())
    } else {
        Err(format!(
            "--weight-column {column} is not a field of a line with a weight: give 1 to {MAX_WEIGHT_COLUMN}, the weight's 1-based field number among the {MAX_WEIGHT_COLUMN} tab-separated fields (like `cut -f`; e.g. {MAX_WEIGHT_COLUMN} for a weight after C26, 2 for one right after the label)"
        ))
    }
}

/// A weight field: a finite decimal number >= 0 (`1`, `0.25`, `3e-2`; `-0` is 0).
fn parse_weight(f: &[u8]) -> Option<f32> {
    let w: f32 = std::str::from_utf8(f).ok()?.parse().ok()?;
    (w.is_finite() && w >= 0.0).then_some(w + 0.0)
}

/// Parses one line of 41 fields whose field `column` (1-based, 1 to 41:
/// [`check_weight_column`]) is the sample's weight and the other 40 Criteo's, in order
/// (without its `\n`; one trailing `\r` is ignored). Checked in the order empty line, field
/// count (41 expected), weight ([`BadLineKind::Weight`]: empty, negative, NaN, infinite or
/// not a number), then the Criteo fields as [`parse_line`] does, their messages numbering
/// the fields of this line.
pub fn parse_weighted_line(line: &[u8], column: usize) -> Result<(Sample, f32), LineError> {
    parse_weighted_line_with(line, column, &mut Vec::new())
}

/// [`parse_weighted_line`] with `scratch` for the line without its weight (reused over
/// the lines of a chunk: no allocation a line).
fn parse_weighted_line_with(line: &[u8], column: usize, scratch: &mut Vec<u8>) -> Result<(Sample, f32), LineError> {
    utf8_first(line, parse_weighted_fields(line, column, scratch))
}

/// The line without its weight and one tab beside it: Criteo's 40 fields, given the
/// weight's bytes `a..b` (a slice of the line when the weight is first or last, else copied
/// into `rest`).
fn without_weight<'a>(line: &'a [u8], a: usize, b: usize, rest: &'a mut Vec<u8>) -> &'a [u8] {
    if b == line.len() {
        &line[..a.saturating_sub(1)]
    } else if a == 0 {
        &line[b + 1..]
    } else {
        rest.clear();
        rest.extend_from_slice(&line[..a]);
        rest.extend_from_slice(&line[b + 1..]);
        rest
    }
}

/// The common case without counting every tab: the weight found from the nearer end of the
/// line, then Criteo's fields through [`parse_fast`] (which checks that they are exactly
/// 40, so the line had 41 and the weight was field `column`). `None` on anything unusual,
/// which [`parse_weighted_fields`] then classifies.
fn parse_weighted_fast(line: &[u8], column: usize, rest: &mut Vec<u8>) -> Option<(Sample, f32)> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let (a, b) = if 2 * column <= NUM_FIELDS + 1 {
        let mut a = 0;
        for _ in 1..column {
            a += find_byte(&line[a..], b'\t')? + 1;
        }
        (a, find_byte(&line[a..], b'\t').map_or(line.len(), |p| a + p))
    } else {
        let mut b = line.len();
        for _ in column..NUM_FIELDS + 1 {
            b = line[..b].iter().rposition(|&c| c == b'\t')?;
        }
        (line[..b].iter().rposition(|&c| c == b'\t').map_or(0, |p| p + 1), b)
    };
    let weight = parse_weight(&line[a..b])?;
    Some((parse_fast(without_weight(line, a, b, rest))?, weight))
}

fn parse_weighted_fields(line: &[u8], column: usize, rest: &mut Vec<u8>) -> Result<(Sample, f32), LineError> {
    match parse_weighted_fast(line, column, rest) {
        Some(parsed) => Ok(parsed),
        None => parse_weighted_careful(line, column, rest),
    }
}

/// Every tab counted, every failure with its reason: the reference that
/// [`parse_weighted_fast`] must agree with.
fn parse_weighted_careful(line: &[u8], column: usize, rest: &mut Vec<u8>) -> Result<(Sample, f32), LineError> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.is_empty() {
        return Err(LineError { kind: BadLineKind::Empty, detail: "empty line".into() });
    }
    // One pass over the tabs: their count, and the weight's bytes a..b.
    let (mut fields, mut a, mut b, mut at) = (1usize, 0usize, line.len(), 0usize);
    while let Some(p) = find_byte(&line[at..], b'\t') {
        let tab = at + p;
        if fields + 1 == column {
            a = tab + 1;
        } else if fields == column {
            b = tab;
        }
        fields += 1;
        at = tab + 1;
    }
    if fields != NUM_FIELDS + 1 {
        return Err(LineError {
            kind: BadLineKind::FieldCount,
            detail: format!("wrong field count: found {fields}, expected {} tab-separated fields (the {NUM_FIELDS} Criteo fields and the weight in field {column}, --weight-column {column})", NUM_FIELDS + 1),
        });
    }
    let weight = parse_weight(&line[a..b]).ok_or_else(|| LineError {
        kind: BadLineKind::Weight,
        detail: format!("field {column} (the weight, --weight-column {column}) {} is not a finite number >= 0", show(&line[a..b])),
    })?;
    let rest = without_weight(line, a, b, rest);
    let sample = match parse_fast(rest) {
        Some(s) => s,
        None => parse_careful(rest, Some(column))?,
    };
    Ok((sample, weight))
}

/// Parsed rows as columns, the layout of the cache's sections: labels, dense features
/// (`fields.dense` a row, row-major) and keys (`fields.sparse` a row, row-major). The
/// default is a TSV's: 13 and 26.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Columns {
    /// The rows' shape: the strides of `dense` and `keys`.
    pub fields: Fields,
    /// One label a row.
    pub labels: Vec<f32>,
    /// `fields.dense` values a row.
    pub dense: Vec<f32>,
    /// `fields.sparse` keys a row.
    pub keys: Vec<u64>,
    /// One weight a row, for lines with a weight column (empty otherwise).
    pub weights: Vec<f32>,
}

impl Columns {
    /// Rows held.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether no row is held.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Appends one row (of a Criteo line: `fields` must be [`Fields::CRITEO`]).
    pub fn push(&mut self, s: &Sample) {
        debug_assert_eq!(self.fields, Fields::CRITEO);
        self.labels.push(s.label);
        self.dense.extend_from_slice(&s.dense);
        self.keys.extend_from_slice(&s.keys);
    }

    /// Appends one row with its weight.
    pub fn push_weighted(&mut self, s: &Sample, weight: f32) {
        self.push(s);
        self.weights.push(weight);
    }

    /// Appends the rows of `other` (of the same shape).
    pub fn append(&mut self, other: &Columns) {
        debug_assert_eq!(self.fields, other.fields);
        self.labels.extend_from_slice(&other.labels);
        self.dense.extend_from_slice(&other.dense);
        self.keys.extend_from_slice(&other.keys);
        self.weights.extend_from_slice(&other.weights);
    }

    /// Drops every row, keeping the allocations.
    pub fn clear(&mut self) {
        self.labels.clear();
        self.dense.clear();
        self.keys.clear();
        self.weights.clear();
    }
}

/// Parses `text`, whole lines of a TSV (each ends with `\n` but perhaps the last of the
/// file), as [`CriteoReader`] reads them: appends the samples to `out` and counts the lines in
/// `report`, numbering them from 1 at the start of `text`. With a `weight_column` the lines
/// have 41 fields ([`parse_weighted_line`]) and `out.weights` gets the weights. Returns the
/// number of the line at which `report` came to hold more than `max_bad_lines` malformed
/// lines, having stopped there, or `None` once every line is read.
pub fn parse_text(text: &[u8], weight_column: Option<u32>, out: &mut Columns, report: &mut BadLineReport, max_bad_lines: u64) -> Option<u64> {
    let mut rest = text;
    let mut line = 0u64;
    let mut scratch = Vec::new();
    while !rest.is_empty() {
        let (l, next) = match find_byte(rest, b'\n') {
            Some(p) => (&rest[..p], &rest[p + 1..]),
            None => (rest, &rest[rest.len()..]),
        };
        rest = next;
        line += 1;
        report.lines += 1;
        let parsed = match weight_column {
            None => parse_line(l).map(|s| out.push(&s)),
            Some(c) => parse_weighted_line_with(l, c as usize, &mut scratch).map(|(s, w)| out.push_weighted(&s, w)),
        };
        match parsed {
            Ok(()) => report.rows += 1,
            Err(e) => {
                report.record(line, e);
                if report.bad() > max_bad_lines {
                    return Some(line);
                }
            }
        }
    }
    None
}

/// Streams [`Sample`]s out of a Criteo TSV, counting malformed lines.
///
/// Iterate it (`Item = DataResult<Sample>`) or call [`CriteoReader::next_sample`]; after an
/// error it yields nothing more. [`CriteoReader::report`] tells what was seen so far.
pub struct CriteoReader<R> {
    src: R,
    path: PathBuf,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    eof: bool,
    failed: bool,
    max_bad_lines: u64,
    report: BadLineReport,
}

const READ_BLOCK: usize = 1 << 20;

impl CriteoReader<File> {
    /// Opens `path` for reading, stopping after more than `max_bad_lines` malformed lines.
    pub fn open(path: &Path, max_bad_lines: u64) -> DataResult<CriteoReader<File>> {
        let f = crate::fileio::open_input(path).map_err(|e| DataError::io(path, "open", e))?;
        Ok(CriteoReader::new(f, path, max_bad_lines))
    }
}

impl<R: Read> CriteoReader<R> {
    /// Reads from `src`; `path` names it in errors.
    pub fn new(src: R, path: impl Into<PathBuf>, max_bad_lines: u64) -> CriteoReader<R> {
        CriteoReader {
            src,
            path: path.into(),
            buf: vec![0; READ_BLOCK],
            start: 0,
            end: 0,
            eof: false,
            failed: false,
            max_bad_lines,
            report: BadLineReport::default(),
        }
    }

    /// What has been read so far.
    pub fn report(&self) -> &BadLineReport {
        &self.report
    }

    /// Consumes the reader, returning its report.
    pub fn into_report(self) -> BadLineReport {
        self.report
    }

    /// The next line as `buf[a..b]` (without `\n`), or `None` at the end of the input.
    fn next_line(&mut self) -> DataResult<Option<(usize, usize)>> {
        loop {
            if let Some(p) = find_byte(&self.buf[self.start..self.end], b'\n') {
                let a = self.start;
                self.start = a + p + 1;
                return Ok(Some((a, a + p)));
            }
            if self.eof {
                if self.start < self.end {
                    let a = self.start;
                    self.start = self.end;
                    return Ok(Some((a, self.end)));
                }
                return Ok(None);
            }
            // Keep the partial line, make room and read more.
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
            if self.end == self.buf.len() {
                let n = self.buf.len() * 2;
                self.buf.resize(n, 0);
            }
            let n = loop {
                match self.src.read(&mut self.buf[self.end..]) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(DataError::io(&self.path, "read", e)),
                }
            };
            if n == 0 {
                self.eof = true;
            }
            self.end += n;
        }
    }

    /// The next sample; `Ok(None)` at the end of the input. Malformed lines are counted and
    /// skipped until there are more than `max_bad_lines`, then this returns
    /// [`DataError::TooManyBadLines`].
    pub fn next_sample(&mut self) -> DataResult<Option<Sample>> {
        if self.failed {
            return Ok(None);
        }
        loop {
            let (a, b) = match self.next_line() {
                Ok(Some(r)) => r,
                Ok(None) => return Ok(None),
                Err(e) => {
                    self.failed = true;
                    return Err(e);
                }
            };
            self.report.lines += 1;
            match parse_line(&self.buf[a..b]) {
                Ok(s) => {
                    self.report.rows += 1;
                    return Ok(Some(s));
                }
                Err(e) => {
                    self.report.record(self.report.lines, e);
                    let count = self.report.bad();
                    if count > self.max_bad_lines {
                        self.failed = true;
                        return Err(DataError::TooManyBadLines {
                            path: self.path.clone(),
                            count,
                            limit: self.max_bad_lines,
                            at_line: self.report.lines,
                            first: self.report.first_lines(),
                        });
                    }
                }
            }
        }
    }
}

impl<R: Read> Iterator for CriteoReader<R> {
    type Item = DataResult<Sample>;
    fn next(&mut self) -> Option<DataResult<Sample>> {
        self.next_sample().transpose()
    }
}

/// Reads a whole TSV into memory (tests, small files; training reads the binary cache).
pub fn read_tsv(path: &Path, max_bad_lines: u64) -> DataResult<(Vec<Sample>, BadLineReport)> {
    let mut r = CriteoReader::open(path, max_bad_lines)?;
    let mut out = Vec::new();
    while let Some(s) = r.next_sample()? {
        out.push(s);
    }
    Ok((out, r.into_report()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(label: &str, ints: &[&str], cats: &[&str]) -> String {
        let mut f = vec![label.to_string()];
        f.extend(ints.iter().map(|s| s.to_string()));
        f.extend(cats.iter().map(|s| s.to_string()));
        f.join("\t")
    }

    fn good() -> String {
        let ints: Vec<String> = (0..NUM_DENSE).map(|i| i.to_string()).collect();
        let ints: Vec<&str> = ints.iter().map(|s| s.as_str()).collect();
        let cats = ["68fd1e64"; NUM_SPARSE];
        line("1", &ints, &cats)
    }

    #[test]
    fn find_byte_matches_position() {
        let hay: Vec<u8> = (0..100u8).map(|i| if i % 37 == 36 { b'\n' } else { b'a' + i % 26 }).collect();
        for start in 0..hay.len() {
            assert_eq!(find_byte(&hay[start..], b'\n'), hay[start..].iter().position(|&b| b == b'\n'), "start {start}");
        }
        assert_eq!(find_byte(b"\x80\x0a", b'\n'), Some(1));
        assert_eq!(find_byte(&[0x0b, 0x09, 0x0a], b'\n'), Some(2));
    }

    #[test]
    fn parses_a_good_line() {
        let s = parse_line(good().as_bytes()).unwrap();
        assert_eq!(s.label, 1.0);
        assert_eq!(s.dense[0], 0.0);
        assert_eq!(s.dense[1], 2f32.ln());
        assert_eq!(s.dense[12], 13f32.ln());
        assert_eq!(s.keys[0], category_key(0, 0x68fd1e64));
        assert_ne!(s.keys[0], s.keys[1], "equal values in different fields get different keys");
    }

    #[test]
    fn integers_negative_missing_and_limits() {
        assert_eq!(parse_int(b"-1"), Some(-1));
        assert_eq!(parse_int(b"0"), Some(0));
        assert_eq!(parse_int(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_int(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_int(b"9223372036854775808"), None);
        assert_eq!(parse_int(b"99999999999999999999"), None);
        assert_eq!(parse_int(b"-"), None);
        assert_eq!(parse_int(b"+1"), None);
        assert_eq!(parse_int(b"1.5"), None);
        assert_eq!(dense_value(-5), 0.0);
        assert_eq!(dense_value(0), 0.0);
        assert_eq!(dense_value(1), 2f32.ln());
        for x in [1i64, 2, 100, 4095, 4096, 4097, 1 << 40] {
            assert_eq!(dense_value(x), (x as f64).ln_1p() as f32, "table and formula agree at {x}");
        }
    }

    #[test]
    fn hex_lengths_and_case() {
        assert_eq!(parse_hex(b"0"), Some(0));
        assert_eq!(parse_hex(b"68fd1e64"), Some(0x68fd1e64));
        assert_eq!(parse_hex(b"68FD1E64"), Some(0x68fd1e64));
        assert_eq!(parse_hex(b"ffffffffffffffff"), Some(u64::MAX));
        assert_eq!(parse_hex(b"1ffffffffffffffff"), None);
        assert_eq!(parse_hex(b"68fd1e6g"), None);
        assert_eq!(parse_hex(b""), None);
        assert_eq!(parse_hex(b" 1"), None);
    }

    #[test]
    fn missing_keys_are_per_field_and_differ_from_values() {
        let keys: std::collections::HashSet<u64> = (0..NUM_SPARSE).map(missing_key).collect();
        assert_eq!(keys.len(), NUM_SPARSE);
        for f in 0..NUM_SPARSE {
            for v in [0u64, 1, 0xffff_ffff] {
                assert_ne!(missing_key(f), category_key(f, v));
            }
        }
    }

    #[test]
    fn reserved_key_is_remapped() {
        // Invert the mix for field 3 to find the value whose key would be u64::MAX.
        fn unmix(mut z: u64) -> u64 {
            // Inverse of splitmix64 (without the increment), then subtract the increment.
            fn inv_xorshift(x: u64, s: u32) -> u64 {
                let mut r = x;
                for _ in 0..(64 / s) {
                    r = x ^ (r >> s);
                }
                r
            }
            fn inv_mul(a: u64) -> u64 {
                let mut x = a;
                for _ in 0..6 {
                    x = x.wrapping_mul(2u64.wrapping_sub(a.wrapping_mul(x)));
                }
                x
            }
            z = inv_xorshift(z, 31);
            z = z.wrapping_mul(inv_mul(0x94D0_49BB_1331_11EB));
            z = inv_xorshift(z, 27);
            z = z.wrapping_mul(inv_mul(0xBF58_476D_1CE4_E5B9));
            z = inv_xorshift(z, 30);
            z.wrapping_sub(0x9E37_79B9_7F4A_7C15)
        }
        assert_eq!(splitmix64(unmix(12345)), 12345);
        let v = unmix(u64::MAX) ^ splitmix64(FIELD_SALT.wrapping_add(3));
        assert_eq!(category_key(3, v), u64::MAX - 1);
    }

    /// A xorshift64 stream from `x` (nonzero).
    fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    /// Up to two random edits of `l`: a byte removed, replaced or inserted (from `alphabet`).
    fn mutate(l: &mut Vec<u8>, alphabet: &[u8], next: &mut impl FnMut() -> u64) {
        for _ in 0..(next() % 3) {
            let i = (next() as usize) % (l.len() + 1);
            match next() % 3 {
                0 if i < l.len() => {
                    l.remove(i);
                }
                1 if i < l.len() => l[i] = alphabet[(next() as usize) % alphabet.len()],
                _ => l.insert(i, alphabet[(next() as usize) % alphabet.len()]),
            }
        }
    }

    #[test]
    fn fast_path_agrees_with_the_careful_parser() {
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
        let alphabet = b"0123456789abcdefABCDEF-\t\r x\xff";
        let base = [good(), format!("0{}", &good()[1..]).replace("68fd1e64", ""), good().replace('\t', "\t-")];
        let (mut fast, mut total) = (0, 0);
        for case in 0..200_000u64 {
            let mut l = base[(case % 3) as usize].clone().into_bytes();
            mutate(&mut l, alphabet, &mut next);
            total += 1;
            if let Some(s) = parse_fast(&l) {
                fast += 1;
                assert_eq!(Ok(s), parse_careful(&l, None), "{:?}", String::from_utf8_lossy(&l));
            }
        }
        assert!(fast > total / 10, "the fast path takes the common case ({fast} of {total})");
    }

    #[test]
    fn the_weighted_fast_path_agrees_with_the_careful_one() {
        let mut next = xorshift(0x2545_f491_4f6c_dd1d);
        let alphabet = b"0123456789abcdef.e-\t\r xn";
        let (mut fast, mut total) = (0, 0);
        for case in 0..100_000u64 {
            let column = [1, 2, 20, 21, 22, 40, 41][(case % 7) as usize];
            let mut l = with_weight(column, ["1", "0.25", "3e-2"][(case % 3) as usize]).into_bytes();
            mutate(&mut l, alphabet, &mut next);
            total += 1;
            let careful = parse_weighted_careful(&l, column, &mut Vec::new());
            if let Some(got) = parse_weighted_fast(&l, column, &mut Vec::new()) {
                fast += 1;
                assert_eq!(Ok(got), careful, "column {column}: {:?}", String::from_utf8_lossy(&l));
            }
        }
        assert!(fast > total / 10, "the fast path takes the common case ({fast} of {total})");
    }

    #[test]
    fn parsing_text_in_pieces_equals_one_read() {
        let g = good();
        let text = format!("{g}\nbad\n{g}\r\n\n{g}\nx\ty\n{g}");
        let (whole, want) = {
            let mut r = CriteoReader::new(text.as_bytes(), "mem", u64::MAX);
            let v: Vec<Sample> = r.by_ref().collect::<DataResult<_>>().unwrap();
            (v, r.into_report())
        };
        // Cut after every newline in turn: the pieces' reports appended equal the read's.
        for cut in text.match_indices('\n').map(|(i, _)| i + 1) {
            let (mut cols, mut report) = (Columns::default(), BadLineReport::default());
            for piece in [&text[..cut], &text[cut..]] {
                let mut r = BadLineReport::default();
                assert_eq!(parse_text(piece.as_bytes(), None, &mut cols, &mut r, u64::MAX), None);
                report.append(&r);
            }
            assert_eq!(report, want, "cut at {cut}");
            assert_eq!(cols.len(), whole.len());
            assert_eq!(cols.keys, whole.iter().flat_map(|s| s.keys).collect::<Vec<_>>());
        }
        // The limit stops at the line that exceeds it: lines 2, 4 and 6 are malformed.
        let (mut cols, mut r) = (Columns::default(), BadLineReport::default());
        assert_eq!(parse_text(text.as_bytes(), None, &mut cols, &mut r, 2), Some(6));
        assert_eq!((r.lines, r.rows, r.bad()), (6, 3, 3));
    }

    #[test]
    fn crlf_is_accepted() {
        let a = parse_line(good().as_bytes()).unwrap();
        let b = parse_line(format!("{}\r", good()).as_bytes()).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn every_kind_of_bad_line() {
        let g = good();
        let cases: Vec<(Vec<u8>, BadLineKind, &str)> = vec![
            (b"".to_vec(), BadLineKind::Empty, "empty line"),
            (b"\r".to_vec(), BadLineKind::Empty, "empty line"),
            (g.rsplit_once('\t').unwrap().0.as_bytes().to_vec(), BadLineKind::FieldCount, "wrong field count: found 39, expected 40 tab-separated fields"),
            (format!("{g}\t").into_bytes(), BadLineKind::FieldCount, "wrong field count: found 41"),
            (g.replacen('1', "2", 1).into_bytes(), BadLineKind::Label, "label \"2\" is not 0 or 1"),
            (g.replacen("1\t0\t1", "1\tx\t1", 1).into_bytes(), BadLineKind::Integer, "field 2 (I1) \"x\" is not an integer"),
            (g.replacen("68fd1e64", "68fd1e6z", 1).into_bytes(), BadLineKind::Categorical, "field 15 (C1) \"68fd1e6z\" is not 1 to 16 hex digits"),
            ([&g.as_bytes()[..20], b"\xff\xfe", &g.as_bytes()[20..]].concat(), BadLineKind::Utf8, "not valid UTF-8 (bad byte at offset 20)"),
        ];
        for (l, kind, msg) in cases {
            let e = parse_line(&l).unwrap_err();
            assert_eq!(e.kind, kind, "{:?}", String::from_utf8_lossy(&l));
            assert!(e.detail.starts_with(msg), "{} does not start with {msg}", e.detail);
        }
    }

    /// `good()` with `weight` inserted as field `column` (1-based).
    fn with_weight(column: usize, weight: &str) -> String {
        let g = good();
        let mut f: Vec<&str> = g.split('\t').collect();
        f.insert(column - 1, weight);
        f.join("\t")
    }

    #[test]
    fn every_kind_is_counted() {
        assert_eq!(BadLineKind::ALL.len(), BAD_LINE_KINDS);
        assert_eq!(BadLineReport::default().counts.len(), BAD_LINE_KINDS);
        assert!(BadLineKind::ALL.iter().enumerate().all(|(i, k)| k.index() == i));
    }

    #[test]
    fn a_weight_column_anywhere_parses_to_the_same_sample() {
        let want = parse_line(good().as_bytes()).unwrap();
        for column in [1, 2, 15, 40, 41] {
            for (text, w) in [("1", 1.0f32), ("0.25", 0.25), ("3e-2", 0.03), ("0", 0.0), ("-0", 0.0), ("2.5\r", 2.5)] {
                let (text, crlf) = text.strip_suffix('\r').map_or((text, ""), |t| (t, "\r"));
                let line = format!("{}{crlf}", with_weight(column, text));
                let (s, got) = parse_weighted_line(line.as_bytes(), column).unwrap_or_else(|e| panic!("column {column} weight {text}: {}", e.detail));
                assert_eq!(s, want, "column {column}");
                assert_eq!(got.to_bits(), w.to_bits(), "column {column} weight {text}");
            }
        }
        assert!(check_weight_column(1).is_ok() && check_weight_column(41).is_ok());
        for bad in [0, 42] {
            assert!(check_weight_column(bad).unwrap_err().contains("give 1 to 41"), "{bad}");
        }
    }

    #[test]
    fn bad_weights_and_40_fields_are_their_own_kinds() {
        for w in ["", "-1", "-0.5", "NaN", "nan", "inf", "-inf", "1e40", "x", "1,5", "0x1", " 1"] {
            let e = parse_weighted_line(with_weight(41, w).as_bytes(), 41).unwrap_err();
            assert_eq!(e.kind, BadLineKind::Weight, "weight {w:?}: {}", e.detail);
            assert!(e.detail.starts_with("field 41 (the weight, --weight-column 41)"), "{}", e.detail);
        }
        // 40 fields: a Criteo line without its weight.
        let e = parse_weighted_line(good().as_bytes(), 41).unwrap_err();
        assert_eq!(e.kind, BadLineKind::FieldCount);
        assert!(e.detail.contains("found 40, expected 41") && e.detail.contains("--weight-column 41"), "{}", e.detail);
        // Without the flag, a line of 41 fields says how to read it.
        let e = parse_line(with_weight(41, "1").as_bytes()).unwrap_err();
        assert!(e.detail.contains("found 41, expected 40") && e.detail.contains("give its field number with --weight-column N"), "{}", e.detail);
        // The Criteo fields' messages number the fields of the line with the weight.
        let l = with_weight(2, "1").replacen("1\t1\t0\t1", "1\t1\tx\t1", 1);
        let e = parse_weighted_line(l.as_bytes(), 2).unwrap_err();
        assert_eq!(e.kind, BadLineKind::Integer);
        assert!(e.detail.starts_with("field 3 (I1) \"x\""), "{}", e.detail);
        let l = with_weight(41, "1").replacen("68fd1e64", "zz", 1);
        let e = parse_weighted_line(l.as_bytes(), 41).unwrap_err();
        assert!(e.detail.starts_with("field 15 (C1)"), "{}", e.detail);
        assert_eq!(parse_weighted_line(b"", 41).unwrap_err().kind, BadLineKind::Empty);
        let e = parse_weighted_line(&[with_weight(41, "x").as_bytes(), b"\xff"].concat(), 41).unwrap_err();
        assert_eq!(e.kind, BadLineKind::Utf8);
        // parse_text counts them and keeps the weights of the good lines.
        let text = format!("{}\n{}\n{}\n", with_weight(41, "2"), with_weight(41, "-2"), with_weight(41, "0.5"));
        let (mut cols, mut r) = (Columns::default(), BadLineReport::default());
        assert_eq!(parse_text(text.as_bytes(), Some(41), &mut cols, &mut r, 5), None);
        assert_eq!((r.rows, r.count(BadLineKind::Weight)), (2, 1));
        assert_eq!(cols.weights, vec![2.0, 0.5]);
        assert_eq!(cols.len(), 2);
    }

    #[test]
    fn reader_handles_no_final_newline_and_tiny_reads() {
        // A reader that returns one byte at a time exercises the buffer refills.
        struct Trickle<'a>(&'a [u8]);
        impl Read for Trickle<'_> {
            fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
                match self.0.split_first() {
                    Some((b, rest)) if !out.is_empty() => {
                        out[0] = *b;
                        self.0 = rest;
                        Ok(1)
                    }
                    _ => Ok(0),
                }
            }
        }
        let text = format!("{g}\n{g}\r\n{g}", g = good());
        let r = CriteoReader::new(Trickle(text.as_bytes()), "mem", 0);
        let v: Vec<Sample> = r.collect::<DataResult<_>>().unwrap();
        assert_eq!(v.len(), 3);
    }
}
