//! Shared-memory segments: one file in `/dev/shm` (or `RINGREC_SHM_DIR`) mapped by every
//! rank of a host.
//!
//! Hygiene: the name holds the job id and the host id, so jobs and simulated hosts never
//! collide; the leader creates it exclusively (`O_EXCL`, mode 0600); peers check owner and
//! size before mapping; once every local rank has mapped it, the leader unlinks the name,
//! so nothing is left in `/dev/shm` however the job ends (the memory lives until the last
//! mapping goes away).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use mpi::collective::CommunicatorCollectives;
use mpi::topology::Communicator;
use mpi::traits::Root;

use crate::topology::Group;
use crate::{CommError, CommResult};

/// A mapped shared-memory segment.
pub struct SharedSegment {
    map: memmap2::MmapRaw,
    path: PathBuf,
}

// SAFETY: the mapping is plain memory valid for the lifetime of the struct; concurrent
// access is coordinated by the protocols built on top (atomics in the segment).
unsafe impl Send for SharedSegment {}
// SAFETY: as above; `&SharedSegment` only hands out raw pointers.
unsafe impl Sync for SharedSegment {}

/// `<dir>/ringrec-<job>-h<host>-<tag>`.
pub fn segment_path(dir: &Path, job_id: &str, host_id: usize, tag: &str) -> PathBuf {
    dir.join(format!("ringrec-{}-h{}-{}", crate::topology::sanitize(job_id), host_id, crate::topology::sanitize(tag)))
}

fn shm_err(path: &Path, source: std::io::Error) -> CommError {
    CommError::Shm { path: path.to_path_buf(), source }
}

impl SharedSegment {
    /// Creates a new zero-filled segment of `len` bytes; fails if the name exists.
    pub fn create(path: &Path, len: usize) -> CommResult<SharedSegment> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| shm_err(path, e))?;
        let made = file.set_len(len as u64).and_then(|_| Self::map(&file, path));
        match made {
            Ok(seg) => Ok(seg),
            Err(e) => {
                let _ = std::fs::remove_file(path);
                Err(shm_err(path, e))
            }
        }
    }

    /// Opens a segment another process created; checks that we own it and its size.
    pub fn open(path: &Path, len: usize) -> CommResult<SharedSegment> {
        let file = OpenOptions::new().read(true).write(true).open(path).map_err(|e| shm_err(path, e))?;
        let meta = file.metadata().map_err(|e| shm_err(path, e))?;
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        if meta.uid() != euid {
            return Err(shm_err(path, std::io::Error::other(format!("owned by uid {}, not by this user ({euid})", meta.uid()))));
        }
        if meta.len() != len as u64 {
            return Err(shm_err(path, std::io::Error::other(format!("size {} bytes, expected {len}", meta.len()))));
        }
        Self::map(&file, path).map_err(|e| shm_err(path, e))
    }

    fn map(file: &File, path: &Path) -> Result<SharedSegment, std::io::Error> {
        let map = memmap2::MmapOptions::new().map_raw(file)?;
        Ok(SharedSegment { map, path: path.to_path_buf() })
    }

    /// Creates the segment on the host leader (local rank 0 of `local`), maps it on every
    /// local rank, then removes the name. Collective over `local`; every rank gets the same
    /// success or failure.
    pub fn on_host(local: &Group, path: &Path, len: usize) -> CommResult<SharedSegment> {
        let _w = crate::watchdog::waiting("the host's ranks mapping a shared segment");
        // The name exists from here until the leader unlinks it below.
        let _tracked = (local.rank() == 0).then(|| crate::signals::track(path));
        let leader = local.comm.process_at_rank(0);
        let mut status = [0u8; 256];
        let mut seg = None;
        if local.rank() == 0 {
            match SharedSegment::create(path, len) {
                Ok(s) => seg = Some(s),
                Err(e) => write_status(&mut status, &e.to_string()),
            }
        }
        leader.broadcast_into(&mut status[..]);
        if status[0] != 0 {
            return Err(shm_err(path, std::io::Error::other(read_status(&status))));
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

fn write_status(buf: &mut [u8; 256], msg: &str) {
    let b = msg.as_bytes();
    let n = b.len().min(255);
    buf[..n].copy_from_slice(&b[..n]);
    if n == 0 {
        buf[0] = b'?';
    }
}
fn read_status(buf: &[u8; 256]) -> String {
    String::from_utf8_lossy(buf).trim_end_matches('\0').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn create_is_exclusive_and_private() {
        let dir = std::env::temp_dir().join(format!("ringrec-shm-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("seg");
        let _ = std::fs::remove_file(&p);
        let a = SharedSegment::create(&p, 4096).unwrap();
        let mode = std::fs::metadata(&p).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(SharedSegment::create(&p, 4096).is_err(), "second create must fail");
        let b = SharedSegment::open(&p, 4096).unwrap();
        // SAFETY: both map the same 4096-byte file; single-threaded test.
        unsafe {
            *a.as_ptr().add(100) = 42;
            assert_eq!(*b.as_ptr().add(100), 42);
        }
        let err = SharedSegment::open(&p, 8192).err().unwrap().to_string();
        assert!(err.contains("expected 8192"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
