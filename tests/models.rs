//! The models of issue 31 on every device: each kernel of kernels/models.cu against a plain
//! reference (CPU, host kernels, GPU), and each model's training steps on the host kernels
//! (with random queue delays) and on a GPU against the CPU device.

use ringrec::device::{CpuDevice, CudaDevice, Device, HostDelay, HostKernels, HostOptions, Op};
use ringrec::hash::splitmix64_next;
use ringrec::model::{CrossStructure, DenseModel, DenseOptimState, DenseOptimizer, ModelKind, ModelSpec, Part};
use ringrec::tensor::Tensor;

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n).map(|_| (splitmix64_next(&mut s) >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0).collect()
}

fn close(a: &[f32], b: &[f32], tol: f32) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol * (1.0 + y.abs()))
}

fn same(got: &[f32], want: &[f32], exact: bool, what: &str) {
    if exact {
        assert_eq!(got, want, "{what}");
    } else {
        assert!(close(got, want, 1e-5), "{what}: {got:?} vs {want:?}");
    }
}

/// Pairs `(i, j)` of DLRM's interaction in order.
fn pairs(vectors: usize, with_self: bool) -> Vec<(usize, usize)> {
    (0..vectors).flat_map(|i| (0..if with_self { i + 1 } else { i }).map(move |j| (i, j))).collect()
}

/// Every model kernel against a plain loop (bit for bit where `exact`: the same order).
fn model_ops_match_the_reference<D: Device>(dev: &D, exact: bool) {
    let (rows, fields, dim, ndense) = (13, 5, 4, 3);
    let up = |v: &[f32]| dev.buffer_from(v).unwrap();
    let get = |b: &D::Buf<f32>, n: usize| dev.to_vec(b, n).unwrap();

    // copy_block
    let src = random(rows * 9, 1);
    let mut out = up(&random(rows * 7, 2));
    let mut want = get(&out, rows * 7);
    for r in 0..rows {
        for c in 0..4 {
            want[r * 7 + 2 + c] = src[r * 9 + 5 + c];
        }
    }
    dev.exec(Op::CopyBlock { src: &up(&src), src_stride: 9, src_col: 5, out: &mut out, stride: 7, col: 2, rows, cols: 4 }).unwrap();
    same(&get(&out, rows * 7), &want, true, "copy_block");

    // mul, add_into
    let (a, b, o) = (random(100, 3), random(100, 4), random(100, 5));
    for accumulate in [false, true] {
        let mut out = up(&o);
        dev.exec(Op::Mul { a: &up(&a), b: &up(&b), out: &mut out, n: 100, accumulate }).unwrap();
        let want: Vec<f32> = (0..100).map(|i| if accumulate { o[i] + a[i] * b[i] } else { a[i] * b[i] }).collect();
        same(&get(&out, 100), &want, exact, "mul");
    }
    let mut out = up(&o);
    dev.exec(Op::AddInto { x: &up(&a), out: &mut out, n: 100 }).unwrap();
    same(&get(&out, 100), &(0..100).map(|i| o[i] + a[i]).collect::<Vec<_>>(), true, "add_into");

    // interaction and its backward
    let vectors = fields + 1;
    for with_self in [false, true] {
        let ps = pairs(vectors, with_self);
        let width = dim + ps.len();
        let z = random(rows * vectors * dim, 6);
        let mut want = vec![0f32; rows * width];
        for r in 0..rows {
            let zr = &z[r * vectors * dim..];
            want[r * width..r * width + dim].copy_from_slice(&zr[..dim]);
            for (p, (i, j)) in ps.iter().enumerate() {
                want[r * width + dim + p] = (0..dim).fold(0f32, |acc, k| acc + zr[i * dim + k] * zr[j * dim + k]);
            }
        }
        let mut out = dev.alloc(rows * width).unwrap();
        dev.exec(Op::Interaction { z: &up(&z), out: &mut out, rows, vectors, dim, with_self }).unwrap();
        same(&get(&out, rows * width), &want, exact, "interaction");
        let dout = random(rows * width, 7);
        let mut want = vec![0f32; rows * vectors * dim];
        for r in 0..rows {
            let (zr, g) = (&z[r * vectors * dim..], &dout[r * width..]);
            for i in 0..vectors {
                for k in 0..dim {
                    let mut acc = if i == 0 { g[k] } else { 0.0 };
                    for j in 0..vectors {
                        let p = ps.iter().position(|&(a, b)| (a, b) == (i.max(j), i.min(j)));
                        if let Some(p) = p {
                            acc += if i == j { 2.0 * g[dim + p] * zr[i * dim + k] } else { g[dim + p] * zr[j * dim + k] };
                        }
                    }
                    want[(r * vectors + i) * dim + k] = acc;
                }
            }
        }
        let mut dz = dev.alloc(rows * vectors * dim).unwrap();
        dev.exec(Op::InteractionGrad { z: &up(&z), dout: &up(&dout), dz: &mut dz, rows, vectors, dim, with_self }).unwrap();
        same(&get(&dz, rows * vectors * dim), &want, exact, "interaction_grad");
    }

    // first-order columns: strip, sum, backward
    let (iw, ow) = (fields * (dim + 1) + ndense, fields * dim + ndense);
    let x = random(rows * iw, 8);
    let (mut deep, mut sum) = (dev.alloc(rows * ow).unwrap(), dev.alloc(rows).unwrap());
    dev.exec(Op::StripFirstOrder { x: &up(&x), out: &mut deep, rows, fields, dim, ndense }).unwrap();
    dev.exec(Op::FirstOrderSum { x: &up(&x), out: &mut sum, rows, fields, dim, ndense }).unwrap();
    let (mut wd, mut ws) = (Vec::new(), Vec::new());
    for r in 0..rows {
        let row = &x[r * iw..(r + 1) * iw];
        let mut s = 0f32;
        for f in 0..fields {
            wd.extend_from_slice(&row[f * (dim + 1)..f * (dim + 1) + dim]);
            s += row[f * (dim + 1) + dim];
        }
        wd.extend_from_slice(&row[fields * (dim + 1)..]);
        ws.push(s);
    }
    same(&get(&deep, rows * ow), &wd, true, "strip_first_order");
    same(&get(&sum, rows), &ws, exact, "first_order_sum");
    let (ddeep, dsum) = (random(rows * ow, 9), random(rows, 10));
    let mut dx = dev.alloc(rows * iw).unwrap();
    dev.exec(Op::StripFirstOrderGrad { ddeep: &up(&ddeep), dsum: &up(&dsum), dx: &mut dx, rows, fields, dim, ndense }).unwrap();
    let mut want = Vec::new();
    for r in 0..rows {
        for f in 0..fields {
            want.extend_from_slice(&ddeep[r * ow + f * dim..r * ow + (f + 1) * dim]);
            want.push(dsum[r]);
        }
        want.extend_from_slice(&ddeep[r * ow + fields * dim..(r + 1) * ow]);
    }
    same(&get(&dx, rows * iw), &want, true, "strip_first_order_grad");

    // the factorisation machine's second order and its backward (rows of `ow`: the deep input)
    let e = random(rows * ow, 11);
    let mut out = dev.alloc(rows).unwrap();
    dev.exec(Op::FmSecondOrder { emb: &up(&e), out: &mut out, rows, fields, dim, stride: ow }).unwrap();
    let sums = |r: usize, k: usize| (0..fields).fold(0f32, |s, f| s + e[r * ow + f * dim + k]);
    let want: Vec<f32> = (0..rows)
        .map(|r| {
            let terms = (0..dim).map(|k| {
                let sq = (0..fields).fold(0f32, |s, f| s + e[r * ow + f * dim + k] * e[r * ow + f * dim + k]);
                sums(r, k) * sums(r, k) - sq
            });
            0.5 * terms.fold(0f32, |a, t| a + t)
        })
        .collect();
    same(&get(&out, rows), &want, exact, "fm_second_order");
    let (dout, d0) = (random(rows, 12), random(rows * ow, 13));
    let mut demb = up(&d0);
    dev.exec(Op::FmSecondOrderGrad { emb: &up(&e), dout: &up(&dout), demb: &mut demb, rows, fields, dim, stride: ow }).unwrap();
    let mut want = d0.clone();
    for r in 0..rows {
        for k in 0..dim {
            for f in 0..fields {
                want[r * ow + f * dim + k] += dout[r] * (sums(r, k) - e[r * ow + f * dim + k]);
            }
        }
    }
    same(&get(&demb, rows * ow), &want, exact, "fm_second_order_grad");

    // Bounds are checked.
    let mut small = dev.alloc(3).unwrap();
    let e = dev.exec(Op::Interaction { z: &up(&random(6, 1)), out: &mut small, rows: 1, vectors: 2, dim: 3, with_self: false }).unwrap_err().to_string();
    assert!(e.contains("interaction: out"), "{e}");
}

/// Every model (small), DCN in each structure and rank kind.
fn specs() -> Vec<ModelSpec> {
    let base = ModelSpec { bottom: vec![5], cross_layers: 2, ..ModelSpec::mlp(4, 3, 2, vec![8, 5]) };
    let mut v = vec![ModelSpec { kind: ModelKind::Dlrm, ..base.clone() }, ModelSpec { kind: ModelKind::Dlrm, interaction_self: true, ..base.clone() }];
    for (rank, structure) in [(0, CrossStructure::Stacked), (2, CrossStructure::Parallel)] {
        v.push(ModelSpec { kind: ModelKind::Dcn, cross_rank: rank, cross_structure: structure, ..base.clone() });
    }
    v.push(ModelSpec { kind: ModelKind::DeepFm, ..base.clone() });
    v.push(ModelSpec { kind: ModelKind::WideDeep, ..base });
    v
}

/// One batch: the unique keys' rows, the inverse map, dense features, labels.
struct Batch {
    emb: Vec<f32>,
    inverse: Vec<u32>,
    dense: Vec<f32>,
    labels: Vec<f32>,
    keys: usize,
}

fn batch(seed: u64, n: usize, spec: &ModelSpec) -> Batch {
    let mut s = seed;
    let keys = 1 + (splitmix64_next(&mut s) % (n * spec.fields) as u64) as usize;
    let inverse = (0..n * spec.fields).map(|i| if i < keys { i as u32 } else { (splitmix64_next(&mut s) % keys as u64) as u32 }).collect();
    Batch { emb: random(keys * spec.row_width(), seed ^ 1), inverse, dense: random(n * spec.ndense, seed ^ 2), labels: (0..n).map(|_| (splitmix64_next(&mut s) % 4 == 0) as u8 as f32).collect(), keys }
}

fn load<D: Device>(m: &mut DenseModel<D>, b: &Batch) {
    let st = m.stage(b.labels.len(), b.keys).unwrap();
    st.emb.copy_from_slice(&b.emb);
    st.inverse.copy_from_slice(&b.inverse);
    st.dense.copy_from_slice(&b.dense);
    st.labels.copy_from_slice(&b.labels);
    m.load().unwrap();
}

/// A step whose gradients come straight back; the parts in the order handed out.
fn step<D: Device>(m: &mut DenseModel<D>, scale: f32) -> Vec<Part> {
    let mut out: Vec<(Part, Tensor)> = Vec::new();
    m.step(scale, &mut |p, t| out.push((p, t))).unwrap();
    let parts = out.iter().map(|(p, _)| *p).collect();
    for (p, t) in out {
        m.give_back(p, t).unwrap();
    }
    parts
}

/// 20 Adam steps of each model on `make()` against the CPU device: the groups handed out
/// last first, losses within 1e-3 relative, key gradients and parameters close, the
/// gradient check clean, predictions close.
fn models_match_the_cpu_device<D: Device>(make: impl Fn() -> D) -> Result<(), String> {
    for spec in specs() {
        let what = spec.describe();
        let params = spec.init_params(5);
        let opt = DenseOptimState::new(DenseOptimizer::Adam, 0.01, params.len());
        let mut dev = DenseModel::new(make(), spec.clone(), &params, &opt).unwrap();
        let mut cpu = DenseModel::new(CpuDevice::new(2), spec.clone(), &params, &opt).unwrap();
        let groups = spec.groups().len();
        let order: Vec<Part> = (0..groups).rev().map(Part::Layer).chain([Part::Loss]).collect();
        for t in 0..20u64 {
            let b = batch(100 + t, 7 + (t as usize * 5) % 23, &spec);
            let scale = 1.0 / b.labels.len() as f32;
            load(&mut dev, &b);
            load(&mut cpu, &b);
            assert_eq!(step(&mut dev, scale), order, "{what}");
            step(&mut cpu, scale);
            if !close(dev.key_grads().unwrap(), cpu.key_grads().unwrap(), 1e-4) {
                return Err(format!("{what}, step {t}: key gradients differ"));
            }
            let (ld, lc) = (dev.loss_sum().unwrap(), cpu.loss_sum().unwrap());
            if (ld - lc).abs() > 1e-3 * lc.abs().max(1e-12) {
                return Err(format!("{what}, step {t}: loss {ld} vs cpu {lc}"));
            }
            assert_eq!(dev.non_finite_gradient().unwrap(), None, "{what}");
            dev.apply().unwrap();
            cpu.apply().unwrap();
        }
        if !close(&dev.params().unwrap(), &cpu.params().unwrap(), 1e-3) {
            return Err(format!("{what}: parameters after 20 steps differ"));
        }
        let b = batch(7, 9, &spec);
        let (mut got, mut want) = (Vec::new(), Vec::new());
        load(&mut dev, &b);
        dev.predict(&mut got).unwrap();
        load(&mut cpu, &b);
        cpu.predict(&mut want).unwrap();
        if !close(&got, &want, 1e-3) {
            return Err(format!("{what}: predictions differ"));
        }
    }
    Ok(())
}

#[test]
fn cpu_model_ops_match_the_references() {
    model_ops_match_the_reference(&CpuDevice::new(1), true);
    model_ops_match_the_reference(&CpuDevice::new(3), true);
}

#[test]
fn host_kernels_model_ops_match_the_references() {
    model_ops_match_the_reference(&HostKernels::new().unwrap(), true);
}

#[test]
fn every_model_learns_the_same_on_the_cpu_with_two_or_three_threads() {
    models_match_the_cpu_device(|| CpuDevice::new(3)).unwrap();
}

#[test]
fn every_model_on_host_kernels_with_random_delays_matches_the_cpu_device() {
    for seed in [1, 2, 3] {
        models_match_the_cpu_device(|| HostKernels::with_options(HostOptions { delay: Some(HostDelay { seed, max_us: 200 }), fault: None }).unwrap()).unwrap_or_else(|e| panic!("delay seed {seed}: {e}"));
    }
}

/// The GPU, or the printed reason why the GPU tests are skipped.
fn gpu() -> Option<CudaDevice> {
    match CudaDevice::new(0) {
        Ok(d) => Some(d),
        Err(e @ (ringrec::device::DeviceError::Kernel { .. } | ringrec::device::DeviceError::KernelLoad(_))) => panic!("the GPU is there but its kernels failed: {e}"),
        Err(e) => {
            eprintln!("skipped: no GPU here ({e})");
            None
        }
    }
}

#[test]
fn gpu_model_ops_match_the_references() {
    if let Some(d) = gpu() {
        // The GPU's float order is the same; its compiler may contract a * b + c.
        model_ops_match_the_reference(&d, false);
    }
}

#[test]
fn gpu_every_model_matches_the_cpu_device() {
    if gpu().is_some() {
        models_match_the_cpu_device(|| CudaDevice::new(0).unwrap()).unwrap();
    }
}
