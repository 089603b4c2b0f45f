//! Writing a Criteo TSV's rows as a Parquet file with Criteo's shape: `label` (int32),
//! `I1`..`I13` (optional int64), `C1`..`C26` (optional strings, dictionary-encoded), an
//! empty TSV field a null. `ringrec data synth --format parquet` writes its set so, and
//! the tests compare the cache of the Parquet file with that of its TSV.

use std::path::Path;
use std::sync::Arc;

use ::parquet::basic::Compression;
use ::parquet::column::writer::ColumnWriter;
use ::parquet::data_type::ByteArray;
use ::parquet::file::properties::WriterProperties;
use ::parquet::file::writer::SerializedFileWriter;
use ::parquet::schema::parser::parse_message_type;

use super::criteo::{NUM_DENSE, NUM_FIELDS, NUM_SPARSE};
use super::error::{DataError, DataResult};
use crate::fileio::AtomicFile;

/// Rows of one row group in [`tsv_to_parquet`]'s files (unless told otherwise).
pub const ROWS_PER_GROUP: usize = 64 << 10;

/// One row group's columns, as the TSV's fields: the label, 13 integers and 26 strings, with
/// a definition level each (0: null).
#[derive(Default)]
struct Group {
    labels: Vec<i32>,
    ints: Vec<(Vec<i64>, Vec<i16>)>,
    texts: Vec<(Vec<ByteArray>, Vec<i16>)>,
}

impl Group {
    fn new() -> Group {
        Group { labels: Vec::new(), ints: vec![Default::default(); NUM_DENSE], texts: vec![Default::default(); NUM_SPARSE] }
    }

    fn len(&self) -> usize {
        self.labels.len()
    }

    /// Adds the line `line` (the `n`-th, for messages) of `tsv`.
    fn push(&mut self, tsv: &Path, n: u64, line: &[u8]) -> DataResult<()> {
        let bad = |what: String| DataError::InvalidArgument(format!("{}: line {n}: {what}; only well-formed Criteo lines are written to Parquet", tsv.display()));
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let fields: Vec<&[u8]> = line.split(|&b| b == b'\t').collect();
        if fields.len() != NUM_FIELDS {
            return Err(bad(format!("{} fields, not {NUM_FIELDS}", fields.len())));
        }
        self.labels.push(match fields[0] {
            b"0" => 0,
            b"1" => 1,
            _ => return Err(bad("the label is not 0 or 1".into())),
        });
        for (j, (values, defs)) in self.ints.iter_mut().enumerate() {
            let f = fields[1 + j];
            if f.is_empty() {
                defs.push(0);
                continue;
            }
            let x = std::str::from_utf8(f).ok().and_then(|s| s.parse::<i64>().ok()).ok_or_else(|| bad(format!("I{} is not an integer", j + 1)))?;
            values.push(x);
            defs.push(1);
        }
        for (j, (values, defs)) in self.texts.iter_mut().enumerate() {
            let f = fields[1 + NUM_DENSE + j];
            if f.is_empty() {
                defs.push(0);
            } else {
                values.push(ByteArray::from(f.to_vec()));
                defs.push(1);
            }
        }
        Ok(())
    }

    fn clear(&mut self) {
        *self = Group::new();
    }
}

/// The Parquet schema of Criteo's shape.
fn criteo_schema() -> String {
    let mut s = String::from("message criteo { required int32 label; ");
    for j in 1..=NUM_DENSE {
        s += &format!("optional int64 I{j}; ");
    }
    for j in 1..=NUM_SPARSE {
        s += &format!("optional binary C{j} (UTF8); ");
    }
    s + "}"
}

/// Writes the rows of the Criteo TSV `tsv` into the Parquet file `out` (atomically, mode
/// 0600), `rows_per_group` rows a row group, snappy-compressed; returns the rows written.
pub fn tsv_to_parquet(tsv: &Path, out: &Path, rows_per_group: usize) -> DataResult<u64> {
    use std::io::BufRead;
    let fail = |e: ::parquet::errors::ParquetError| DataError::InvalidArgument(format!("{}: writing Parquet: {e}", out.display()));
    let schema = Arc::new(parse_message_type(&criteo_schema()).map_err(fail)?);
    let props = Arc::new(WriterProperties::builder().set_compression(Compression::SNAPPY).set_max_row_group_row_count(Some(rows_per_group.max(1))).build());
    let tmp = AtomicFile::create(out, crate::fileio::PRIVATE)?;
    let mut writer = SerializedFileWriter::new(tmp.file(), schema, props).map_err(fail)?;
    let src = crate::fileio::open_input(tsv).map_err(|e| DataError::io(tsv, "open", e))?;
    let mut lines = std::io::BufReader::with_capacity(1 << 20, src);
    let (mut group, mut line, mut n, mut rows) = (Group::new(), Vec::new(), 0u64, 0u64);
    loop {
        line.clear();
        let got = lines.read_until(b'\n', &mut line).map_err(|e| DataError::io(tsv, "read", e))?;
        if got > 0 {
            n += 1;
            let l = line.strip_suffix(b"\n").unwrap_or(&line);
            if !l.is_empty() {
                group.push(tsv, n, l)?;
            }
        }
        if group.len() > 0 && (got == 0 || group.len() >= rows_per_group.max(1)) {
            let mut rg = writer.next_row_group().map_err(fail)?;
            let (mut int, mut text) = (0, 0);
            while let Some(mut col) = rg.next_column().map_err(fail)? {
                match col.untyped() {
                    ColumnWriter::Int32ColumnWriter(w) => w.write_batch(&group.labels, None, None),
                    ColumnWriter::Int64ColumnWriter(w) => {
                        int += 1;
                        let (v, d) = &group.ints[int - 1];
                        w.write_batch(v, Some(d), None)
                    }
                    ColumnWriter::ByteArrayColumnWriter(w) => {
                        text += 1;
                        let (v, d) = &group.texts[text - 1];
                        w.write_batch(v, Some(d), None)
                    }
                    _ => Err(::parquet::errors::ParquetError::General("unexpected column type".into())),
                }
                .map_err(fail)?;
                col.close().map_err(fail)?;
            }
            rg.close().map_err(fail)?;
            rows += group.len() as u64;
            group.clear();
        }
        if got == 0 {
            break;
        }
    }
    writer.close().map_err(fail)?;
    tmp.commit()?;
    Ok(rows)
}
