//! [`HostBoard`]: a shared-memory segment where the ranks of one host publish serialized
//! lists for each other to read where they lie, with no copy into a receive buffer.
//!
//! Four segments: a [`HostBarrier`], a small control block (every rank's piece length and
//! rows on a cache line of its own, then the leader's status) and the data, one segment per
//! kind of area ([`Area::Own`], [`Area::Range`]) holding that area of every local rank,
//! rank after rank, each sized for the pieces that area held (local rank 0's range area
//! holds the host's whole list, the others' an error piece at most); a rank writes only its
//! own areas. A kind's segment grows without touching the other's, so the ranks' own lists
//! stay readable while the host's list is written ([`HostBoard::publish_list_from_own`]).
//! [`HostBoard::publish`] is collective over the host:
//!
//! 1. every rank posts the length of its piece and passes the barrier (so every rank has
//!    finished reading the pieces of the previous round of this area: reading borrows the
//!    board and publishing needs it mutably);
//! 2. if a piece does not fit its area, every rank maps a larger segment for that kind of
//!    area (all decide alike from the same lengths; the old one goes away, and so do the
//!    other ranks' pieces of that kind);
//! 3. every rank writes its piece into its area, then a barrier: the pieces are readable.
//!
//! An area's first segment holds its first piece exactly (page-rounded); when a piece does
//! not fit, the area grows to 5/4 of it, and it never shrinks, so a job whose steps have
//! equal pieces keeps no room it does not use, and after the first steps of any job a
//! publish is two barriers and one copy of this rank's piece (or none, where the writer
//! fills its area in place). The segment is allocated in full in the
//! shared-memory directory, so areas sized apart keep it near what the pieces need (a
//! rank's list per rank and the host's list once), not every area at the largest piece.
//!
//! [`HostBoard::publish_list`] is the same collective for one list written by all: every rank
//! posts how many rows it adds, every rank computes from the same numbers where its rows
//! lie in one serialized list (in local rank 0's [`Area::Range`]), and writes its keys,
//! counts and values there; the ranks write disjoint bytes, so the list is whole after the
//! second barrier without anybody copying it.
//!
//! The barrier is a [`HostBarrier`]: a waiting rank sleeps on a futex, and a wait ends
//! with an error after `RINGREC_COMM_TIMEOUT_SECONDS` or when a peer process is gone.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use super::error::{SparseError, SparseResult};
use super::list;
use crate::hostsync::HostBarrier;
use crate::shm::SharedSegment;
use crate::topology::{Group, Topology};

/// The two areas of every rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Area {
    /// The rank's own (deduped) list.
    Own = 0,
    /// The rank's part of the step's result (its key range).
    Range = 1,
}

/// What a local rank puts into the host's list ([`HostBoard::publish_list`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part<'a> {
    /// This many rows, after those of the local ranks before it.
    Rows(usize),
    /// An error piece instead of rows.
    Error(&'a [u8]),
}

/// Tells apart the segments of one process (every local rank maps them in the same order).
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// Bytes of the leader's status in the control block.
pub const STATUS_BYTES: usize = 1024;

/// Shared areas of the ranks of one host (see the module docs).
pub struct HostBoard {
    /// The host's ranks, to map segments.
    local: Group,
    /// The rank lines and the status.
    ctrl: SharedSegment,
    barrier: HostBarrier,
    /// This host's segment path up to the generation number.
    seg_prefix: PathBuf,
    local_rank: usize,
    local_size: usize,
    /// Per kind of area, the segment holding every local rank's area of that kind.
    seg: [Option<SharedSegment>; 2],
    /// Per area, the bytes of every local rank's (multiples of the page size; 0 without a
    /// segment).
    caps: [Vec<usize>; 2],
    /// Per area, the length of every local rank's last piece.
    lens: [Vec<usize>; 2],
}

impl std::fmt::Debug for HostBoard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBoard").field("local_rank", &self.local_rank).field("local_size", &self.local_size).field("caps", &self.caps).finish()
    }
}

const PAGE: usize = 4096;

/// Bytes of one area of a board whose largest piece is `need` bytes: a quarter more, so
/// that a slightly larger piece later does not make the board grow again, page-rounded.
fn area_bytes(need: usize) -> usize {
    (need.saturating_add(need / 4).saturating_add(PAGE)).div_ceil(PAGE) * PAGE
}

/// Bytes of an area's first segment for a first piece of `need` bytes: the piece, page-
/// rounded (a page at least, never empty).
fn first_area_bytes(need: usize) -> usize {
    need.max(1).div_ceil(PAGE).saturating_mul(PAGE)
}

/// The largest segment a host board of `local_size` ranks holds when no piece is over
/// `max_piece` bytes (two areas per local rank, each at most that): what the shared-memory
/// directory must keep free for it beside the host table.
pub fn board_bytes(local_size: usize, max_piece: usize) -> u64 {
    (area_bytes(max_piece) as u64).saturating_mul(2 * local_size as u64)
}

impl HostBoard {
    /// A board for this rank's host: maps the control block, and no data until the first
    /// publish. Collective over the host.
    pub fn new(topo: &Topology) -> SparseResult<HostBoard> {
        let local = topo.local.duplicate();
        let generation = GENERATION.fetch_add(1, Ordering::Relaxed);
        let path = topo.segment_path(&format!("sparse-ctrl-{generation}"));
        let ctrl_len = (64 * topo.local_size + STATUS_BYTES).div_ceil(PAGE) * PAGE;
        let ctrl = SharedSegment::on_host(&local, &path, ctrl_len)?;
        let barrier = HostBarrier::new(topo, &format!("sparse-barrier-{generation}"), "sparse host board")?;
        Ok(HostBoard {
            local,
            ctrl,
            barrier,
            seg_prefix: topo.segment_path("sparse-"),
            local_rank: topo.local_rank,
            local_size: topo.local_size,
            seg: [None, None],
            caps: [vec![0; topo.local_size], vec![0; topo.local_size]],
            lens: [vec![0; topo.local_size], vec![0; topo.local_size]],
        })
    }

    /// Word `w` (1: piece length, 2: rows for the host's list) of local rank `q`'s line.
    fn rank_word(&self, q: usize, w: usize) -> &AtomicU64 {
        debug_assert!(q < self.local_size && w < 8);
        // SAFETY: inside the control segment (sized for `local_size` lines), 8-byte aligned,
        // zero-initialised: a valid atomic.
        unsafe { &*(self.ctrl.as_ptr().add(64 * q + 8 * w) as *const AtomicU64) }
    }

    /// Returns once every local rank has entered it (the `n`-th call on every rank).
    pub fn barrier(&mut self) -> SparseResult<()> {
        Ok(self.barrier.wait()?)
    }

    /// The leader posts `status` (at most [`STATUS_BYTES`]) and every local rank gets it
    /// back after a barrier. Collective over the host.
    pub fn broadcast_status(&mut self, status: &mut [u8]) -> SparseResult<()> {
        if status.len() > STATUS_BYTES {
            return Err(SparseError::Invalid(format!("a status of {} bytes; the host board holds {STATUS_BYTES}", status.len())));
        }
        let at = 64 * self.local_size;
        if self.local_rank == 0 {
            // SAFETY: the status lies inside the control segment; only the leader writes it,
            // between the barrier that ended the previous status read (every rank read it
            // before entering a later barrier) and the barrier below.
            unsafe { std::ptr::copy_nonoverlapping(status.as_ptr(), self.ctrl.as_ptr().add(at), status.len()) };
        }
        self.barrier()?;
        if self.local_rank != 0 {
            // SAFETY: as above; the leader wrote it before the barrier and writes it again only
            // after this rank has entered its next barrier.
            unsafe { std::ptr::copy_nonoverlapping(self.ctrl.as_ptr().add(at), status.as_mut_ptr(), status.len()) };
        }
        Ok(())
    }

    /// Where local rank `q`'s `area` starts in that kind's segment: rank after rank.
    fn offset(&self, q: usize, area: Area) -> usize {
        self.caps[area as usize][..q].iter().sum()
    }

    /// Makes every local rank's `area` hold at least `needs[q]` bytes (collective: every
    /// rank calls it with the same `needs`): a larger segment when one does not fit.
    fn fit(&mut self, area: Area, needs: &[usize]) -> SparseResult<()> {
        let caps = &self.caps[area as usize];
        if self.seg[area as usize].is_some() && needs.iter().zip(caps).all(|(n, c)| n <= c) {
            return Ok(());
        }
        let first = self.seg[area as usize].is_none();
        let mut grown = caps.clone();
        for (c, n) in grown.iter_mut().zip(needs) {
            if first {
                *c = first_area_bytes(*n);
            } else if *n > *c {
                *c = area_bytes(*n);
            }
        }
        self.grow(area, grown)
    }

    /// Publishes this rank's piece of `len` bytes in `area`: `write` fills it (given exactly
    /// `len` bytes). Collective over the host; every rank gets the same error if the segment
    /// cannot grow. Afterwards [`HostBoard::piece`] reads any local rank's piece.
    pub fn publish(&mut self, area: Area, len: usize, write: impl FnOnce(&mut [u8])) -> SparseResult<()> {
        self.rank_word(self.local_rank, 1).store(len as u64, Ordering::Release);
        self.barrier()?;
        let lens: Vec<usize> = (0..self.local_size).map(|q| self.rank_word(q, 1).load(Ordering::Acquire) as usize).collect();
        self.fit(area, &lens)?;
        self.lens[area as usize] = lens;
        let off = self.offset(self.local_rank, area);
        if let Some(seg) = &self.seg[area as usize] {
            // SAFETY: the area lies inside the segment (`fit` made this rank's area at least
            // `len` bytes); only this rank writes it, and no peer reads it between the
            // barrier above (every peer has finished reading the previous piece) and the
            // barrier below.
            let dst = unsafe { std::slice::from_raw_parts_mut(seg.as_ptr().add(off), len) };
            write(dst);
        }
        self.barrier()
    }

    /// Collective over the host: every local rank puts its part into one list shared by the
    /// host, serialized with counts in local rank 0's [`Area::Range`]: the rows of local
    /// rank 0, then those of local rank 1, and so on (so the ranks' parts must follow each
    /// other in key order). Each rank writes its own rows where they lie in the list:
    /// `write` gets the keys, counts and values of exactly its rows (it is not called for an
    /// error or no rows). If any rank sent an error, no list is written and every error piece
    /// lands in its sender's range area instead.
    ///
    /// Returns whether the list was written. Afterwards [`HostBoard::piece`]`(0,
    /// Area::Range)` reads the whole list (or local rank 0's error piece), and `piece(q,
    /// Area::Range)` local rank `q`'s error piece (empty if it had none).
    pub fn publish_list(&mut self, part: Part<'_>, dim: usize, write: impl FnOnce(list::Sections<'_>)) -> SparseResult<bool> {
        self.publish_list_from_own(part, dim, |_, sections| write(sections))
    }

    /// [`HostBoard::publish_list`], where `write` also reads every local rank's piece in
    /// [`Area::Own`] (as the last [`HostBoard::publish`] of that area left them, in
    /// local-rank order): a rank merges its part of the host's list straight from the
    /// ranks' own lists, with no copy of its own in between. The own pieces stay as they
    /// are: only the range areas' segment may grow here.
    pub fn publish_list_from_own(&mut self, part: Part<'_>, dim: usize, write: impl FnOnce(&[&[u8]], list::Sections<'_>)) -> SparseResult<bool> {
        let (rows, error) = match part {
            Part::Rows(n) => (n, &[][..]),
            Part::Error(piece) => (0, piece),
        };
        self.rank_word(self.local_rank, 1).store(error.len() as u64, Ordering::Release);
        self.rank_word(self.local_rank, 2).store(rows as u64, Ordering::Release);
        self.barrier()?;
        let errors: Vec<usize> = (0..self.local_size).map(|q| self.rank_word(q, 1).load(Ordering::Acquire) as usize).collect();
        let parts: Vec<usize> = (0..self.local_size).map(|q| self.rank_word(q, 2).load(Ordering::Acquire) as usize).collect();
        if errors.iter().any(|len| *len > 0) {
            self.fit(Area::Range, &errors)?;
            self.lens[Area::Range as usize] = errors;
            if let Some(seg) = &self.seg[Area::Range as usize] {
                let off = self.offset(self.local_rank, Area::Range);
                // SAFETY: as in `publish`: this rank's own area, at least its error's length
                // (`fit`), read by no peer until the barrier below.
                let dst = unsafe { std::slice::from_raw_parts_mut(seg.as_ptr().add(off), error.len()) };
                dst.copy_from_slice(error);
            }
            self.barrier()?;
            return Ok(false);
        }
        let total = parts.iter().try_fold(0usize, |a, n| a.checked_add(*n)).unwrap_or(usize::MAX);
        let header = list::header(total, dim, true)?;
        let need = list::encoded_len(total, dim, true);
        let mut lens = vec![0; self.local_size];
        lens[0] = need;
        self.fit(Area::Range, &lens)?;
        self.lens[Area::Range as usize] = lens;
        let first: usize = parts[..self.local_rank].iter().sum();
        let [keys, counts, values] = list::row_spans(total, dim, true, first..first + rows);
        if let Some(seg) = &self.seg[Area::Range as usize] {
            let list = seg.as_ptr().wrapping_add(self.offset(0, Area::Range));
            if self.local_rank == 0 {
                // SAFETY: the header lies at the start of local rank 0's range area (at least
                // `need` bytes); only local rank 0 writes it, and no rank reads the area until
                // the barrier below.
                unsafe { std::ptr::copy_nonoverlapping(header.as_ptr(), list, header.len()) };
            }
            if rows > 0 {
                // SAFETY: the three spans lie inside the list (`row_spans` of `total` rows, the
                // area holds `need` bytes) and belong to this rank's rows only: every rank
                // computed the same `total` and offsets from the same posted parts, so no two
                // ranks write the same bytes, and no rank reads them until the barrier below.
                // The area is page aligned and the spans start at multiples of 8 (keys) and 4
                // (counts, values) bytes from it.
                let sections = unsafe {
                    (
                        std::slice::from_raw_parts_mut(list.add(keys.start) as *mut u64, rows),
                        std::slice::from_raw_parts_mut(list.add(counts.start) as *mut u32, rows),
                        std::slice::from_raw_parts_mut(list.add(values.start) as *mut f32, rows * dim),
                    )
                };
                let (k, c, v) = sections;
                let own: Vec<&[u8]> = (0..self.local_size).map(|q| self.piece(q, Area::Own)).collect();
                write(&own, (&mut *k, &mut *c, &mut *v));
                if cfg!(target_endian = "big") {
                    k.iter_mut().for_each(|x| *x = x.to_le());
                    c.iter_mut().for_each(|x| *x = x.to_le());
                    v.iter_mut().for_each(|x| *x = f32::from_bits(x.to_bits().to_le()));
                }
            }
        }
        self.barrier()?;
        Ok(true)
    }

    /// Maps a segment for `area` whose areas hold `caps` bytes, one per local rank
    /// (collective: every rank calls it with the same `caps`); the other kind's stays.
    fn grow(&mut self, area: Area, caps: Vec<usize>) -> SparseResult<()> {
        let a = area as usize;
        self.seg[a] = None;
        self.caps[a] = vec![0; self.local_size];
        self.lens[a] = vec![0; self.local_size];
        let len = caps
            .iter()
            .try_fold(0usize, |a, c| a.checked_add(*c))
            .ok_or_else(|| SparseError::Invalid(format!("a host board of {} local ranks with areas of {caps:?} bytes overflows the address space", self.local_size)))?;
        let generation = GENERATION.fetch_add(1, Ordering::Relaxed);
        let mut path = self.seg_prefix.clone().into_os_string();
        path.push(generation.to_string());
        let path = PathBuf::from(path);
        self.seg[a] = Some(SharedSegment::on_host(&self.local, &path, len)?);
        self.caps[a] = caps;
        Ok(())
    }

    /// Local rank `q`'s piece in `area`, as published by the last [`HostBoard::publish`] of
    /// that area (empty if there is no segment or no such rank).
    pub fn piece(&self, q: usize, area: Area) -> &[u8] {
        let (Some(seg), Some(len)) = (&self.seg[area as usize], self.lens[area as usize].get(q)) else { return &[] };
        // SAFETY: inside the segment (`len` fits the area, `fit` checked it); written by
        // rank q before the barrier that ended the publish, and not written again until
        // every rank (this one included, which needs `&mut self`) enters the next publish.
        unsafe { std::slice::from_raw_parts(seg.as_ptr().add(self.offset(q, area)), *len) }
    }
}
