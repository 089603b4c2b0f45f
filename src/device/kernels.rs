//! The CUDA C kernel sources (kernels/*.cu), embedded in the binary so an installed
//! `ringrec` needs no source tree, the [`Kernel`] list, and (feature `cuda`) their NVRTC
//! compilation.
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
}

impl Kernel {
    /// Every kernel.
    pub const ALL: [Kernel; 14] = [
        Kernel::GatherRows,
        Kernel::CopyColumns,
        Kernel::BiasAct,
        Kernel::ReluGrad,
        Kernel::ColumnSum,
        Kernel::BceWithLogits,
        Kernel::Sum,
        Kernel::SegmentSum,
        Kernel::SgdUpdate,
        Kernel::AdamUpdate,
        Kernel::F32ToF16,
        Kernel::F32ToBf16,
        Kernel::F16ToF32,
        Kernel::Bf16ToF32,
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
            Kernel::Sum => "sum",
            Kernel::SegmentSum => "segment_sum",
            Kernel::SgdUpdate => "sgd_update",
            Kernel::AdamUpdate => "adam_update",
            Kernel::F32ToF16 => "f32_to_f16",
            Kernel::F32ToBf16 => "f32_to_bf16",
            Kernel::F16ToF32 => "f16_to_f32",
            Kernel::Bf16ToF32 => "bf16_to_f32",
        }
    }

    /// The file (kernels/<source>.cu) that defines it.
    pub fn source(self) -> &'static str {
        match self {
            Kernel::SgdUpdate | Kernel::AdamUpdate => "optim",
            Kernel::F32ToF16 | Kernel::F32ToBf16 | Kernel::F16ToF32 | Kernel::Bf16ToF32 => "cast",
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

#[cfg(feature = "cuda")]
pub use loaded::{compile as compile_source, Kernels};

#[cfg(feature = "cuda")]
mod loaded {
    use std::collections::HashMap;
    use std::sync::Arc;

    use cudarc::driver::{CudaContext, CudaFunction};
    use cudarc::nvrtc::{CompileError, CompileOptions};

    use super::{device_source, Kernel, SOURCES};
    use crate::device::DeviceError;

    /// Every kernel, compiled by NVRTC for the context's device and loaded.
    pub struct Kernels {
        functions: HashMap<Kernel, CudaFunction>,
    }

    impl Kernels {
        /// Compiles and loads every source. A source that fails to compile is reported with
        /// NVRTC's log ([`DeviceError::Kernel`]).
        pub fn load(ctx: &Arc<CudaContext>) -> Result<Kernels, DeviceError> {
            let (major, minor) = ctx.compute_capability().map_err(|e| DeviceError::call("reading the device's compute capability", e))?;
            // PTX for the device's virtual architecture; the driver JIT-compiles it.
            let arch = format!("--gpu-architecture=compute_{major}{minor}");
            let mut functions = HashMap::new();
            for (name, _) in SOURCES {
                let src = device_source(name).ok_or_else(|| DeviceError::Kernel { name: name.to_string(), log: "no such source".into() })?;
                let ptx = compile(name, &src, &arch)?;
                let module = ctx.load_module(ptx).map_err(|e| DeviceError::call(format!("loading the module of kernels/{name}.cu"), e))?;
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

    /// Compiles one source to PTX; a failure carries NVRTC's log.
    pub fn compile(name: &str, src: &str, arch: &str) -> Result<cudarc::nvrtc::Ptx, DeviceError> {
        // fmad off: the kernels' arithmetic rounds like the CPU path's.
        let opts = CompileOptions { fmad: Some(false), options: vec![arch.to_string()], name: Some(format!("{name}.cu")), ..Default::default() };
        cudarc::nvrtc::compile_ptx_with_opts(src, opts).map_err(|e| match e {
            CompileError::CompileError { log, .. } => DeviceError::Kernel { name: name.to_string(), log: log.to_string_lossy().into_owned() },
            other => DeviceError::Kernel { name: name.to_string(), log: format!("{other:?}") },
        })
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
}
