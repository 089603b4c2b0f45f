//! Parquet inputs: a file's columns mapped onto the model's inputs (its *schema*) and read,
//! row group by row group on every core, into the same mapped cache a TSV is prepared into.
//!
//! # Schema
//!
//! The columns are those a [`ColumnSpec`] names (the column flags or a schema file:
//! [`super::schema`]). The label is the column `label`, or the one the spec names (boolean,
//! integer or floating point, 0 or 1); the weight, when the spec names one, a number >= 0
//! (never null) that becomes the row's weight as a TSV's `--weight-column` field does. The
//! features are every other column, inferred by type, or — when the spec names dense or
//! sparse columns — exactly the columns it names (the others are not read):
//!
//! | column | inferred as | becomes |
//! |---|---|---|
//! | integer or boolean | dense | a dense feature, `ln(1 + max(x, 0))` as Criteo's integers (transform `log`, the default) or as it is (`none`) |
//! | floating point | dense | a dense feature, as it is (transform `none`, the default) or `ln(1 + max(x, 0))` (`log`) |
//! | string or binary (dictionary-encoded or not) | categorical | one id, hashed with the field's number as a TSV's (a string of 1 to 16 hex digits is the number it spells, as in a TSV; other strings their FNV-1a digest) |
//! | integer named categorical | - | one id: the integer, hashed with the field's number |
//! | a list (or large list) of integer or string ids | categorical, multi-hot | a bag of ids a row, hashed with the list field's number ([`super::lists::list_key`]), pooled by the model |
//!
//! The rows have exactly the file's features ([`Fields`]): its dense columns, in column
//! order, then its single-hot categorical columns, any number of either (none padded), so a
//! Parquet file with Criteo's shape (a label, 13 integers, 26 hex strings) gives the very
//! cache its TSV gives. A file needs one feature column at least (and the models one
//! categorical column, single-hot or list: the trainer refuses a file of dense columns
//! only). Nulls are allowed in features and counted per
//! column (an empty TSV field's value: a dense null is 0, a categorical null the field's
//! missing key); a null label or weight is an error.
//!
//! List columns (multi-hot fields, in column order) make the cache a version-4 one: per row
//! and list field its ids' span, the ids, and the fields' names ([`super::cache`]). A null
//! list is an empty bag; null elements are left out (counted with the nulls).
//!
//! Every failure — a file cut short, a column of the wrong type, a value out of range — is
//! [`DataError::Parquet`], naming the file, the row group and the column.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use ::parquet::basic::Type as PhysicalType;
use ::parquet::column::reader::{ColumnReader, ColumnReaderImpl};
use ::parquet::data_type::DataType;
use ::parquet::file::reader::{FileReader, SerializedFileReader};
use ::parquet::schema::types::ColumnDescriptor;

use super::cache::{now_ns, CacheHeader, CacheLayout, ListShape, SourceStat, CACHE_MODE, ID_BYTES, SPAN_BYTES};
use super::criteo::{category_key, dense_value, missing_key, Columns};
use super::error::{DataError, DataResult};
use super::fields::Fields;
use super::prepare::{count_lines, on_threads, write_columns, write_sums, PrepareOptions, PrepareSummary};
use super::schema::{ColumnSpec, Transform};
use crate::fileio::{reserve, AtomicFile};

/// The magic bytes that start (and end) a Parquet file.
pub const MAGIC: &[u8; 4] = b"PAR1";

/// What a column is to the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The row's label.
    Label,
    /// The row's weight (a number >= 0).
    Weight,
    /// Dense feature `slot` (0-based), `ln(1 + max(x, 0))` when `log`.
    Dense {
        /// Its slot among the dense features.
        slot: usize,
        /// Whether the log transform applies.
        log: bool,
    },
    /// Categorical field `slot` (0-based): one id a row.
    Sparse {
        /// Its slot among the single-hot fields.
        slot: usize,
    },
    /// Multi-hot field `slot` (0-based, among the list columns): a bag of ids a row.
    List {
        /// Its place among the list fields.
        slot: usize,
    },
}

/// One column of the file and what it becomes.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Field {
    /// Its index among the file's leaf columns.
    pub column: usize,
    /// Its name.
    pub name: String,
    /// What it becomes.
    pub role: Role,
}

/// A file's columns mapped onto the model's inputs (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Schema {
    /// The columns read, the label first (then the weight, when there is one).
    pub fields: Vec<Field>,
}

/// The kinds of leaf column the schema tells apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Bool,
    Int,
    Float,
    Text,
    List,
    Other,
}

fn kind_of(c: &ColumnDescriptor) -> Kind {
    if c.max_rep_level() > 0 {
        return Kind::List;
    }
    match c.physical_type() {
        PhysicalType::BOOLEAN => Kind::Bool,
        PhysicalType::INT32 | PhysicalType::INT64 => Kind::Int,
        PhysicalType::FLOAT | PhysicalType::DOUBLE => Kind::Float,
        PhysicalType::BYTE_ARRAY | PhysicalType::FIXED_LEN_BYTE_ARRAY => Kind::Text,
        _ => Kind::Other,
    }
}

/// A column's name: its top-level field (a list's leaf is `name.list.element`).
fn top_name(c: &ColumnDescriptor) -> String {
    c.path().parts().first().cloned().unwrap_or_else(|| c.name().to_string())
}

impl Schema {
    /// The schema of the file `path` whose leaf columns are `columns`, as `spec` names them.
    pub fn infer(path: &Path, columns: &[std::sync::Arc<ColumnDescriptor>], spec: &ColumnSpec) -> DataResult<Schema> {
        let refuse = |column: &str, reason: String| DataError::Parquet { path: path.to_path_buf(), at: format!("column `{column}`"), detail: reason };
        let label = spec.label.as_deref().unwrap_or("label");
        let Some(li) = columns.iter().position(|c| top_name(c) == label) else {
            let names: Vec<String> = columns.iter().map(|c| top_name(c)).collect();
            return Err(refuse(label, format!("no such column (the file has {}); name the label column with {}", names.join(", "), spec.origin("label"))));
        };
        if !matches!(kind_of(&columns[li]), Kind::Bool | Kind::Int | Kind::Float) {
            return Err(refuse(label, format!("the label is of type {}, not a boolean or a number", columns[li].physical_type())));
        }
        let mut fields = vec![Field { column: li, name: label.to_string(), role: Role::Label }];
        let wi = Schema::weight_column(path, columns, spec)?;
        if let Some(wi) = wi {
            fields.push(Field { column: wi, name: top_name(&columns[wi]), role: Role::Weight });
        }
        let named = spec.names_features();
        for (key, list) in [("dense", &spec.dense), ("sparse", &spec.sparse), ("multi_hot", &spec.multi_hot)] {
            for name in list {
                if !columns.iter().any(|c| top_name(c) == *name) {
                    return Err(refuse(name, format!("no such column, but {} names it", spec.origin(key))));
                }
            }
        }
        for (name, _) in &spec.transforms {
            if !spec.dense.contains(name) {
                return Err(refuse(name, format!("{} gives it a transform, but it is not a dense column", spec.origin("dense"))));
            }
        }
        let (mut dense, mut sparse, mut lists) = (0usize, 0usize, 0usize);
        for (i, c) in columns.iter().enumerate().filter(|&(i, _)| i != li && Some(i) != wi) {
            let name = top_name(c);
            let kind = kind_of(c);
            let multi_hot = spec.multi_hot.contains(&name);
            if multi_hot && kind != Kind::List {
                return Err(refuse(&name, format!("named multi-hot by {}, but not a list column: name a single-id column in `sparse`", spec.origin("multi_hot"))));
            }
            let (as_dense, as_sparse) = if named {
                (spec.dense.contains(&name), spec.sparse.contains(&name) || multi_hot)
            } else {
                (!matches!(kind, Kind::Text | Kind::List), matches!(kind, Kind::Text | Kind::List))
            };
            if !as_dense && !as_sparse {
                continue;
            }
            let role = match kind {
                Kind::List if as_dense => return Err(refuse(&name, format!("a list column (multi-hot) cannot be a dense feature ({})", spec.origin("dense")))),
                Kind::List if c.max_rep_level() > 1 => return Err(refuse(&name, "a list of lists (nested); a multi-hot field is a flat list of integer or string ids".into())),
                Kind::List if !matches!(c.physical_type(), PhysicalType::INT32 | PhysicalType::INT64 | PhysicalType::BYTE_ARRAY | PhysicalType::FIXED_LEN_BYTE_ARRAY) => {
                    return Err(refuse(&name, format!("a list of {} values; a multi-hot field is a list of integer or string ids", c.physical_type())))
                }
                Kind::List => {
                    lists += 1;
                    Role::List { slot: lists - 1 }
                }
                Kind::Other => return Err(refuse(&name, format!("of type {}, which ringrec does not read (a feature is a boolean, a number or a string)", c.physical_type()))),
                _ if as_dense && as_sparse => return Err(refuse(&name, format!("named by both {} and {}", spec.origin("dense"), spec.origin("sparse")))),
                Kind::Text if as_dense => return Err(refuse(&name, format!("a string column cannot be a dense feature ({})", spec.origin("dense")))),
                Kind::Float if as_sparse => return Err(refuse(&name, format!("a floating-point column cannot be a categorical field ({})", spec.origin("sparse")))),
                _ if as_sparse => {
                    sparse += 1;
                    Role::Sparse { slot: sparse - 1 }
                }
                _ => {
                    dense += 1;
                    let log = spec.transform(&name).map_or(kind != Kind::Float, |t| t == Transform::Log);
                    Role::Dense { slot: dense - 1, log }
                }
            };
            fields.push(Field { column: i, name, role });
        }
        let schema = Schema { fields };
        if dense + sparse + lists == 0 {
            return Err(DataError::Parquet { path: path.to_path_buf(), at: "columns".into(), detail: "no feature column besides the label (and the weight)".into() });
        }
        if let Some(e) = schema.fields().check() {
            return Err(DataError::Parquet { path: path.to_path_buf(), at: "columns".into(), detail: e });
        }
        Ok(schema)
    }

    /// The rows' shape: the dense and the single-hot categorical columns read.
    pub fn fields(&self) -> Fields {
        let count = |dense: bool| self.fields.iter().filter(|f| if dense { matches!(f.role, Role::Dense { .. }) } else { matches!(f.role, Role::Sparse { .. }) }).count();
        Fields { dense: count(true), sparse: count(false) }
    }

    /// The single-hot categorical fields' names, in their order.
    pub fn sparse_names(&self) -> Vec<String> {
        self.fields.iter().filter(|f| matches!(f.role, Role::Sparse { .. })).map(|f| f.name.clone()).collect()
    }

    /// The dense columns' names in their slots' order (the file's column order).
    pub fn dense_names(&self) -> Vec<String> {
        self.fields.iter().filter(|f| matches!(f.role, Role::Dense { .. })).map(|f| f.name.clone()).collect()
    }

    /// The list (multi-hot) fields' names, in their order.
    pub fn list_names(&self) -> Vec<String> {
        self.fields.iter().filter(|f| matches!(f.role, Role::List { .. })).map(|f| f.name.clone()).collect()
    }

    /// The list fields' leaf columns, in their order.
    fn list_columns(&self) -> Vec<usize> {
        self.fields.iter().filter(|f| matches!(f.role, Role::List { .. })).map(|f| f.column).collect()
    }

    /// Whether a column is the rows' weight.
    pub fn weighted(&self) -> bool {
        self.fields.iter().any(|f| f.role == Role::Weight)
    }

    /// The index of the weight column `spec` names, checked to be a flat number column.
    fn weight_column(path: &Path, columns: &[std::sync::Arc<ColumnDescriptor>], spec: &ColumnSpec) -> DataResult<Option<usize>> {
        let Some(name) = &spec.weight else { return Ok(None) };
        let refuse = |reason: String| DataError::Parquet { path: path.to_path_buf(), at: format!("column `{name}`"), detail: reason };
        let Some(i) = columns.iter().position(|c| top_name(c) == *name) else {
            return Err(refuse(format!("no such column, but {} names it as the weight", spec.origin("weight"))));
        };
        match kind_of(&columns[i]) {
            Kind::Bool | Kind::Int | Kind::Float => Ok(Some(i)),
            _ => Err(refuse(format!("the weight is of type {}, not a number ({})", columns[i].physical_type(), spec.origin("weight")))),
        }
    }
}

/// The key of a string value of categorical field `slot`: the number its 1 to 16 hex digits
/// spell (as a TSV's), else its FNV-1a digest; an empty string is the missing value.
pub fn text_key(slot: usize, bytes: &[u8]) -> u64 {
    if bytes.is_empty() {
        return missing_key(slot);
    }
    category_key(slot, super::criteo::parse_hex(bytes).unwrap_or_else(|| crate::hash::fnv1a64(bytes)))
}

/// Where the values of one column go in a row group's columns.
struct Sink<'a> {
    role: Role,
    /// The group's first row in the file (messages number rows in the file, from 0).
    base: u64,
    cols: &'a mut Columns,
}

impl Sink<'_> {
    fn label(&mut self, row: usize, x: f64) -> Result<(), String> {
        if x != 0.0 && x != 1.0 {
            return Err(format!("row {}: label {x} is not 0 or 1", self.base + row as u64));
        }
        self.cols.labels[row] = x as f32;
        Ok(())
    }

    fn weight(&mut self, row: usize, x: f64) -> Result<(), String> {
        let w = x as f32;
        if !(w.is_finite() && w >= 0.0) {
            return Err(format!("row {}: weight {x} is not a finite number >= 0", self.base + row as u64));
        }
        self.cols.weights[row] = w + 0.0;
        Ok(())
    }

    fn int(&mut self, row: usize, x: i64) -> Result<(), String> {
        match self.role {
            Role::Label => self.label(row, x as f64)?,
            Role::Weight => self.weight(row, x as f64)?,
            Role::Dense { slot, log } => self.cols.dense[row * self.cols.fields.dense + slot] = if log { dense_value(x) } else { x as f32 },
            Role::Sparse { slot } => self.cols.keys[row * self.cols.fields.sparse + slot] = category_key(slot, x as u64),
            Role::List { .. } => return Err("a list column is read as bags".into()),
        }
        Ok(())
    }

    fn float(&mut self, row: usize, x: f64) -> Result<(), String> {
        match self.role {
            Role::Label => self.label(row, x)?,
            Role::Weight => self.weight(row, x)?,
            Role::Dense { slot, log } => self.cols.dense[row * self.cols.fields.dense + slot] = if log { x.max(0.0).ln_1p() as f32 } else { x as f32 },
            Role::Sparse { .. } | Role::List { .. } => return Err("a floating-point column cannot be categorical".into()),
        }
        Ok(())
    }

    fn text(&mut self, row: usize, bytes: &[u8]) -> Result<(), String> {
        match self.role {
            Role::Sparse { slot } => self.cols.keys[row * self.cols.fields.sparse + slot] = text_key(slot, bytes),
            _ => return Err("a string column can only be categorical".into()),
        }
        Ok(())
    }
}

/// Reads the `rows` values of a flat column, handing each non-null one to `put` with its
/// row; returns the nulls.
fn read_flat<T: DataType>(r: &mut ColumnReaderImpl<T>, rows: usize, max_def: i16, mut put: impl FnMut(usize, &T::T) -> Result<(), String>) -> Result<u64, String> {
    let (mut defs, mut values) = (Vec::new(), Vec::new());
    let (mut row, mut nulls) = (0usize, 0u64);
    while row < rows {
        defs.clear();
        values.clear();
        let (records, _, _) = r.read_records(rows - row, (max_def > 0).then_some(&mut defs), None, &mut values).map_err(|e| e.to_string())?;
        if records == 0 {
            return Err(format!("the column ends at row {row} of the group's {rows}"));
        }
        if max_def == 0 {
            for (i, v) in values.iter().enumerate().take(records) {
                put(row + i, v)?;
            }
        } else {
            let mut vi = values.iter();
            for (i, &d) in defs.iter().enumerate().take(records) {
                if d == max_def {
                    let v = vi.next().ok_or("fewer values than definition levels")?;
                    put(row + i, v)?;
                } else {
                    nulls += 1;
                }
            }
        }
        row += records;
    }
    Ok(nulls)
}

/// Reads row group `g` (of `rows` rows, the first row `base` of the file) into `cols`: the
/// label, the schema's dense values and keys and (when it has a weight) the weight a row.
/// Returns the nulls of each of `schema.fields`.
fn read_group(path: &Path, reader: &SerializedFileReader<std::fs::File>, schema: &Schema, g: usize, base: u64, rows: usize, cols: &mut Columns) -> DataResult<Vec<u64>> {
    cols.clear();
    cols.fields = schema.fields();
    let fields = cols.fields;
    cols.labels.resize(rows, f32::NAN);
    if schema.weighted() {
        cols.weights.resize(rows, f32::NAN);
    }
    cols.dense.resize(rows * fields.dense, 0.0);
    cols.keys.extend((0..rows).flat_map(|_| (0..fields.sparse).map(missing_key)));
    let fail = |column: &str, detail: String| DataError::Parquet { path: path.to_path_buf(), at: format!("row group {g}, column `{column}`"), detail };
    let group = reader.get_row_group(g).map_err(|e| DataError::Parquet { path: path.to_path_buf(), at: format!("row group {g}"), detail: e.to_string() })?;
    let descr = reader.metadata().file_metadata().schema_descr_ptr();
    let mut nulls = Vec::with_capacity(schema.fields.len());
    for f in &schema.fields {
        if matches!(f.role, Role::List { .. }) {
            // Read as bags, its nulls counted there ([`ListPlan::read`]).
            nulls.push(0);
            continue;
        }
        let max_def = descr.column(f.column).max_def_level();
        let mut sink = Sink { role: f.role, base, cols: &mut *cols };
        let column = group.get_column_reader(f.column).map_err(|e| fail(&f.name, e.to_string()))?;
        let n = match column {
            ColumnReader::BoolColumnReader(mut r) => read_flat(&mut r, rows, max_def, |row, &v| sink.int(row, i64::from(v))),
            ColumnReader::Int32ColumnReader(mut r) => read_flat(&mut r, rows, max_def, |row, &v| sink.int(row, i64::from(v))),
            ColumnReader::Int64ColumnReader(mut r) => read_flat(&mut r, rows, max_def, |row, &v| sink.int(row, v)),
            ColumnReader::FloatColumnReader(mut r) => read_flat(&mut r, rows, max_def, |row, &v| sink.float(row, f64::from(v))),
            ColumnReader::DoubleColumnReader(mut r) => read_flat(&mut r, rows, max_def, |row, &v| sink.float(row, v)),
            ColumnReader::ByteArrayColumnReader(mut r) => read_flat(&mut r, rows, max_def, |row, v| sink.text(row, v.data())),
            ColumnReader::FixedLenByteArrayColumnReader(mut r) => read_flat(&mut r, rows, max_def, |row, v| sink.text(row, v.data())),
            ColumnReader::Int96ColumnReader(_) => Err("INT96 columns are not read".into()),
        }
        .map_err(|e| fail(&f.name, e))?;
        if matches!(f.role, Role::Label | Role::Weight) && n > 0 {
            let (what, values) = if f.role == Role::Label { ("label", &cols.labels) } else { ("weight", &cols.weights) };
            let row = values.iter().position(|l| l.is_nan()).unwrap_or(0);
            return Err(fail(&f.name, format!("row {}: the {what} is null ({n} null {what}(s) in the group)", base + row as u64)));
        }
        nulls.push(n);
    }
    Ok(nulls)
}

/// Opens `path` as a Parquet file.
fn open(path: &Path) -> DataResult<SerializedFileReader<std::fs::File>> {
    let file = crate::fileio::open_input(path).map_err(|e| DataError::io(path, "open", e))?;
    SerializedFileReader::new(file).map_err(|e| DataError::Parquet { path: path.to_path_buf(), at: "footer".into(), detail: format!("{e} (a file cut short, or not Parquet)") })
}

/// The schema of the Parquet file `path`, as `spec` names its columns.
pub fn schema_of(path: &Path, spec: &ColumnSpec) -> DataResult<Schema> {
    let reader = open(path)?;
    Schema::infer(path, reader.metadata().file_metadata().schema_descr().columns(), spec)
}

/// The nulls of each column the schema of `path` reads (as `spec` names them), from the
/// file's footer (the writer's statistics: no column is read), in [`Schema::fields`] order;
/// `None` for a column whose statistics do not count its nulls.
pub fn null_counts(path: &Path, spec: &ColumnSpec) -> DataResult<Vec<(String, Option<u64>)>> {
    let reader = open(path)?;
    let meta = reader.metadata();
    let schema = Schema::infer(path, meta.file_metadata().schema_descr().columns(), spec)?;
    let count = |column: usize| -> Option<u64> { meta.row_groups().iter().map(|g| g.column(column).statistics().and_then(|s| s.null_count_opt())).sum() };
    Ok(schema.fields.iter().map(|f| (f.name.clone(), count(f.column))).collect())
}

/// Converts the Parquet file `src` into the cache file `out` (written atomically, mode 0600)
/// on `opts.threads` threads, each reading whole row groups and writing them at their rows.
pub fn prepare(src: &Path, out: &Path, opts: &PrepareOptions) -> DataResult<PrepareSummary> {
    if let Some(c) = opts.weight_column {
        return Err(DataError::InvalidArgument(format!("{}: --weight-column {c} numbers a TSV's fields; a Parquet file's weight is a column: name it (--weight-column NAME, or `weight` in the schema file)", src.display())));
    }
    let source = SourceStat::of(src)?;
    let reader = open(src)?;
    let schema = Schema::infer(src, reader.metadata().file_metadata().schema_descr().columns(), &opts.columns)?;
    let groups: Vec<u64> = reader.metadata().row_groups().iter().map(|g| g.num_rows().max(0) as u64).collect();
    let starts: Vec<u64> = groups.iter().scan(0u64, |at, &n| Some(std::mem::replace(at, *at + n))).collect();
    let rows: u64 = groups.iter().sum();
    if rows == 0 {
        return Err(DataError::NoRows { path: src.to_path_buf(), lines: 0 });
    }
    let threads = opts.threads.max(1);
    let (_, source_crc32) = count_lines(src, source.size, threads)?;
    let lists = ListPlan::new(&reader, &schema);
    let layout = CacheLayout::compute_with(rows, rows, schema.weighted(), lists.shape(), schema.fields()).ok_or_else(|| DataError::InvalidArgument(format!("{}: {rows} rows do not fit in the address space", src.display())))?;
    let tmp = AtomicFile::create(out, CACHE_MODE)?;
    reserve(tmp.file(), tmp.path(), layout.file_len)?;
    tmp.file().set_len(layout.file_len).map_err(|e| DataError::io(tmp.path(), "write", e))?;
    if !lists.names.is_empty() {
        use std::os::unix::fs::FileExt;
        tmp.file().write_all_at(&lists.names, layout.names_offset).map_err(|e| DataError::io(tmp.path(), "write", e))?;
    }

    let (claim, stop) = (AtomicUsize::new(0), AtomicBool::new(false));
    let nulls: Vec<AtomicU64> = schema.fields.iter().map(|_| AtomicU64::new(0)).collect();
    let failures = on_threads(threads.min(groups.len()), |_| -> Vec<(usize, DataError)> {
        // A reader of its own: the crate reads a `File` through clones of its descriptor,
        // which share one offset, so one reader cannot serve several threads.
        let reader = match open(src) {
            Ok(r) => r,
            Err(e) => return vec![(0, e)],
        };
        let mut cols = Columns::default();
        let mut bags = GroupBags::default();
        loop {
            let g = claim.fetch_add(1, Ordering::Relaxed);
            if g >= groups.len() || stop.load(Ordering::Relaxed) {
                return Vec::new();
            }
            if opts.cancel.as_ref().is_some_and(|c| c.load(Ordering::Relaxed)) {
                return vec![(g, DataError::Cancelled { path: src.to_path_buf() })];
            }
            // A reader that panics on a damaged file is an error naming the row group.
            let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let mut n = read_group(src, &reader, &schema, g, starts[g], groups[g] as usize, &mut cols)?;
                lists.read(src, &reader, &schema, g, groups[g] as usize, &mut bags, &mut n)?;
                Ok(n)
            }));
            let read = read.unwrap_or_else(|_| Err(DataError::Parquet { path: src.to_path_buf(), at: format!("row group {g}"), detail: "the Parquet reader failed on it (a damaged file)".into() }));
            let done = read.and_then(|n| {
                for (total, n) in nulls.iter().zip(n) {
                    total.fetch_add(n, Ordering::Relaxed);
                }
                write_columns(&tmp, &layout, starts[g], &cols)?;
                lists.write(src, &tmp, &layout, g, starts[g], &bags)
            });
            if let Err(e) = done {
                stop.store(true, Ordering::Relaxed);
                return vec![(g, e)];
            }
        }
    });
    // The first failure in file order.
    if let Some((_, e)) = failures.into_iter().flatten().min_by_key(|(g, _)| *g) {
        return Err(e);
    }
    let sums_crc32 = write_sums(&tmp, &layout, threads)?;
    let now = SourceStat::of(src)?;
    let prepared_ns = now_ns();
    if now != source {
        return Err(DataError::SourceChanged { path: src.to_path_buf(), detail: format!("its stat was {source:?} before reading and is {now:?} after") });
    }
    let report = super::criteo::BadLineReport { lines: rows, rows, ..Default::default() };
    let header = CacheHeader {
        rows,
        row_capacity: rows,
        lines: rows,
        bad_lines: 0,
        bad_counts: [0; 7],
        weight_column: opts.weights_field(),
        list_fields: lists.columns.len() as u32,
        fields: schema.fields(),
        source,
        source_crc32,
        prepared_ns,
        sums_crc32,
        layout,
    };
    use std::os::unix::fs::FileExt;
    tmp.file().write_all_at(&header.encode(), 0).map_err(|e| DataError::io(tmp.path(), "write", e))?;
    tmp.commit()?;
    let column_nulls: Vec<(String, u64)> = schema.fields.iter().zip(nulls).map(|(f, n)| (f.name.clone(), n.into_inner())).collect();
    let nulls = column_nulls.iter().map(|(_, n)| n).sum();
    Ok(PrepareSummary { path: out.to_path_buf(), rows, bytes: layout.file_len, source_bytes: source.size, source_crc32, threads, parsing_threads: threads, report, nulls, column_nulls })
}

/// Where a file's list columns go in a version-4 cache: each row group's ids at their own
/// place, after the room the groups before it may fill (their list columns' values, nulls
/// included, from the footer: an upper bound of their ids, so the groups are written
/// independently, on every thread).
struct ListPlan {
    /// The list fields' leaf columns (empty: no lists, a version-2 cache).
    columns: Vec<usize>,
    /// The names section.
    names: Vec<u8>,
    /// Per row group: its first id's place and its room.
    room: Vec<(u64, u64)>,
}

/// One row group's bags (scratch of a thread).
#[derive(Default)]
struct GroupBags {
    ends: Vec<u32>,
    keys: Vec<u64>,
}

impl ListPlan {
    fn new(reader: &SerializedFileReader<std::fs::File>, schema: &Schema) -> ListPlan {
        let columns = schema.list_columns();
        let names = super::cache::encode_list_names(&schema.list_names());
        let mut at = 0u64;
        let room = reader
            .metadata()
            .row_groups()
            .iter()
            .map(|g| {
                let n: u64 = columns.iter().map(|&c| g.column(c).num_values().max(0) as u64).sum();
                let first = at;
                at += n;
                (first, n)
            })
            .collect();
        ListPlan { columns, names, room }
    }

    /// The cache's list sections (`None` without lists).
    fn shape(&self) -> Option<ListShape> {
        let id_capacity = self.room.last().map_or(0, |(at, n)| at + n);
        (!self.columns.is_empty()).then_some(ListShape { fields: self.columns.len() as u32, id_capacity, names_len: self.names.len() as u64 })
    }

    /// Reads row group `g`'s bags into `bags`; adds each list field's null (or empty) lists
    /// and null elements to its entry of `nulls` (one per field of `schema`).
    #[allow(clippy::too_many_arguments)]
    fn read(&self, path: &Path, reader: &SerializedFileReader<std::fs::File>, schema: &Schema, g: usize, rows: usize, bags: &mut GroupBags, nulls: &mut [u64]) -> DataResult<()> {
        bags.ends.clear();
        bags.keys.clear();
        if self.columns.is_empty() {
            return Ok(());
        }
        let mut counts = vec![(0, 0); self.columns.len()];
        super::lists::read_group_bags(path, reader, (g, rows), &self.columns, &schema.list_names(), schema.fields(), &mut bags.ends, &mut bags.keys, &mut counts)?;
        let fields = schema.fields.iter().enumerate().filter(|(_, f)| matches!(f.role, Role::List { .. }));
        for ((at, _), (empty, null_elements)) in fields.zip(counts) {
            nulls[at] += empty + null_elements;
        }
        Ok(())
    }

    /// Writes row group `g`'s bags (its first row `first`) at their places.
    fn write(&self, path: &Path, out: &AtomicFile, layout: &CacheLayout, g: usize, first: u64, bags: &GroupBags) -> DataResult<()> {
        if self.columns.is_empty() {
            return Ok(());
        }
        let (at, room) = self.room[g];
        if bags.keys.len() as u64 > room {
            return Err(DataError::Parquet { path: path.to_path_buf(), at: format!("row group {g}"), detail: format!("{} list ids, but the footer counts {room} values in its list columns (a damaged file)", bags.keys.len()) });
        }
        let mut spans = Vec::with_capacity(2 * bags.ends.len());
        let mut start = at;
        for &e in &bags.ends {
            spans.extend_from_slice(&[start, at + u64::from(e)]);
            start = at + u64::from(e);
        }
        use std::os::unix::fs::FileExt;
        let fields = self.columns.len() as u64;
        for (bytes, offset) in [(bytemuck::cast_slice::<u64, u8>(&spans), layout.spans_offset + first * fields * SPAN_BYTES), (bytemuck::cast_slice(&bags.keys), layout.ids_offset + at * ID_BYTES)] {
            out.file().write_all_at(bytes, offset).map_err(|e| DataError::io(out.path(), "write", e))?;
        }
        Ok(())
    }
}

/// Whether `path` starts with Parquet's magic.
pub fn is_parquet(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 4];
    crate::fileio::open_input(path).and_then(|mut f| f.read_exact(&mut head)).is_ok_and(|_| head == *MAGIC)
}

/// Refuses Parquet inputs whose schemas differ (as `spec` names their columns): the first
/// that differs from the first Parquet file of `files`, naming the column. Other files pass.
pub fn check_same_schema(files: &[std::path::PathBuf], spec: &ColumnSpec) -> DataResult<()> {
    let mut first: Option<(&Path, Schema)> = None;
    for path in files.iter().filter(|p| is_parquet(p)) {
        let schema = schema_of(path, spec)?;
        let Some((first_path, want)) = &first else {
            first = Some((path, schema));
            continue;
        };
        let described = |s: &Schema, i: usize| s.fields.get(i).map_or("absent".to_string(), |f| format!("`{}` ({:?})", f.name, f.role));
        if let Some(i) = (0..schema.fields.len().max(want.fields.len())).find(|&i| schema.fields.get(i) != want.fields.get(i)) {
            let name = schema.fields.get(i).or(want.fields.get(i)).map_or(String::new(), |f| f.name.clone());
            return Err(DataError::Parquet {
                path: path.clone(),
                at: format!("column `{name}`"),
                detail: format!(
                    "the schema differs from that of {}: its input {i} is {} here and {} there; every Parquet input of a run must have the same columns",
                    first_path.display(),
                    described(&schema, i),
                    described(want, i)
                ),
            });
        }
    }
    Ok(())
}
