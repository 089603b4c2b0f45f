//! No leaked files, no SIGBUS (issue 20), under real mpirun, each job with a shared-memory
//! directory of its own test (`RINGREC_SHM_DIR`), so a test sees only its own files.
//! (b) a rank SIGKILLed at seeded moments of start-up, while the host table is created or
//! copied from a checkpoint (`--resume`): whatever the kill leaves is gone after the next
//! job's start, or after `ringrec clean`; (c) a live job's segments, older than the sweep's
//! minimum age, survive `ringrec clean` and the job ends normally; (f) a shared-memory
//! directory too small for a segment: a clear error on every rank naming the directory and
//! the bytes needed and free, no SIGBUS, nothing left.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use common::TempDir;

/// Host-table slots of the killed jobs: creating (or copying) the table takes ~1 s in the
/// debug build, so the seeded kills land in it.
const CAPACITY: &str = "8388608";

/// Kills of the start-up test.
const KILLS: u64 = 8;

/// Where Open MPI's shared-memory transport puts its own segments (default /dev/shm): in the
/// test's data directory, so that what the killed ranks leave of Open MPI's goes with it.
const VADER_DIR: &str = "OMPI_MCA_btl_vader_backing_directory";

fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_ringrec")
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A seeded number in `0..n`.
fn pick(seed: u64, salt: u64, n: u64) -> u64 {
    ringrec::hash::splitmix64(seed.wrapping_mul(0x9E37) ^ salt) % n.max(1)
}

/// A test's own shared-memory directory (on tmpfs, like /dev/shm, where there is one) and
/// data directory.
struct Dirs {
    shm: TempDir,
    data: TempDir,
}

impl Dirs {
    fn new(name: &str) -> Dirs {
        let shm = if Path::new("/dev/shm").is_dir() {
            let p = PathBuf::from(format!("/dev/shm/hygiene-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).expect("shm dir");
            TempDir(p)
        } else {
            TempDir::new(&format!("hygiene-shm-{name}"))
        };
        Dirs { shm, data: TempDir::new(&format!("hygiene-data-{name}")) }
    }

    /// `ringrec train` on 2 ranks as job `job` with `args`, killed past `limit`.
    fn train(&self, job: &str, args: &[&str], limit: Duration) -> common::Job {
        let (shm, data) = (self.shm.0.display().to_string(), self.data.0.display().to_string());
        let env = [("RINGREC_SHM_DIR", shm.as_str()), ("RINGREC_DATA_DIR", data.as_str()), ("RINGREC_JOB_ID", job), ("RINGREC_COMM_TIMEOUT_SECONDS", "30"), (VADER_DIR, data.as_str())];
        let mut all = vec!["train", "--no-progress", "--json", "--no-eval", "--synth-rows", "6000", "--batch", "240"];
        all.extend_from_slice(args);
        common::mpirun_exe(Path::new(exe()), 2, &env, &all, limit)
    }

    /// `ringrec clean --shm-dir <shm> <dirs>`: its stdout.
    fn clean(&self, dirs: &[&Path]) -> String {
        let out = Command::new(exe()).arg("clean").arg("--shm-dir").arg(&self.shm.0).args(dirs).output().expect("ringrec clean");
        assert!(out.status.success(), "ringrec clean: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The files of job `job` in the shared-memory directory, with their sizes.
    fn files_of(&self, job: &str) -> Vec<(String, u64)> {
        let prefix = format!("ringrec-{job}-h");
        let mut v: Vec<(String, u64)> = std::fs::read_dir(&self.shm.0)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                Some((name.clone(), e.metadata().ok()?.len())).filter(|_| name.starts_with(&prefix))
            })
            .collect();
        v.sort();
        v
    }
}

/// Moves the mtime of `path` `secs` seconds back: what the file looks like to a sweep that
/// runs that much later (the sweep leaves files younger than `stale::MIN_AGE` alone).
fn backdate(path: &Path, secs: u64) {
    let f = std::fs::File::open(path).expect("open to backdate");
    f.set_modified(SystemTime::now() - Duration::from_secs(secs)).expect("set mtime");
}

/// Waits until job `job` has `np` rank processes; their pids.
fn wait_for_ranks(job: &str, np: usize, limit: Duration) -> Vec<i32> {
    let t = Instant::now();
    loop {
        let ranks = common::rank_pids(job);
        if ranks.len() == np {
            return ranks.into_iter().map(|(_, p)| p).collect();
        }
        assert!(t.elapsed() < limit, "job {job}: {} of {np} ranks after {limit:?}", ranks.len());
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits until the processes `pids` of job `job` are gone (mpirun may return before the
/// last has exited; an exiting process holds its files, and their locks, to the end).
fn wait_gone(job: &str, pids: &[i32]) {
    // Every thread: a process whose main thread is already a zombie may have a thread still
    // exiting (out of a long syscall), which holds the process' files and their locks.
    let alive = |p: &i32| {
        let tasks = std::fs::read_dir(format!("/proc/{p}/task")).into_iter().flatten().flatten();
        ringrec::stale::pid_alive(*p) || tasks.filter_map(|t| t.file_name().to_str()?.parse().ok()).any(ringrec::stale::pid_alive)
    };
    let t = Instant::now();
    while pids.iter().any(alive) {
        assert!(t.elapsed() < Duration::from_secs(30), "job {job}: ranks still running 30 s after mpirun returned");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(pids: &[i32], sig: i32) {
    for p in pids {
        // SAFETY: signalling a rank process of a job this test started.
        unsafe { libc::kill(*p, sig) };
    }
}

/// SIGSTOP to `pids`, returning once every thread of every one is stopped (a signal is
/// delivered asynchronously, and a thread inside a long syscall, such as allocating a
/// table, stops only when it returns).
fn freeze(pids: &[i32]) {
    signal(pids, libc::SIGSTOP);
    let task_stopped = |stat: String| matches!(stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()), Some('T') | Some('t') | None);
    let stopped = |p: &i32| {
        let tasks = std::fs::read_dir(format!("/proc/{p}/task")).into_iter().flatten().flatten();
        tasks.map(|t| std::fs::read_to_string(t.path().join("stat")).unwrap_or_default()).all(task_stopped)
    };
    let t = Instant::now();
    while !pids.iter().all(stopped) {
        assert!(t.elapsed() < Duration::from_secs(5), "the ranks did not stop");
        std::thread::yield_now();
    }
}

#[test]
fn what_killed_start_ups_leave_is_gone_after_the_next_start_or_clean() {
    let dirs = Dirs::new("kill");
    let pid = std::process::id();
    let ck = dirs.data.path("ck");
    let ckd = ck.to_str().expect("utf-8 path");
    // The checkpoint the resumed starts copy their table from (and the data set, cached).
    let first = dirs.train(&format!("hyg-ck-{pid}"), &["--max-steps", "2", "--table-capacity", CAPACITY, "--checkpoint-dir", ckd, "--checkpoint-every", "2"], Duration::from_secs(120));
    first.assert_ok();
    assert!(std::fs::read_dir(&ck).is_ok_and(|mut d| d.next().is_some()), "a checkpoint was written");
    let start = Instant::now();
    let mut left_total = 0usize;
    for k in 0..KILLS {
        let resume = k % 2 == 1;
        let by_clean = (k / 2) % 2 == 1;
        // Mostly the leader (it creates the files), mostly while the table is filled.
        let victim = usize::from(pick(k, 1, 3) == 0);
        let at_table = pick(k, 3, 3) != 0;
        let delay = Duration::from_millis(pick(k, 2, if at_table { 600 } else { 1200 }));
        let job = format!("hyg-kill{k}-{pid}");
        let mut args = vec!["--max-steps", "1000", "--table-capacity", CAPACITY];
        if resume {
            args.extend(["--checkpoint-dir", ckd, "--resume"]);
        }
        let (done, left) = std::thread::scope(|s| {
            let run = s.spawn(|| dirs.train(&job, &args, Duration::from_secs(60)));
            let ranks = wait_for_ranks(&job, 2, Duration::from_secs(30));
            let t = Instant::now();
            while at_table && !dirs.files_of(&job).iter().any(|(n, _)| n.ends_with("-table")) {
                assert!(t.elapsed() < Duration::from_secs(30) && !run.is_finished(), "kill {k}: the host table never appeared");
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(delay);
            signal(&ranks[victim..=victim], libc::SIGKILL);
            let done = run.join().expect("job thread");
            wait_gone(&job, &ranks);
            (done, dirs.files_of(&job))
        });
        assert!(!done.timed_out && done.code != Some(0), "kill {k}: the job must fail, in bounded time:\n{}", done.all());
        let moment = format!("{} ms after {}", delay.as_millis(), if at_table { "the table file appeared" } else { "the ranks started" });
        eprintln!("kill {k}: rank {victim} {moment} in {}; left {left:?}; removed by {}", if resume { "a --resume" } else { "a fresh start" }, if by_clean { "ringrec clean" } else { "the next start" });
        left_total += left.len();
        // As a sweep a while later sees them.
        for (name, _) in &left {
            backdate(&dirs.shm.path(name), 60);
        }
        if by_clean {
            let out = dirs.clean(&[&ck]);
            for (name, bytes) in &left {
                assert!(out.contains(&format!("removed {} ({bytes} bytes)", dirs.shm.path(name).display())), "kill {k}: clean must list {name}:\n{out}");
            }
            let total: u64 = left.iter().map(|(_, b)| b).sum();
            assert!(out.contains(&format!("ringrec clean: removed {} file(s), {total} bytes", left.len())), "kill {k}:\n{out}");
        } else {
            let next = dirs.train(&format!("hyg-next{k}-{pid}"), &["--max-steps", "1"], Duration::from_secs(120));
            next.assert_ok();
            if !left.is_empty() {
                let line = format!("ringrec: removed {} stale file(s) of ended jobs from {}", left.len(), dirs.shm.0.display());
                assert!(next.stderr.contains(&line), "kill {k}: the next start must say what it removed:\n{}", next.stderr);
            }
        }
        assert_eq!(dirs.files_of(&job), vec![], "kill {k}: files of the killed job are left");
    }
    eprintln!("{KILLS} kills, {left_total} files left by them and removed, {:.1} s", start.elapsed().as_secs_f64());
    // The seeded moments must hit the table's window, or this test proves nothing.
    assert!(left_total >= 2, "only {left_total} kills left a file: the seeded moments miss start-up");
    assert_eq!(std::fs::read_dir(&dirs.shm.0).expect("shm dir").count(), 0, "nothing at all is left");
}

#[test]
fn a_live_jobs_segments_survive_clean_and_the_job_ends_normally() {
    let dirs = Dirs::new("live");
    let job = format!("hyg-live-{}", std::process::id());
    // Warm the data set so the job below starts fast.
    dirs.train(&format!("{job}-warm"), &["--max-steps", "1"], Duration::from_secs(120)).assert_ok();
    let (done, caught, out) = std::thread::scope(|s| {
        let run = s.spawn(|| dirs.train(&job, &["--epochs", "100", "--max-steps", "60"], Duration::from_secs(120)));
        let ranks = wait_for_ranks(&job, 2, Duration::from_secs(30));
        // Freeze both ranks while a segment of theirs exists and is locked by its creator
        // (the moments it exists unlocked, right after its creation, are what the sweep's
        // minimum age protects).
        let t = Instant::now();
        let caught = loop {
            assert!(t.elapsed() < Duration::from_secs(60) && !run.is_finished(), "never saw a segment of the live job");
            let locked = |files: &[(String, u64)]| files.iter().any(|(n, _)| ringrec::fileio::is_locked(&dirs.shm.path(n)));
            if !locked(&dirs.files_of(&job)) {
                continue;
            }
            freeze(&ranks);
            let now: Vec<(String, u64)> = dirs.files_of(&job).into_iter().filter(|(n, _)| ringrec::fileio::is_locked(&dirs.shm.path(n))).collect();
            if !now.is_empty() {
                break now;
            }
            signal(&ranks, libc::SIGCONT);
        };
        // As old as a long job's: only the lock keeps them.
        for (name, _) in &caught {
            backdate(&dirs.shm.path(name), 60);
        }
        let out = dirs.clean(&[]);
        let still = dirs.files_of(&job);
        signal(&ranks, libc::SIGCONT);
        assert_eq!(still, caught, "clean removed a live job's segment:\n{out}");
        (run.join().expect("job thread"), caught, out)
    });
    eprintln!("froze the job with {caught:?} in the directory; clean said: {}", out.trim());
    assert!(out.contains("ringrec clean: removed 0 file(s), 0 bytes"), "{out}");
    done.assert_ok();
    assert!(done.stdout.contains("\"global_step\":60"), "the job ran to its end:\n{}", done.stdout);
    assert_eq!(dirs.files_of(&job), vec![]);
}

/// Unmounts its tmpfs when dropped (before its directory is removed).
struct Mount(TempDir);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0 .0).status();
    }
}

/// 2-rank training with the default table capacity on a tmpfs of `size` as the shared-memory
/// directory: every rank fails with the directory and the bytes needed and free named, no
/// SIGBUS, nothing left. Skipped (saying why) when not root or the mount fails.
fn full_tmpfs(size: &str) {
    if !is_root() {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    let dir = TempDir::new(&format!("hygiene-tmpfs-{size}"));
    let mounted = Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"]).arg(&dir.0).status();
    if !mounted.is_ok_and(|s| s.success()) {
        eprintln!("skipped: cannot mount a tmpfs of {size} on {}", dir.0.display());
        return;
    }
    let mount = Mount(dir);
    let data = TempDir::new("hygiene-tmpfs-data");
    let (shm, dd) = (mount.0 .0.display().to_string(), data.0.display().to_string());
    let job = format!("hyg-full-{size}-{}", std::process::id());
    let env = [("RINGREC_SHM_DIR", shm.as_str()), ("RINGREC_DATA_DIR", dd.as_str()), ("RINGREC_JOB_ID", job.as_str()), ("RINGREC_COMM_TIMEOUT_SECONDS", "30"), (VADER_DIR, dd.as_str())];
    let args = ["train", "--no-progress", "--synth-rows", "6000", "--batch", "240", "--max-steps", "3"];
    let done = common::mpirun_exe(Path::new(exe()), 2, &env, &args, Duration::from_secs(120));
    assert!(!done.timed_out && done.code.is_some_and(|c| c != 0 && c != 128 + libc::SIGBUS), "a clear failure, not a SIGBUS (exit 135):\n{}", done.all());
    assert!(!done.all().contains("Bus error"), "{}", done.all());
    for r in 0..2 {
        let line = done.stderr.lines().find(|l| l.starts_with(&format!("ringrec rank {r}: error:")));
        let line = line.unwrap_or_else(|| panic!("rank {r} printed no error:\n{}", done.all()));
        assert!(line.contains(&format!("bytes free in {shm}")) && line.contains("needs "), "rank {r} must name the directory and the bytes needed and free: {line}");
    }
    let left: Vec<_> = std::fs::read_dir(&mount.0 .0).expect("tmpfs").flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "left in the tmpfs: {left:?}");
}

#[test]
fn a_shared_memory_directory_too_small_for_a_segment_is_a_clear_error_on_every_rank() {
    // 2 MiB: the heartbeat fits, the first collective's 4 MiB segment does not.
    full_tmpfs("2m");
}

#[test]
fn a_shared_memory_directory_too_small_for_the_host_table_is_a_clear_error_on_every_rank() {
    // 20 MiB: every segment fits, the default host table (151 MB) does not.
    full_tmpfs("20m");
}
