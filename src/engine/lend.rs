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
use std::sync::{Mutex, OnceLock};

use half::{bf16, f16};

use super::{EngineConfig, EngineError, EngineResult, ExecuteDevice, MakeDevice, Runtime};
use crate::comm::device::{Alone, HostCollectives};
use crate::comm::nccl::NcclComm;
use crate::comm::{self, Backend};
use crate::device::lent::device_buffer_mut;
use crate::device::{select, CudaDevice, Device, DeviceError, DeviceResult, HostKernels, HostOptions, LentBuf, Placement, Scalar};
use crate::dtype::{DType, Element};
use crate::tensor::{DeviceTensor, Tensor};
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
    /// engine's tensor is). Refuses a null or misaligned pointer and another device's memory;
    /// a tensor of no elements lends no memory (DLPack's empty tensors have a null pointer):
    /// it becomes an empty buffer of the device's own, and `owner` is released at once.
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
        if n == 0 {
            drop(owner);
            let empty = self.dev.alloc::<T>(0)?;
            return Ok(Tensor::on_device(DeviceTensor::new(empty, T::DTYPE, 0, self.dev.kind())).with_shape(shape).unwrap_or_else(|t| t));
        }
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

/// What makes a runtime's device side at its first device tensor: the placement asked
/// for, a copy of the topology for the engine's thread (its own communicators), the host
/// backend of the host-kernels device's collectives.
struct Plan {
    placement: Placement,
    topo: Topology,
    backend: Backend,
}

/// A runtime's device side ([`Runtime::lend_device`]): made at the first device tensor, not
/// at the start, so a program that never gives one makes no GPU context and no NCCL
/// communicator (Horovod's lazy NCCL set-up).
#[derive(Default)]
pub(super) struct DeviceSide {
    /// The lender, or why this rank has none (made once).
    made: OnceLock<Result<Box<dyn LendDevice>, String>>,
    /// What makes it; taken by the first device tensor.
    plan: Mutex<Option<Plan>>,
}

/// A value moved whole into the engine's thread.
struct ToEngine<T>(T);

// SAFETY: the values moved (a topology's communicators, a device's queue) are used by the
// engine's thread alone from then on; MPI runs at MPI_THREAD_MULTIPLE (the engine refuses a
// multi-rank world without it) and a device handle is valid in every thread.
unsafe impl<T> Send for ToEngine<T> {}

impl<T> ToEngine<T> {
    fn take(self) -> T {
        self.0
    }
}

/// A device executor on `queue` reducing with the collectives `coll` makes (on the engine's
/// thread, at the first device response), boxed as the engine takes it.
fn make_on<D: Device + 'static, C: crate::comm::DeviceCollectives<D> + 'static>(queue: D, topo: Topology, coll: impl FnOnce(&Topology, &D) -> EngineResult<C> + 'static) -> MakeDevice {
    let moved = ToEngine((queue, topo, coll));
    Box::new(move || {
        let (queue, topo, coll) = moved.take();
        let c = coll(&topo, &queue)?;
        Ok(Box::new(super::DeviceExecutor::new(queue, c)) as Box<dyn ExecuteDevice>)
    })
}

/// This rank's GPU (`machine_local_rank % visible GPUs`), made alone.
fn rank_gpu(topo: &Topology) -> Result<CudaDevice, String> {
    let info = select::probe_device().map_err(|e| e.to_string())?;
    if topo.size > 1 {
        select::probe_nccl().map_err(|e| e.to_string())?;
    }
    let ordinal = select::select_ordinal(topo.machine_local_rank, info.devices).map_err(|e| e.to_string())?;
    CudaDevice::new(ordinal).map_err(|e| format!("GPU {ordinal}: {e}"))
}

impl Runtime {
    /// Starts the engine over `topo` with `config`; device tensors go to `placement`'s
    /// device: `HostKernels` over the engine's host backend (the tests' stand-in for a GPU),
    /// `Cuda` this rank's GPU with NCCL (none for one rank), `Auto` the GPU when this build
    /// and machine have one, `Cpu` none. Nothing of the device is made here: the first
    /// device tensor makes it ([`Runtime::lend_device`]).
    pub fn with_device(topo: Topology, config: &EngineConfig, placement: Placement) -> EngineResult<Runtime> {
        let mut rt = Runtime::new(topo, config)?;
        if placement != Placement::Cpu {
            // Collective (the copy's communicators), as the start is.
            let backend = config.backend.unwrap_or_else(|| Backend::auto(&rt.topo));
            rt.device = DeviceSide { made: OnceLock::new(), plan: Mutex::new(Some(Plan { placement, topo: rt.topo.duplicate(), backend })) };
        }
        Ok(rt)
    }

    /// What lends device tensors to this runtime's engine, once a device tensor made it.
    pub fn lender(&self) -> Option<&dyn LendDevice> {
        self.device.made.get().and_then(|m| m.as_ref().ok()).map(|l| &**l)
    }

    /// What lends device tensors to this runtime's engine, made by the first call: this
    /// rank's device alone (a GPU context and the executor's stream), the executor's
    /// collectives (NCCL) on the engine's thread at the first response on device tensors,
    /// which every rank runs together — only once every rank gave a device tensor for it
    /// (the engine negotiates where each rank's tensor lives: a rank that gave a host tensor
    /// makes the collective an error naming every rank's). `Err`: why this rank takes no
    /// device tensors (the placement is the CPU, no GPU or driver), the same on later calls.
    pub fn lend_device(&self) -> Result<&dyn LendDevice, String> {
        let made = self.device.made.get_or_init(|| {
            let plan = self.device.plan.lock().unwrap_or_else(|e| e.into_inner()).take();
            match plan {
                Some(p) => self.make_device(p),
                None => Err("ringrec was started without a device for device tensors (the CPU placement)".into()),
            }
        });
        made.as_ref().map(|l| &**l).map_err(Clone::clone)
    }

    /// This rank's device and lender for `plan`, the engine told how to make the executor.
    fn make_device(&self, plan: Plan) -> Result<Box<dyn LendDevice>, String> {
        let Plan { placement, topo, backend } = plan;
        let rank = topo.rank;
        let (lender, describe, make): (Box<dyn LendDevice>, String, MakeDevice) = match placement {
            Placement::Cpu => return Err("ringrec was started without a device for device tensors (the CPU placement)".into()),
            Placement::HostKernels => {
                let dev = HostKernels::with_options(HostOptions::from_env(rank)?).map_err(|e| format!("rank {rank}: {e}"))?;
                let queue = dev.fork().map_err(|e| e.to_string())?;
                let describe = format!("{backend} on {}", dev.describe());
                let stream = queue.stream_handle();
                let make = make_on(queue, topo, move |topo: &Topology, _: &HostKernels| Ok(HostCollectives::new(comm::build_tagged(backend, topo, "device")?)));
                (Box::new(Lender { dev, stream }), describe, make)
            }
            Placement::Auto | Placement::Cuda(_) => {
                let dev = rank_gpu(&topo).map_err(|e| format!("rank {rank}: {e}"))?;
                let bus = dev.pci_bus_id().map_err(|e| e.to_string())?;
                let queue = dev.fork().map_err(|e| e.to_string())?;
                let stream = queue.stream_handle();
                let describe = format!("{} on {}", if topo.size == 1 { "none (one rank)" } else { "nccl" }, dev.describe());
                let distinct = move |topo: &Topology| select::check_distinct(topo, &bus, topo.config.allow_shared_gpu).map_err(config_err);
                let make = if topo.size == 1 {
                    make_on(queue, topo, move |topo: &Topology, _: &CudaDevice| distinct(topo).map(|()| Alone))
                } else {
                    make_on(queue, topo, move |topo: &Topology, queue: &CudaDevice| {
                        distinct(topo)?;
                        NcclComm::new(topo, queue).map_err(|e| EngineError::Config(format!("rank {} joining the NCCL communicator: {e}", topo.rank)))
                    })
                };
                (Box::new(Lender { dev, stream }), describe, make)
            }
        };
        self.engine.attach_device(describe, make).map_err(|e| e.to_string())?;
        Ok(lender)
    }
}

fn config_err(e: impl std::fmt::Display) -> EngineError {
    EngineError::Config(e.to_string())
}

/// [`super::init`] with device tensors going to `placement`'s device, made at the first
/// ([`Runtime::with_device`]).
pub fn init_on(placement: Placement) -> EngineResult<Runtime> {
    let config = EngineConfig::from_env()?;
    let topo = Topology::init()?;
    Runtime::with_device(topo, &config, placement)
}
