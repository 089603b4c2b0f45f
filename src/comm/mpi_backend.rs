//! `mpi`: the MPI library's own collectives, the reference every other backend is measured
//! against. Allreduce is `MPI_Allreduce(MPI_IN_PLACE, ...)` on the caller's buffer, as an
//! MPI user writes it: no copy, no allocation. f16/bf16 are widened to f32 (MPI has no half
//! types) and narrowed back.

use mpi::collective::{CommunicatorCollectives, SystemOperation};
use mpi::topology::Communicator;
use mpi::traits::{AsRaw, Equivalence, Root};

use super::{verify, Collectives, Gathered, Header};
use crate::gather::{mpi_allgatherv, mpi_gatherv};
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
