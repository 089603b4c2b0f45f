//! A table's image: the bytes of a table file as a saved table is written from them — the
//! live mapping itself ([`EmbeddingTable::image`]) or a private copy taken between steps
//! ([`EmbeddingTable::snapshot`], [`TableSnapshot`]), which a background thread writes while
//! training changes the live table. [`TableImage::save`] is the one writer of a saved table
//! (per-block CRC-32 sums, atomic, fsynced), [`EmbeddingTable::save`] included.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use memmap2::MmapMut;
use rayon::prelude::*;

use super::error::{TableError, TableResult};
use super::format::{Header, HEADER_FIELDS, HEADER_LEN};
use super::table::{sealed, sub, EmbeddingTable};
use crate::fileio::{self, AtomicFile, IoError};
use crate::hash;

/// The bytes of a table file and their header, ready to be saved.
#[derive(Clone, Copy)]
pub struct TableImage<'a> {
    /// The table they were taken from (named by errors).
    origin: &'a Path,
    bytes: &'a [u8],
    header: Header,
}

impl TableImage<'_> {
    /// The header of the image (parsed from its bytes).
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The whole file's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes
    }

    /// Writes the table to `path` atomically (a temporary file in the same directory, its
    /// space reserved up front, fsync, rename over `path`, fsync of the directory), with
    /// the CRC-32 of every block of the body in the sums section and the checksums flag
    /// set: every later open verifies them. The sums are computed on the rayon pool while
    /// the body is written (the header, which records their own CRC, is written last), so
    /// they add little to the time of the write. Pages of the body that are all zeros (the
    /// rows, state and usage of empty slots: most of a new table) are not written
    /// ([`fileio::write_nonzero_at`]): the reserved file reads as zeros there, so the file
    /// reads back byte for byte the same, and the write and fsync cost the used pages only.
    pub fn save(&self, path: &Path) -> TableResult<()> {
        let (h, b) = (&self.header, self.bytes);
        let l = h.layout;
        let body = sub(self.origin, b, l.index_offset, l.sums_offset - l.index_offset)?;
        let f = AtomicFile::create(path, 0o600)?;
        fileio::reserve(f.file(), path, l.file_len)?;
        let io = |e| IoError::new(f.path(), "write", e);
        let out = f.file();
        // Where the filesystem cannot reserve, the length makes the pages not written zeros.
        out.set_len(l.file_len).map_err(io)?;
        // The header page goes in last; until the rename nobody sees the file anyway. The
        // sums are a rayon task this thread may run itself (when it is the pool's only
        // worker, or a thread outside the pool), never one it blocks on.
        let (written, sums) = rayon::join(|| fileio::write_nonzero_at(out, l.index_offset, body), || hash::block_sums(body));
        written.map_err(io)?;
        let (tail, sealed) = sealed(h, sums);
        let mut head = vec![0u8; HEADER_LEN as usize];
        head[..HEADER_FIELDS].copy_from_slice(&sealed.encode());
        out.write_all_at(&tail, l.sums_offset).and_then(|_| out.write_all_at(&head, 0)).map_err(io)?;
        Ok(f.commit()?)
    }
}

/// A private copy of a table's bytes (an anonymous mapping, page-aligned like the file's),
/// taken at memory speed between steps: the table's memory twice while it lives. Dropped,
/// its memory is kept for the process's next snapshot of the same size ([`SPARE`]).
pub struct TableSnapshot {
    origin: PathBuf,
    /// `Some` until dropped.
    map: Option<MmapMut>,
    header: Header,
}

impl TableSnapshot {
    /// Its image, to save.
    pub fn image(&self) -> TableImage<'_> {
        TableImage { origin: &self.origin, bytes: self.map.as_deref().unwrap_or(&[]), header: self.header }
    }
}

impl Drop for TableSnapshot {
    fn drop(&mut self) {
        if let (Some(map), Ok(mut spare)) = (self.map.take(), SPARE.lock()) {
            *spare = Some(map);
        }
    }
}

/// The memory of the last snapshot, reused by the next one of the same size: a fresh
/// anonymous mapping of a 151 MB table costs 37,000 page faults (0.2-0.5 s on the training
/// thread, measured) where a copy into pages already present takes 0.02 s. A run that
/// checkpoints in the background so holds the table's memory twice from its first
/// checkpoint on (docs/reliability.md).
static SPARE: std::sync::Mutex<Option<MmapMut>> = std::sync::Mutex::new(None);

/// The size of the memory kept for the next snapshot (0: none).
pub fn spare_bytes() -> u64 {
    SPARE.lock().ok().and_then(|s| s.as_ref().map(|m| m.len() as u64)).unwrap_or(0)
}

impl EmbeddingTable {
    /// The image of the table as it is now, in its own mapping (valid while nothing
    /// updates it).
    pub fn image(&self) -> TableResult<TableImage<'_>> {
        let b = self.as_bytes();
        Ok(TableImage { origin: self.path(), bytes: b, header: Header::parse(self.path(), b, b.len() as u64)? })
    }

    /// A copy of the table's bytes as they are now (call it between steps, while no rank
    /// updates the table), made on the rayon pool in 16 MiB pieces; its header is the one
    /// of the copied bytes.
    pub fn snapshot(&self) -> TableResult<TableSnapshot> {
        let from = self.as_bytes();
        let header = Header::parse(self.path(), from, from.len() as u64)?;
        let kept = SPARE.lock().ok().and_then(|mut s| s.take()).filter(|m| m.len() == from.len());
        let mut map = match kept {
            Some(m) => m,
            None => {
                let m = MmapMut::map_anon(from.len()).map_err(|e| TableError::io(self.path(), "map memory for a snapshot of", e))?;
                // Huge pages where the kernel has them: a 151 MB copy otherwise spends most
                // of its time faulting in 37,000 fresh 4 KiB pages (0.3-0.5 s measured,
                // against 0.03 s).
                let _ = m.advise(memmap2::Advice::HugePage);
                m
            }
        };
        map.par_chunks_mut(1 << 24).zip(from.par_chunks(1 << 24)).for_each(|(d, s)| d.copy_from_slice(s));
        Ok(TableSnapshot { origin: self.path().to_path_buf(), map: Some(map), header })
    }
}

/// The memory the kernel can give without swapping (`MemAvailable` of /proc/meminfo), in
/// bytes; `None` where unknown.
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb = text.lines().find_map(|l| l.strip_prefix("MemAvailable:"))?.split_whitespace().next()?.parse::<u64>().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embedding::TableConfig;

    #[test]
    fn a_snapshot_saves_the_bytes_of_its_moment_and_the_live_table_moves_on() {
        let root = std::env::temp_dir().join(format!("ringrec-snapshot-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let mut t = EmbeddingTable::create(&root.join("live"), &TableConfig::new(4, 64)).unwrap();
        t.put_rows(&[3, 5], &[0.25; 8]).unwrap();
        let snap = t.snapshot().unwrap();
        assert_eq!(snap.image().as_bytes(), t.as_bytes());
        t.put_rows(&[3, 7], &[0.5; 8]).unwrap();
        snap.image().save(&root.join("snap.rrt")).unwrap();
        t.image().unwrap().save(&root.join("now.rrt")).unwrap();
        let (s, n) = (EmbeddingTable::open_readonly(&root.join("snap.rrt")).unwrap(), EmbeddingTable::open_readonly(&root.join("now.rrt")).unwrap());
        assert_eq!((s.live_rows(), n.live_rows()), (2, 3));
        let mut row = [0f32; 4];
        s.lookup(&[3], &mut row).unwrap();
        assert_eq!(row, [0.25; 4], "the row as it was when the snapshot was taken");
        n.lookup(&[3], &mut row).unwrap();
        assert_eq!(row, [0.5; 4]);
        assert!(available_memory().is_some_and(|b| b > 0));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
