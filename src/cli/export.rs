//! `ringrec export --model DIR --out BUNDLE`: a checkpoint written as a serving bundle
//! (`ringrec::train::bundle`).

use std::path::PathBuf;

use ringrec::train::bundle;
use ringrec::train::source::ModelSource;

/// Flags of `ringrec export`.
#[derive(clap::Args, Debug, Clone)]
pub struct ExportArgs {
    /// The model: a checkpoint directory (its newest checkpoint that passes every check) or
    /// one checkpoint (DIR/step-N).
    #[arg(long)]
    pub model: PathBuf,
    /// The bundle directory to write (must not exist).
    #[arg(long)]
    pub out: PathBuf,
    /// Print a JSON summary.
    #[arg(long)]
    pub json: bool,
}

/// Exports; prints what was written.
pub fn run(args: &ExportArgs) -> anyhow::Result<()> {
    let (m, warnings) = ModelSource::open(&args.model)?;
    for w in warnings {
        ringrec::eprint_line(&format!("ringrec: warning: {w}"));
    }
    let s = bundle::export(&m, &args.out)?;
    if args.json {
        println!("{}", serde_json::to_string(&s)?);
    } else {
        println!(
            "ringrec export: {} -> {}: step {}, {} table rows, {} dense parameters, {:.1} MiB (model.json, dense.bin, table.bin)",
            s.source.display(),
            s.bundle.display(),
            s.step,
            s.rows,
            s.params,
            s.bytes as f64 / (1024.0 * 1024.0)
        );
    }
    Ok(())
}
