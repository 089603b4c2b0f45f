//! `hier`: hierarchical collectives. Inside a host ranks go through shared memory (`shm`);
//! across hosts only ranks with the same `local_rank` talk, over a `ring`.
//!
//! allreduce = shm reduce-scatter (local rank l ends with part l of the host sum) ->
//! ring allreduce of part l among the l-th ranks of all hosts -> shm allgather of the parts.
//! Each host moves 1/local_size of the buffer per rank across the network, in parallel
//! over local_size rings. Every part is finished by one ring, so all ranks get
//! bit-identical results. Needs the same number of ranks on every host.
//! A fusion buffer is cut by its [`FusedLayout`] at `[local size, hosts]`: each tensor's
//! own part l goes to local rank l and round the ring in that part's own segments, so an
//! element is summed as in its tensor alone, whatever it was fused with.
//! Headers are checked once over the whole world (MPI allgather) unless `RINGREC_VERIFY=0`.
//!
//! Counted traffic ([`super::count`]): the host's `shm` steps count inside the host, the
//! ring among equal local ranks across hosts. allgatherv and broadcast across hosts run
//! MPI's own algorithm among the leaders, gatherv MPI's over the world: on several hosts
//! they void the count (every rank's, so that all ranks agree).

use mpi::topology::Communicator;
use mpi::traits::Root;

use super::mpi_backend::MpiCollectives;
use super::count::{self, PeerCounter};
use super::shm::ShmCollectives;
use super::traffic::Traffic;
use super::fused::FusedLayout;
use super::{ring, verify, Collectives, Gathered, Header};
use crate::dtype::{self, DType, ReduceOp};
use crate::topology::{Group, Topology};
use crate::{CommError, CommResult};

/// shm inside hosts, ring across.
pub struct HierCollectives {
    local: ShmCollectives,
    cross: Group,
    world: MpiCollectives,
    local_rank: usize,
    local_size: usize,
    host_id: usize,
    host_of_rank: Vec<usize>,
    local_rank_of_rank: Vec<usize>,
    pipeline: ring::Pipeline,
    /// The ring across hosts' bytes (every peer of `cross` is on another host).
    cross_counter: PeerCounter,
}

impl HierCollectives {
    /// Collective over the world; `tag` names its shared segment.
    pub fn new(topo: &Topology, tag: &str) -> CommResult<HierCollectives> {
        if !topo.is_homogeneous() {
            return Err(CommError::Unsupported { backend: "hier", reason: "hosts have different numbers of ranks; use --backend ring".into() });
        }
        Ok(HierCollectives {
            local: ShmCollectives::on_host(topo, &format!("hier-{tag}"))?,
            cross: topo.cross.duplicate(),
            world: MpiCollectives::new(topo.world.duplicate(), topo.config.verify),
            local_rank: topo.local_rank,
            local_size: topo.local_size,
            host_id: topo.host_id,
            host_of_rank: topo.host_of_rank.clone(),
            local_rank_of_rank: topo.local_rank_of_rank.clone(),
            pipeline: ring::Pipeline::new(ring::DEFAULT_CHUNK_BYTES),
            cross_counter: PeerCounter::one_per_host(topo.cross.size(), topo.cross.rank()),
        })
    }

    /// Allreduce of `buf` laid out by `layout` (cut at [`Collectives::fusion_levels`]):
    /// the host's parts by the layout's outer cut, each part's ring segments by its inner one.
    fn allreduce_full(&mut self, buf: &mut [u8], layout: &FusedLayout, dtype: DType, op: ReduceOp) -> CommResult<()> {
        let esz = dtype.size();
        let n = buf.len() / esz;
        let levels = self.fusion_levels();
        let parts = layout.parts_for(&levels, n, &[])?;
        let segs = layout.parts_for(&levels, n, &[self.local_rank])?;
        self.local.reduce_scatter_parts(buf, &parts, dtype, op.combine())?;
        let mine = &parts[self.local_rank];
        ring::ring_allreduce(&self.cross.comm, &mut buf[mine.start * esz..mine.end * esz], &segs, dtype, op.combine(), &mut self.pipeline, &mut self.cross_counter)?;
        self.local.allgather_parts(buf, &parts, dtype)?;
        if op == ReduceOp::Average {
            dtype::scale(buf, dtype, self.size())?;
        }
        Ok(())
    }

    /// [`HierCollectives::allreduce_full`] for every dtype: half types through f32.
    fn allreduce_laid_out(&mut self, buf: &mut [u8], layout: &FusedLayout, dtype: DType, op: ReduceOp) -> CommResult<()> {
        if dtype.is_half() {
            let mut wide = dtype::half_to_f32(buf, dtype)?;
            self.allreduce_full(bytemuck::cast_slice_mut(&mut wide), layout, DType::F32, op)?;
            return dtype::f32_to_half(&wide, buf, dtype);
        }
        self.allreduce_full(buf, layout, dtype, op)
    }

    fn is_leader(&self) -> bool {
        self.local_rank == 0
    }
}

/// Host blob: [n][world rank; n][count; n][data].
fn pack_host(ranks: &[usize], g: &Gathered) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + 16 * ranks.len() + g.data.len());
    out.extend_from_slice(&(ranks.len() as u64).to_le_bytes());
    for r in ranks {
        out.extend_from_slice(&(*r as u64).to_le_bytes());
    }
    for c in &g.counts {
        out.extend_from_slice(&(*c as u64).to_le_bytes());
    }
    out.extend_from_slice(&g.data);
    out
}

fn read_u64(b: &[u8], at: usize) -> CommResult<u64> {
    b.get(at..at + 8).map(|s| u64::from_le_bytes(s.try_into().unwrap_or([0; 8]))).ok_or_else(|| CommError::Invalid("hier allgatherv: truncated host blob".into()))
}

/// Decodes the leaders' allgather of host blobs into world-rank order.
fn unpack_world(blob: &Gathered, world: usize) -> CommResult<Gathered> {
    let mut pieces: Vec<Option<&[u8]>> = vec![None; world];
    for h in 0..blob.counts.len() {
        let b = blob.piece(h);
        let n = read_u64(b, 0)? as usize;
        let mut data_at = 8 + 16 * n;
        for i in 0..n {
            let r = read_u64(b, 8 + 8 * i)? as usize;
            let c = read_u64(b, 8 + 8 * n + 8 * i)? as usize;
            let piece = b.get(data_at..data_at + c).ok_or_else(|| CommError::Invalid("hier allgatherv: truncated host blob".into()))?;
            *pieces.get_mut(r).ok_or_else(|| CommError::Invalid("hier allgatherv: bad rank".into()))? = Some(piece);
            data_at += c;
        }
    }
    let mut out = Gathered::default();
    for p in pieces {
        let p = p.ok_or_else(|| CommError::Invalid("hier allgatherv: a rank's piece is missing".into()))?;
        out.counts.push(p.len());
        out.data.extend_from_slice(p);
    }
    Ok(out)
}

impl Collectives for HierCollectives {
    fn name(&self) -> &'static str {
        "hier"
    }
    fn rank(&self) -> usize {
        self.world.rank()
    }
    fn size(&self) -> usize {
        self.world.size()
    }
    fn allreduce_raw(&mut self, buf: &mut [u8], dtype: DType, op: ReduceOp) -> CommResult<()> {
        let layout = FusedLayout::new(&[buf.len() / dtype.size()], &self.fusion_levels());
        self.allreduce_fused(buf, &layout, dtype, op)
    }
    fn fusion_levels(&self) -> Vec<usize> {
        vec![self.local_size, self.cross.size()]
    }
    fn allreduce_fused(&mut self, buf: &mut [u8], layout: &FusedLayout, dtype: DType, op: ReduceOp) -> CommResult<()> {
        let h = Header::allreduce_for(buf, dtype, op);
        if self.world.verify() {
            verify::agree(self.world.comm(), &h)?;
        }
        if h.count == u64::MAX {
            return Err(CommError::BadBuffer { len: buf.len(), dtype: dtype.name() });
        }
        self.allreduce_laid_out(buf, layout, dtype, op)
    }
    fn allgatherv_raw(&mut self, send: &[u8]) -> CommResult<Gathered> {
        if self.world.verify() {
            verify::agree(self.world.comm(), &Header::allgatherv(send.len()))?;
        }
        if self.cross.size() > 1 {
            self.cross_counter.opaque();
        }
        let local = self.local.allgatherv_raw(send)?;
        let mut blob_len = [0u64; 1];
        let mut blob = Vec::new();
        if self.is_leader() {
            let ranks: Vec<usize> = (0..self.host_of_rank.len()).filter(|r| self.host_of_rank[*r] == self.host_id).collect();
            let mine = pack_host(&ranks, &local);
            let all = crate::gather::mpi_allgatherv(&self.cross.comm, &mine)?;
            blob = pack_gathered(&all);
            blob_len[0] = blob.len() as u64;
        }
        self.local.broadcast_raw(bytemuck::cast_slice_mut(&mut blob_len), 0)?;
        blob.resize(blob_len[0] as usize, 0);
        self.local.broadcast_raw(&mut blob, 0)?;
        let all = unpack_gathered(&blob)?;
        unpack_world(&all, self.size())
    }
    fn broadcast_raw(&mut self, buf: &mut [u8], root: usize) -> CommResult<()> {
        if root >= self.size() {
            return Err(CommError::Invalid(format!("broadcast root {root} is not a rank of a world of {}", self.size())));
        }
        if self.world.verify() {
            verify::agree(self.world.comm(), &Header::broadcast(buf.len(), root))?;
        }
        let root_host = self.host_of_rank[root];
        if self.cross.size() > 1 && !buf.is_empty() {
            self.cross_counter.opaque();
        }
        if root_host == self.host_id {
            self.local.broadcast_raw(buf, self.local_rank_of_rank[root])?;
        }
        if self.is_leader() && self.cross.size() > 1 && !buf.is_empty() {
            // The leader of host h has cross_rank h.
            self.cross.comm.process_at_rank(root_host as i32).broadcast_into(buf);
        }
        if root_host != self.host_id {
            self.local.broadcast_raw(buf, 0)?;
        }
        Ok(())
    }
    fn gatherv_raw(&mut self, send: &[u8], root: usize) -> CommResult<Option<Gathered>> {
        self.cross_counter.opaque();
        self.world.gatherv_raw(send, root)
    }
    fn barrier(&mut self) -> CommResult<()> {
        // The world header exchange is itself a barrier (with verification); a shm-only
        // barrier could not see a rank of another host calling something else.
        self.world.barrier()
    }
    fn traffic(&self) -> Option<Traffic> {
        count::sum(self.local.traffic(), self.cross_counter.traffic())
    }
    fn widens_halves(&self) -> bool {
        true
    }
}

/// Serialises a Gathered as [n][counts; n][data].
fn pack_gathered(g: &Gathered) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + 8 * g.counts.len() + g.data.len());
    out.extend_from_slice(&(g.counts.len() as u64).to_le_bytes());
    for c in &g.counts {
        out.extend_from_slice(&(*c as u64).to_le_bytes());
    }
    out.extend_from_slice(&g.data);
    out
}

fn unpack_gathered(b: &[u8]) -> CommResult<Gathered> {
    let n = read_u64(b, 0)? as usize;
    let mut counts = Vec::with_capacity(n.min(1 << 20));
    for i in 0..n {
        counts.push(read_u64(b, 8 + 8 * i)? as usize);
    }
    let data = b.get(8 + 8 * n..).ok_or_else(|| CommError::Invalid("hier allgatherv: truncated blob".into()))?.to_vec();
    if counts.iter().sum::<usize>() != data.len() {
        return Err(CommError::Invalid("hier allgatherv: inconsistent blob".into()));
    }
    Ok(Gathered { data, counts })
}
