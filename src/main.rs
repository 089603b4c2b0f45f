//! The `ringrec` command line: clap definitions and dispatch only.

mod cli;

use anyhow::Context;
use clap::{Parser, Subcommand};

use ringrec::comm::{self, Backend, CollectivesExt};
use ringrec::topology::Topology;

#[derive(Parser)]
#[command(name = "ringrec", version, about = "Horovod-style data-parallel CTR training with a host-shared embedding table.\nLaunch with `mpirun -np N ringrec ...`; without mpirun it is a world of one rank.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process: the size of `train`'s flags does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Print every rank's topology and run an allreduce on each backend (the quick-start job).
    Demo,
    /// Run a ringrec command on N ranks with mpirun (binding, signals, restarts):
    /// `ringrec launch -np 4 --restarts 2 -- train --checkpoint-dir ckpt ...`.
    Launch(cli::launch::LaunchArgs),
    /// Train the CTR model (data-parallel; run under mpirun for several ranks). Without
    /// --data it trains on a synthetic Criteo-format set that it generates once.
    Train(cli::train::TrainArgs),
    /// Score rows with a trained model (a checkpoint directory or an export bundle) on every
    /// rank: `score<TAB>label` lines in row order (--out), AUC and log loss.
    Predict(cli::predict::PredictArgs),
    /// Write a checkpoint as a self-describing serving bundle (model.json, dense.bin,
    /// table.bin), readable without ringrec (scripts/bundle_predict.py).
    Export(cli::export::ExportArgs),
    /// Print this rank's topology, the CUDA libraries (where each was found and its
    /// version) and whether a GPU path is available; --compile-kernels compiles every
    /// kernel to SASS for given architectures (no GPU needed).
    Info(cli::info::InfoArgs),
    /// Prepare, generate and inspect training data (Criteo format).
    #[command(subcommand)]
    Data(cli::data::DataCommand),
    /// Create, import, export and inspect embedding table files.
    #[command(subcommand)]
    Table(cli::table::TableCommand),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Remove what killed jobs left behind: shared segments and host tables in the
    /// shared-memory directory, interrupted writes in checkpoint and data directories
    /// (`ringrec clean ckpt ~/.cache/ringrec`). Never a file of a live job.
    Clean(cli::clean::CleanArgs),
    /// The job service: an HTTP API and a live dashboard that submit, watch and kill
    /// `ringrec train` jobs on this machine or a Slurm cluster, with records that survive
    /// restarts (`ringrec serve --state-dir DIR`; `ringrec serve token add NAME --state-dir DIR`).
    Serve(cli::serve::ServeArgs),
    /// The online scoring service: loads a bundle or a checkpoint directory's newest good
    /// checkpoint and answers `POST /v1/score` (JSON rows or Criteo lines), `/metrics`;
    /// `--watch` swaps in newer models (`ringrec serve-model --model DIR --listen ADDR`).
    ServeModel(cli::serve_model::ServeModelArgs),
}

#[derive(Subcommand)]
enum BenchCommand {
    /// nccl-tests style allreduce table for every CPU backend, `mpi` as the reference.
    Allreduce(cli::bench::allreduce::AllreduceBenchArgs),
    /// The engine on ResNet-50-shaped gradients: fused vs one flat allreduce vs unfused.
    Engine(cli::bench::engine::EngineBenchArgs),
    /// What integrity costs a checkpoint: write and verify at N table rows, the checksums' share.
    Checkpoint(cli::bench::checkpoint::CheckpointBenchArgs),
    /// Embedding table lookups/updates vs a per-rank HashMap.
    Embedding(cli::bench::embedding::EmbeddingBenchArgs),
    /// The MLP's SGEMMs: the gemm crate vs OpenBLAS, and the MLP vs plain SGEMM.
    Gemm(cli::bench::gemm::GemmBenchArgs),
    /// Many distinct keys through a table that starts small: each growth's pause vs a step.
    Growth(cli::bench::growth::GrowthBenchArgs),
    /// Hierarchical vs flat sparse gradient exchange (time and cross-host bytes).
    Sparse(cli::bench::sparse::SparseBenchArgs),
    /// The host-side work of a training step without the dense model (the GPU path's
    /// ceiling): samples/s per host, phases, and the memcpy roofline.
    Step(cli::bench::step::StepBenchArgs),
}

fn main() {
    let cli = Cli::parse_from(cli::launch::mpirun_spelling(std::env::args().collect()));
    if let Err(e) = run(cli) {
        cli::fail(&e, None);
    }
}

/// Runs `f` with MPI up; an error is printed while MPI still is, and ends the job at once
/// (`MPI_Abort`), so no rank waits in MPI_Finalize for a peer that already failed.
fn with_mpi(f: impl FnOnce(&Topology) -> anyhow::Result<()>) -> anyhow::Result<()> {
    let topo = Topology::init().context("starting MPI")?;
    // After MPI_Init, which may install handlers of its own.
    ringrec::signals::install();
    match f(&topo) {
        Ok(()) => Ok(()),
        // A signal stopped every rank after the same step: an orderly end, status 128+sig.
        Err(e) => match e.downcast_ref::<ringrec::train::TrainError>() {
            Some(ringrec::train::TrainError::Stopped { signal, .. }) => {
                if topo.rank == 0 {
                    ringrec::eprint_line(&format!("ringrec: {e}"));
                }
                let code = 128 + signal;
                drop(topo);
                std::process::exit(code)
            }
            // Every rank found it at the same step (the data is the same everywhere).
            Some(ringrec::train::TrainError::NonFinite { .. }) => {
                if topo.rank == 0 {
                    ringrec::eprint_line(&format!("ringrec: error: {e}"));
                }
                drop(topo);
                std::process::exit(1)
            }
            _ => cli::fail(&e, Some(&topo)),
        },
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Demo => with_mpi(demo),
        Command::Launch(args) => std::process::exit(cli::launch::run(&args)?),
        Command::Train(args) => with_mpi(|topo| cli::train::run(topo, &args)),
        Command::Predict(args) => with_mpi(|topo| cli::predict::run(topo, &args)),
        Command::Export(args) => cli::export::run(&args),
        Command::Info(args) => cli::info::run(&args),
        Command::Table(cli::table::TableCommand::Hold(a)) => with_mpi(|topo| cli::table::hold(topo, &a)),
        Command::Table(cmd) => cli::table::run(cmd),
        Command::Data(cmd) => cli::data::run(cmd),
        Command::Clean(args) => cli::clean::run(&args),
        Command::Serve(args) => std::process::exit(cli::serve::run(&args)?),
        Command::ServeModel(args) => cli::serve_model::run(&args),
        Command::Bench(BenchCommand::Embedding(args)) => cli::bench::embedding::run(args),
        Command::Bench(BenchCommand::Checkpoint(args)) => cli::bench::checkpoint::run(&args),
        Command::Bench(BenchCommand::Engine(args)) => with_mpi(|topo| cli::bench::engine::run(topo, &args).map(|_| ())),
        Command::Bench(BenchCommand::Gemm(args)) => cli::bench::gemm::run(&args),
        Command::Bench(BenchCommand::Growth(args)) => cli::bench::growth::run(args),
        Command::Bench(BenchCommand::Sparse(args)) => with_mpi(|topo| cli::bench::sparse::run(topo, &args).map(|_| ())),
        Command::Bench(BenchCommand::Step(args)) => with_mpi(|topo| cli::bench::step::run(topo, &args).map(|_| ())),
        Command::Bench(BenchCommand::Allreduce(args)) => with_mpi(|topo| cli::bench::allreduce::run(topo, &args).map(|_| ())),
    }
}

fn demo(topo: &Topology) -> anyhow::Result<()> {
    let mut world = comm::build(Backend::Mpi, topo)?;
    let lines = world.gatherv(topo.describe().as_bytes(), 0)?;
    if let Some((bytes, counts)) = lines {
        println!("ringrec demo: {} rank(s) on {} host(s), job {}", topo.size, topo.num_hosts, topo.job_id);
        let mut at = 0;
        for c in counts {
            println!("  {}", String::from_utf8_lossy(&bytes[at..at + c]));
            at += c;
        }
        match ringrec::device::probe() {
            Ok(i) => println!("cuda: {} device(s) visible", i.devices),
            Err(e) => println!("cuda: {e}"),
        }
    }
    let n = topo.size as f32;
    let want = n * (n + 1.0) / 2.0;
    for backend in Backend::ALL {
        match comm::build(backend, topo) {
            Ok(mut c) => {
                let mut v = vec![topo.rank as f32 + 1.0; 1 << 20];
                let t = std::time::Instant::now();
                c.allreduce(&mut v, ringrec::dtype::ReduceOp::Sum)?;
                let dt = t.elapsed();
                let ok = v.iter().all(|x| *x == want);
                if topo.rank == 0 {
                    println!(
                        "allreduce(sum of rank+1) over 4 MiB with {:<4}: every element = {} (expected {}) {} in {:.2} ms",
                        backend.name(),
                        v[0],
                        want,
                        if ok { "OK" } else { "WRONG" },
                        dt.as_secs_f64() * 1e3
                    );
                }
                if !ok {
                    anyhow::bail!("backend {backend} gave a wrong allreduce result");
                }
            }
            Err(e) => {
                if topo.rank == 0 {
                    println!("allreduce with {:<4}: skipped: {e}", backend.name());
                }
            }
        }
    }
    Ok(())
}
