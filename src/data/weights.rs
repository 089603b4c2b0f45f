//! Per-sample weights of training rows (design 002): time decay by the day of a row's
//! file, merging of identical rows, and dropping rows that weigh too little.
//!
//! **Days.** Every training file carries a day: by default its position in the `--data`
//! list after directories and globs are expanded (the i-th file is day i), or
//! `--day-of FILE=N`. The newest day is the largest; a row's age is `newest - day`.
//!
//! **Weight.** `w = base^(-age) * c`: `base` is `--decay-base` (`e`, `2` or a number
//! above 1; without it every age weighs 1) and `c` the sum of the column weights of the
//! rows merged into this one (`--merge-duplicates`; the row's own otherwise). The column
//! weight is the row's `--weight-column` field (a finite number >= 0, read when the TSV
//! is prepared: [`crate::data::criteo::parse_weighted_line`]), 1 without the flag: `c` is
//! then the count of merged rows.
//!
//! **Merging** (`--merge-duplicates`): rows of one file (one day: the time bucket) with
//! the same label, the same 13 dense values (bit for bit), the same 26 keys and the same
//! ids in every multi-hot field become one row, the first in file order, whose column weight is the sum of theirs (their
//! column weights are not compared). It depends on the file alone, so every rank
//! computes the same kept rows without communication.
//!
//! **Dropping**: after merging, rows whose weight is below `--min-sample-weight`
//! (default 0.001 with `--decay-base`, else 0) are left out. So for every file,
//! `kept + merged + dropped` = its rows. A row of weight 0 is therefore *kept* by default
//! (0 is not below 0): it trains with no effect on the gradient (a global batch of weight 0
//! changes no parameter: [`crate::train::weights::loss_scale`]); `--min-sample-weight` with
//! any value above 0 drops such rows and counts them.
//!
//! Everything is a function of the data and the flags: every rank knows the weight of
//! every row of a global batch, so the global weight sum of a step needs no collective.
//!
//! Held-out rows (`--eval-data` files, or the test split of a single file) are read with
//! the same `--weight-column` layout, but evaluation ignores weights: its AUC and log loss
//! are unweighted, as without the column.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::cache::Dataset;
use super::{DataError, DataResult};
use crate::hash::splitmix64;
use crate::settings::{Scope, ServiceRole};

/// `--decay-unit`: what one unit of age is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DecayUnit {
    /// One day: one step of a file's day number.
    #[default]
    Day,
}

impl std::str::FromStr for DecayUnit {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "day" | "days" => Ok(DecayUnit::Day),
            _ => Err(format!("`{s}` is not a decay unit; the only unit is `day` (a file's day from --day-of or its position in --data)")),
        }
    }
}

impl std::fmt::Display for DecayUnit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("day")
    }
}

/// Parses `--decay-base`: `e`, `2`, or a number above 1.
pub fn parse_decay_base(s: &str) -> Result<f64, String> {
    let v = match s {
        "e" => std::f64::consts::E,
        _ => s.parse::<f64>().map_err(|_| format!("`{s}` is not a decay base; give e, 2 or a number above 1 (a sample of age a weighs base^-a)"))?,
    };
    if !(v.is_finite() && v > 1.0) {
        return Err(format!("--decay-base must be above 1 (e, 2 or x > 1), got {s}: a base of 1 or less would not decay"));
    }
    Ok(v)
}

/// Parses one `--day-of FILE=N`.
pub fn parse_day_of(s: &str) -> Result<(PathBuf, i64), String> {
    let (file, day) = s.rsplit_once('=').ok_or_else(|| format!("`{s}`: give --day-of FILE=N (a --data file and its day number)"))?;
    let day = day.trim().parse::<i64>().map_err(|_| format!("`{s}`: the day after `=` must be an integer (e.g. --day-of day_7.tsv=7)"))?;
    if file.is_empty() {
        return Err(format!("`{s}`: the file before `=` is empty; give --day-of FILE=N"));
    }
    Ok((PathBuf::from(file), day))
}

impl crate::settings::Word for DecayUnit {
    fn parse_word(s: &str) -> Result<DecayUnit, String> {
        s.trim().parse()
    }
    fn word(&self) -> String {
        self.to_string()
    }
}

crate::settings::word_settings!(DecayUnit);

impl crate::settings::Word for (PathBuf, i64) {
    fn parse_word(s: &str) -> Result<(PathBuf, i64), String> {
        parse_day_of(s)
    }
    fn word(&self) -> String {
        format!("{}={}", self.0.display(), self.1)
    }
}

crate::settings::list_settings!((PathBuf, i64) => crate::settings::Arity::Repeated);

/// `--weight-column`: a TSV's field number (1 to 41) or a Parquet file's column name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WeightColumn {
    /// Field N (1-based) of a line of 41 fields.
    Field(u32),
    /// A Parquet file's column.
    Name(String),
}

impl WeightColumn {
    /// The TSV field, when it is one.
    pub fn field(&self) -> Option<u32> {
        match self {
            WeightColumn::Field(n) => Some(*n),
            WeightColumn::Name(_) => None,
        }
    }

    /// The Parquet column's name, when it is one.
    pub fn name(&self) -> Option<&str> {
        match self {
            WeightColumn::Name(n) => Some(n),
            WeightColumn::Field(_) => None,
        }
    }
}

impl std::fmt::Display for WeightColumn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WeightColumn::Field(n) => write!(f, "{n}"),
            WeightColumn::Name(name) => f.write_str(name),
        }
    }
}

/// As a summary shows it: the field as a number, the column as a string.
impl serde::Serialize for WeightColumn {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            WeightColumn::Field(n) => s.serialize_u32(*n),
            WeightColumn::Name(name) => s.serialize_str(name),
        }
    }
}

impl crate::settings::Word for WeightColumn {
    fn parse_word(s: &str) -> Result<WeightColumn, String> {
        let s = s.trim();
        if s.is_empty() {
            return Err("give a TSV's field number (1 to 41) or a Parquet file's column name".into());
        }
        match s.parse::<u32>() {
            Ok(n) => Ok(WeightColumn::Field(n)),
            Err(_) if s.bytes().all(|b| b.is_ascii_digit() || b == b'-' || b == b'+') => Err(format!("`{s}` is not a field number (1 to 41)")),
            Err(_) => Ok(WeightColumn::Name(s.to_string())),
        }
    }
    fn word(&self) -> String {
        self.to_string()
    }
}

crate::settings::word_settings!(WeightColumn);

fn parse_decay(values: &[&str]) -> Result<Option<f64>, String> {
    parse_decay_base(crate::settings::one(values)?).map(Some)
}

crate::settings::settings! {
    /// How the training rows are weighted (the `--decay-*`, `--day-of`,
    /// `--min-sample-weight`, `--merge-duplicates` and `--weight-column` flags). The default
    /// weighs every row 1 and keeps every row.
    #[derive(Clone, Debug, PartialEq)]
    pub struct WeightConfig {
        /// Time decay: a sample of age a (days before the newest --data file's day) weighs
        /// BASE^-a: e, 2, or a number above 1. Default: every sample weighs 1.
        #[setting(flag = "--decay-base", scope = Scope::Resumed, service = ServiceRole::Args, value_name = "BASE", parse = parse_decay)]
        pub decay_base: Option<f64> = None,
        /// The unit of age for --decay-base: day (a file's day: its position in --data, or
        /// --day-of).
        #[setting(flag = "--decay-unit", scope = Scope::Resumed, service = ServiceRole::Args, value_name = "UNIT")]
        pub decay_unit: DecayUnit = DecayUnit::Day,
        /// The day of a --data file, FILE=N (repeatable); files not named are day = their
        /// position in --data (0, 1, ...). The newest day is the largest.
        #[setting(flag = "--day-of", scope = Scope::Resumed, service = ServiceRole::Args, value_name = "FILE=N")]
        pub day_of: Vec<(PathBuf, i64)> = Vec::new(),
        /// Samples weighing less than W are left out and counted
        /// (`samples_dropped_by_weight`) [default: 0.001 with --decay-base, else 0].
        #[setting(flag = "--min-sample-weight", scope = Scope::Resumed, service = ServiceRole::Args, value_name = "W")]
        pub min_sample_weight: Option<f64> = None,
        /// Identical samples (same label, dense values and keys) of one --data file become
        /// one sample whose weight is multiplied by their count (the first kept, in file
        /// order; `samples_merged` counts the rows merged away).
        #[setting(flag = "--merge-duplicates", scope = Scope::Resumed, service = ServiceRole::Args)]
        pub merge_duplicates: bool = false,
        /// The --data and --eval-data lines have 41 tab-separated fields: field N (1-based,
        /// like `cut -f`; e.g. 41 last, 2 right after the label) is the sample's weight, a
        /// finite number >= 0, and the other 40 are Criteo's in order; or, for Parquet
        /// inputs, NAME is the weight column (a number >= 0, never null). A training row
        /// weighs its weight times its decay weight; merged rows add their weights. A bad
        /// weight makes the line malformed (counted, --max-bad-lines). Evaluation stays
        /// unweighted.
        #[setting(flag = "--weight-column", scope = Scope::Resumed, service = ServiceRole::Args, value_name = "N|NAME")]
        pub weight_column: Option<WeightColumn> = None,
    }
}

impl Default for WeightConfig {
    fn default() -> WeightConfig {
        WeightConfig::defaults()
    }
}

/// `--min-sample-weight` when decay is on and it is not given (seed 002).
pub const DEFAULT_MIN_WEIGHT_WITH_DECAY: f64 = 0.001;

impl WeightConfig {
    /// Whether any row may weigh other than 1 or be left out: the run then stages
    /// weights and uses the weighted loss. False: today's unweighted run, bit for bit
    /// (also with a `--min-sample-weight` of at most 1 alone: every row weighs 1 and stays).
    pub fn active(&self) -> bool {
        self.decay_base.is_some() || self.merge_duplicates || self.weight_column.is_some()
    }

    /// The weight below which a row is dropped.
    pub fn min_weight(&self) -> f64 {
        self.min_sample_weight.unwrap_or(if self.decay_base.is_some() { DEFAULT_MIN_WEIGHT_WITH_DECAY } else { 0.0 })
    }

    /// Refuses values no run can use, naming the flag.
    pub fn validate(&self) -> DataResult<()> {
        if let Some(c) = self.weight_column.as_ref().and_then(WeightColumn::field) {
            super::criteo::check_weight_column(c).map_err(DataError::InvalidArgument)?;
        }
        if let Some(b) = self.decay_base {
            if !(b.is_finite() && b > 1.0) {
                return Err(DataError::InvalidArgument(format!("--decay-base must be above 1, got {b}")));
            }
        }
        if let Some(m) = self.min_sample_weight {
            if !(m.is_finite() && m >= 0.0) {
                return Err(DataError::InvalidArgument(format!("--min-sample-weight must be a number >= 0, got {m}")));
            }
            if m > 1.0 && !self.active() {
                return Err(DataError::InvalidArgument(format!(
                    "--min-sample-weight {m} would leave out every sample: without --decay-base or --merge-duplicates every sample weighs 1 (unless --weight-column gives the weights)"
                )));
            }
        }
        if !self.day_of.is_empty() && self.decay_base.is_none() {
            return Err(DataError::InvalidArgument("--day-of gives the days that --decay-base ages samples by; add --decay-base (e, 2 or x > 1) or drop --day-of".into()));
        }
        Ok(())
    }

    /// The day of each training file (`files` as resolved, in order): its position, or
    /// its `--day-of`. A `--day-of` that names no training file is an error.
    pub fn days(&self, files: &[PathBuf]) -> DataResult<Vec<i64>> {
        let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        let names: Vec<PathBuf> = files.iter().map(|p| canon(p)).collect();
        let mut days: Vec<i64> = (0..files.len() as i64).collect();
        for (file, day) in &self.day_of {
            let c = canon(file);
            let hits: Vec<usize> = names.iter().enumerate().filter(|(_, n)| **n == c).map(|(i, _)| i).collect();
            if hits.is_empty() {
                return Err(DataError::InvalidArgument(format!("--day-of {}={day}: {} is not one of the --data files; name a training file as --data resolves it", file.display(), file.display())));
            }
            for i in hits {
                days[i] = *day;
            }
        }
        Ok(days)
    }

    /// The decay weight of each file of `days`: `base^-(newest - day)` (1 without decay).
    pub fn day_weights(&self, days: &[i64]) -> Vec<f64> {
        let newest = days.iter().copied().max().unwrap_or(0);
        days.iter().map(|d| self.decay_base.map_or(1.0, |b| b.powf(-((newest - d) as f64)))).collect()
    }
}

/// The rows of one file that train, with their weights.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FileWeights {
    /// Rows of the file kept (ascending: first occurrences in file order).
    pub kept: Vec<u32>,
    /// The weight of each kept row (`day weight * the merged rows' column weights`).
    pub weights: Vec<f32>,
    /// Rows that were merged into an earlier identical row.
    pub merged: u64,
    /// Rows (after merging) left out for weighing less than the minimum.
    pub dropped: u64,
}

/// A row's identity for merging: a hash of its label, dense bits and keys.
fn row_hash(ds: &Dataset, i: usize) -> u64 {
    let mut h = splitmix64(ds.label(i).to_bits() as u64);
    for d in ds.dense(i) {
        h = splitmix64(h ^ d.to_bits() as u64);
    }
    for k in ds.keys(i) {
        h = splitmix64(h ^ k);
    }
    // A multi-hot row's bags too (nothing for a cache without lists: the hash as before).
    for g in 0..ds.list_fields() {
        let bag = ds.bag(i, g);
        h = splitmix64(h ^ bag.len() as u64);
        for k in bag {
            h = splitmix64(h ^ k);
        }
    }
    h
}

/// Whether rows `a` and `b` are identical (label, dense bits, keys, and the ids of every
/// multi-hot field in order).
fn same_row(ds: &Dataset, a: usize, b: usize) -> bool {
    ds.label(a).to_bits() == ds.label(b).to_bits()
        && ds.dense(a).iter().zip(ds.dense(b)).all(|(x, y)| x.to_bits() == y.to_bits())
        && ds.keys(a) == ds.keys(b)
        && (0..ds.list_fields()).all(|g| ds.bag(a, g) == ds.bag(b, g))
}

/// Weighs rows `0..rows` of `ds`, each of decay weight `day_weight` and of its column
/// weight in `ds` (1 when the cache has none): merges identical rows when `merge` (the
/// first kept, the column weights of the rows merged into it added), then drops rows
/// weighing less than `min_weight`.
pub fn weigh_file(ds: &Dataset, rows: usize, day_weight: f64, merge: bool, min_weight: f64) -> FileWeights {
    let column = ds.weights();
    let weight = |i: usize| column.map_or(1.0, |w| w[i] as f64);
    let mut kept: Vec<u32> = Vec::with_capacity(rows);
    // The column weights of each kept row's group (without a column: its count, exactly).
    let mut sums: Vec<f64> = Vec::with_capacity(rows);
    if merge {
        // hash -> kept positions with that hash (collisions compared row by row).
        let mut seen: HashMap<u64, Vec<u32>> = HashMap::with_capacity(rows);
        for i in 0..rows {
            let slot = seen.entry(row_hash(ds, i)).or_default();
            match slot.iter().find(|&&k| same_row(ds, kept[k as usize] as usize, i)) {
                Some(&k) => sums[k as usize] += weight(i),
                None => {
                    slot.push(kept.len() as u32);
                    kept.push(i as u32);
                    sums.push(weight(i));
                }
            }
        }
    } else {
        kept.extend(0..rows as u32);
        sums.extend((0..rows).map(weight));
    }
    let merged = (rows - kept.len()) as u64;
    let mut out = FileWeights { merged, ..FileWeights::default() };
    for (row, sum) in kept.into_iter().zip(sums) {
        let w = day_weight * sum;
        if w < min_weight {
            out.dropped += 1;
        } else {
            out.kept.push(row);
            out.weights.push(w as f32);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decay_bases_and_units_parse_or_say_what_to_give() {
        assert_eq!(parse_decay_base("e").unwrap(), std::f64::consts::E);
        assert_eq!(parse_decay_base("2").unwrap(), 2.0);
        assert_eq!(parse_decay_base("1.5").unwrap(), 1.5);
        assert!(parse_decay_base("1").unwrap_err().contains("above 1"));
        assert!(parse_decay_base("0.5").unwrap_err().contains("above 1"));
        assert!(parse_decay_base("x").unwrap_err().contains("e, 2"));
        assert_eq!("day".parse::<DecayUnit>().unwrap(), DecayUnit::Day);
        assert!("hour".parse::<DecayUnit>().unwrap_err().contains("only unit is `day`"));
        assert_eq!(parse_day_of("a/b.tsv=7").unwrap(), (PathBuf::from("a/b.tsv"), 7));
        assert!(parse_day_of("a.tsv").unwrap_err().contains("FILE=N"));
        assert!(parse_day_of("a.tsv=x").unwrap_err().contains("integer"));
    }

    #[test]
    fn days_follow_the_order_or_day_of_and_weights_decay_from_the_newest() {
        let files: Vec<PathBuf> = ["/nonexistent/d0", "/nonexistent/d1", "/nonexistent/d2"].iter().map(PathBuf::from).collect();
        let mut c = WeightConfig { decay_base: Some(2.0), ..WeightConfig::default() };
        assert_eq!(c.days(&files).unwrap(), vec![0, 1, 2]);
        assert_eq!(c.day_weights(&[0, 1, 2]), vec![0.25, 0.5, 1.0]);
        c.day_of = vec![(PathBuf::from("/nonexistent/d0"), 5)];
        assert_eq!(c.days(&files).unwrap(), vec![5, 1, 2]);
        assert_eq!(c.day_weights(&[5, 1, 2]), vec![1.0, 1.0 / 16.0, 1.0 / 8.0]);
        c.day_of = vec![(PathBuf::from("/nonexistent/other"), 1)];
        assert!(c.days(&files).unwrap_err().to_string().contains("not one of the --data files"));
        assert_eq!(WeightConfig::default().day_weights(&[0, 9]), vec![1.0, 1.0]);
        assert_eq!(c.min_weight(), 0.001);
        assert_eq!(WeightConfig::default().min_weight(), 0.0);
        assert!(!WeightConfig::default().active());
        assert!(WeightConfig { merge_duplicates: true, ..WeightConfig::default() }.active());
        // A minimum alone weighs nothing: the unweighted run, or an error past 1.
        assert!(!WeightConfig { min_sample_weight: Some(0.5), ..WeightConfig::default() }.active());
        assert!(WeightConfig { min_sample_weight: Some(2.0), ..WeightConfig::default() }.validate().unwrap_err().to_string().contains("every sample weighs 1"));
        assert!(WeightConfig { day_of: vec![(PathBuf::from("x"), 1)], ..WeightConfig::default() }.validate().is_err());
    }
}
