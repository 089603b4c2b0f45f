//! `ringrec serve`: the job service of design 004 — an HTTP JSON API and a live dashboard
//! over two cluster back ends (local mpirun, Slurm), with job records in SQLite that
//! survive the service's own death.
//!
//! - [`spec`]: the job spec and its validation into `ringrec train` flags
//! - [`state`]: the job states
//! - [`store`]: the SQLite records
//! - [`service`]: the worker (submit, poll, kill, re-attach) and the in-memory view
//! - [`backend`]: the `Cluster` trait, `local` and `slurm`
//! - [`supervise`]: the local back end's per-job process
//! - [`analyze`]: the likely cause of a failure, from the log
//! - [`tokens`]: bearer tokens, stored hashed
//! - [`api`]: the axum router; `dashboard.html` the page
//! - [`metrics`]: `GET /metrics` (Prometheus)
//!
//! All of it is binary-side: the library knows nothing of HTTP, tokio or SQLite.

pub mod analyze;
pub mod api;
pub mod backend;
pub mod metrics;
pub mod service;
pub mod spec;
pub mod state;
pub mod store;
pub mod supervise;
pub mod tokens;

use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};

use backend::slurm::Launcher;

/// Flags of `ringrec serve`.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// Token management (`token add NAME`); without a command, run the service.
    #[command(subcommand)]
    pub command: Option<ServeCommand>,
    /// Where the service keeps its database (jobs.db), tokens and job directories.
    #[arg(long, global = true)]
    pub state_dir: Option<PathBuf>,
    /// Address to listen on (port 0: any free port, printed at start).
    #[arg(long, default_value = "127.0.0.1:8750")]
    pub listen: String,
    /// A directory data paths of job specs may point into (repeat for several).
    #[arg(long = "data-root")]
    pub data_roots: Vec<PathBuf>,
    /// Local jobs running at once (the others wait, `queued`).
    #[arg(long, default_value_t = 2)]
    pub local_slots: usize,
    /// Niceness of local jobs (0-19): training yields the CPU to the service's answers.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(i32).range(0..=19))]
    pub local_nice: i32,
    /// No Slurm back end, even where `sbatch` exists.
    #[arg(long)]
    pub no_slurm: bool,
    /// How Slurm jobs start their ranks: srun --mpi=pmix, mpirun inside the allocation, or
    /// auto (srun when Slurm's PMIx plugin is present).
    #[arg(long, value_enum, default_value = "auto")]
    pub slurm_launcher: Launcher,
    /// The Slurm partition (default: the cluster's default).
    #[arg(long)]
    pub slurm_partition: Option<String>,
    /// Milliseconds between polls of the clusters.
    #[arg(long, default_value_t = 500)]
    pub poll_ms: u64,
    /// Seconds a killed job may take to stop gracefully (checkpoint) before it is ended.
    #[arg(long, default_value_t = 30)]
    pub kill_grace_secs: u64,
    /// The most ranks a job may ask for.
    #[arg(long, default_value_t = 64)]
    pub max_ranks: u32,
    /// The largest request body, in bytes.
    #[arg(long, default_value_t = 64 << 10)]
    pub max_body: usize,
}

/// `ringrec serve` subcommands.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum ServeCommand {
    /// Bearer tokens: `add NAME` (prints the new token once, as the last word), `list`, `remove NAME`.
    #[command(subcommand)]
    Token(TokenCommand),
    /// The local back end's per-job supervisor (started by the service).
    #[command(hide = true)]
    Supervise(supervise::SuperviseArgs),
}

/// `ringrec serve token ...`.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum TokenCommand {
    /// Make a token named NAME; it is shown once and stored hashed.
    Add {
        /// Letters, digits and `_.-`.
        name: String,
    },
    /// The tokens' names.
    List,
    /// Remove the token named NAME.
    Remove {
        /// Its name.
        name: String,
    },
}

fn state_dir(args: &ServeArgs) -> anyhow::Result<PathBuf> {
    let Some(d) = &args.state_dir else { bail!("--state-dir DIR is required (where the service keeps its database, tokens and jobs)") };
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(d).with_context(|| format!("creating the state directory {}", d.display()))?;
    std::fs::canonicalize(d).with_context(|| format!("resolving {}", d.display()))
}

/// Runs `ringrec serve ...`; the process' exit status.
pub fn run(args: &ServeArgs) -> anyhow::Result<i32> {
    match &args.command {
        Some(ServeCommand::Supervise(a)) => supervise::run(a),
        Some(ServeCommand::Token(t)) => {
            let dir = state_dir(args)?;
            match t {
                TokenCommand::Add { name } => {
                    let token = tokens::add(&dir, name)?;
                    println!("ringrec serve: token `{name}` added to {} (stored hashed; shown this once):", tokens::path(&dir).display());
                    println!("token {token}");
                }
                TokenCommand::List => {
                    for n in tokens::names(&dir)? {
                        println!("{n}");
                    }
                }
                TokenCommand::Remove { name } => {
                    if !tokens::remove(&dir, name)? {
                        bail!("there is no token named `{name}` in {}", tokens::path(&dir).display());
                    }
                    println!("ringrec serve: token `{name}` removed");
                }
            }
            Ok(0)
        }
        None => serve(args).map(|_| 0),
    }
}

/// Holds `serve.lock` in the state directory: one service per directory.
fn lock_state(dir: &Path) -> anyhow::Result<std::fs::File> {
    use std::os::unix::io::AsRawFd;
    let p = dir.join("serve.lock");
    let f = std::fs::OpenOptions::new().create(true).truncate(false).write(true).mode(0o600).open(&p).with_context(|| format!("opening {}", p.display()))?;
    // SAFETY: flock on an open descriptor; held while `f` lives.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        bail!("another `ringrec serve` uses {} (it holds {}); stop it or give another --state-dir", dir.display(), p.display());
    }
    Ok(f)
}

fn serve(args: &ServeArgs) -> anyhow::Result<()> {
    let dir = state_dir(args)?;
    let _lock = lock_state(&dir)?;
    let addr: SocketAddr = args.listen.parse().with_context(|| format!("--listen {}: not an address like 127.0.0.1:8750", args.listen))?;
    if !addr.ip().is_loopback() {
        ringrec::eprint_line(&format!("ringrec serve: warning: listening on {addr}, beyond this machine; tokens travel in clear text (no TLS): put a TLS proxy in front"));
    }
    let toks = tokens::Tokens::open(&dir)?;
    if toks.count() == 0 {
        ringrec::eprint_line(&format!("ringrec serve: no tokens yet: make one with `ringrec serve token add NAME --state-dir {}`", dir.display()));
    }
    let exe = backend::ringrec_exe()?;
    let help = std::process::Command::new(&exe).args(["train", "--help"]).output().context("running `ringrec train --help` to learn its flags")?;
    let mut roots = Vec::new();
    for r in &args.data_roots {
        roots.push(std::fs::canonicalize(r).with_context(|| format!("--data-root {}: it must be an existing directory", r.display()))?);
    }
    let mut backends: Vec<Arc<dyn backend::Cluster>> = vec![Arc::new(backend::local::Local::new(exe.clone(), dir.join("slots"), args.local_slots, args.local_nice)?)];
    if !args.no_slurm && backend::slurm::available() {
        backends.push(Arc::new(backend::slurm::Slurm::new(exe.clone(), args.slurm_launcher, &dir, args.slurm_partition.clone())));
    }
    let limits = spec::Limits { data_roots: roots, max_ranks: args.max_ranks.max(1), train_flags: spec::flags_of_help(&String::from_utf8_lossy(&help.stdout)), slurm: backends.len() > 1 };
    let cfg = service::Config { state_dir: dir.clone(), poll: Duration::from_millis(args.poll_ms.max(50)), kill_grace: Duration::from_secs(args.kill_grace_secs), limits };
    let svc = service::Service::start(cfg, backends)?;
    let state = Arc::new(api::AppState { service: svc.clone(), tokens: toks, metrics: Default::default() });
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().context("starting the async runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("listening on {addr} (in use? pick another --listen)"))?;
        let bound = listener.local_addr()?;
        println!("ringrec serve: listening on http://{bound} (state in {}; {})", dir.display(), svc.describe_backends().join("; "));
        let _ = std::io::stdout().flush();
        let app = api::router(state, args.max_body);
        axum::serve(listener, app).with_graceful_shutdown(shutdown()).await.context("serving HTTP")
    })?;
    ringrec::eprint_line("ringrec serve: stopped (jobs keep running; a restart re-attaches to them)");
    Ok(())
}

/// Resolves at SIGTERM or SIGINT (`ringrec serve-model` stops on them too).
pub async fn shutdown() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
