//! Device memory a program lends the engine: a [`Runtime`] whose engine has a device
//! executor ([`super::DeviceExecutor`]) and a [`LendDevice`] that turns a framework's device
//! tensor — (address, dtype, shape, device ordinal) and what keeps it alive, a DLPack
//! capsule's manager in the Python module — into an engine tensor over that memory
//! ([`crate::device::LentBuf`]), reduced, broadcast or gathered where it is.
//!
//! Streams (DLPack's protocol): the consumer asks the producer for the tensor with the
//! stream it will use, `__dlpack__(stream=S)`, and the producer makes S wait for its pending
//! work on the tensor. [`LendDevice::stream`] is S: the executor's own stream (NCCL runs on
//! it), so the collective starts after the framework's writes without a host wait. The
//! executor answers a handle only once its stream has finished the operation (it
//! synchronizes), so the result is ready for any stream of the caller when `wait()` returns:
//! the one wait left is that host synchronization, not an event the caller's stream waits on.
//! The host-kernels device has no CUDA stream (`None`: its queues finish before the handle
//! is answered too).

use std::any::Any;

use half::{bf16, f16};

use super::{Engine, EngineConfig, EngineError, EngineResult, ExecuteDevice, Runtime};
use crate::comm::device::{Alone, HostCollectives};
use crate::comm::nccl::NcclComm;
use crate::comm::{self, Backend};
use crate::device::lent::device_buffer_mut;
use crate::device::{select, CudaDevice, Device, DeviceError, DeviceResult, HostKernels, HostOptions, LentBuf, Placement, Scalar};
use crate::dtype::{DType, Element};
use crate::tensor::Tensor;
use crate::topology::Topology;

/// What a program needs to lend device memory to the engine (object-safe: the program does
/// not name the device type).
pub trait LendDevice: Send + Sync {
    /// The executor's device, in words.
    fn describe(&self) -> String;
    /// The device type's short name (`cuda`, `host-kernels`).
    fn kind(&self) -> &'static str;
    /// The device's ordinal (DLPack's `device_id` of the tensors it takes).
    fn ordinal(&self) -> usize;
    /// The stream to pass as DLPack's `__dlpack__(stream=...)` (module docs); `None` on the
    /// host-kernels device.
    fn stream(&self) -> Option<usize>;
    /// An engine tensor of `dtype` and `shape` over the device memory at `address` on device
    /// `ordinal`, kept alive by `owner` (dropped, after the memory is given up, when the
    /// engine's tensor is). Refuses a null or misaligned pointer and another device's memory.
    ///
    /// # Safety
    /// `address` holds the tensor's elements, contiguous, in the memory of device `ordinal`
    /// until the returned tensor is dropped, and nothing else reads or writes them meanwhile
    /// (Horovod's contract for a tensor in flight).
    unsafe fn lend(&self, address: usize, dtype: DType, shape: &[usize], ordinal: usize, owner: Box<dyn Any + Send>) -> DeviceResult<Tensor>;
    /// The device address of a tensor the engine made (an allgather's result), ready for any
    /// stream; `None` when it is not this device's.
    fn address(&self, t: &mut Tensor) -> Option<usize>;
}

/// [`LendDevice`] over device `D`: a queue of the executor's device (to make buffers) and
/// the executor's stream.
struct Lender<D: Device> {
    dev: D,
    stream: Option<usize>,
}

impl<D: Device> Lender<D> {
    /// # Safety
    /// As [`LendDevice::lend`].
    unsafe fn lend_as<T: Scalar + Element>(&self, address: usize, shape: &[usize], ordinal: usize, owner: Box<dyn Any + Send>) -> DeviceResult<Tensor> {
        let n: usize = shape.iter().product();
        // SAFETY: the caller's contract, forwarded.
        let lent = unsafe { LentBuf::<D, T>::new(&self.dev, address, n, ordinal, owner) }?;
        lent.into_tensor(&self.dev, n).with_shape(shape).map_err(|_| DeviceError::refused("lending a tensor", "its shape does not hold its elements"))
    }

    fn address_as<T: Scalar>(&self, t: &mut Tensor) -> Option<usize> {
        let b = device_buffer_mut::<D, T>(t.device_mut()?)?;
        self.dev.address(b)
    }
}

impl<D: Device> LendDevice for Lender<D> {
    fn describe(&self) -> String {
        self.dev.describe()
    }
    fn kind(&self) -> &'static str {
        self.dev.kind()
    }
    fn ordinal(&self) -> usize {
        self.dev.ordinal()
    }
    fn stream(&self) -> Option<usize> {
        self.stream
    }
    unsafe fn lend(&self, address: usize, dtype: DType, shape: &[usize], ordinal: usize, owner: Box<dyn Any + Send>) -> DeviceResult<Tensor> {
        // SAFETY: the caller's contract, forwarded.
        unsafe { by_dtype!(self, lend_as, dtype, address, shape, ordinal, owner) }
    }
    fn address(&self, t: &mut Tensor) -> Option<usize> {
        by_dtype!(self, address_as, t.dtype(), t)
    }
}

fn config_err(e: impl std::fmt::Display) -> EngineError {
    EngineError::Config(e.to_string())
}

/// A device executor and the lender of its device.
type OnDevice = (Box<dyn ExecuteDevice>, Box<dyn LendDevice>);

/// The executor and lender on `dev` with collectives `coll` (the executor queues on a fork).
fn on_device<D: Device, C: crate::comm::DeviceCollectives<D> + 'static>(dev: D, exec_queue: D, coll: C) -> OnDevice {
    let stream = exec_queue.stream_handle();
    (Box::new(super::DeviceExecutor::new(exec_queue, coll)), Box::new(Lender { dev, stream }))
}

/// This rank's GPU (`machine_local_rank % visible GPUs`), checked not to be another rank's.
fn rank_gpu(topo: &Topology) -> Result<CudaDevice, String> {
    let info = select::probe_device().map_err(|e| e.to_string())?;
    if topo.size > 1 {
        select::probe_nccl().map_err(|e| e.to_string())?;
    }
    let ordinal = select::select_ordinal(topo.machine_local_rank, info.devices).map_err(|e| e.to_string())?;
    let dev = CudaDevice::new(ordinal).map_err(|e| format!("GPU {ordinal}: {e}"))?;
    let bus = dev.pci_bus_id().map_err(|e| e.to_string())?;
    select::check_distinct(topo, &bus, topo.config.allow_shared_gpu).map_err(|e| e.to_string())?;
    Ok(dev)
}

/// The device executor and lender for `placement` (collective: every rank calls it with the
/// same placement): `HostKernels` over the engine's host backend (the tests' stand-in for a
/// GPU), `Cuda` on this rank's GPU with NCCL (none for one rank), `Auto` the GPU when this
/// build and machine have one, else none, as `Cpu`.
fn device_for(topo: &Topology, config: &EngineConfig, placement: Placement) -> EngineResult<Option<OnDevice>> {
    let rank = topo.rank;
    match placement {
        Placement::Cpu => Ok(None),
        Placement::HostKernels => {
            let options = topo.agree(HostOptions::from_env(rank)).map_err(config_err)?;
            let dev = topo.agree(HostKernels::with_options(options).map_err(|e| format!("rank {rank}: {e}"))).map_err(config_err)?;
            let queue = dev.fork().map_err(config_err)?;
            let backend = config.backend.unwrap_or_else(|| Backend::auto(topo));
            let coll = HostCollectives::new(comm::build_tagged(backend, topo, "device")?);
            Ok(Some(on_device(dev, queue, coll)))
        }
        Placement::Auto | Placement::Cuda(_) => {
            let dev = topo.agree(rank_gpu(topo).map_err(|e| format!("rank {rank}: {e}")));
            let dev = match dev {
                Err(e) if placement == Placement::Auto => {
                    if rank == 0 && select::probe_device().is_ok() {
                        crate::eprint_line(&format!("ringrec: no GPU for device tensors ({e}); CUDA tensors will be refused"));
                    }
                    return Ok(None);
                }
                dev => dev.map_err(config_err)?,
            };
            let queue = dev.fork().map_err(config_err)?;
            if topo.size == 1 {
                return Ok(Some(on_device(dev, queue, Alone)));
            }
            let nccl = NcclComm::new(topo, &queue).map_err(|e| EngineError::Config(format!("rank {rank} joining the NCCL communicator: {e}")))?;
            Ok(Some(on_device(dev, queue, nccl)))
        }
    }
}

impl Runtime {
    /// Starts the engine over `topo` with `config`, with a device executor on `placement`'s
    /// device where there is one, and the [`LendDevice`] that lends it device tensors
    /// ([`Runtime::lender`]).
    pub fn with_device(topo: Topology, config: &EngineConfig, placement: Placement) -> EngineResult<Runtime> {
        match device_for(&topo, config, placement)? {
            None => Runtime::new(topo, config),
            Some((exec, lender)) => Ok(Runtime { engine: Engine::start_with_device(&topo, config, Some(exec))?, topo, lender: Some(lender) }),
        }
    }

    /// What lends device tensors to this runtime's engine, when it has a device executor.
    pub fn lender(&self) -> Option<&dyn LendDevice> {
        self.lender.as_deref()
    }
}

/// [`super::init`] with a device executor on `placement`'s device ([`Runtime::with_device`]).
pub fn init_on(placement: Placement) -> EngineResult<Runtime> {
    let config = EngineConfig::from_env()?;
    let topo = Topology::init()?;
    Runtime::with_device(topo, &config, placement)
}
