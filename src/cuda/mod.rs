//! The GPU path (feature `cuda`): device selection, NVRTC-compiled kernels, the dense model
//! on the GPU with cuBLAS, and NCCL.
//!
//! cudarc loads libcuda, libnvrtc, libcublas and libnccl at run time (dynamic loading), so
//! the binary builds and starts on machines without CUDA. cudarc panics when asked to load
//! a library that is not there, so [`probe`] checks each library's presence *before*
//! cudarc touches it and turns absence into a [`CudaError`] naming what is missing and
//! suggesting `--device cpu`. Without the feature every probe reports that the build has
//! no CUDA support, and [`CudaDevice`] / [`NcclComm`] are uninhabited stand-ins (like
//! candle's dummy CUDA backend), so callers need no `#[cfg]`.
//!
//! | module | what |
//! |---|---|
//! | [`device`] | the [`Device`] trait: buffers, staging, copies, GEMM, kernels (bounds-checked) |
//! | [`gpu`] | [`CudaDevice`]: cudarc context, compute stream, cuBLAS, NVRTC kernels, pinned memory |
//! | [`host`] | [`HostDevice`]: the same kernel sources compiled as host C++ (tests without a GPU) |
//! | [`mlp`] | [`DeviceMlp`]: the dense model and its optimizer on a device, batch staging |
//! | [`nccl`] | [`NcclComm`]: NCCL communicator (unique id over MPI), watchdog, header agreement |
//! | [`kernels`] | kernels/*.cu embedded, the [`kernels::Kernel`] list, NVRTC compilation |
//! | [`plan`] | row-major GEMMs as cuBLAS's column-major calls |

pub mod device;
pub mod gpu;
pub mod host;
pub mod kernels;
pub mod mlp;
pub mod nccl;
pub mod plan;
#[cfg(test)]
mod device_tests;

pub use device::{Device, DeviceResult};
pub use gpu::CudaDevice;
pub use host::HostDevice;
pub use mlp::DeviceMlp;
pub use nccl::NcclComm;

/// Environment variable that lets several ranks share one GPU (tests only: NCCL refuses
/// two ranks on one device, so only single-rank communicators work then).
pub const ALLOW_SHARED_GPU_ENV: &str = "RINGREC_ALLOW_SHARED_GPU";

/// Why the GPU path cannot run.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum CudaError {
    /// ringrec was built without `--features cuda`.
    #[error("this ringrec was built without CUDA support; rebuild with `cargo build --release --features cuda`, or use --device cpu")]
    NotBuilt,
    /// A CUDA library could not be loaded.
    #[error("{0} not found (is the NVIDIA driver / CUDA toolkit installed and on the library path?); use --device cpu")]
    MissingLibrary(&'static str),
    /// The driver loaded but reports no usable device.
    #[error("no CUDA device available ({0}); use --device cpu")]
    NoDevice(String),
    /// More ranks on a host than visible GPUs.
    #[error(
        "{local_size} ranks on this host but {devices} visible GPU(s): NCCL cannot run two ranks on one GPU; start at most {devices} rank(s) per host (e.g. mpirun --map-by ppr:{devices}:node), make more GPUs visible (CUDA_VISIBLE_DEVICES), or use --device cpu"
    )]
    SharedGpu {
        /// Ranks on this host.
        local_size: usize,
        /// Visible GPUs.
        devices: usize,
    },
    /// A kernel source failed to compile; NVRTC's log follows.
    #[error("NVRTC could not compile kernels/{name}.cu:\n{log}")]
    Kernel {
        /// The source's name.
        name: String,
        /// NVRTC's compile log.
        log: String,
    },
    /// An NCCL collective failed: ranks disagree, a peer died or timed out.
    #[error("{0}")]
    Collective(String),
    /// A CUDA driver, cuBLAS or NCCL call failed.
    #[error("{what} failed: {detail}")]
    Call {
        /// What was being done.
        what: String,
        /// The library's error.
        detail: String,
    },
}

impl CudaError {
    /// A failed CUDA call, from any of cudarc's error types.
    pub fn call(what: impl Into<String>, e: impl std::fmt::Debug) -> CudaError {
        CudaError::Call { what: what.into(), detail: format!("{e:?}") }
    }
}

/// What the GPU probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaInfo {
    /// Visible CUDA devices (CUDA_VISIBLE_DEVICES applied by the driver).
    pub devices: usize,
}

/// `--device`: where the dense model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum DeviceChoice {
    /// The CPU path.
    Cpu,
    /// The GPU path; an error when it cannot run.
    Cuda,
    /// The GPU path when a driver and a GPU are present, else the CPU.
    Auto,
    /// The GPU path's code on the CPU: the kernels compiled as host C++, gradients over
    /// the CPU collectives (tests of the GPU code on machines without one; slow).
    #[value(hide = true)]
    Host,
}

/// The GPU ordinal of a rank: `local_rank % devices`. Refuses more ranks per host than
/// devices (NCCL forbids two ranks on one GPU) unless `allow_shared`.
pub fn select_ordinal(local_rank: usize, local_size: usize, devices: usize, allow_shared: bool) -> Result<usize, CudaError> {
    if devices == 0 {
        return Err(CudaError::NoDevice("the driver reports 0 devices".into()));
    }
    if local_size > devices && !allow_shared {
        return Err(CudaError::SharedGpu { local_size, devices });
    }
    Ok(local_rank % devices)
}

/// True when [`ALLOW_SHARED_GPU_ENV`] is set to 1.
pub fn shared_gpu_allowed() -> bool {
    std::env::var(ALLOW_SHARED_GPU_ENV).is_ok_and(|v| v.trim() == "1")
}

/// Checks the driver, NVRTC and cuBLAS libraries (what one GPU needs) and counts devices.
#[cfg(feature = "cuda")]
pub fn probe_device() -> Result<CudaInfo, CudaError> {
    // SAFETY: is_culib_present only tries to dlopen candidate library names.
    let present = unsafe {
        [
            ("libcuda (the NVIDIA driver)", cudarc::driver::sys::is_culib_present()),
            ("libnvrtc (CUDA runtime compiler)", cudarc::nvrtc::sys::is_culib_present()),
            ("libcublas", cudarc::cublas::sys::is_culib_present()),
        ]
    };
    if let Some((name, _)) = present.iter().find(|(_, ok)| !ok) {
        return Err(CudaError::MissingLibrary(name));
    }
    cudarc::driver::result::init().map_err(|e| CudaError::NoDevice(format!("{e:?}")))?;
    let n = cudarc::driver::result::device::get_count().map_err(|e| CudaError::NoDevice(format!("{e:?}")))?;
    if n <= 0 {
        return Err(CudaError::NoDevice("the driver reports 0 devices".into()));
    }
    Ok(CudaInfo { devices: n as usize })
}

/// Checks that libnccl can be loaded (needed with more than one rank).
#[cfg(feature = "cuda")]
pub fn probe_nccl() -> Result<(), CudaError> {
    // SAFETY: is_culib_present only tries to dlopen candidate library names.
    if unsafe { cudarc::nccl::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(CudaError::MissingLibrary("libnccl (NCCL)"))
    }
}

/// Without the `cuda` feature there is no GPU path.
#[cfg(not(feature = "cuda"))]
pub fn probe_device() -> Result<CudaInfo, CudaError> {
    Err(CudaError::NotBuilt)
}

/// Without the `cuda` feature there is no NCCL.
#[cfg(not(feature = "cuda"))]
pub fn probe_nccl() -> Result<(), CudaError> {
    Err(CudaError::NotBuilt)
}

/// Everything the multi-GPU path needs: [`probe_device`] and [`probe_nccl`].
pub fn probe() -> Result<CudaInfo, CudaError> {
    let info = probe_device()?;
    probe_nccl()?;
    Ok(info)
}

/// Resolves `--device` for a rank: `Ok(Some(ordinal))` for the GPU path, `Ok(None)` for the
/// CPU. `auto` falls back to the CPU only when the build, driver or device is absent;
/// `cuda` reports every missing piece. NCCL is required with more than one rank.
pub fn resolve(choice: DeviceChoice, local_rank: usize, local_size: usize, world: usize) -> Result<Option<usize>, CudaError> {
    if matches!(choice, DeviceChoice::Cpu | DeviceChoice::Host) {
        return Ok(None);
    }
    let info = match probe_device() {
        Ok(info) => info,
        Err(CudaError::NotBuilt | CudaError::NoDevice(_) | CudaError::MissingLibrary("libcuda (the NVIDIA driver)")) if choice == DeviceChoice::Auto => return Ok(None),
        Err(e) => return Err(e),
    };
    if world > 1 {
        probe_nccl()?;
    }
    select_ordinal(local_rank, local_size, info.devices, shared_gpu_allowed()).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_never_panics_and_explains_itself() {
        match probe() {
            Ok(info) => assert!(info.devices > 0),
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains("--device cpu"), "{msg}");
            }
        }
    }

    #[test]
    fn ordinal_is_local_rank_modulo_devices_and_sharing_is_refused() {
        assert_eq!(select_ordinal(0, 4, 4, false), Ok(0));
        assert_eq!(select_ordinal(3, 4, 8, false), Ok(3));
        assert_eq!(select_ordinal(5, 8, 8, false), Ok(5));
        let e = select_ordinal(2, 3, 2, false).unwrap_err();
        assert_eq!(e, CudaError::SharedGpu { local_size: 3, devices: 2 });
        let msg = e.to_string();
        assert!(msg.contains("3 ranks") && msg.contains("2 visible GPU") && msg.contains("--device cpu"), "{msg}");
        assert_eq!(select_ordinal(2, 3, 2, true), Ok(0), "allowed for tests: wraps around");
        assert!(matches!(select_ordinal(0, 1, 0, true), Err(CudaError::NoDevice(_))));
    }

    #[test]
    fn cpu_choice_never_probes_and_auto_falls_back_without_a_gpu() {
        assert_eq!(resolve(DeviceChoice::Cpu, 0, 1, 1), Ok(None));
        match probe_device() {
            // No GPU here (CI): auto picks the CPU, cuda explains what is missing.
            Err(_) => {
                assert_eq!(resolve(DeviceChoice::Auto, 0, 1, 1), Ok(None));
                let e = resolve(DeviceChoice::Cuda, 0, 1, 1).unwrap_err();
                assert!(e.to_string().contains("--device cpu"), "{e}");
            }
            Ok(info) => assert_eq!(resolve(DeviceChoice::Cuda, 0, 1, 1), Ok(Some(0)), "{info:?}"),
        }
    }
}
