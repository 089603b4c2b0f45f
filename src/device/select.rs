//! Where the dense model runs: [`Placement`] (what `--device` asks for, and the GPU a rank
//! gets), and the probes of the CUDA libraries.
//!
//! cudarc loads libcuda, libnvrtc, libcublas and libnccl at run time (dynamic loading), so
//! the binary builds and starts on machines without CUDA. cudarc panics when asked to load
//! a library that is not there, so [`probe`] checks each library's presence *before*
//! cudarc touches it and turns absence into a [`DeviceError`] naming what is missing and
//! suggesting `--device cpu`. Without the feature every probe reports that the build has
//! no CUDA support.

use super::DeviceError;

/// What the GPU probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Visible CUDA devices (CUDA_VISIBLE_DEVICES applied by the driver).
    pub devices: usize,
}

/// Where the dense model runs: what `--device` asks for (`auto`, `cpu`, `cuda`, `host`),
/// and, once [`Placement::resolve`]d for a rank, where it runs (`Cpu`, `Cuda(Some(gpu))`
/// or `HostKernels`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// The GPU when the build, a driver and a GPU are present, else the CPU.
    Auto,
    /// The CPU device.
    Cpu,
    /// A GPU: any (asked for), or this ordinal (resolved).
    Cuda(Option<usize>),
    /// The GPU path's code on the CPU: the kernels compiled as host C++, gradients over the
    /// CPU collectives (tests of the GPU code on machines without one; slow).
    HostKernels,
}

impl Placement {
    /// The names `--device` takes, in [`Placement::parse`]'s order.
    pub const NAMES: [&'static str; 4] = ["auto", "cpu", "cuda", "host"];

    /// Parses a `--device` value.
    pub fn parse(s: &str) -> Option<Placement> {
        match s.trim() {
            "auto" => Some(Placement::Auto),
            "cpu" => Some(Placement::Cpu),
            "cuda" | "gpu" => Some(Placement::Cuda(None)),
            "host" | "host-kernels" => Some(Placement::HostKernels),
            _ => None,
        }
    }

    /// Resolves the request for a rank (`local_rank` of `local_size` ranks on its machine,
    /// `world` ranks in all): the GPU is `local_rank % visible GPUs`. `Auto` falls back to
    /// the CPU only when the build, driver or device is absent; `Cuda` reports every missing
    /// piece. NCCL is required with more than one rank. `allow_shared`: see
    /// [`select_ordinal`].
    pub fn resolve(self, local_rank: usize, local_size: usize, world: usize, allow_shared: bool) -> Result<Placement, DeviceError> {
        if matches!(self, Placement::Cpu | Placement::HostKernels | Placement::Cuda(Some(_))) {
            return Ok(self);
        }
        let info = match probe_device() {
            Ok(info) => info,
            Err(DeviceError::NotBuilt | DeviceError::NoDevice(_) | DeviceError::MissingLibrary("libcuda (the NVIDIA driver)")) if self == Placement::Auto => return Ok(Placement::Cpu),
            Err(e) => return Err(e),
        };
        if world > 1 {
            probe_nccl()?;
        }
        select_ordinal(local_rank, local_size, info.devices, allow_shared).map(|o| Placement::Cuda(Some(o)))
    }
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Placement::Auto => f.write_str("auto"),
            Placement::Cpu => f.write_str("cpu"),
            Placement::Cuda(None) => f.write_str("cuda"),
            Placement::Cuda(Some(o)) => write!(f, "cuda:{o}"),
            Placement::HostKernels => f.write_str("host"),
        }
    }
}

/// The GPU ordinal of a rank: `local_rank % devices`. Refuses more ranks per host than
/// devices (NCCL forbids two ranks on one GPU) unless `allow_shared`.
pub fn select_ordinal(local_rank: usize, local_size: usize, devices: usize, allow_shared: bool) -> Result<usize, DeviceError> {
    if devices == 0 {
        return Err(DeviceError::NoDevice("the driver reports 0 devices".into()));
    }
    if local_size > devices && !allow_shared {
        return Err(DeviceError::SharedGpu { local_size, devices });
    }
    Ok(local_rank % devices)
}

/// Checks the driver, NVRTC and cuBLAS libraries (what one GPU needs) and counts devices.
#[cfg(feature = "cuda")]
pub fn probe_device() -> Result<DeviceInfo, DeviceError> {
    // SAFETY: is_culib_present only tries to dlopen candidate library names.
    let present = unsafe {
        [
            ("libcuda (the NVIDIA driver)", cudarc::driver::sys::is_culib_present()),
            ("libnvrtc (CUDA runtime compiler)", cudarc::nvrtc::sys::is_culib_present()),
            ("libcublas", cudarc::cublas::sys::is_culib_present()),
        ]
    };
    if let Some((name, _)) = present.iter().find(|(_, ok)| !ok) {
        return Err(DeviceError::MissingLibrary(name));
    }
    cudarc::driver::result::init().map_err(|e| DeviceError::NoDevice(format!("{e:?}")))?;
    let n = cudarc::driver::result::device::get_count().map_err(|e| DeviceError::NoDevice(format!("{e:?}")))?;
    if n <= 0 {
        return Err(DeviceError::NoDevice("the driver reports 0 devices".into()));
    }
    Ok(DeviceInfo { devices: n as usize })
}

/// Checks that libnccl can be loaded (needed with more than one rank).
#[cfg(feature = "cuda")]
pub fn probe_nccl() -> Result<(), DeviceError> {
    // SAFETY: is_culib_present only tries to dlopen candidate library names.
    if unsafe { cudarc::nccl::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(DeviceError::MissingLibrary("libnccl (NCCL)"))
    }
}

/// Without the `cuda` feature there is no GPU path.
#[cfg(not(feature = "cuda"))]
pub fn probe_device() -> Result<DeviceInfo, DeviceError> {
    Err(DeviceError::NotBuilt)
}

/// Without the `cuda` feature there is no NCCL.
#[cfg(not(feature = "cuda"))]
pub fn probe_nccl() -> Result<(), DeviceError> {
    Err(DeviceError::NotBuilt)
}

/// Everything the multi-GPU path needs: [`probe_device`] and [`probe_nccl`].
pub fn probe() -> Result<DeviceInfo, DeviceError> {
    let info = probe_device()?;
    probe_nccl()?;
    Ok(info)
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
        assert_eq!(e, DeviceError::SharedGpu { local_size: 3, devices: 2 });
        let msg = e.to_string();
        assert!(msg.contains("3 ranks") && msg.contains("2 visible GPU") && msg.contains("--device cpu"), "{msg}");
        assert_eq!(select_ordinal(2, 3, 2, true), Ok(0), "allowed for tests: wraps around");
        assert!(matches!(select_ordinal(0, 1, 0, true), Err(DeviceError::NoDevice(_))));
    }

    #[test]
    fn cpu_choice_never_probes_and_auto_falls_back_without_a_gpu() {
        assert_eq!(Placement::Cpu.resolve(0, 1, 1, false), Ok(Placement::Cpu));
        match probe_device() {
            // No GPU here (CI): auto picks the CPU, cuda explains what is missing.
            Err(_) => {
                assert_eq!(Placement::Auto.resolve(0, 1, 1, false), Ok(Placement::Cpu));
                let e = Placement::Cuda(None).resolve(0, 1, 1, false).unwrap_err();
                assert!(e.to_string().contains("--device cpu"), "{e}");
            }
            Ok(info) => assert_eq!(Placement::Cuda(None).resolve(0, 1, 1, false), Ok(Placement::Cuda(Some(0))), "{info:?}"),
        }
        for name in Placement::NAMES {
            assert_eq!(Placement::parse(name).map(|p| p.to_string()).as_deref(), Some(name));
        }
        assert_eq!(Placement::parse("tpu"), None);
    }
}
