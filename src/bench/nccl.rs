//! The NCCL row of `ringrec bench allreduce` (`--backends nccl`): the same table as the CPU
//! backends, on device buffers, like nccl-tests' `all_reduce_perf` (in place; the loop of
//! iterations is queued on the communicator's stream and timed to its completion).
//! Without the `cuda` feature the backend is skipped with the reason.

use super::allreduce::Target;
use crate::topology::Topology;

/// The rank's GPU (`machine_local_rank % visible GPUs`) with the world's NCCL communicator.
#[cfg(feature = "cuda")]
pub fn target(topo: &Topology) -> anyhow::Result<Box<dyn Target>> {
    use crate::cuda::{CudaDevice, DeviceChoice, NcclComm};
    let open = || -> Result<CudaDevice, crate::cuda::CudaError> {
        let ordinal = crate::cuda::resolve(DeviceChoice::Cuda, topo.machine_local_rank, topo.machine_local_size, topo.size)?.unwrap_or(0);
        CudaDevice::new(ordinal)
    };
    // Every rank has its GPU before any waits in NCCL's start-up.
    let dev = topo.agree(open().map_err(|e| format!("rank {}: {e}", topo.rank)))?;
    let comm = NcclComm::new(topo, &dev)?;
    let buf = dev.stream().null()?;
    Ok(Box::new(gpu::NcclTarget { dev, comm, buf }))
}

/// Without the `cuda` feature: the reason the row is skipped.
#[cfg(not(feature = "cuda"))]
pub fn target(_topo: &Topology) -> anyhow::Result<Box<dyn Target>> {
    Err(crate::cuda::CudaError::NotBuilt.into())
}

#[cfg(feature = "cuda")]
mod gpu {
    use cudarc::driver::CudaSlice;

    use super::Target;
    use crate::cuda::{CudaDevice, NcclComm};
    use crate::dtype::{DType, ReduceOp};

    pub(super) struct NcclTarget {
        pub dev: CudaDevice,
        pub comm: NcclComm,
        pub buf: CudaSlice<u8>,
    }

    impl Target for NcclTarget {
        fn name(&self) -> String {
            "nccl".into()
        }
        fn load(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
            let s = self.dev.stream();
            self.buf = if bytes.is_empty() { s.null()? } else { s.clone_htod(bytes)? };
            s.synchronize()?;
            Ok(())
        }
        fn allreduce(&mut self, dtype: DType, op: ReduceOp) -> anyhow::Result<()> {
            Ok(self.comm.allreduce(&mut self.buf, dtype, op)?)
        }
        fn sync(&mut self) -> anyhow::Result<()> {
            Ok(self.comm.wait()?)
        }
        fn read(&mut self, out: &mut [u8]) -> anyhow::Result<()> {
            if !out.is_empty() {
                let s = self.dev.stream();
                s.memcpy_dtoh(&self.buf, out)?;
                s.synchronize()?;
            }
            Ok(())
        }
    }
}
