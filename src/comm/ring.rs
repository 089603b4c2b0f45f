//! `ring`: bandwidth-optimal ring allreduce over MPI point-to-point.
//!
//! N ranks, buffer cut into N segments. Reduce-scatter: in step s (0..N-1) rank r sends
//! segment (r-s) mod N to its right neighbour and receives segment (r-s-1) mod N from its
//! left, adding it to its own; after N-1 steps rank r owns the full sum of segment
//! (r+1) mod N. Allgather: N-1 more steps pass the finished segments around. Each rank
//! sends and receives 2(N-1)/N of the buffer, the lower bound (hence busbw).
//!
//! Each step is chunked (`RINGREC_RING_CHUNK_BYTES`, default 512 KiB) and pipelined: all
//! sends of a step are posted at once, receives go into two scratch buffers so the
//! reduction of chunk j runs while chunk j+1 is in flight.
//! Summation order differs by segment but every element is reduced exactly once along
//! the ring, so all ranks end with bit-identical results. f16/bf16 are widened to f32
//! for the whole ring (accumulate in f32) and narrowed once.
//! A fusion buffer goes round in its [`FusedLayout`] (each tensor cut into the N segments
//! by its own length, segment-major): each element then falls in the segment, so gets the
//! summation order, it has in its tensor reduced alone, whatever it was fused with.
//! allgatherv, broadcast, gatherv and barrier use MPI's own algorithms.
//!
//! The ring counts what it moves ([`PeerCounter`]): every chunk posted to the right
//! neighbour as sent, every chunk posted from the left one as received, inside or across
//! hosts by the neighbour's host. A collective left to MPI's own algorithm voids the count
//! (see [`super::count`]).

use std::ops::Range;

use mpi::raw::AsRaw;
use mpi::topology::{Communicator, SimpleCommunicator};

use super::count::PeerCounter;
use super::traffic::Traffic;
use super::fused::{even_parts, FusedLayout};
use super::{mpi_backend, verify, Collectives, Gathered, Header};
use crate::dtype::{self, DType, ReduceOp};
use crate::topology::Group;
use crate::{CommError, CommResult};

/// Default pipeline chunk of the ring.
pub const DEFAULT_CHUNK_BYTES: usize = 512 << 10;

/// Ring allreduce over MPI point-to-point; MPI's algorithms for the rest.
pub struct RingCollectives {
    mpi: mpi_backend::MpiCollectives,
    pipeline: Pipeline,
    counter: PeerCounter,
}

/// The ring's pipeline: the chunk each step's segments move in, and the two receive
/// buffers of that size.
pub(crate) struct Pipeline {
    chunk_bytes: usize,
    scratch: Vec<u8>,
}

impl Pipeline {
    /// Chunks of `chunk_bytes` (buffers allocated on first use).
    pub(crate) fn new(chunk_bytes: usize) -> Pipeline {
        Pipeline { chunk_bytes, scratch: Vec::new() }
    }
}

impl RingCollectives {
    /// Over `group`; `verify` exchanges headers first; pipeline chunks of `chunk_bytes`;
    /// the bytes moved counted by `counter` (indexed by rank in `group`).
    pub fn new(group: Group, verify: bool, chunk_bytes: usize, counter: PeerCounter) -> RingCollectives {
        RingCollectives { mpi: mpi_backend::MpiCollectives::new(group, verify), pipeline: Pipeline::new(chunk_bytes), counter }
    }
}

impl RingCollectives {
    /// Makes the ranks agree on an allreduce of `n` elements (unless `RINGREC_VERIFY=0`).
    fn agree(&self, n: usize, dtype: DType, op: ReduceOp) -> CommResult<()> {
        if self.mpi.verify() {
            verify::agree(self.mpi.comm(), &Header::allreduce(n, dtype, op))?;
        }
        Ok(())
    }
}

/// Posts a nonblocking send of `len` bytes at `ptr`.
///
/// # Safety
/// `ptr..ptr+len` must stay valid and unmodified until the request completes.
unsafe fn isend(comm: &SimpleCommunicator, ptr: *const u8, len: usize, dest: usize) -> mpi::ffi::MPI_Request {
    let mut req = request_null();
    mpi::ffi::MPI_Isend(ptr as *const _, len as i32, mpi::ffi::RSMPI_UINT8_T, dest as i32, 7, comm.as_raw(), &mut req);
    req
}

/// Posts a nonblocking receive of `len` bytes into `ptr`.
///
/// # Safety
/// `ptr..ptr+len` must stay valid and untouched by anything else until the request completes.
unsafe fn irecv(comm: &SimpleCommunicator, ptr: *mut u8, len: usize, src: usize) -> mpi::ffi::MPI_Request {
    let mut req = request_null();
    mpi::ffi::MPI_Irecv(ptr as *mut _, len as i32, mpi::ffi::RSMPI_UINT8_T, src as i32, 7, comm.as_raw(), &mut req);
    req
}

fn request_null() -> mpi::ffi::MPI_Request {
    // SAFETY: reading an immutable constant the MPI shim initialises at load time.
    unsafe { mpi::ffi::RSMPI_REQUEST_NULL }
}

fn wait(req: &mut mpi::ffi::MPI_Request) {
    // SAFETY: `req` is a valid request handle (or REQUEST_NULL, which MPI_Wait accepts).
    unsafe {
        mpi::ffi::MPI_Wait(req, mpi::ffi::RSMPI_STATUS_IGNORE);
    }
}

fn wait_all(reqs: &mut [mpi::ffi::MPI_Request]) {
    // SAFETY: every entry is a valid request or REQUEST_NULL; the array outlives the call.
    unsafe {
        mpi::ffi::MPI_Waitall(reqs.len() as i32, reqs.as_mut_ptr(), mpi::ffi::RSMPI_STATUSES_IGNORE);
    }
}

/// In-place ring allreduce (Sum/Min/Max combine; Average scaled by the caller) of a buffer
/// of a full-precision dtype cut into the ring's segments `segs` (element ranges, one per
/// rank, consecutive from 0 to the buffer's end: [`even_parts`] for one tensor, a
/// [`FusedLayout`]'s parts for a fusion buffer), moved through `pipeline`; the chunks posted
/// are counted in `counter`.
pub(crate) fn ring_allreduce(comm: &SimpleCommunicator, buf: &mut [u8], segs: &[Range<usize>], dtype: DType, op: ReduceOp, pipeline: &mut Pipeline, counter: &mut PeerCounter) -> CommResult<()> {
    let p = comm.size() as usize;
    let r = comm.rank() as usize;
    let esz = dtype.size();
    if buf.len() % esz != 0 || (buf.as_ptr() as usize) % esz != 0 {
        return Err(CommError::BadBuffer { len: buf.len(), dtype: dtype.name() });
    }
    let n = buf.len() / esz;
    if segs.len() != p || segs.first().is_some_and(|s| s.start != 0) || segs.last().is_some_and(|s| s.end != n) || segs.windows(2).any(|w| w[0].end != w[1].start) {
        return Err(CommError::Invalid(format!("ring: {} segments do not cut {n} elements among {p} ranks", segs.len())));
    }
    if p == 1 {
        return Ok(());
    }
    let chunk = (pipeline.chunk_bytes / esz).max(1) * esz;
    let scratch = &mut pipeline.scratch;
    if scratch.len() < 2 * chunk {
        scratch.resize(2 * chunk, 0);
    }
    let right = (r + 1) % p;
    let left = (r + p - 1) % p;
    let seg = |i: usize| {
        let e = &segs[i % p];
        (e.start * esz)..(e.end * esz)
    };
    let base = buf.as_mut_ptr();
    let (s0, s1) = scratch.split_at_mut(chunk);
    let scr: [*mut u8; 2] = [s0.as_mut_ptr(), s1.as_mut_ptr()];

    // Reduce-scatter.
    for s in 0..p - 1 {
        let send = seg(r + p - s);
        let recv = seg(r + 2 * p - s - 1);
        let mut sends: Vec<mpi::ffi::MPI_Request> = Vec::new();
        let mut off = send.start;
        while off < send.end {
            let len = chunk.min(send.end - off);
            // SAFETY: `send` is inside `buf`; nothing writes it during this step (only `recv`,
            // a disjoint segment, is written) and we wait for the sends before returning.
            sends.push(unsafe { isend(comm, base.add(off), len, right) });
            counter.sent(right, len);
            off += len;
        }
        let pieces: Vec<(usize, usize)> = {
            let mut v = Vec::new();
            let mut o = recv.start;
            while o < recv.end {
                let len = chunk.min(recv.end - o);
                counter.received(left, len);
                v.push((o, len));
                o += len;
            }
            v
        };
        let mut recvs = [request_null(); 2];
        for (j, (_, len)) in pieces.iter().enumerate().take(2) {
            // SAFETY: scratch buffer j is only touched by this receive until waited on.
            recvs[j] = unsafe { irecv(comm, scr[j], *len, left) };
        }
        for (j, (o, len)) in pieces.iter().enumerate() {
            wait(&mut recvs[j % 2]);
            // SAFETY: the receive into scratch j%2 completed; `o..o+len` lies in the `recv`
            // segment of `buf`, which no pending send reads.
            let (dst, src) = unsafe { (std::slice::from_raw_parts_mut(base.add(*o), *len), std::slice::from_raw_parts(scr[j % 2], *len)) };
            dtype::accumulate(dst, src, dtype, op)?;
            if let Some((_, next_len)) = pieces.get(j + 2) {
                // SAFETY: scratch j%2 was consumed just above.
                recvs[j % 2] = unsafe { irecv(comm, scr[j % 2], *next_len, left) };
            }
        }
        wait_all(&mut sends);
    }
    // Allgather: pass finished segments around.
    for s in 0..p - 1 {
        let send = seg(r + 1 + p - s);
        let recv = seg(r + p - s);
        let mut reqs: Vec<mpi::ffi::MPI_Request> = Vec::new();
        let mut o = recv.start;
        while o < recv.end {
            let len = chunk.min(recv.end - o);
            // SAFETY: `recv` is a segment of `buf` disjoint from `send`; waited below.
            reqs.push(unsafe { irecv(comm, base.add(o), len, left) });
            counter.received(left, len);
            o += len;
        }
        let mut o = send.start;
        while o < send.end {
            let len = chunk.min(send.end - o);
            // SAFETY: `send` is not written during this step; waited below.
            reqs.push(unsafe { isend(comm, base.add(o), len, right) });
            counter.sent(right, len);
            o += len;
        }
        wait_all(&mut reqs);
    }
    Ok(())
}

/// Ring allreduce for every dtype and op over segments `segs` ([`ring_allreduce`]): half
/// types through f32, Average scaled at the end.
pub(crate) fn ring_allreduce_any(comm: &SimpleCommunicator, buf: &mut [u8], segs: &[Range<usize>], dtype: DType, op: ReduceOp, pipeline: &mut Pipeline, counter: &mut PeerCounter) -> CommResult<()> {
    let p = comm.size() as usize;
    if dtype == DType::U8 {
        return Err(CommError::Invalid("uint8 buffers cannot be reduced".into()));
    }
    if dtype.is_half() {
        let mut wide = dtype::half_to_f32(buf, dtype)?;
        let wb: &mut [u8] = bytemuck::cast_slice_mut(&mut wide);
        ring_allreduce(comm, wb, segs, DType::F32, op, pipeline, counter)?;
        if op == ReduceOp::Average {
            dtype::scale(wb, DType::F32, p)?;
        }
        return dtype::f32_to_half(&wide, buf, dtype);
    }
    ring_allreduce(comm, buf, segs, dtype, op, pipeline, counter)?;
    if op == ReduceOp::Average {
        dtype::scale(buf, dtype, p)?;
    }
    Ok(())
}

impl Collectives for RingCollectives {
    fn name(&self) -> &'static str {
        "ring"
    }
    fn rank(&self) -> usize {
        self.mpi.rank()
    }
    fn size(&self) -> usize {
        self.mpi.size()
    }
    fn allreduce_raw(&mut self, buf: &mut [u8], dtype: DType, op: ReduceOp) -> CommResult<()> {
        let n = buf.len() / dtype.size();
        self.agree(n, dtype, op)?;
        ring_allreduce_any(self.mpi.comm(), buf, &even_parts(n, self.size()), dtype, op, &mut self.pipeline, &mut self.counter)
    }
    fn fusion_levels(&self) -> Vec<usize> {
        vec![self.size()]
    }
    fn allreduce_fused(&mut self, buf: &mut [u8], layout: &FusedLayout, dtype: DType, op: ReduceOp) -> CommResult<()> {
        let n = buf.len() / dtype.size();
        self.agree(n, dtype, op)?;
        let segs = layout.parts_for(&self.fusion_levels(), n, &[])?;
        ring_allreduce_any(self.mpi.comm(), buf, &segs, dtype, op, &mut self.pipeline, &mut self.counter)
    }
    fn allgatherv_raw(&mut self, send: &[u8]) -> CommResult<Gathered> {
        self.counter.opaque();
        self.mpi.allgatherv_raw(send)
    }
    fn broadcast_raw(&mut self, buf: &mut [u8], root: usize) -> CommResult<()> {
        self.counter.opaque();
        self.mpi.broadcast_raw(buf, root)
    }
    fn gatherv_raw(&mut self, send: &[u8], root: usize) -> CommResult<Option<Gathered>> {
        self.counter.opaque();
        self.mpi.gatherv_raw(send, root)
    }
    fn barrier(&mut self) -> CommResult<()> {
        self.mpi.barrier()
    }
    fn traffic(&self) -> Option<Traffic> {
        self.counter.traffic()
    }
    fn widens_halves(&self) -> bool {
        true
    }
}
