//! `mpi`: the MPI library's own collectives, the reference every other backend is measured
//! against. Allreduce is `MPI_Allreduce(MPI_IN_PLACE, ...)` on the caller's buffer, as an
//! MPI user writes it: no copy, no allocation. f16/bf16 are widened to f32 (MPI has no half
//! types) and narrowed back.

use mpi::collective::{CommunicatorCollectives, SystemOperation};
use mpi::datatype::PartitionMut;
use mpi::topology::Communicator;
use mpi::traits::{AsRaw, Equivalence, Root};

use super::{verify, Collectives, Gathered, Header};
use crate::dtype::{self, DType, ReduceOp};
use crate::topology::Group;
use crate::{CommError, CommResult};

/// Collectives delegated to MPI.
pub struct MpiCollectives {
    group: Group,
    verify: bool,
}

impl MpiCollectives {
    /// Over `group` (a private duplicate is best); `verify` exchanges headers first.
    pub fn new(group: Group, verify: bool) -> MpiCollectives {
        MpiCollectives { group, verify }
    }
    /// The communicator.
    pub(crate) fn comm(&self) -> &mpi::topology::SimpleCommunicator {
        &self.group.comm
    }
    /// Whether headers are exchanged first.
    pub(crate) fn verify(&self) -> bool {
        self.verify
    }
}

fn system_op(op: ReduceOp) -> SystemOperation {
    match op.combine() {
        ReduceOp::Min => SystemOperation::min(),
        ReduceOp::Max => SystemOperation::max(),
        _ => SystemOperation::sum(),
    }
}

extern "C" {
    /// `MPI_IN_PLACE` of the linked MPI (src/comm/mpi_shim.c).
    fn ringrec_mpi_in_place() -> *mut std::ffi::c_void;
}

/// `MPI_Allreduce(MPI_IN_PLACE, buf, ...)`, in pieces of at most `i32::MAX` elements (MPI's
/// count is an int).
fn typed_allreduce<T: Equivalence + bytemuck::Pod>(comm: &mpi::topology::SimpleCommunicator, buf: &mut [u8], dtype: DType, op: ReduceOp) -> CommResult<()> {
    let vals: &mut [T] = bytemuck::try_cast_slice_mut(buf).map_err(|_| CommError::BadBuffer { len: 0, dtype: dtype.name() })?;
    let (datatype, op) = (T::equivalent_datatype().as_raw(), system_op(op).as_raw());
    for piece in vals.chunks_mut(i32::MAX as usize) {
        // SAFETY: `piece` is a live, exclusively borrowed buffer of `piece.len()` elements of
        // `T`, whose MPI datatype is `datatype`; with MPI_IN_PLACE MPI reads and writes only
        // that buffer, and returns before the borrow ends (a blocking call). The count fits
        // an int (chunks of at most i32::MAX). Every rank calls with the same count, dtype
        // and op (the header agreement before it, or the caller's contract).
        let rc = unsafe { mpi::ffi::MPI_Allreduce(ringrec_mpi_in_place(), piece.as_mut_ptr().cast(), piece.len() as i32, datatype, op, comm.as_raw()) };
        if rc != 0 {
            return Err(CommError::Invalid(format!("MPI_Allreduce failed with error code {rc}")));
        }
    }
    Ok(())
}

/// MPI_Allreduce over raw bytes of `dtype` (half types through f32), Average included.
pub(crate) fn mpi_allreduce(comm: &mpi::topology::SimpleCommunicator, buf: &mut [u8], dtype: DType, op: ReduceOp) -> CommResult<()> {
    if buf.len() % dtype.size() != 0 {
        return Err(CommError::BadBuffer { len: buf.len(), dtype: dtype.name() });
    }
    if buf.is_empty() {
        return Ok(());
    }
    match dtype {
        DType::F32 => typed_allreduce::<f32>(comm, buf, dtype, op)?,
        DType::F64 => typed_allreduce::<f64>(comm, buf, dtype, op)?,
        DType::I32 => typed_allreduce::<i32>(comm, buf, dtype, op)?,
        DType::I64 => typed_allreduce::<i64>(comm, buf, dtype, op)?,
        DType::F16 | DType::BF16 => {
            let mut wide = dtype::half_to_f32(buf, dtype)?;
            typed_allreduce::<f32>(comm, bytemuck::cast_slice_mut(&mut wide), DType::F32, op)?;
            if op == ReduceOp::Average {
                dtype::scale(bytemuck::cast_slice_mut(&mut wide), DType::F32, comm.size() as usize)?;
            }
            return dtype::f32_to_half(&wide, buf, dtype);
        }
        DType::U8 => return Err(CommError::Invalid("uint8 buffers cannot be reduced".into())),
    }
    if op == ReduceOp::Average {
        dtype::scale(buf, dtype, comm.size() as usize)?;
    }
    Ok(())
}

/// MPI_Allgatherv of byte pieces (lengths exchanged first).
pub(crate) fn mpi_allgatherv(comm: &mpi::topology::SimpleCommunicator, send: &[u8]) -> CommResult<Gathered> {
    let n = comm.size() as usize;
    let mine = send.len() as u64;
    let mut lens = vec![0u64; n];
    comm.all_gather_into(&mine, &mut lens[..]);
    let counts: Vec<usize> = lens.iter().map(|l| *l as usize).collect();
    let total: usize = counts.iter().sum();
    if counts.iter().any(|c| *c > i32::MAX as usize) || total > i32::MAX as usize {
        return Err(CommError::Invalid("allgatherv over MPI is limited to 2 GiB in total".into()));
    }
    let mut data = vec![0u8; total];
    if total == 0 {
        return Ok(Gathered { data, counts });
    }
    let c32: Vec<i32> = counts.iter().map(|c| *c as i32).collect();
    let displs = displacements(&c32);
    let anchor = [0u8; 8];
    {
        let mut part = PartitionMut::new(&mut data[..], &c32[..], &displs[..]);
        comm.all_gather_varcount_into(not_in_place(send, &anchor), &mut part);
    }
    Ok(Gathered { data, counts })
}

/// MPI_Gatherv of byte pieces to `root`.
pub(crate) fn mpi_gatherv(comm: &mpi::topology::SimpleCommunicator, send: &[u8], root: usize) -> CommResult<Option<Gathered>> {
    let n = comm.size() as usize;
    let me = comm.rank() as usize;
    let root_proc = comm.process_at_rank(root as i32);
    // Every rank learns every length, so all agree on skipping an empty gather.
    let mine = send.len() as u64;
    let mut lens = vec![0u64; n];
    comm.all_gather_into(&mine, &mut lens[..]);
    let counts: Vec<usize> = lens.iter().map(|l| *l as usize).collect();
    let total: usize = counts.iter().sum();
    if total > i32::MAX as usize {
        return Err(CommError::Invalid("gatherv over MPI is limited to 2 GiB in total".into()));
    }
    if total == 0 {
        return Ok((me == root).then(|| Gathered { data: Vec::new(), counts }));
    }
    let anchor = [0u8; 8];
    let send = not_in_place(send, &anchor);
    if me == root {
        let c32: Vec<i32> = counts.iter().map(|c| *c as i32).collect();
        let displs = displacements(&c32);
        let mut data = vec![0u8; total];
        {
            let mut part = PartitionMut::new(&mut data[..], &c32[..], &displs[..]);
            root_proc.gather_varcount_into_root(send, &mut part);
        }
        Ok(Some(Gathered { data, counts }))
    } else {
        root_proc.gather_varcount_into(send);
        Ok(None)
    }
}

/// An empty slice that does not point at address 1: Open MPI defines `MPI_IN_PLACE` as
/// `(void *)1`, which is exactly where Rust puts empty byte slices.
fn not_in_place<'a>(s: &'a [u8], anchor: &'a [u8; 8]) -> &'a [u8] {
    if s.is_empty() {
        &anchor[..0]
    } else {
        s
    }
}

fn displacements(counts: &[i32]) -> Vec<i32> {
    counts
        .iter()
        .scan(0i32, |acc, c| {
            let d = *acc;
            *acc += c;
            Some(d)
        })
        .collect()
}

impl Collectives for MpiCollectives {
    fn name(&self) -> &'static str {
        "mpi"
    }
    fn rank(&self) -> usize {
        self.group.rank()
    }
    fn size(&self) -> usize {
        self.group.size()
    }
    fn allreduce_raw(&mut self, buf: &mut [u8], dtype: DType, op: ReduceOp) -> CommResult<()> {
        if self.verify {
            verify::agree(&self.group.comm, &Header::allreduce(buf.len() / dtype.size().max(1), dtype, op))?;
        }
        mpi_allreduce(&self.group.comm, buf, dtype, op)
    }
    fn allgatherv_raw(&mut self, send: &[u8]) -> CommResult<Gathered> {
        if self.verify {
            verify::agree(&self.group.comm, &Header::allgatherv(send.len()))?;
        }
        mpi_allgatherv(&self.group.comm, send)
    }
    fn broadcast_raw(&mut self, buf: &mut [u8], root: usize) -> CommResult<()> {
        if root >= self.size() {
            return Err(CommError::Invalid(format!("broadcast root {root} is not a rank of a group of {}", self.size())));
        }
        if self.verify {
            verify::agree(&self.group.comm, &Header::broadcast(buf.len(), root))?;
        }
        if !buf.is_empty() {
            self.group.comm.process_at_rank(root as i32).broadcast_into(buf);
        }
        Ok(())
    }
    fn gatherv_raw(&mut self, send: &[u8], root: usize) -> CommResult<Option<Gathered>> {
        if root >= self.size() {
            return Err(CommError::Invalid(format!("gatherv root {root} is not a rank of a group of {}", self.size())));
        }
        if self.verify {
            verify::agree(&self.group.comm, &Header::gatherv(send.len(), root))?;
        }
        mpi_gatherv(&self.group.comm, send, root)
    }
    fn barrier(&mut self) -> CommResult<()> {
        if self.verify {
            verify::agree(&self.group.comm, &Header::barrier())?;
        } else {
            self.group.comm.barrier();
        }
        Ok(())
    }
    fn widens_halves(&self) -> bool {
        true
    }
}
