//! Collective operations over host memory, behind one trait.
//!
//! | backend | allreduce | the rest |
//! |---|---|---|
//! | `mpi`  | `MPI_Allreduce` (the reference) | MPI's own |
//! | `ring` | reduce-scatter + allgather over MPI point-to-point, 2(N-1) steps, chunked and pipelined | MPI's own |
//! | `shm`  | one host: every rank reduces its 1/P slice straight from its peers' data in a shared segment | through the segment |
//! | `hier` | `shm` reduce-scatter in each host, `ring` across hosts between equal local ranks, `shm` allgather | composed the same way |
//!
//! Fusion never changes a sum's bits on ringrec's own backends (`ring`, `shm`, `hier`: the
//! ones [`Backend::auto`] picks): a fused allreduce reduces every element as in its tensor
//! alone ([`fused`]). `mpi` leaves the order to `MPI_Allreduce`, which picks its algorithm
//! by message size, so there fusion may change the last bits of a sum at 3+ ranks.
//!
//! Every collective first makes ranks agree on what they are doing (collective kind, element
//! count, dtype, op, root): a mismatch is a [`CommError::Mismatch`] on every rank, never a hang
//! or an overrun. `shm` carries the check inside its own synchronisation; the MPI-based
//! backends exchange a 32-byte header first, unless `RINGREC_VERIFY=0`.

pub mod arrival;
pub mod count;
pub mod device;
pub mod fused;
pub mod hier;
pub mod mpi_backend;
pub mod nccl;
pub mod ring;
pub mod scattered;
pub mod shm;
pub mod traffic;
pub mod verify;

use crate::dtype::{DType, Element, ReduceOp};
pub use device::{DeviceCollectives, HostCollectives};
pub use crate::gather::Gathered;
pub use fused::FusedLayout;
pub use scattered::Scattered;
use crate::topology::Topology;
use crate::{CommError, CommResult};

/// The collective backends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// The MPI library's collectives.
    Mpi,
    /// Ring allreduce over MPI point-to-point.
    Ring,
    /// Shared-memory collectives among the ranks of one host.
    Shm,
    /// `shm` inside hosts, `ring` across them.
    Hier,
}

impl Backend {
    /// All CPU backends.
    pub const ALL: [Backend; 4] = [Backend::Mpi, Backend::Ring, Backend::Shm, Backend::Hier];
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Mpi => "mpi",
            Backend::Ring => "ring",
            Backend::Shm => "shm",
            Backend::Hier => "hier",
        }
    }
    /// Parses a backend name.
    pub fn parse(s: &str) -> Option<Backend> {
        Backend::ALL.iter().copied().find(|b| b.name() == s)
    }
    /// The best backend for this topology: `shm` on one host, `hier` on several homogeneous
    /// hosts, `ring` otherwise.
    pub fn auto(topo: &Topology) -> Backend {
        if topo.num_hosts == 1 {
            Backend::Shm
        } else if topo.is_homogeneous() {
            Backend::Hier
        } else {
            Backend::Ring
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

crate::settings::word_enum!(Backend, "backend", "mpi, ring, shm, hier");

/// Collective operations among the ranks of one group (the world, a host, or the ranks
/// across hosts). Every rank of the group must make the same sequence of calls.
pub trait Collectives {
    /// The backend's name.
    fn name(&self) -> &'static str;
    /// This rank in the group.
    fn rank(&self) -> usize;
    /// Ranks in the group.
    fn size(&self) -> usize;
    /// In-place allreduce of `buf`, a whole number of aligned `dtype` elements.
    fn allreduce_raw(&mut self, buf: &mut [u8], dtype: DType, op: ReduceOp) -> CommResult<()>;
    /// Every rank contributes `send` (any length, 0 included) and receives all pieces.
    fn allgatherv_raw(&mut self, send: &[u8]) -> CommResult<Gathered>;
    /// Copies `buf` of rank `root` into `buf` of every rank (lengths must agree).
    fn broadcast_raw(&mut self, buf: &mut [u8], root: usize) -> CommResult<()>;
    /// Rank `root` receives every rank's `send`; the others get `None`.
    fn gatherv_raw(&mut self, send: &[u8], root: usize) -> CommResult<Option<Gathered>>;
    /// Returns once every rank of the group has entered it.
    fn barrier(&mut self) -> CommResult<()>;
    /// In-place allreduce of several buffers (tensors) as if they were one (a fusion
    /// buffer), each element reduced as in its tensor alone where the backend's order is
    /// ringrec's ([`Collectives::fusion_levels`]). The default copies them through one
    /// contiguous buffer in their [`FusedLayout`]; backends that can move the pieces
    /// directly say so with [`Collectives::zero_copy_fusion`].
    fn allreduce_scattered(&mut self, bufs: &mut Scattered<'_>, dtype: DType, op: ReduceOp) -> CommResult<()> {
        let len = bufs.len();
        let layout = scattered::layout_of(bufs, dtype, &self.fusion_levels());
        let mut tmp = scattered::aligned_bytes(len);
        let tmp = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut tmp)[..len];
        layout.pack(bufs, dtype.size(), tmp);
        self.allreduce_fused(tmp, &layout, dtype, op)?;
        layout.unpack(tmp, dtype.size(), bufs);
        Ok(())
    }
    /// The part counts at which the backend cuts a buffer to reduce it, outermost first
    /// (`ring`: `[size]`; `hier`: `[local size, hosts]`): a fusion buffer laid out by a
    /// [`FusedLayout`] with these levels is reduced by [`Collectives::allreduce_fused`]
    /// element for element as its tensors alone. Empty (the default) where an element's
    /// reduction does not depend on its position (`shm`: rank order for every element) or
    /// is not ringrec's to set (`mpi`: the MPI library picks its algorithm, and so the
    /// order, by message size — fusion may change the last bits there).
    fn fusion_levels(&self) -> Vec<usize> {
        Vec::new()
    }
    /// In-place allreduce of a fusion buffer laid out by `layout` (made with this
    /// backend's [`Collectives::fusion_levels`]). The default reduces it as one buffer.
    fn allreduce_fused(&mut self, buf: &mut [u8], layout: &FusedLayout, dtype: DType, op: ReduceOp) -> CommResult<()> {
        let _ = layout;
        self.allreduce_raw(buf, dtype, op)
    }
    /// True when [`Collectives::allreduce_scattered`] reduces the pieces in place, with no
    /// copy through a separate fusion buffer.
    fn zero_copy_fusion(&self) -> bool {
        false
    }
    /// True when half-precision buffers travel as f32 (the backend widens them before
    /// reducing): their wire bytes are those of f32.
    fn widens_halves(&self) -> bool {
        false
    }
    /// The bytes this instance moved so far, by direction inside and across hosts, where
    /// the backend runs its own algorithm and counts them ([`count`]); `None` where it
    /// cannot see them (MPI's and NCCL's own collectives: use [`traffic::dense_model`]).
    fn traffic(&self) -> Option<traffic::Traffic> {
        None
    }
}

/// Typed helpers on top of [`Collectives`].
pub trait CollectivesExt: Collectives {
    /// In-place allreduce of a typed slice.
    fn allreduce<T: Element>(&mut self, buf: &mut [T], op: ReduceOp) -> CommResult<()> {
        self.allreduce_raw(bytemuck::cast_slice_mut(buf), T::DTYPE, op)
    }
    /// Allgatherv of typed slices: the concatenation in rank order and each rank's count.
    fn allgatherv<T: Element>(&mut self, send: &[T]) -> CommResult<(Vec<T>, Vec<usize>)> {
        let g = self.allgatherv_raw(bytemuck::cast_slice(send))?;
        typed(g)
    }
    /// Broadcast of a typed slice from `root`.
    fn broadcast<T: Element>(&mut self, buf: &mut [T], root: usize) -> CommResult<()> {
        self.broadcast_raw(bytemuck::cast_slice_mut(buf), root)
    }
    /// Gatherv of typed slices to `root`.
    fn gatherv<T: Element>(&mut self, send: &[T], root: usize) -> CommResult<Option<(Vec<T>, Vec<usize>)>> {
        match self.gatherv_raw(bytemuck::cast_slice(send), root)? {
            Some(g) => typed(g).map(Some),
            None => Ok(None),
        }
    }
}
impl<C: Collectives + ?Sized> CollectivesExt for C {}

fn typed<T: Element>(g: Gathered) -> CommResult<(Vec<T>, Vec<usize>)> {
    let size = std::mem::size_of::<T>();
    if g.counts.iter().any(|c| c % size != 0) {
        return Err(CommError::BadBuffer { len: g.data.len(), dtype: T::DTYPE.name() });
    }
    Ok((bytemuck::allocation::pod_collect_to_vec(&g.data), g.counts.iter().map(|c| c / size).collect()))
}

/// Collective kinds, as carried in headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Kind {
    /// allreduce
    Allreduce = 1,
    /// allgatherv
    Allgatherv = 2,
    /// broadcast
    Broadcast = 3,
    /// gatherv
    Gatherv = 4,
    /// barrier
    Barrier = 5,
}

impl Kind {
    /// Its name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Allreduce => "allreduce",
            Kind::Allgatherv => "allgatherv",
            Kind::Broadcast => "broadcast",
            Kind::Gatherv => "gatherv",
            Kind::Barrier => "barrier",
        }
    }
    fn from_u32(v: u32) -> Option<Kind> {
        [Kind::Allreduce, Kind::Allgatherv, Kind::Broadcast, Kind::Gatherv, Kind::Barrier].into_iter().find(|k| *k as u32 == v)
    }
}

/// What a rank says it is about to do; ranks compare these before moving data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Header {
    /// [`Kind`] as u32.
    pub kind: u32,
    /// [`DType::code`].
    pub dtype: u32,
    /// [`ReduceOp::code`].
    pub op: u32,
    /// Root rank (broadcast, gatherv).
    pub root: u32,
    /// Element count (allreduce, broadcast) or byte count of this rank's piece (gathers).
    pub count: u64,
}

impl Header {
    /// Header of an allreduce.
    pub fn allreduce(count: usize, dtype: DType, op: ReduceOp) -> Header {
        Header { kind: Kind::Allreduce as u32, dtype: dtype.code(), op: op.code(), root: 0, count: count as u64 }
    }
    /// Header of an allgatherv contributing `bytes`.
    pub fn allgatherv(bytes: usize) -> Header {
        Header { kind: Kind::Allgatherv as u32, dtype: DType::U8.code(), op: 0, root: 0, count: bytes as u64 }
    }
    /// Header of a broadcast of `bytes` from `root`.
    pub fn broadcast(bytes: usize, root: usize) -> Header {
        Header { kind: Kind::Broadcast as u32, dtype: DType::U8.code(), op: 0, root: root as u32, count: bytes as u64 }
    }
    /// Header of a gatherv contributing `bytes` to `root`.
    pub fn gatherv(bytes: usize, root: usize) -> Header {
        Header { kind: Kind::Gatherv as u32, dtype: DType::U8.code(), op: 0, root: root as u32, count: bytes as u64 }
    }
    /// Header of a barrier.
    pub fn barrier() -> Header {
        Header { kind: Kind::Barrier as u32, ..Header::default() }
    }
    /// The collective's name.
    pub fn kind_name(&self) -> &'static str {
        Kind::from_u32(self.kind).map_or("unknown collective", Kind::name)
    }
    /// Does this header describe the same call as `other`? Gathers may differ in count.
    fn agrees(&self, other: &Header) -> bool {
        let per_rank_count = matches!(Kind::from_u32(self.kind), Some(Kind::Allgatherv) | Some(Kind::Gatherv));
        self.kind == other.kind
            && self.dtype == other.dtype
            && self.op == other.op
            && self.root == other.root
            && (per_rank_count || self.count == other.count)
    }
    /// Human description: `allreduce of 10 x float (sum)`.
    pub fn describe(&self) -> String {
        let dtype = DType::from_code(self.dtype).map_or("?", DType::name);
        match Kind::from_u32(self.kind) {
            Some(Kind::Allreduce) => {
                format!("allreduce of {} x {} ({})", self.count, dtype, ReduceOp::from_code(self.op).map_or("?", ReduceOp::name))
            }
            Some(Kind::Broadcast) => format!("broadcast of {} bytes from root {}", self.count, self.root),
            Some(Kind::Gatherv) => format!("gatherv to root {}", self.root),
            Some(Kind::Allgatherv) => "allgatherv".to_string(),
            Some(Kind::Barrier) => "barrier".to_string(),
            None => format!("unknown collective {}", self.kind),
        }
    }
    /// Encodes into 32 bytes.
    pub fn to_words(&self) -> [u64; 4] {
        [((self.kind as u64) << 32) | self.dtype as u64, ((self.op as u64) << 32) | self.root as u64, self.count, HEADER_MAGIC]
    }
    /// Decodes from 32 bytes.
    pub fn from_words(w: &[u64; 4]) -> Header {
        Header { kind: (w[0] >> 32) as u32, dtype: w[0] as u32, op: (w[1] >> 32) as u32, root: w[1] as u32, count: w[2] }
    }
}

const HEADER_MAGIC: u64 = 0x7269_6e67_7265_6321;

/// Compares every rank's header with rank 0's. `mine` names the collective in the error.
/// Every rank calls this with the same `all` and so reaches the same verdict.
pub fn check_headers(mine: &Header, all: &[Header]) -> CommResult<()> {
    let reference = all[0];
    let bad: Vec<usize> = (0..all.len()).filter(|r| !all[*r].agrees(&reference)).collect();
    if bad.is_empty() {
        return Ok(());
    }
    let mut detail = format!("rank 0 called {}", reference.describe());
    for r in bad.iter().take(8) {
        detail.push_str(&format!(", rank {r} called {}", all[*r].describe()));
    }
    if bad.len() > 8 {
        detail.push_str(&format!(" and {} more", bad.len() - 8));
    }
    Err(CommError::Mismatch { collective: mine.kind_name(), detail, ranks: bad })
}

/// Builds a backend over all ranks of the world.
pub fn build(backend: Backend, topo: &Topology) -> CommResult<Box<dyn Collectives>> {
    build_tagged(backend, topo, "world")
}

/// A backend whose every call is registered with the watchdog ([`crate::watchdog`]): a
/// collective that a peer never joins ends the job after the deadline instead of hanging.
struct Watched(Box<dyn Collectives>);

impl Collectives for Watched {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn size(&self) -> usize {
        self.0.size()
    }
    fn allreduce_raw(&mut self, buf: &mut [u8], dtype: DType, op: ReduceOp) -> CommResult<()> {
        let _w = crate::watchdog::waiting("an allreduce");
        self.0.allreduce_raw(buf, dtype, op)
    }
    fn allgatherv_raw(&mut self, send: &[u8]) -> CommResult<Gathered> {
        let _w = crate::watchdog::waiting("an allgatherv");
        self.0.allgatherv_raw(send)
    }
    fn broadcast_raw(&mut self, buf: &mut [u8], root: usize) -> CommResult<()> {
        let _w = crate::watchdog::waiting("a broadcast");
        self.0.broadcast_raw(buf, root)
    }
    fn gatherv_raw(&mut self, send: &[u8], root: usize) -> CommResult<Option<Gathered>> {
        let _w = crate::watchdog::waiting("a gatherv");
        self.0.gatherv_raw(send, root)
    }
    fn barrier(&mut self) -> CommResult<()> {
        let _w = crate::watchdog::waiting("a barrier");
        self.0.barrier()
    }
    fn allreduce_scattered(&mut self, bufs: &mut Scattered<'_>, dtype: DType, op: ReduceOp) -> CommResult<()> {
        let _w = crate::watchdog::waiting("a fused allreduce");
        self.0.allreduce_scattered(bufs, dtype, op)
    }
    fn zero_copy_fusion(&self) -> bool {
        self.0.zero_copy_fusion()
    }
    fn fusion_levels(&self) -> Vec<usize> {
        self.0.fusion_levels()
    }
    fn allreduce_fused(&mut self, buf: &mut [u8], layout: &FusedLayout, dtype: DType, op: ReduceOp) -> CommResult<()> {
        let _w = crate::watchdog::waiting("a fused allreduce");
        self.0.allreduce_fused(buf, layout, dtype, op)
    }
    fn traffic(&self) -> Option<traffic::Traffic> {
        self.0.traffic()
    }
    fn widens_halves(&self) -> bool {
        self.0.widens_halves()
    }
}

/// Builds a backend over all ranks of the world; `tag` names its shared segments so that
/// several backends (the trainer's, the engine's) live side by side in one job. Every
/// call is watched ([`crate::watchdog`]).
pub fn build_tagged(backend: Backend, topo: &Topology, tag: &str) -> CommResult<Box<dyn Collectives>> {
    build_unwatched(backend, topo, tag).map(|c| Box::new(Watched(c)) as Box<dyn Collectives>)
}

fn build_unwatched(backend: Backend, topo: &Topology, tag: &str) -> CommResult<Box<dyn Collectives>> {
    Ok(match backend {
        Backend::Mpi => Box::new(mpi_backend::MpiCollectives::new(topo.world.duplicate(), topo.config.verify)),
        Backend::Ring => Box::new(ring::RingCollectives::new(topo.world.duplicate(), topo.config.verify, topo.config.ring_chunk_bytes, count::PeerCounter::world(topo))),
        Backend::Shm => {
            if topo.num_hosts > 1 {
                return Err(CommError::Unsupported {
                    backend: "shm",
                    reason: format!("the world spans {} hosts and shm only reaches ranks of one host; use --backend hier", topo.num_hosts),
                });
            }
            Box::new(shm::ShmCollectives::on_host(topo, tag)?)
        }
        Backend::Hier => Box::new(hier::HierCollectives::new(topo, tag)?),
    })
}

/// Shared-memory collectives among the ranks of this host (e.g. gather to the host leader).
pub fn host_collectives(topo: &Topology, tag: &str) -> CommResult<shm::ShmCollectives> {
    shm::ShmCollectives::on_host(topo, tag)
}

/// How long a wait polls without giving its core away: a peer a few microseconds behind
/// (the usual case for a collective's partner) is met without a sleep's wake-up delay.
pub const SPIN_BEFORE_SLEEP: std::time::Duration = std::time::Duration::from_micros(50);

/// The shortest and longest sleep between two polls of [`wait_sleeping`].
const POLL_SLEEP: (std::time::Duration, std::time::Duration) = (std::time::Duration::from_micros(20), std::time::Duration::from_micros(250));

/// The sleep between two polls of a wait that has lasted `waited` (past
/// [`SPIN_BEFORE_SLEEP`]): an eighth of it, within [`POLL_SLEEP`]. A wait that ends soon
/// after it starts (a peer a little behind) is met within 20 us as before; one that lasts
/// (an idle peer's engine, milliseconds away) wakes a few hundred times less often — at
/// 20 us apiece such waits took 15-25% of a core per rank on a 2-core, 2-rank run — and
/// ends at most an eighth of its length (at most 250 us) after its peer arrived.
pub(crate) fn poll_sleep(waited: std::time::Duration) -> std::time::Duration {
    (waited / 8).clamp(POLL_SLEEP.0, POLL_SLEEP.1)
}

/// Waits for `req` polling with sleeps in between, instead of MPI's busy (or yielding)
/// wait: where ranks share cores, the core goes to the ranks that still work. The first
/// [`SPIN_BEFORE_SLEEP`] polls without sleeping; the sleeps then grow with the wait
/// ([`poll_sleep`]).
pub fn wait_sleeping<'a, R: ?Sized, S: mpi::request::Scope<'a>>(mut req: mpi::request::Request<'a, R, S>) {
    let mut polls = 0u32;
    let mut start: Option<std::time::Instant> = None;
    loop {
        match req.test() {
            Ok(_) => return,
            Err(pending) => req = pending,
        }
        polls = polls.saturating_add(1);
        let waited = start.map_or(std::time::Duration::ZERO, |t0| t0.elapsed());
        if waited < SPIN_BEFORE_SLEEP {
            if polls % 64 != 0 {
                std::hint::spin_loop();
                continue;
            }
            start.get_or_insert_with(std::time::Instant::now);
            std::thread::yield_now();
        } else {
            // One poll per wake-up (each takes MPI's request lock).
            std::thread::sleep(poll_sleep(waited));
        }
    }
}

/// Makes this thread's short sleeps short: Linux lets a sleep overrun by the thread's
/// timer slack (50 us by default), more than the first (20 us) polls of [`wait_sleeping`] and the
/// shared-memory waits themselves; the engine's thread sets it to 1 us. Elsewhere a no-op.
pub fn precise_sleeps() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_TIMERSLACK takes a value and changes only this thread's timer slack.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_wait_polls_less_often() {
        let us = std::time::Duration::from_micros;
        assert_eq!(poll_sleep(us(60)), us(20), "a short wait polls every 20 us");
        assert_eq!(poll_sleep(us(800)), us(100), "an eighth of the wait");
        assert_eq!(poll_sleep(std::time::Duration::from_secs(3)), us(250), "at most 250 us");
    }

    #[test]
    fn header_round_trips_and_mismatch_names_ranks() {
        let a = Header::allreduce(10, DType::F32, ReduceOp::Sum);
        assert_eq!(Header::from_words(&a.to_words()), a);
        let b = Header::allreduce(12, DType::F32, ReduceOp::Sum);
        let err = check_headers(&a, &[a, b, a, b]).unwrap_err();
        match &err {
            CommError::Mismatch { ranks, detail, .. } => {
                assert_eq!(ranks, &vec![1, 3]);
                assert!(detail.contains("rank 1 called allreduce of 12 x float (sum)"), "{detail}");
            }
            e => panic!("{e}"),
        }
        // Gathers may contribute different lengths.
        assert!(check_headers(&Header::allgatherv(3), &[Header::allgatherv(3), Header::allgatherv(0)]).is_ok());
        assert!(check_headers(&Header::barrier(), &[Header::barrier(), Header::allgatherv(0)]).is_err());
    }
}
