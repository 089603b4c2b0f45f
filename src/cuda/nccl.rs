//! [`NcclComm`]: NCCL collectives on device memory, one communicator per rank over the MPI
//! world (feature `cuda`; an uninhabited stand-in without it).
//!
//! Start-up as in Horovod and nccl-tests: rank 0 creates the NCCL unique id, MPI broadcasts
//! it, every rank joins with `ncclCommInitRank` on its own GPU. Collectives run on the
//! communicator's own stream, so the dense gradient allreduce overlaps the compute stream
//! and the host-side sparse exchange; cudarc's per-buffer events order them.
//!
//! **Agreement before data**, like the CPU backends: unless `RINGREC_VERIFY=0`, every
//! collective first allgathers a 32-byte header over MPI ([`crate::comm::verify`]), so
//! ranks that call with different counts, dtypes or ops get the same `Mismatch` error on
//! every rank instead of a hang or a silent overrun.
//!
//! **A dead or stuck peer.** NCCL waits forever for a peer that never arrives.
//! [`NcclComm::wait`] polls the queued work with a deadline (`RINGREC_COMM_TIMEOUT_SECONDS`,
//! default 300) and NCCL's asynchronous error state; on either it aborts the communicator
//! and returns an error that says what happened, so the rank exits with a message.

#[cfg(feature = "cuda")]
pub use imp::NcclComm;

#[cfg(not(feature = "cuda"))]
pub use dummy::NcclComm;

use crate::dtype::{DType, ReduceOp};

/// NCCL's name of a [`ReduceOp`] and whether NCCL has it (all four: `ncclAvg` since 2.10).
pub fn op_name(op: ReduceOp) -> &'static str {
    match op {
        ReduceOp::Sum => "ncclSum",
        ReduceOp::Average => "ncclAvg",
        ReduceOp::Min => "ncclMin",
        ReduceOp::Max => "ncclMax",
    }
}

/// NCCL's name of a [`DType`] (all of ringrec's dtypes exist in NCCL).
pub fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "ncclFloat32",
        DType::F64 => "ncclFloat64",
        DType::F16 => "ncclFloat16",
        DType::BF16 => "ncclBfloat16",
        DType::I32 => "ncclInt32",
        DType::I64 => "ncclInt64",
        DType::U8 => "ncclUint8",
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use cudarc::driver::{CudaSlice, CudaStream, DevicePtrMut};
    use cudarc::nccl::sys::{ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t};
    use mpi::traits::{Communicator, Root};

    use crate::comm::{verify, Header};
    use crate::cuda::gpu::CudaDevice;
    use crate::cuda::CudaError;
    use crate::dtype::{DType, ReduceOp};
    use crate::topology::{Group, Topology};

    /// One rank's NCCL communicator over the world (see the module docs).
    pub struct NcclComm {
        comm: ncclComm_t,
        stream: Arc<CudaStream>,
        mpi: Group,
        rank: usize,
        size: usize,
        verify: bool,
        timeout: Duration,
        aborted: bool,
    }

    fn nccl_err(what: &str, e: impl std::fmt::Debug) -> CudaError {
        CudaError::call(what, e)
    }

    fn nccl_dtype(d: DType) -> ncclDataType_t {
        match d {
            DType::F32 => ncclDataType_t::ncclFloat32,
            DType::F64 => ncclDataType_t::ncclFloat64,
            DType::F16 => ncclDataType_t::ncclFloat16,
            DType::BF16 => ncclDataType_t::ncclBfloat16,
            DType::I32 => ncclDataType_t::ncclInt32,
            DType::I64 => ncclDataType_t::ncclInt64,
            DType::U8 => ncclDataType_t::ncclUint8,
        }
    }

    fn nccl_op(op: ReduceOp) -> ncclRedOp_t {
        match op {
            ReduceOp::Sum => ncclRedOp_t::ncclSum,
            ReduceOp::Average => ncclRedOp_t::ncclAvg,
            ReduceOp::Min => ncclRedOp_t::ncclMin,
            ReduceOp::Max => ncclRedOp_t::ncclMax,
        }
    }

    impl NcclComm {
        /// Joins the world's NCCL communicator on `dev`'s GPU (collective over the world).
        pub fn new(topo: &Topology, dev: &CudaDevice) -> Result<NcclComm, CudaError> {
            crate::cuda::probe_nccl()?;
            let mpi = topo.world.duplicate();
            let mut id = [0u8; 128];
            let made = if topo.rank == 0 {
                match cudarc::nccl::result::get_uniqueid() {
                    Ok(u) => {
                        for (d, s) in id.iter_mut().zip(u.internal.iter()) {
                            *d = *s as u8;
                        }
                        Ok(())
                    }
                    Err(e) => Err(nccl_err("ncclGetUniqueId", e)),
                }
            } else {
                Ok(())
            };
            // Every rank learns whether rank 0 has an id before anyone waits in NCCL.
            let mut ok = [u8::from(made.is_ok())];
            mpi.comm.process_at_rank(0).broadcast_into(&mut ok[..]);
            made?;
            if ok[0] == 0 {
                return Err(CudaError::Collective("rank 0 could not create the NCCL unique id (see its error)".into()));
            }
            mpi.comm.process_at_rank(0).broadcast_into(&mut id[..]);
            let mut internal = [0 as std::ffi::c_char; 128];
            for (d, s) in internal.iter_mut().zip(id.iter()) {
                *d = *s as std::ffi::c_char;
            }
            let unique = cudarc::nccl::sys::ncclUniqueId { internal };
            let stream = dev.context().new_stream().map_err(|e| CudaError::call("creating the NCCL stream", e))?;
            dev.context().bind_to_thread().map_err(|e| CudaError::call("binding the CUDA context", e))?;
            let mut comm: ncclComm_t = std::ptr::null_mut();
            // SAFETY: `comm` receives the new communicator; the id is the one every rank got
            // from rank 0; rank and size are this world's.
            unsafe { cudarc::nccl::result::comm_init_rank(&mut comm, topo.size as i32, unique, topo.rank as i32) }.map_err(|e| nccl_err("ncclCommInitRank", e))?;
            Ok(NcclComm { comm, stream, mpi, rank: topo.rank, size: topo.size, verify: crate::comm::verify_from_env(), timeout: crate::comm::shm::timeout_from_env(), aborted: false })
        }

        /// This rank.
        pub fn rank(&self) -> usize {
            self.rank
        }
        /// Ranks in the communicator.
        pub fn size(&self) -> usize {
            self.size
        }
        /// The communicator's stream.
        pub fn stream(&self) -> &Arc<CudaStream> {
            &self.stream
        }

        fn agree(&self, h: Header) -> Result<(), CudaError> {
            if self.aborted {
                return Err(CudaError::Collective("the NCCL communicator was aborted after an earlier failure; restart the job".into()));
            }
            if self.verify && self.size > 1 {
                verify::agree(&self.mpi.comm, &h).map_err(|e| CudaError::Collective(e.to_string()))?;
            }
            Ok(())
        }

        /// Queues an in-place allreduce of the buffer's bytes read as elements of `dtype`
        /// (any element type `T` whose size divides the buffer: bytes for the benchmark,
        /// u16 for f16/bf16, f32) on the communicator's stream. [`NcclComm::wait`] waits.
        pub fn allreduce<T>(&mut self, buf: &mut CudaSlice<T>, dtype: DType, op: ReduceOp) -> Result<(), CudaError> {
            let bytes = buf.num_bytes();
            let count = bytes / dtype.size();
            if count * dtype.size() != bytes {
                return Err(CudaError::Collective(format!("buffer of {bytes} bytes is not a whole array of {}", dtype.name())));
            }
            self.agree(Header::allreduce(count, dtype, op))?;
            if count == 0 {
                return Ok(());
            }
            let stream = self.stream.clone();
            let (ptr, _record) = buf.device_ptr_mut(&stream);
            // SAFETY: in-place allreduce of `count` elements of `dtype` that `buf` holds
            // (checked above), on the communicator's stream; `_record` records the
            // buffer's write event after it, so other streams wait for the result.
            unsafe { cudarc::nccl::result::all_reduce(ptr as *const _, ptr as *mut _, count, nccl_dtype(dtype), nccl_op(op), self.comm, stream.cu_stream() as _) }.map_err(|e| nccl_err("ncclAllReduce", e))?;
            Ok(())
        }

        /// Queues an in-place allreduce of f32 values (the dense gradients).
        pub fn allreduce_f32(&mut self, buf: &mut CudaSlice<f32>, op: ReduceOp) -> Result<(), CudaError> {
            self.allreduce(buf, DType::F32, op)
        }

        /// Queues an in-place broadcast of f32 values from `root`.
        pub fn broadcast_f32(&mut self, buf: &mut CudaSlice<f32>, root: usize) -> Result<(), CudaError> {
            let count = buf.len();
            self.agree(Header::broadcast(count * 4, root))?;
            let stream = self.stream.clone();
            let (ptr, _record) = buf.device_ptr_mut(&stream);
            // SAFETY: in-place broadcast of the buffer's `count` f32 on the comm's stream.
            unsafe { cudarc::nccl::result::broadcast(ptr as *const _, ptr as *mut _, count, ncclDataType_t::ncclFloat32, root as i32, self.comm, stream.cu_stream() as _) }.map_err(|e| nccl_err("ncclBroadcast", e))?;
            Ok(())
        }

        /// Waits for every collective queued so far, with the deadline and NCCL's error
        /// state checked while waiting; aborts the communicator on failure.
        pub fn wait(&mut self) -> Result<(), CudaError> {
            let event = self.stream.record_event(None).map_err(|e| CudaError::call("recording an event on the NCCL stream", e))?;
            let start = Instant::now();
            let mut polls = 0u32;
            loop {
                match event.try_is_complete() {
                    Ok(true) => return Ok(()),
                    Ok(false) => {}
                    Err(e) => return Err(self.abort(format!("the NCCL stream failed: {e:?}"))),
                }
                let mut async_err = ncclResult_t::ncclSuccess;
                // SAFETY: the communicator is live (not aborted); async_err receives its state.
                unsafe { cudarc::nccl::sys::ncclCommGetAsyncError(self.comm, &mut async_err) };
                if async_err != ncclResult_t::ncclSuccess && async_err != ncclResult_t::ncclInProgress {
                    return Err(self.abort(format!("NCCL reported {async_err:?} (a peer rank failed or the network broke); look at the other ranks' output")));
                }
                if start.elapsed() > self.timeout {
                    let secs = self.timeout.as_secs_f64();
                    return Err(self.abort(format!("an NCCL collective did not finish in {secs:.0}s (a peer rank died or is stuck); raise RINGREC_COMM_TIMEOUT_SECONDS if it is just slow")));
                }
                polls = polls.saturating_add(1);
                if polls > 64 {
                    std::thread::sleep(Duration::from_micros(20));
                }
            }
        }

        fn abort(&mut self, why: String) -> CudaError {
            if !self.aborted {
                self.aborted = true;
                // SAFETY: aborting a live communicator once; it is not used afterwards.
                let _ = unsafe { cudarc::nccl::result::comm_abort(self.comm) };
            }
            CudaError::Collective(why)
        }
    }

    impl crate::cuda::device::DeviceReducer<CudaDevice> for NcclComm {
        fn allreduce_sum(&mut self, _dev: &CudaDevice, buf: &mut CudaSlice<f32>) -> Result<(), CudaError> {
            self.allreduce(buf, DType::F32, ReduceOp::Sum)
        }
        fn allreduce_half_sum(&mut self, _dev: &CudaDevice, buf: &mut CudaSlice<u16>, bf16: bool) -> Result<(), CudaError> {
            self.allreduce(buf, if bf16 { DType::BF16 } else { DType::F16 }, ReduceOp::Sum)
        }
        fn wait(&mut self) -> Result<(), CudaError> {
            NcclComm::wait(self)
        }
    }

    impl Drop for NcclComm {
        fn drop(&mut self) {
            if !self.aborted {
                // SAFETY: the communicator is live and no collective is queued past `wait`.
                let _ = unsafe { cudarc::nccl::result::comm_destroy(self.comm) };
            }
        }
    }
}

#[cfg(not(feature = "cuda"))]
mod dummy {
    use crate::cuda::device::Device;
    use crate::cuda::gpu::CudaDevice;
    use crate::dtype::ReduceOp;
    use crate::cuda::CudaError;
    use crate::topology::Topology;

    /// Stands in for the NCCL communicator in builds without the `cuda` feature; it cannot
    /// be constructed.
    pub enum NcclComm {}

    impl crate::cuda::device::DeviceReducer<CudaDevice> for NcclComm {
        fn allreduce_sum(&mut self, _dev: &CudaDevice, _buf: &mut ()) -> Result<(), CudaError> {
            match *self {}
        }
        fn allreduce_half_sum(&mut self, _dev: &CudaDevice, _buf: &mut (), _bf16: bool) -> Result<(), CudaError> {
            match *self {}
        }
        fn wait(&mut self) -> Result<(), CudaError> {
            match *self {}
        }
    }

    impl NcclComm {
        /// Unreachable without a [`CudaDevice`], which cannot be built here either.
        pub fn new(_topo: &Topology, dev: &CudaDevice) -> Result<NcclComm, CudaError> {
            match *dev {}
        }
        /// This rank.
        pub fn rank(&self) -> usize {
            match *self {}
        }
        /// Ranks in the communicator.
        pub fn size(&self) -> usize {
            match *self {}
        }
        /// See the `cuda` build.
        pub fn allreduce_f32(&mut self, _buf: &mut <CudaDevice as Device>::F32, _op: ReduceOp) -> Result<(), CudaError> {
            match *self {}
        }
        /// See the `cuda` build.
        pub fn broadcast_f32(&mut self, _buf: &mut <CudaDevice as Device>::F32, _root: usize) -> Result<(), CudaError> {
            match *self {}
        }
        /// See the `cuda` build.
        pub fn wait(&mut self) -> Result<(), CudaError> {
            match *self {}
        }
    }
}
