//! `ringrec bench sparse`: hierarchical vs flat sparse gradient exchange, measured in the
//! same run on the same inputs.
//!
//! Every step each rank draws `fields x batch` Zipf-distributed keys (hot ids scattered over
//! the key space) with one row of `dim` gradient values each, then runs one step of each mode
//! back to back (a world barrier before each), so machine noise hits both alike. time = mean
//! over the timed steps of the slowest rank's step time; cpu = the largest per-rank mean CPU
//! time of a step; bytes = per step, summed over ranks.
//! `check` compares the two modes' final gradients on every host leader, bit for bit.

use std::time::Instant;

use mpi::collective::{CommunicatorCollectives, SystemOperation};
use serde::Serialize;

use ringrec::hash::fnv1a64;
use ringrec::sparse::workload::batch;
use ringrec::sparse::{SparseExchange, SparseExchanger, SparseNormalize, SparseStats};
use ringrec::topology::Topology;

/// Flags of `ringrec bench sparse`.
#[derive(clap::Args, Debug, Clone)]
pub struct SparseBenchArgs {
    /// Sparse fields (features) per sample.
    #[arg(long, default_value_t = 26)]
    pub fields: usize,
    /// Samples per rank per step.
    #[arg(long, default_value_t = 4096)]
    pub batch: usize,
    /// Values per embedding row.
    #[arg(long, default_value_t = 16)]
    pub dim: usize,
    /// Distinct ids keys are drawn from.
    #[arg(long, default_value_t = 1_000_000)]
    pub vocab: u64,
    /// Zipf exponent s of the key distribution.
    #[arg(long, default_value_t = 1.05)]
    pub zipf_s: f64,
    /// Normalisation of the summed gradients.
    #[arg(long, default_value = "frequency")]
    pub normalize: SparseNormalize,
    /// Timed steps per mode.
    #[arg(short = 'n', long, default_value_t = 20)]
    pub steps: usize,
    /// Untimed warm-up steps per mode.
    #[arg(short = 'w', long, default_value_t = 3)]
    pub warmup: usize,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// One mode's figures.
#[derive(Serialize, Debug, Clone, Default)]
pub struct ModeRow {
    /// `hier` or `flat`.
    pub mode: String,
    /// Mean step time of the slowest rank, milliseconds.
    pub time_ms: f64,
    /// Fastest step (slowest rank), milliseconds.
    pub min_ms: f64,
    /// CPU time of a step, the largest per-rank mean, milliseconds (waiting included as far
    /// as it spins: on a machine with more ranks than cores this is what the ranks compete
    /// for).
    pub cpu_ms: f64,
    /// Phase means, the largest over ranks, milliseconds.
    pub dedupe_ms: f64,
    /// Host gather.
    pub host_ms: f64,
    /// Cross-host (or world) allgatherv.
    pub cross_ms: f64,
    /// Decode, merge, normalise.
    pub merge_ms: f64,
    /// Distinct keys per rank (mean).
    pub unique_per_rank: f64,
    /// Distinct keys of a step.
    pub global_keys: f64,
    /// Bytes moved between ranks of one host per step, summed over ranks (sent).
    pub host_bytes: f64,
    /// Bytes moved between hosts per step, summed over ranks (sent).
    pub cross_bytes: f64,
}

/// The whole run.
#[derive(Serialize, Debug, Clone)]
pub struct SparseReport {
    /// World size.
    pub ranks: usize,
    /// Hosts (simulated ones count).
    pub hosts: usize,
    /// Ranks per host (of rank 0's host).
    pub local_size: usize,
    /// Keys per rank per step.
    pub keys_per_rank: usize,
    /// Row values.
    pub dim: usize,
    /// Timed steps.
    pub steps: usize,
    /// `hier`, then `flat`.
    pub rows: Vec<ModeRow>,
    /// flat time / hier time.
    pub speedup: f64,
    /// flat cross-host bytes / hier cross-host bytes.
    pub cross_bytes_ratio: f64,
    /// Both modes gave bit-identical gradients on every leader in every step.
    pub identical: bool,
}

#[derive(Default)]
struct Acc {
    steps: usize,
    time: f64,
    min: f64,
    cpu: f64,
    stats: SparseStats,
}

/// CPU seconds this process has used (all threads, user and system).
fn process_cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec to write; the clock id is a constant Linux knows.
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) } == 0;
    if ok {
        ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
    } else {
        0.0
    }
}

fn max_over_ranks(topo: &Topology, v: f64) -> f64 {
    let mut out = 0f64;
    topo.world.comm.all_reduce_into(&v, &mut out, SystemOperation::max());
    out
}

fn sum_over_ranks(topo: &Topology, v: f64) -> f64 {
    let mut out = 0f64;
    topo.world.comm.all_reduce_into(&v, &mut out, SystemOperation::sum());
    out
}

/// Runs the benchmark; prints on rank 0. Returns the report (on every rank).
pub fn run(topo: &Topology, args: &SparseBenchArgs) -> anyhow::Result<SparseReport> {
    let keys_per_rank = args.fields * args.batch;
    let modes = [SparseExchange::Hierarchical, SparseExchange::Flat];
    let mut ex = Vec::new();
    for m in modes {
        ex.push(SparseExchanger::new(topo, m, args.normalize, args.dim)?);
    }
    let root = topo.rank == 0;
    if root && !args.json {
        println!(
            "# ringrec bench sparse: {} ranks on {} host(s) ({} per host), {} fields x batch {} = {} keys/rank, dim {}, zipf s={} over {} ids, normalize {}",
            topo.size, topo.num_hosts, topo.local_size, args.fields, args.batch, keys_per_rank, args.dim, args.zipf_s, args.vocab, args.normalize
        );
        println!("# {} timed steps per mode after {} warm-up, modes alternating on the same inputs; time = mean of the slowest rank", args.steps, args.warmup);
    }
    let mut acc: Vec<Acc> = modes.iter().map(|_| Acc { min: f64::INFINITY, ..Acc::default() }).collect();
    let mut identical = true;
    for step in 0..args.warmup + args.steps {
        let (keys, grads) = batch(topo.rank, step, keys_per_rank, args.dim, args.vocab, args.zipf_s);
        let mut digests = Vec::new();
        for (m, e) in ex.iter_mut().enumerate() {
            topo.world.comm.barrier();
            let t = Instant::now();
            let cpu = process_cpu_seconds();
            let (agg, st) = e.exchange(&keys, &grads)?;
            let dt = t.elapsed().as_secs_f64();
            let cpu = process_cpu_seconds() - cpu;
            let slowest = max_over_ranks(topo, dt);
            if topo.is_leader() {
                let agg = agg.ok_or_else(|| anyhow::anyhow!("mode {}: a host leader got no result", modes[m]))?;
                digests.push((fnv1a64(bytemuck::cast_slice(agg.keys)), fnv1a64(bytemuck::cast_slice(agg.grads)), fnv1a64(bytemuck::cast_slice(agg.counts.unwrap_or_default()))));
            }
            if step >= args.warmup {
                let a = &mut acc[m];
                a.steps += 1;
                a.time += slowest;
                a.min = a.min.min(slowest);
                a.cpu += cpu;
                a.stats.add(&st);
            }
        }
        let same = u8::from(digests.windows(2).all(|w| w[0] == w[1]));
        let mut all_same = 0u8;
        topo.world.comm.all_reduce_into(&same, &mut all_same, SystemOperation::min());
        identical &= all_same == 1;
    }
    let mut rows = Vec::new();
    for (m, a) in acc.iter().enumerate() {
        let n = a.steps.max(1) as f64;
        let s = &a.stats;
        rows.push(ModeRow {
            mode: modes[m].name().to_string(),
            time_ms: a.time / n * 1e3,
            min_ms: if a.min.is_finite() { a.min * 1e3 } else { 0.0 },
            cpu_ms: max_over_ranks(topo, a.cpu / n) * 1e3,
            dedupe_ms: max_over_ranks(topo, s.dedupe_s / n) * 1e3,
            host_ms: max_over_ranks(topo, s.host_s / n) * 1e3,
            cross_ms: max_over_ranks(topo, s.cross_s / n) * 1e3,
            merge_ms: max_over_ranks(topo, s.merge_s / n) * 1e3,
            unique_per_rank: sum_over_ranks(topo, s.keys_unique as f64 / n) / topo.size as f64,
            global_keys: max_over_ranks(topo, s.keys_global as f64 / n),
            host_bytes: sum_over_ranks(topo, s.host_bytes_sent as f64 / n),
            cross_bytes: sum_over_ranks(topo, s.cross_bytes_sent as f64 / n),
        });
    }
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::INFINITY };
    let report = SparseReport {
        ranks: topo.size,
        hosts: topo.num_hosts,
        local_size: topo.local_size,
        keys_per_rank,
        dim: args.dim,
        steps: args.steps,
        speedup: ratio(rows[1].time_ms, rows[0].time_ms),
        cross_bytes_ratio: ratio(rows[1].cross_bytes, rows[0].cross_bytes),
        rows,
        identical,
    };
    if root {
        if args.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            for line in table(&report) {
                println!("{line}");
            }
        }
    }
    Ok(report)
}

/// The human-readable table and summary of a report.
pub fn table(r: &SparseReport) -> Vec<String> {
    let mut out = vec![
        format!("#{:>5} {:>9} {:>8} {:>8} | {:>7} {:>7} {:>7} {:>7} | {:>9} {:>8} | {:>9} {:>9}", "mode", "time", "min", "cpu", "dedupe", "host", "cross", "merge", "uniq/rank", "global", "host", "cross"),
        format!("#{:>5} {:>9} {:>8} {:>8} | {:>7} {:>7} {:>7} {:>7} | {:>9} {:>8} | {:>9} {:>9}", "", "(ms)", "(ms)", "(ms)", "(ms)", "(ms)", "(ms)", "(ms)", "(keys)", "(keys)", "(MB/step)", "(MB/step)"),
    ];
    for m in &r.rows {
        out.push(format!(
            "{:>6} {:>9.2} {:>8.2} {:>8.2} | {:>7.2} {:>7.2} {:>7.2} {:>7.2} | {:>9.0} {:>8.0} | {:>9.2} {:>9.2}",
            m.mode,
            m.time_ms,
            m.min_ms,
            m.cpu_ms,
            m.dedupe_ms,
            m.host_ms,
            m.cross_ms,
            m.merge_ms,
            m.unique_per_rank,
            m.global_keys,
            m.host_bytes / 1e6,
            m.cross_bytes / 1e6
        ));
    }
    out.push(format!(
        "# hier vs flat: {:.2}x faster (target >= 2x), {:.2}x fewer cross-host bytes (target >= local_size = {}x); results bit-identical: {}",
        r.speedup,
        r.cross_bytes_ratio,
        r.local_size,
        if r.identical { "yes" } else { "NO" }
    ));
    out
}
