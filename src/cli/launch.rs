//! `ringrec launch`: the counterpart of horovodrun. Runs `mpirun` with the flags a ringrec
//! job wants, passes SIGTERM/SIGINT on to the ranks as a graceful stop, and after a failure
//! relaunches `train` from its newest checkpoint, up to `--restarts` times.
//!
//! mpirun flags: `--oversubscribe`; `--bind-to core` when the ranks of this machine equal
//! its cores, else `--bind-to none` (a rank runs several threads); `--allow-run-as-root`
//! as root; every `RINGREC_*` variable exported to the ranks. Open MPI's kill sequence
//! (`odls_base_sigkill_timeout`) stays at its default of 1 s: once a rank has ended,
//! mpirun sends SIGCONT, sleeps that long, SIGTERM, sleeps again, SIGKILL — and it sleeps
//! even when the others have already exited, so a long one only delays the job's end (a
//! graceful stop needs none: every rank checkpoints and passes MPI_Finalize before any
//! exits).
//!
//! Signals: Open MPI's mpirun ends MPI ranks on SIGTERM without passing it on, but forwards
//! SIGUSR1; the launcher runs mpirun in its own process group (a terminal's Ctrl-C reaches
//! only the launcher) and turns the first SIGTERM/SIGINT into a SIGUSR1 to mpirun: every
//! rank stops after the same step, checkpoints and exits. A second signal ends the job at
//! once (SIGTERM to mpirun, then SIGKILL). The launcher exits with 128 + the signal.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// Flags of `ringrec launch`.
#[derive(clap::Args, Debug, Clone)]
#[command(trailing_var_arg = true)]
pub struct LaunchArgs {
    /// Ranks to start (`-np N` as with mpirun, or `-n N`).
    #[arg(short = 'n', long = "np", default_value_t = 2)]
    pub np: usize,
    /// Hosts and slots, mpirun's syntax (`host1:4,host2:4`); default: this machine.
    #[arg(short = 'H', long)]
    pub hosts: Option<String>,
    /// Relaunch a failed `train` from its newest checkpoint up to this many times (needs
    /// `--checkpoint-dir`).
    #[arg(long, default_value_t = 0)]
    pub restarts: u32,
    /// Extra mpirun arguments (repeat; e.g. `--mpirun-arg=--mca --mpirun-arg=btl ...`).
    #[arg(long = "mpirun-arg", allow_hyphen_values = true)]
    pub mpirun_args: Vec<String>,
    /// The ringrec command to run on every rank (e.g. `train --epochs 2`).
    #[arg(required = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

/// `ringrec launch -np N ...` spelled as clap reads it (`--np N`): mpirun's single-dash
/// long option, before the `--` that starts the ranks' command. Other commands unchanged.
pub fn mpirun_spelling(mut args: Vec<String>) -> Vec<String> {
    if args.get(1).map(String::as_str) == Some("launch") {
        for a in args.iter_mut().skip(2).take_while(|a| a.as_str() != "--") {
            if a == "-np" {
                *a = "--np".into();
            }
        }
    }
    args
}

/// The value of `--flag VALUE` or `--flag=VALUE` in `args`.
fn flag_value(args: &[String], flag: &str) -> Option<String> {
    let eq = format!("{flag}=");
    args.iter().enumerate().find_map(|(i, a)| if a == flag { args.get(i + 1).cloned() } else { a.strip_prefix(&eq).map(str::to_string) })
}

/// The step of the newest checkpoint in `dir`, when there is one.
fn checkpoint_step(dir: &Path) -> Option<u64> {
    ringrec::train::checkpoint::latest_step(dir).or_else(|| ringrec::train::checkpoint::list(dir).first().map(|c| c.0))
}

fn cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// The mpirun command line for one attempt.
fn mpirun(args: &LaunchArgs, command: &[String]) -> anyhow::Result<Command> {
    let exe = std::env::current_exe().context("finding the ringrec binary")?;
    let mut c = Command::new("mpirun");
    c.arg("--oversubscribe");
    let bind = if args.hosts.is_none() && args.np == cores() { "core" } else { "none" };
    c.args(["--bind-to", bind]);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        c.arg("--allow-run-as-root");
    }
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("RINGREC_")) {
        c.args(["-x", &k]);
    }
    if let Some(h) = &args.hosts {
        c.args(["-H", h]);
    }
    c.args(&args.mpirun_args);
    c.args(["-np", &args.np.to_string()]);
    c.arg(exe).args(command);
    // Its own process group: a terminal's signals reach the launcher, which decides.
    c.process_group(0);
    Ok(c)
}

/// Waits for mpirun, turning signals into a graceful stop (first) or a kill (second).
/// Returns its status and the signal that stopped the job, if one did.
fn supervise(child: &mut std::process::Child) -> anyhow::Result<(ExitStatus, Option<i32>)> {
    let pid = child.id() as i32;
    let mut forwarded = 0;
    let mut killed_at: Option<Instant> = None;
    loop {
        if let Some(status) = child.try_wait()? {
            let (n, sig) = ringrec::signals::received();
            return Ok((status, (n > 0).then_some(sig)));
        }
        let (n, sig) = ringrec::signals::received();
        if n > forwarded {
            forwarded = n;
            if n == 1 {
                ringrec::eprint_line(&format!("ringrec launch: {} received: asking every rank to stop after its current step and checkpoint (again to stop at once)", ringrec::signals::name(sig)));
                // SAFETY: signalling our own child.
                unsafe { libc::kill(pid, libc::SIGUSR1) };
            } else if killed_at.is_none() {
                ringrec::eprint_line("ringrec launch: second signal: ending the job now");
                // SAFETY: as above.
                unsafe { libc::kill(pid, libc::SIGTERM) };
                killed_at = Some(Instant::now());
            }
        }
        if killed_at.is_some_and(|t| t.elapsed() > Duration::from_secs(5)) {
            // SAFETY: as above; mpirun did not end the job in time.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn describe(status: &ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => "unknown status".into(),
    }
}

/// Runs the job, relaunching as configured; the process' exit status.
pub fn run(args: &LaunchArgs) -> anyhow::Result<i32> {
    ringrec::signals::install_counting();
    let mut command = args.command.clone();
    let is_train = command.first().is_some_and(|c| c == "train");
    let ckpt: Option<PathBuf> = flag_value(&command, "--checkpoint-dir").map(PathBuf::from);
    if args.restarts > 0 && !(is_train && ckpt.is_some()) {
        bail!("--restarts needs a `train` command with --checkpoint-dir (a relaunch continues from the newest checkpoint)");
    }
    let mut attempt = 0;
    loop {
        attempt += 1;
        let mut child = mpirun(args, &command)?.spawn().context("starting mpirun (run scripts/setup.sh to install Open MPI)")?;
        let (status, signal) = supervise(&mut child)?;
        if status.success() {
            return Ok(0);
        }
        if let Some(sig) = signal {
            ringrec::eprint_line(&format!("ringrec launch: the job stopped on {} ({})", ringrec::signals::name(sig), describe(&status)));
            return Ok(128 + sig);
        }
        let left = args.restarts + 1 - attempt;
        if left == 0 {
            ringrec::eprint_line(&format!("ringrec launch: attempt {attempt} ended with {}; no restarts left", describe(&status)));
            return Ok(status.code().unwrap_or(1).max(1));
        }
        let from = ckpt.as_deref().and_then(checkpoint_step);
        if from.is_some() && !command.iter().any(|a| a == "--resume") {
            command.push("--resume".into());
        }
        ringrec::eprint_line(&format!(
            "ringrec launch: attempt {attempt} ended with {}; relaunching {} ({left} restart(s) left)",
            describe(&status),
            match from {
                Some(s) => format!("from the checkpoint of step {s}"),
                None => "from the start (no checkpoint yet)".into(),
            }
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_found_in_both_spellings() {
        let a: Vec<String> = ["train", "--checkpoint-dir", "/x", "--epochs=2"].iter().map(|s| s.to_string()).collect();
        assert_eq!(flag_value(&a, "--checkpoint-dir").as_deref(), Some("/x"));
        assert_eq!(flag_value(&a, "--epochs").as_deref(), Some("2"));
        assert_eq!(flag_value(&a, "--seed"), None);
    }
}
