//! `ringrec info`: this rank's topology, the CUDA libraries (where each was found, or why
//! not, and its version), whether a GPU path is available, and on request the kernels
//! compiled to SASS for given architectures (no GPU needed).

use anyhow::Context;
use ringrec::device::kernels::{self, Arch};
use ringrec::device::libs::{self, CudaLib};
use ringrec::device::Placement;
use ringrec::topology::Topology;

/// Flags of `ringrec info`.
#[derive(clap::Args, Debug, Clone)]
pub struct InfoArgs {
    /// Only the CUDA libraries and the GPU path: no MPI start, no topology.
    #[arg(long)]
    pub libs: bool,
    /// Also compile every kernel with NVRTC for these architectures (comma-separated:
    /// sm_80,sm_90) and print each kernel's size in the CUBIN. Needs NVRTC, not a GPU;
    /// implies --libs.
    #[arg(long, value_delimiter = ',', value_name = "ARCHS")]
    pub compile_kernels: Vec<String>,
    /// Exit with an error unless these libraries are usable (comma-separated: driver,
    /// nvrtc, cublas, nccl); for scripts and image builds.
    #[arg(long, value_delimiter = ',', value_name = "LIBS")]
    pub require: Vec<String>,
    /// Only print the table of every RINGREC_* variable (name, default, who reads it,
    /// what it does) and which of them this environment sets: the table of
    /// docs/configuration.md.
    #[arg(long)]
    pub variables: bool,
}

fn lib_named(s: &str) -> Option<CudaLib> {
    match s.trim() {
        "driver" | "cuda" | "libcuda" => Some(CudaLib::Driver),
        "nvrtc" | "libnvrtc" => Some(CudaLib::Nvrtc),
        "cublas" | "libcublas" => Some(CudaLib::Cublas),
        "nccl" | "libnccl" => Some(CudaLib::Nccl),
        _ => None,
    }
}

/// Runs `ringrec info`.
pub fn run(args: &InfoArgs) -> anyhow::Result<()> {
    if args.variables {
        print!("{}", ringrec::config::variables_table());
        let set: Vec<String> = ringrec::config::VARIABLES.iter().filter_map(|v| ringrec::config::var(v.name).map(|x| format!("{}={x}", v.name))).collect();
        println!("\nset here: {}", if set.is_empty() { "none".to_string() } else { set.join(" ") });
        return Ok(());
    }
    let archs: Vec<Arch> = args.compile_kernels.iter().filter(|s| !s.trim().is_empty()).map(|s| Arch::parse(s).with_context(|| format!("--compile-kernels: `{s}` is not an architecture (sm_80, sm_90, ...)"))).collect::<anyhow::Result<_>>()?;
    let required: Vec<CudaLib> = args.require.iter().filter(|s| !s.trim().is_empty()).map(|s| lib_named(s).with_context(|| format!("--require: `{s}` is not one of driver, nvrtc, cublas, nccl"))).collect::<anyhow::Result<_>>()?;
    let topo = if args.libs || !archs.is_empty() {
        None
    } else {
        let topo = Topology::init()?;
        println!("{}", topo.describe());
        println!("job id {}", topo.job_id);
        Some(topo)
    };
    let libs = libs::libraries();
    let build = if cfg!(feature = "cuda") { "this build has CUDA support" } else { "this build has NO CUDA support (rebuild with --features cuda to use them)" };
    let set = ringrec::config::var(libs::LIB_DIR_VAR).map(|v| format!("{}={v}", libs::LIB_DIR_VAR)).unwrap_or_else(|| format!("{} not set", libs::LIB_DIR_VAR));
    println!("CUDA libraries ({build}; {set}):");
    print!("{}", libs.report());
    match (ringrec::device::probe(), &topo) {
        (Ok(i), Some(topo)) => match Placement::Cuda(None).resolve(topo.machine_local_rank, topo.size) {
            Ok(Placement::Cuda(Some(g))) => println!("cuda: {} device(s); this rank would train on GPU {g}", i.devices),
            Ok(_) => println!("cuda: {} device(s)", i.devices),
            Err(e) => println!("cuda: {} device(s), but: {e}", i.devices),
        },
        (Ok(i), None) => println!("cuda: {} device(s)", i.devices),
        (Err(e), _) => println!("cuda: unavailable: {e}"),
    }
    let missing: Vec<String> = required.iter().filter_map(|l| libs.require(*l).err()).map(|e| e.to_string()).collect();
    if !required.is_empty() && !cfg!(feature = "cuda") {
        anyhow::bail!("--require: {}", ringrec::device::DeviceError::NotBuilt);
    }
    if !missing.is_empty() {
        anyhow::bail!("--require: {}", missing.join("\n"));
    }
    if !archs.is_empty() {
        compile(&archs)?;
    }
    Ok(())
}

/// Compiles every kernel for each architecture and prints the sizes.
fn compile(archs: &[Arch]) -> anyhow::Result<()> {
    ringrec::device::probe_nvrtc().context("--compile-kernels")?;
    let nvrtc = libs::libraries().describe(CudaLib::Nvrtc);
    println!("kernels compiled by NVRTC {nvrtc} with --fmad=false:");
    for arch in archs {
        let t = std::time::Instant::now();
        let compiled = kernels::compile_for(*arch).with_context(|| format!("compiling the kernels for {arch}"))?;
        let total: usize = compiled.iter().map(|c| c.image.len()).sum();
        let kind = compiled.first().map(|c| c.target.to_string()).unwrap_or_default();
        println!("  {arch}: {kind}, {} modules, {total} bytes, {:.2} s", compiled.len(), t.elapsed().as_secs_f64());
        for c in &compiled {
            println!("    kernels/{}.cu: {} bytes of {}", c.source, c.image.len(), if matches!(c.target, kernels::Target::Sass(_)) { "CUBIN" } else { "PTX" });
            for (k, size) in c.kernels() {
                match size {
                    Some(s) => println!("      {:<16} {s:>6} bytes of SASS", k.name()),
                    None => println!("      {:<16}      - (not in a symbol table)", k.name()),
                }
            }
        }
    }
    Ok(())
}
