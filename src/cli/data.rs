//! `ringrec data ...`: convert a Criteo TSV into the binary cache, write a synthetic TSV,
//! inspect a cache.

use std::path::PathBuf;
use std::time::Instant;

use ringrec::data::cache::Dataset;
use ringrec::data::prepare::{all_cores, prepare_with, PrepareOptions};
use ringrec::data::criteo::{BadLineKind, DEFAULT_MAX_BAD_LINES};
use ringrec::data::multihot::{synth_multi_hot_cut, LIST_FIELDS};
use ringrec::data::parquet_write::{tsv_to_parquet, ROWS_PER_GROUP};
use ringrec::data::synth::{synth_shaped, PlantedModel, SynthSummary, ValueShape, ZIPF_EXPONENT};
use ringrec::data::weights::WeightColumn;
use ringrec::data::ColumnSpec;

/// Parses `--weight-column`: a TSV's field number or a Parquet file's column name.
fn weight_column(s: &str) -> Result<WeightColumn, String> {
    <WeightColumn as ringrec::settings::Word>::parse_word(s)
}

/// `ringrec data ...`.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum DataCommand {
    /// Convert a Criteo TSV (plain, .gz or .zst) or a Parquet file into a binary cache that
    /// training maps read-only.
    Prepare {
        /// The Criteo TSV (label, I1..I13, C1..C26, tab-separated; plain, gzip- or
        /// zstd-compressed) or Parquet file (a label column, numeric dense and string
        /// categorical columns).
        input: PathBuf,
        /// The cache file to write (replaced atomically if it exists).
        output: PathBuf,
        /// Malformed lines to skip (and count) before giving up; 0 accepts none.
        /// [default: 1000] [env: RINGREC_MAX_BAD_LINES]
        #[arg(long)]
        max_bad_lines: Option<u64>,
        /// Threads reading the TSV (default: every core); the cache is the same byte for
        /// byte whatever their number.
        #[arg(long)]
        threads: Option<usize>,
        /// The lines have 41 fields, field N (1-based) the sample's weight (see `train
        /// --weight-column`), or a Parquet file's weight column NAME: the cache is then
        /// version 3, with the weights.
        #[arg(long, value_name = "N|NAME", value_parser = weight_column)]
        weight_column: Option<WeightColumn>,
        /// A Parquet file's label column [default: label].
        #[arg(long, value_name = "NAME")]
        label_column: Option<String>,
        /// A Parquet file's dense feature columns: with --sparse-columns, the only feature
        /// columns read [default: inferred: numbers dense, strings categorical].
        #[arg(long, value_name = "NAME,...", value_delimiter = ',')]
        dense_columns: Vec<String>,
        /// A Parquet file's categorical columns (one id a row; strings or integers): with
        /// --dense-columns, the only feature columns read.
        #[arg(long, value_name = "NAME,...", value_delimiter = ',')]
        sparse_columns: Vec<String>,
        /// A Parquet file's columns in a TOML file (label, weight, dense columns with their
        /// transform, sparse columns: docs/data.md), instead of the column flags.
        #[arg(long, value_name = "FILE.toml")]
        schema: Option<PathBuf>,
    },
    /// Write a synthetic Criteo-format TSV with a planted logistic model (or, with
    /// --interactions, a planted factorisation machine plus a deep part) and print the
    /// planted model's (Bayes) AUC on it.
    Synth {
        /// Rows to write.
        #[arg(long, default_value_t = 200_000)]
        rows: u64,
        /// The TSV file to write.
        #[arg(long)]
        out: PathBuf,
        /// Seed of the values and of the planted model.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Label the rows with a model whose logit depends on pairwise field interactions
        /// (first-order part + planted factorisation machine + small deep part), so the
        /// interaction models (dlrm, dcn, deepfm) have something to find. The values are
        /// those of the file without the flag; only the labels differ.
        #[arg(long)]
        interactions: bool,
        /// The file's format: `tsv`, or `parquet` (the same rows: a label, I1..I13 as
        /// int64, C1..C26 as strings, an empty field a null).
        #[arg(long, default_value = "tsv", value_parser = ["tsv", "parquet"])]
        format: String,
        /// With --format parquet: the multi-hot set instead (10 single-hot int64 fields
        /// c0..c9, 6 list fields l0..l5 of mean length 20, Zipf-like ids, labels from a
        /// planted model that uses the lists; see `ringrec::data::multihot`).
        #[arg(long)]
        multi_hot: bool,
        /// With --multi-hot: write each list cut to its first N ids (the same rows and
        /// labels: what a reading of the lists' first ids sees).
        #[arg(long, value_name = "N")]
        max_list_len: Option<u64>,
        /// Multiply every field's vocabulary (10 to 100,000 values) by N: 31 gives the 26
        /// fields a key space of 10 million, 300 one of 97 million (the largest field 30
        /// million values). The default file is unchanged by `--vocab-scale 1`.
        #[arg(long, value_name = "N", default_value_t = 1)]
        vocab_scale: u32,
        /// Zipf exponent of the values' draw by rank (default 1.1).
        #[arg(long, value_name = "S", default_value_t = ZIPF_EXPONENT)]
        zipf: f64,
    },
    /// Verify a cache file (every block's CRC-32) and print its header, row count and CTR.
    Inspect {
        /// The cache file.
        path: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `ringrec data synth --format parquet --multi-hot`: the multi-hot set, and what it is.
fn synth_multi_hot_set(out: &std::path::Path, rows: u64, seed: u64, format: &str, max_list_len: Option<u64>) -> anyhow::Result<()> {
    anyhow::ensure!(format == "parquet", "--multi-hot writes Parquet: give --format parquet");
    let t = Instant::now();
    let s = synth_multi_hot_cut(out, rows, seed, max_list_len)?;
    println!(
        "wrote {}: {} rows, {} bytes in {:.2}s; ctr {:.4}, {} list ids ({:.1} a list); planted-model (Bayes) AUC {:.4}, with each list cut to its first id {:.4}; seed {}",
        s.path.display(),
        s.rows,
        s.bytes,
        t.elapsed().as_secs_f64(),
        s.positives as f64 / s.rows.max(1) as f64,
        s.list_ids,
        s.list_ids as f64 / (s.rows.max(1) * LIST_FIELDS as u64) as f64,
        s.bayes_auc,
        s.first_id_auc,
        s.seed
    );
    Ok(())
}

/// Runs a `ringrec data` command.
pub fn run(cmd: DataCommand) -> anyhow::Result<()> {
    match cmd {
        DataCommand::Prepare { input, output, max_bad_lines, threads, weight_column, label_column, dense_columns, sparse_columns, schema } => {
            let t = Instant::now();
            // The errors name the file already.
            let max_bad_lines = super::or_env(max_bad_lines, "RINGREC_MAX_BAD_LINES")?.unwrap_or(DEFAULT_MAX_BAD_LINES);
            let weight = weight_column.as_ref().and_then(|c| c.name()).map(str::to_string);
            let columns = ColumnSpec::resolve(schema.as_deref(), ColumnSpec::from_flags(label_column, dense_columns, sparse_columns, weight))?;
            let opts = PrepareOptions::new(max_bad_lines).threads(threads.unwrap_or_else(all_cores)).weight_column(weight_column.and_then(|c| c.field())).columns(columns);
            let s = prepare_with(&input, &output, &opts)?;
            let secs = t.elapsed().as_secs_f64().max(1e-9);
            println!(
                "wrote {}: {} rows, {} bytes in {:.2}s ({:.0} rows/s, {:.1} MB/s of TSV, {} threads, {} parsing); source crc32 {:08x}; {}",
                s.path.display(),
                s.rows,
                s.bytes,
                secs,
                s.report.lines as f64 / secs,
                s.source_bytes as f64 / secs / 1e6,
                s.threads,
                s.parsing_threads,
                s.source_crc32,
                s.report
            );
            if !s.column_nulls.is_empty() {
                let each: Vec<String> = s.column_nulls.iter().map(|(c, n)| format!("{c} {n}")).collect();
                println!("nulls by column: {} ({} in all, read as empty fields: 0.0, the field's missing key)", each.join(", "), s.nulls);
            }
        }
        DataCommand::Synth { multi_hot: true, rows, out, seed, format, max_list_len, .. } => synth_multi_hot_set(&out, rows, seed, &format, max_list_len)?,
        DataCommand::Synth { rows, out, seed, interactions, format, vocab_scale, zipf, .. } => {
            let t = Instant::now();
            let model = if interactions { PlantedModel::Interactions } else { PlantedModel::Logistic };
            let shape = ValueShape::new(vocab_scale, zipf)?;
            let s = if format == "parquet" {
                // The TSV is written beside it, converted, and removed.
                let tsv = out.with_extension("synth.tsv");
                let s = synth_shaped(&tsv, rows, seed, model, shape)?;
                let converted = tsv_to_parquet(&tsv, &out, ROWS_PER_GROUP);
                std::fs::remove_file(&tsv)?;
                converted?;
                SynthSummary { path: out.clone(), bytes: std::fs::metadata(&out)?.len(), ..s }
            } else {
                synth_shaped(&out, rows, seed, model, shape)?
            };
            println!(
                "wrote {}: {} rows, {} bytes in {:.2}s; ctr {:.4} ({} positives), planted-model (Bayes) AUC {:.4}, seed {}{}{}",
                s.path.display(),
                s.rows,
                s.bytes,
                t.elapsed().as_secs_f64(),
                s.ctr,
                s.positives,
                s.bayes_auc,
                s.seed,
                if interactions { " (planted interactions: first-order + factorisation machine + deep)" } else { "" },
                if shape == ValueShape::default() { String::new() } else { format!("; values Zipf({}) over vocabularies x{} (key space {})", shape.zipf, shape.vocab_scale, shape.key_space()) }
            );
        }
        DataCommand::Inspect { path, json } => {
            let t = Instant::now();
            // Opening verifies every block: a damaged file is an error naming the bytes.
            let ds = Dataset::open(&path)?;
            let verify_s = t.elapsed().as_secs_f64();
            let h = ds.header();
            let blocks = h.layout.sums_len / 4;
            let positives = ds.positives();
            let ctr = if ds.is_empty() { 0.0 } else { positives as f64 / ds.len() as f64 };
            if json {
                let v = serde_json::json!({ "path": path, "header": h, "list_names": ds.list_names(), "positives": positives, "ctr": ctr, "verified_blocks": blocks, "open_seconds": verify_s });
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!("dataset cache {}", path.display());
                println!("  rows            {}", h.rows);
                println!("  positives       {positives} (ctr {ctr:.4})");
                println!("  features        {} dense, {} categorical keys a row", h.fields.dense, h.fields.sparse);
                match h.weight_column {
                    Some(ringrec::data::prepare::NAMED_WEIGHT_COLUMN) => println!("  weights         one per row, from a Parquet file's weight column (format version 3)"),
                    Some(c) => println!("  weights         one per row, from field {c} of each line (format version 3)"),
                    None => {}
                }
                if !ds.list_names().is_empty() {
                    let ids: usize = ds.spans_all().chunks_exact(2).map(|s| (s[1] - s[0]) as usize).sum();
                    println!("  multi-hot       {} list fields ({}), {ids} ids ({:.1} a list) (format version 4)", ds.list_fields(), ds.list_names().join(", "), ids as f64 / (ds.len() * ds.list_fields()).max(1) as f64);
                }
                let src = &h.source;
                println!("  source          {} lines, {} bytes, crc32 {:08x}", h.lines, src.size, h.source_crc32);
                println!("  source stat     mtime {} ns, ctime {} ns, inode {}", src.mtime_ns, src.ctime_ns, src.inode);
                let kinds: Vec<String> = BadLineKind::ALL.iter().zip(h.bad_counts).filter(|(_, c)| *c > 0).map(|(k, c)| format!("{k} {c}")).collect();
                println!("  malformed lines {}{}", h.bad_lines, if kinds.is_empty() { String::new() } else { format!(" ({})", kinds.join(", ")) });
                println!("  file            {} bytes", h.layout.file_len);
                println!("  integrity       {blocks} CRC-32 blocks of 1 MiB, all verified ({verify_s:.3}s to open)");
            }
        }
    }
    Ok(())
}
