//! The one way ringrec writes a file that others may read: under a temporary name in the
//! destination's directory, fsynced, renamed over the destination, and the directory
//! fsynced, so a reader (or a crash) sees the old file or the new one, never a part.
//! Tables, parameter files, data caches and checkpoints are all written so.
//!
//! A directory of such files (a checkpoint's `step-N/`, an export bundle) is published the
//! same way ([`AtomicDir`]): built under a temporary name (mode 0700), every file and the
//! directory fsynced, renamed into place, the parent fsynced. Every temporary, file or
//! directory, is named `.<name>.tmp-<pid>-<n>` beside its destination, which is how
//! [`crate::stale`] finds those a killed writer left.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// An operating-system call on a file failed.
#[derive(Debug, thiserror::Error)]
#[error("{path}: cannot {op}: {source}")]
pub struct IoError {
    /// The file.
    pub path: PathBuf,
    /// What was being done (`open`, `map`, `write`...).
    pub op: &'static str,
    /// The OS error.
    pub source: std::io::Error,
}

impl IoError {
    /// The failure of `op` on `path`.
    pub fn new(path: &Path, op: &'static str, source: std::io::Error) -> IoError {
        IoError { path: path.to_path_buf(), op, source }
    }
}

/// A file written under a temporary name and renamed over its destination by
/// [`AtomicFile::commit`]; dropped uncommitted, it is removed.
pub struct AtomicFile {
    tmp: PathBuf,
    dest: PathBuf,
    file: File,
    committed: bool,
}

impl AtomicFile {
    /// Creates the temporary file next to `dest`, with permissions `mode`.
    pub fn create(dest: &Path, mode: u32) -> Result<AtomicFile, IoError> {
        let tmp = temporary_name(dest);
        let file = OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp).map_err(|e| IoError::new(&tmp, "create", e))?;
        Ok(AtomicFile { tmp, dest: dest.to_path_buf(), file, committed: false })
    }

    /// The open temporary file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The temporary path (for error messages).
    pub fn path(&self) -> &Path {
        &self.tmp
    }

    /// fsync, rename over the destination, fsync of the directory.
    pub fn commit(mut self) -> Result<(), IoError> {
        self.file.sync_all().map_err(|e| IoError::new(&self.tmp, "fsync", e))?;
        std::fs::rename(&self.tmp, &self.dest).map_err(|e| IoError::new(&self.dest, "rename into place", e))?;
        self.committed = true;
        fsync_dir(&parent_of(&self.dest))
    }
}

/// A fresh temporary name beside `dest`: `.<name>.tmp-<pid>-<n>`.
fn temporary_name(dest: &Path) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = dest.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "file".into());
    dest.with_file_name(format!(".{name}.tmp-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)))
}

/// The directory `path` lies in (`.` for a bare name).
fn parent_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// fsyncs the directory `dir` (its entries: a rename into it is durable).
pub fn fsync_dir(dir: &Path) -> Result<(), IoError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| IoError::new(dir, "fsync directory", e))
}

/// fsyncs every file and directory under `dir`, then `dir` itself; links are not followed.
fn fsync_tree(dir: &Path) -> Result<(), IoError> {
    for e in std::fs::read_dir(dir).map_err(|e| IoError::new(dir, "list", e))? {
        let p = e.map_err(|e| IoError::new(dir, "list", e))?.path();
        let t = std::fs::symlink_metadata(&p).map_err(|e| IoError::new(&p, "stat", e))?.file_type();
        if t.is_dir() {
            fsync_tree(&p)?;
        } else if t.is_file() {
            File::open(&p).and_then(|f| f.sync_all()).map_err(|e| IoError::new(&p, "fsync", e))?;
        }
    }
    fsync_dir(dir)
}

/// A directory built under a temporary name beside its destination (mode 0700; its files
/// are written 0600 by [`write_atomic`] or [`AtomicFile`]) and published by
/// [`AtomicDir::publish`]: a reader (or a crash) sees the old directory or the new one
/// whole, never a part. Dropped unpublished, it is removed with what it holds.
pub struct AtomicDir {
    tmp: PathBuf,
    dest: PathBuf,
    published: bool,
}

impl AtomicDir {
    /// Creates the temporary directory beside `dest` (whose parent must exist).
    pub fn create(dest: &Path) -> Result<AtomicDir, IoError> {
        use std::os::unix::fs::DirBuilderExt;
        let tmp = temporary_name(dest);
        std::fs::DirBuilder::new().mode(0o700).create(&tmp).map_err(|e| IoError::new(&tmp, "create", e))?;
        Ok(AtomicDir { tmp, dest: dest.to_path_buf(), published: false })
    }

    /// The temporary directory, to write the files into.
    pub fn path(&self) -> &Path {
        &self.tmp
    }

    /// fsyncs every file in it and the directory, renames it to its destination and fsyncs
    /// the parent. An existing destination is an error (`AlreadyExists`) unless `replace`:
    /// then it is first moved aside under a temporary name, and removed once the new one is
    /// in place (put back if the rename fails).
    pub fn publish(mut self, replace: bool) -> Result<(), IoError> {
        fsync_tree(&self.tmp)?;
        let mut aside = None;
        if std::fs::symlink_metadata(&self.dest).is_ok() {
            if !replace {
                return Err(IoError::new(&self.dest, "publish", std::io::Error::new(std::io::ErrorKind::AlreadyExists, "it exists")));
            }
            let old = temporary_name(&self.dest);
            std::fs::rename(&self.dest, &old).map_err(|e| IoError::new(&self.dest, "move aside", e))?;
            aside = Some(old);
        }
        if let Err(e) = std::fs::rename(&self.tmp, &self.dest) {
            if let Some(old) = &aside {
                let _ = std::fs::rename(old, &self.dest);
            }
            return Err(IoError::new(&self.dest, "rename into place", e));
        }
        self.published = true;
        let synced = fsync_dir(&parent_of(&self.dest));
        if let Some(old) = aside {
            let _ = std::fs::remove_dir_all(&old).or_else(|_| std::fs::remove_file(&old));
        }
        synced
    }
}

impl Drop for AtomicDir {
    fn drop(&mut self) {
        if !self.published {
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Writes `dest` atomically (permissions `mode`) with what `fill` writes to a buffered
/// writer. On error `dest` is untouched and no temporary file remains.
pub fn write_atomic(dest: &Path, mode: u32, fill: impl FnOnce(&mut BufWriter<&File>) -> std::io::Result<()>) -> Result<(), IoError> {
    let f = AtomicFile::create(dest, mode)?;
    {
        let mut w = BufWriter::with_capacity(1 << 20, f.file());
        fill(&mut w).and_then(|_| w.flush()).map_err(|e| IoError::new(f.path(), "write", e))?;
    }
    f.commit()
}

/// What a file of type `t` is, in words, when it is not a regular file (`None` for one):
/// `a FIFO`, `a socket`, `a character device`, `a block device`, `a directory`.
pub fn special_kind(t: std::fs::FileType) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    Some(match t {
        t if t.is_file() => return None,
        t if t.is_fifo() => "a FIFO",
        t if t.is_socket() => "a socket",
        t if t.is_char_device() => "a character device",
        t if t.is_block_device() => "a block device",
        t if t.is_dir() => "a directory",
        _ => "not a regular file",
    })
}

/// The error of an input that is `kind` ([`special_kind`]) rather than a regular file.
fn not_regular(kind: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("it is {kind}, not a regular file; ringrec reads its inputs from regular files only (a FIFO, a socket or a device could make it wait without end)"))
}

/// Opens `path` as `options` say, as an input: only a regular file. The open itself cannot
/// wait (`O_NONBLOCK`: a FIFO without a writer would block it), the descriptor's type is
/// checked (`fstat`, so a path swapped after a check is caught too), and a FIFO, socket or
/// device is refused with an error saying what it is; reads then block as usual. Every
/// file ringrec reads from a user, a checkpoint or a bundle is opened so.
pub fn open_regular(options: &mut OpenOptions, path: &Path) -> std::io::Result<File> {
    use std::os::fd::AsRawFd;
    let f = options.custom_flags(libc::O_NONBLOCK).open(path)?;
    if let Some(kind) = special_kind(f.metadata()?.file_type()) {
        return Err(not_regular(kind));
    }
    // SAFETY: fcntl on a descriptor `f` owns; F_GETFL/F_SETFL touch no memory.
    unsafe {
        let flags = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(f.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
    }
    Ok(f)
}

/// Opens the input `path` for reading ([`open_regular`]).
pub fn open_input(path: &Path) -> std::io::Result<File> {
    open_regular(OpenOptions::new().read(true), path)
}

/// Reads the whole input `path` ([`open_regular`]).
pub fn read_input(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut f = open_input(path)?;
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Bytes free for this user on the filesystem of `path` (`statvfs`), when it can be read.
pub fn free_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: a zeroed statvfs is a valid out-parameter; `c` is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    (rc == 0).then(|| st.f_bavail as u64 * st.f_frsize as u64)
}

/// Allocates `len` bytes of `file` (at `path`, for messages) up front (`posix_fallocate`),
/// so that writing or touching a mapping of it later cannot fail for lack of space (on
/// tmpfs a mapped page that cannot be backed is a SIGBUS). A shortfall is an error naming
/// the directory, the bytes needed and the bytes free. Filesystems that cannot allocate
/// ahead are left to fail at write time, as before.
pub fn reserve(file: &File, path: &Path, len: u64) -> Result<(), IoError> {
    use std::os::unix::io::AsRawFd;
    if len == 0 {
        return Ok(());
    }
    let Ok(n) = libc::off_t::try_from(len) else {
        return Err(IoError::new(path, "reserve space", std::io::Error::other(format!("{len} bytes exceed the largest file size"))));
    };
    // SAFETY: posix_fallocate on an open descriptor with a valid range; it returns the
    // error number instead of setting errno.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, n) };
    match rc {
        0 => Ok(()),
        libc::EOPNOTSUPP | libc::EINVAL => Ok(()),
        libc::ENOSPC | libc::EFBIG | libc::EDQUOT => {
            let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
            let free = free_bytes(dir).map_or_else(|| "an unknown number of bytes".to_string(), |f| format!("{f} bytes"));
            Err(IoError::new(
                path,
                "reserve space",
                std::io::Error::other(format!("needs {len} bytes, {free} free in {}: free space there or point ringrec at a larger directory", dir.display())),
            ))
        }
        e => Err(IoError::new(path, "reserve space", std::io::Error::from_raw_os_error(e))),
    }
}

/// Bytes of the pages [`write_nonzero_at`] tells apart: the smallest unit a filesystem
/// leaves unwritten (a hole, or a reserved block never written: both read back as zeros).
pub const PAGE: usize = 4096;

/// Writes `bytes` into `file` at `offset` (positional writes, the file's cursor untouched),
/// skipping every [`PAGE`]-aligned page of `bytes` that is all zeros: the file must already
/// read as zeros there — a region just reserved ([`reserve`]) or extended (`set_len`) and not
/// yet written. A table that is mostly empty slots so costs the writes (and the fsync) of
/// its used pages only, and reads back byte for byte the same. Consecutive pages that are
/// not all zeros go out in one write.
pub fn write_nonzero_at(file: &File, offset: u64, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    static ZEROS: [u8; PAGE] = [0; PAGE];
    // A slice comparison of bytes is one memcmp: fast in a debug build too.
    let zero = |page: &[u8]| page == &ZEROS[..page.len()];
    let mut run: Option<usize> = None;
    for (i, page) in bytes.chunks(PAGE).enumerate() {
        match (zero(page), run) {
            (false, None) => run = Some(i * PAGE),
            (true, Some(start)) => {
                file.write_all_at(&bytes[start..i * PAGE], offset + start as u64)?;
                run = None;
            }
            _ => {}
        }
    }
    match run {
        Some(start) => file.write_all_at(&bytes[start..], offset + start as u64),
        None => Ok(()),
    }
}

/// Permissions of every file ringrec creates: owner-only (what it writes holds data, models
/// or their metrics); a directory published whole ([`AtomicDir`]) is 0700. Share one with
/// `chmod`.
pub const PRIVATE: u32 = 0o600;

/// Creates (or truncates) `path` for writing, with [`PRIVATE`] permissions when it is new:
/// a file written in place (a log, a metrics file, a timeline), not atomically.
pub fn create_private(path: &Path, append: bool) -> std::io::Result<File> {
    OpenOptions::new().create(true).write(true).append(append).truncate(!append).mode(PRIVATE).open(path)
}

/// An exclusive `flock` on a lock file that exists only while it is held: the holder
/// removes the file before it lets go (on drop), so no lock file outlives its use. A
/// process that waited on a file that was removed meanwhile finds the path no longer
/// names the file it locked, and starts again (with the file now there, or a new one):
/// so two processes never both hold "the" lock, and a sweep may remove a lock file that
/// nobody holds ([`FileLock::try_exclusive`]).
pub struct FileLock {
    /// Holds the lock while open.
    _file: File,
    path: PathBuf,
}

impl std::fmt::Debug for FileLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileLock").field("path", &self.path).finish()
    }
}

impl FileLock {
    /// Blocks until this process holds the lock of `path` (the file created if missing,
    /// [`PRIVATE`]).
    pub fn exclusive(path: &Path) -> Result<FileLock, IoError> {
        loop {
            if let Some(lock) = FileLock::acquire(path, true)? {
                return Ok(lock);
            }
        }
    }

    /// The lock of the existing lock file `path` when nobody holds it (`None` when someone
    /// does, or it is gone): dropped, it removes the file.
    pub fn try_exclusive(path: &Path) -> Result<Option<FileLock>, IoError> {
        FileLock::acquire(path, false)
    }

    /// One try: `block` creates the file and waits for the lock; otherwise only an existing
    /// file, and only a lock nobody holds. `None`: the path no longer names the file locked
    /// (try again), or (without `block`) someone holds it.
    fn acquire(path: &Path, block: bool) -> Result<Option<FileLock>, IoError> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::MetadataExt;
        let opened = OpenOptions::new().create(block).truncate(false).write(true).mode(PRIVATE).open(path);
        let file = match opened {
            Ok(f) => f,
            Err(e) if !block && e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(IoError::new(path, "create lock file", e)),
        };
        let op = if block { libc::LOCK_EX } else { libc::LOCK_EX | libc::LOCK_NB };
        loop {
            // SAFETY: flock on a descriptor `file` owns and keeps open; it touches no memory.
            if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
                break;
            }
            let e = std::io::Error::last_os_error();
            match e.kind() {
                std::io::ErrorKind::Interrupted => continue,
                std::io::ErrorKind::WouldBlock if !block => return Ok(None),
                _ => return Err(IoError::new(path, "lock", e)),
            }
        }
        let mine = file.metadata().map_err(|e| IoError::new(path, "stat", e))?;
        let named = std::fs::metadata(path).ok().is_some_and(|m| (m.dev(), m.ino()) == (mine.dev(), mine.ino()));
        Ok(named.then(|| FileLock { _file: file, path: path.to_path_buf() }))
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        // Removed while held: a process waiting on it finds it gone and starts again.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Takes a shared `flock` on `file`: held while the file (any descriptor of this open file
/// description) stays open, released by the kernel when the process dies. Every process
/// that creates or maps a shared file of a job holds one, so a file that nobody holds a
/// lock on (a non-blocking exclusive `flock` succeeds) belongs to no live process: the
/// stale-file sweep's test of liveness.
pub fn lock_shared(file: &File, path: &Path) -> Result<(), IoError> {
    use std::os::unix::io::AsRawFd;
    // SAFETY: flock on an open descriptor.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH) } != 0 {
        return Err(IoError::new(path, "lock", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Creates `path` exclusively (`O_EXCL`, permissions `mode`, read-write) and takes the
/// shared liveness lock on it at once ([`lock_shared`]).
pub fn create_locked(path: &Path, mode: u32) -> std::io::Result<File> {
    let f = OpenOptions::new().read(true).write(true).create_new(true).mode(mode).open(path)?;
    lock_shared(&f, path).map_err(|e| e.source)?;
    Ok(f)
}

/// True when some process holds a lock on `path` (see [`lock_shared`]); false when
/// nobody does (or the file cannot be opened).
pub fn is_locked(path: &Path) -> bool {
    use std::os::unix::io::AsRawFd;
    let Ok(f) = File::open(path) else { return false };
    // SAFETY: flock on an open descriptor; the probe's lock (if taken) goes with `f`.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) != 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    /// What `dir` holds: names, sorted.
    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    #[test]
    fn a_lock_file_exists_only_while_held_and_a_waiter_takes_the_next_one() {
        let root = std::env::temp_dir().join(format!("ringrec-file-lock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let p = root.join("x.lock");
        let held = FileLock::exclusive(&p).unwrap();
        assert_eq!(mode(&p), PRIVATE);
        assert!(FileLock::try_exclusive(&p).unwrap().is_none(), "held: a sweep leaves it");
        let waiter = {
            let p = p.clone();
            std::thread::spawn(move || {
                let lock = FileLock::exclusive(&p).unwrap();
                // The waiter locked the file the holder removed, then the one now there.
                let there = p.exists();
                drop(lock);
                there
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(100));
        drop(held);
        assert!(waiter.join().unwrap(), "the waiter holds a lock file that exists");
        assert!(!p.exists(), "and removed it when done");
        // A lock file a killed process left: nobody holds it, a sweep takes and removes it.
        std::fs::write(&p, b"").unwrap();
        drop(FileLock::try_exclusive(&p).unwrap().expect("nobody holds it"));
        assert!(!p.exists());
        assert!(FileLock::try_exclusive(&p).unwrap().is_none(), "a missing file is not created");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn inputs_that_are_not_regular_files_are_refused_without_waiting() {
        let root = std::env::temp_dir().join(format!("ringrec-open-input-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let fifo = root.join("f.tsv");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo with a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // No writer: a plain open would block here for ever.
        let e = open_input(&fifo).unwrap_err().to_string();
        assert!(e.starts_with("it is a FIFO, not a regular file"), "{e}");
        assert!(read_input(Path::new("/dev/null")).unwrap_err().to_string().starts_with("it is a character device"));
        assert!(open_input(&root).unwrap_err().to_string().starts_with("it is a directory"));
        std::fs::write(root.join("a"), b"x").unwrap();
        assert_eq!(read_input(&root.join("a")).unwrap(), b"x");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_directory_is_published_whole_replacing_or_refusing_the_old_one() {
        let root = std::env::temp_dir().join(format!("ringrec-atomic-dir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let dest = root.join("step-1");
        let d = AtomicDir::create(&dest).unwrap();
        let tmp = d.path().to_path_buf();
        let name = tmp.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with(&format!(".step-1.tmp-{}-", std::process::id())), "{name}");
        assert_eq!(mode(&tmp), 0o700);
        write_atomic(&tmp.join("a"), 0o600, |w| w.write_all(b"one")).unwrap();
        assert!(!dest.exists(), "nothing under the name before publish");
        d.publish(false).unwrap();
        assert_eq!((names(&root), std::fs::read(dest.join("a")).unwrap()), (vec!["step-1".to_string()], b"one".to_vec()));
        assert_eq!((mode(&dest), mode(&dest.join("a"))), (0o700, 0o600));
        // Refused over an existing one, which stays; the temporary goes with the writer.
        let d = AtomicDir::create(&dest).unwrap();
        write_atomic(&d.path().join("a"), 0o600, |w| w.write_all(b"two")).unwrap();
        let e = d.publish(false).unwrap_err();
        assert_eq!(e.source.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!((names(&root), std::fs::read(dest.join("a")).unwrap()), (vec!["step-1".to_string()], b"one".to_vec()));
        // Replaced: the old one moved aside and removed.
        let d = AtomicDir::create(&dest).unwrap();
        write_atomic(&d.path().join("b"), 0o600, |w| w.write_all(b"three")).unwrap();
        d.publish(true).unwrap();
        assert_eq!((names(&root), names(&dest)), (vec!["step-1".to_string()], vec!["b".to_string()]));
        // Dropped unpublished: nothing left.
        let d = AtomicDir::create(&root.join("bundle")).unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        write_atomic(&d.path().join("sub/c"), 0o600, |w| w.write_all(b"x")).unwrap();
        drop(d);
        assert_eq!(names(&root), vec!["step-1".to_string()]);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_created_file_is_locked_while_open() {
        let p = std::env::temp_dir().join(format!("ringrec-lock-{}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        let f = create_locked(&p, 0o600).unwrap();
        assert!(is_locked(&p));
        drop(f);
        assert!(!is_locked(&p));
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn zero_pages_are_skipped_and_the_file_reads_back_the_same() {
        let p = std::env::temp_dir().join(format!("ringrec-nonzero-{}", std::process::id()));
        // Zero pages at the start, between runs and at the end; a run across pages; a short
        // last page; one byte that makes a page non-zero.
        let mut bytes = vec![0u8; 64 * PAGE + 100];
        bytes[3 * PAGE..5 * PAGE + 7].fill(0xAB);
        bytes[40 * PAGE + PAGE - 1] = 1;
        bytes[64 * PAGE + 99] = 2;
        let offset = 2 * PAGE;
        let written = |p: usize| (3..=5).contains(&p) || p == 40 || p == 64;
        // Over a file of 0xFF: the pages written hold the bytes, the others were not touched.
        std::fs::write(&p, vec![0xFF; offset + bytes.len()]).unwrap();
        let f = OpenOptions::new().write(true).open(&p).unwrap();
        write_nonzero_at(&f, offset as u64, &bytes).unwrap();
        let back = std::fs::read(&p).unwrap();
        assert!(back[..offset].iter().all(|b| *b == 0xFF));
        for (i, (got, want)) in back[offset..].chunks(PAGE).zip(bytes.chunks(PAGE)).enumerate() {
            if written(i) {
                assert_eq!(got, want, "page {i} is written");
            } else {
                assert!(got.iter().all(|b| *b == 0xFF), "page {i} is all zeros: skipped");
            }
        }
        // Over a file just extended, it reads back as the bytes.
        let f = OpenOptions::new().write(true).truncate(true).open(&p).unwrap();
        f.set_len((offset + bytes.len()) as u64).unwrap();
        write_nonzero_at(&f, offset as u64, &bytes).unwrap();
        let back = std::fs::read(&p).unwrap();
        assert!(back[..offset].iter().all(|b| *b == 0) && back[offset..] == bytes[..]);
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn reserve_allocates_and_free_bytes_reads_the_filesystem() {
        let dir = std::env::temp_dir();
        let p = dir.join(format!("ringrec-reserve-{}", std::process::id()));
        let f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&p).unwrap();
        reserve(&f, &p, 1 << 20).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 1 << 20);
        assert!(free_bytes(&dir).unwrap() > 0);
        // More than any filesystem here has: the error names what was needed.
        let e = reserve(&f, &p, 1 << 62).unwrap_err().to_string();
        assert!(e.contains("needs 4611686018427387904 bytes") || e.contains("largest file size") || e.contains("File too large"), "{e}");
        std::fs::remove_file(&p).unwrap();
    }
}
