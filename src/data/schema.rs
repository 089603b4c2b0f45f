//! Which columns of a Parquet input are the model's inputs, as the user names them: the
//! `--label-column`, `--dense-columns`, `--sparse-columns` and `--weight-column NAME` flags,
//! or a schema file (`--schema FILE.toml`). The two are exclusive: a run that gives the file
//! gives none of those flags. [`ColumnSpec`] is what either says; the Parquet reader
//! ([`super::parquet_file::Schema::infer`]) maps it onto a file's columns.
//!
//! # The schema file
//!
//! ```toml
//! label = "click"            # the label column [default: label]
//! weight = "w"               # a per-sample weight column (optional)
//! sparse = ["user", "item"]  # categorical columns: one id a row (strings or integers)
//! multi_hot = ["history"]    # list columns of integer or string ids: multi-hot fields (pooled)
//!
//! [dense]                    # dense columns, each with its transform
//! count = "log"              # ln(1 + max(x, 0)), as Criteo's integers
//! price = "none"             # as it is
//! age = {}                   # the flags' default: log for integers and booleans, none for floats
//! ```
//!
//! `dense` may also be an array of names (each with the flags' default). Without `dense` and
//! `sparse`, the features are inferred by type as without flags. A key ringrec does not
//! know, a value of the wrong type, a column named twice or (when the file is read) a column
//! the input lacks is an error naming the schema file, the key and the column.

use std::path::{Path, PathBuf};

use super::error::{DataError, DataResult};

/// What a dense column's values become.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transform {
    /// `ln(1 + max(x, 0))`, Criteo's transform of its integer features.
    Log,
    /// The value as it is (rounded to binary32).
    None,
}

impl Transform {
    /// Its name in a schema file.
    pub fn name(self) -> &'static str {
        match self {
            Transform::Log => "log",
            Transform::None => "none",
        }
    }

    /// The transform [`Transform::name`] names, if any.
    pub fn from_name(name: &str) -> Option<Transform> {
        [Transform::Log, Transform::None].into_iter().find(|t| t.name() == name)
    }
}

/// The columns of a Parquet input the user names (see the module docs). The default names
/// none: the label is `label` and the features are inferred by type.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ColumnSpec {
    /// The label column (`None`: `label`).
    pub label: Option<String>,
    /// The per-sample weight column, if any.
    pub weight: Option<String>,
    /// The dense feature columns (with `sparse`: the only feature columns read).
    pub dense: Vec<String>,
    /// The categorical columns, one id a row.
    pub sparse: Vec<String>,
    /// List columns named as multi-hot fields (lists of integer or string ids, pooled by the model).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub multi_hot: Vec<String>,
    /// Dense columns given a transform explicitly (by the schema file), in name order; the
    /// others take the default (log for integers and booleans, none for floats).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub transforms: Vec<(String, Transform)>,
    /// The schema file it was read from (`None`: the flags).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
}

/// The keys a schema file may have.
const KEYS: [&str; 5] = ["label", "weight", "dense", "sparse", "multi_hot"];

impl ColumnSpec {
    /// The spec of the column flags (empty lists and `None`: not given).
    pub fn from_flags(label: Option<String>, dense: Vec<String>, sparse: Vec<String>, weight: Option<String>) -> ColumnSpec {
        ColumnSpec { label, weight, dense, sparse, ..ColumnSpec::default() }
    }

    /// The spec of the schema file `schema` when given, else of the flags; refuses both at
    /// once (naming the flags given).
    pub fn resolve(schema: Option<&Path>, flags: ColumnSpec) -> DataResult<ColumnSpec> {
        let Some(path) = schema else { return Ok(flags) };
        let given: Vec<&str> = [
            ("--label-column", flags.label.is_some()),
            ("--dense-columns", !flags.dense.is_empty()),
            ("--sparse-columns", !flags.sparse.is_empty()),
            ("--weight-column NAME", flags.weight.is_some()),
        ]
        .into_iter()
        .filter_map(|(f, given)| given.then_some(f))
        .collect();
        if !given.is_empty() {
            return Err(DataError::InvalidArgument(format!(
                "--schema {} and {} both name a Parquet input's columns: give the columns in one place (the schema file, or the flags)",
                path.display(),
                given.join(", ")
            )));
        }
        ColumnSpec::load(path)
    }

    /// Reads the schema file `path`.
    pub fn load(path: &Path) -> DataResult<ColumnSpec> {
        let text = std::fs::read_to_string(path).map_err(|e| DataError::io(path, "read the schema file", e))?;
        ColumnSpec::parse(path, &text)
    }

    /// Parses the text of the schema file `path`.
    pub fn parse(path: &Path, text: &str) -> DataResult<ColumnSpec> {
        let bad = |key: &str, detail: String| DataError::Schema { path: path.to_path_buf(), key: key.to_string(), detail };
        // The parser's message and the line, not the line's text (which may be anything).
        let syntax = |e: toml::de::Error| {
            let line = e.span().map_or(String::new(), |s| format!(" (line {})", 1 + text.as_bytes()[..s.start.min(text.len())].iter().filter(|&&b| b == b'\n').count()));
            bad("(syntax)", format!("not TOML: {}{line}", e.message().trim_end()))
        };
        let table: toml::Table = text.parse().map_err(syntax)?;
        let mut spec = ColumnSpec { file: Some(path.to_path_buf()), ..ColumnSpec::default() };
        for (key, value) in &table {
            match key.as_str() {
                "label" => spec.label = Some(name_of(value).map_err(|d| bad(key, d))?),
                "weight" => spec.weight = Some(name_of(value).map_err(|d| bad(key, d))?),
                "sparse" => spec.sparse = names_of(value).map_err(|(k, d)| bad(&format!("{key}{k}"), d))?,
                "multi_hot" => spec.multi_hot = names_of(value).map_err(|(k, d)| bad(&format!("{key}{k}"), d))?,
                "dense" => spec.dense_of(value).map_err(|(k, d)| bad(&format!("dense{k}"), d))?,
                _ => return Err(bad(key, format!("not a key of a schema file (they are {})", KEYS.join(", ")))),
            }
        }
        spec.check_distinct().map_err(|(k, d)| bad(&k, d))?;
        Ok(spec)
    }

    /// Reads `dense`: an array of names, or a table of name = transform.
    fn dense_of(&mut self, value: &toml::Value) -> Result<(), (String, String)> {
        let Some(table) = value.as_table() else {
            self.dense = names_of(value)?;
            return Ok(());
        };
        for (name, t) in table {
            let at = || format!(".{name}");
            let transform = match t {
                toml::Value::String(s) => Some(s.as_str()),
                toml::Value::Table(inner) => {
                    if let Some(k) = inner.keys().find(|k| k.as_str() != "transform") {
                        return Err((format!("{}.{k}", at()), "not a key of a dense column (it has only `transform`)".into()));
                    }
                    match inner.get("transform") {
                        None => None,
                        Some(toml::Value::String(s)) => Some(s.as_str()),
                        Some(v) => return Err((format!("{}.transform", at()), format!("of type {}, not a string (\"log\" or \"none\")", v.type_str()))),
                    }
                }
                v => return Err((at(), format!("of type {}, not a transform (\"log\", \"none\", or {{ transform = ... }})", v.type_str()))),
            };
            if let Some(t) = transform {
                let t = Transform::from_name(t).ok_or_else(|| (at(), format!("transform \"{t}\" is not one of \"log\" (ln(1 + max(x, 0))) and \"none\"")))?;
                self.transforms.push((name.clone(), t));
            }
            self.dense.push(name.clone());
        }
        self.transforms.sort();
        Ok(())
    }

    /// Refuses a column named twice (the label, the weight and the features are distinct).
    fn check_distinct(&self) -> Result<(), (String, String)> {
        let mut seen: Vec<(&str, &str)> = Vec::new();
        let label = [self.label.clone().unwrap_or_else(|| "label".into())];
        for (key, names) in [("label", label.as_slice()), ("weight", self.weight.as_slice()), ("dense", &self.dense), ("sparse", &self.sparse), ("multi_hot", &self.multi_hot)] {
            for name in names {
                if let Some((other, _)) = seen.iter().find(|(_, n)| *n == name.as_str()) {
                    return Err((key.to_string(), format!("column `{name}` is named by `{other}` too: a column is one input")));
                }
                seen.push((key, name));
            }
        }
        Ok(())
    }

    /// Whether any feature column is named (the others are then not read).
    pub fn names_features(&self) -> bool {
        !self.dense.is_empty() || !self.sparse.is_empty() || !self.multi_hot.is_empty()
    }

    /// Whether it names nothing (the label `label`, features inferred, no weight).
    pub fn is_default(&self) -> bool {
        self.label.is_none() && self.weight.is_none() && !self.names_features() && self.transforms.is_empty()
    }

    /// The explicit transform of dense column `name`, if any.
    pub fn transform(&self, name: &str) -> Option<Transform> {
        self.transforms.iter().find(|(n, _)| n == name).map(|&(_, t)| t)
    }

    /// Where a key of the spec comes from, for errors: the flag, or the schema file's key.
    pub fn origin(&self, key: &str) -> String {
        match &self.file {
            Some(f) => format!("key `{key}` of {}", f.display()),
            None => match key {
                "label" => "--label-column".into(),
                "weight" => "--weight-column".into(),
                "dense" => "--dense-columns".into(),
                "sparse" => "--sparse-columns".into(),
                other => format!("`{other}`"),
            },
        }
    }

    /// The bytes a cache's name covers: those of the flags as before the schema file (the
    /// label, dense and sparse names, each tagged), then the weight and the explicit
    /// transforms when there are any. A spec from a file and the same flags cover the same
    /// bytes.
    pub fn cache_id(&self) -> Vec<u8> {
        let mut id = Vec::new();
        let mut put = |tag: u8, name: &str| {
            id.push(tag);
            id.extend_from_slice(name.as_bytes());
            id.push(0);
        };
        for (tag, names) in [(b'l', self.label.as_slice()), (b'd', &self.dense), (b's', &self.sparse), (b'w', self.weight.as_slice()), (b'm', &self.multi_hot)] {
            for name in names {
                put(tag, name);
            }
        }
        for (name, t) in &self.transforms {
            put(if *t == Transform::Log { b'L' } else { b'N' }, name);
        }
        id
    }

    /// The columns in words, as the flags say them (the ranks and a checkpoint compare
    /// them); `None` when the spec is the default. The weight is left to the weight
    /// settings (`--weight-column`); the transforms follow when explicit. A schema file and
    /// the same flags read the same.
    pub fn describe(&self) -> Option<String> {
        if self.label.is_none() && !self.names_features() && self.transforms.is_empty() {
            return None;
        }
        let mut s = format!("--label-column {} --dense-columns {} --sparse-columns {}", self.label.as_deref().unwrap_or("label"), self.dense.join(","), self.sparse.join(","));
        if !self.multi_hot.is_empty() {
            s += &format!(" multi_hot {}", self.multi_hot.join(","));
        }
        if !self.transforms.is_empty() {
            let t: Vec<String> = self.transforms.iter().map(|(n, t)| format!("{n}={}", t.name())).collect();
            s += &format!(" transforms {}", t.join(","));
        }
        Some(s)
    }
}

impl ColumnSpec {
    /// The spec [`ColumnSpec::describe`] said (a checkpoint's `Parquet columns`); `None` for
    /// words it does not write.
    pub fn from_description(words: &str) -> Option<ColumnSpec> {
        let list = |s: &str| s.split(',').filter(|n| !n.is_empty()).map(str::to_string).collect::<Vec<_>>();
        let mut it = words.split(' ');
        let mut spec = ColumnSpec::default();
        while let Some(key) = it.next() {
            let value = it.next()?;
            match key {
                "--label-column" => spec.label = Some(value.to_string()),
                "--dense-columns" => spec.dense = list(value),
                "--sparse-columns" => spec.sparse = list(value),
                "multi_hot" => spec.multi_hot = list(value),
                "transforms" => {
                    for pair in list(value) {
                        let (name, t) = pair.rsplit_once('=')?;
                        spec.transforms.push((name.to_string(), Transform::from_name(t)?));
                    }
                }
                _ => return None,
            }
        }
        Some(spec)
    }

    /// The spec with its dense columns in the order `slots` gives them (a Parquet file's
    /// dense slots, [`super::parquet_file::Schema::dense_names`]), so that dense feature `j`
    /// is `dense[j]` with its transform; itself when `slots` are not its dense columns.
    pub fn in_slot_order(&self, slots: &[String]) -> ColumnSpec {
        let (mut a, mut b) = (self.dense.clone(), slots.to_vec());
        a.sort();
        b.sort();
        match a == b {
            true => ColumnSpec { dense: slots.to_vec(), ..self.clone() },
            false => self.clone(),
        }
    }

    /// Whether two descriptions ([`ColumnSpec::describe`]) name the same columns in the same
    /// roles, whatever the order of their dense columns (a checkpoint records them in the
    /// file's order since the slots are read by it, [`ColumnSpec::in_slot_order`]).
    pub fn same_description(a: &str, b: &str) -> bool {
        match (ColumnSpec::from_description(a), ColumnSpec::from_description(b)) {
            (Some(a), Some(b)) => a.first_difference(&b).is_none() && a.in_slot_order(&b.dense) == b,
            _ => a == b,
        }
    }

    /// Where the columns two descriptions ([`ColumnSpec::describe`]: a checkpoint's, a
    /// run's) name differ, in words (` (column `x`: sparse there, dense here)`); empty when
    /// either is not a description or they name the same.
    pub fn described_difference(there: &str, here: &str) -> String {
        match (ColumnSpec::from_description(there), ColumnSpec::from_description(here)) {
            (Some(a), Some(b)) => a.first_difference(&b).map_or(String::new(), |(c, a, b)| format!(" (column `{c}`: {a} there, {b} here)")),
            _ => String::new(),
        }
    }

    /// The first column whose role differs between `self` and `other` (a checkpoint's
    /// columns and a run's), with what it is in each; `None` when they read the same.
    pub fn first_difference(&self, other: &ColumnSpec) -> Option<(String, String, String)> {
        let role = |s: &ColumnSpec, name: &str| -> String {
            if s.label.as_deref().unwrap_or("label") == name {
                "the label".into()
            } else if s.dense.iter().any(|n| n == name) {
                s.transform(name).map_or("dense".to_string(), |t| format!("dense, transform {}", t.name()))
            } else if s.sparse.iter().any(|n| n == name) {
                "sparse".into()
            } else if s.multi_hot.iter().any(|n| n == name) {
                "multi-hot".into()
            } else if s.names_features() {
                "not read".into()
            } else {
                "inferred by type".into()
            }
        };
        let label = |s: &ColumnSpec| s.label.clone().unwrap_or_else(|| "label".into());
        let names = [label(self), label(other)].into_iter().chain(self.dense.iter().chain(&self.sparse).chain(&self.multi_hot).chain(other.dense.iter().chain(&other.sparse).chain(&other.multi_hot)).cloned());
        names.map(|n| (role(self, &n), role(other, &n), n)).find(|(a, b, _)| a != b).map(|(a, b, n)| (n, a, b))
    }
}

/// A column name: a non-empty string.
fn name_of(value: &toml::Value) -> Result<String, String> {
    match value {
        toml::Value::String(s) if !s.is_empty() => Ok(s.clone()),
        toml::Value::String(_) => Err("an empty column name".into()),
        v => Err(format!("of type {}, not a column name (a string)", v.type_str())),
    }
}

/// An array of column names; the error names the bad element (`[i]`).
fn names_of(value: &toml::Value) -> Result<Vec<String>, (String, String)> {
    let Some(items) = value.as_array() else {
        return Err((String::new(), format!("of type {}, not an array of column names", value.type_str())));
    };
    items.iter().enumerate().map(|(i, v)| name_of(v).map_err(|d| (format!("[{i}]"), d))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> DataResult<ColumnSpec> {
        ColumnSpec::parse(Path::new("s.toml"), text)
    }

    #[test]
    fn the_dense_columns_in_their_slots_order_describe_the_same_columns() {
        let t = parse("sparse = [\"item\"]\n[dense]\nprice = \"log\"\ncount = \"none\"\nage = {}\n").unwrap();
        assert_eq!(t.dense, ["age", "count", "price"], "a TOML table's keys in name order");
        let slots = ["price".to_string(), "count".into(), "age".into()];
        let s = t.in_slot_order(&slots);
        assert_eq!((s.dense.as_slice(), &s.transforms), (&slots[..], &t.transforms));
        assert_eq!(t.in_slot_order(&slots[..2]), t, "not its dense columns: as it is");
        let (a, b) = (t.describe().unwrap(), s.describe().unwrap());
        assert!(a != b && ColumnSpec::same_description(&a, &b) && ColumnSpec::same_description(&b, &a));
        let other = ColumnSpec { transforms: vec![("price".into(), Transform::None)], ..s.clone() }.describe().unwrap();
        assert!(!ColumnSpec::same_description(&a, &other), "another transform is another model");
        assert!(!ColumnSpec::same_description(&a, "--label-column label --dense-columns price,count --sparse-columns item"));
    }

    #[test]
    fn a_schema_file_reads_as_the_same_flags() {
        let s = parse("label = \"y\"\nsparse = [\"item\", \"user\"]\ndense = [\"count\", \"price\"]\n").unwrap();
        let flags = ColumnSpec::from_flags(Some("y".into()), vec!["count".into(), "price".into()], vec!["item".into(), "user".into()], None);
        assert_eq!(s.cache_id(), flags.cache_id());
        assert_eq!(s.describe(), flags.describe());
        assert_eq!(flags.describe().unwrap(), "--label-column y --dense-columns count,price --sparse-columns item,user");
        let t = parse("weight = \"w\"\n[dense]\ncount = \"log\"\nprice = { transform = \"none\" }\nage = {}\n").unwrap();
        assert_eq!(t.dense, ["age", "count", "price"]);
        assert_eq!(t.transforms, [("count".to_string(), Transform::Log), ("price".to_string(), Transform::None)]);
        assert_eq!((t.transform("price"), t.transform("age")), (Some(Transform::None), None));
        assert_eq!(t.weight.as_deref(), Some("w"));
        assert!(t.describe().unwrap().ends_with(" transforms count=log,price=none"), "{:?}", t.describe());
        assert!(ColumnSpec::default().describe().is_none() && ColumnSpec::default().cache_id().is_empty());
        for spec in [&flags, &t] {
            let back = ColumnSpec::from_description(&spec.describe().unwrap()).unwrap();
            assert_eq!(back.describe(), spec.describe());
            assert_eq!(back.first_difference(spec), None);
        }
        let diff = t.first_difference(&ColumnSpec { transforms: vec![("count".into(), Transform::Log), ("price".into(), Transform::Log)], ..t.clone() });
        assert_eq!(diff, Some(("price".into(), "dense, transform none".into(), "dense, transform log".into())));
        assert_eq!(flags.first_difference(&ColumnSpec::default()), Some(("y".into(), "the label".into(), "inferred by type".into())));
        let moved = ColumnSpec { dense: vec!["count".into()], sparse: vec!["item".into(), "price".into(), "user".into()], ..flags.clone() };
        assert_eq!(ColumnSpec::described_difference(&flags.describe().unwrap(), &moved.describe().unwrap()), " (column `price`: dense there, sparse here)");
    }

    #[test]
    fn each_bad_schema_names_the_file_and_the_key() {
        let cases = [
            ("lable = \"y\"", "key `lable`: not a key of a schema file"),
            ("label = 3", "key `label`: of type integer, not a column name"),
            ("sparse = \"user\"", "key `sparse`: of type string, not an array of column names"),
            ("sparse = [\"a\", 2]", "key `sparse[1]`: of type integer, not a column name"),
            ("[dense]\nprice = \"sqrt\"", "key `dense.price`: transform \"sqrt\" is not one of"),
            ("[dense]\nprice = { scale = 2 }", "key `dense.price.scale`: not a key of a dense column"),
            ("[dense]\nprice = 1.5", "key `dense.price`: of type float, not a transform"),
            ("dense = [\"a\"]\nsparse = [\"a\"]", "key `sparse`: column `a` is named by `dense` too"),
            ("label = \"a\"\nweight = \"a\"", "key `weight`: column `a` is named by `label` too"),
            ("label = \"y\"\nlabel = ", "key `(syntax)`: not TOML: "),
        ];
        for (text, want) in cases {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.starts_with("s.toml: ") && e.contains(want), "{text:?}: {e}");
        }
        let both = ColumnSpec::resolve(Some(Path::new("s.toml")), ColumnSpec::from_flags(Some("y".into()), vec![], vec![], None)).unwrap_err().to_string();
        assert!(both.contains("--schema s.toml and --label-column both name"), "{both}");
        let missing = ColumnSpec::resolve(Some(Path::new("/nonexistent/s.toml")), ColumnSpec::default()).unwrap_err().to_string();
        assert!(missing.contains("/nonexistent/s.toml"), "{missing}");
    }
}
