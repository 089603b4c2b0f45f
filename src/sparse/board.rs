//! [`HostBoard`]: a shared-memory segment where the ranks of one host publish serialized
//! lists for each other to read where they lie, with no copy into a receive buffer.
//!
//! Layout: per local rank two areas of `area_bytes` each ([`Area::Own`], [`Area::Range`]),
//! rank after rank; a rank writes only its own areas. [`HostBoard::publish`] is collective
//! over the host:
//!
//! 1. every rank tells every rank the length of its piece (a small shared-memory
//!    allgather, which is also a barrier: every rank has finished reading the pieces of the
//!    previous round of this area, since reading borrows the board and publishing needs it
//!    mutably);
//! 2. if a piece does not fit, every rank maps a larger segment (all decide alike from the
//!    same lengths; the old one goes away, and so do its other area's pieces);
//! 3. every rank writes its piece into its area, then a barrier: the pieces are readable.
//!
//! Segments grow to 5/4 of the largest piece seen and never shrink, so after the first
//! steps of a job a publish is two barriers and one copy of this rank's piece.

use std::sync::atomic::{AtomicU64, Ordering};

use super::error::{SparseError, SparseResult};
use crate::comm::shm::ShmCollectives;
use crate::comm::Collectives;
use crate::shm::{segment_path, SharedSegment};
use crate::topology::{Group, Topology};

/// The two areas of every rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Area {
    /// The rank's own (deduped) list.
    Own = 0,
    /// The rank's part of the step's result (its key range).
    Range = 1,
}

/// Tells apart the segments of one process (every local rank maps them in the same order).
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// Shared areas of the ranks of one host (see the module docs).
pub struct HostBoard {
    /// The host's ranks, to map segments.
    local: Group,
    job_id: String,
    host_id: usize,
    local_rank: usize,
    local_size: usize,
    seg: Option<SharedSegment>,
    /// Bytes of every area (a multiple of the page size).
    area_bytes: usize,
    /// Per area, the length of every local rank's last piece.
    lens: [Vec<usize>; 2],
}

impl std::fmt::Debug for HostBoard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBoard").field("local_rank", &self.local_rank).field("local_size", &self.local_size).field("area_bytes", &self.area_bytes).finish()
    }
}

const PAGE: usize = 4096;

impl HostBoard {
    /// A board for this rank's host; maps nothing until the first publish. Collective over
    /// the host (it duplicates the host's communicator).
    pub fn new(topo: &Topology) -> HostBoard {
        HostBoard {
            local: topo.local.duplicate(),
            job_id: topo.job_id.clone(),
            host_id: topo.host_id,
            local_rank: topo.local_rank,
            local_size: topo.local_size,
            seg: None,
            area_bytes: 0,
            lens: [vec![0; topo.local_size], vec![0; topo.local_size]],
        }
    }

    fn offset(&self, q: usize, area: Area) -> usize {
        (2 * q + area as usize) * self.area_bytes
    }

    /// Publishes this rank's piece of `len` bytes in `area`: `write` fills it (given exactly
    /// `len` bytes). Collective over the host, with `sync` (the host's shared-memory
    /// collectives) for the barriers; every rank gets the same error if the segment cannot
    /// grow. Afterwards [`HostBoard::piece`] reads any local rank's piece.
    pub fn publish(&mut self, sync: &mut ShmCollectives, area: Area, len: usize, write: impl FnOnce(&mut [u8])) -> SparseResult<()> {
        let lens = sync.allgatherv_raw(&(len as u64).to_le_bytes())?;
        if lens.counts.len() != self.local_size || lens.data.len() != 8 * self.local_size {
            return Err(SparseError::Invalid(format!("the host board's length exchange returned {} bytes for {} local ranks", lens.data.len(), self.local_size)));
        }
        let lens: Vec<usize> = lens.data.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()) as usize).collect();
        let most = lens.iter().copied().max().unwrap_or(0);
        if self.seg.is_none() || most > self.area_bytes {
            self.grow(most)?;
        }
        self.lens[area as usize] = lens;
        let off = self.offset(self.local_rank, area);
        if let Some(seg) = &self.seg {
            // SAFETY: the area lies inside the segment (`grow` made every area at least
            // `most >= len` bytes); only this rank writes it, and no peer reads it between the
            // length exchange above (every peer has finished reading the previous piece) and
            // the barrier below.
            let dst = unsafe { std::slice::from_raw_parts_mut(seg.as_ptr().add(off), len) };
            write(dst);
        }
        sync.barrier()?;
        Ok(())
    }

    /// Maps a segment whose areas hold `need` bytes (collective: every rank calls it with
    /// the same `need`).
    fn grow(&mut self, need: usize) -> SparseResult<()> {
        self.seg = None;
        self.area_bytes = 0;
        self.lens = [vec![0; self.local_size], vec![0; self.local_size]];
        let area = (need + need / 4 + PAGE).div_ceil(PAGE) * PAGE;
        let len = area
            .checked_mul(2 * self.local_size)
            .ok_or_else(|| SparseError::Invalid(format!("a host board of {} local ranks with {need}-byte pieces overflows the address space", self.local_size)))?;
        let generation = GENERATION.fetch_add(1, Ordering::Relaxed);
        let path = segment_path(&self.job_id, self.host_id, &format!("sparse-{generation}"));
        self.seg = Some(SharedSegment::on_host(&self.local, &path, len)?);
        self.area_bytes = area;
        Ok(())
    }

    /// Local rank `q`'s piece in `area`, as published by the last [`HostBoard::publish`] of
    /// that area (empty if there is no segment or no such rank).
    pub fn piece(&self, q: usize, area: Area) -> &[u8] {
        let (Some(seg), Some(len)) = (&self.seg, self.lens[area as usize].get(q)) else { return &[] };
        // SAFETY: inside the segment (`len <= area_bytes`, checked when it grew); written by
        // rank q before the barrier that ended the publish, and not written again until
        // every rank (this one included, which needs `&mut self`) enters the next publish.
        unsafe { std::slice::from_raw_parts(seg.as_ptr().add(self.offset(q, area)), *len) }
    }
}
