//! The CUDA libraries as users install them, found and used without a GPU or a driver:
//! NVIDIA's wheels from PyPI (NVRTC, cuBLAS, NCCL), which scripts/cuda-wheels.sh installs
//! into target/cuda-wheels (CI runs it). NCCL's file there is `libnccl.so.2`, a name cudarc
//! does not try: these tests fail without the discovery and aliasing of
//! `ringrec::device::libs`.
//!
//! Each test prints `skipped: <reason>` and passes when the build has no `cuda` feature or
//! the wheels are absent, so a plain `cargo test` passes anywhere.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The venv of the wheels and the versions installed, or the printed reason why not.
fn wheels() -> Option<(PathBuf, Vec<(String, String)>)> {
    if !cfg!(feature = "cuda") {
        eprintln!("skipped: built without --features cuda");
        return None;
    }
    let dir = std::env::var_os("RINGREC_CUDA_WHEELS").map(PathBuf::from).unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).parent().expect("target dir").join("cuda-wheels"));
    let Ok(stamp) = std::fs::read_to_string(dir.join(".ringrec-wheels")) else {
        eprintln!("skipped: no CUDA wheels in {} (scripts/cuda-wheels.sh installs them; scripts/test.sh runs it)", dir.display());
        return None;
    };
    // "nvidia-nccl-cu12==2.30.7 ..."
    let pins = stamp.split_whitespace().filter_map(|p| p.split_once("==")).map(|(n, v)| (n.to_string(), v.to_string())).collect();
    Some((dir, pins))
}

fn pin<'a>(pins: &'a [(String, String)], package: &str) -> &'a str {
    pins.iter().find(|(n, _)| n == package).map(|(_, v)| v.as_str()).unwrap_or_else(|| panic!("{package} not pinned: {pins:?}"))
}

/// The site-packages of the venv.
fn site_packages(venv: &Path) -> PathBuf {
    let lib = venv.join("lib");
    std::fs::read_dir(&lib).expect("venv lib").flatten().map(|e| e.path().join("site-packages")).find(|p| p.is_dir()).expect("site-packages")
}

/// `ringrec info <args>` with only `env` pointing at CUDA libraries.
fn info(args: &[&str], env: &[(&str, &Path)]) -> (bool, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ringrec"));
    cmd.arg("info").args(args);
    for k in ["RINGREC_CUDA_LIB_DIR", "VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH", "CUDA_HOME", "CUDA_PATH"] {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run ringrec");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    // Shown with --nocapture, and by cargo when the test fails.
    println!("$ ringrec info {}\n{text}", args.join(" "));
    (out.status.success(), text)
}

/// The line of `ringrec info` about `lib`.
fn line<'a>(text: &'a str, lib: &str) -> &'a str {
    text.lines().find(|l| l.trim_start().starts_with(lib)).unwrap_or_else(|| panic!("no line for {lib}:\n{text}"))
}

#[test]
fn ringrec_info_finds_the_wheels_of_a_venv_and_compiles_every_kernel_to_sass() {
    let Some((venv, pins)) = wheels() else { return };
    let site = site_packages(&venv);
    let (ok, text) = info(&["--compile-kernels", "sm_80,sm_90"], &[("VIRTUAL_ENV", &venv)]);
    assert!(ok, "{text}");
    let nvrtc_version = pin(&pins, "nvidia-cuda-nvrtc-cu12").split('.').take(2).collect::<Vec<_>>().join(".");
    let cublas_version = pin(&pins, "nvidia-cublas-cu12").split('.').take(3).collect::<Vec<_>>().join(".");
    let wheel = format!("(from a Python wheel in {})", site.display());
    for (lib, version, file) in [
        ("libnvrtc", nvrtc_version.as_str(), "nvidia/cuda_nvrtc/lib/libnvrtc.so.12"),
        ("libcublas", cublas_version.as_str(), "nvidia/cublas/lib/libcublas.so.12"),
        ("libnccl", pin(&pins, "nvidia-nccl-cu12"), "nvidia/nccl/lib/libnccl.so.2"),
    ] {
        let l = line(&text, lib);
        assert!(l.contains(&format!(": {version} at {}", site.join(file).display())) && l.ends_with(&wheel), "{lib} {version}: {l}");
        assert!(text.contains(&format!("cudarc loads it as {lib}.so")), "{text}");
    }
    assert!(text.contains("libcublasLt.so.12") && text.contains("libnvrtc-builtins.so."), "companions: {text}");
    // No driver here: said so, with where it was looked for.
    if !line(&text, "libcuda").contains(" at ") {
        assert!(text.contains("cuda: unavailable: libcuda (the NVIDIA driver) is not available: looked for libcuda.so.1"), "{text}");
    }
    // Every kernel compiled to SASS for both architectures, with its size in the CUBIN.
    for arch in ["sm_80", "sm_90"] {
        let modules = ringrec::device::kernels::SOURCES.len();
        assert!(text.contains(&format!("  {arch}: SASS for {arch}, {modules} modules")), "{arch}: {text}");
    }
    let sizes: Vec<u64> = text.lines().filter(|l| l.ends_with("bytes of SASS")).map(|l| l.split_whitespace().nth(1).unwrap().parse().unwrap()).collect();
    assert_eq!(sizes.len(), 2 * ringrec::device::kernels::Kernel::ALL.len(), "{text}");
    assert!(sizes.iter().all(|s| *s > 0), "{sizes:?}");
}

#[test]
fn the_override_directory_finds_them_without_any_python_environment() {
    let Some((venv, _)) = wheels() else { return };
    let site = site_packages(&venv);
    let dirs = ["nvidia/nccl/lib", "nvidia/cuda_nvrtc/lib", "nvidia/cublas/lib"].map(|d| site.join(d));
    let joined = std::env::join_paths(&dirs).unwrap();
    let (ok, text) = info(&["--libs", "--require", "nvrtc,cublas,nccl"], &[("RINGREC_CUDA_LIB_DIR", Path::new(&joined))]);
    assert!(ok, "{text}");
    for lib in ["libnvrtc", "libcublas", "libnccl"] {
        assert!(line(&text, lib).ends_with("(from RINGREC_CUDA_LIB_DIR)"), "{lib}: {text}");
    }
    // A directory without the library is passed by; NCCL without any says where it looked.
    let (ok, text) = info(&["--libs", "--require", "nccl"], &[("RINGREC_CUDA_LIB_DIR", &dirs[1])]);
    assert!(!ok && text.contains("--require: libnccl (NCCL) is not available"), "{text}");
    assert!(line(&text, "libnvrtc").ends_with("(from RINGREC_CUDA_LIB_DIR)"), "{text}");
    let nccl = line(&text, "libnccl");
    assert!(nccl.contains("not found: looked for libnccl.so.2") && nccl.contains(&format!("RINGREC_CUDA_LIB_DIR ({})", dirs[1].display())) && nccl.contains("pip install nvidia-nccl-cu12"), "{nccl}");
}

#[cfg(feature = "cuda")]
#[test]
fn cudarc_itself_loads_the_wheels_and_nvrtc_compiles_without_a_gpu() {
    use ringrec::device::kernels::{compile_for, compile_source, Arch, Target};
    use ringrec::device::libs::{self, CudaLib, Search};
    let Some((venv, pins)) = wheels() else { return };
    // This process's libraries: the venv's wheels only (nothing else runs discovery in
    // this test binary before).
    assert!(libs::configure(Search::python_prefix_only(&venv)), "discovery ran before configure");
    let found = libs::libraries();
    println!("{}", found.report());
    for lib in [CudaLib::Nvrtc, CudaLib::Cublas, CudaLib::Nccl] {
        found.require(lib).unwrap_or_else(|e| panic!("{e}"));
    }
    ringrec::device::probe_nccl().unwrap();
    ringrec::device::probe_nvrtc().unwrap();
    // cudarc's own loader (its fixed names) reaches the same libraries through the aliases.
    let nccl = cudarc::nccl::result::get_nccl_version().expect("ncclGetVersion through cudarc");
    assert_eq!(found.get(CudaLib::Nccl).found.as_ref().unwrap().version, Some(libs::Version::from_nccl(nccl)));
    assert_eq!(libs::Version::from_nccl(nccl).to_string(), pin(&pins, "nvidia-nccl-cu12"));
    let mut major = 0;
    // SAFETY: cublasGetProperty writes one int; it needs no handle or GPU.
    unsafe { cudarc::cublas::sys::cublasGetProperty(cudarc::cublas::sys::libraryPropertyType::MAJOR_VERSION, &mut major) }.result().expect("cublasGetProperty through cudarc");
    assert_eq!(major, 12);
    // The GPU path's compilation, for two architectures, with NVRTC's log on failure.
    for arch in [Arch(80), Arch(90)] {
        let modules = compile_for(arch).unwrap();
        assert_eq!(modules.len(), ringrec::device::kernels::SOURCES.len());
        for m in &modules {
            assert_eq!(m.target, Target::Sass(arch));
            assert_eq!(&m.image[..4], b"\x7fELF", "a CUBIN");
            for (k, size) in m.kernels() {
                assert!(size.is_some_and(|s| s > 0), "{arch} {}: {size:?}", k.name());
            }
        }
    }
    let e = compile_source("broken", "extern \"C\" __global__ void f(float* x) { x[0] = undefined_name; }", Target::Sass(Arch(80))).unwrap_err();
    assert!(e.to_string().contains("NVRTC could not compile kernels/broken.cu") && e.to_string().contains("undefined_name"), "{e}");
    // A GPU newer than this NVRTC gets PTX for the newest architecture it knows.
    let newest = *found.nvrtc_archs().last().unwrap();
    let ptx = compile_for(Arch(newest + 1)).unwrap();
    assert_eq!(ptx[0].target, Target::Ptx(Arch(newest)));
    assert!(String::from_utf8_lossy(&ptx[0].image).contains(&format!(".target sm_{newest}")), "PTX for compute_{newest}");
    // Without a driver, the device probe says what is missing (and nothing panicked).
    if found.require(CudaLib::Driver).is_err() {
        let e = ringrec::device::probe_device().unwrap_err();
        assert!(matches!(e, ringrec::device::DeviceError::MissingLibrary { lib: CudaLib::Driver, .. }), "{e}");
    }
}
