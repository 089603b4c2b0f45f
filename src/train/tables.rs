//! `--table`: categorical fields given host tables of their own (issue 33, point 4) —
//! [`TableSpec`] (one flag: the fields, the table's name, its dim and capacity),
//! [`TableLayout`] (every field of the data's rows mapped to its table, checked against the
//! data's field names) and [`Tables`] (the named tables' [`EmbeddingStage`]s beside the
//! run's default one, and a step's work over all of them).
//!
//! Syntax: `--table FIELDS=NAME[:dim=N][:capacity=SLOTS]`, repeated for several tables;
//! FIELDS comma-separated. A field is named as the data names it: a Parquet file's column
//! name (single-hot or list), `C1`..`Cn` for the single-hot fields of a TSV or cache. A
//! table's dim and capacity default to `--dim` and `--table-capacity`; every other table
//! setting is the run's. Fields not named stay in the default table.
//!
//! **Keys are the same keys.** A key is hashed with its field's number whichever table holds
//! it, rows are initialised from the key, and the sparse update is per key: a field moved
//! into a table of the same dim trains bit for bit as in the default table.
//!
//! **The step.** Each table has its own deduplicated keys (the batch's `uniq` split by the
//! table of the fields that hold them), lookup, sparse exchange and leader update. The
//! batch's keys are staged grouped by table (the default table's first), each table's rows
//! looked up straight into the model's staging at their offsets ([`Tables::stage`]), and the
//! model's input is gathered and pooled on the device ([`crate::model::fields`]: per sample,
//! each field's row from its table, a multi-hot field pooled as the one-table path's
//! kernels pool it, at the field's columns); the model sees one row per (sample, field) when
//! every field has the same width, or one row per sample (`mlp` and `dcn`, whose input is
//! one vector) when widths differ. The device sums the input gradient per key in the
//! one-table kernels' order (a key's single-hot slots in sample then field order, then its
//! bags'), so the sums are the one-table run's bits, and each table's key gradients are one
//! piece of the result.

use std::path::Path;

use super::batch::Batch;
use super::embedding::{EmbeddingStage, TableName};
use super::source::TableFile;
use super::{NanPolicy, TrainConfig, TrainError, TrainResult};
use crate::data::{ColumnSpec, Fields};
use crate::embedding::EmbeddingTable;
use super::gpu_cache::GpuCache;
use crate::device::{Device, CACHE_MISS};
use crate::embedding::TableSource;
use crate::model::pooling::Pooling;
use crate::model::fields::FieldWidths;
use crate::model::{DenseModel, ModelKind, ModelSpec};
use crate::settings::{Arity, SettingValue, Word};
use crate::sparse::SparseStats;
use crate::topology::Topology;

/// The syntax of `--table`, for messages.
pub const SYNTAX: &str = "--table FIELDS=NAME[:dim=N][:capacity=SLOTS][:max_bytes=BYTES]";

/// One `--table` flag (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableSpec {
    /// The fields it holds, as the data names them.
    pub fields: Vec<String>,
    /// Its name: its checkpoint file's tag (`table.NAME.rrt`).
    pub name: String,
    /// Values per row (`None`: `--dim`).
    pub dim: Option<usize>,
    /// Slots (`None`: `--table-capacity`).
    pub capacity: Option<u64>,
    /// Its largest file (`None`: its share of `--table-max-bytes` or of the free space,
    /// [`super::embedding::share_max_bytes`]).
    pub max_bytes: Option<u64>,
}

/// Why `name` cannot name a table (a checkpoint's file tag), if it cannot.
fn bad_name(name: &str) -> Option<String> {
    let ok = !name.is_empty() && name.len() <= 64 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if name == super::table_summary::DEFAULT_TABLE {
        return Some(format!("table name `{name}`: the run's default table is called so in the summary; give the table another name"));
    }
    (!ok).then(|| format!("table name `{name}`: use 1 to 64 letters, digits, `_` or `-` (it names the table's checkpoint file)"))
}

impl Word for TableSpec {
    fn parse_word(s: &str) -> Result<TableSpec, String> {
        let fail = |why: String| format!("`{s}`: {why} ({SYNTAX})");
        let (fields, rest) = s.split_once('=').ok_or_else(|| fail("no `=NAME` after the fields".into()))?;
        let fields: Vec<String> = fields.split(',').map(|f| f.trim().to_string()).collect();
        if fields.iter().any(String::is_empty) {
            return Err(fail("an empty field name".into()));
        }
        if let Some(f) = fields.iter().enumerate().find(|(i, f)| fields[..*i].contains(f)).map(|(_, f)| f) {
            return Err(fail(format!("field `{f}` named twice")));
        }
        let mut parts = rest.split(':');
        let name = parts.next().unwrap_or_default().trim().to_string();
        if let Some(why) = bad_name(&name) {
            return Err(fail(why));
        }
        let mut spec = TableSpec { fields, name, dim: None, capacity: None, max_bytes: None };
        for p in parts {
            let (k, v) = p.split_once('=').ok_or_else(|| fail(format!("`{p}` is not KEY=VALUE (dim=N, capacity=SLOTS or max_bytes=BYTES)")))?;
            if k.trim() == "max_bytes" {
                spec.max_bytes = Some(super::config::size(v.trim()).map_err(|e| fail(format!("max_bytes={e}")))?);
                continue;
            }
            let n: u64 = v.trim().parse().map_err(|_| fail(format!("{k}=`{v}` is not a whole number")))?;
            match k.trim() {
                "dim" if n == 0 => return Err(fail("dim=0: a table's rows need at least one value".into())),
                "dim" => spec.dim = Some(n as usize),
                "capacity" if n == 0 => return Err(fail("capacity=0: a table needs slots".into())),
                "capacity" => spec.capacity = Some(n),
                other => return Err(fail(format!("unknown key `{other}` (dim, capacity or max_bytes)"))),
            }
        }
        Ok(spec)
    }

    fn word(&self) -> String {
        let mut s = format!("{}={}", self.fields.join(","), self.name);
        if let Some(d) = self.dim {
            s += &format!(":dim={d}");
        }
        if let Some(c) = self.capacity {
            s += &format!(":capacity={c}");
        }
        if let Some(b) = self.max_bytes {
            s += &format!(":max_bytes={b}");
        }
        s
    }
}

impl SettingValue for Vec<TableSpec> {
    const ARITY: Arity = Arity::Repeated;
    fn from_values(values: &[&str]) -> Result<Vec<TableSpec>, String> {
        values.iter().map(|v| TableSpec::parse_word(v)).collect()
    }
    /// The flags' values separated by spaces (each holds commas); `none` without one.
    fn show(&self) -> String {
        if self.is_empty() {
            return "none".into();
        }
        self.iter().map(Word::word).collect::<Vec<_>>().join(" ")
    }
}

/// The checks of `--table` that need no data: unique table names, no field in two tables.
pub fn check_specs(specs: &[TableSpec]) -> TrainResult<()> {
    for (i, t) in specs.iter().enumerate() {
        if let Some(o) = specs[..i].iter().find(|o| o.name == t.name) {
            return Err(TrainError::Config(format!("--table {} and --table {}: two tables named `{}`; give each table its own name", o.word(), t.word(), t.name)));
        }
        for f in &t.fields {
            if let Some(o) = specs[..i].iter().find(|o| o.fields.contains(f)) {
                return Err(TrainError::Config(format!("--table: field `{f}` is in table `{}` and in table `{}`; a field keys into one table", o.name, t.name)));
            }
        }
    }
    Ok(())
}

/// The names of the data's fields `--table` can name: single-hot fields then list fields
/// (a Parquet file's column names; `C1`..`Cn` for the single-hot fields of a TSV or cache).
/// `columns`: the run's named Parquet columns.
pub fn field_names(columns: &ColumnSpec, input: &Path, fields: Fields, lists: &[String]) -> TrainResult<Vec<String>> {
    let mut names = if crate::data::parquet_file::is_parquet(input) {
        crate::data::parquet_file::schema_of(input, columns).map_err(|e| TrainError::Config(e.to_string()))?.sparse_names()
    } else {
        (1..=fields.sparse).map(|i| format!("C{i}")).collect()
    };
    if names.len() != fields.sparse {
        names = (1..=fields.sparse).map(|i| format!("C{i}")).collect();
    }
    names.extend(lists.iter().cloned());
    Ok(names)
}

/// The setting under which a `--table` run's checkpoint records its data's categorical
/// fields by name ([`fields_setting`]): what `export`, `serve-model` and `--init-from` lay
/// the tables out over without the data.
pub const FIELDS_SETTING: &str = "--table fields";

/// The [`FIELDS_SETTING`] of a `--table` run on `input` (`None` without `--table`): the
/// single-hot fields' names, ` | `, the list fields' names, each comma-separated.
pub fn fields_setting(cfg: &TrainConfig, input: &Path, fields: Fields, lists: &[String]) -> TrainResult<Option<(&'static str, String)>> {
    if cfg.tables.is_empty() {
        return Ok(None);
    }
    let columns = cfg.columns().map_err(|e| TrainError::Config(e.to_string()))?;
    let names = field_names(&columns, input, fields, lists)?;
    let (single, bags) = names.split_at(fields.sparse.min(names.len()));
    Ok(Some((FIELDS_SETTING, format!("{} | {}", single.join(","), bags.join(",")))))
}

/// The fields a [`FIELDS_SETTING`] records: every name (single-hot, then lists) and how
/// many are single-hot; `None` when it is not one.
pub fn recorded_field_names(value: &str) -> Option<(Vec<String>, usize)> {
    let (single, bags) = value.split_once('|')?;
    let split = |s: &str| s.trim().split(',').filter(|f| !f.is_empty()).map(str::to_string).collect::<Vec<_>>();
    let mut names = split(single);
    let n = names.len();
    names.extend(split(bags));
    Some((names, n))
}

/// The model `cfg` trains on rows of `fields` with list fields `lists` (the first input
/// `input`'s) and, with `--table`, the tables' layout over those fields (the model's fields
/// and their pooling are then set by the tables' gathering, [`Gather::stage`]).
pub fn model_and_layout(cfg: &TrainConfig, input: &Path, fields: Fields, lists: &[String]) -> TrainResult<(ModelSpec, Option<TableLayout>)> {
    let spec = cfg.model_spec_of(input, fields, lists.len())?;
    if cfg.tables.is_empty() {
        return Ok((spec, None));
    }
    let columns = cfg.columns().map_err(|e| TrainError::Config(e.to_string()))?;
    let Some(layout) = TableLayout::resolve(cfg, &field_names(&columns, input, fields, lists)?, fields.sparse)? else { return Ok((spec, None)) };
    Ok((layout.model_spec(spec)?, Some(layout)))
}

/// Every field of the data's rows mapped to its table (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableLayout {
    /// Per field of a row (single-hot fields, then list fields): its table (0: the
    /// default table; `i`: the `i`-th `--table`).
    pub table_of: Vec<usize>,
    /// Per table (0: the default): values per row.
    pub widths: Vec<usize>,
    /// Single-hot fields per row.
    pub single: usize,
}

impl TableLayout {
    /// The layout `cfg`'s `--table` flags give over fields named `names` (single-hot then
    /// list fields, `single` of the first), `None` without the flag. An unknown field is
    /// refused naming the flag and the data's fields.
    pub fn resolve(cfg: &TrainConfig, names: &[String], single: usize) -> TrainResult<Option<TableLayout>> {
        if cfg.tables.is_empty() {
            return Ok(None);
        }
        let mut widths = vec![cfg.row_width()];
        widths.extend(cfg.tables.iter().map(|t| cfg.for_table(t).row_width()));
        TableLayout::of(&cfg.tables, names, single, widths).map(Some)
    }

    /// The layout of tables `specs` over fields named `names` (`single` of them single-hot),
    /// the tables' row widths `widths` (the default table's first).
    pub fn of(specs: &[TableSpec], names: &[String], single: usize, widths: Vec<usize>) -> TrainResult<TableLayout> {
        check_specs(specs)?;
        let mut table_of = vec![0; names.len()];
        for (i, t) in specs.iter().enumerate() {
            for f in &t.fields {
                let Some(at) = names.iter().position(|n| n == f) else {
                    return Err(TrainError::Config(format!("--table {}: the data has no field `{f}`; its categorical fields are {}", t.word(), names.join(", "))));
                };
                table_of[at] = i + 1;
            }
        }
        Ok(TableLayout { table_of, widths, single })
    }

    /// Values per row of field `f`.
    pub fn width(&self, f: usize) -> usize {
        self.widths[self.table_of[f]]
    }

    /// Whether table `t` holds a field.
    pub fn used(&self, t: usize) -> bool {
        self.table_of.contains(&t)
    }

    /// The model over these fields: `base` (the one-table model of the data) with the
    /// fields' width when they share one; with fields of different widths, an `mlp` or
    /// `dcn` over one vector of their rows (one field of their summed width), a `wide-deep`
    /// over one vector of their rows with each field's dim ([`ModelSpec::field_dims`]: its
    /// wide part reads field `f`'s weight after its `d_f` values). dlrm and deepfm need one
    /// dim: refused naming `--table`.
    pub fn model_spec(&self, base: ModelSpec) -> TrainResult<ModelSpec> {
        let first = usize::from(base.first_order());
        let w = self.width(0);
        if (0..self.table_of.len()).all(|f| self.width(f) == w) {
            return Ok(ModelSpec { dim: w - first, ..base });
        }
        let widths = (0..self.table_of.len()).map(|f| self.width(f));
        match base.kind {
            ModelKind::Mlp | ModelKind::Dcn => Ok(ModelSpec { fields: 1, dim: widths.sum(), ..base }),
            ModelKind::WideDeep => {
                let field_dims: Vec<usize> = widths.map(|w| w - 1).collect();
                Ok(ModelSpec { fields: 1, dim: field_dims.iter().sum(), field_dims, ..base })
            }
            kind => {
                let dims: Vec<String> = (0..self.widths.len()).filter(|t| self.used(*t)).map(|t| format!("{}", self.widths[t] - first)).collect();
                let why = match kind {
                    ModelKind::Dlrm => "its dot interaction takes the dot product of every two fields' vectors",
                    _ => "its factorisation machine takes the dot product of every two fields' vectors",
                };
                Err(TrainError::Config(format!("--table gives fields of different dims ({}), and --model {kind} needs one dim for every field ({why}): give every table the same dim, or train --model mlp, dcn or wide-deep", dims.join(", "))))
            }
        }
    }
}

/// The checkpoint file of table `name`.
pub fn table_file(name: &str) -> String {
    format!("table.{name}.rrt")
}

/// A step's keys split by table (scratch, reused).
#[derive(Default)]
struct Split {
    /// Per unique key of the batch: its table, and its place among the staged keys (grouped
    /// by table).
    table: Vec<u32>,
    staged: Vec<u32>,
    /// Per table: its keys (sorted), and where its rows (and key gradients) start among the
    /// staged values; then the values in all.
    keys: Vec<Vec<u64>>,
    at: Vec<usize>,
    /// Staged with hot-row caches ([`Gather::stage_cached`]): per key in table order (as
    /// `staged` numbers them), where its row and key gradient are among the staged values;
    /// empty otherwise.
    moved: Vec<u32>,
    /// Per table: the batch's occurrences of its keys, as indices into its keys (scratch).
    occurrences: Vec<Vec<u32>>,
    /// Per key in table order: its place among the keys a cached staging stages (scratch).
    place: Vec<u32>,
}

/// A step's work over the tables of a [`TableLayout`] (see the module docs): the batch's keys
/// split by table and staged for the model's device gathering, with each field's width.
/// Scratch, reused from batch to batch.
pub struct Gather {
    layout: TableLayout,
    /// The model's fields: each field's width, the single-hot ones first.
    widths: FieldWidths,
    /// The list fields' pooling.
    pooling: Vec<Pooling>,
    split: Split,
}

/// The named tables of a run beside its default one (see the module docs).
pub struct Tables {
    gather: Gather,
    /// The key gradients put back in table order after a cached staging (scratch).
    in_order: Vec<f32>,
    /// The `--table` tables, in flag order (table `i + 1` of the layout), and their names.
    stages: Vec<EmbeddingStage>,
    names: Vec<String>,
}

const NO_TABLE: u32 = u32::MAX;

impl Tables {
    /// Opens the `--table` tables of `layout` (collective over the world): new, the tables
    /// of the checkpoint directory `saved`, or (`--init-from`) filled from the model's table
    /// files `warm`, in flag order ([`TableFile::config`]). `pooling`: the list fields'
    /// modes; `step_keys`: the most keys of a host's step
    /// ([`super::embedding::host_step_keys`], of all tables together: a bound for each).
    pub fn open(topo: &Topology, cfg: &TrainConfig, layout: TableLayout, pooling: &[Pooling], saved: Option<&Path>, warm: &[TableFile], step_keys: u64) -> TrainResult<Tables> {
        let mut stages = Vec::with_capacity(cfg.tables.len());
        for (i, t) in cfg.tables.iter().enumerate() {
            let tcfg = cfg.for_table(t);
            let from = warm.get(i);
            let tc = from.map_or_else(|| tcfg.table_config(), |f| f.config(&tcfg.table_config()));
            let file = saved.map(|d| d.join(table_file(&t.name)));
            let source = match (&file, from) {
                (Some(p), _) => TableSource::Saved(p, &tc),
                (None, Some(f)) => f.source(&tc),
                (None, None) => TableSource::New(&tc),
            };
            stages.push(EmbeddingStage::open_named(topo, &tcfg, source, &TableName::named(&t.name), step_keys)?);
        }
        let names = cfg.tables.iter().map(|t| t.name.clone()).collect();
        Ok(Tables { gather: Gather::new(layout, pooling), in_order: Vec::new(), stages, names })
    }

    /// The named tables' stages with their names, in flag order.
    pub fn named(&self) -> impl Iterator<Item = (&str, &EmbeddingStage)> {
        self.names.iter().map(String::as_str).zip(&self.stages)
    }

    /// The named tables' stages, in flag order.
    pub fn stages_mut(&mut self) -> impl Iterator<Item = &mut EmbeddingStage> {
        self.stages.iter_mut()
    }

    /// Every table (`default` first) and the step's gathering over them: what scoring a
    /// batch needs ([`super::predict::Embeddings::Split`]).
    pub fn parts<'a>(&'a mut self, default: &'a EmbeddingStage) -> (Vec<&'a EmbeddingTable>, &'a mut Gather) {
        let tables = std::iter::once(default).chain(&self.stages).map(|s| s.table().table()).collect();
        (tables, &mut self.gather)
    }

    /// Stages batch `b` for `model` ([`Gather::stage`]) from `default` and the named tables.
    pub fn stage<D: Device>(&mut self, model: &mut DenseModel<D>, default: &EmbeddingStage, b: &Batch) -> TrainResult<()> {
        let (tables, gather) = self.parts(default);
        gather.stage(model, &tables, b)
    }

    /// The sparse half of a step over every table holding a field (collective over the
    /// world, tables in order, `default` first): the model's key gradients `grads` of batch
    /// `b` (as [`Tables::stage`] staged its keys: grouped by table), each table's piece
    /// exchanged and applied ([`EmbeddingStage::exchange_and_apply`]).
    /// Returns the exchanges' counters summed.
    pub fn exchange_and_apply(&mut self, default: &mut EmbeddingStage, b: &Batch, grads: &[f32], step: u64, policy: NanPolicy) -> TrainResult<SparseStats> {
        let g = &self.gather;
        if g.split.table.len() != b.uniq.len() || g.split.at.last() != Some(&grads.len()) {
            return Err(TrainError::Config(format!("--table: {} key gradient values for a batch staged with {}", grads.len(), g.split.at.last().copied().unwrap_or(0))));
        }
        let grads = match g.split.moved.is_empty() {
            true => grads,
            false => {
                g.in_table_order(grads, &mut self.in_order);
                &self.in_order[..]
            }
        };
        let mut stats = SparseStats::default();
        for t in 0..g.layout.widths.len() {
            if !g.layout.used(t) {
                continue;
            }
            let stage = if t == 0 { &mut *default } else { &mut self.stages[t - 1] };
            stats.add(&stage.exchange_and_apply(&g.split.keys[t], &grads[g.split.at[t]..g.split.at[t + 1]], step, policy)?);
        }
        Ok(stats)
    }

    /// Table `t`'s stage (`default` for table 0).
    pub fn stage_mut<'a>(&'a mut self, t: usize, default: &'a mut EmbeddingStage) -> &'a mut EmbeddingStage {
        if t == 0 {
            default
        } else {
            &mut self.stages[t - 1]
        }
    }

    /// The layout's tables, the default one first.
    pub fn layout(&self) -> &TableLayout {
        &self.gather.layout
    }

    /// [`Tables::stage`] with hot-row caches ([`Gather::stage_cached`]).
    pub fn stage_cached<D: Device>(&mut self, model: &mut DenseModel<D>, default: &EmbeddingStage, b: &Batch, caches: &mut [Option<GpuCache<D>>]) -> TrainResult<Vec<(usize, usize, usize)>> {
        let (tables, gather) = self.parts(default);
        gather.stage_cached(model, &tables, b, caches)
    }

    /// `--sparse-normalize weighted`: this rank's weight and all ranks' for every named
    /// table's next exchange.
    pub fn set_sparse_weights(&mut self, w: (f32, f32)) {
        self.stages.iter_mut().for_each(|s| s.set_sparse_weights(w));
    }
}

impl Gather {
    /// The gathering over `layout`, its list fields pooled as `pooling` says.
    pub fn new(layout: TableLayout, pooling: &[Pooling]) -> Gather {
        let widths = FieldWidths { widths: (0..layout.table_of.len()).map(|f| layout.width(f)).collect(), single: layout.single };
        // A list field without a mode is summed.
        let mut pooling = pooling.to_vec();
        pooling.resize(layout.table_of.len() - layout.single, Pooling::Sum);
        let n = layout.widths.len();
        let split = Split { keys: vec![Vec::new(); n], at: vec![0; n + 1], ..Split::default() };
        Gather { layout, widths, pooling, split }
    }

    /// Splits the batch's unique keys by table and places them grouped by table (see the
    /// module docs); a key held by fields of two tables (a hash collision of two fields'
    /// ids) is an error naming it.
    fn split(&mut self, b: &Batch) -> TrainResult<()> {
        let (single, bags) = (self.layout.single, b.bags);
        if b.fields.sparse != single || single + bags != self.layout.table_of.len() {
            return Err(TrainError::Config(format!("--table: the batch has {}, the tables were laid out for {} fields", b.fields.with_lists(bags), self.layout.table_of.len())));
        }
        let s = &mut self.split;
        s.table.clear();
        s.table.resize(b.uniq.len(), NO_TABLE);
        let mut assign = |u: u32, t: usize| -> TrainResult<()> {
            let slot = &mut s.table[u as usize];
            if *slot == NO_TABLE {
                *slot = t as u32;
            } else if *slot != t as u32 {
                return Err(TrainError::Config(format!("--table: key {:#x} is a key of fields in two tables (a hash collision of two fields' ids); move those fields into one table", b.uniq[u as usize])));
            }
            Ok(())
        };
        for (p, u) in b.inverse.iter().enumerate() {
            assign(*u, self.layout.table_of[p % single.max(1)])?;
        }
        for bag in 0..b.len() * bags {
            let t = self.layout.table_of[single + bag % bags];
            for u in &b.bag_index[b.bag_offsets[bag] as usize..b.bag_offsets[bag + 1] as usize] {
                assign(*u, t)?;
            }
        }
        s.keys.iter_mut().for_each(Vec::clear);
        for (u, t) in s.table.iter().enumerate() {
            s.keys[*t as usize].push(b.uniq[u]);
        }
        // Table t's keys are staged after those of the tables before it.
        let mut first = Vec::with_capacity(s.keys.len());
        let (mut keys, mut values) = (0u32, 0);
        for (t, k) in s.keys.iter().enumerate() {
            first.push(keys);
            s.at[t] = values;
            keys += k.len() as u32;
            values += k.len() * self.layout.widths[t];
        }
        s.at[s.keys.len()] = values;
        s.staged.clear();
        for t in &s.table {
            let at = &mut first[*t as usize];
            s.staged.push(*at);
            *at += 1;
        }
        Ok(())
    }

    /// Stages batch `b` for `model` (see the module docs): each table's rows of its keys
    /// (`tables`: the layout's, the default table first) looked up into the model's staging,
    /// grouped by table, for the device to gather and pool per sample.
    pub fn stage<D: Device>(&mut self, model: &mut DenseModel<D>, tables: &[&EmbeddingTable], b: &Batch) -> TrainResult<()> {
        self.prepare(model, tables, b)?;
        self.split.moved.clear();
        let (split, widths) = (&self.split, &self.layout.widths);
        let floats = split.at[widths.len()];
        let (st, key_at) = model.stage_tables(b.len(), b.uniq.len(), floats)?;
        let mut k = 0;
        for (t, table) in tables.iter().enumerate() {
            let (keys, at) = (&split.keys[t], split.at[t]);
            table.lookup(keys, &mut st.emb[at..split.at[t + 1]])?;
            for l in 0..keys.len() {
                key_at[k] = (at + l * widths[t]) as u32;
                k += 1;
            }
        }
        key_at[k] = floats as u32;
        st.inverse.iter_mut().zip(&b.inverse).for_each(|(s, u)| *s = split.staged[*u as usize]);
        st.dense.copy_from_slice(&b.dense);
        st.labels.copy_from_slice(&b.labels);
        if b.bags > 0 {
            let (offsets, index) = model.stage_bags(b.len(), b.bag_index.len())?;
            offsets.copy_from_slice(&b.bag_offsets);
            index.iter_mut().zip(&b.bag_index).for_each(|(s, u)| *s = self.split.staged[*u as usize]);
        }
        Ok(())
    }

    /// [`Gather::stage`] with a hot-row cache per table (`caches[t]`, `None` for a table
    /// without one; [`super::table_caches`]): each table's keys are planned by its cache, only
    /// the misses' rows are looked up and uploaded, and the hits' rows are gathered on the
    /// device from the cache. The keys are staged misses first (table by table, each
    /// table's in key order), then the hits (the same way), so the uploaded values are
    /// one prefix; their key gradients come back in that order and
    /// [`Tables::exchange_and_apply`] puts them back in table order. Returns per cache
    /// with hits (table, values, their offset among the staged values), for
    /// [`DenseModel::load_with_rows`].
    pub fn stage_cached<D: Device>(&mut self, model: &mut DenseModel<D>, tables: &[&EmbeddingTable], b: &Batch, caches: &mut [Option<GpuCache<D>>]) -> TrainResult<Vec<(usize, usize, usize)>> {
        self.prepare(model, tables, b)?;
        let n = self.layout.widths.len();
        if caches.len() != n {
            return Err(TrainError::Config(format!("internal: {} hot-row caches for {n} tables", caches.len())));
        }
        let (split, widths) = (&mut self.split, &self.layout.widths);
        let floats = split.at[n];
        // Each table's first key among the keys staged in table order.
        let first: Vec<u32> = split.keys.iter().scan(0u32, |k, keys| {
            let f = *k;
            *k += keys.len() as u32;
            Some(f)
        }).collect();
        split.occurrences.resize_with(n, Vec::new);
        split.occurrences.iter_mut().for_each(Vec::clear);
        for u in b.inverse.iter().chain(&b.bag_index) {
            let t = split.table[*u as usize] as usize;
            split.occurrences[t].push(split.staged[*u as usize] - first[t]);
        }
        let mut misses = vec![0usize; n];
        for (t, cache) in caches.iter_mut().enumerate() {
            misses[t] = match cache {
                Some(c) => c.plan_keys(&split.keys[t], &[&split.occurrences[t]], b.len()).misses.len(),
                None => split.keys[t].len(),
            };
        }
        // Where each group starts: keys and values, the misses' groups then the hits'.
        let (mut key0, mut val0) = (vec![0u32; 2 * n], vec![0usize; 2 * n]);
        let (mut k, mut v) = (0u32, 0usize);
        for g in 0..2 * n {
            let t = g % n;
            let count = if g < n { misses[t] } else { split.keys[t].len() - misses[t] };
            (key0[g], val0[g]) = (k, v);
            k += count as u32;
            v += count * widths[t];
        }
        let uploaded = val0[n];
        let (st, key_at) = model.stage_tables(b.len(), b.uniq.len(), floats)?;
        // Per key in table order: its place among the staged keys (every entry set below).
        split.place.clear();
        split.place.resize(b.uniq.len(), 0);
        split.moved.clear();
        split.moved.resize(b.uniq.len(), 0);
        for t in 0..n {
            let w = widths[t];
            let mut hit = 0usize;
            let plan = caches[t].as_ref().map(|c| c.plan());
            let source = |l: usize| plan.map_or(CACHE_MISS | l as u32, |p| p.source[l]);
            for l in 0..split.keys[t].len() {
                let s = source(l);
                let (key, val) = match s & CACHE_MISS {
                    0 => {
                        hit += 1;
                        (key0[n + t] as usize + hit - 1, val0[n + t] + (hit - 1) * w)
                    }
                    _ => {
                        let i = (s & !CACHE_MISS) as usize;
                        (key0[t] as usize + i, val0[t] + i * w)
                    }
                };
                let k = first[t] as usize + l;
                split.place[k] = key as u32;
                split.moved[k] = val as u32;
                key_at[key] = val as u32;
            }
            let rows = &mut st.emb[val0[t]..val0[t] + misses[t] * w];
            match plan {
                Some(p) => tables[t].lookup(&p.misses, rows)?,
                None => tables[t].lookup(&split.keys[t], rows)?,
            }
        }
        key_at[b.uniq.len()] = floats as u32;
        st.inverse.iter_mut().zip(&b.inverse).for_each(|(s, u)| *s = split.place[split.staged[*u as usize] as usize]);
        st.dense.copy_from_slice(&b.dense);
        st.labels.copy_from_slice(&b.labels);
        if b.bags > 0 {
            let (offsets, index) = model.stage_bags(b.len(), b.bag_index.len())?;
            offsets.copy_from_slice(&b.bag_offsets);
            index.iter_mut().zip(&b.bag_index).for_each(|(s, u)| *s = split.place[split.staged[*u as usize] as usize]);
        }
        model.stage_uploaded(uploaded)?;
        let mut on_device = Vec::new();
        for (t, cache) in caches.iter_mut().enumerate() {
            if let Some(c) = cache {
                let values = c.gather_hits(model.device())?;
                if values > 0 {
                    on_device.push((t, values, val0[n + t]));
                }
            }
        }
        Ok(on_device)
    }

    /// After [`Gather::stage_cached`]: the key gradients `grads` (in its staged order) put
    /// back in table order into `out`, as [`Gather::stage`] stages them.
    fn in_table_order(&self, grads: &[f32], out: &mut Vec<f32>) {
        let s = &self.split;
        out.clear();
        out.resize(grads.len(), 0.0);
        let mut k = 0;
        for (t, keys) in s.keys.iter().enumerate() {
            let w = self.layout.widths[t];
            for l in 0..keys.len() {
                let from = s.moved[k] as usize;
                out[s.at[t] + l * w..s.at[t] + (l + 1) * w].copy_from_slice(&grads[from..from + w]);
                k += 1;
            }
        }
    }

    /// Splits batch `b` by table and readies `model` for it: the checks both stagings share.
    fn prepare<D: Device>(&mut self, model: &mut DenseModel<D>, tables: &[&EmbeddingTable], b: &Batch) -> TrainResult<()> {
        self.split(b)?;
        if tables.len() != self.layout.widths.len() || tables.iter().zip(&self.layout.widths).any(|(t, w)| t.dim() != *w) {
            let dims: Vec<usize> = tables.iter().map(|t| t.dim()).collect();
            return Err(TrainError::Config(format!("--table: tables of {dims:?} values per row, the layout has {:?}", self.layout.widths)));
        }
        let spec = model.spec();
        let (width, per_sample) = (spec.row_width(), self.widths.cols());
        if spec.ndense != b.fields.dense || spec.fields * width != per_sample {
            return Err(TrainError::Config(format!("--table: the model takes {} fields of {width} values and {} dense features, the tables give {per_sample} values and the batch {}", spec.fields, spec.ndense, b.fields.with_lists(b.bags))));
        }
        if model.field_widths() != Some(&self.widths) {
            model.set_fields(&self.widths.widths, &self.pooling)?;
        }
        let floats = self.split.at[self.layout.widths.len()];
        if u32::try_from(floats).is_err() {
            return Err(TrainError::Config(format!("--table: a batch of {floats} row values does not fit the staging's offsets; use a smaller --batch")));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_reads_fields_name_dim_and_capacity_and_shows_as_typed() {
        let t = TableSpec::parse_word("c3,l0=items:dim=32:capacity=1048576").unwrap();
        assert_eq!(t, TableSpec { fields: vec!["c3".into(), "l0".into()], name: "items".into(), dim: Some(32), capacity: Some(1 << 20), max_bytes: None });
        assert_eq!(t.word(), "c3,l0=items:dim=32:capacity=1048576");
        let t = TableSpec::parse_word("c3=items:max_bytes=64M").unwrap();
        assert_eq!((t.max_bytes, t.word().as_str()), (Some(64 << 20), "c3=items:max_bytes=67108864"));
        assert!(TableSpec::parse_word("c3=items:max_bytes=lots").unwrap_err().contains("max_bytes=`lots` is not a size"));
        assert_eq!(TableSpec::parse_word("C1=a").unwrap().word(), "C1=a");
        for (bad, says) in [("C1", "no `=NAME`"), ("C1=", "table name"), ("C1=a/b", "table name"), ("C1,=a", "empty field"), ("C1,C1=a", "named twice"), ("C1=a:dim=0", "dim=0"), ("C1=a:rows=3", "unknown key"), ("C1=a:dim=x", "not a whole number"), ("C1=default", "the run's default table")] {
            let e = TableSpec::parse_word(bad).unwrap_err();
            assert!(e.contains(says) && e.contains("--table FIELDS=NAME"), "{bad}: {e}");
        }
        let two = Vec::<TableSpec>::from_values(&["C1=a", "C2,C3=b:dim=8"]).unwrap();
        assert_eq!(two.show(), "C1=a C2,C3=b:dim=8");
        assert_eq!(Vec::<TableSpec>::new().show(), "none");
        assert!(check_specs(&two).is_ok());
        let e = check_specs(&Vec::<TableSpec>::from_values(&["C1=a", "C2=a"]).unwrap()).unwrap_err().to_string();
        assert!(e.contains("two tables named `a`"), "{e}");
        let e = check_specs(&Vec::<TableSpec>::from_values(&["C1=a", "C2,C1=b"]).unwrap()).unwrap_err().to_string();
        assert!(e.contains("field `C1` is in table `a` and in table `b`"), "{e}");
    }

    #[test]
    fn the_recorded_fields_read_back() {
        assert_eq!(recorded_field_names("c0,c1 | l0"), Some((vec!["c0".to_string(), "c1".into(), "l0".into()], 2)));
        assert_eq!(recorded_field_names("C1,C2 | "), Some((vec!["C1".to_string(), "C2".into()], 2)));
        assert_eq!(recorded_field_names("C1,C2 |"), Some((vec!["C1".to_string(), "C2".into()], 2)), "a manifest's trimmed value");
        assert_eq!(recorded_field_names("c0,c1"), None);
    }

    #[test]
    fn the_layout_maps_fields_and_gives_the_model_its_widths() {
        let mut cfg = TrainConfig::defaults();
        cfg.tables = Vec::<TableSpec>::from_values(&["C2,l0=items:dim=8"]).unwrap();
        let names: Vec<String> = ["C1", "C2", "C3", "l0"].iter().map(|s| s.to_string()).collect();
        let layout = TableLayout::resolve(&cfg, &names, 3).unwrap().unwrap();
        assert_eq!((layout.table_of.clone(), layout.widths.clone()), (vec![0, 1, 0, 1], vec![16, 8]));
        let base = cfg.model_spec_for(Fields { dense: 2, sparse: 3 }, 1);
        let spec = layout.model_spec(base.clone()).unwrap();
        assert_eq!((spec.fields, spec.dim, spec.concat_width()), (1, 48, 50));
        let dlrm = ModelSpec { kind: ModelKind::Dlrm, ..base.clone() };
        assert!(layout.model_spec(dlrm).unwrap_err().to_string().contains("--model dlrm needs one dim"));
        let fm = ModelSpec { kind: ModelKind::DeepFm, ..base.clone() };
        assert!(layout.model_spec(fm).unwrap_err().to_string().contains("--model deepfm needs one dim"));
        // A wide-deep's rows hold each field's dim + 1 values: one input field of them all,
        // with each field's dim.
        cfg.model = ModelKind::WideDeep;
        let wide = TableLayout::resolve(&cfg, &names, 3).unwrap().unwrap();
        assert_eq!(wide.widths, vec![17, 9]);
        let spec = wide.model_spec(cfg.model_spec_for(Fields { dense: 2, sparse: 3 }, 1)).unwrap();
        assert_eq!((spec.fields, spec.dim, spec.field_dims.clone(), spec.row_width(), spec.concat_width()), (1, 48, vec![16, 8, 16, 8], 52, 50));
        assert_eq!(spec.check(), None);
        cfg.model = ModelKind::Mlp;
        cfg.tables[0].dim = None;
        let same = TableLayout::resolve(&cfg, &names, 3).unwrap().unwrap();
        assert_eq!(same.model_spec(base.clone()).unwrap(), base);
        cfg.tables[0].fields = vec!["C9".into()];
        let e = TableLayout::resolve(&cfg, &names, 3).unwrap_err().to_string();
        assert!(e.contains("no field `C9`") && e.contains("C1, C2, C3, l0"), "{e}");
    }
}
