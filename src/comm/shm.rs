//! `shm`: collectives among the ranks of one host through a shared-memory segment.
//!
//! Layout: one control block per rank (two cache-line `arrive` words, one per round
//! parity, each carrying the round's [`Header`] in the same line; a `reduced` word; the
//! rank's pid), then two data slots per rank (double buffering). Every collective is a
//! sequence of *rounds*, the same number on every rank; round `it` uses slot buffer `it % 2`
//! and arrive line `it % 2`:
//!
//! 1. write this rank's input piece into its slot, its header into its arrive line, then
//!    `arrive = it+1` (release);
//! 2. wait for every peer's `arrive`; compare headers (a mismatch ends the collective with
//!    the same error on every rank, after the same number of rounds);
//! 3. consume peers' slots (allreduce: rank r reduces the r-th 1/P slice straight from every
//!    peer's slot, publishes it, `reduced = it+1`, waits, copies the others' slices).
//!
//! No "done" handshake is needed before a buffer is reused: a peer arrives at round it+1
//! only after it finished round it, so once we have seen every peer arrive at round it+1
//! (step 2 of that round) the buffers and header line of round it are free for round it+2.
//! A small allreduce therefore costs one cache-line transfer each way (arrive + header) plus
//! its data lines.
//!
//! Allreduce cuts the buffer into P parts (part r is reduced by rank r, summing ranks in
//! order 0..P, so every rank gets bit-identical results — and every element is summed in
//! that one order wherever it sits: fusion never changes its bits) and moves them through the slots
//! in cache-sized pieces, so peers' data is read from the shared L3 rather than DRAM.
//! Small buffers take a one-sync direct path: every rank reduces the whole buffer itself.
//! Waits spin, then yield, then sleep in short naps, check a deadline (`RINGREC_COMM_TIMEOUT_SECONDS`, default 300)
//! and that peer processes are still alive.
//!
//! **Counted traffic** ([`super::count`], all of it inside the host): *sent* is what this
//! rank wrote into its slots for other ranks to read, once per rank that reads it (a
//! sliced allreduce's piece for rank l counts once, its reduced part once per peer, a
//! direct allreduce's whole buffer once per peer); *received* is what it read from other
//! ranks' slots. A sliced allreduce of B bytes thus sends and receives about
//! `2 (P-1)/P B` per rank (parts round to whole elements), a direct one `(P-1) B`.
//! Headers and arrival words are not counted.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mpi::collective::CommunicatorCollectives;

use super::count::PeerCounter;
use super::fused::even_parts;
use super::scattered::{aligned_bytes, ByteView};
use super::traffic::Traffic;
use super::{check_headers, Collectives, Gathered, Header, Scattered};
use crate::dtype::{self, DType, ReduceOp};
use crate::hostsync::PeerWatch;
use crate::shm::SharedSegment;
use crate::topology::Topology;
use crate::{CommError, CommResult};

/// Default bytes per data slot (`RINGREC_SHM_CHUNK_BYTES`).
pub const DEFAULT_SLOT_BYTES: usize = 1 << 20;
/// Buffers up to this size take the direct (one-sync) allreduce path.
pub const DIRECT_MAX_BYTES: usize = 16 << 10;

/// The largest buffer an allreduce reduces by the direct path, for a configured
/// `RINGREC_SHM_CHUNK_BYTES` of `chunk_bytes`.
pub fn direct_max(chunk_bytes: usize) -> usize {
    DIRECT_MAX_BYTES.min(slot_bytes(chunk_bytes))
}

/// The data slot's size for a configured chunk: rounded up to whole cache lines.
fn slot_bytes(chunk_bytes: usize) -> usize {
    (chunk_bytes + 63) & !63
}

#[repr(C, align(64))]
struct Line {
    v: AtomicU64,
    words: [AtomicU64; 7],
}

#[repr(C)]
struct Ctrl {
    /// By round parity: the arrival counter (`v`) and the round's header (`words[..4]`),
    /// double-buffered like the data slots: a peer may already be one round ahead (and
    /// write its next header) while we read this round's.
    arrive: [Line; 2],
    reduced: Line,
    pid: Line,
}

#[derive(Clone, Copy)]
enum Phase {
    Arrive,
    Reduced,
}

/// Shared-memory collectives among the ranks of one host.
pub struct ShmCollectives {
    seg: SharedSegment,
    rank: usize,
    size: usize,
    slot_bytes: usize,
    data_off: usize,
    iter: u64,
    watch: PeerWatch,
    /// Reduction target for pieces of a scattered buffer that straddle its parts.
    scratch: Vec<u64>,
    /// The payload bytes moved through the slots (see the module docs).
    counter: PeerCounter,
}

impl ShmCollectives {
    /// Maps a segment shared by the ranks of this host (collective over `topo.local`).
    /// `tag` tells apart several segments of one job.
    pub fn on_host(topo: &Topology, tag: &str) -> CommResult<ShmCollectives> {
        let size = topo.local_size;
        let slot_bytes = slot_bytes(topo.config.shm_chunk_bytes);
        let ctrl_bytes = size * std::mem::size_of::<Ctrl>();
        let data_off = (ctrl_bytes + 4095) & !4095;
        let len = data_off + size * 2 * slot_bytes;
        let path = topo.segment_path(&format!("coll-{tag}"));
        let seg = SharedSegment::on_host(&topo.local, &path, len)?;
        let mut me = ShmCollectives {
            seg,
            rank: topo.local_rank,
            size,
            slot_bytes,
            data_off,
            iter: 0,
            watch: PeerWatch::new(topo),
            scratch: Vec::new(),
            counter: PeerCounter::one_host(size),
        };
        me.ctrl(me.rank).pid.v.store(std::process::id() as u64, Ordering::Release);
        topo.local.comm.barrier();
        for q in 0..size {
            me.watch.pids[q] = me.ctrl(q).pid.v.load(Ordering::Acquire) as i32;
        }
        Ok(me)
    }

    fn ctrl(&self, q: usize) -> &Ctrl {
        debug_assert!(q < self.size);
        // SAFETY: the segment holds `size` zero-initialised Ctrl blocks at its start (page
        // aligned, so 64-byte aligned); all-zero bytes are valid AtomicU64s.
        unsafe { &*(self.seg.as_ptr().add(q * std::mem::size_of::<Ctrl>()) as *const Ctrl) }
    }

    /// Peer q's line of `phase` in the current round.
    fn line(&self, q: usize, phase: Phase) -> &Line {
        let c = self.ctrl(q);
        match phase {
            Phase::Arrive => &c.arrive[(self.iter % 2) as usize],
            Phase::Reduced => &c.reduced,
        }
    }

    fn slot(&self, q: usize, b: usize) -> *mut u8 {
        // SAFETY: q < size and b < 2, so the slot lies inside the segment.
        unsafe { self.seg.as_ptr().add(self.data_off + (q * 2 + b) * self.slot_bytes) }
    }

    /// Waits until every peer's `phase` counter reached `target`.
    fn wait_all(&mut self, phase: Phase, target: u64, what: &'static str) -> CommResult<()> {
        let start = crate::hostsync::WaitStart::now();
        let mut last_check = Instant::now();
        let mut spins: u32 = 0;
        let mut sleeping: Option<Instant> = None;
        loop {
            let mut ready = true;
            for q in 0..self.size {
                if q != self.rank && self.line(q, phase).v.load(Ordering::Acquire) < target {
                    ready = false;
                    break;
                }
            }
            if ready {
                return Ok(());
            }
            spins = spins.wrapping_add(1);
            if spins < 4000 {
                std::hint::spin_loop();
                continue;
            }
            // Then give the core away: a few yields, then sleeps growing with the wait (a
            // peer that is still computing should not have to share its core with this wait).
            if spins < 4256 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(super::poll_sleep(sleeping.get_or_insert_with(Instant::now).elapsed()));
            }
            if spins % 64 != 0 {
                continue;
            }
            let now = Instant::now();
            if now.duration_since(last_check) > Duration::from_millis(200) {
                last_check = now;
                let late: Vec<usize> = (0..self.size).filter(|q| *q != self.rank && self.line(*q, phase).v.load(Ordering::Acquire) < target).collect();
                self.watch.check(what, &start, &late)?;
            }
        }
    }

    /// Counts `bytes` of this rank's slot read by every peer (`None`) or by `reader` only.
    fn count_sent(&mut self, bytes: usize, reader: Option<usize>) {
        for q in 0..self.size {
            if q != self.rank && reader.is_none_or(|r| r == q) {
                self.counter.sent(q, bytes);
            }
        }
    }

    /// Counts `bytes` read from every peer's slot.
    fn count_received_from_all(&mut self, bytes: usize) {
        for q in (0..self.size).filter(|q| *q != self.rank) {
            self.counter.received(q, bytes);
        }
    }

    fn check_usable(&self) -> CommResult<()> {
        self.watch.usable()
    }

    /// Round start: this round's slot buffer. It is free on every rank: each peer arrived
    /// at the previous round, so it finished the one before (see the module docs).
    fn begin(&self) -> usize {
        (self.iter % 2) as usize
    }

    fn publish(&self, phase: Phase) {
        self.line(self.rank, phase).v.store(self.iter + 1, Ordering::Release);
    }

    fn finish(&mut self) {
        self.iter += 1;
    }

    /// Peer q's header of this round (valid between every peer's arrival and `finish`).
    fn header_words(&self, q: usize) -> [u64; 4] {
        let w = &self.line(q, Phase::Arrive).words;
        [w[0].load(Ordering::Relaxed), w[1].load(Ordering::Relaxed), w[2].load(Ordering::Relaxed), w[3].load(Ordering::Relaxed)]
    }

    /// Every rank's header of this round.
    fn headers(&self) -> Vec<Header> {
        (0..self.size).map(|q| Header::from_words(&self.header_words(q))).collect()
    }

    /// Publishes our arrival (with our header when `h` is given), waits for everyone,
    /// compares headers.
    fn arrive_with_header(&mut self, h: Option<&Header>, what: &'static str) -> CommResult<()> {
        let mine = h.map(Header::to_words);
        if let Some(w) = mine {
            let line = self.line(self.rank, Phase::Arrive);
            for (i, x) in w.iter().enumerate() {
                line.words[i].store(*x, Ordering::Relaxed);
            }
        }
        self.publish(Phase::Arrive);
        self.wait_all(Phase::Arrive, self.iter + 1, what)?;
        let (Some(h), Some(w)) = (h, mine) else { return Ok(()) };
        // Identical headers agree; otherwise the full comparison decides (gathers allow
        // different counts) and names the ranks.
        if (0..self.size).all(|q| self.header_words(q) == w) {
            return Ok(());
        }
        if let Err(e) = check_headers(h, &self.headers()) {
            self.finish();
            return Err(e);
        }
        Ok(())
    }

    /// Copies `src` into slot (me, b) at `off`.
    fn put(&self, b: usize, off: usize, src: &[u8]) {
        self.put_from(b, off, src, 0..src.len());
    }

    /// Copies bytes `r` of `src` into slot (me, b) at `off`.
    fn put_from<V: ByteView + ?Sized>(&self, b: usize, off: usize, src: &V, r: std::ops::Range<usize>) {
        debug_assert!(off + r.len() <= self.slot_bytes);
        // SAFETY: the destination lies in our own slot, which no peer reads before our
        // `arrive` for this round (and which every peer finished reading: `begin`); nothing
        // else holds a reference into it while this one lives.
        let dst = unsafe { std::slice::from_raw_parts_mut(self.slot(self.rank, b).add(off), r.len()) };
        src.read_range(r, dst);
    }

    /// Reduces `srcs` into bytes `r` of `buf`: in place when the range is contiguous, else
    /// through the scratch buffer.
    fn reduce_range<V: ByteView + ?Sized>(scratch: &mut Vec<u64>, buf: &mut V, r: std::ops::Range<usize>, srcs: &[&[u8]], dtype: DType, op: ReduceOp, scale: Option<usize>) -> CommResult<()> {
        if let Some(dst) = buf.range_mut(r.clone()) {
            return dtype::reduce_into(dst, srcs, dtype, op, scale);
        }
        if scratch.len() * 8 < r.len() {
            *scratch = aligned_bytes(r.len());
        }
        let tmp = &mut bytemuck::cast_slice_mut::<u64, u8>(scratch)[..r.len()];
        dtype::reduce_into(tmp, srcs, dtype, op, scale)?;
        buf.write_range(r, tmp);
        Ok(())
    }

    /// Peer q's slot b bytes `off..off+len`, valid to read between its `arrive` (or
    /// `reduced`) and our `done` of this round.
    fn peer(&self, q: usize, b: usize, off: usize, len: usize) -> &[u8] {
        debug_assert!(off + len <= self.slot_bytes);
        // SAFETY: inside the segment; by the round protocol nobody writes this range until
        // we publish `done` for the round.
        unsafe { std::slice::from_raw_parts(self.slot(q, b).add(off), len) }
    }

    fn allreduce_direct<V: ByteView + ?Sized>(&mut self, buf: &mut V, dtype: DType, op: ReduceOp, h: &Header) -> CommResult<()> {
        let len = buf.view_len();
        let b = self.begin();
        self.put_from(b, 0, buf, 0..len);
        self.arrive_with_header(Some(h), "allreduce")?;
        self.count_sent(len, None);
        self.count_received_from_all(len);
        let mut scratch = std::mem::take(&mut self.scratch);
        let scale = (op == ReduceOp::Average).then_some(self.size);
        // reduce_into only fails on ragged buffers, excluded by the header check.
        let r = if self.size <= 8 {
            // No allocation on the latency path.
            let mut srcs: [&[u8]; 8] = [&[]; 8];
            (0..self.size).for_each(|q| srcs[q] = self.peer(q, b, 0, len));
            Self::reduce_range(&mut scratch, buf, 0..len, &srcs[..self.size], dtype, op, scale)
        } else {
            let srcs: Vec<&[u8]> = (0..self.size).map(|q| self.peer(q, b, 0, len)).collect();
            Self::reduce_range(&mut scratch, buf, 0..len, &srcs, dtype, op, scale)
        };
        self.scratch = scratch;
        self.finish();
        r
    }

    /// The P-part layout: part l of the buffer moves through the slots in pieces of
    /// `piece` elements; piece k of part l sits at `l * piece` in every slot.
    fn piece_elems(&self, dtype: DType) -> usize {
        (self.slot_bytes / self.size / dtype.size()).max(1)
    }

    /// Elements per piece and rounds, for a buffer cut into `parts` (element ranges, one
    /// per rank).
    fn plan(&self, parts: &[Range<usize>], dtype: DType) -> (usize, usize) {
        let piece = self.piece_elems(dtype);
        let max_part = parts.iter().map(|p| p.len()).max().unwrap_or(0);
        (piece, max_part.div_ceil(piece).max(1))
    }

    /// Range (bytes) of piece k of part `p`.
    fn piece_range(p: &Range<usize>, k: usize, piece: usize, esz: usize) -> Range<usize> {
        let s = (p.start + k * piece).min(p.end);
        let e = (s + piece).min(p.end);
        s * esz..e * esz
    }

    /// Sliced allreduce of a buffer cut into `parts` (rank l reduces part l: [`even_parts`]
    /// for the buffer alone; `scatter_only`: stop after the reduce-scatter, leaving only
    /// this rank's part reduced; used by `hier`). `h` is checked in round 0. A rank reduces its
    /// own part in place in its buffer, reading only the peers' pieces from their slots
    /// (its own piece is not copied through its slot), when that piece is contiguous.
    fn allreduce_sliced<V: ByteView + ?Sized>(&mut self, buf: &mut V, parts: &[Range<usize>], dtype: DType, op: ReduceOp, h: &Header, scatter_only: bool) -> CommResult<()> {
        debug_assert_eq!(parts.len(), self.size);
        let esz = dtype.size();
        let (piece, rounds) = self.plan(parts, dtype);
        let pb = piece * esz;
        let scale = (op == ReduceOp::Average && !scatter_only).then_some(self.size);
        for k in 0..rounds {
            let b = self.begin();
            let mine = Self::piece_range(&parts[self.rank], k, piece, esz);
            let in_place = buf.range_mut(mine.clone()).is_some();
            for (l, part) in parts.iter().enumerate() {
                if l != self.rank || !in_place {
                    let r = Self::piece_range(part, k, piece, esz);
                    if l != self.rank {
                        self.counter.sent(l, r.len());
                    }
                    self.put_from(b, l * pb, buf, r);
                }
            }
            self.arrive_with_header((k == 0).then_some(h), "allreduce")?;
            let len = mine.len();
            self.count_received_from_all(len);
            {
                let mut scratch = std::mem::take(&mut self.scratch);
                let r = if in_place {
                    let srcs: Vec<&[u8]> = (0..self.size).filter(|q| *q != self.rank).map(|q| self.peer(q, b, self.rank * pb, len)).collect();
                    match buf.range_mut(mine.clone()) {
                        Some(dst) => dtype::reduce_with_own(dst, &srcs, Some(self.rank), dtype, op, scale),
                        None => Err(CommError::Invalid("shm: a contiguous piece became scattered".into())),
                    }
                } else {
                    let srcs: Vec<&[u8]> = (0..self.size).map(|q| self.peer(q, b, self.rank * pb, len)).collect();
                    Self::reduce_range(&mut scratch, buf, mine.clone(), &srcs, dtype, op, scale)
                };
                self.scratch = scratch;
                r.map_err(|e| self.watch.poison(e))?;
            }
            if scatter_only {
                self.finish();
                continue;
            }
            self.count_sent(mine.len(), None);
            self.put_from(b, self.rank * pb, buf, mine);
            self.publish(Phase::Reduced);
            self.wait_all(Phase::Reduced, self.iter + 1, "allreduce")?;
            for (q, part) in parts.iter().enumerate() {
                if q != self.rank {
                    let r = Self::piece_range(part, k, piece, esz);
                    let len = r.len();
                    self.counter.received(q, len);
                    buf.write_range(r, self.peer(q, b, q * pb, len));
                }
            }
            self.finish();
        }
        Ok(())
    }

    /// Reduce-scatter of a buffer cut into `parts` (element ranges, one per rank,
    /// consecutive over the whole buffer): afterwards `buf[parts[rank]]` holds the host
    /// reduction (combine op; Average is not scaled). Part of `hier`.
    pub fn reduce_scatter_parts(&mut self, buf: &mut [u8], parts: &[Range<usize>], dtype: DType, op: ReduceOp) -> CommResult<()> {
        self.check_usable()?;
        let h = Header::allreduce_for(buf, dtype, op);
        Self::check_parts(parts, buf.len() / dtype.size(), self.size)?;
        self.allreduce_sliced(buf, parts, dtype, op.combine(), &h, true)
    }

    /// Allgather of a buffer cut into `parts`: every rank's `buf[parts[rank]]` goes to all.
    pub fn allgather_parts(&mut self, buf: &mut [u8], parts: &[Range<usize>], dtype: DType) -> CommResult<()> {
        self.check_usable()?;
        let esz = dtype.size();
        let n = buf.len() / esz;
        Self::check_parts(parts, n, self.size)?;
        let (piece, rounds) = self.plan(parts, dtype);
        let h = Header::allgatherv(n * esz);
        for k in 0..rounds {
            let b = self.begin();
            let mine = Self::piece_range(&parts[self.rank], k, piece, esz);
            self.count_sent(mine.len(), None);
            self.put(b, 0, &buf[mine]);
            self.arrive_with_header((k == 0).then_some(&h), "allgather")?;
            for (q, part) in parts.iter().enumerate() {
                if q != self.rank {
                    let r = Self::piece_range(part, k, piece, esz);
                    let len = r.len();
                    self.counter.received(q, len);
                    buf[r].copy_from_slice(self.peer(q, b, 0, len));
                }
            }
            self.finish();
        }
        Ok(())
    }

    /// Checks that `parts` cut `n` elements into `size` consecutive ranges.
    fn check_parts(parts: &[Range<usize>], n: usize, size: usize) -> CommResult<()> {
        let consecutive = parts.windows(2).all(|w| w[0].end == w[1].start);
        if parts.len() != size || parts.first().is_some_and(|p| p.start != 0) || parts.last().is_some_and(|p| p.end != n) || !consecutive {
            return Err(CommError::Invalid(format!("shm: {} parts do not cut {n} elements among {size} ranks", parts.len())));
        }
        Ok(())
    }

    /// Gathers variable pieces to `root` (`Some(root)`) or to all (`None`).
    fn gather_impl(&mut self, send: &[u8], root: Option<usize>, h: &Header, what: &'static str) -> CommResult<Option<Gathered>> {
        let slot = self.slot_bytes;
        let b = self.begin();
        let first = send.len().min(slot);
        self.put(b, 0, &send[..first]);
        self.arrive_with_header(Some(h), what)?;
        let all = self.headers();
        if let Some(r) = root {
            if r >= self.size {
                self.finish();
                return Err(CommError::Invalid(format!("{what} root {r} is not a rank of a group of {}", self.size)));
            }
        }
        let counts: Vec<usize> = all.iter().map(|h| h.count as usize).collect();
        let receiving = root.is_none_or(|r| r == self.rank);
        let offsets: Vec<usize> = counts.iter().scan(0usize, |acc, c| {
            let o = *acc;
            *acc += c;
            Some(o)
        }).collect();
        let mut data = if receiving { vec![0u8; counts.iter().sum()] } else { Vec::new() };
        let rounds = counts.iter().copied().max().unwrap_or(0).div_ceil(slot).max(1);
        for k in 0..rounds {
            if k > 0 {
                let b = self.begin();
                let s = (k * slot).min(send.len());
                let e = ((k + 1) * slot).min(send.len());
                self.put(b, 0, &send[s..e]);
                self.arrive_with_header(None, what)?;
            }
            let b = (self.iter % 2) as usize;
            let chunk = |c: usize| ((k + 1) * slot).min(c) - (k * slot).min(c);
            self.count_sent(chunk(send.len()), root);
            if receiving {
                for q in 0..self.size {
                    let s = (k * slot).min(counts[q]);
                    let e = ((k + 1) * slot).min(counts[q]);
                    if e > s {
                        if q != self.rank {
                            self.counter.received(q, e - s);
                        }
                        data[offsets[q] + s..offsets[q] + e].copy_from_slice(self.peer(q, b, 0, e - s));
                    }
                }
            }
            self.finish();
        }
        Ok(receiving.then_some(Gathered { data, counts }))
    }
}

impl Header {
    /// Allreduce header of a raw (or scattered) buffer; a buffer that is not a whole number
    /// of aligned elements gets a count no other rank can match, so every rank fails
    /// instead of hanging.
    pub fn allreduce_for<V: ByteView + ?Sized>(buf: &V, dtype: DType, op: ReduceOp) -> Header {
        let esz = dtype.size();
        let ok = buf.is_whole_for(esz) && dtype != DType::U8;
        let mut h = Header::allreduce(buf.view_len() / esz, dtype, op);
        if !ok {
            h.count = u64::MAX;
        }
        h
    }
}

impl ShmCollectives {
    /// Allreduce of a contiguous or scattered buffer.
    fn allreduce_view<V: ByteView + ?Sized>(&mut self, buf: &mut V, dtype: DType, op: ReduceOp) -> CommResult<()> {
        self.check_usable()?;
        let h = Header::allreduce_for(buf, dtype, op);
        if h.count == u64::MAX {
            // Take part in one round so peers fail with a mismatch instead of waiting.
            let _ = self.allreduce_direct(&mut [][..], DType::U8, op, &h);
            return Err(CommError::BadBuffer { len: buf.view_len(), dtype: dtype.name() });
        }
        if self.size == 1 {
            return Ok(()); // sum, min, max and average of one rank are the input
        }
        if buf.view_len() <= direct_max(self.slot_bytes) {
            self.allreduce_direct(buf, dtype, op, &h)
        } else {
            let parts = even_parts(buf.view_len() / dtype.size(), self.size);
            self.allreduce_sliced(buf, &parts, dtype, op, &h, false)
        }
    }
}

impl Collectives for ShmCollectives {
    fn name(&self) -> &'static str {
        "shm"
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn allreduce_raw(&mut self, buf: &mut [u8], dtype: DType, op: ReduceOp) -> CommResult<()> {
        self.allreduce_view(buf, dtype, op)
    }
    fn allreduce_scattered(&mut self, bufs: &mut Scattered<'_>, dtype: DType, op: ReduceOp) -> CommResult<()> {
        self.allreduce_view(bufs, dtype, op)
    }
    fn zero_copy_fusion(&self) -> bool {
        true
    }
    fn allgatherv_raw(&mut self, send: &[u8]) -> CommResult<Gathered> {
        self.check_usable()?;
        let h = Header::allgatherv(send.len());
        Ok(self.gather_impl(send, None, &h, "allgatherv")?.unwrap_or_default())
    }
    fn broadcast_raw(&mut self, buf: &mut [u8], root: usize) -> CommResult<()> {
        self.check_usable()?;
        let h = Header::broadcast(buf.len(), root);
        let slot = self.slot_bytes;
        let rounds = buf.len().div_ceil(slot).max(1);
        for k in 0..rounds {
            let b = self.begin();
            let r = (k * slot).min(buf.len())..((k + 1) * slot).min(buf.len());
            if root == self.rank {
                self.put(b, 0, &buf[r.clone()]);
            }
            self.arrive_with_header((k == 0).then_some(&h), "broadcast")?;
            if root >= self.size {
                self.finish();
                return Err(CommError::Invalid(format!("broadcast root {root} is not a rank of a group of {}", self.size)));
            }
            if root == self.rank {
                self.count_sent(r.len(), None);
            } else {
                let len = r.len();
                self.counter.received(root, len);
                buf[r].copy_from_slice(self.peer(root, b, 0, len));
            }
            self.finish();
        }
        Ok(())
    }
    fn gatherv_raw(&mut self, send: &[u8], root: usize) -> CommResult<Option<Gathered>> {
        self.check_usable()?;
        let h = Header::gatherv(send.len(), root);
        self.gather_impl(send, Some(root), &h, "gatherv")
    }
    fn barrier(&mut self) -> CommResult<()> {
        self.check_usable()?;
        self.arrive_with_header(Some(&Header::barrier()), "barrier")?;
        self.finish();
        Ok(())
    }
    fn traffic(&self) -> Option<Traffic> {
        self.counter.traffic()
    }
}
