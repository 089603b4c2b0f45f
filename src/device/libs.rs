//! Where the CUDA libraries are, and how cudarc is made to load exactly those.
//!
//! cudarc (dynamic loading) opens each library by a fixed list of bare names — for NCCL
//! `libnccl.so`, `libnccl.so.12`, `.11`, `.10`, `.9`, `.1` — none of which is NCCL's soname
//! (`libnccl.so.2`, all that `libnccl2` and the `nvidia-nccl-cu12` wheel install), nor CUDA
//! 13's (`libnvrtc.so.13`, `libcublas.so.13`); and it never looks where pip puts them.
//! glibc reads `LD_LIBRARY_PATH` once, at start, so setting it later does not help.
//!
//! **Discovery** ([`libraries`]; each library once per process, when first asked for). For
//! each library, in this order, the first file that exists and loads wins:
//! 1. the directories of `RINGREC_CUDA_LIB_DIR` (colon-separated), any name below;
//! 2. for each real soname in turn (`libcuda.so.1`; `libnvrtc.so.12`, `libnvrtc.so.13`;
//!    `libcublas.so.12`, `.13`; `libnccl.so.2` — a CUDA major the driver supports first):
//!    the dynamic linker's own search (`LD_LIBRARY_PATH`, `/etc/ld.so.cache`, `/lib`,
//!    `/usr/lib`), Python wheels (`<site-packages>/nvidia/<package>/lib`,
//!    `nvidia/cu13/lib`, for the site-packages of `$VIRTUAL_ENV`, `$CONDA_PREFIX`,
//!    `$PYTHONPATH`, `~/.local` and the system Pythons), `$CONDA_PREFIX/lib`, the CUDA
//!    toolkit (`$CUDA_HOME`, `$CUDA_PATH`, `/usr/local/cuda`, `/opt/cuda`; `/usr/lib/wsl/lib`
//!    for the driver);
//! 3. cudarc's own names, in the same places.
//!
//! The CUDA toolkit's link-time stubs (`.../stubs/libcuda.so`) are passed over. A cuBLAS
//! found in a directory brings its `libcublasLt` from there, an NVRTC its builtins.
//!
//! **Aliasing.** The library found is loaded by its full path, then aliased under the
//! first name cudarc tries (`libnccl.so`): a shared object of a few hundred bytes, written
//! here into a memfd, whose `DT_SONAME` is that name and whose only `DT_NEEDED` is the
//! library's full path. glibc's `dlopen` answers a bare name with an already loaded object
//! of that soname before it searches any directory, so cudarc's `dlopen("libnccl.so")`
//! returns the alias, and `dlsym` through it finds the library's symbols (its only
//! dependency). Each alias is checked: the name must resolve to the same function as the
//! library. No re-exec and no environment change: programs that use ringrec as a library,
//! and test binaries, get the same libraries as the `ringrec` binary, and child processes
//! inherit nothing. (glibc only; elsewhere cudarc's own search applies.)
//!
//! Versions are read without a GPU where the library allows it (`nvrtcVersion`,
//! `cublasGetProperty`, `ncclGetVersion`; `cuDriverGetVersion` needs the driver).
//! [`Libraries::report`] says for every library where it was found, or where it was looked
//! for and what to install; the probes ([`super::select`]) turn the same into
//! [`DeviceError::MissingLibrary`].
//!
//! This module does not need the `cuda` feature: without it `ringrec info` still lists what
//! it finds (and says the build cannot use it).

use std::ffi::{c_int, c_void, CStr, CString};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::DeviceError;

/// The environment variable naming directories searched before any other (colon-separated).
pub const LIB_DIR_VAR: &str = "RINGREC_CUDA_LIB_DIR";

/// A CUDA library the GPU path loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CudaLib {
    /// `libcuda`, the NVIDIA driver's user-space library.
    Driver,
    /// `libnvrtc`, the runtime compiler of kernels/*.cu.
    Nvrtc,
    /// `libcublas` (and its `libcublasLt`): the GEMMs.
    Cublas,
    /// `libnccl`: the collectives between GPUs (more than one rank).
    Nccl,
}

impl CudaLib {
    /// Every library, in discovery order (the driver first: its version orders the others).
    pub const ALL: [CudaLib; 4] = [CudaLib::Driver, CudaLib::Nvrtc, CudaLib::Cublas, CudaLib::Nccl];

    /// The library, in words.
    pub fn name(self) -> &'static str {
        match self {
            CudaLib::Driver => "libcuda (the NVIDIA driver)",
            CudaLib::Nvrtc => "libnvrtc (the CUDA runtime compiler)",
            CudaLib::Cublas => "libcublas",
            CudaLib::Nccl => "libnccl (NCCL)",
        }
    }

    /// The name cudarc's loader is given: it tries `lib<stem>.so` first.
    pub fn stem(self) -> &'static str {
        match self {
            CudaLib::Driver => "cuda",
            CudaLib::Nvrtc => "nvrtc",
            CudaLib::Cublas => "cublas",
            CudaLib::Nccl => "nccl",
        }
    }

    /// The first name cudarc tries (`libnccl.so`): the found library is aliased under it.
    pub fn alias_name(self) -> String {
        format!("lib{}.so", self.stem())
    }

    /// The sonames releases install (CUDA 12 before 13; [`ordered_sonames`] puts the
    /// driver's major first).
    pub fn sonames(self) -> &'static [&'static str] {
        match self {
            CudaLib::Driver => &["libcuda.so.1"],
            CudaLib::Nvrtc => &["libnvrtc.so.12", "libnvrtc.so.13"],
            CudaLib::Cublas => &["libcublas.so.12", "libcublas.so.13"],
            CudaLib::Nccl => &["libnccl.so.2"],
        }
    }

    /// The names cudarc's own loader tries on Linux (`cudarc::get_lib_name_candidates`
    /// without the Windows-style ones).
    pub fn cudarc_names(self) -> Vec<String> {
        ["", ".12", ".11", ".10", ".9", ".1"].iter().map(|v| format!("lib{}.so{v}", self.stem())).collect()
    }

    /// Where pip puts it, relative to site-packages (CUDA 12 wheels, then CUDA 13's).
    fn wheel_dirs(self) -> &'static [&'static str] {
        match self {
            CudaLib::Driver => &[],
            CudaLib::Nvrtc => &["nvidia/cuda_nvrtc/lib", "nvidia/cu13/lib"],
            CudaLib::Cublas => &["nvidia/cublas/lib", "nvidia/cu13/lib"],
            CudaLib::Nccl => &["nvidia/nccl/lib"],
        }
    }

    /// A function every version exports (to check an alias and to locate a library).
    fn marker_symbol(self) -> &'static str {
        match self {
            CudaLib::Driver => "cuDriverGetVersion",
            CudaLib::Nvrtc => "nvrtcVersion",
            CudaLib::Cublas => "cublasGetProperty",
            CudaLib::Nccl => "ncclGetVersion",
        }
    }

    /// What to install.
    pub fn install_hint(self) -> &'static str {
        match self {
            CudaLib::Driver => "install the NVIDIA driver (it provides libcuda.so.1; in a container, start it with --gpus through the NVIDIA container toolkit)",
            CudaLib::Nvrtc => "install NVRTC: `pip install nvidia-cuda-nvrtc-cu12` (CUDA 13: nvidia-cuda-nvrtc), or the CUDA package cuda-nvrtc-12-<minor>",
            CudaLib::Cublas => "install cuBLAS: `pip install nvidia-cublas-cu12` (CUDA 13: nvidia-cublas), or the CUDA package libcublas-12-<minor>",
            CudaLib::Nccl => "install NCCL: `pip install nvidia-nccl-cu12`, or the package libnccl2",
        }
    }
}

impl fmt::Display for CudaLib {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A library's version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
    /// Patch level, where the library reports one.
    pub patch: Option<u32>,
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.patch {
            Some(p) => write!(f, "{}.{}.{p}", self.major, self.minor),
            None => write!(f, "{}.{}", self.major, self.minor),
        }
    }
}

impl Version {
    /// A CUDA version as the driver reports it (`12080` = 12.8).
    pub fn from_cuda(v: i32) -> Version {
        let v = v.max(0) as u32;
        Version { major: v / 1000, minor: (v % 1000) / 10, patch: None }
    }
    /// An NCCL version code (`22605` = 2.26.5; before 2.9: `2708` = 2.7.8).
    pub fn from_nccl(code: i32) -> Version {
        let c = code.max(0) as u32;
        if c >= 10000 {
            Version { major: c / 10000, minor: (c % 10000) / 100, patch: Some(c % 100) }
        } else {
            Version { major: c / 1000, minor: (c % 1000) / 100, patch: Some(c % 100) }
        }
    }
}

/// Where a library was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A directory of `RINGREC_CUDA_LIB_DIR`.
    Override,
    /// The dynamic linker's own search (`LD_LIBRARY_PATH`, ld.so.cache, system directories).
    Linker,
    /// A Python wheel, under this site-packages.
    Wheel(PathBuf),
    /// `$CONDA_PREFIX/lib`.
    Conda,
    /// A CUDA toolkit directory.
    Toolkit,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Override => write!(f, "{LIB_DIR_VAR}"),
            Origin::Linker => f.write_str("the dynamic linker's search path"),
            Origin::Wheel(site) => write!(f, "a Python wheel in {}", site.display()),
            Origin::Conda => f.write_str("the conda environment"),
            Origin::Toolkit => f.write_str("the CUDA toolkit"),
        }
    }
}

/// Where to look (see the module docs); [`Search::from_env`] is what [`libraries`] uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Search {
    /// `RINGREC_CUDA_LIB_DIR`'s directories, searched first for every name.
    pub lib_dirs: Vec<PathBuf>,
    /// Whether to ask the dynamic linker (a bare-name `dlopen`).
    pub linker: bool,
    /// site-packages directories that may hold `nvidia/<package>/lib`.
    pub site_packages: Vec<PathBuf>,
    /// `$CONDA_PREFIX/lib`.
    pub conda_lib: Option<PathBuf>,
    /// CUDA toolkit library directories.
    pub toolkit_dirs: Vec<PathBuf>,
}

impl Search {
    /// The search this process's environment describes.
    pub fn from_env() -> Search {
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        let lib_dirs = crate::config::var_os(LIB_DIR_VAR).map(|v| std::env::split_paths(&v).filter(|p| !p.as_os_str().is_empty()).collect()).unwrap_or_default();
        let mut site_packages = Vec::new();
        for prefix in [var("VIRTUAL_ENV"), var("CONDA_PREFIX")].into_iter().flatten() {
            site_packages.extend(python_dirs(&prefix.join("lib"), "site-packages"));
        }
        if let Some(pp) = std::env::var_os("PYTHONPATH") {
            site_packages.extend(std::env::split_paths(&pp).filter(|p| p.is_dir()));
        }
        if let Some(home) = var("HOME") {
            site_packages.extend(python_dirs(&home.join(".local/lib"), "site-packages"));
        }
        for lib in ["/usr/local/lib", "/usr/lib", "/usr/lib64"] {
            site_packages.extend(python_dirs(Path::new(lib), "dist-packages"));
            site_packages.extend(python_dirs(Path::new(lib), "site-packages"));
        }
        let mut toolkit_dirs = Vec::new();
        let arch = std::env::consts::ARCH;
        let target = if arch == "aarch64" { "sbsa" } else { arch };
        for root in [var("CUDA_HOME"), var("CUDA_PATH"), Some("/usr/local/cuda".into()), Some("/opt/cuda".into())].into_iter().flatten() {
            toolkit_dirs.push(root.join("lib64"));
            toolkit_dirs.push(root.join("lib"));
            toolkit_dirs.push(root.join(format!("targets/{target}-linux/lib")));
        }
        toolkit_dirs.push("/usr/lib/wsl/lib".into());
        Search { lib_dirs, linker: true, site_packages: dedup(site_packages), conda_lib: var("CONDA_PREFIX").map(|p| p.join("lib")), toolkit_dirs: dedup(toolkit_dirs) }
    }

    /// Only these site-packages, no other place (tests of the wheel layout).
    pub fn site_packages_only(site_packages: Vec<PathBuf>) -> Search {
        Search { site_packages, ..Search::default() }
    }

    /// Only the site-packages of the Python environment (venv, conda) at `prefix`.
    pub fn python_prefix_only(prefix: &Path) -> Search {
        Search::site_packages_only(python_dirs(&prefix.join("lib"), "site-packages"))
    }

    /// Every place `lib` is looked for under `name`, in order (not the override dirs).
    fn places(&self, lib: CudaLib) -> Vec<(PathBuf, Origin)> {
        let mut v = Vec::new();
        for site in &self.site_packages {
            for d in lib.wheel_dirs() {
                v.push((site.join(d), Origin::Wheel(site.clone())));
            }
        }
        if lib != CudaLib::Driver {
            v.extend(self.conda_lib.iter().map(|d| (d.clone(), Origin::Conda)));
        }
        v.extend(self.toolkit_dirs.iter().filter(|d| lib == CudaLib::Driver || !d.ends_with("wsl/lib")).map(|d| (d.clone(), Origin::Toolkit)));
        v
    }

    /// The places, in words, for an error message.
    fn describe(&self, lib: CudaLib) -> String {
        let mut parts = Vec::new();
        if self.lib_dirs.is_empty() {
            parts.push(format!("{LIB_DIR_VAR} (not set)"));
        } else {
            let dirs: Vec<String> = self.lib_dirs.iter().map(|d| if d.is_dir() { d.display().to_string() } else { format!("{}: no such directory", d.display()) }).collect();
            parts.push(format!("{LIB_DIR_VAR} ({})", dirs.join(", ")));
        }
        if self.linker {
            let ld = std::env::var("LD_LIBRARY_PATH").ok().filter(|v| !v.is_empty());
            parts.push(format!("the dynamic linker's path (LD_LIBRARY_PATH {}, /etc/ld.so.cache, /lib, /usr/lib)", ld.map(|v| format!("= {v}")).unwrap_or_else(|| "not set".into())));
        }
        if !lib.wheel_dirs().is_empty() {
            let sites: Vec<PathBuf> = self.site_packages.iter().filter(|s| s.is_dir()).cloned().collect();
            if sites.is_empty() {
                parts.push(format!("Python wheels ({} under a site-packages: none found; looked at $VIRTUAL_ENV, $CONDA_PREFIX, $PYTHONPATH, ~/.local and the system Pythons)", lib.wheel_dirs().join(", ")));
            } else {
                parts.push(format!("Python wheels ({} under {})", lib.wheel_dirs().join(", "), join_paths(&sites)));
            }
        }
        if lib != CudaLib::Driver {
            if let Some(c) = &self.conda_lib {
                parts.push(format!("the conda environment ({})", c.display()));
            }
        }
        let tk: Vec<PathBuf> = self.toolkit_dirs.iter().filter(|d| d.is_dir()).cloned().collect();
        if !tk.is_empty() {
            parts.push(format!("the CUDA toolkit ({})", join_paths(&tk)));
        }
        parts.join(", ")
    }
}

fn join_paths(p: &[PathBuf]) -> String {
    p.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
}

fn dedup(v: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for p in v {
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// `<lib>/python3*/<leaf>` directories that exist, newest Python first.
fn python_dirs(lib: &Path, leaf: &str) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(lib) else { return Vec::new() };
    let mut v: Vec<(Vec<u32>, PathBuf)> = rd
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let ver = name.strip_prefix("python3")?;
            let key = std::iter::once(3).chain(ver.trim_start_matches('.').split('.').filter_map(|s| s.parse().ok())).collect();
            let d = e.path().join(leaf);
            d.is_dir().then_some((key, d))
        })
        .collect();
    v.sort_by(|a, b| b.0.cmp(&a.0));
    v.into_iter().map(|(_, d)| d).collect()
}

/// `lib`'s sonames, a CUDA major the driver supports first (the newest such), then the
/// others in their usual order.
pub fn ordered_sonames(lib: CudaLib, driver_major: Option<u32>) -> Vec<&'static str> {
    let mut v: Vec<&'static str> = lib.sonames().to_vec();
    if let Some(d) = driver_major {
        let major = |s: &str| s.rsplit('.').next().and_then(|m| m.parse::<u32>().ok()).unwrap_or(0);
        // Supported majors, newest first; then the rest (stable order).
        v.sort_by_key(|s| {
            let m = major(s);
            if m <= d {
                (0, u32::MAX - m)
            } else {
                (1, m)
            }
        });
    }
    v
}

/// One candidate: a file in a directory, or a bare name for the dynamic linker.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Candidate {
    File(PathBuf, Origin),
    Linker(String),
}

/// Every candidate for `lib`, in the order they are tried (see the module docs).
fn candidates(lib: CudaLib, search: &Search, driver_major: Option<u32>) -> Vec<Candidate> {
    let sonames = ordered_sonames(lib, driver_major);
    let extra: Vec<String> = lib.cudarc_names().into_iter().filter(|n| !sonames.contains(&n.as_str())).collect();
    let all: Vec<String> = sonames.iter().map(|s| s.to_string()).chain(extra.iter().cloned()).collect();
    let mut v = Vec::new();
    for dir in &search.lib_dirs {
        for name in &all {
            v.push(Candidate::File(dir.join(name), Origin::Override));
        }
    }
    let places = search.places(lib);
    for name in &all {
        if search.linker {
            v.push(Candidate::Linker(name.clone()));
        }
        for (dir, origin) in &places {
            v.push(Candidate::File(dir.join(name), origin.clone()));
        }
    }
    v
}

/// A `dlopen` handle. Dropping it does not close it: what was loaded stays loaded for the
/// life of the process (only passed-over candidates are closed, by [`close`]).
#[derive(Debug)]
struct Handle(*mut c_void);

// SAFETY: a dlopen handle is a process-wide token that any thread may pass to dlsym; a
// Handle that is kept is never closed (close() consumes the ones passed over), so it stays
// valid.
unsafe impl Send for Handle {}
// SAFETY: as above; dlsym and dladdr are thread-safe.
unsafe impl Sync for Handle {}

impl Handle {
    /// The address of `symbol` in this object or its dependencies.
    fn sym(&self, symbol: &str) -> Option<*mut c_void> {
        let c = CString::new(symbol).ok()?;
        // SAFETY: the handle is live (never closed) and `c` is NUL-terminated.
        let p = unsafe { libc::dlsym(self.0, c.as_ptr()) };
        (!p.is_null()).then_some(p)
    }
}

/// The last `dlerror`, in words.
fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl call
    // on this thread; it is copied at once.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-null, NUL-terminated (above).
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// `dlopen(name, RTLD_LAZY | RTLD_LOCAL | extra)` (cudarc's mode).
fn dlopen(name: &str, extra: c_int) -> Result<Handle, String> {
    let c = CString::new(name).map_err(|_| format!("{name:?} contains a NUL byte"))?;
    // SAFETY: `c` is NUL-terminated; loading a library runs its initialisers, which is
    // what loading a CUDA library for use means anyway.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL | extra) };
    if h.is_null() {
        Err(dl_error())
    } else {
        Ok(Handle(h))
    }
}

/// The file the object holding `addr` was loaded from.
fn object_path(addr: *mut c_void) -> Option<PathBuf> {
    // SAFETY: Dl_info is plain data; dladdr fills it for an address inside a loaded object.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `addr` came from dlsym; `info` is a valid out-pointer.
    if unsafe { libc::dladdr(addr as *const c_void, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is the object's NUL-terminated name, owned by the loader.
    Some(PathBuf::from(unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned()))
}

/// A library that was found and loaded.
#[derive(Debug)]
pub struct Found {
    /// The file.
    pub path: PathBuf,
    /// Where it was found.
    pub origin: Origin,
    /// Its version, where it can be read (the driver's needs the driver; all others
    /// without a GPU).
    pub version: Option<Version>,
    /// NVRTC only: the architectures it compiles for (`80` = sm_80), ascending.
    pub archs: Vec<u32>,
    /// Libraries loaded from the same directory with it (cublasLt, NVRTC's builtins).
    pub companions: Vec<PathBuf>,
    /// Candidates that existed but were passed over, and why.
    pub passed_over: Vec<String>,
    /// Whether cudarc's first name now loads this library (or why not).
    pub alias: Result<(), String>,
    handle: Handle,
}

/// What discovery found for one library.
#[derive(Debug)]
pub struct LibStatus {
    /// The library.
    pub lib: CudaLib,
    /// The library, or why none: where it was looked for, what existed but did not load,
    /// what to install.
    pub found: Result<Found, String>,
}

/// The CUDA libraries of this process ([`libraries`]): each looked for (and loaded) the
/// first time it is asked for — the driver first, since its version orders the others — so
/// a machine without a driver never loads cuBLAS or NCCL to learn it has no GPU.
#[derive(Debug)]
pub struct Libraries {
    /// The search.
    pub search: Search,
    slots: [OnceLock<LibStatus>; 4],
}

static LIBRARIES: OnceLock<Libraries> = OnceLock::new();

/// The CUDA libraries of this process, with the search of [`Search::from_env`] unless
/// [`configure`] came first.
pub fn libraries() -> &'static Libraries {
    LIBRARIES.get_or_init(|| Libraries::new(Search::from_env()))
}

/// Sets the search before anything asked for a library (a program that embeds ringrec, a
/// test). `false` when the search was already set (and is kept).
pub fn configure(search: Search) -> bool {
    let mut set = false;
    LIBRARIES.get_or_init(|| {
        set = true;
        Libraries::new(search)
    });
    set
}

/// Tries every candidate of `lib`; the first that loads is read and aliased.
fn find(lib: CudaLib, search: &Search, driver_major: Option<u32>) -> Result<Found, String> {
    let mut passed_over = Vec::new();
    for c in candidates(lib, search, driver_major) {
        let label = match &c {
            Candidate::File(p, _) => p.display().to_string(),
            Candidate::Linker(n) => format!("{n} through the dynamic linker"),
        };
        let (handle, origin, companions) = match c {
            Candidate::File(path, origin) => {
                if !path.is_file() {
                    continue;
                }
                if is_stub(&path) {
                    passed_over.push(format!("{} (the CUDA toolkit's link-time stub, not the library)", path.display()));
                    continue;
                }
                let dir = path.parent().unwrap_or(Path::new("/"));
                let mut companions = Vec::new();
                if lib == CudaLib::Cublas {
                    // libcublas needs libcublasLt of its version; from the same directory.
                    let name = path.file_name().map(|n| n.to_string_lossy().replacen("libcublas", "libcublasLt", 1)).unwrap_or_default();
                    let lt = dir.join(name);
                    if lt.is_file() && dlopen(&lt.to_string_lossy(), 0).is_ok() {
                        companions.push(lt);
                    }
                }
                match dlopen(&path.to_string_lossy(), 0) {
                    Ok(h) => (h, origin, companions),
                    Err(e) => {
                        passed_over.push(format!("{} (did not load: {e})", path.display()));
                        continue;
                    }
                }
            }
            Candidate::Linker(name) => match dlopen(&name, 0) {
                Ok(h) => (h, Origin::Linker, Vec::new()),
                Err(e) => {
                    if !e.contains("No such file") {
                        passed_over.push(format!("{label} (did not load: {e})"));
                    }
                    continue;
                }
            },
        };
        let Some(marker) = handle.sym(lib.marker_symbol()) else {
            passed_over.push(format!("{label} (loaded, but has no {}: not {})", lib.marker_symbol(), lib.name()));
            close(handle);
            continue;
        };
        let path = object_path(marker).unwrap_or_else(|| PathBuf::from(&label));
        if is_stub(&path) {
            passed_over.push(format!("{} (the CUDA toolkit's link-time stub, not the library)", path.display()));
            close(handle);
            continue;
        }
        let mut found = Found { version: read_version(lib, &handle), archs: Vec::new(), path, origin, companions, passed_over, alias: Ok(()), handle };
        if lib == CudaLib::Nvrtc {
            found.archs = nvrtc_archs(&found.handle);
            preload_builtins(&mut found);
        }
        found.alias = alias(lib, &found);
        return Ok(found);
    }
    let sonames = ordered_sonames(lib, driver_major);
    let others: Vec<String> = lib.cudarc_names().into_iter().filter(|n| !sonames.contains(&n.as_str())).collect();
    let mut why = format!("looked for {} (and cudarc's names {}) in {}", sonames.join(", "), others.join(", "), search.describe(lib));
    if !passed_over.is_empty() {
        why.push_str(&format!("; passed over: {}", passed_over.join("; ")));
    }
    why.push_str(&format!("; {}, or set {LIB_DIR_VAR} to the directory that holds it", lib.install_hint()));
    Err(why)
}

/// Unloads a candidate that was passed over (so a stub's soname answers nobody).
fn close(h: Handle) {
    // SAFETY: `h` came from a successful dlopen and is not used again.
    unsafe { libc::dlclose(h.0) };
}

/// The CUDA toolkit's link-time stubs (`lib64/stubs/libcuda.so`) only satisfy the linker.
fn is_stub(path: &Path) -> bool {
    path.parent().and_then(|d| d.file_name()).is_some_and(|d| d == "stubs")
}

/// NVRTC loads its builtins library by bare name when it compiles; one that sits beside
/// it (of its version) is loaded now by path, so that name resolves to it whatever NVRTC's
/// own search path.
fn preload_builtins(found: &mut Found) {
    let Some(v) = found.version else { return };
    let Some(dir) = found.path.parent() else { return };
    let b = dir.join(format!("libnvrtc-builtins.so.{}.{}", v.major, v.minor));
    if b.is_file() && dlopen(&b.to_string_lossy(), 0).is_ok() {
        found.companions.push(b);
    }
}

/// Makes cudarc's first name for `lib` load `found`, and checks it does.
fn alias(lib: CudaLib, found: &Found) -> Result<(), String> {
    let name = lib.alias_name();
    let marker = found.handle.sym(lib.marker_symbol()).ok_or("the library lost its marker symbol")?;
    // Already answered (the library's own soname, or an earlier alias)?
    if let Ok(h) = dlopen(&name, libc::RTLD_NOLOAD) {
        let same = h.sym(lib.marker_symbol()) == Some(marker);
        // SAFETY: `h` came from a successful RTLD_NOLOAD dlopen, which took a reference.
        unsafe { libc::dlclose(h.0) };
        return if same { Ok(()) } else { Err(format!("another {name} is already loaded in this process; cudarc would use it")) };
    }
    let image = alias_object(&name, &found.path.to_string_lossy())?;
    load_from_memory(&image, &name)?;
    let h = dlopen(&name, libc::RTLD_NOLOAD).map_err(|e| format!("{name} does not resolve to the alias (not glibc?): {e}"))?;
    let same = h.sym(lib.marker_symbol()) == Some(marker);
    // SAFETY: as above.
    unsafe { libc::dlclose(h.0) };
    if same {
        Ok(())
    } else {
        Err(format!("{name} resolves to another library than {}", found.path.display()))
    }
}

/// Loads a shared object from bytes: a memfd (or, without memfd, a temporary file removed
/// once loaded). The handle is kept open for the life of the process; so is the memfd, so
/// no later object can reuse its `/proc/self/fd/N` name.
fn load_from_memory(image: &[u8], name: &str) -> Result<(), String> {
    use std::io::Write;
    use std::os::fd::FromRawFd;
    static KEEP: std::sync::Mutex<Vec<std::fs::File>> = std::sync::Mutex::new(Vec::new());
    let cname = CString::new(format!("ringrec-alias-{name}")).map_err(|e| e.to_string())?;
    // SAFETY: `cname` is NUL-terminated; memfd_create returns a new fd or -1.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
    if fd >= 0 {
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
        file.write_all(image).map_err(|e| format!("writing the alias of {name}: {e}"))?;
        let path = format!("/proc/self/fd/{fd}");
        if Path::new(&path).exists() {
            // Never closed (a Handle does not close on drop): the alias stays loaded.
            dlopen(&path, 0).map_err(|e| format!("loading the alias of {name}: {e}"))?;
            KEEP.lock().unwrap_or_else(|e| e.into_inner()).push(file);
            return Ok(());
        }
    }
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("ringrec-alias-{}-{n}-{name}", std::process::id()));
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).open(&path).map_err(|e| format!("writing the alias of {name} to {}: {e}", path.display()))?;
    let wrote = f.write_all(image);
    drop(f);
    let loaded = wrote.map_err(|e| e.to_string()).and_then(|_| dlopen(&path.to_string_lossy(), 0));
    let _ = std::fs::remove_file(&path);
    loaded.map(|_| ()).map_err(|e| format!("loading the alias of {name}: {e}"))
}

/// An ELF shared object with no code: `DT_SONAME` = `soname`, one `DT_NEEDED` = `needed`
/// (a full path), an empty symbol table and hash table, a non-executable stack. Loaded, it
/// answers `dlopen(soname)` with `needed`'s symbols.
pub fn alias_object(soname: &str, needed: &str) -> Result<Vec<u8>, String> {
    let machine: u16 = match std::env::consts::ARCH {
        "x86_64" => 62,
        "aarch64" => 183,
        other => return Err(format!("aliasing libraries is not implemented on {other}")),
    };
    if soname.contains('\0') || needed.contains('\0') {
        return Err("a name contains a NUL byte".into());
    }
    const EHDR: usize = 64;
    const PHDR: usize = 56;
    const NPH: usize = 3;
    const NDYN: usize = 8;
    let dyn_off = EHDR + NPH * PHDR;
    let hash_off = dyn_off + NDYN * 16;
    let sym_off = hash_off + 16;
    let str_off = sym_off + 24;
    let mut strtab = vec![0u8];
    let soname_at = strtab.len();
    strtab.extend_from_slice(soname.as_bytes());
    strtab.push(0);
    let needed_at = strtab.len();
    strtab.extend_from_slice(needed.as_bytes());
    strtab.push(0);
    let end = str_off + strtab.len();

    let mut b: Vec<u8> = Vec::with_capacity(end);
    let u16_ = |b: &mut Vec<u8>, v: u16| b.extend_from_slice(&v.to_le_bytes());
    let u32_ = |b: &mut Vec<u8>, v: u32| b.extend_from_slice(&v.to_le_bytes());
    let u64_ = |b: &mut Vec<u8>, v: u64| b.extend_from_slice(&v.to_le_bytes());
    // ELF header: 64-bit, little-endian, current version, System V ABI, shared object.
    b.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    u16_(&mut b, 3); // ET_DYN
    u16_(&mut b, machine);
    u32_(&mut b, 1); // EV_CURRENT
    u64_(&mut b, 0); // e_entry
    u64_(&mut b, EHDR as u64); // e_phoff
    u64_(&mut b, 0); // e_shoff: no sections
    u32_(&mut b, 0); // e_flags
    u16_(&mut b, EHDR as u16);
    u16_(&mut b, PHDR as u16);
    u16_(&mut b, NPH as u16);
    u16_(&mut b, 64); // e_shentsize
    u16_(&mut b, 0); // e_shnum
    u16_(&mut b, 0); // e_shstrndx
    let phdr = |b: &mut Vec<u8>, kind: u32, flags: u32, off: usize, size: usize, align: u64| {
        u32_(b, kind);
        u32_(b, flags);
        u64_(b, off as u64); // p_offset
        u64_(b, off as u64); // p_vaddr
        u64_(b, off as u64); // p_paddr
        u64_(b, size as u64); // p_filesz
        u64_(b, size as u64); // p_memsz
        u64_(b, align);
    };
    const RW: u32 = 4 | 2;
    // One read-write segment maps the whole file (older glibc relocate the dynamic section
    // in place); 64 KiB alignment suits every page size.
    phdr(&mut b, 1, RW, 0, end, 0x10000); // PT_LOAD
    phdr(&mut b, 2, RW, dyn_off, NDYN * 16, 8); // PT_DYNAMIC
    phdr(&mut b, 0x6474_e551, RW, 0, 0, 16); // PT_GNU_STACK: not executable
    let dynamic = [(1u64, needed_at as u64), (14, soname_at as u64), (4, hash_off as u64), (5, str_off as u64), (6, sym_off as u64), (10, strtab.len() as u64), (11, 24), (0, 0)];
    for (tag, val) in dynamic {
        u64_(&mut b, tag);
        u64_(&mut b, val);
    }
    // DT_HASH: one bucket, one chain entry, both the null symbol.
    for v in [1u32, 1, 0, 0] {
        u32_(&mut b, v);
    }
    b.extend_from_slice(&[0u8; 24]); // the null symbol
    b.extend_from_slice(&strtab);
    debug_assert_eq!(b.len(), end);
    Ok(b)
}

/// Calls `f(symbol)` with the function pointer type `F` if the library has it.
///
/// # Safety
/// `F` must be the C signature of `symbol` as the library's header declares it.
unsafe fn with_fn<F: Copy, R>(h: &Handle, symbol: &str, call: impl FnOnce(F) -> R) -> Option<R> {
    let p = h.sym(symbol)?;
    debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: `p` is the address of `symbol`, whose signature is `F` (the caller's promise).
    let f: F = unsafe { std::mem::transmute_copy(&p) };
    Some(call(f))
}

fn read_version(lib: CudaLib, h: &Handle) -> Option<Version> {
    match lib {
        CudaLib::Driver => {
            let mut v: c_int = 0;
            // SAFETY: CUresult cuDriverGetVersion(int*) (cuda.h); needs no cuInit.
            let rc = unsafe { with_fn(h, "cuDriverGetVersion", |f: unsafe extern "C" fn(*mut c_int) -> c_int| f(&mut v)) }?;
            (rc == 0).then(|| Version::from_cuda(v))
        }
        CudaLib::Nvrtc => {
            let (mut major, mut minor): (c_int, c_int) = (0, 0);
            // SAFETY: nvrtcResult nvrtcVersion(int*, int*) (nvrtc.h).
            let rc = unsafe { with_fn(h, "nvrtcVersion", |f: unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int| f(&mut major, &mut minor)) }?;
            (rc == 0).then_some(Version { major: major as u32, minor: minor as u32, patch: None })
        }
        CudaLib::Cublas => {
            let mut parts = [0 as c_int; 3];
            for (kind, out) in parts.iter_mut().enumerate() {
                // SAFETY: cublasStatus_t cublasGetProperty(libraryPropertyType, int*)
                // (cublas_api.h); MAJOR_VERSION = 0, MINOR_VERSION = 1, PATCH_LEVEL = 2.
                let rc = unsafe { with_fn(h, "cublasGetProperty", |f: unsafe extern "C" fn(c_int, *mut c_int) -> c_int| f(kind as c_int, out)) }?;
                if rc != 0 {
                    return None;
                }
            }
            Some(Version { major: parts[0] as u32, minor: parts[1] as u32, patch: Some(parts[2] as u32) })
        }
        CudaLib::Nccl => {
            let mut code: c_int = 0;
            // SAFETY: ncclResult_t ncclGetVersion(int*) (nccl.h); needs no GPU.
            let rc = unsafe { with_fn(h, "ncclGetVersion", |f: unsafe extern "C" fn(*mut c_int) -> c_int| f(&mut code)) }?;
            (rc == 0).then(|| Version::from_nccl(code))
        }
    }
}

/// The architectures NVRTC compiles for (`nvrtcGetSupportedArchs`, CUDA 11.2 and later).
fn nvrtc_archs(h: &Handle) -> Vec<u32> {
    let mut n: c_int = 0;
    // SAFETY: nvrtcResult nvrtcGetNumSupportedArchs(int*) (nvrtc.h).
    let ok = unsafe { with_fn(h, "nvrtcGetNumSupportedArchs", |f: unsafe extern "C" fn(*mut c_int) -> c_int| f(&mut n)) } == Some(0);
    if !ok || n <= 0 {
        return Vec::new();
    }
    let mut v = vec![0 as c_int; n as usize];
    // SAFETY: nvrtcResult nvrtcGetSupportedArchs(int*) fills as many ints as
    // nvrtcGetNumSupportedArchs reported; `v` holds that many.
    let ok = unsafe { with_fn(h, "nvrtcGetSupportedArchs", |f: unsafe extern "C" fn(*mut c_int) -> c_int| f(v.as_mut_ptr())) } == Some(0);
    let mut archs: Vec<u32> = if ok { v.into_iter().filter(|a| *a > 0).map(|a| a as u32).collect() } else { Vec::new() };
    archs.sort_unstable();
    archs
}

impl Libraries {
    fn new(search: Search) -> Libraries {
        Libraries { search, slots: Default::default() }
    }

    /// What was found for `lib` (looked for now, the first time).
    pub fn get(&self, lib: CudaLib) -> &LibStatus {
        let at = CudaLib::ALL.iter().position(|l| *l == lib).expect("every library has a slot");
        self.slots[at].get_or_init(|| {
            let driver_major = if lib == CudaLib::Driver { None } else { self.get(CudaLib::Driver).found.as_ref().ok().and_then(|f| f.version).map(|v| v.major) };
            LibStatus { lib, found: find(lib, &self.search, driver_major) }
        })
    }

    /// `lib`, usable by cudarc; else [`DeviceError::MissingLibrary`] saying where it was
    /// looked for (or what was wrong with what was found) and what to install.
    pub fn require(&self, lib: CudaLib) -> Result<&Found, DeviceError> {
        match &self.get(lib).found {
            Ok(f) => match &f.alias {
                Ok(()) => Ok(f),
                Err(e) => Err(DeviceError::MissingLibrary { lib, detail: format!("found {} ({}), but could not make it cudarc's {}: {e}", f.path.display(), f.origin, lib.alias_name()) }),
            },
            Err(why) => Err(DeviceError::MissingLibrary { lib, detail: why.clone() }),
        }
    }

    /// The architectures the NVRTC found compiles for (empty without NVRTC).
    pub fn nvrtc_archs(&self) -> &[u32] {
        self.get(CudaLib::Nvrtc).found.as_ref().map(|f| f.archs.as_slice()).unwrap_or(&[])
    }

    /// A library's version and file, in words (`12.8 (/path/libnvrtc.so.12)`), or `none`.
    pub fn describe(&self, lib: CudaLib) -> String {
        match &self.get(lib).found {
            Ok(f) => format!("{} ({})", f.version.map(|v| v.to_string()).unwrap_or_else(|| "version unknown".into()), f.path.display()),
            Err(_) => "none".into(),
        }
    }

    /// One paragraph per library: where it was found, its version and what came with it —
    /// or where it was looked for and what to install.
    pub fn report(&self) -> String {
        let mut s = String::new();
        for st in CudaLib::ALL.map(|l| self.get(l)) {
            match &st.found {
                Ok(f) => {
                    let version = match (f.version, st.lib) {
                        (Some(v), _) => v.to_string(),
                        (None, CudaLib::Driver) => "version unknown".into(),
                        (None, _) => "version unreadable".into(),
                    };
                    s.push_str(&format!("  {}: {version} at {} (from {})\n", st.lib, f.path.display(), f.origin));
                    for c in &f.companions {
                        s.push_str(&format!("      with {}\n", c.display()));
                    }
                    if !f.archs.is_empty() {
                        let a: Vec<String> = f.archs.iter().map(|a| format!("sm_{a}")).collect();
                        s.push_str(&format!("      compiles for {}\n", a.join(" ")));
                    }
                    for p in &f.passed_over {
                        s.push_str(&format!("      passed over {p}\n"));
                    }
                    match &f.alias {
                        Ok(()) => s.push_str(&format!("      cudarc loads it as {}\n", st.lib.alias_name())),
                        Err(e) => s.push_str(&format!("      NOT usable by cudarc: {e}\n")),
                    }
                }
                Err(why) => s.push_str(&format!("  {}: not found: {why}\n", st.lib)),
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ringrec-libs-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn versions_read_as_the_libraries_encode_them() {
        assert_eq!(Version::from_cuda(12080).to_string(), "12.8");
        assert_eq!(Version::from_cuda(13000).to_string(), "13.0");
        assert_eq!(Version::from_nccl(23007).to_string(), "2.30.7");
        assert_eq!(Version::from_nccl(2708).to_string(), "2.7.8");
    }

    #[test]
    fn sonames_put_a_major_the_driver_supports_first() {
        assert_eq!(ordered_sonames(CudaLib::Nvrtc, None), ["libnvrtc.so.12", "libnvrtc.so.13"]);
        assert_eq!(ordered_sonames(CudaLib::Nvrtc, Some(12)), ["libnvrtc.so.12", "libnvrtc.so.13"]);
        assert_eq!(ordered_sonames(CudaLib::Cublas, Some(13)), ["libcublas.so.13", "libcublas.so.12"]);
        assert_eq!(ordered_sonames(CudaLib::Nccl, Some(12)), ["libnccl.so.2"]);
        assert_eq!(CudaLib::Nccl.cudarc_names()[0], "libnccl.so");
        assert!(!CudaLib::Nccl.cudarc_names().contains(&"libnccl.so.2".to_string()), "the reason this module exists");
    }

    #[test]
    fn override_dirs_come_first_then_each_soname_everywhere_then_cudarcs_names() {
        let s = Search { lib_dirs: vec!["/o".into()], linker: true, site_packages: vec!["/site".into()], conda_lib: None, toolkit_dirs: vec!["/usr/local/cuda/lib64".into(), "/usr/lib/wsl/lib".into()] };
        let c = candidates(CudaLib::Nccl, &s, None);
        let file = |p: &str, o: Origin| Candidate::File(p.into(), o);
        assert_eq!(c[0], file("/o/libnccl.so.2", Origin::Override));
        assert_eq!(c[1], file("/o/libnccl.so", Origin::Override));
        let first_other = c.iter().position(|x| !matches!(x, Candidate::File(_, Origin::Override))).unwrap();
        assert_eq!(&c[first_other..first_other + 3], &[Candidate::Linker("libnccl.so.2".into()), file("/site/nvidia/nccl/lib/libnccl.so.2", Origin::Wheel("/site".into())), file("/usr/local/cuda/lib64/libnccl.so.2", Origin::Toolkit)]);
        assert!(!c.iter().any(|x| matches!(x, Candidate::File(p, _) if p.starts_with("/usr/lib/wsl"))), "WSL's directory holds only the driver");
        assert_eq!(c[first_other + 3], Candidate::Linker("libnccl.so".into()));
        // CUDA 13's wheels share one directory.
        let c = candidates(CudaLib::Cublas, &Search::site_packages_only(vec!["/s".into()]), Some(13));
        assert_eq!(c[0], file("/s/nvidia/cublas/lib/libcublas.so.13", Origin::Wheel("/s".into())));
        assert_eq!(c[1], file("/s/nvidia/cu13/lib/libcublas.so.13", Origin::Wheel("/s".into())));
    }

    #[test]
    fn site_packages_of_every_python_newest_first() {
        let d = tmpdir("py");
        for v in ["python3.9", "python3.11", "python3.12", "python2.7"] {
            std::fs::create_dir_all(d.join(v).join("site-packages")).unwrap();
        }
        let got = python_dirs(&d, "site-packages");
        assert_eq!(got, vec![d.join("python3.12/site-packages"), d.join("python3.11/site-packages"), d.join("python3.9/site-packages")]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_missing_library_says_where_it_looked_what_failed_and_what_to_install() {
        // A wheel layout whose libnccl.so.2 is not a library, and a toolkit stub.
        let d = tmpdir("missing");
        let lib = d.join("site/nvidia/nccl/lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("libnccl.so.2"), b"not an ELF file").unwrap();
        std::fs::create_dir_all(d.join("cuda/stubs")).unwrap();
        std::fs::write(d.join("cuda/stubs/libnccl.so"), b"").unwrap();
        let s = Search { lib_dirs: vec![d.join("empty")], linker: false, site_packages: vec![d.join("site")], conda_lib: None, toolkit_dirs: vec![d.join("cuda/stubs")] };
        let why = find(CudaLib::Nccl, &s, None).unwrap_err();
        for want in ["libnccl.so.2", "cudarc's names libnccl.so", "empty: no such directory", "nvidia/nccl/lib under", "did not load", "link-time stub", "pip install nvidia-nccl-cu12", "libnccl2"] {
            assert!(why.contains(want), "{want:?} missing from: {why}");
        }
        let e = DeviceError::MissingLibrary { lib: CudaLib::Nccl, detail: why };
        assert!(e.to_string().starts_with("libnccl (NCCL) is not available: looked for"), "{e}");
        assert!(e.to_string().ends_with("use --device cpu"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_alias_object_loads_and_answers_its_soname_with_the_librarys_symbols() {
        // libm stands in for a CUDA library: found through the linker, aliased under a
        // name nothing else has.
        let m = dlopen("libm.so.6", 0).expect("libm");
        let cos = m.sym("cos").expect("cos");
        let path = object_path(cos).expect("libm's path");
        let name = format!("libringrec-test-alias-{}.so", std::process::id());
        assert!(dlopen(&name, 0).is_err(), "no such library before");
        let image = alias_object(&name, &path.to_string_lossy()).unwrap();
        assert!(image.len() < 512 + path.as_os_str().len() + name.len(), "{} bytes", image.len());
        load_from_memory(&image, &name).unwrap();
        let h = dlopen(&name, 0).expect("the alias answers its soname");
        assert_eq!(h.sym("cos"), Some(cos), "dlsym through the alias finds the library's function");
        // A second alias (another memfd) does not collide with the first.
        let name2 = format!("libringrec-test-alias2-{}.so", std::process::id());
        load_from_memory(&alias_object(&name2, &path.to_string_lossy()).unwrap(), &name2).unwrap();
        assert_eq!(dlopen(&name2, 0).unwrap().sym("sin"), m.sym("sin"));
        assert_eq!(dlopen(&name, libc::RTLD_NOLOAD).unwrap().sym("cos"), Some(cos));
    }

    #[test]
    fn discovery_never_panics_and_reports_every_library() {
        let libs = libraries();
        assert_eq!(CudaLib::ALL.map(|l| libs.get(l).lib), CudaLib::ALL);
        let r = libs.report();
        for lib in CudaLib::ALL {
            assert!(r.contains(lib.name()), "{r}");
            match libs.require(lib) {
                Ok(f) => assert!(f.path.is_file(), "{}", f.path.display()),
                Err(e) => assert!(e.to_string().contains("--device cpu") && e.to_string().contains("looked for") || e.to_string().contains("found "), "{e}"),
            }
        }
    }
}
