//! `ringrec predict --model DIR --data FILES [--out scores.tsv]`: scores rows with a trained
//! model on every rank (`ringrec::train::predict`), rank 0 writes them and prints AUC and
//! log loss.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use ringrec::device::Placement;
use ringrec::topology::Topology;
use ringrec::train::predict::{self, PredictConfig, PredictSummary};

use super::train::{backend, default_data_dir, placement, BackendArg};

/// Flags of `ringrec predict`.
#[derive(clap::Args, Debug, Clone)]
pub struct PredictArgs {
    /// The model: a checkpoint directory (its newest checkpoint that passes every check),
    /// one checkpoint (DIR/step-N), or an export bundle (ringrec export).
    #[arg(long)]
    pub model: PathBuf,
    /// Criteo-format TSVs or prepared .rrdata caches, directories or globs (the syntax of
    /// `train --data`), scored in this order as one set (as `train --eval-data` scores them).
    #[arg(long, value_delimiter = ',', num_args = 1.., required = true)]
    pub data: Vec<PathBuf>,
    /// Write `score<TAB>label` lines here, one per scored row in row order (`-`: stdout,
    /// the summary then goes to stderr). Without it only the summary is printed.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Rows per batch on each rank. The same --batch and rank count as a training run give
    /// its evaluation's scores bit for bit (others: within a few units in the last place).
    #[arg(long, default_value_t = 1024)]
    pub batch: usize,
    /// Score only the last fraction of each file (the held-out split of `train
    /// --test-fraction`); 0: every row.
    #[arg(long, default_value_t = 0.0)]
    pub test_fraction: f64,
    /// Where TSV caches live.
    /// [env: RINGREC_DATA_DIR]
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Where the dense model runs: auto, cpu, cuda.
    #[arg(long, default_value = "auto", value_parser = placement)]
    pub device: Placement,
    /// Threads per rank (default: cores / ranks on this host).
    /// [env: RINGREC_THREADS]
    #[arg(long)]
    pub threads: Option<usize>,
    /// Malformed input lines tolerated per file (they are skipped: no score is written for them).
    #[arg(long, default_value_t = ringrec::data::criteo::DEFAULT_MAX_BAD_LINES)]
    pub max_bad_lines: u64,
    /// The input lines have 41 fields, field N (1-based) a sample weight that scoring reads
    /// past (as `train --weight-column N` reads it).
    #[arg(long, value_name = "N")]
    pub weight_column: Option<u32>,
    /// A Parquet input's label column [default: label] (as `train --label-column`).
    #[arg(long, value_name = "NAME")]
    pub label_column: Option<String>,
    /// A Parquet input's dense feature columns (as `train --dense-columns`).
    #[arg(long, value_name = "NAME,...", value_delimiter = ',')]
    pub dense_columns: Vec<String>,
    /// A Parquet input's categorical columns (as `train --sparse-columns`).
    #[arg(long, value_name = "NAME,...", value_delimiter = ',')]
    pub sparse_columns: Vec<String>,
    /// How the multi-hot fields were pooled in training (as `train --multi-hot-pooling`):
    /// the model records it; given, it must agree.
    #[arg(long, value_name = "MODE")]
    pub multi_hot_pooling: Option<String>,
    /// A Parquet input's columns in a TOML file (as `train --schema`), instead of the column
    /// flags.
    #[arg(long, value_name = "FILE.toml")]
    pub schema: Option<PathBuf>,
    /// Collective backend: auto, mpi, ring, shm, hier.
    #[arg(long, default_value = "auto", value_parser = backend)]
    pub backend: BackendArg,
    /// Refuse a checkpoint directory whose newest checkpoint is damaged, instead of scoring
    /// with the newest one that passes every check (a warning, and the summary's `skipped`
    /// and `step` say which).
    #[arg(long)]
    pub require_newest: bool,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Writes `score<TAB>label` lines; scores in Rust's shortest round-trip form (parsing one
/// back gives the same f32).
fn write_scores(w: &mut impl Write, scores: &[f32], labels: &[f32]) -> std::io::Result<()> {
    for (s, y) in scores.iter().zip(labels) {
        writeln!(w, "{s}\t{y}")?;
    }
    Ok(())
}

fn print(s: &PredictSummary, out: Option<&Path>, json: bool, to_stderr: bool) -> anyhow::Result<()> {
    let line = if json {
        let mut v = serde_json::to_value(s)?;
        v["out"] = serde_json::json!(out);
        v.to_string()
    } else {
        let bad: u64 = s.files.iter().map(|f| f.bad_lines).sum();
        format!(
            "ringrec predict: {} rows of {} file(s){} with the {}, {}, on {} rank(s): AUC {} logloss {} NE {} calibration {}; {:.0} rows/s; {}",
            s.rows,
            s.files.len(),
            if bad > 0 { format!(" ({bad} malformed line(s) skipped)") } else { String::new() },
            s.model,
            s.model_spec,
            s.ranks,
            s.auc.map_or("-".into(), |v| format!("{v:.6}")),
            s.logloss.map_or("-".into(), |v| format!("{v:.6}")),
            s.ne.map_or("-".into(), |v| format!("{v:.6}")),
            s.calibration.map_or("-".into(), |v| format!("{v:.4}")),
            s.rows_per_sec,
            match out {
                Some(p) if p == Path::new("-") => "scores on stdout".to_string(),
                Some(p) => format!("scores in {}", p.display()),
                None => "scores not written (--out FILE writes them)".to_string(),
            }
        )
    };
    if to_stderr {
        ringrec::eprint_line(&line);
    } else {
        println!("{line}");
    }
    Ok(())
}

/// Scores; rank 0 writes the scores and prints the summary.
pub fn run(topo: &Topology, args: &PredictArgs) -> anyhow::Result<()> {
    let cfg = PredictConfig {
        model: args.model.clone(),
        data: args.data.clone(),
        data_dir: super::or_env(args.data_dir.clone(), "RINGREC_DATA_DIR")?.unwrap_or_else(default_data_dir),
        batch: args.batch,
        test_fraction: args.test_fraction,
        device: args.device,
        threads: super::or_env(args.threads, "RINGREC_THREADS")?,
        max_bad_lines: args.max_bad_lines,
        weight_column: args.weight_column,
        label_column: args.label_column.clone(),
        dense_columns: args.dense_columns.clone(),
        sparse_columns: args.sparse_columns.clone(),
        multi_hot_pooling: args.multi_hot_pooling.clone(),
        schema: args.schema.clone(),
        backend: args.backend.0,
        require_newest: args.require_newest,
    };
    let p = predict::run(topo, &cfg)?;
    let Some((scores, labels)) = p.scores else { return Ok(()) };
    let stdout = args.out.as_deref() == Some(Path::new("-"));
    match args.out.as_deref() {
        Some(_) if stdout => {
            let mut w = std::io::BufWriter::new(std::io::stdout().lock());
            write_scores(&mut w, &scores, &labels).and_then(|_| w.flush()).context("writing the scores to stdout")?;
        }
        Some(path) => ringrec::fileio::write_atomic(path, ringrec::fileio::PRIVATE, |w| write_scores(w, &scores, &labels)).with_context(|| format!("writing the scores to {}", path.display()))?,
        None => {}
    }
    print(&p.summary, args.out.as_deref(), args.json, stdout)
}
