//! `ringrec bench engine`: a synthetic model with ResNet-50's gradient tensors (161
//! tensors, 25.6M float32 parameters) submitted in reverse layer order, as backward
//! produces them. One step = submit all, wait all. Measured in the same run:
//!
//! - **flat**: one allreduce of a single buffer of the same total size on the same backend
//!   (the lower bound fusion aims for);
//! - **fused**: the engine with the fusion threshold (default 128 MiB);
//! - **unfused**: the engine with fusion disabled (threshold 0): one collective per tensor.

use std::time::{Duration, Instant};

use serde::Serialize;

use ringrec::comm::{self, Backend, CollectivesExt};
use ringrec::dtype::ReduceOp;
use ringrec::engine::{Engine, EngineConfig, Tensor};
use ringrec::topology::Topology;

/// Flags of `ringrec bench engine`.
#[derive(clap::Args, Debug, Clone)]
pub struct EngineBenchArgs {
    /// Timed steps per mode.
    #[arg(short = 'n', long, default_value_t = 20)]
    pub steps: usize,
    /// Untimed warm-up steps per mode.
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    /// Fusion threshold of the fused mode (bytes, K/M/G suffixes).
    #[arg(long, default_value = "128M")]
    pub fusion_threshold: String,
    /// Cycle time of the engine (ms).
    #[arg(long, default_value_t = 1.0)]
    pub cycle_time_ms: f64,
    /// Backend (auto: the best for the topology).
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// Also run the engine with RINGREC_AUTOTUNE's search first, then time the parameters it kept.
    #[arg(long)]
    pub autotune: bool,
    /// Seconds the autotuner measures each candidate.
    #[arg(long, default_value_t = 0.3)]
    pub autotune_sample: f64,
    /// Print a JSON summary instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// ResNet-50's parameter tensors (conv weights, batch-norm scale and shift, fc), in
/// forward order.
pub fn resnet50_shapes() -> Vec<(String, Vec<usize>)> {
    let mut v: Vec<(String, Vec<usize>)> = Vec::new();
    let bn = |v: &mut Vec<(String, Vec<usize>)>, name: &str, c: usize| {
        v.push((format!("{name}.gamma"), vec![c]));
        v.push((format!("{name}.beta"), vec![c]));
    };
    v.push(("conv1.w".into(), vec![64, 3, 7, 7]));
    bn(&mut v, "bn1", 64);
    let mut cin = 64;
    for (stage, (blocks, mid, out)) in [(3usize, 64usize, 256usize), (4, 128, 512), (6, 256, 1024), (3, 512, 2048)].into_iter().enumerate() {
        for b in 0..blocks {
            let p = format!("layer{}.{b}", stage + 1);
            v.push((format!("{p}.conv1.w"), vec![mid, cin, 1, 1]));
            bn(&mut v, &format!("{p}.bn1"), mid);
            v.push((format!("{p}.conv2.w"), vec![mid, mid, 3, 3]));
            bn(&mut v, &format!("{p}.bn2"), mid);
            v.push((format!("{p}.conv3.w"), vec![out, mid, 1, 1]));
            bn(&mut v, &format!("{p}.bn3"), out);
            if b == 0 {
                v.push((format!("{p}.downsample.w"), vec![out, cin, 1, 1]));
                bn(&mut v, &format!("{p}.downsample.bn"), out);
            }
            cin = out;
        }
    }
    v.push(("fc.w".into(), vec![1000, 2048]));
    v.push(("fc.b".into(), vec![1000]));
    v
}

/// One mode's result.
#[derive(Clone, Debug, Serialize)]
pub struct ModeResult {
    /// flat, fused or unfused.
    pub mode: String,
    /// Mean step time of the slowest rank (ms).
    pub mean_ms: f64,
    /// Fastest step (ms).
    pub min_ms: f64,
    /// Collectives per step.
    pub collectives_per_step: f64,
    /// Tensors per step that ran from the response cache.
    pub cached_per_step: f64,
    /// Fusion threshold in use (bytes).
    pub fusion_threshold: u64,
    /// Cycle time in use (ms).
    pub cycle_time_ms: f64,
}

/// The whole run.
#[derive(Clone, Debug, Serialize)]
pub struct EngineReport {
    /// Ranks.
    pub ranks: usize,
    /// Backend.
    pub backend: String,
    /// Tensors per step.
    pub tensors: usize,
    /// Parameters per step.
    pub params: usize,
    /// flat, fused, unfused.
    pub modes: Vec<ModeResult>,
    /// fused / flat time (target <= 1.2).
    pub fused_over_flat: f64,
    /// unfused / fused time (target >= 3).
    pub unfused_over_fused: f64,
}

fn slowest(c: &mut dyn comm::Collectives, v: f64) -> anyhow::Result<f64> {
    let mut x = [v];
    c.allreduce(&mut x[..], ReduceOp::Max)?;
    Ok(x[0])
}

fn time_engine(engine: &Engine, shapes: &[(String, Vec<usize>)], tensors: &mut [Tensor], steps: usize, warmup: usize) -> anyhow::Result<(Vec<f64>, ringrec::engine::StatsSnapshot)> {
    let mut times = Vec::new();
    let mut before = engine.stats();
    for s in 0..warmup + steps {
        if s == warmup {
            before = engine.stats();
        }
        let t0 = Instant::now();
        // Backward produces the last layer's gradient first.
        let mut handles = Vec::with_capacity(shapes.len());
        for i in (0..shapes.len()).rev() {
            let t = std::mem::replace(&mut tensors[i], Tensor::from_vec(Vec::<f32>::new()));
            handles.push((i, engine.allreduce_async(&shapes[i].0, t, ReduceOp::Average)));
        }
        for (i, h) in handles {
            tensors[i] = h.wait()?;
        }
        if s >= warmup {
            times.push(t0.elapsed().as_secs_f64() * 1e3);
        }
    }
    let after = engine.stats();
    let d = ringrec::engine::StatsSnapshot {
        cycles: after.cycles - before.cycles,
        negotiations: after.negotiations - before.negotiations,
        cached: after.cached - before.cached,
        negotiated: after.negotiated - before.negotiated,
        collectives: after.collectives - before.collectives,
        bytes: after.bytes - before.bytes,
        ..after
    };
    Ok((times, d))
}

/// Runs the benchmark (collective over the world).
pub fn run(topo: &Topology, args: &EngineBenchArgs) -> anyhow::Result<EngineReport> {
    let backend = if args.backend == "auto" { Backend::auto(topo) } else { Backend::parse(&args.backend).ok_or_else(|| anyhow::anyhow!("--backend {}: expected auto, mpi, ring, shm or hier", args.backend))? };
    let threshold = ringrec::config::parse_bytes(&args.fusion_threshold).ok_or_else(|| anyhow::anyhow!("--fusion-threshold {}: expected bytes such as 134217728 or 128M", args.fusion_threshold))?;
    let shapes = resnet50_shapes();
    let params: usize = shapes.iter().map(|(_, s)| s.iter().product::<usize>()).sum();
    let fill = |rank: usize| -> Vec<Tensor> { shapes.iter().map(|(_, s)| Tensor::new(vec![rank as f32 + 0.5; s.iter().product()], s).expect("shape")).collect() };
    let mut referee = comm::build_tagged(Backend::Mpi, topo, "bench-engine-ref")?;
    let mut modes = Vec::new();

    // flat: one buffer, the same backend.
    {
        let mut flat = comm::build_tagged(backend, topo, "bench-engine-flat")?;
        let mut buf = vec![topo.rank as f32 + 0.5; params];
        let mut times = Vec::new();
        for s in 0..args.warmup + args.steps {
            referee.barrier()?;
            let t0 = Instant::now();
            flat.allreduce(&mut buf[..], ReduceOp::Average)?;
            if s >= args.warmup {
                times.push(t0.elapsed().as_secs_f64() * 1e3);
            }
        }
        let mean = times.iter().sum::<f64>() / times.len().max(1) as f64;
        let min = times.iter().copied().fold(f64::INFINITY, f64::min);
        modes.push(ModeResult { mode: "flat".into(), mean_ms: slowest(referee.as_mut(), mean)?, min_ms: slowest(referee.as_mut(), min)?, collectives_per_step: 1.0, cached_per_step: 0.0, fusion_threshold: 0, cycle_time_ms: 0.0 });
    }
    let mut runs = vec![("fused", threshold, false), ("unfused", 0, false)];
    if args.autotune {
        runs.push(("autotuned", threshold, true));
    }
    for (mode, fusion, autotune) in runs {
        let config = EngineConfig {
            backend: Some(backend),
            fusion_threshold: fusion,
            cycle_time: Duration::from_secs_f64(args.cycle_time_ms / 1000.0),
            tag: format!("bench-{mode}"),
            autotune,
            autotune_sample: Duration::from_secs_f64(args.autotune_sample),
            ..EngineConfig::default()
        };
        let engine = Engine::start(topo, &config)?;
        let mut tensors = fill(topo.rank);
        if autotune {
            // Steps until rank 0's search ends (every rank learns it in the same cycle).
            let mut steps = 0;
            loop {
                time_engine(&engine, &shapes, &mut tensors, 1, 0)?;
                steps += 1;
                let mut tuning = [engine.stats().tuning as i32];
                referee.allreduce(&mut tuning[..], ReduceOp::Max)?;
                if tuning[0] == 0 || steps >= 2000 {
                    break;
                }
            }
        }
        referee.barrier()?;
        let (times, st) = time_engine(&engine, &shapes, &mut tensors, args.steps, args.warmup)?;
        // Every rank holds the average of (rank + 0.5) over ranks.
        let want = (0..topo.size).map(|r| r as f32 + 0.5).sum::<f32>() / topo.size as f32;
        anyhow::ensure!(tensors.iter().all(|t| t.as_slice::<f32>().is_some_and(|x| x.iter().all(|v| *v == want))), "{mode}: wrong allreduce result");
        drop(engine);
        let mean = times.iter().sum::<f64>() / times.len().max(1) as f64;
        let min = times.iter().copied().fold(f64::INFINITY, f64::min);
        let n = args.steps.max(1) as f64;
        modes.push(ModeResult {
            mode: mode.into(),
            mean_ms: slowest(referee.as_mut(), mean)?,
            min_ms: slowest(referee.as_mut(), min)?,
            collectives_per_step: st.collectives as f64 / n,
            cached_per_step: st.cached as f64 / n,
            fusion_threshold: st.fusion_threshold,
            cycle_time_ms: st.cycle_time_us as f64 / 1e3,
        });
    }
    let report = EngineReport {
        ranks: topo.size,
        backend: backend.name().into(),
        tensors: shapes.len(),
        params,
        fused_over_flat: modes[1].mean_ms / modes[0].mean_ms,
        unfused_over_fused: modes[2].mean_ms / modes[1].mean_ms,
        modes,
    };
    if topo.rank == 0 {
        if args.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            println!("# ringrec bench engine: {} ranks, backend {}, {} tensors shaped like ResNet-50's gradients, {} float32 parameters ({:.1} MB), submitted in reverse layer order", report.ranks, report.backend, report.tensors, params, params as f64 * 4.0 / 1e6);
            println!("# {} timed steps per mode after {} warm-up; time = mean of the slowest rank; fusion threshold {} bytes, cycle time {} ms", args.steps, args.warmup, threshold, args.cycle_time_ms);
            println!("# mode        time (ms)   min (ms)   collectives/step   cached tensors/step   fusion (MiB)   cycle (ms)");
            for m in &report.modes {
                let (f, c) = if m.mode == "flat" { ("-".to_string(), "-".to_string()) } else { (format!("{:.0}", m.fusion_threshold as f64 / (1 << 20) as f64), format!("{:.1}", m.cycle_time_ms)) };
                println!("  {:<9} {:>11.2} {:>10.2} {:>18.1} {:>21.1} {:>14} {:>12}", m.mode, m.mean_ms, m.min_ms, m.collectives_per_step, m.cached_per_step, f, c);
            }
            println!("# fused / flat = {:.2}x (target <= 1.2x); unfused / fused = {:.2}x (target >= 3x)", report.fused_over_flat, report.unfused_over_fused);
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resnet50_has_161_tensors_and_25_6m_parameters() {
        let s = resnet50_shapes();
        assert_eq!(s.len(), 161);
        let p: usize = s.iter().map(|(_, s)| s.iter().product::<usize>()).sum();
        assert_eq!(p, 25_557_032);
    }
}
