//! Data-parallel training of a small MLP with the ringrec engine, Horovod style.
//!
//! Every rank holds the same model (12 named parameter tensors: 6 layers of weights and
//! biases), trains on its own shard of a synthetic regression problem, and submits each
//! gradient tensor to the engine as soon as backward produces it (last layer first); the
//! engine negotiates, fuses and averages them in the background while backward goes on.
//!
//! ```text
//! cargo build --release --examples
//! scripts/mpirun.sh -np 4 target/release/examples/engine_mlp
//! ```

use ringrec::dtype::ReduceOp;
use ringrec::engine::{Handle, Tensor};
use ringrec::hash::splitmix64_next;

const WIDTHS: [usize; 7] = [16, 64, 64, 64, 32, 16, 1];
const BATCH: usize = 64; // per rank
const LR: f32 = 0.05;

/// Uniform in [-1, 1).
fn rng(state: &mut u64) -> f32 {
    (splitmix64_next(state) >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
}

/// The target every rank learns: a fixed smooth function of the 16 inputs.
fn target(x: &[f32]) -> f32 {
    x.iter().enumerate().map(|(i, v)| ((i + 1) as f32 * v).sin() / (i + 1) as f32).sum()
}

struct Layer {
    w: Vec<f32>, // in x out
    b: Vec<f32>,
}

fn main() {
    let rt = ringrec::init().unwrap_or_else(|e| {
        eprintln!("engine_mlp: {e}");
        std::process::exit(1)
    });
    let (rank, size) = (rt.rank(), rt.size());
    let steps: usize = std::env::var("ENGINE_MLP_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(300);
    // Each rank starts from different random weights; rank 0's are broadcast to all.
    let mut seed = 1000 + rank as u64;
    let mut layers: Vec<Layer> = WIDTHS
        .windows(2)
        .map(|p| {
            let limit = (6.0 / (p[0] + p[1]) as f32).sqrt();
            Layer { w: (0..p[0] * p[1]).map(|_| rng(&mut seed) * limit).collect(), b: vec![0.0; p[1]] }
        })
        .collect();
    {
        let names: Vec<(String, String)> = (0..layers.len()).map(|l| (format!("layer{l}.w"), format!("layer{l}.b"))).collect();
        let mut params: Vec<(&str, &mut [f32])> = Vec::new();
        for (l, layer) in layers.iter_mut().enumerate() {
            params.push((names[l].0.as_str(), &mut layer.w[..]));
            params.push((names[l].1.as_str(), &mut layer.b[..]));
        }
        rt.broadcast_parameters(&mut params, 0).expect("broadcast parameters");
    }
    let mut data_seed = 7 + 31 * rank as u64;
    let mut first_loss = None;
    let mut loss = 0.0;
    for step in 0..steps {
        // This rank's batch.
        let x: Vec<f32> = (0..BATCH * WIDTHS[0]).map(|_| rng(&mut data_seed)).collect();
        let y: Vec<f32> = x.chunks(WIDTHS[0]).map(target).collect();
        // Forward, keeping activations.
        let mut acts = vec![x];
        for (l, layer) in layers.iter().enumerate() {
            let (fi, fo) = (WIDTHS[l], WIDTHS[l + 1]);
            let a = &acts[l];
            let mut z = vec![0f32; BATCH * fo];
            for n in 0..BATCH {
                for o in 0..fo {
                    let mut s = layer.b[o];
                    for i in 0..fi {
                        s += a[n * fi + i] * layer.w[i * fo + o];
                    }
                    z[n * fo + o] = if l + 2 < WIDTHS.len() { s.max(0.0) } else { s };
                }
            }
            acts.push(z);
        }
        // Mean squared error over the global batch; its gradient.
        let out = acts.last().expect("output");
        let mut delta: Vec<f32> = out.iter().zip(&y).map(|(p, t)| 2.0 * (p - t) / BATCH as f32).collect();
        let local_loss: f32 = out.iter().zip(&y).map(|(p, t)| (p - t) * (p - t)).sum::<f32>() / BATCH as f32;
        let loss_handle = rt.allreduce_async("loss", Tensor::from_vec(vec![local_loss]), ReduceOp::Average);
        // Backward, last layer first; each gradient goes to the engine at once.
        let mut pending: Vec<(usize, Handle, Handle)> = Vec::new();
        for l in (0..layers.len()).rev() {
            let (fi, fo) = (WIDTHS[l], WIDTHS[l + 1]);
            let a = &acts[l];
            let mut gw = vec![0f32; fi * fo];
            let mut gb = vec![0f32; fo];
            for n in 0..BATCH {
                for o in 0..fo {
                    let d = delta[n * fo + o];
                    gb[o] += d;
                    for i in 0..fi {
                        gw[i * fo + o] += a[n * fi + i] * d;
                    }
                }
            }
            let hw = rt.allreduce_async(&format!("layer{l}.w"), Tensor::from_vec(gw), ReduceOp::Average);
            let hb = rt.allreduce_async(&format!("layer{l}.b"), Tensor::from_vec(gb), ReduceOp::Average);
            pending.push((l, hw, hb));
            if l > 0 {
                let mut below = vec![0f32; BATCH * fi];
                for n in 0..BATCH {
                    for i in 0..fi {
                        if a[n * fi + i] > 0.0 {
                            below[n * fi + i] = (0..fo).map(|o| delta[n * fo + o] * layers[l].w[i * fo + o]).sum();
                        }
                    }
                }
                delta = below;
            }
        }
        // SGD with the averaged gradients.
        for (l, hw, hb) in pending {
            let gw = hw.wait().expect("allreduce").into_vec::<f32>().expect("f32");
            let gb = hb.wait().expect("allreduce").into_vec::<f32>().expect("f32");
            for (p, g) in layers[l].w.iter_mut().zip(&gw) {
                *p -= LR * g;
            }
            for (p, g) in layers[l].b.iter_mut().zip(&gb) {
                *p -= LR * g;
            }
        }
        loss = loss_handle.wait().expect("loss").as_slice::<f32>().expect("f32")[0];
        first_loss.get_or_insert(loss);
        if rank == 0 && step % 50 == 0 {
            println!("step {step:4}  loss {loss:.5}");
        }
    }
    // Replicas must be identical: compare every rank's parameters with rank 0's.
    let flat: Vec<f32> = layers.iter().flat_map(|l| l.w.iter().chain(&l.b).copied()).collect();
    let max = rt.allreduce("check.max", Tensor::from_slice(&flat), ReduceOp::Max).expect("max");
    let min = rt.allreduce("check.min", Tensor::from_slice(&flat), ReduceOp::Min).expect("min");
    let identical = max == min;
    let stats = rt.stats();
    if rank == 0 {
        let first = first_loss.unwrap_or(f32::NAN);
        println!("engine_mlp: {size} rank(s), {} parameter tensors, {steps} steps: loss {first:.5} -> {loss:.5}; replicas identical: {identical}", 2 * layers.len());
        println!("engine_mlp: engine backend {}, {} collectives for {} tensors ({} from the response cache, {} negotiated)", rt.backend_name(), stats.collectives, stats.cached + stats.negotiated, stats.cached, stats.negotiated);
    }
    let learned = loss < first_loss.unwrap_or(0.0) / 2.0; // false for NaN too
    if !identical || !learned {
        eprintln!("engine_mlp: rank {rank}: training failed (identical replicas: {identical}, loss {loss})");
        std::process::exit(1);
    }
}
