//! `ringrec serve supervise --job-dir DIR` (hidden): the local back end's per-job process.
//! In a session of its own (a killed service does not take it along), it holds
//! `supervisor.lock` for its whole life, waits for a free slot (`queued`), runs the
//! command of `launch.json` with its output appended to the job's `log` (`running`),
//! passes each SIGTERM/SIGINT it gets on to it, and writes `exit.json` last.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};

use super::backend::local::{lock_path, phase_path, ExitRecord, LaunchFile};

/// Flags of `ringrec serve supervise`.
#[derive(clap::Args, Debug, Clone)]
pub struct SuperviseArgs {
    /// The job's directory (holds launch.json; gets log, phase and exit.json).
    #[arg(long)]
    pub job_dir: PathBuf,
}

fn try_lock(f: &std::fs::File) -> bool {
    // SAFETY: flock on an open descriptor; the lock lives as long as the descriptor.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

fn write_small(path: &Path, text: &str) -> anyhow::Result<()> {
    ringrec::fileio::write_atomic(path, ringrec::fileio::PRIVATE, |w| std::io::Write::write_all(w, text.as_bytes()))?;
    Ok(())
}

fn finish(dir: &Path, rec: &ExitRecord) -> anyhow::Result<i32> {
    write_small(&dir.join("exit.json"), &serde_json::to_string(rec)?)?;
    Ok(0)
}

/// Runs the job; the supervisor's own exit status (0 once `exit.json` is written).
pub fn run(args: &SuperviseArgs) -> anyhow::Result<i32> {
    // SAFETY: setsid has no preconditions; it fails only for a group leader, which a
    // freshly spawned child is not.
    unsafe { libc::setsid() };
    ringrec::signals::install_counting();
    let dir = &args.job_dir;
    let lock_file = lock_path(dir);
    let lock = OpenOptions::new().create(true).truncate(false).write(true).mode(0o600).open(&lock_file).with_context(|| format!("opening {}", lock_file.display()))?;
    // The service probes the lock for liveness, briefly: retry for a second.
    let mut tries = 0;
    while !try_lock(&lock) {
        tries += 1;
        if tries > 50 {
            bail!("{}: another supervisor runs this job", lock_file.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    write_small(&dir.join("supervisor.json"), &serde_json::json!({ "pid": std::process::id() }).to_string())?;
    let launch: LaunchFile = serde_json::from_slice(&std::fs::read(dir.join("launch.json")).context("reading launch.json")?).context("parsing launch.json")?;
    let Some((program, rest)) = launch.argv.split_first() else { bail!("launch.json: an empty command") };
    write_small(&phase_path(dir), "queued")?;
    // A free slot: the first slot file nobody holds a lock on.
    let _slot = loop {
        let (n, sig) = ringrec::signals::received();
        if n > 0 {
            return finish(dir, &ExitRecord { code: Some(128 + sig), signal: None, before_start: true });
        }
        let mut got = None;
        for k in 0..launch.slots {
            let p = launch.slots_dir.join(format!("slot-{k}"));
            let f = OpenOptions::new().create(true).truncate(false).write(true).mode(0o600).open(&p).with_context(|| format!("opening the slot file {}", p.display()))?;
            if try_lock(&f) {
                got = Some(f);
                break;
            }
        }
        if let Some(f) = got {
            break f;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    if launch.nice != 0 {
        // SAFETY: nice(2) changes only this process' priority (its children inherit it).
        unsafe { libc::nice(launch.nice) };
    }
    let log = OpenOptions::new().create(true).append(true).open(dir.join("log")).context("opening the job's log")?;
    let mut child = Command::new(program)
        .args(rest)
        .envs(launch.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {program}"))?;
    write_small(&phase_path(dir), "running")?;
    let mut passed = 0;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        let (n, _) = ringrec::signals::received();
        while passed < n {
            passed += 1;
            // SAFETY: signalling our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // The record is written while the lock is still held (it goes with the process).
    let code = finish(dir, &ExitRecord { code: status.code(), signal: status.signal(), before_start: false });
    drop(lock);
    code
}
