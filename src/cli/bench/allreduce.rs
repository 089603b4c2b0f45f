//! `ringrec bench allreduce`: an nccl-tests style table (size, count, type, redop, time,
//! algbw, busbw, #wrong) for every backend, `mpi` measured in the same run as the reference.
//!
//! time = mean over iterations of one in-place allreduce, the slowest rank's figure;
//! algbw = size / time; busbw = algbw * 2(n-1)/n (the bytes each rank must move in a ring,
//! so figures are comparable across rank counts). #wrong validates every element of a
//! fresh allreduce per size against the exact expected value, summed over ranks.
//!
//! `--reference FILE` adds the rows of an independent reference measured by the same rules
//! (scripts/bench/allreduce_ref.c: in-place MPI_Allreduce in C, sharing no code with
//! ringrec; run by scripts/bench/allreduce.sh right before and after this command). The
//! summary compares the best ringrec backend with the better of the two MPI references.

use std::time::Instant;

use mpi::collective::{CommunicatorCollectives, SystemOperation};
use anyhow::Context;
use serde::Serialize;

use ringrec::comm::nccl::NcclComm;
use ringrec::comm::{self, Backend, DeviceCollectives, HostCollectives};
use ringrec::device::{CpuDevice, CudaDevice, Device, Placement, Scalar};
use ringrec::dtype::{DType, Element, ReduceOp};
use ringrec::topology::Topology;

/// Flags of `ringrec bench allreduce`.
#[derive(clap::Args, Debug, Clone)]
pub struct AllreduceBenchArgs {
    /// Backends to measure, comma separated: mpi, ring, shm, hier, nccl (GPU buffers; needs
    /// the `cuda` feature and one GPU per rank). mpi is always measured first, as the
    /// reference.
    #[arg(long, alias = "backend", default_value = "mpi,ring,shm,hier", value_delimiter = ',')]
    pub backends: Vec<String>,
    /// Smallest message (bytes; K/M/G suffixes).
    #[arg(short = 'b', long, default_value = "8", value_parser = parse_size)]
    pub min_bytes: usize,
    /// Largest message (bytes; K/M/G suffixes).
    #[arg(short = 'e', long, default_value = "256M", value_parser = parse_size)]
    pub max_bytes: usize,
    /// Size multiplication factor between rows.
    #[arg(short = 'f', long, default_value_t = 2)]
    pub step_factor: usize,
    /// Element type: f32, f64, f16, bf16, i32, i64.
    #[arg(short = 'd', long, default_value = "f32")]
    pub dtype: String,
    /// Reduction: sum, avg, min, max.
    #[arg(short = 'o', long, default_value = "sum")]
    pub op: String,
    /// Timed iterations per size. Small sizes run more (until 8 MiB moved, at most 1000) so
    /// one scheduler hiccup cannot dominate; large ones fewer (at most 2 GiB moved, at least 3).
    #[arg(short = 'n', long, default_value_t = 20)]
    pub iters: usize,
    /// Untimed warm-up iterations per size.
    #[arg(short = 'w', long, default_value_t = 3)]
    pub warmup: usize,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also write the report (every row, the reference's too) as JSON to this file.
    #[arg(long)]
    pub json_out: Option<std::path::PathBuf>,
    /// Rows of an independent reference (JSON, one row per line, e.g. from
    /// scripts/bench/allreduce_ref.c), printed in the table and used in the summary.
    #[arg(long)]
    pub reference: Option<std::path::PathBuf>,
}

/// Parses `8`, `4K`, `16M`, `1G` (powers of 1024).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (num, mul) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1usize << 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 1 << 20),
        Some('g' | 'G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().map(|n| n * mul).map_err(|_| format!("`{s}` is not a size like 8, 4K, 16M or 1G"))
}

/// One row of the table.
#[derive(Serialize, serde::Deserialize, Debug, Clone)]
pub struct Row {
    /// Backend name.
    pub backend: String,
    /// Message size in bytes.
    pub size: usize,
    /// Elements.
    pub count: usize,
    /// dtype name.
    #[serde(rename = "type")]
    pub dtype: String,
    /// Reduction name.
    pub redop: String,
    /// Mean time per allreduce, slowest rank, microseconds.
    pub time_us: f64,
    /// size / time, GB/s.
    pub algbw: f64,
    /// algbw * 2(n-1)/n, GB/s.
    pub busbw: f64,
    /// Wrong elements over all ranks.
    pub wrong: u64,
}

/// The whole run.
#[derive(Serialize, Debug)]
pub struct Report {
    /// World size.
    pub ranks: usize,
    /// Hosts (simulated ones count).
    pub hosts: usize,
    /// Every measured row.
    pub rows: Vec<Row>,
    /// Backends skipped, with the reason.
    pub skipped: Vec<(String, String)>,
}

/// Rank r's value at index i: small integers, so every summation order is exact in every dtype.
pub fn pattern(i: usize, rank: usize) -> f64 {
    ((i.wrapping_mul(7) + rank * 3) % 8) as f64 - 3.0
}

/// Writes the pattern of `rank` into `buf`.
pub fn fill<T: Element>(buf: &mut [T], rank: usize) {
    buf.iter_mut().enumerate().for_each(|(i, x)| *x = T::from_f64(pattern(i, rank)));
}

/// The exact expected result at index i of an allreduce of the pattern over `n` ranks,
/// as `dtype` computes it (sum, then one division for avg).
pub fn expected(i: usize, n: usize, dtype: DType, op: ReduceOp) -> f64 {
    let vals = (0..n).map(|r| pattern(i, r));
    let combined = match op {
        ReduceOp::Sum | ReduceOp::Average => vals.sum::<f64>(),
        ReduceOp::Min => vals.fold(f64::INFINITY, f64::min),
        ReduceOp::Max => vals.fold(f64::NEG_INFINITY, f64::max),
    };
    if op != ReduceOp::Average {
        return combined;
    }
    match dtype {
        DType::I32 | DType::I64 => ((combined as i64) / n as i64) as f64,
        DType::F64 => combined / n as f64,
        _ => (combined as f32 / n as f32) as f64,
    }
}

/// Counts elements of `buf` that differ from [`expected`].
pub fn count_wrong<T: Element>(buf: &[T], op: ReduceOp, n: usize) -> u64 {
    buf.iter().enumerate().filter(|(i, x)| **x != T::from_f64(expected(*i, n, T::DTYPE, op))).count() as u64
}

fn sizes(args: &AllreduceBenchArgs, esz: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut s = args.min_bytes.max(esz);
    let f = args.step_factor.max(2);
    while s <= args.max_bytes {
        out.push(s / esz * esz);
        s *= f;
    }
    out
}

/// Timed iterations for a row of `size` bytes (see `--iters`).
pub fn iterations(iters: usize, size: usize) -> usize {
    let size = size.max(1);
    let small = ((8usize << 20) / size).min(1000);
    let large = ((2usize << 30) / size).max(3);
    iters.max(small).min(large.max(1)).max(1)
}

/// One row: an in-place allreduce of `size` bytes of `T` on `dev`'s memory with `coll`
/// (the mean over the timed iterations, the slowest rank's), validated afterwards.
fn measure<D: Device, C: DeviceCollectives<D>, T: Scalar + Element>(topo: &Topology, dev: &D, coll: &mut C, args: &AllreduceBenchArgs, op: ReduceOp, size: usize) -> anyhow::Result<Row> {
    let (world, n, dtype) = (&topo.world.comm, topo.size, T::DTYPE);
    let count = size / dtype.size();
    let mut host = vec![T::zeroed(); count];
    fill(&mut host, topo.rank);
    let mut buf = dev.buffer_from(&host)?;
    let iters = iterations(args.iters, size);
    for _ in 0..args.warmup.min(iters) {
        coll.allreduce(dev, &mut buf, 0, count, op)?;
    }
    coll.wait(dev)?;
    world.barrier();
    let t0 = Instant::now();
    for _ in 0..iters {
        coll.allreduce(dev, &mut buf, 0, count, op)?;
    }
    coll.wait(dev)?;
    let local = t0.elapsed().as_secs_f64() / iters as f64;
    let mut slowest = 0f64;
    world.all_reduce_into(&local, &mut slowest, SystemOperation::max());
    // Validation on fresh input.
    dev.write(&host, &mut buf, 0)?;
    coll.allreduce(dev, &mut buf, 0, count, op)?;
    coll.wait(dev)?;
    dev.read(&buf, 0, &mut host)?;
    let wrong_here = count_wrong(&host, op, n);
    let mut wrong = 0u64;
    world.all_reduce_into(&wrong_here, &mut wrong, SystemOperation::sum());
    let algbw = size as f64 / slowest / 1e9;
    let busbw = if n > 1 { algbw * 2.0 * (n - 1) as f64 / n as f64 } else { 0.0 };
    Ok(Row { backend: coll.name().to_string(), size, count, dtype: dtype.name().to_string(), redop: op.name().to_string(), time_us: slowest * 1e6, algbw, busbw, wrong })
}

/// Every size of the run on one backend; prints the rows on rank 0.
fn table<D: Device, C: DeviceCollectives<D>>(topo: &Topology, dev: &D, coll: &mut C, args: &AllreduceBenchArgs, dtype: DType, op: ReduceOp, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let print = topo.rank == 0 && !args.json;
    if print {
        print_head(coll.name());
    }
    for size in sizes(args, dtype.size()) {
        let row = match dtype {
            DType::F32 => measure::<D, C, f32>(topo, dev, coll, args, op, size),
            DType::F64 => measure::<D, C, f64>(topo, dev, coll, args, op, size),
            DType::F16 => measure::<D, C, half::f16>(topo, dev, coll, args, op, size),
            DType::BF16 => measure::<D, C, half::bf16>(topo, dev, coll, args, op, size),
            DType::I32 => measure::<D, C, i32>(topo, dev, coll, args, op, size),
            DType::I64 => measure::<D, C, i64>(topo, dev, coll, args, op, size),
            DType::U8 => anyhow::bail!("uint8 is not reducible"),
        }?;
        if print {
            print_row(&row);
        }
        rows.push(row);
    }
    Ok(())
}

fn print_head(backend: &str) {
    println!("\n# backend: {backend}");
    println!("#{:>11} {:>12} {:>8} {:>6} {:>10} {:>8} {:>8} {:>7}", "size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong");
    println!("#{:>11} {:>12} {:>8} {:>6} {:>10} {:>8} {:>8} {:>7}", "(B)", "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)", "");
}

fn print_row(row: &Row) {
    println!("{:>12} {:>12} {:>8} {:>6} {:>10.2} {:>8.3} {:>8.3} {:>7}", row.size, row.count, row.dtype, row.redop, row.time_us, row.algbw, row.busbw, row.wrong);
}

/// The reference rows in `path` (one JSON row per line), on rank 0.
fn reference_rows(path: &std::path::Path) -> anyhow::Result<Vec<Row>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading the reference rows {}", path.display()))?;
    text.lines().filter(|l| !l.trim().is_empty()).enumerate().map(|(i, l)| serde_json::from_str(l).with_context(|| format!("{}:{}: not a row", path.display(), i + 1))).collect()
}

/// A backend to measure: a CPU one (on the CPU device's memory) or NCCL (on the rank's GPU).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Choice {
    Cpu(Backend),
    Nccl,
}

/// The rank's GPU (`machine_local_rank % visible GPUs`).
fn gpu(topo: &Topology) -> Result<CudaDevice, ringrec::device::DeviceError> {
    match Placement::Cuda(None).resolve(topo.machine_local_rank, topo.size)? {
        Placement::Cuda(Some(ordinal)) => CudaDevice::new(ordinal),
        _ => Err(ringrec::device::DeviceError::NoDevice("no GPU was chosen".into())),
    }
}

/// Runs the benchmark; prints on rank 0. Returns the report (on every rank).
pub fn run(topo: &Topology, args: &AllreduceBenchArgs) -> anyhow::Result<Report> {
    let dtype = DType::parse(&args.dtype).filter(|d| *d != DType::U8).ok_or_else(|| anyhow::anyhow!("--dtype {} is not one of f32, f64, f16, bf16, i32, i64", args.dtype))?;
    let op = ReduceOp::parse(&args.op).ok_or_else(|| anyhow::anyhow!("--op {} is not one of sum, avg, min, max", args.op))?;
    let mut backends = vec![Choice::Cpu(Backend::Mpi)];
    for b in &args.backends {
        let b = match b.trim() {
            "nccl" => Choice::Nccl,
            other => Choice::Cpu(Backend::parse(other).ok_or_else(|| anyhow::anyhow!("unknown backend `{b}`; choose from mpi, ring, shm, hier, nccl"))?),
        };
        if !backends.contains(&b) {
            backends.push(b);
        }
    }
    let root = topo.rank == 0;
    let mut report = Report { ranks: topo.size, hosts: topo.num_hosts, rows: Vec::new(), skipped: Vec::new() };
    if root && !args.json {
        println!("# ringrec bench allreduce: {} ranks on {} host(s), {} {}, in place", topo.size, topo.num_hosts, dtype.name(), op.name());
        println!("# busbw = algbw * 2(n-1)/n; time = mean of the slowest rank; #wrong over all ranks");
    }
    for choice in backends {
        let backend = match choice {
            Choice::Cpu(b) => b.to_string(),
            Choice::Nccl => "nccl".to_string(),
        };
        // Start-up is collective (NCCL's especially): every rank has its backend or all skip.
        let ran = match choice {
            Choice::Cpu(b) => topo.agree(comm::build(b, topo).map_err(|e| e.to_string())).map(|c| table(topo, &CpuDevice::new(1), &mut HostCollectives::new(c), args, dtype, op, &mut report.rows)),
            Choice::Nccl => topo.agree(gpu(topo).map_err(|e| format!("rank {}: {e}", topo.rank))).map(|dev| {
                let bus = dev.pci_bus_id().unwrap_or_else(|e| format!("unknown to rank {} ({e})", topo.rank));
                ringrec::device::select::check_distinct(topo, &bus, topo.config.allow_shared_gpu)?;
                let mut nccl = NcclComm::new(topo, &dev)?;
                table(topo, &dev, &mut nccl, args, dtype, op, &mut report.rows)
            }),
        };
        match ran {
            Ok(done) => done?,
            Err(e) => {
                if root && !args.json {
                    println!("\n# backend {backend}: skipped ({e})");
                }
                report.skipped.push((backend, e.to_string()));
            }
        }
    }
    if let (true, Some(path)) = (root, &args.reference) {
        let rows = reference_rows(path)?;
        if !args.json {
            print_head(&format!("{} (independent reference: {})", rows.first().map_or("?", |r| r.backend.as_str()), path.display()));
            rows.iter().for_each(print_row);
        }
        report.rows.extend(rows);
    }
    if let (true, Some(path)) = (root, &args.json_out) {
        let text = serde_json::to_string_pretty(&report)?;
        ringrec::fileio::write_atomic(path, ringrec::fileio::PRIVATE, |w| std::io::Write::write_all(w, text.as_bytes())).with_context(|| format!("writing {}", path.display()))?;
    }
    if root {
        if args.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            for line in summary(&report) {
                println!("{line}");
            }
        }
    }
    Ok(report)
}

/// The MPI references: ringrec's `mpi` backend and the independent C program's rows.
const REFERENCES: [&str; 2] = ["mpi", "mpi-c"];

/// Ratio lines: best ringrec backend vs the better MPI reference at 16 and 64 MiB, and for
/// small messages.
pub fn summary(report: &Report) -> Vec<String> {
    let mut out = vec![String::new(), "# summary (ratios against the better of mpi and mpi-c at each size, same run)".to_string()];
    let at = |s: usize| report.rows.iter().filter(move |r| r.size == s);
    let best_ref = |s: usize| at(s).filter(|r| REFERENCES.contains(&r.backend.as_str())).max_by(|a, b| a.busbw.total_cmp(&b.busbw).then(b.time_us.total_cmp(&a.time_us)));
    let best_ours = |s: usize| at(s).filter(|r| !REFERENCES.contains(&r.backend.as_str())).min_by(|a, b| a.time_us.total_cmp(&b.time_us));
    for s in [16usize << 20, 64 << 20] {
        if let (Some(m), Some(best)) = (best_ref(s), best_ours(s)) {
            if m.busbw <= 0.0 {
                // One rank moves nothing (busbw = algbw * 2(n-1)/n = 0): no ratio to give.
                out.push(format!("#   {:>4} MiB: no busbw ratio with one rank (busbw is 0 by definition)", s >> 20));
                continue;
            }
            out.push(format!("#   {:>4} MiB: best {} busbw {:.3} GB/s vs {} {:.3} GB/s = {:.2}x", s >> 20, best.backend, best.busbw, m.backend, m.busbw, best.busbw / m.busbw));
        }
    }
    let mut small: Vec<usize> = report.rows.iter().filter(|r| r.size <= 4096).map(|r| r.size).collect();
    small.sort_unstable();
    small.dedup();
    let ratios: Vec<(usize, f64)> = small.iter().filter_map(|s| Some((*s, best_ref(*s)?.time_us / best_ours(*s)?.time_us))).collect();
    if let Some((worst_at, worst)) = ratios.iter().copied().min_by(|a, b| a.1.total_cmp(&b.1)) {
        let best = ratios.iter().map(|r| r.1).fold(0.0, f64::max);
        out.push(format!("#   <= 4 KiB: best backend per size vs the better MPI (its time / ours): worst {worst:.2}x (at {worst_at} B), best {best:.2}x over {} sizes", ratios.len()));
    }
    let mut names: Vec<&str> = report.rows.iter().map(|r| r.backend.as_str()).filter(|b| !REFERENCES.contains(b)).collect();
    names.dedup();
    for b in names {
        let r: Vec<f64> = small.iter().filter_map(|s| Some(best_ref(*s)?.time_us / at(*s).find(|r| r.backend == b)?.time_us)).collect();
        if let Some(worst) = r.iter().copied().reduce(f64::min) {
            out.push(format!("#   <= 4 KiB: {b} vs the better MPI (its time / {b} time): worst {worst:.2}x over {} sizes", r.len()));
        }
    }
    let wrong: u64 = report.rows.iter().map(|r| r.wrong).sum();
    out.push(format!("#   #wrong total: {wrong}"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn sizes_parse_and_expected_values_are_exact() {
        assert_eq!(parse_size("16M").unwrap(), 16 << 20);
        assert_eq!(parse_size("8").unwrap(), 8);
        assert!(parse_size("x").is_err());
        assert_eq!(iterations(20, 8), 1000);
        assert_eq!(iterations(20, 1 << 20), 20);
        assert_eq!(iterations(20, 256 << 20), 8);
        assert_eq!(iterations(20, 1 << 30), 3);
        // rank values at i=0: -3, 0, 3, -2 -> sum -2, min -3, max 3
        assert_eq!(expected(0, 4, DType::F32, ReduceOp::Sum), -2.0);
        assert_eq!(expected(0, 4, DType::F32, ReduceOp::Min), -3.0);
        assert_eq!(expected(0, 4, DType::F32, ReduceOp::Max), 3.0);
        assert_eq!(expected(0, 4, DType::I32, ReduceOp::Average), 0.0);
        assert_eq!(expected(0, 4, DType::F32, ReduceOp::Average), -0.5);
        let mut buf = vec![0f32; 10];
        fill(&mut buf, 0);
        assert_eq!(count_wrong(&buf, ReduceOp::Sum, 1), 0);
        assert_eq!(count_wrong(&buf, ReduceOp::Sum, 2), 10 - buf.iter().enumerate().filter(|(i, _)| pattern(*i, 1) == 0.0).count() as u64);
    }
}
