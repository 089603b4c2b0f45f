//! Where the dense model runs: [`Placement`] (what `--device` asks for, and the GPU a rank
//! gets), and the probes of the CUDA libraries.
//!
//! cudarc loads libcuda, libnvrtc, libcublas and libnccl at run time (dynamic loading), so
//! the binary builds and starts on machines without CUDA. cudarc panics when asked to load
//! a library that is not there, and looks only under its own fixed names, so the probes
//! here are the one place the rest of the code asks whether a library is usable: they find
//! each library where users install it and make cudarc load exactly that one
//! ([`super::libs`]) *before* cudarc touches it, and turn absence into a [`DeviceError`]
//! saying where it was looked for, what was found and what to install, and suggesting
//! `--device cpu`. Without the feature every probe reports that the build has no CUDA
//! support.

use super::{CudaLib, DeviceError};

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
    /// The GPU path's code on the CPU: the kernels compiled as host C++ and queued like a
    /// GPU's work, gradients over the CPU collectives (tests of the GPU code on machines
    /// without one; slow).
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

    /// Resolves the request for a rank (`local_rank` among the ranks of its machine, `world`
    /// ranks in all): the GPU is `local_rank % visible GPUs` ([`select_ordinal`]). `Auto`
    /// falls back to the CPU only when the build, driver or device is absent; `Cuda`
    /// reports every missing piece. NCCL is required with more than one rank. Whether
    /// ranks would really share a GPU is only known from the GPUs' PCI bus ids, once every
    /// rank has its device ([`check_distinct`]).
    pub fn resolve(self, local_rank: usize, world: usize) -> Result<Placement, DeviceError> {
        if matches!(self, Placement::Cpu | Placement::HostKernels | Placement::Cuda(Some(_))) {
            return Ok(self);
        }
        let info = match probe_device() {
            Ok(info) => info,
            Err(DeviceError::NotBuilt | DeviceError::NoDevice(_) | DeviceError::MissingLibrary { lib: CudaLib::Driver, .. }) if self == Placement::Auto => return Ok(Placement::Cpu),
            Err(e) => return Err(e),
        };
        if world > 1 {
            probe_nccl()?;
        }
        select_ordinal(local_rank, info.devices).map(|o| Placement::Cuda(Some(o)))
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

crate::settings::word_enum!(Placement, "device", "auto, cpu, cuda, host");

/// The GPU ordinal of a rank: `local_rank % devices`, where `local_rank` counts the ranks
/// of its machine. Every launcher's layout works: with all GPUs visible to all ranks, rank
/// `l` takes GPU `l`; with one visible GPU per rank (`CUDA_VISIBLE_DEVICES` set per rank by
/// Slurm's `--gpus-per-task=1`, Kubernetes, MPI wrappers) every rank takes its own GPU 0.
pub fn select_ordinal(local_rank: usize, devices: usize) -> Result<usize, DeviceError> {
    if devices == 0 {
        return Err(DeviceError::NoDevice("the driver reports 0 devices".into()));
    }
    Ok(local_rank % devices)
}

/// Bytes of a rank's record in [`check_distinct`]: its host name and its GPU's PCI bus id.
const PICK_BYTES: usize = 128;

/// GPUs picked by more than one rank of a machine, from every world rank's pick
/// (`picks[r]` = (host name, PCI bus id) of rank r): (host, bus id, ranks), in rank order.
pub fn shared_gpus(picks: &[(String, String)]) -> Vec<(String, String, Vec<usize>)> {
    let mut by_gpu: std::collections::BTreeMap<(&str, &str), Vec<usize>> = std::collections::BTreeMap::new();
    for (r, (host, bus)) in picks.iter().enumerate() {
        by_gpu.entry((host.as_str(), bus.as_str())).or_default().push(r);
    }
    let mut shared: Vec<(String, String, Vec<usize>)> = by_gpu.into_iter().filter(|(_, ranks)| ranks.len() > 1).map(|((h, b), ranks)| (h.to_string(), b.to_string(), ranks)).collect();
    shared.sort_by_key(|s| s.2[0]);
    shared
}

/// Refuses, on every rank, ranks of one machine that would share a GPU (NCCL cannot run
/// two ranks of a job on one device): every rank's (host name, PCI bus id of its GPU) is
/// gathered over the world and compared. `allow_shared` (`RINGREC_ALLOW_SHARED_GPU`, for
/// tests) lets them. Collective over the world.
pub fn check_distinct(topo: &crate::topology::Topology, bus_id: &str, allow_shared: bool) -> Result<(), DeviceError> {
    use mpi::collective::CommunicatorCollectives;
    let _w = crate::watchdog::waiting("every rank reporting its GPU");
    let mut mine = [0u8; PICK_BYTES];
    let (host_part, bus_part) = mine.split_at_mut(PICK_BYTES / 2);
    for (dst, src) in [(host_part, topo.hostname.as_bytes()), (bus_part, bus_id.as_bytes())] {
        let n = src.len().min(dst.len());
        dst[..n].copy_from_slice(&src[..n]);
    }
    let mut all = vec![0u8; PICK_BYTES * topo.size];
    topo.world.comm.all_gather_into(&mine[..], &mut all[..]);
    let text = |b: &[u8]| String::from_utf8_lossy(b).trim_end_matches('\0').to_string();
    let picks: Vec<(String, String)> = all.chunks_exact(PICK_BYTES).map(|c| (text(&c[..PICK_BYTES / 2]), text(&c[PICK_BYTES / 2..]))).collect();
    match shared_gpus(&picks).into_iter().next() {
        Some((host, bus_id, ranks)) if !allow_shared => Err(DeviceError::SharedGpu { host, bus_id, ranks }),
        _ => Ok(()),
    }
}

/// Checks the driver, NVRTC and cuBLAS libraries (what one GPU needs) and counts devices.
#[cfg(feature = "cuda")]
pub fn probe_device() -> Result<DeviceInfo, DeviceError> {
    let libs = super::libs::libraries();
    let driver = libs.require(CudaLib::Driver)?;
    libs.require(CudaLib::Nvrtc)?;
    libs.require(CudaLib::Cublas)?;
    let from = || format!("driver {} at {}", driver.version.map(|v| format!("CUDA {v}")).unwrap_or_else(|| "of unknown version".into()), driver.path.display());
    cudarc::driver::result::init().map_err(|e| DeviceError::NoDevice(format!("cuInit: {e:?} ({})", from())))?;
    let n = cudarc::driver::result::device::get_count().map_err(|e| DeviceError::NoDevice(format!("{e:?} ({})", from())))?;
    if n <= 0 {
        return Err(DeviceError::NoDevice(format!("the driver reports 0 devices ({})", from())));
    }
    Ok(DeviceInfo { devices: n as usize })
}

/// Checks that libnccl can be loaded (needed with more than one rank).
#[cfg(feature = "cuda")]
pub fn probe_nccl() -> Result<(), DeviceError> {
    super::libs::libraries().require(CudaLib::Nccl).map(|_| ())
}

/// Checks that NVRTC can be loaded (compiling the kernels needs no GPU).
#[cfg(feature = "cuda")]
pub fn probe_nvrtc() -> Result<(), DeviceError> {
    super::libs::libraries().require(CudaLib::Nvrtc).map(|_| ())
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

/// Without the `cuda` feature there is no NVRTC.
#[cfg(not(feature = "cuda"))]
pub fn probe_nvrtc() -> Result<(), DeviceError> {
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
    fn ordinal_is_local_rank_modulo_devices() {
        assert_eq!(select_ordinal(0, 4), Ok(0));
        assert_eq!(select_ordinal(3, 8), Ok(3));
        assert_eq!(select_ordinal(2, 2), Ok(0), "wraps around; sharing is decided by bus ids");
        assert_eq!(select_ordinal(5, 1), Ok(0), "one visible GPU per rank: each takes its GPU 0");
        assert!(matches!(select_ordinal(0, 0), Err(DeviceError::NoDevice(_))));
    }

    #[test]
    fn only_ranks_of_one_machine_on_one_bus_id_share_a_gpu() {
        let pick = |h: &str, b: &str| (h.to_string(), b.to_string());
        // One visible GPU per rank (each sees "GPU 0", bus ids differ): no sharing.
        assert!(shared_gpus(&[pick("a", "0000:3b:00.0"), pick("a", "0000:5e:00.0"), pick("b", "0000:3b:00.0"), pick("b", "0000:5e:00.0")]).is_empty());
        // Three ranks, two GPUs on host a: ranks 0 and 2 on one of them.
        let s = shared_gpus(&[pick("a", "0000:3b:00.0"), pick("a", "0000:5e:00.0"), pick("a", "0000:3b:00.0"), pick("b", "0000:3b:00.0")]);
        assert_eq!(s, vec![("a".to_string(), "0000:3b:00.0".to_string(), vec![0, 2])]);
        let e = DeviceError::SharedGpu { host: "a".into(), bus_id: "0000:3b:00.0".into(), ranks: vec![0, 2] };
        let msg = e.to_string();
        assert!(msg.contains("ranks [0, 2]") && msg.contains("0000:3b:00.0") && msg.contains("CUDA_VISIBLE_DEVICES") && msg.contains("--device cpu"), "{msg}");
    }

    #[test]
    fn cpu_choice_never_probes_and_auto_falls_back_without_a_gpu() {
        assert_eq!(Placement::Cpu.resolve(0, 1), Ok(Placement::Cpu));
        match probe_device() {
            // No GPU here (CI): auto picks the CPU, cuda explains what is missing.
            Err(_) => {
                assert_eq!(Placement::Auto.resolve(0, 1), Ok(Placement::Cpu));
                let e = Placement::Cuda(None).resolve(0, 1).unwrap_err();
                assert!(e.to_string().contains("--device cpu"), "{e}");
            }
            Ok(info) => assert_eq!(Placement::Cuda(None).resolve(0, 1), Ok(Placement::Cuda(Some(0))), "{info:?}"),
        }
        for name in Placement::NAMES {
            assert_eq!(Placement::parse(name).map(|p| p.to_string()).as_deref(), Some(name));
        }
        assert_eq!(Placement::parse("tpu"), None);
    }
}
