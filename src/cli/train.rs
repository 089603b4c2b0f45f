//! `ringrec train`: its flags, turned into a [`TrainConfig`], the progress bar and the
//! printed summary.

use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Command};

use ringrec::comm::Backend;
use ringrec::device::Placement;
use ringrec::settings::{Arity, Setting, Word};
use ringrec::topology::Topology;
use ringrec::train::{self, Progress, TrainConfig, TrainSummary};

/// `--backend`: `auto` (the best for the topology) or a backend.
#[derive(Clone, Copy, Debug)]
pub struct BackendArg(pub Option<Backend>);

/// Parses `--backend` as `ringrec train` does ([`ringrec::train::config::parse_backend`]).
pub fn backend(s: &str) -> Result<BackendArg, String> {
    ringrec::train::config::parse_backend(&[s]).map(BackendArg)
}

/// Parses `--device` as `ringrec train` does (the setting's [`Word`]).
pub fn placement(s: &str) -> Result<Placement, String> {
    Placement::parse_word(s)
}

/// Flags of `ringrec train`: every setting of [`TrainConfig`], built from its table
/// ([`Settings`]), and the flags of this command's output.
#[derive(clap::Args, Debug, Clone)]
pub struct TrainArgs {
    /// The run's settings.
    #[command(flatten)]
    pub settings: Settings,
    /// Every rank keeps DIR/rank-<rank>.json with its progress (step, samples, samples/s;
    /// at most twice a second), for `ringrec serve`'s per-rank view.
    #[arg(long)]
    pub progress_dir: Option<PathBuf>,
    /// Print a final JSON summary (rank 0).
    #[arg(long)]
    pub json: bool,
    /// No progress bar.
    #[arg(long)]
    pub no_progress: bool,
}

/// The flags that are not settings of a run (`ringrec train` only): what the service sets
/// for every job, and the output's.
pub const OUTPUT_FLAGS: [&str; 3] = ["--progress-dir", "--json", "--no-progress"];

/// Every [`TrainConfig`] setting as a flag: the flag, help, value name and arity its
/// declaration gives ([`ringrec::settings`]), each value checked by its parser; the
/// default in the help. A setting not given on the command line keeps its default, or
/// takes its variable's value where the command line reads one
/// ([`ringrec::config::cli_default`]).
#[derive(Debug, Clone)]
pub struct Settings(pub TrainConfig);

fn arg(s: &'static Setting, defaults: &TrainConfig) -> Arg {
    let mut help = s.summary();
    let default = defaults.show(s.field).unwrap_or_default();
    if matches!(s.arity, Arity::Value | Arity::List) && !default.is_empty() && !help.contains("[default:") {
        help.push_str(&format!(" [default: {default}]"));
    }
    if let Some(env) = s.env {
        help.push_str(&format!(" [env: {env}]"));
    }
    let check = s.check;
    let a = Arg::new(s.field).long(s.long()).help(help);
    match s.arity {
        Arity::Switch => a.action(ArgAction::SetTrue),
        Arity::Value | Arity::Optional => a.action(ArgAction::Set).value_name(s.value_name).value_parser(move |v: &str| check(v).map(|()| v.to_string())),
        Arity::List => a.action(ArgAction::Append).value_name(s.value_name).value_delimiter(',').num_args(1..).value_parser(move |v: &str| check(v).map(|()| v.to_string())),
        Arity::Repeated => a.action(ArgAction::Append).value_name(s.value_name).value_parser(move |v: &str| check(v).map(|()| v.to_string())),
    }
}

impl clap::Args for Settings {
    fn augment_args(cmd: Command) -> Command {
        let defaults = TrainConfig::defaults();
        cmd.args(TrainConfig::all_settings().into_iter().map(|s| arg(s, &defaults)))
    }
    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl clap::FromArgMatches for Settings {
    fn from_arg_matches(m: &ArgMatches) -> Result<Settings, clap::Error> {
        let mut s = Settings(TrainConfig::defaults());
        s.update_from_arg_matches(m)?;
        Ok(s)
    }
    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        for s in TrainConfig::all_settings().into_iter() {
            let given = m.value_source(s.field) == Some(ValueSource::CommandLine);
            let values: Vec<String> = match s.arity {
                Arity::Switch if m.get_flag(s.field) => Vec::new(),
                Arity::Switch => continue,
                _ if given => m.get_many::<String>(s.field).into_iter().flatten().cloned().collect(),
                _ => match s.env.and_then(ringrec::config::cli_default) {
                    Some(v) => vec![v],
                    None => continue,
                },
            };
            let values: Vec<&str> = values.iter().map(String::as_str).collect();
            let what = if given { s.flag.to_string() } else { s.env.unwrap_or(s.flag).to_string() };
            self.0.set(s.field, &values).map_err(|e| clap::Error::raw(clap::error::ErrorKind::ValueValidation, format!("{what}: {e}\n")))?;
        }
        Ok(())
    }
}

/// Parses a size flag as `ringrec train` does.
pub use ringrec::train::config::size as bytes;

pub use ringrec::train::config::default_data_dir;

impl TrainArgs {
    /// The run these flags describe.
    pub fn config(&self) -> TrainConfig {
        self.settings.0.clone()
    }
}

fn print(s: &TrainSummary, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(s)?);
        return Ok(());
    }
    println!(
        "ringrec train: {} ranks on {} host(s), {} steps, {} samples in {:.1}s = {:.0} samples/s; train loss {:.4}; test logloss {} AUC {} NE {} calibration {}; peak RSS {:.0} MiB",
        s.ranks,
        s.hosts,
        s.steps,
        s.samples,
        s.train_seconds,
        s.samples_per_sec,
        s.train_loss,
        s.test_logloss.map_or("-".into(), |v| format!("{v:.4}")),
        s.test_auc.map_or("-".into(), |v| format!("{v:.4}")),
        s.test_ne.map_or("-".into(), |v| format!("{v:.4}")),
        s.test_calibration.map_or("-".into(), |v| format!("{v:.4}")),
        s.peak_rss_mib
    );
    if s.column_nulls.iter().any(|c| c.nulls != Some(0)) {
        let each: Vec<String> = s.column_nulls.iter().map(|c| format!("{} {}", c.column, c.nulls.map_or("?".to_string(), |n| n.to_string()))).collect();
        println!("nulls by column (read as empty fields; ? where a file's statistics do not count them): {}", each.join(", "));
    }
    if s.samples_merged + s.samples_dropped_by_weight > 0 {
        println!("sample weights: {} rows merged into identical ones, {} left out below --min-sample-weight", s.samples_merged, s.samples_dropped_by_weight);
    }
    let g = &s.gpu_cache;
    if g.slots > 0 {
        println!(
            "GPU hot-row cache: {} slots ({:.1} MiB) per rank, {}, hit rate {:.3}, {:.0} bytes uploaded and {:.0} downloaded per sample, {} rows refreshed",
            g.slots, g.mib, g.mode, g.hit_rate, g.bytes_uploaded_per_sample, g.bytes_downloaded_per_sample, g.rows_refreshed
        );
    }
    if s.table_growths + s.table_evictions + s.table_expirations + s.table_refused > 0 {
        println!(
            "table: {} rows in {} slots ({:.1} MiB); grew {} times ({:.2} s); {} rows evicted, {} expired; {} gradients of keys without a row dropped",
            s.table_rows,
            s.table_capacity,
            s.table_bytes as f64 / (1u64 << 20) as f64,
            s.table_growths,
            s.table_growth_seconds,
            s.table_evictions,
            s.table_expirations,
            s.table_refused
        );
    }
    Ok(())
}

/// Trains; rank 0 shows progress and prints the summary.
pub fn run(topo: &Topology, args: &TrainArgs) -> anyhow::Result<()> {
    let cfg = args.config();
    let mut bar: Option<indicatif::ProgressBar> = None;
    let mut ranks_file = args.progress_dir.as_deref().map(|d| super::progress::RankProgress::new(d, topo.rank, topo.size));
    let mut show = |p: &Progress| {
        if let Some(f) = ranks_file.as_mut() {
            f.update(p);
        }
        if topo.rank != 0 || args.no_progress {
            return;
        }
        let pb = bar.get_or_insert_with(|| {
            let pb = indicatif::ProgressBar::new(p.total_steps);
            pb.set_style(indicatif::ProgressStyle::with_template("{spinner} step {pos}/{len} [{bar:30}] {msg} ETA {eta}").unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()));
            pb
        });
        if let Some(loss) = p.loss {
            let auc = p.eval_auc.map_or(String::new(), |a| format!(" eval AUC {a:.4}"));
            pb.set_message(format!("epoch {} loss {loss:.4} {:.0} samples/s{auc}", p.epoch, p.samples_per_sec));
        }
        pb.set_position(p.step);
    };
    let summary = train::run(topo, &cfg, &mut show)?;
    if let Some(f) = ranks_file.as_mut() {
        f.finish();
    }
    if let Some(pb) = bar {
        pb.finish_and_clear();
    }
    if topo.rank == 0 {
        print(&summary, args.json)?;
    }
    Ok(())
}
