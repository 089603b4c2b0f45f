//! Multi-hot list columns of a Parquet file (issue 33) read into bags: per row and list
//! field, its ids hashed with the field's number into keys of the one host table, in CSR
//! form — the ids of field `g` of row `r` are `keys[offsets[r * fields + g]..offsets[r *
//! fields + g + 1]]`, rows in file order, fields in the order named. List field `g` is
//! categorical field number [`Fields::list_field`]`(g)` (after the single-hot fields: `26 +
//! g` up to 26 of them), so a list id never shares a key with a single-hot id of another
//! field. A null list and an empty one
//! are both an empty bag (counted); a null element is left out (counted).
//!
//! An id is an integer (int64, int32, uint32, uint64: the number it is, as an unsigned
//! 64-bit number) or a string (1 to 16 hex digits: the number they spell, else its FNV-1a
//! 64, as a single-hot string's; an empty string is left out like a null). A list or a
//! large list alike; a list of floating-point or boolean values, or of lists, is refused
//! naming the column.
//!
//! `data prepare` writes them into a version-4 cache's `spans` and `ids` sections
//! ([`super::parquet_file::prepare`], row group by row group);
//! [`crate::train::batch::Batch::load_columns_with_bags`] takes the same CSR.

use std::path::Path;

use ::parquet::basic::ConvertedType;
use ::parquet::column::reader::{ColumnReader, ColumnReaderImpl};
use ::parquet::data_type::DataType;
use ::parquet::file::reader::{FileReader, SerializedFileReader};
use ::parquet::schema::types::{ColumnDescriptor, SchemaDescriptor};

use super::criteo::{category_key, NUM_SPARSE};
use super::error::{DataError, DataResult};
use super::fields::Fields;
use crate::hash::fnv1a64;

/// The key of id `id` of list field `g` of data with at most 26 single-hot fields
/// (categorical field `26 + g`, salted as [`super::criteo::category_key`] salts the
/// single-hot fields; [`Fields::list_key`] for any data).
pub fn list_key(g: usize, id: u64) -> u64 {
    category_key(NUM_SPARSE + g, id)
}

/// Bags of a file's list columns (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bags {
    /// List fields per row.
    pub fields: usize,
    /// Where each bag's keys start (`rows * fields + 1` entries, from 0).
    pub offsets: Vec<u32>,
    /// The keys of every bag, bag after bag.
    pub keys: Vec<u64>,
    /// Null or empty lists.
    pub empty: u64,
    /// Null elements left out.
    pub null_elements: u64,
}

impl Bags {
    /// Rows read.
    pub fn rows(&self) -> usize {
        (self.offsets.len() - 1).checked_div(self.fields).unwrap_or(0)
    }
}

/// The id of a string element: the number its 1 to 16 hex digits spell, else its FNV-1a
/// 64; `None` (left out) for an empty string.
fn text_id(bytes: &[u8]) -> Option<u64> {
    (!bytes.is_empty()).then(|| super::criteo::parse_hex(bytes).unwrap_or_else(|| fnv1a64(bytes)))
}

/// Whether a leaf column holds unsigned integers (uint32 is stored as an INT32).
fn unsigned(leaf: &ColumnDescriptor) -> bool {
    // A logical type's unsigned integer has its converted type too (the format's rule).
    matches!(leaf.converted_type(), ConvertedType::UINT_8 | ConvertedType::UINT_16 | ConvertedType::UINT_32 | ConvertedType::UINT_64)
}

/// One list column (leaf `leaf`) of one row group: per row its ids (hashed), appended to
/// `ids`, and their count to `lens`, each value's id by the column's type (see the module
/// docs).
fn read_list(r: ColumnReader, leaf: &ColumnDescriptor, (fields, g): (Fields, usize), rows: usize, lens: &mut Vec<u32>, ids: &mut Vec<u64>, counts: &mut (u64, u64)) -> Result<(), String> {
    let max_def = leaf.max_def_level();
    let levels = (max_def, max_def - i16::from(leaf.self_type().is_optional()));
    let unsigned = unsigned(leaf);
    match r {
        ColumnReader::Int64ColumnReader(mut c) => read_levels(&mut c, (fields, g), rows, levels, lens, ids, counts, |v| Some(*v as u64)),
        ColumnReader::Int32ColumnReader(mut c) if unsigned => read_levels(&mut c, (fields, g), rows, levels, lens, ids, counts, |v| Some(u64::from(*v as u32))),
        ColumnReader::Int32ColumnReader(mut c) => read_levels(&mut c, (fields, g), rows, levels, lens, ids, counts, |v| Some(i64::from(*v) as u64)),
        ColumnReader::ByteArrayColumnReader(mut c) => read_levels(&mut c, (fields, g), rows, levels, lens, ids, counts, |v| text_id(v.data())),
        ColumnReader::FixedLenByteArrayColumnReader(mut c) => read_levels(&mut c, (fields, g), rows, levels, lens, ids, counts, |v| text_id(v.data())),
        _ => Err("a list of floating-point or boolean values; a multi-hot field is a list of integer or string ids".into()),
    }
}

/// [`read_list`] over a column of values of type `T`, `id` giving a value's id (`None`: left
/// out, counted as a null element). A level of definition `max_def` is a value; one below
/// `list_def` (the definition level of a list with an element) that starts a row is a null
/// or empty list; any other, a null element.
#[allow(clippy::too_many_arguments)]
fn read_levels<T: DataType>(col: &mut ColumnReaderImpl<T>, (fields, g): (Fields, usize), rows: usize, (max_def, list_def): (i16, i16), lens: &mut Vec<u32>, ids: &mut Vec<u64>, counts: &mut (u64, u64), id: impl Fn(&T::T) -> Option<u64>) -> Result<(), String> {
    let (mut defs, mut reps, mut values) = (Vec::new(), Vec::new(), Vec::new());
    let mut done = 0usize;
    while done < rows {
        defs.clear();
        reps.clear();
        values.clear();
        let (records, _, levels) = col.read_records(rows - done, Some(&mut defs), Some(&mut reps), &mut values).map_err(|e| e.to_string())?;
        if records == 0 {
            return Err(format!("the column ends at row {done} of the group's {rows}"));
        }
        let mut vi = values.iter();
        for i in 0..levels {
            if reps[i] == 0 {
                lens.push(0);
                if defs[i] < list_def {
                    counts.0 += 1;
                    continue;
                }
            }
            if defs[i] == max_def {
                let v = vi.next().ok_or("fewer values than definition levels")?;
                match id(v) {
                    Some(v) => {
                        ids.push(fields.list_key(g, v));
                        *lens.last_mut().ok_or("a list continues before it starts")? += 1;
                    }
                    None => counts.1 += 1,
                }
            } else {
                counts.1 += 1;
            }
        }
        done += records;
    }
    Ok(())
}

/// The leaf columns of the list columns `names` of a file whose schema is `descr`, in that
/// order; an error names the first that is not a flat list column.
pub(crate) fn list_columns(path: &Path, descr: &SchemaDescriptor, names: &[String]) -> DataResult<Vec<usize>> {
    let mut columns = Vec::with_capacity(names.len());
    for name in names {
        let at = (0..descr.num_columns()).find(|i| descr.column(*i).path().parts().first() == Some(name));
        let at = at.filter(|i| descr.column(*i).max_rep_level() == 1).ok_or_else(|| DataError::Parquet { path: path.to_path_buf(), at: format!("column `{name}`"), detail: "no such list column (a multi-hot field is a flat list of integer or string ids)".into() })?;
        columns.push(at);
    }
    Ok(columns)
}

/// The bags of row group `rg` (of `rows` rows) of `reader`'s list columns `columns` (leaf
/// indices, named `names`; keys salted after `fields`' single-hot fields): appended to `keys`, and after each bag (row by row, field by
/// field) its end in the group's keys to `ends` (from the group's first key, 0). Null
/// lists and null elements are added to `counts`, one entry per column (empty or null
/// lists, null elements).
/// An error names the file, the row group and the column.
#[allow(clippy::too_many_arguments)]
pub(crate) fn read_group_bags(path: &Path, reader: &SerializedFileReader<std::fs::File>, (rg, rows): (usize, usize), columns: &[usize], names: &[String], fields: Fields, ends: &mut Vec<u32>, keys: &mut Vec<u64>, counts: &mut [(u64, u64)]) -> DataResult<()> {
    let fail = |at: String, detail: String| DataError::Parquet { path: path.to_path_buf(), at, detail };
    let group = reader.get_row_group(rg).map_err(|e| fail(format!("row group {rg}"), e.to_string()))?;
    let descr = reader.metadata().file_metadata().schema_descr_ptr();
    let (mut lens, mut ids) = (Vec::with_capacity(rows * names.len()), Vec::new());
    let mut per_field = Vec::with_capacity(names.len());
    for (g, (&c, name)) in columns.iter().zip(names).enumerate() {
        let (start_len, start_id) = (lens.len(), ids.len());
        let r = group.get_column_reader(c).map_err(|e| fail(format!("row group {rg}, column `{name}`"), e.to_string()))?;
        read_list(r, &descr.column(c), (fields, g), rows, &mut lens, &mut ids, &mut counts[g]).map_err(|e| fail(format!("row group {rg}, column `{name}`"), e))?;
        if lens.len() - start_len != rows {
            return Err(fail(format!("row group {rg}, column `{name}`"), format!("{} lists for the group's {rows} rows", lens.len() - start_len)));
        }
        per_field.push((start_len, start_id));
    }
    // Interleave: row by row, field by field.
    let first = keys.len();
    let mut next: Vec<usize> = per_field.iter().map(|(_, id)| *id).collect();
    for r in 0..rows {
        for (g, (start_len, _)) in per_field.iter().enumerate() {
            let n = lens[start_len + r] as usize;
            keys.extend_from_slice(&ids[next[g]..next[g] + n]);
            next[g] += n;
            let end = u32::try_from(keys.len() - first).map_err(|_| fail(format!("row group {rg}"), format!("more than {} list ids in one row group", u32::MAX)))?;
            ends.push(end);
        }
    }
    Ok(())
}

/// The bags of the list columns `names` of the Parquet file `path`, every row group in
/// order, keys salted after `fields`' single-hot fields. An error names the file, the row
/// group and the column.
pub fn read_bags(path: &Path, names: &[String], fields: Fields) -> DataResult<Bags> {
    let file = crate::fileio::open_input(path).map_err(|e| DataError::io(path, "open", e))?;
    let reader = SerializedFileReader::new(file).map_err(|e| DataError::Parquet { path: path.to_path_buf(), at: "footer".into(), detail: format!("{e} (a file cut short, or not Parquet)") })?;
    let columns = list_columns(path, reader.metadata().file_metadata().schema_descr(), names)?;
    let mut bags = Bags { fields: names.len(), offsets: vec![0], ..Default::default() };
    let mut counts = vec![(0u64, 0u64); names.len()];
    let mut ends = Vec::new();
    for rg in 0..reader.num_row_groups() {
        let rows = usize::try_from(reader.metadata().row_group(rg).num_rows()).map_err(|_| DataError::Parquet { path: path.to_path_buf(), at: format!("row group {rg}"), detail: "a negative row count".into() })?;
        let base = bags.keys.len();
        ends.clear();
        read_group_bags(path, &reader, (rg, rows), &columns, names, fields, &mut ends, &mut bags.keys, &mut counts)?;
        for &e in &ends {
            let end = u32::try_from(base + e as usize).map_err(|_| DataError::Parquet { path: path.to_path_buf(), at: format!("row group {rg}"), detail: format!("more than {} list ids in one file", u32::MAX) })?;
            bags.offsets.push(end);
        }
    }
    (bags.empty, bags.null_elements) = counts.iter().fold((0, 0), |(e, n), c| (e + c.0, n + c.1));
    Ok(bags)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::multihot::{synth_multi_hot, LIST_FIELDS};
    use crate::data::criteo::EMPTY_KEY;

    #[test]
    fn the_synth_sets_lists_read_back_as_bags() {
        let dir = std::env::temp_dir().join(format!("ringrec-lists-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m.parquet");
        let s = synth_multi_hot(&path, 40_000, 7).unwrap();
        let names: Vec<String> = (0..LIST_FIELDS).map(|g| format!("l{g}")).collect();
        let bags = read_bags(&path, &names, Fields::CRITEO).unwrap();
        assert_eq!(bags.rows(), 40_000, "two row groups read in order");
        assert_eq!(bags.keys.len() as u64, s.list_ids);
        assert!(bags.empty > 0 && bags.empty == bags.offsets.windows(2).filter(|w| w[0] == w[1]).count() as u64);
        assert_eq!(bags.null_elements, 0);
        assert!(bags.keys.iter().all(|k| *k != EMPTY_KEY));
        // Two fields, in the other order: the same lists, swapped in each row (salted by
        // their place in the order named).
        let two = read_bags(&path, &["l1".to_string(), "l0".to_string()], Fields::CRITEO).unwrap();
        fn bag(b: &Bags, i: usize) -> &[u64] {
            &b.keys[b.offsets[i] as usize..b.offsets[i + 1] as usize]
        }
        let (k0, k1) = (bag(&bags, 3 * LIST_FIELDS), bag(&bags, 3 * LIST_FIELDS + 1));
        assert_eq!(bag(&two, 3 * 2 + 1).len(), k0.len());
        assert_eq!(bag(&two, 3 * 2).len(), k1.len());
        let e = read_bags(&path, &["c0".to_string()], Fields::CRITEO).unwrap_err().to_string();
        assert!(e.contains("`c0`") && e.contains("no such list column"), "{e}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn list_keys_are_salted_by_field() {
        assert_ne!(list_key(0, 5), list_key(1, 5));
        assert_ne!(list_key(0, 5), crate::data::criteo::category_key(0, 5));
    }
}
