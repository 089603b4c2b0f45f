//! Stale files: what a killed job leaves behind, found and removed without ever touching a
//! live job's.
//!
//! Two kinds:
//! - **Shared segments and host tables** in the shared-memory directory (`RINGREC_SHM_DIR`,
//!   default `/dev/shm`), named `ringrec-<job>-h<host>-<tag>` ([`crate::shm::segment_path`]).
//!   A job unlinks them as soon as every local rank mapped them; a kill before that leaves
//!   one behind (a host table: hundreds of MB of memory) until someone removes it. Every
//!   process that created or mapped one holds a shared `flock` on it
//!   ([`crate::fileio::lock_shared`]), released by the kernel when it dies, so such a file is
//!   stale when it is this user's, nobody holds a lock on it
//!   ([`crate::fileio::is_locked`]) and it is older than [`MIN_AGE`]. The first rank of
//!   every machine sweeps them at each job's start ([`crate::topology::Topology::init`]).
//! - **Temporaries of atomic writes**: `.<name>.tmp-<pid>-<n>` files
//!   ([`crate::fileio::AtomicFile`]) and directories ([`crate::fileio::AtomicDir`]: a
//!   checkpoint's step, an export bundle, or one moved aside to be replaced), and the
//!   checkpoint step directories `.step-<digits>.tmp-<pid>` of older builds, stale when they
//!   are this user's, the process `<pid>` is not alive on this machine
//!   ([`pid_alive`]) and they are older than [`MIN_AGE`]. Swept in the data
//!   directories when training data is opened, in the checkpoint directory by the trainer,
//!   and by `ringrec clean` (in the directories it is given: a bundle's parent too).
//!
//! - **Lock files** (`<cache>.lock`, `synth.lock`: [`crate::fileio::FileLock`]) that a
//!   killed preparation left (a lock file is removed by its holder otherwise): empty
//!   `*.lock` files of this user that nobody holds a lock on, removed under their own lock
//!   (so a process about to take one starts again), by `ringrec clean`.
//!
//! [`MIN_AGE`] protects a segment in its first instants (between its creation and its
//! creator's lock), and a temporary that a process of another machine sharing the directory
//! is still writing (its pid means nothing here; a file being written keeps a fresh mtime).
//! A directory's age is that of the newest entry inside it.
//!
//! Sweeps are best effort: an entry that cannot be read or removed is left alone, and a
//! missing directory holds nothing stale.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// How old (mtime) a file must be before a sweep may remove it.
pub const MIN_AGE: Duration = Duration::from_secs(10);

/// True while process `pid` exists and is neither a zombie nor dead (read from /proc).
pub fn pid_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // state is the first field after the parenthesised command name
        Ok(s) => !matches!(s.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()), Some('Z') | Some('X')),
        Err(_) => false,
    }
}

/// The stale shared segments and host tables in `dir` (see the module docs), with their
/// sizes in bytes; removes nothing.
pub fn stale_shm(dir: &Path) -> Vec<(PathBuf, u64)> {
    entries(dir)
        .filter(|(path, meta)| {
            let name = path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
            meta.file_type().is_file() && crate::shm::is_segment_name(&name) && mine_and_old(meta) && !crate::fileio::is_locked(path)
        })
        .map(|(path, meta)| (path, meta.len()))
        .collect()
}

/// Removes the stale shared segments and host tables in `dir` ([`stale_shm`]); returns those
/// it removed, with their sizes in bytes.
pub fn sweep_shm(dir: &Path) -> Vec<(PathBuf, u64)> {
    remove(stale_shm(dir))
}

/// The stale temporaries in `dir` (see the module docs), with their sizes in bytes (a
/// directory: the sum of its files); removes nothing. Not recursive: subdirectories other
/// than the temporaries themselves are not looked into.
pub fn stale_temporaries(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut found = Vec::new();
    for (path, meta) in entries(dir) {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let Some(pid) = temporary_pid(&name) else { continue };
        let ft = meta.file_type();
        // An atomic writer's temporary is a file or a directory (a checkpoint's step, a bundle).
        if !(ft.is_file() || ft.is_dir()) || pid_alive(pid) {
            continue;
        }
        let (bytes, newest) = tree(&path, &meta);
        if meta.uid() == euid() && older_than_min_age(newest) {
            found.push((path, bytes));
        }
    }
    found
}

/// Removes the stale temporaries in `dir` ([`stale_temporaries`]); returns those it
/// removed, with their sizes in bytes.
pub fn sweep_temporaries(dir: &Path) -> Vec<(PathBuf, u64)> {
    remove(stale_temporaries(dir))
}

/// The stale lock files in `dir` (see the module docs): empty `*.lock` files of this user
/// that nobody holds; removes nothing.
pub fn stale_locks(dir: &Path) -> Vec<(PathBuf, u64)> {
    entries(dir)
        .filter(|(path, meta)| {
            meta.file_type().is_file() && meta.len() == 0 && meta.uid() == euid() && path.extension().is_some_and(|e| e == "lock") && !crate::fileio::is_locked(path)
        })
        .map(|(path, _)| (path, 0))
        .collect()
}

/// Removes the stale lock files in `dir` ([`stale_locks`]), each under its own lock (one
/// taken meanwhile is left); returns those it removed.
pub fn sweep_locks(dir: &Path) -> Vec<(PathBuf, u64)> {
    stale_locks(dir).into_iter().filter(|(p, _)| crate::fileio::FileLock::try_exclusive(p).ok().flatten().is_some()).collect()
}

/// Prints one line on stderr saying what a sweep of `dir` removed (nothing when it removed
/// nothing): how many files, how many bytes, and the first names.
pub fn report(dir: &Path, removed: &[(PathBuf, u64)]) {
    if removed.is_empty() {
        return;
    }
    const SHOWN: usize = 8;
    let total: u64 = removed.iter().map(|(_, b)| b).sum();
    let mut names: Vec<String> = removed.iter().take(SHOWN).map(|(p, b)| format!("{} ({b} bytes)", p.file_name().unwrap_or(p.as_os_str()).to_string_lossy())).collect();
    if removed.len() > SHOWN {
        names.push(format!("and {} more", removed.len() - SHOWN));
    }
    crate::eprint_line(&format!("ringrec: removed {} stale file(s) of ended jobs from {} ({total} bytes): {}", removed.len(), dir.display(), names.join(", ")));
}

/// The entries of `dir` with their own metadata (links not followed).
fn entries(dir: &Path) -> impl Iterator<Item = (PathBuf, std::fs::Metadata)> {
    std::fs::read_dir(dir).into_iter().flatten().flatten().filter_map(|e| {
        let path = e.path();
        let meta = std::fs::symlink_metadata(&path).ok()?;
        Some((path, meta))
    })
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

fn older_than_min_age(mtime: SystemTime) -> bool {
    SystemTime::now().duration_since(mtime).is_ok_and(|age| age >= MIN_AGE)
}

fn mine_and_old(meta: &std::fs::Metadata) -> bool {
    meta.uid() == euid() && meta.modified().is_ok_and(older_than_min_age)
}

/// The pid in the name of a ringrec temporary: an atomic writer's (`.<name>.tmp-<pid>-<n>`)
/// or an older build's checkpoint step (`.step-<digits>.tmp-<pid>`).
fn temporary_pid(name: &str) -> Option<i32> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let pid = |s: &str| s.parse::<i32>().ok().filter(|p| *p > 0);
    let (stem, tail) = name.strip_prefix('.')?.rsplit_once(".tmp-")?;
    if stem.is_empty() {
        return None;
    }
    if let Some(step) = stem.strip_prefix("step-") {
        if digits(step) && digits(tail) {
            return pid(tail);
        }
    }
    let (p, n) = tail.split_once('-')?;
    (digits(p) && digits(n)).then(|| pid(p)).flatten()
}

/// Bytes of the files under `path` (itself, for a file) and the newest mtime among them and
/// their directories; links are not followed.
fn tree(path: &Path, meta: &std::fs::Metadata) -> (u64, SystemTime) {
    let mut newest = meta.modified().unwrap_or_else(|_| SystemTime::now());
    if !meta.is_dir() {
        return (meta.len(), newest);
    }
    let mut bytes = 0;
    for (p, m) in entries(path) {
        let (b, t) = tree(&p, &m);
        bytes += b;
        newest = newest.max(t);
    }
    (bytes, newest)
}

/// Removes each of `found` (directories with what they hold); keeps those removed here.
fn remove(found: Vec<(PathBuf, u64)>) -> Vec<(PathBuf, u64)> {
    found
        .into_iter()
        .filter(|(path, _)| {
            let is_dir = std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir());
            if is_dir {
                std::fs::remove_dir_all(path).is_ok()
            } else {
                std::fs::remove_file(path).is_ok()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory under the system temp dir.
    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ringrec-stale-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// Sets the mtime of `path` `secs` seconds into the past.
    fn backdate(path: &Path, secs: u64) {
        let t = SystemTime::now() - Duration::from_secs(secs);
        std::fs::File::options().write(true).open(path).or_else(|_| std::fs::File::open(path)).unwrap().set_modified(t).unwrap();
    }

    /// A pid that no process has: above the kernel's pid_max.
    fn dead_pid() -> i32 {
        let max: i32 = std::fs::read_to_string("/proc/sys/kernel/pid_max").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(4_194_304);
        assert!(!pid_alive(max + 1));
        max + 1
    }

    fn write(path: &Path, bytes: usize) {
        std::fs::write(path, vec![7u8; bytes]).unwrap();
    }

    fn names(found: &[(PathBuf, u64)]) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = found.iter().map(|(p, b)| (p.file_name().unwrap().to_string_lossy().into_owned(), *b)).collect();
        v.sort();
        v
    }

    #[test]
    fn names_of_temporaries() {
        assert_eq!(temporary_pid(".dense.json.tmp-123-4"), Some(123));
        assert_eq!(temporary_pid(".a.tmp-b.tmp-77-0"), Some(77));
        assert_eq!(temporary_pid(".step-20.tmp-55"), Some(55));
        assert_eq!(temporary_pid(".step-000000000020.tmp-55-3"), Some(55));
        assert_eq!(temporary_pid(".bundle.tmp-56-0"), Some(56));
        for not_ours in ["dense.json.tmp-1-2", ".tmp-1-2", ".x.tmp-1", ".x.tmp-a-2", ".x.tmp-1-", ".step-.tmp-5", ".step-2.tmp-", ".x.tmp-0-1", ".x.tmp-99999999999-1", "ringrec-j-h0-table"] {
            assert_eq!(temporary_pid(not_ours), None, "{not_ours}");
        }
    }

    #[test]
    fn a_dead_process_temporaries_go_live_fresh_and_foreign_ones_stay() {
        let d = scratch("tmp");
        let dead = dead_pid();
        let me = std::process::id();
        let dead_file = d.join(format!(".dense.bin.tmp-{dead}-0"));
        let live_file = d.join(format!(".dense.bin.tmp-{me}-1"));
        let fresh_file = d.join(format!(".table-20.rrt.tmp-{dead}-2"));
        let foreign = d.join(format!("notes.tmp-{dead}-0"));
        let foreign_dot = d.join(format!(".notes-{dead}"));
        let step_dir = d.join(format!(".step-40.tmp-{dead}"));
        let live_step = d.join(format!(".step-60.tmp-{me}"));
        // What fileio::AtomicDir leaves: a checkpoint's step and an export bundle.
        let new_step = d.join(format!(".step-000000000080.tmp-{dead}-4"));
        let bundle = d.join(format!(".bundle.tmp-{dead}-0"));
        let live_bundle = d.join(format!(".bundle.tmp-{me}-1"));
        for (p, n) in [(&dead_file, 100), (&live_file, 200), (&fresh_file, 300), (&foreign, 400), (&foreign_dot, 500)] {
            write(p, n);
        }
        for s in [&step_dir, &live_step, &new_step, &bundle, &live_bundle] {
            std::fs::create_dir_all(s.join("sub")).unwrap();
            write(&s.join("dense.bin"), 1000);
            write(&s.join("sub/table.rrt"), 24);
        }
        for p in [&dead_file, &live_file, &foreign, &foreign_dot, &live_step, &live_bundle] {
            backdate(p, 60);
        }
        for s in [&step_dir, &new_step, &bundle] {
            for p in [&s.join("dense.bin"), &s.join("sub/table.rrt"), &s.join("sub"), s] {
                backdate(p, 60);
            }
        }
        let want = vec![
            (format!(".bundle.tmp-{dead}-0"), 1024),
            (format!(".dense.bin.tmp-{dead}-0"), 100),
            (format!(".step-000000000080.tmp-{dead}-4"), 1024),
            (format!(".step-40.tmp-{dead}"), 1024),
        ];
        assert_eq!(names(&stale_temporaries(&d)), want, "listing");
        assert!(dead_file.exists() && step_dir.exists(), "a listing removes nothing");
        assert_eq!(names(&sweep_temporaries(&d)), want);
        assert!(!dead_file.exists() && !step_dir.exists() && !new_step.exists() && !bundle.exists());
        for kept in [&live_file, &fresh_file, &foreign, &foreign_dot, &live_step, &live_bundle] {
            assert!(kept.exists(), "{} must stay", kept.display());
        }
        // Once old, the fresh one goes too; a second sweep finds nothing else.
        backdate(&fresh_file, 60);
        assert_eq!(names(&sweep_temporaries(&d)), vec![(format!(".table-20.rrt.tmp-{dead}-2"), 300)]);
        assert_eq!(sweep_temporaries(&d), vec![]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_step_directory_written_to_recently_is_not_old() {
        let d = scratch("step");
        let step = d.join(format!(".step-7.tmp-{}", dead_pid()));
        std::fs::create_dir_all(&step).unwrap();
        write(&step.join("dense.bin"), 10);
        backdate(&step, 60);
        assert_eq!(sweep_temporaries(&d), vec![], "its file is fresh");
        backdate(&step.join("dense.bin"), 60);
        assert_eq!(names(&sweep_temporaries(&d)), vec![(step.file_name().unwrap().to_string_lossy().into_owned(), 10)]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn only_unlocked_old_segments_are_swept() {
        let d = scratch("shm");
        let dead = d.join("ringrec-j1-h0-table");
        let held = d.join("ringrec-j2-h0-coll-world");
        let fresh = d.join("ringrec-j3-h1-heartbeat");
        let not_a_segment = d.join("ringrec-saved.tbl");
        let other = d.join("other-j1-h0-table");
        write(&dead, 4096);
        let lock = crate::fileio::create_locked(&held, 0o600).unwrap();
        write(&fresh, 10);
        write(&not_a_segment, 10);
        write(&other, 10);
        std::fs::create_dir(d.join("ringrec-j4-h0-dir")).unwrap();
        for p in [&dead, &held, &not_a_segment, &other, &d.join("ringrec-j4-h0-dir")] {
            backdate(p, 60);
        }
        assert_eq!(names(&stale_shm(&d)), vec![("ringrec-j1-h0-table".into(), 4096)]);
        assert_eq!(names(&sweep_shm(&d)), vec![("ringrec-j1-h0-table".into(), 4096)]);
        assert!(!dead.exists());
        for kept in [&held, &fresh, &not_a_segment, &other, &d.join("ringrec-j4-h0-dir")] {
            assert!(kept.exists(), "{} must stay", kept.display());
        }
        // Its creator gone, the held one is stale.
        drop(lock);
        assert_eq!(names(&sweep_shm(&d)), vec![("ringrec-j2-h0-coll-world".into(), 0)]);
        assert_eq!(sweep_shm(&d.join("missing")), vec![]);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
