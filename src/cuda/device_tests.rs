//! Tests of the GPU path, written once over the [`Device`] trait and run on
//! [`HostDevice`] (the kernel sources compiled for the CPU: every machine) and on
//! [`CudaDevice`] (a real GPU: skipped with a printed reason where there is none).
//! Each kernel and the whole dense model are compared with the CPU implementation.

use super::device::Device;
use super::mlp::DeviceMlp;
use super::{CudaDevice, HostDevice};
use crate::model::input::{fill_row, scatter_key_grads, InputLayout};

const LAYOUT: InputLayout = InputLayout { fields: 3, dim: 2, ndense: 1 };
use crate::model::mlp::{bce_with_logits, sigmoid, splitmix64};
use crate::model::{DenseOptimState, DenseOptimizer, Mlp, MlpShape};

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n).map(|_| (splitmix64(&mut s) >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0).collect()
}

fn upload<D: Device>(dev: &D, v: &[f32]) -> D::F32 {
    let mut b = dev.zeros_f32(v.len()).unwrap();
    dev.write_f32(v, &mut b, 0).unwrap();
    b
}

fn upload_u32<D: Device>(dev: &D, v: &[u32]) -> D::U32 {
    let mut h = dev.staging_u32(v.len()).unwrap();
    dev.host_u32(&mut h).unwrap()[..v.len()].copy_from_slice(v);
    let mut b = dev.zeros_u32(v.len()).unwrap();
    dev.upload_u32(&h, v.len(), &mut b).unwrap();
    dev.synchronize().unwrap();
    b
}

fn read<D: Device>(dev: &D, b: &D::F32, n: usize) -> Vec<f32> {
    let mut v = vec![0f32; n];
    dev.read_f32(b, 0, &mut v).unwrap();
    v
}

fn close(a: &[f32], b: &[f32], tol: f32) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol * (1.0 + y.abs()))
}

/// Every kernel against the CPU implementation on random inputs.
fn kernels_match_the_cpu<D: Device>(dev: &D) {
    let (batch, fields, dim, ndense, keys) = (37, 5, 4, 3, 29);
    let width = fields * dim + ndense;
    let mut s = 7u64;
    let inverse: Vec<u32> = (0..batch * fields).map(|_| (splitmix64(&mut s) % keys as u64) as u32).collect();
    let emb = random(keys * dim, 1);
    let dense = random(batch * ndense, 2);

    // gather_input == the trainer's row fill.
    let mut want = vec![0f32; batch * width];
    for (s, row) in want.chunks_mut(width).enumerate() {
        fill_row(row, &emb, &inverse[s * fields..(s + 1) * fields], &dense[s * ndense..(s + 1) * ndense], dim);
    }
    let (emb_d, inv_d, dense_d) = (upload(dev, &emb), upload_u32(dev, &inverse), upload(dev, &dense));
    let mut x = dev.zeros_f32(batch * width).unwrap();
    dev.gather_input(&emb_d, &inv_d, &dense_d, &mut x, batch, fields, dim, ndense).unwrap();
    assert_eq!(read(dev, &x, batch * width), want, "gather_input");

    // key_grad_reduce over the CSR lists == the trainer's scatter, bit for bit (same order).
    let dx = random(batch * width, 3);
    let mut want = vec![0f32; keys * dim];
    scatter_key_grads(&dx, &inverse, batch, fields, dim, width, &mut want);
    let mut offsets = vec![0u32; keys + 1];
    for u in &inverse {
        offsets[*u as usize + 1] += 1;
    }
    for u in 0..keys {
        offsets[u + 1] += offsets[u];
    }
    let mut next = offsets.clone();
    let mut slots = vec![0u32; inverse.len()];
    for (p, u) in inverse.iter().enumerate() {
        slots[next[*u as usize] as usize] = p as u32;
        next[*u as usize] += 1;
    }
    let mut out = dev.zeros_f32(keys * dim).unwrap();
    dev.key_grad_reduce(&upload(dev, &dx), &upload_u32(dev, &offsets), &upload_u32(dev, &slots), &mut out, keys, batch, fields, dim, width).unwrap();
    assert_eq!(read(dev, &out, keys * dim), want, "key_grad_reduce");

    // bias + ReLU, bias only, ReLU backward, bias gradient.
    let (rows, cols) = (9, 7);
    let z0 = random(rows * cols, 4);
    let bias = random(cols + 3, 5); // used at offset 3
    for relu in [true, false] {
        let mut z = upload(dev, &z0);
        dev.bias_act(&mut z, (&upload(dev, &bias), 3), rows, cols, relu).unwrap();
        let want: Vec<f32> = z0.iter().enumerate().map(|(i, v)| if relu { (v + bias[3 + i % cols]).max(0.0) } else { v + bias[3 + i % cols] }).collect();
        assert_eq!(read(dev, &z, rows * cols), want, "bias_act relu={relu}");
    }
    let act = random(rows * cols, 6);
    let mut delta = upload(dev, &z0);
    dev.relu_backward(&mut delta, &upload(dev, &act), rows * cols).unwrap();
    let want: Vec<f32> = z0.iter().zip(&act).map(|(d, a)| if *a <= 0.0 { 0.0 } else { *d }).collect();
    assert_eq!(read(dev, &delta, rows * cols), want, "relu_backward");
    let mut db = dev.zeros_f32(cols + 2).unwrap();
    dev.bias_grad(&upload(dev, &z0), (&mut db, 2), rows, cols).unwrap();
    let mut want = vec![0f32; cols + 2];
    for row in z0.chunks(cols) {
        for (c, v) in row.iter().enumerate() {
            want[2 + c] += v;
        }
    }
    assert_eq!(read(dev, &db, cols + 2), want, "bias_grad");

    // Binary cross-entropy, its gradient, the loss sum.
    let n = 53;
    let logits: Vec<f32> = random(n, 7).iter().map(|v| v * 30.0).collect();
    let labels: Vec<f32> = (0..n).map(|i| (i % 3 == 0) as u8 as f32).collect();
    let (mut loss, mut d) = (dev.zeros_f32(n).unwrap(), dev.zeros_f32(n).unwrap());
    dev.bce_loss(&upload(dev, &logits), &upload(dev, &labels), &mut loss, &mut d, n, 0.25).unwrap();
    let want_loss: Vec<f32> = logits.iter().zip(&labels).map(|(z, y)| bce_with_logits(*z, *y)).collect();
    let want_d: Vec<f32> = logits.iter().zip(&labels).map(|(z, y)| (sigmoid(*z) - y) * 0.25).collect();
    assert!(close(&read(dev, &loss, n), &want_loss, 1e-6), "bce loss");
    assert!(close(&read(dev, &d, n), &want_d, 1e-6), "bce delta");
    let mut sum = dev.zeros_f32(4).unwrap();
    dev.loss_sum(&loss, n, (&mut sum, 3)).unwrap();
    let want_sum = want_loss.iter().map(|v| *v as f64).sum::<f64>() as f32;
    let got = read(dev, &sum, 4);
    assert_eq!(&got[..3], &[0.0; 3]);
    assert!((got[3] - want_sum).abs() <= 1e-5 * want_sum.abs(), "loss_sum {} vs {want_sum}", got[3]);

    // SGD and three Adam steps == DenseOptimState on the CPU, parameters at an offset.
    let (np, at) = (41, 5);
    let p0 = random(at + np, 8);
    for kind in [DenseOptimizer::Sgd, DenseOptimizer::Adam] {
        let mut cpu = DenseOptimState::new(kind, 0.01, np);
        let mut want = p0[at..].to_vec();
        let (mut p, mut m, mut v) = (upload(dev, &p0), dev.zeros_f32(at + np).unwrap(), dev.zeros_f32(at + np).unwrap());
        for t in 1..=3u64 {
            let g = random(np, 100 + t);
            cpu.step(&mut want, &g);
            let gd = upload(dev, &g);
            match kind {
                DenseOptimizer::Sgd => dev.sgd_update((&mut p, at), &gd, 0.01, np).unwrap(),
                DenseOptimizer::Adam => {
                    let (alpha, eps_hat) = crate::model::optim::adam_factors(0.01, t);
                    dev.adam_update((&mut p, at), &gd, &mut m, &mut v, alpha, crate::model::optim::BETA1, crate::model::optim::BETA2, eps_hat, np).unwrap()
                }
            }
        }
        let got = read(dev, &p, at + np);
        assert_eq!(&got[..at], &p0[..at], "{kind:?}: parameters before the offset untouched");
        assert!(close(&got[at..], &want, 1e-6), "{kind:?}: {:?} vs {want:?}", &got[at..]);
    }

    // f16 / bf16 casts == the half crate (round to nearest even), including specials.
    let mut vals = random(200, 9).iter().map(|v| v * 70000.0).collect::<Vec<f32>>();
    vals.extend([0.0, -0.0, 1e-8, -6.1e-5, 65504.0, 65520.0, 1e30, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 3.0e-39]);
    let n = vals.len();
    let src = upload(dev, &vals);
    for bf16 in [false, true] {
        let mut h = dev.zeros_u16(n).unwrap();
        dev.cast_to_half(&src, &mut h, n, bf16).unwrap();
        let mut bits = vec![0u16; n];
        dev.read_u16(&h, &mut bits).unwrap();
        let want: Vec<u16> = vals.iter().map(|v| if bf16 { half::bf16::from_f32(*v).to_bits() } else { half::f16::from_f32(*v).to_bits() }).collect();
        for (i, (g, w)) in bits.iter().zip(&want).enumerate() {
            let both_nan = if bf16 { half::bf16::from_bits(*g).is_nan() && half::bf16::from_bits(*w).is_nan() } else { half::f16::from_bits(*g).is_nan() && half::f16::from_bits(*w).is_nan() };
            assert!(g == w || both_nan, "bf16={bf16} {}: {g:#06x} vs {w:#06x}", vals[i]);
        }
        let mut back = dev.zeros_f32(n).unwrap();
        dev.cast_from_half(&h, &mut back, n, bf16).unwrap();
        let got = read(dev, &back, n);
        for (i, g) in got.iter().enumerate() {
            let w = if bf16 { half::bf16::from_bits(want[i]).to_f32() } else { half::f16::from_bits(want[i]).to_f32() };
            assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()), "bf16={bf16} widen {i}: {g} vs {w}");
        }
    }
}

/// One synthetic batch: inverse map over `keys` rows, rows, dense features, labels.
struct Batch {
    inverse: Vec<u32>,
    emb: Vec<f32>,
    dense: Vec<f32>,
    labels: Vec<f32>,
    keys: usize,
}

fn batch(seed: u64, batch: usize, fields: usize, dim: usize, ndense: usize) -> Batch {
    let mut s = seed;
    let keys = 1 + (splitmix64(&mut s) % (batch * fields) as u64) as usize;
    let inverse: Vec<u32> = (0..batch * fields).map(|i| if i < keys { i as u32 } else { (splitmix64(&mut s) % keys as u64) as u32 }).collect();
    Batch { inverse, emb: random(keys * dim, seed ^ 1), dense: random(batch * ndense, seed ^ 2), labels: (0..batch).map(|_| (splitmix64(&mut s) % 4 == 0) as u8 as f32).collect(), keys }
}

fn stage<D: Device>(m: &mut DeviceMlp<D>, b: &Batch) {
    let n = b.labels.len();
    let st = m.stage(n, b.keys).unwrap();
    st.emb.copy_from_slice(&b.emb);
    st.inverse.copy_from_slice(&b.inverse);
    st.dense.copy_from_slice(&b.dense);
    st.labels.copy_from_slice(&b.labels);
}

/// 50 training steps of the device model against the CPU model (the same parameters,
/// batches and optimizer): losses within 1e-3 relative, key gradients and final
/// parameters close; the next batch is always staged before the current step finishes.
fn model_matches_the_cpu_path<D: Device>(dev: D) {
    let (fields, dim, ndense, n) = (4, 3, 2, 12);
    let shape = MlpShape { input: fields * dim + ndense, hidden: vec![8, 5] };
    let mut cpu = Mlp::new(shape.clone(), 11, 1);
    let mut opt = DenseOptimState::new(DenseOptimizer::Adam, 0.01, cpu.num_params());
    let mut gpu = DeviceMlp::new(dev, &shape, InputLayout { fields, dim, ndense }, cpu.params(), DenseOptimizer::Adam, 0.01).unwrap();
    assert_eq!(gpu.num_params(), cpu.num_params());
    let scale = 1.0 / n as f32;
    let batches: Vec<Batch> = (0..51).map(|t| batch(1000 + t, n, fields, dim, ndense)).collect();
    stage(&mut gpu, &batches[0]);
    let (mut grad, mut x, mut dx) = (vec![0f32; cpu.num_params()], vec![0f32; n * shape.input], vec![0f32; n * shape.input]);
    let mut worst = 0f64;
    for t in 0..50 {
        let b = &batches[t];
        let mut order = Vec::new();
        gpu.step(scale, &mut |_, l, _g| {
            order.push(l);
            Ok(())
        })
        .unwrap();
        assert_eq!(order, vec![2, 1, 0], "layers handed out last first");
        // Double buffering: the next batch is staged while this step's results are pending.
        stage(&mut gpu, &batches[t + 1]);
        for (s, row) in x.chunks_mut(shape.input).enumerate() {
            fill_row(row, &b.emb, &b.inverse[s * fields..(s + 1) * fields], &b.dense[s * ndense..(s + 1) * ndense], dim);
        }
        let cpu_loss = cpu.forward_backward(&x, &b.labels, n, scale, &mut grad, &mut dx);
        let mut key_grads = vec![0f32; b.keys * dim];
        scatter_key_grads(&dx, &b.inverse, n, fields, dim, shape.input, &mut key_grads);
        assert!(close(gpu.key_grads().unwrap(), &key_grads, 1e-4), "step {t}: key gradients");
        let gpu_loss = gpu.loss_sum().unwrap();
        let rel = (gpu_loss - cpu_loss).abs() / cpu_loss.abs().max(1e-12);
        worst = worst.max(rel);
        assert!(rel <= 1e-3, "step {t}: loss {gpu_loss} vs cpu {cpu_loss}");
        opt.step(cpu.params_mut(), &grad);
        gpu.apply().unwrap();
    }
    eprintln!("{}: 50 steps, worst relative loss difference {worst:.2e}", gpu.device().describe());
    assert!(close(&gpu.params().unwrap(), cpu.params(), 1e-3), "parameters after 50 steps");
    let st = gpu.optim_state().unwrap();
    assert_eq!(st.step, 50);
    assert!(close(&st.m, &opt.m, 1e-3) && close(&st.v, &opt.v, 1e-3), "Adam moments");
    // Inference on the staged batch equals the CPU forward.
    let b = &batches[50];
    for (s, row) in x.chunks_mut(shape.input).enumerate() {
        fill_row(row, &b.emb, &b.inverse[s * fields..(s + 1) * fields], &b.dense[s * ndense..(s + 1) * ndense], dim);
    }
    let (mut want, mut got) = (vec![0f32; n], vec![0f32; n]);
    cpu.forward(&x, n, &mut want);
    assert_eq!(gpu.predict(&mut got).unwrap(), n);
    assert!(close(&got, &want, 1e-3), "predict");
}

/// Two "ranks" with half a batch each, their layer gradients summed as an allreduce
/// would, give the one-rank model's losses and parameters (the loss sum rides in layer 0).
fn halves_summed_equal_the_whole<D: Device>(make: impl Fn() -> D) {
    let (fields, dim, ndense, n) = (3, 2, 1, 10);
    let shape = MlpShape { input: fields * dim + ndense, hidden: vec![6] };
    let init = Mlp::new(shape.clone(), 5, 1);
    let mk = || DeviceMlp::new(make(), &shape, InputLayout { fields, dim, ndense }, init.params(), DenseOptimizer::Sgd, 0.1).unwrap();
    let (mut whole, mut a, mut b) = (mk(), mk(), mk());
    for t in 0..5 {
        let full = batch(77 + t, n, fields, dim, ndense);
        // Rank 0 takes samples 0..4, rank 1 samples 4..10, with their own key numbering.
        let split = |lo: usize, hi: usize| {
            let inv = &full.inverse[lo * fields..hi * fields];
            let mut uniq: Vec<u32> = Vec::new();
            let inverse: Vec<u32> = inv
                .iter()
                .map(|u| match uniq.iter().position(|v| v == u) {
                    Some(i) => i as u32,
                    None => {
                        uniq.push(*u);
                        (uniq.len() - 1) as u32
                    }
                })
                .collect();
            let emb = uniq.iter().flat_map(|u| full.emb[*u as usize * dim..(*u as usize + 1) * dim].to_vec()).collect();
            Batch { inverse, emb, dense: full.dense[lo * ndense..hi * ndense].to_vec(), labels: full.labels[lo..hi].to_vec(), keys: uniq.len() }
        };
        let scale = 1.0 / n as f32;
        stage(&mut whole, &full);
        whole.step(scale, &mut |_, _, _| Ok(())).unwrap();
        stage(&mut a, &split(0, 4));
        a.step(scale, &mut |_, _, _| Ok(())).unwrap();
        stage(&mut b, &split(4, n));
        b.step(scale, &mut |_, _, _| Ok(())).unwrap();
        for l in 0..whole.num_layers() {
            let len = whole.grad_len(l);
            let ga = {
                let (d, g) = a.layer_grad_mut(l);
                read(d, g, len)
            };
            let gb = {
                let (d, g) = b.layer_grad_mut(l);
                read(d, g, len)
            };
            let sum: Vec<f32> = ga.iter().zip(&gb).map(|(x, y)| x + y).collect();
            for m in [&mut a, &mut b] {
                let (d, g) = m.layer_grad_mut(l);
                d.write_f32(&sum, g, 0).unwrap();
            }
        }
        let (lw, la, lb) = (whole.loss_sum().unwrap(), a.loss_sum().unwrap(), b.loss_sum().unwrap());
        assert_eq!(la, lb, "step {t}: every rank holds the same global loss");
        assert!((lw - la).abs() <= 1e-5 * lw.abs(), "step {t}: loss {la} vs {lw}");
        for m in [&mut whole, &mut a, &mut b] {
            m.apply().unwrap();
        }
        assert_eq!(a.params().unwrap(), b.params().unwrap(), "replicas stay identical");
        assert!(close(&a.params().unwrap(), &whole.params().unwrap(), 1e-5));
    }
}

/// Buffers too small for a launch, and a staged inverse naming a missing row, are errors.
fn bad_launches_are_refused<D: Device>(make: impl Fn() -> D) {
    let dev = make();
    let mut z = dev.zeros_f32(10).unwrap();
    let bias = dev.zeros_f32(4).unwrap();
    let e = dev.bias_act(&mut z, (&bias, 1), 3, 4, true).unwrap_err().to_string();
    assert!(e.contains("bias_act: z") && e.contains("buffer of 10 elements, the launch needs 12"), "{e}");
    let e = dev.bias_act(&mut dev.zeros_f32(12).unwrap(), (&bias, 1), 3, 4, true).unwrap_err().to_string();
    assert!(e.contains("bias_act: bias") && e.contains("needs 5"), "{e}");
    let shape = MlpShape { input: 3 * 2 + 1, hidden: vec![4] };
    let init = Mlp::new(shape.clone(), 1, 1);
    let mut m = DeviceMlp::new(make(), &shape, LAYOUT, init.params(), DenseOptimizer::Sgd, 0.1).unwrap();
    let st = m.stage(2, 3).unwrap();
    st.inverse.copy_from_slice(&[0, 1, 2, 0, 3, 1]);
    let e = m.step(0.5, &mut |_, _, _| Ok(())).unwrap_err().to_string();
    assert!(e.contains("inverse names row 3 of 3 unique keys"), "{e}");
    assert!(m.step(0.5, &mut |_, _, _| Ok(())).unwrap_err().to_string().contains("no batch was staged"));
    let e = DeviceMlp::new(make(), &shape, LAYOUT, &init.params()[1..], DenseOptimizer::Sgd, 0.1).err().unwrap().to_string();
    assert!(e.contains("parameters given"), "{e}");
}

#[test]
fn host_kernels_match_the_cpu() {
    kernels_match_the_cpu(&HostDevice::new().unwrap());
}

#[test]
fn host_model_matches_the_cpu_path_for_50_steps() {
    model_matches_the_cpu_path(HostDevice::new().unwrap());
}

#[test]
fn host_halves_summed_equal_the_whole_batch() {
    halves_summed_equal_the_whole(|| HostDevice::new().unwrap());
}

#[test]
fn host_bad_launches_are_refused() {
    bad_launches_are_refused(|| HostDevice::new().unwrap());
}

/// The GPU, or the printed reason why the GPU tests are skipped.
fn gpu() -> Option<CudaDevice> {
    match CudaDevice::new(0) {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("skipped: no GPU here ({e})");
            None
        }
    }
}

#[test]
fn gpu_kernels_match_the_cpu() {
    if let Some(d) = gpu() {
        kernels_match_the_cpu(&d);
    }
}

#[test]
fn gpu_model_matches_the_cpu_path_for_50_steps() {
    if let Some(d) = gpu() {
        model_matches_the_cpu_path(d);
    }
}

#[test]
fn gpu_halves_summed_equal_the_whole_batch() {
    if gpu().is_some() {
        halves_summed_equal_the_whole(|| CudaDevice::new(0).unwrap());
    }
}

#[test]
fn gpu_bad_launches_are_refused() {
    if gpu().is_some() {
        bad_launches_are_refused(|| CudaDevice::new(0).unwrap());
    }
}

#[cfg(feature = "cuda")]
#[test]
fn gpu_a_kernel_that_does_not_compile_reports_nvrtcs_log() {
    if gpu().is_none() {
        return;
    }
    let e = super::kernels::compile_source("broken", "extern \"C\" __global__ void f(float* x) { x[0] = undefined_name; }", "--gpu-architecture=compute_70").unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("NVRTC could not compile kernels/broken.cu") && msg.contains("undefined_name"), "{msg}");
}
