//! `ringrec clean`: removes what killed jobs left behind — shared segments and host tables in
//! the shared-memory directory, temporaries of interrupted writes and lock files of killed
//! preparations in checkpoint and data directories — never a file of a live job (the rules are [`ringrec::stale`]'s).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use ringrec::stale;

/// Flags of `ringrec clean`.
#[derive(clap::Args, Debug, Clone)]
pub struct CleanArgs {
    /// The shared-memory directory to sweep (default: RINGREC_SHM_DIR, else /dev/shm).
    #[arg(long, value_name = "DIR")]
    pub shm_dir: Option<PathBuf>,
    /// Checkpoint and data directories whose interrupted writes and stale lock files to
    /// remove (each, and the directories directly inside it, such as a data directory's
    /// cache/).
    #[arg(value_name = "DIR")]
    pub dirs: Vec<PathBuf>,
    /// Only list what would be removed.
    #[arg(long)]
    pub dry_run: bool,
}

/// Runs `ringrec clean`: one line per file removed (or that would be) with its size, then
/// the total.
pub fn run(args: &CleanArgs) -> anyhow::Result<()> {
    let shm_dir = match &args.shm_dir {
        Some(d) => d.clone(),
        None => ringrec::config::RuntimeConfig::from_env().context("reading RINGREC_SHM_DIR")?.shm_dir,
    };
    let mut found = Vec::new();
    for d in std::iter::once(&shm_dir).chain(&args.dirs) {
        if !d.is_dir() {
            bail!("{}: not a directory; give an existing shared-memory, checkpoint or data directory", d.display());
        }
    }
    found.extend(if args.dry_run { stale::stale_shm(&shm_dir) } else { stale::sweep_shm(&shm_dir) });
    for d in &args.dirs {
        for dir in std::iter::once(d.clone()).chain(subdirectories(d)) {
            found.extend(if args.dry_run { stale::stale_temporaries(&dir) } else { stale::sweep_temporaries(&dir) });
            found.extend(if args.dry_run { stale::stale_locks(&dir) } else { stale::sweep_locks(&dir) });
        }
    }
    let verb = if args.dry_run { "would remove" } else { "removed" };
    let mut out = String::new();
    for (path, bytes) in &found {
        out.push_str(&format!("{verb} {} ({bytes} bytes)\n", path.display()));
    }
    let total: u64 = found.iter().map(|(_, b)| b).sum();
    let note = if args.dry_run { " (dry run: nothing removed)" } else { "" };
    out.push_str(&format!("ringrec clean: {verb} {} file(s), {total} bytes{note}\n", found.len()));
    print!("{out}");
    Ok(())
}

/// The directories directly inside `dir`, hidden ones (temporaries among them) left out;
/// links not followed.
fn subdirectories(dir: &Path) -> Vec<PathBuf> {
    let mut subs: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| e.path())
        .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()))
        .collect();
    subs.sort();
    subs
}
