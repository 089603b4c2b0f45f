//! Collectives on device memory: [`DeviceCollectives`], the counterpart of
//! [`super::Collectives`] for buffers of a [`Device`]. NCCL implements it on GPUs
//! ([`super::nccl::NcclComm`]); [`HostCollectives`] implements it with any CPU backend
//! for devices whose memory is the host's (the host-kernels device of the tests, which
//! hands a buffer's memory over once the work queued on it has run, and the CPU device in
//! the allreduce benchmark).
//!
//! Calls may only queue the work (NCCL runs on the device queue's stream);
//! [`DeviceCollectives::wait`] waits for all of it, with the deadline
//! `RINGREC_COMM_TIMEOUT_SECONDS`, and reports a failed or stuck peer.

use super::{Collectives, CollectivesExt, FusedLayout};
use crate::device::{Device, Scalar};
use crate::dtype::{Element, ReduceOp};
use crate::{CommError, CommResult};

/// Collective operations on device buffers among the ranks of the world (every rank makes
/// the same sequence of calls).
pub trait DeviceCollectives<D: Device>: Send {
    /// The backend's name.
    fn name(&self) -> &'static str;
    /// This rank.
    fn rank(&self) -> usize;
    /// Ranks in the group.
    fn size(&self) -> usize;
    /// Queues an in-place allreduce of `n` elements of `buf` from element `at`.
    fn allreduce<T: Scalar + Element>(&mut self, dev: &D, buf: &mut D::Buf<T>, at: usize, n: usize, op: ReduceOp) -> CommResult<()>;
    /// The part counts at which the collectives cut a buffer ([`super::Collectives::fusion_levels`]):
    /// a fusion buffer laid out by a [`FusedLayout`] with these levels is reduced by
    /// [`DeviceCollectives::allreduce_fused`] element for element as its tensors alone.
    /// Empty (the default) where the order is not ringrec's: NCCL picks its own algorithm
    /// (ring or tree, its channels and chunks) by message size, so fusion may change the
    /// last bits of a sum at 3+ ranks there.
    fn fusion_levels(&self) -> Vec<usize> {
        Vec::new()
    }
    /// Queues an in-place allreduce of the first `layout.len()` elements of `buf`, a fusion
    /// buffer laid out by `layout` (made with [`DeviceCollectives::fusion_levels`]). The
    /// default reduces them as one buffer.
    fn allreduce_fused<T: Scalar + Element>(&mut self, dev: &D, buf: &mut D::Buf<T>, layout: &FusedLayout, op: ReduceOp) -> CommResult<()> {
        self.allreduce(dev, buf, 0, layout.len(), op)
    }
    /// Queues a copy of `n` elements of rank `root`'s `buf` (from `at`) into every rank's.
    fn broadcast<T: Scalar + Element>(&mut self, dev: &D, buf: &mut D::Buf<T>, at: usize, n: usize, root: usize) -> CommResult<()>;
    /// Queues an allgather of the first `n` words of every rank's `send` into `recv`:
    /// rank r's at words `r * n ..` (1-bit compression's encodings).
    fn allgather_words(&mut self, dev: &D, send: &mut D::Buf<u32>, n: usize, recv: &mut D::Buf<u32>) -> CommResult<()>;
    /// Queues an allgather of the first `n` elements of every rank's `send` (`n` may differ
    /// between ranks) into a new buffer, rank 0's first; returns it with each rank's count.
    fn allgatherv<T: Scalar + Element>(&mut self, dev: &D, send: &mut D::Buf<T>, n: usize) -> CommResult<(D::Buf<T>, Vec<usize>)>;
    /// Waits for everything queued (with a deadline where a peer could hang it).
    fn wait(&mut self, dev: &D) -> CommResult<()>;
}

fn device_failed(e: crate::device::DeviceError) -> CommError {
    CommError::Failed(e.to_string())
}

/// [`DeviceCollectives`] over a CPU backend, for devices whose memory is the host's.
pub struct HostCollectives {
    coll: Box<dyn Collectives>,
}

impl HostCollectives {
    /// Reduces over `coll`'s ranks.
    pub fn new(coll: Box<dyn Collectives>) -> HostCollectives {
        HostCollectives { coll }
    }
}

// SAFETY: the backend (communicators, mappings) is moved whole into the one thread that
// uses it from then on (the engine's); MPI runs at MPI_THREAD_MULTIPLE.
unsafe impl Send for HostCollectives {}

fn host_slice<'a, D: Device, T: Scalar>(dev: &D, buf: &'a mut D::Buf<T>, at: usize, n: usize) -> CommResult<&'a mut [T]> {
    let kind = dev.kind();
    let all = dev.host_memory(buf).ok_or_else(|| CommError::Unsupported { backend: "host collectives", reason: format!("the memory of a {kind} device is not host memory; use its own collectives (NCCL on GPUs)") })?;
    let len = all.len();
    all.get_mut(at..at + n).ok_or_else(|| CommError::Invalid(format!("elements {at}..{} of a buffer of {len}", at + n)))
}

impl<D: Device> DeviceCollectives<D> for HostCollectives {
    fn name(&self) -> &'static str {
        self.coll.name()
    }
    fn rank(&self) -> usize {
        self.coll.rank()
    }
    fn size(&self) -> usize {
        self.coll.size()
    }
    fn allreduce<T: Scalar + Element>(&mut self, dev: &D, buf: &mut D::Buf<T>, at: usize, n: usize, op: ReduceOp) -> CommResult<()> {
        self.coll.allreduce(host_slice(dev, buf, at, n)?, op)
    }
    fn fusion_levels(&self) -> Vec<usize> {
        self.coll.fusion_levels()
    }
    fn allreduce_fused<T: Scalar + Element>(&mut self, dev: &D, buf: &mut D::Buf<T>, layout: &FusedLayout, op: ReduceOp) -> CommResult<()> {
        let n = layout.len();
        self.coll.allreduce_fused(bytemuck::cast_slice_mut(host_slice(dev, buf, 0, n)?), layout, T::DTYPE, op)
    }
    fn broadcast<T: Scalar + Element>(&mut self, dev: &D, buf: &mut D::Buf<T>, at: usize, n: usize, root: usize) -> CommResult<()> {
        self.coll.broadcast(host_slice(dev, buf, at, n)?, root)
    }
    fn allgather_words(&mut self, dev: &D, send: &mut D::Buf<u32>, n: usize, recv: &mut D::Buf<u32>) -> CommResult<()> {
        let size = self.coll.size();
        let g = self.coll.allgatherv_raw(bytemuck::cast_slice(host_slice(dev, send, 0, n)?))?;
        if g.data.len() != 4 * size * n {
            return Err(CommError::Invalid(format!("an allgather of {n} words per rank returned {} bytes from {size} ranks", g.data.len())));
        }
        bytemuck::cast_slice_mut::<u32, u8>(host_slice(dev, recv, 0, size * n)?).copy_from_slice(&g.data);
        Ok(())
    }
    fn allgatherv<T: Scalar + Element>(&mut self, dev: &D, send: &mut D::Buf<T>, n: usize) -> CommResult<(D::Buf<T>, Vec<usize>)> {
        let g = self.coll.allgatherv_raw(bytemuck::cast_slice(host_slice(dev, send, 0, n)?))?;
        let size = std::mem::size_of::<T>();
        let total = g.data.len() / size;
        let mut recv = dev.alloc::<T>(total).map_err(device_failed)?;
        bytemuck::cast_slice_mut::<T, u8>(host_slice(dev, &mut recv, 0, total)?).copy_from_slice(&g.data[..total * size]);
        Ok((recv, g.counts.iter().map(|c| c / size).collect()))
    }
    fn wait(&mut self, _dev: &D) -> CommResult<()> {
        Ok(())
    }
}

/// [`DeviceCollectives`] of a world of one rank: nothing to reduce, no library needed (a
/// single GPU trains without NCCL).
pub struct Alone;

impl<D: Device> DeviceCollectives<D> for Alone {
    fn name(&self) -> &'static str {
        "none (one rank)"
    }
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn allreduce<T: Scalar + Element>(&mut self, _dev: &D, _buf: &mut D::Buf<T>, _at: usize, _n: usize, _op: ReduceOp) -> CommResult<()> {
        Ok(())
    }
    fn broadcast<T: Scalar + Element>(&mut self, _dev: &D, _buf: &mut D::Buf<T>, _at: usize, _n: usize, _root: usize) -> CommResult<()> {
        Ok(())
    }
    fn allgather_words(&mut self, dev: &D, send: &mut D::Buf<u32>, n: usize, recv: &mut D::Buf<u32>) -> CommResult<()> {
        dev.copy((&*send, 0), (recv, 0), n).map_err(device_failed)
    }
    fn allgatherv<T: Scalar + Element>(&mut self, dev: &D, send: &mut D::Buf<T>, n: usize) -> CommResult<(D::Buf<T>, Vec<usize>)> {
        let mut recv = dev.alloc::<T>(n).map_err(device_failed)?;
        dev.copy((&*send, 0), (&mut recv, 0), n).map_err(device_failed)?;
        Ok((recv, vec![n]))
    }
    fn wait(&mut self, _dev: &D) -> CommResult<()> {
        Ok(())
    }
}
