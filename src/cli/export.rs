//! `ringrec export --model DIR --out BUNDLE`: a checkpoint written as a serving bundle
//! (`ringrec::train::bundle`).

use std::path::PathBuf;

use ringrec::train::bundle;
use ringrec::train::source::{Fallback, ModelSource};

/// Flags of `ringrec export`.
#[derive(clap::Args, Debug, Clone)]
pub struct ExportArgs {
    /// The model: a checkpoint directory (its newest checkpoint, which must pass every
    /// check) or one checkpoint (DIR/step-N); a `--table` model's every table is bundled.
    #[arg(long)]
    pub model: PathBuf,
    /// When the directory's newest checkpoint is damaged, export the newest one that passes
    /// every check (with a warning; the bundle's model.json and the JSON summary list the
    /// checkpoints skipped) instead of refusing.
    #[arg(long)]
    pub allow_older: bool,
    /// The bundle directory to write (must not exist).
    #[arg(long)]
    pub out: PathBuf,
    /// What to write: `bundle` (model.json, dense.bin, table.bin) or `onnx` (the bundle and
    /// model.onnx, the dense model as an ONNX graph beside the table; docs/serving.md).
    #[arg(long, default_value = "bundle")]
    pub format: bundle::Format,
    /// Print a JSON summary.
    #[arg(long)]
    pub json: bool,
}


/// Exports; prints what was written.
pub fn run(args: &ExportArgs) -> anyhow::Result<()> {
    let fallback = if args.allow_older { Fallback::Allow } else { Fallback::Refuse("pass --allow-older to export it") };
    let m = ModelSource::open(&args.model, fallback)?;
    m.warn_skipped();
    let s = bundle::export(&m, &args.out, args.format)?;
    if args.json {
        println!("{}", serde_json::to_string(&s)?);
    } else {
        println!(
            "ringrec export: {} -> {}: the {}, step {}{}, {} table rows, {} dense parameters, {:.1} MiB (model.json, dense.bin, table.bin{}{})",
            s.source.display(),
            s.bundle.display(),
            s.model,
            s.step,
            if s.skipped.is_empty() { String::new() } else { format!(" (an older checkpoint: {} newer one(s) skipped as damaged)", s.skipped.len()) },
            s.rows,
            s.params,
            s.bytes as f64 / (1024.0 * 1024.0),
            s.tables.iter().map(|t| format!(", {t}")).collect::<String>(),
            if s.onnx { ", model.onnx" } else { "" }
        );
    }
    Ok(())
}
