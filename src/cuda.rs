//! GPU availability. With feature `cuda`, cudarc loads libcuda/libnvrtc/libnccl/libcublas
//! at run time (dynamic loading), so the binary builds and starts on machines without CUDA;
//! this module checks each library is present *before* cudarc touches it (cudarc panics
//! on a missing library) and turns absence into [`CudaError`] naming what is missing.
//! Without the feature every probe reports that the build has no CUDA support.

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
}

/// What the GPU probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaInfo {
    /// Visible CUDA devices.
    pub devices: usize,
}

/// Checks driver, NVRTC, cuBLAS and NCCL libraries and counts devices.
#[cfg(feature = "cuda")]
pub fn probe() -> Result<CudaInfo, CudaError> {
    // SAFETY: is_culib_present only tries to dlopen candidate library names.
    let present = unsafe {
        [
            ("libcuda (the NVIDIA driver)", cudarc::driver::sys::is_culib_present()),
            ("libnvrtc (CUDA runtime compiler)", cudarc::nvrtc::sys::is_culib_present()),
            ("libcublas", cudarc::cublas::sys::is_culib_present()),
            ("libnccl", cudarc::nccl::sys::is_culib_present()),
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

/// Without the `cuda` feature there is no GPU path.
#[cfg(not(feature = "cuda"))]
pub fn probe() -> Result<CudaInfo, CudaError> {
    Err(CudaError::NotBuilt)
}

#[cfg(test)]
mod tests {
    #[test]
    fn probe_never_panics_and_explains_itself() {
        match super::probe() {
            Ok(info) => assert!(info.devices > 0),
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains("--device cpu"), "{msg}");
            }
        }
    }
}
