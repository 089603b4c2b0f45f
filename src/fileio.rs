//! The one way ringrec writes a file that others may read: under a temporary name in the
//! destination's directory, fsynced, renamed over the destination, and the directory
//! fsynced, so a reader (or a crash) sees the old file or the new one, never a part.
//! Tables, parameter files, data caches and checkpoints are all written so.

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
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = dest.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "file".into());
        let tmp = dest.with_file_name(format!(".{name}.tmp-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
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
        let dir = match self.dest.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        File::open(&dir).and_then(|d| d.sync_all()).map_err(|e| IoError::new(&dir, "fsync directory", e))
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
