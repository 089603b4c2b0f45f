//! Shared-memory segments: one file in `/dev/shm` (or `RINGREC_SHM_DIR`) mapped by every
//! rank of a host.
//!
//! Hygiene: the name holds the job id and the host id, so jobs and simulated hosts never
//! collide; the leader creates it exclusively (`O_EXCL`, mode 0600) and allocates all of it
//! at once ([`crate::fileio::reserve`]: a directory too small is an error naming it and the
//! bytes needed and free, never a SIGBUS when a page is first touched); peers check owner
//! and size before mapping; once every local rank has mapped it, the leader unlinks the
//! name (the memory lives until the last mapping goes away).
//!
//! A kill in the short window before that unlink leaves the file behind. Every process that
//! created or opened a segment holds a shared `flock` on it for the segment's lifetime
//! ([`crate::fileio::create_locked`], [`crate::fileio::lock_shared`]), so a left-over file
//! nobody holds a lock on belongs to no live process, and [`crate::stale::sweep_shm`]
//! removes it at the next job's start (or `ringrec clean`).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use mpi::collective::CommunicatorCollectives;
use mpi::topology::Communicator;
use mpi::traits::Root;

use crate::group::Group;
use crate::{CommError, CommResult};

/// A mapped shared-memory segment.
pub struct SharedSegment {
    map: memmap2::MmapRaw,
    path: PathBuf,
    /// Kept open for the segment's lifetime: it holds this process' liveness lock.
    _file: File,
}

// SAFETY: the mapping is plain memory valid for the lifetime of the struct; concurrent
// access is coordinated by the protocols built on top (atomics in the segment).
unsafe impl Send for SharedSegment {}
// SAFETY: as above; `&SharedSegment` only hands out raw pointers.
unsafe impl Sync for SharedSegment {}

/// Keeps `[A-Za-z0-9._-]`, replaces the rest, so an id can name a file.
pub fn sanitize(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' { c } else { '_' }).take(40).collect()
}

/// `<dir>/ringrec-<job>-h<host>-<tag>`.
pub fn segment_path(dir: &Path, job_id: &str, host_id: usize, tag: &str) -> PathBuf {
    dir.join(format!("ringrec-{}-h{}-{}", sanitize(job_id), host_id, sanitize(tag)))
}

/// True for a file name [`segment_path`] makes (`ringrec-<job>-h<digits>-<tag>`): the only
/// names the stale-file sweep of the shared-memory directory considers.
pub fn is_segment_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("ringrec-") else { return false };
    rest.match_indices("-h").any(|(at, _)| {
        let after = &rest[at + 2..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        at > 0 && digits > 0 && after[digits..].starts_with('-') && after.len() > digits + 1
    })
}

fn shm_err(path: &Path, source: std::io::Error) -> CommError {
    CommError::Shm { path: path.to_path_buf(), source }
}

impl SharedSegment {
    /// Creates a new zero-filled segment of `len` bytes, locked (see the module docs) and
    /// allocated in full; fails if the name exists or the directory has no room for it (the
    /// error names the directory, the bytes needed and free). Nothing is left on failure.
    pub fn create(path: &Path, len: usize) -> CommResult<SharedSegment> {
        Self::create_file(path, len).map_err(|e| shm_err(path, e))
    }

    fn create_file(path: &Path, len: usize) -> std::io::Result<SharedSegment> {
        let file = crate::fileio::create_locked(path, 0o600)?;
        let made = crate::fileio::reserve(&file, path, len as u64)
            .map_err(|e| std::io::Error::new(e.source.kind(), format!("cannot {}: {}", e.op, e.source)))
            .and_then(|_| file.set_len(len as u64))
            .and_then(|_| Self::map(file, path));
        if made.is_err() {
            let _ = std::fs::remove_file(path);
        }
        made
    }

    /// Opens a segment another process created and takes its liveness lock; checks that we
    /// own it and its size.
    pub fn open(path: &Path, len: usize) -> CommResult<SharedSegment> {
        let file = OpenOptions::new().read(true).write(true).open(path).map_err(|e| shm_err(path, e))?;
        crate::fileio::lock_shared(&file, path).map_err(|e| shm_err(path, e.source))?;
        let meta = file.metadata().map_err(|e| shm_err(path, e))?;
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        if meta.uid() != euid {
            return Err(shm_err(path, std::io::Error::other(format!("owned by uid {}, not by this user ({euid})", meta.uid()))));
        }
        if meta.len() != len as u64 {
            return Err(shm_err(path, std::io::Error::other(format!("size {} bytes, expected {len}", meta.len()))));
        }
        Self::map(file, path).map_err(|e| shm_err(path, e))
    }

    fn map(file: File, path: &Path) -> Result<SharedSegment, std::io::Error> {
        let map = memmap2::MmapOptions::new().map_raw(&file)?;
        Ok(SharedSegment { map, path: path.to_path_buf(), _file: file })
    }

    /// Creates the segment on the host leader (local rank 0 of `local`), maps it on every
    /// local rank, then removes the name. Collective over `local`; every rank gets the same
    /// success or failure.
    pub fn on_host(local: &Group, path: &Path, len: usize) -> CommResult<SharedSegment> {
        let _w = crate::watchdog::waiting("the host's ranks mapping a shared segment");
        // The name exists from here until the leader unlinks it below.
        let _tracked = (local.rank() == 0).then(|| crate::signals::track(path));
        let leader = local.comm.process_at_rank(0);
        // Empty: created; else the leader's error (the same message on every rank).
        let mut status = [0u8; STATUS_LEN];
        let mut seg = None;
        let mut leader_err = None;
        if local.rank() == 0 {
            match SharedSegment::create_file(path, len) {
                Ok(s) => seg = Some(s),
                Err(e) => {
                    write_status(&mut status, &e.to_string());
                    leader_err = Some(e);
                }
            }
        }
        leader.broadcast_into(&mut status[..]);
        if status[0] != 0 {
            return Err(shm_err(path, leader_err.unwrap_or_else(|| std::io::Error::other(read_status(&status)))));
        }
        let mut ok = 1u8;
        if local.rank() != 0 {
            match SharedSegment::open(path, len) {
                Ok(s) => seg = Some(s),
                Err(_) => ok = 0,
            }
        }
        let mut all_ok = 0u8;
        local.comm.all_reduce_into(&ok, &mut all_ok, mpi::collective::SystemOperation::min());
        if local.rank() == 0 {
            let _ = std::fs::remove_file(path);
        }
        match seg {
            Some(s) if all_ok == 1 => Ok(s),
            _ => Err(shm_err(path, std::io::Error::other("a local rank could not map the segment"))),
        }
    }

    /// Start of the mapping (page aligned).
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }
    /// True for a zero-length segment.
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }
    /// The path it was created under (already unlinked when made by [`SharedSegment::on_host`]).
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Bytes of the leader's status in [`SharedSegment::on_host`] (room for an error naming a
/// long path twice).
const STATUS_LEN: usize = 1024;

fn write_status(buf: &mut [u8; STATUS_LEN], msg: &str) {
    let b = msg.as_bytes();
    let n = b.len().min(STATUS_LEN - 1);
    buf[..n].copy_from_slice(&b[..n]);
    if n == 0 {
        buf[0] = b'?';
    }
}
fn read_status(buf: &[u8; STATUS_LEN]) -> String {
    String::from_utf8_lossy(buf).trim_end_matches('\0').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn sanitize_keeps_file_safe_chars() {
        assert_eq!(sanitize("job 12/a.b"), "job_12_a.b");
        assert_eq!(sanitize(&"x".repeat(100)).len(), 40);
    }
    #[test]
    fn create_is_exclusive_and_private() {
        let dir = std::env::temp_dir().join(format!("ringrec-shm-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("seg");
        let _ = std::fs::remove_file(&p);
        let a = SharedSegment::create(&p, 4096).unwrap();
        let mode = std::fs::metadata(&p).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(crate::fileio::is_locked(&p), "the creator holds the liveness lock");
        assert_eq!(std::fs::metadata(&p).unwrap().blocks() * 512, 4096, "allocated up front");
        assert!(SharedSegment::create(&p, 4096).is_err(), "second create must fail");
        let b = SharedSegment::open(&p, 4096).unwrap();
        drop(a);
        assert!(crate::fileio::is_locked(&p), "a peer that mapped it holds the lock too");
        let a = SharedSegment::open(&p, 4096).unwrap();
        drop(b);
        let b = SharedSegment::open(&p, 4096).unwrap();
        // SAFETY: both map the same 4096-byte file; single-threaded test.
        unsafe {
            *a.as_ptr().add(100) = 42;
            assert_eq!(*b.as_ptr().add(100), 42);
        }
        let err = SharedSegment::open(&p, 8192).err().unwrap().to_string();
        assert!(err.contains("expected 8192"), "{err}");
        drop((a, b));
        assert!(!crate::fileio::is_locked(&p), "nobody maps it any more");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_segment_too_large_for_its_directory_is_an_error_and_leaves_nothing() {
        let dir = std::env::temp_dir().join(format!("ringrec-shm-full-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("ringrec-j-h0-big");
        // More than any directory here has free, less than the largest file.
        let len = 1usize << 60;
        let err = SharedSegment::create(&p, len).err().expect("cannot fit").to_string();
        assert!(err.contains(&format!("needs {len} bytes")) && err.contains(&format!("free in {}", dir.display())), "{err}");
        assert!(!p.exists(), "the file is removed on failure");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn segment_names_are_recognised() {
        let p = segment_path(Path::new("/dev/shm"), "job-h1-x", 3, "coll-world");
        assert!(is_segment_name(&p.file_name().unwrap().to_string_lossy()));
        for name in ["ringrec-1234-abc-h0-table", "ringrec-j-h12-sparse-3"] {
            assert!(is_segment_name(name), "{name}");
        }
        for name in ["ringrec-saved.tbl", "ringrec-j-h0-", "ringrec--h0-x", "ringrec-j-hx-table", "other-j-h0-table", "ringrec-h0-table"] {
            assert!(!is_segment_name(name), "{name}");
        }
    }
}
