//! The CUDA C kernel sources (kernels/*.cu), embedded in the binary so an installed
//! `ringrec` needs no source tree, the [`Kernel`] list, and (feature `cuda`) their NVRTC
//! compilation.
//!
//! NVRTC compiles straight to machine code (SASS, a CUBIN) for the device's architecture
//! ([`Target::Sass`]), so the driver has nothing left to compile: a PTX that an NVRTC newer
//! than the driver wrote is what the driver refuses (`CUDA_ERROR_UNSUPPORTED_PTX_VERSION`).
//! Only when NVRTC does not know the device's architecture (a GPU newer than NVRTC) does it
//! write PTX for the newest architecture it knows below, which the driver then compiles
//! ([`target_for`]). If the driver still refuses the module, the error names NVRTC's and the
//! driver's versions and what to install ([`super::DeviceError::KernelLoad`]). Compiling
//! needs NVRTC only, no GPU: `ringrec info --compile-kernels sm_80,sm_90`.
//!
//! Every source gets [`PRELUDE`] prepended. The kernels are written so the same text also
//! compiles as host C++ with kernels/host_shim.h ([`host_source`]): [`super::HostKernels`]
//! runs them thread by thread on the CPU, so the kernels' logic is tested on machines
//! without a GPU too.

/// Prepended to every kernel source.
pub const PRELUDE: &str = include_str!("../../kernels/prelude.cuh");

/// Defines the CUDA keywords and launch geometry for a host C++ compiler (tests only).
pub const HOST_SHIM: &str = include_str!("../../kernels/host_shim.h");

/// (name, source) of every kernel file.
pub const SOURCES: &[(&str, &str)] = &[
    ("dense", include_str!("../../kernels/dense.cu")),
    ("optim", include_str!("../../kernels/optim.cu")),
    ("cast", include_str!("../../kernels/cast.cu")),
    ("compress", include_str!("../../kernels/compress.cu")),
    ("models", include_str!("../../kernels/models.cu")),
    ("cache", include_str!("../../kernels/cache.cu")),
    ("pooling", include_str!("../../kernels/pooling.cu")),
    ("csr", include_str!("../../kernels/csr.cu")),
];

/// Every kernel of kernels/*.cu.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Row gather into row blocks.
    GatherRows,
    /// Columns appended to rows.
    CopyColumns,
    /// Bias, then an activation.
    BiasAct,
    /// Zeroes deltas where the ReLU was off.
    ReluGrad,
    /// Column sums.
    ColumnSum,
    /// Sigmoid + binary cross-entropy and its gradient.
    BceWithLogits,
    /// The same with a weight per sample.
    WeightedBce,
    /// The sum of a vector.
    Sum,
    /// Segmented sum of row blocks (the backward of the gather).
    SegmentSum,
    /// SGD update.
    SgdUpdate,
    /// Adam update.
    AdamUpdate,
    /// f32 -> f16.
    F32ToF16,
    /// f32 -> bf16.
    F32ToBf16,
    /// f16 -> f32.
    F16ToF32,
    /// bf16 -> f32.
    Bf16ToF32,
    /// 1-bit: v = x + residual and the parts of its norm.
    OneBitNorms,
    /// 1-bit: the scale from the parts.
    OneBitScale,
    /// 1-bit: the sign bits and the new residual.
    OneBitPack,
    /// 1-bit: every rank's encoding decoded and summed.
    OneBitUnpackSum,
    /// A block of columns between strided matrices.
    CopyBlock,
    /// Element-wise product (or product added).
    Mul,
    /// Element-wise sum into the output.
    AddInto,
    /// DLRM's dot interaction.
    Interaction,
    /// Its backward.
    InteractionGrad,
    /// The deep input without the first-order weights.
    StripFirstOrder,
    /// The sum of a sample's first-order weights.
    FirstOrderSum,
    /// The backward of both.
    StripFirstOrderGrad,
    /// The factorisation machine's second-order term.
    FmSecondOrder,
    /// Its backward.
    FmSecondOrderGrad,
    /// Row gather from the hot-row cache or the staged misses.
    GatherSourced,
    /// Multi-hot pooling of rows from the hot-row cache or the staged misses.
    PoolBagsSourced,
    /// The host table's optimizer step on cached rows.
    CacheUpdate,
    /// Rows (and accumulators) put into cache slots.
    CachePut,
    /// New keys' initial rows.
    InitRows,
    /// Multi-hot pooling (sum or mean per field).
    PoolBags,
    /// Its backward, added into the key gradients.
    PoolBagsGrad,
    /// The input of fields of several widths (several tables), gathered and pooled.
    GatherFields,
    /// Its backward: the key gradients.
    GatherFieldsGrad,
    /// The per-key lists' sort: each chunk's digit counts.
    CsrCount,
    /// The sort's prefix sums: each block's count.
    CsrBlockSums,
    /// The sort's prefix sums: where each block starts.
    CsrBlockStarts,
    /// The sort: where each (digit, chunk) pair's entries go.
    CsrStarts,
    /// The sort: each chunk's entries to their places.
    CsrScatter,
    /// The per-key lists' offsets from the sorted slots.
    CsrOffsets,
}

impl Kernel {
    /// Every kernel.
    pub const ALL: [Kernel; 44] = [
        Kernel::GatherRows,
        Kernel::CopyColumns,
        Kernel::BiasAct,
        Kernel::ReluGrad,
        Kernel::ColumnSum,
        Kernel::BceWithLogits,
        Kernel::WeightedBce,
        Kernel::Sum,
        Kernel::SegmentSum,
        Kernel::SgdUpdate,
        Kernel::AdamUpdate,
        Kernel::F32ToF16,
        Kernel::F32ToBf16,
        Kernel::F16ToF32,
        Kernel::Bf16ToF32,
        Kernel::OneBitNorms,
        Kernel::OneBitScale,
        Kernel::OneBitPack,
        Kernel::OneBitUnpackSum,
        Kernel::CopyBlock,
        Kernel::Mul,
        Kernel::AddInto,
        Kernel::Interaction,
        Kernel::InteractionGrad,
        Kernel::StripFirstOrder,
        Kernel::FirstOrderSum,
        Kernel::StripFirstOrderGrad,
        Kernel::FmSecondOrder,
        Kernel::FmSecondOrderGrad,
        Kernel::GatherSourced,
        Kernel::PoolBagsSourced,
        Kernel::CacheUpdate,
        Kernel::CachePut,
        Kernel::InitRows,
        Kernel::PoolBags,
        Kernel::PoolBagsGrad,
        Kernel::GatherFields,
        Kernel::GatherFieldsGrad,
        Kernel::CsrCount,
        Kernel::CsrBlockSums,
        Kernel::CsrBlockStarts,
        Kernel::CsrStarts,
        Kernel::CsrScatter,
        Kernel::CsrOffsets,
    ];

    /// The function's name in its source.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::GatherRows => "gather_rows",
            Kernel::CopyColumns => "copy_columns",
            Kernel::BiasAct => "bias_act",
            Kernel::ReluGrad => "relu_grad",
            Kernel::ColumnSum => "column_sum",
            Kernel::BceWithLogits => "bce_with_logits",
            Kernel::WeightedBce => "weighted_bce",
            Kernel::Sum => "sum",
            Kernel::SegmentSum => "segment_sum",
            Kernel::SgdUpdate => "sgd_update",
            Kernel::AdamUpdate => "adam_update",
            Kernel::F32ToF16 => "f32_to_f16",
            Kernel::F32ToBf16 => "f32_to_bf16",
            Kernel::F16ToF32 => "f16_to_f32",
            Kernel::Bf16ToF32 => "bf16_to_f32",
            Kernel::OneBitNorms => "onebit_norms",
            Kernel::OneBitScale => "onebit_scale",
            Kernel::OneBitPack => "onebit_pack",
            Kernel::OneBitUnpackSum => "onebit_unpack_sum",
            Kernel::CopyBlock => "copy_block",
            Kernel::Mul => "mul",
            Kernel::AddInto => "add_into",
            Kernel::Interaction => "interaction",
            Kernel::InteractionGrad => "interaction_grad",
            Kernel::StripFirstOrder => "strip_first_order",
            Kernel::FirstOrderSum => "first_order_sum",
            Kernel::StripFirstOrderGrad => "strip_first_order_grad",
            Kernel::FmSecondOrder => "fm_second_order",
            Kernel::FmSecondOrderGrad => "fm_second_order_grad",
            Kernel::GatherSourced => "gather_sourced",
            Kernel::PoolBagsSourced => "pool_bags_sourced",
            Kernel::CacheUpdate => "cache_update",
            Kernel::CachePut => "cache_put",
            Kernel::InitRows => "init_rows",
            Kernel::PoolBags => "pool_bags",
            Kernel::PoolBagsGrad => "pool_bags_grad",
            Kernel::GatherFields => "gather_fields",
            Kernel::GatherFieldsGrad => "gather_fields_grad",
            Kernel::CsrCount => "csr_count",
            Kernel::CsrBlockSums => "csr_block_sums",
            Kernel::CsrBlockStarts => "csr_block_starts",
            Kernel::CsrStarts => "csr_starts",
            Kernel::CsrScatter => "csr_scatter",
            Kernel::CsrOffsets => "csr_offsets",
        }
    }

    /// The file (kernels/<source>.cu) that defines it.
    pub fn source(self) -> &'static str {
        match self {
            Kernel::SgdUpdate | Kernel::AdamUpdate => "optim",
            Kernel::F32ToF16 | Kernel::F32ToBf16 | Kernel::F16ToF32 | Kernel::Bf16ToF32 => "cast",
            Kernel::OneBitNorms | Kernel::OneBitScale | Kernel::OneBitPack | Kernel::OneBitUnpackSum => "compress",
            Kernel::CopyBlock
            | Kernel::Mul
            | Kernel::AddInto
            | Kernel::Interaction
            | Kernel::InteractionGrad
            | Kernel::StripFirstOrder
            | Kernel::FirstOrderSum
            | Kernel::StripFirstOrderGrad
            | Kernel::FmSecondOrder
            | Kernel::FmSecondOrderGrad => "models",
            Kernel::GatherSourced | Kernel::CacheUpdate | Kernel::CachePut | Kernel::InitRows => "cache",
            Kernel::PoolBags | Kernel::PoolBagsSourced | Kernel::PoolBagsGrad | Kernel::GatherFields | Kernel::GatherFieldsGrad => "pooling",
            Kernel::CsrCount | Kernel::CsrBlockSums | Kernel::CsrBlockStarts | Kernel::CsrStarts | Kernel::CsrScatter | Kernel::CsrOffsets => "csr",
            _ => "dense",
        }
    }
}

/// One translation unit of every kernel for a host C++ compiler, with an entry point
/// `rr_launch_<name>(void** args)` per kernel that takes its arguments as cuLaunchKernel
/// does (an array of pointers to the values).
pub fn host_source() -> String {
    let mut s = String::from(HOST_SHIM);
    s.push_str(PRELUDE);
    for (_, src) in SOURCES {
        s.push_str(src);
        s.push('\n');
    }
    for k in Kernel::ALL {
        s.push_str(&format!("extern \"C\" void rr_launch_{0}(void** a) {{ rr_invoke({0}, a); }}\n", k.name()));
    }
    s
}

/// The source NVRTC compiles for `name`: the prelude, then the file.
pub fn device_source(name: &str) -> Option<String> {
    SOURCES.iter().find(|(n, _)| *n == name).map(|(_, src)| format!("{PRELUDE}\n{src}"))
}

/// A GPU architecture: its compute capability as major * 10 + minor (`sm_80` = 80,
/// `sm_120` = 120).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Arch(pub u32);

impl Arch {
    /// The architecture of a device of compute capability `major.minor`.
    pub fn from_capability(major: i32, minor: i32) -> Arch {
        Arch((major.max(0) * 10 + minor.max(0)) as u32)
    }

    /// `sm_80`, `compute_80`, `80` or `8.0`.
    pub fn parse(s: &str) -> Option<Arch> {
        let s = s.trim();
        let digits = s.strip_prefix("sm_").or_else(|| s.strip_prefix("compute_")).unwrap_or(s);
        if let Some((major, minor)) = digits.split_once('.') {
            return Some(Arch::from_capability(major.parse().ok()?, minor.parse().ok()?));
        }
        let v: u32 = digits.parse().ok()?;
        (v >= 10).then_some(Arch(v))
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sm_{}", self.0)
    }
}

/// What NVRTC produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Machine code (a CUBIN) for this architecture: nothing left for the driver to compile.
    Sass(Arch),
    /// PTX for this virtual architecture, which the driver compiles (NVRTC does not know
    /// the device's architecture).
    Ptx(Arch),
}

impl Target {
    /// NVRTC's option for it.
    pub fn option(self) -> String {
        match self {
            Target::Sass(a) => format!("--gpu-architecture=sm_{}", a.0),
            Target::Ptx(a) => format!("--gpu-architecture=compute_{}", a.0),
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Sass(a) => write!(f, "SASS for {a}"),
            Target::Ptx(a) => write!(f, "PTX for compute_{}", a.0),
        }
    }
}

/// What to compile for a device of architecture `device`, given the architectures NVRTC
/// knows (`supported`, ascending; empty when it cannot say, before CUDA 11.2): SASS for
/// the device when NVRTC knows it, else PTX for the newest architecture it knows below the
/// device's. An error (saying what to install) when it knows none at or below.
pub fn target_for(device: Arch, supported: &[u32]) -> Result<Target, String> {
    if supported.is_empty() || supported.contains(&device.0) {
        return Ok(Target::Sass(device));
    }
    match supported.iter().copied().filter(|a| *a <= device.0).max() {
        Some(a) => Ok(Target::Ptx(Arch(a))),
        None => Err(format!(
            "this NVRTC compiles for sm_{} to sm_{} only, not for {device}: install an NVRTC that still supports {device} (CUDA 12: `pip install nvidia-cuda-nvrtc-cu12`) and set RINGREC_CUDA_LIB_DIR to its directory",
            supported[0],
            supported[supported.len() - 1]
        )),
    }
}

/// What to do when the driver (of CUDA `driver`) refused what NVRTC `nvrtc` compiled.
pub fn load_advice(nvrtc: Option<super::libs::Version>, driver: Option<super::libs::Version>) -> String {
    // The pip requirement of the NVRTC of CUDA `v` (CUDA 13's wheels dropped the suffix).
    let pip = |v: super::libs::Version| {
        let package = if v.major >= 13 { "nvidia-cuda-nvrtc".to_string() } else { format!("nvidia-cuda-nvrtc-cu{}", v.major) };
        format!("`pip install \"{package}=={}.{}.*\"`", v.major, v.minor)
    };
    match (nvrtc, driver) {
        (Some(n), Some(d)) if (n.major, n.minor) > (d.major, d.minor) => format!(
            "NVRTC {n} is newer than the driver (CUDA {d}): install an NVRTC of CUDA {d} or older ({}) and set RINGREC_CUDA_LIB_DIR to its directory, or update the NVIDIA driver to one for CUDA {n} or newer",
            pip(d)
        ),
        (_, Some(d)) => format!("update the NVIDIA driver, or install the NVRTC of the driver's CUDA {d} ({}) and set RINGREC_CUDA_LIB_DIR to its directory", pip(d)),
        _ => "update the NVIDIA driver, or install the NVRTC of the driver's CUDA version and set RINGREC_CUDA_LIB_DIR to its directory".into(),
    }
}

/// The functions of a CUBIN (an ELF file) and their code sizes in bytes, from its symbol
/// table; empty for anything else (PTX).
pub fn cubin_functions(image: &[u8]) -> Vec<(String, u64)> {
    elf_functions(image).unwrap_or_default()
}

fn elf_functions(b: &[u8]) -> Option<Vec<(String, u64)>> {
    let u16_at = |o: usize| b.get(o..o + 2).map(|s| u16::from_le_bytes([s[0], s[1]]));
    let u32_at = |o: usize| b.get(o..o + 4).map(|s| u32::from_le_bytes(s.try_into().unwrap()));
    let u64_at = |o: usize| b.get(o..o + 8).map(|s| u64::from_le_bytes(s.try_into().unwrap()));
    // 64-bit little-endian ELF only (what NVRTC writes).
    if b.get(..6)? != [0x7f, b'E', b'L', b'F', 2, 1] {
        return None;
    }
    let shoff = usize::try_from(u64_at(0x28)?).ok()?;
    let shentsize = u16_at(0x3a)? as usize;
    let shnum = u16_at(0x3c)? as usize;
    if shentsize < 64 {
        return None;
    }
    let section = |i: usize| -> Option<(u32, usize, usize, u32)> {
        let h = shoff.checked_add(i.checked_mul(shentsize)?)?;
        Some((u32_at(h + 4)?, usize::try_from(u64_at(h + 24)?).ok()?, usize::try_from(u64_at(h + 32)?).ok()?, u32_at(h + 40)?))
    };
    let mut out = Vec::new();
    for i in 0..shnum {
        let (kind, off, size, link) = section(i)?;
        if kind != 2 {
            continue; // SHT_SYMTAB
        }
        let (_, str_off, str_size, _) = section(link as usize)?;
        let strtab = b.get(str_off..str_off.checked_add(str_size)?)?;
        let syms = b.get(off..off.checked_add(size)?)?;
        for sym in syms.chunks_exact(24) {
            let (name, info) = (u32::from_le_bytes(sym[0..4].try_into().unwrap()) as usize, sym[4]);
            if info & 0xf != 2 {
                continue; // STT_FUNC
            }
            let len = u64::from_le_bytes(sym[16..24].try_into().unwrap());
            let name = strtab.get(name..)?.split(|c| *c == 0).next()?;
            out.push((String::from_utf8_lossy(name).into_owned(), len));
        }
    }
    Some(out)
}

/// One kernel source compiled for one target.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// The source (`kernels/<source>.cu`).
    pub source: &'static str,
    /// What was produced.
    pub target: Target,
    /// The CUBIN, or NUL-terminated PTX.
    pub image: Vec<u8>,
}

impl Compiled {
    /// Each kernel of the source and its code size in the CUBIN (`None` for PTX, or a
    /// kernel the CUBIN's symbol table does not list).
    pub fn kernels(&self) -> Vec<(Kernel, Option<u64>)> {
        let funcs = cubin_functions(&self.image);
        Kernel::ALL.into_iter().filter(|k| k.source() == self.source).map(|k| (k, funcs.iter().find(|(n, _)| n == k.name()).map(|(_, s)| *s))).collect()
    }
}

/// Every source compiled for `arch` with the options the GPU path uses — SASS, or PTX
/// when NVRTC does not know `arch` ([`target_for`]). Needs NVRTC, not a GPU.
#[cfg(feature = "cuda")]
pub fn compile_for(arch: Arch) -> Result<Vec<Compiled>, super::DeviceError> {
    super::probe_nvrtc()?;
    let target = target_for(arch, super::libs::libraries().nvrtc_archs()).map_err(|why| super::DeviceError::refused(format!("compiling the kernels for {arch}"), why))?;
    SOURCES
        .iter()
        .map(|(name, _)| {
            let src = device_source(name).expect("every source is listed");
            Ok(Compiled { source: name, target, image: compile_source(name, &src, target)? })
        })
        .collect()
}

/// Without the `cuda` feature there is no NVRTC.
#[cfg(not(feature = "cuda"))]
pub fn compile_for(_arch: Arch) -> Result<Vec<Compiled>, super::DeviceError> {
    Err(super::DeviceError::NotBuilt)
}

#[cfg(feature = "cuda")]
pub use loaded::{compile as compile_source, Kernels};

#[cfg(feature = "cuda")]
mod loaded {
    use std::collections::HashMap;
    use std::ffi::CString;
    use std::sync::Arc;

    use cudarc::driver::{CudaContext, CudaFunction, DriverError};
    use cudarc::nvrtc::{result, sys, Ptx};

    use super::{device_source, load_advice, target_for, Arch, Kernel, Target, SOURCES};
    use crate::device::libs::{libraries, CudaLib};
    use crate::device::{DeviceError, KernelLoadError};

    /// Every kernel, compiled by NVRTC for the context's device and loaded.
    pub struct Kernels {
        functions: HashMap<Kernel, CudaFunction>,
    }

    impl Kernels {
        /// Compiles and loads every source: SASS for the device, or PTX when NVRTC does not
        /// know its architecture. A source that fails to compile is reported with NVRTC's
        /// log ([`DeviceError::Kernel`]), one the driver refuses with both versions
        /// ([`DeviceError::KernelLoad`]).
        pub fn load(ctx: &Arc<CudaContext>) -> Result<Kernels, DeviceError> {
            let (major, minor) = ctx.compute_capability().map_err(|e| DeviceError::call("reading the device's compute capability", e))?;
            let device = Arch::from_capability(major, minor);
            crate::device::probe_nvrtc()?;
            let target = target_for(device, libraries().nvrtc_archs()).map_err(|why| DeviceError::refused(format!("compiling the kernels for this GPU ({device})"), why))?;
            let mut functions = HashMap::new();
            for (name, _) in SOURCES {
                let src = device_source(name).ok_or_else(|| DeviceError::Kernel { name: name.to_string(), log: "no such source".into() })?;
                let image = compile(name, &src, target)?;
                let module = ctx.load_module(Ptx::from_binary(image)).map_err(|e| load_error(name, target, e))?;
                for k in Kernel::ALL.into_iter().filter(|k| k.source() == *name) {
                    let func = module.load_function(k.name()).map_err(|e| DeviceError::call(format!("loading kernel {} of kernels/{name}.cu", k.name()), e))?;
                    functions.insert(k, func);
                }
            }
            Ok(Kernels { functions })
        }

        /// The loaded function of `k`.
        pub fn get(&self, k: Kernel) -> Result<&CudaFunction, DeviceError> {
            self.functions.get(&k).ok_or_else(|| DeviceError::Kernel { name: k.name().to_string(), log: "no kernel of that name was loaded".into() })
        }
    }

    /// The driver refused a module: both versions and what to install.
    fn load_error(name: &str, target: Target, e: DriverError) -> DeviceError {
        let libs = libraries();
        let version = |lib| libs.get(lib).found.as_ref().ok().and_then(|f| f.version);
        let advice = load_advice(version(CudaLib::Nvrtc), version(CudaLib::Driver));
        DeviceError::KernelLoad(Box::new(KernelLoadError { name: name.to_string(), target: target.to_string(), nvrtc: libs.describe(CudaLib::Nvrtc), driver: libs.describe(CudaLib::Driver), error: format!("{e:?}"), advice }))
    }

    /// Destroys the program when dropped.
    struct Program(sys::nvrtcProgram);

    impl Drop for Program {
        fn drop(&mut self) {
            // SAFETY: the program came from create_program and is destroyed once, here.
            let _ = unsafe { result::destroy_program(self.0) };
        }
    }

    /// Compiles one source for `target` with `--fmad=false` (the kernels' arithmetic rounds
    /// like the CPU path's): a CUBIN for [`Target::Sass`], NUL-terminated PTX for
    /// [`Target::Ptx`]. A failure carries NVRTC's log.
    pub fn compile(name: &str, src: &str, target: Target) -> Result<Vec<u8>, DeviceError> {
        crate::device::probe_nvrtc()?;
        let fail = |log: String| DeviceError::Kernel { name: name.to_string(), log };
        let csrc = CString::new(src).map_err(|_| fail("the source contains a NUL byte".into()))?;
        let cname = CString::new(format!("{name}.cu")).map_err(|_| fail("the name contains a NUL byte".into()))?;
        let prog = Program(result::create_program(&csrc, Some(&cname)).map_err(|e| fail(format!("nvrtcCreateProgram: {e:?}")))?);
        let options = ["--fmad=false".to_string(), target.option()];
        // SAFETY: the program is live; `csrc` and `cname`, which it may point into, outlive it.
        if let Err(e) = unsafe { result::compile_program(prog.0, &options) } {
            // SAFETY: as above.
            let log = unsafe { result::get_program_log(prog.0) }.map(|l| l.iter().take_while(|c| **c != 0).map(|c| *c as u8).collect::<Vec<u8>>()).unwrap_or_default();
            return Err(fail(format!("{e:?} with {}\n{}", options.join(" "), String::from_utf8_lossy(&log))));
        }
        match target {
            Target::Sass(_) => {
                let mut size = 0usize;
                // SAFETY: the program is live and compiled for a real architecture.
                unsafe { sys::nvrtcGetCUBINSize(prog.0, &mut size) }.result().map_err(|e| fail(format!("nvrtcGetCUBINSize: {e:?}")))?;
                let mut cubin = vec![0u8; size];
                // SAFETY: `cubin` holds the size NVRTC just reported.
                unsafe { sys::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr().cast()) }.result().map_err(|e| fail(format!("nvrtcGetCUBIN: {e:?}")))?;
                Ok(cubin)
            }
            Target::Ptx(_) => {
                // SAFETY: the program is live and compiled.
                let ptx = unsafe { result::get_ptx(prog.0) }.map_err(|e| fail(format!("nvrtcGetPTX: {e:?}")))?;
                Ok(ptx.into_iter().map(|c| c as u8).collect())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_is_defined_in_its_source_and_has_a_host_entry() {
        for k in Kernel::ALL {
            let src = device_source(k.source()).unwrap();
            assert!(src.starts_with(PRELUDE));
            assert!(src.contains(&format!("void {}(", k.name())), "{} missing from kernels/{}.cu", k.name(), k.source());
            assert!(host_source().contains(&format!("rr_launch_{}(void** a)", k.name())));
        }
        // Every extern "C" kernel in the sources is listed.
        let defined: usize = SOURCES.iter().map(|(_, s)| s.matches("extern \"C\" __global__").count()).sum();
        assert_eq!(defined, Kernel::ALL.len());
        assert!(device_source("nope").is_none());
        assert!(!host_source().contains("#include <cuda"), "kernels must not need CUDA headers");
    }

    #[test]
    fn architectures_parse_and_sass_is_chosen_when_nvrtc_knows_the_device() {
        for s in ["sm_80", "compute_80", "80", "8.0"] {
            assert_eq!(Arch::parse(s), Some(Arch(80)), "{s}");
        }
        assert_eq!(Arch::parse("sm_120"), Some(Arch(120)));
        assert_eq!(Arch::from_capability(9, 0).to_string(), "sm_90");
        assert_eq!(Arch::parse("sm_x"), None);
        assert_eq!(Arch::parse("8"), None);
        let nvrtc_12_8 = [50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90, 100, 101, 120];
        assert_eq!(target_for(Arch(90), &nvrtc_12_8), Ok(Target::Sass(Arch(90))));
        assert_eq!(Target::Sass(Arch(90)).option(), "--gpu-architecture=sm_90");
        // A GPU newer than NVRTC: PTX of the newest architecture below, which the driver compiles.
        assert_eq!(target_for(Arch(121), &nvrtc_12_8), Ok(Target::Ptx(Arch(120))));
        assert_eq!(Target::Ptx(Arch(120)).option(), "--gpu-architecture=compute_120");
        assert_eq!(target_for(Arch(103), &[75, 80, 90, 100]), Ok(Target::Ptx(Arch(100))));
        // Older than anything NVRTC knows (CUDA 13 dropped sm_70).
        let e = target_for(Arch(70), &[75, 80, 90, 100, 120]).unwrap_err();
        assert!(e.contains("sm_75 to sm_120") && e.contains("not for sm_70") && e.contains("RINGREC_CUDA_LIB_DIR"), "{e}");
        // An NVRTC that cannot list its architectures is asked for SASS.
        assert_eq!(target_for(Arch(80), &[]), Ok(Target::Sass(Arch(80))));
    }

    #[test]
    fn a_refused_module_says_which_nvrtc_to_install() {
        use crate::device::libs::Version;
        let v = |major, minor| Some(Version { major, minor, patch: None });
        let a = load_advice(v(12, 8), v(12, 4));
        assert!(a.starts_with("NVRTC 12.8 is newer than the driver (CUDA 12.4)") && a.contains("pip install \"nvidia-cuda-nvrtc-cu12==12.4.*\"") && a.contains("RINGREC_CUDA_LIB_DIR"), "{a}");
        let a = load_advice(v(13, 0), v(12, 8));
        assert!(a.contains("nvidia-cuda-nvrtc-cu12==12.8.*") && a.contains("update the NVIDIA driver to one for CUDA 13.0"), "{a}");
        assert!(load_advice(v(13, 1), v(13, 0)).contains("`pip install \"nvidia-cuda-nvrtc==13.0.*\"`"));
        assert!(load_advice(v(12, 4), v(12, 8)).starts_with("update the NVIDIA driver, or install the NVRTC of the driver's CUDA 12.8"));
        let e = crate::device::DeviceError::KernelLoad(Box::new(crate::device::KernelLoadError {
            name: "dense".into(),
            target: Target::Ptx(Arch(90)).to_string(),
            nvrtc: "12.8 (/x/libnvrtc.so.12)".into(),
            driver: "12.4 (/usr/lib/libcuda.so.1)".into(),
            error: "DriverError(CUDA_ERROR_UNSUPPORTED_PTX_VERSION, \"the provided PTX was compiled with an unsupported toolchain.\")".into(),
            advice: load_advice(v(12, 8), v(12, 4)),
        }));
        let msg = e.to_string();
        assert!(msg.starts_with("the driver could not load kernels/dense.cu (PTX for compute_90 from NVRTC 12.8 (/x/libnvrtc.so.12); driver for CUDA 12.4 (/usr/lib/libcuda.so.1)): DriverError(CUDA_ERROR_UNSUPPORTED_PTX_VERSION"), "{msg}");
    }

    #[test]
    fn elf_function_sizes_come_from_the_symbol_table_and_anything_else_has_none() {
        // This test binary is an ELF file with a symbol table (debug build, not stripped).
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let funcs = cubin_functions(&exe);
        assert!(funcs.iter().filter(|(_, size)| *size > 0).count() > 100, "{} functions", funcs.len());
        assert!(cubin_functions(b"//\n// Generated by NVIDIA NVVM Compiler\n.version 8.7\n\0").is_empty());
        assert!(cubin_functions(&exe[..100.min(exe.len())]).is_empty(), "a truncated file is refused, not read past its end");
        assert!(cubin_functions(&[]).is_empty());
    }
}
