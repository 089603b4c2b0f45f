//! Tests of the device layer, written once over [`Device`] and run on [`CpuDevice`] (one
//! and three threads), on [`HostKernels`] (the kernel sources compiled for the CPU: every
//! machine) and on [`CudaDevice`] (a real GPU: skipped with a printed reason where there is
//! none). Every operation is compared with a plain reference, and the dense model on each
//! device with the model on the CPU device.

use half::{bf16, f16};

use reference::{fill_row, scatter_key_grads};
use ringrec::device::{Activation, CpuDevice, CsrScratch, CudaDevice, Device, Epilogue, Gemm, GemmPrecision, Half, HostDelay, HostFault, HostKernels, HostOptions, Op, CACHE_MISS};
use ringrec::hash::splitmix64_next;
use ringrec::model::input::{build_csr, InputLayout};
use ringrec::model::pooling::{build_bag_csr, Pooling};
use ringrec::model::optim::{adam_factors, BETA1, BETA2};
use ringrec::model::{CrossStructure, DenseModel, DenseOptimState, DenseOptimizer, ModelKind, ModelSpec, Part};
use ringrec::tensor::Tensor;

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n).map(|_| (splitmix64_next(&mut s) >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0).collect()
}

fn close(a: &[f32], b: &[f32], tol: f32) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol * (1.0 + y.abs()))
}

/// Asserts `got == want` exactly, or within 1e-6 relative when `exact` is false (a device
/// that sums in another order).
fn same(got: &[f32], want: &[f32], exact: bool, what: &str) {
    if exact {
        assert_eq!(got, want, "{what}");
    } else {
        assert!(close(got, want, 1e-6), "{what}: {got:?} vs {want:?}");
    }
}

fn naive_gemm(g: &Gemm, a: &[f32], b: &[f32]) -> Vec<f32> {
    let mut c = vec![0f32; g.m * g.n];
    for i in 0..g.m {
        for j in 0..g.n {
            let mut s = 0f64;
            for p in 0..g.k {
                let av = if g.a_t { a[p * g.m + i] } else { a[i * g.k + p] };
                let bv = if g.b_t { b[j * g.k + p] } else { b[p * g.n + j] };
                s += av as f64 * bv as f64;
            }
            c[i * g.n + j] = s as f32;
        }
    }
    c
}

/// Every GEMM transpose combination and epilogue against a plain loop.
fn gemms_match_a_plain_loop<D: Device>(dev: &D) {
    let (m, n, k) = (23, 9, 31);
    for (a_t, b_t) in [(false, false), (true, false), (false, true), (true, true)] {
        let g = Gemm { m, n, k, a_t, b_t };
        let (a, b) = (random(m * k, 1), random(k * n, 2));
        let want = naive_gemm(&g, &a, &b);
        // The product at an offset of its buffer, after 3 untouched values.
        let mut c = dev.alloc(3 + m * n).unwrap();
        dev.gemm(&g, (&dev.buffer_from(&a).unwrap(), 0), (&dev.buffer_from(&b).unwrap(), 0), (&mut c, 3), Epilogue::None).unwrap();
        let got = dev.to_vec(&c, 3 + m * n).unwrap();
        assert_eq!(&got[..3], &[0.0; 3], "a_t {a_t} b_t {b_t}: before the offset");
        assert!(close(&got[3..], &want, 1e-5), "a_t {a_t} b_t {b_t}");
    }
    let (a, b, bias) = (random(m * k, 3), random(k * n, 4), random(n + 2, 5));
    let (ad, bd, biasd) = (dev.buffer_from(&a).unwrap(), dev.buffer_from(&b).unwrap(), dev.buffer_from(&bias).unwrap());
    let g = Gemm { m, n, k, a_t: false, b_t: false };
    let plain = naive_gemm(&g, &a, &b);
    for act in [Activation::Identity, Activation::Relu] {
        let mut c = dev.alloc(m * n).unwrap();
        dev.gemm(&g, (&ad, 0), (&bd, 0), (&mut c, 0), Epilogue::Bias { bias: &biasd, at: 2, act }).unwrap();
        let want: Vec<f32> = plain.iter().enumerate().map(|(i, v)| v + bias[2 + i % n]).map(|v| if act == Activation::Relu { v.max(0.0) } else { v }).collect();
        assert!(close(&dev.to_vec(&c, m * n).unwrap(), &want, 1e-5), "bias {act:?}");
    }
    let act = random(m * n, 6);
    let mut c = dev.alloc(m * n).unwrap();
    dev.gemm(&g, (&ad, 0), (&bd, 0), (&mut c, 0), Epilogue::ReluGrad { act: &dev.buffer_from(&act).unwrap() }).unwrap();
    let want: Vec<f32> = plain.iter().zip(&act).map(|(v, a)| if *a <= 0.0 { 0.0 } else { *v }).collect();
    assert!(close(&dev.to_vec(&c, m * n).unwrap(), &want, 1e-5), "relu grad");
    // Weight and bias gradient in one buffer: a^T b, then the column sums of b.
    let g = Gemm { m: k, n, k: m, a_t: true, b_t: false };
    let a2 = random(m * k, 7);
    let b2 = random(m * n, 8);
    let mut c = dev.alloc(k * n + n).unwrap();
    dev.gemm(&g, (&dev.buffer_from(&a2).unwrap(), 0), (&dev.buffer_from(&b2).unwrap(), 0), (&mut c, 0), Epilogue::BiasGrad { at: k * n }).unwrap();
    let got = dev.to_vec(&c, k * n + n).unwrap();
    assert!(close(&got[..k * n], &naive_gemm(&g, &a2, &b2), 1e-5), "weight gradient");
    let sums: Vec<f32> = (0..n).map(|j| (0..m).map(|r| b2[r * n + j] as f64).sum::<f64>() as f32).collect();
    assert!(close(&got[k * n..], &sums, 1e-5), "bias gradient");
    let e = dev.gemm(&g, (&dev.buffer_from(&a2).unwrap(), 0), (&dev.buffer_from(&b2).unwrap(), 0), (&mut c, 0), Epilogue::BiasGrad { at: 4 }).unwrap_err().to_string();
    assert!(e.contains("overlap the product"), "{e}");
}

/// At [`GemmPrecision::Bf16`], the models' three GEMM shapes with their epilogues (forward
/// `x W` + bias and ReLU, weight gradient `x^T delta` + bias gradient, input gradient
/// `delta W^T` + ReLU backward), odd k and sizes off the CPU's 6 x 64 tile, against the f64
/// product of the bf16-rounded operands: |c - ref| <= k 2^-24 sum |a_p b_p| + 1e-6 |c| (f32
/// summation in another order; the epilogue's f32 add). Returns the products, for comparing
/// devices.
/// An epilogue made from the bias and activation buffers.
type MakeEpilogue<'c, D> = dyn for<'e> Fn(&'e <D as Device>::Buf<f32>, &'e <D as Device>::Buf<f32>) -> Epilogue<'e, D> + 'c;

fn bf16_gemms_match_the_rounded_product<D: Device>(dev: &mut D) -> Vec<Vec<f32>> {
    dev.set_gemm_precision(GemmPrecision::Bf16).unwrap();
    assert_eq!(dev.gemm_precision(), GemmPrecision::Bf16);
    let r = |x: &[f32]| x.iter().map(|v| bf16::from_f32(*v).to_f32()).collect::<Vec<f32>>();
    let (batch, fan_in, fan_out) = (37, 429, 70);
    let (x, w, delta) = (random(batch * fan_in, 11), random(fan_in * fan_out, 12), random(batch * fan_out, 13));
    let (bias, act) = (random(fan_out, 14), random(batch * fan_in, 15));
    let mut out = Vec::new();
    let mut check = |g: Gemm, a: &[f32], b: &[f32], epi: &MakeEpilogue<'_, D>, extra: usize, post: &dyn Fn(&mut [f32])| {
        let (ad, bd) = (dev.buffer_from(a).unwrap(), dev.buffer_from(b).unwrap());
        let (biasd, actd) = (dev.buffer_from(&bias).unwrap(), dev.buffer_from(&act).unwrap());
        let mut c = dev.alloc(g.m * g.n + extra).unwrap();
        dev.gemm(&g, (&ad, 0), (&bd, 0), (&mut c, 0), epi(&biasd, &actd)).unwrap();
        let got = dev.to_vec(&c, g.m * g.n + extra).unwrap();
        let mut want = naive_gemm(&g, &r(a), &r(b));
        let abs = |x: &[f32]| x.iter().map(|v| v.abs()).collect::<Vec<f32>>();
        let mag = naive_gemm(&g, &abs(&r(a)), &abs(&r(b)));
        post(&mut want);
        for (i, (gv, wv)) in got.iter().zip(&want).enumerate() {
            let tol = g.k as f32 * f32::powi(2.0, -24) * mag[i] + 1e-6 * wv.abs() + 1e-7;
            assert!((gv - wv).abs() <= tol, "{g:?} on {}: c[{i}] = {gv}, want {wv} +- {tol}", dev.describe());
        }
        out.push(got);
    };
    let bias_relu = |c: &mut [f32]| c.iter_mut().enumerate().for_each(|(i, v)| *v = (*v + bias[i % fan_out]).max(0.0));
    check(Gemm { m: batch, n: fan_out, k: fan_in, a_t: false, b_t: false }, &x, &w, &|b, _| Epilogue::Bias { bias: b, at: 0, act: Activation::Relu }, 0, &bias_relu);
    check(Gemm { m: fan_in, n: fan_out, k: batch, a_t: true, b_t: false }, &x, &delta, &|_, _| Epilogue::BiasGrad { at: fan_in * fan_out }, fan_out, &|_| {});
    let relu_back = |c: &mut [f32]| c.iter_mut().zip(&act).for_each(|(v, a)| if *a <= 0.0 { *v = 0.0 });
    check(Gemm { m: batch, n: fan_in, k: fan_out, a_t: false, b_t: true }, &delta, &w, &|_, a| Epilogue::ReluGrad { act: a }, 0, &relu_back);
    // The bias gradient beside the weight gradient stays the f32 column sum.
    let sums: Vec<f32> = (0..fan_out).map(|j| (0..batch).map(|r| delta[r * fan_out + j]).sum::<f32>()).collect();
    assert!(close(&out[1][fan_in * fan_out..], &sums, 1e-5), "bias gradient");
    dev.set_gemm_precision(GemmPrecision::F32).unwrap();
    out
}

#[test]
fn bf16_gemms_match_the_rounded_product_on_the_cpu_and_the_host_kernels() {
    let mut host = HostKernels::new().unwrap();
    let on_host = bf16_gemms_match_the_rounded_product(&mut host);
    assert!(host.fork().unwrap().gemm_precision() == GemmPrecision::F32);
    for threads in [1, 3] {
        let mut cpu = CpuDevice::new(threads);
        match cpu.set_gemm_precision(GemmPrecision::Bf16) {
            Err(e) => {
                assert_eq!(e.to_string(), "--dense-precision bf16 needs AVX-512 BF16 (avx512_bf16), which this CPU lacks; use f32");
                assert!(!ringrec::device::bgemm::available());
                eprintln!("skipped the CPU's bf16 GEMM: {e}");
                return;
            }
            Ok(()) => assert_eq!(cpu.fork().unwrap().gemm_precision(), GemmPrecision::Bf16, "a fork keeps the precision"),
        }
        let on_cpu = bf16_gemms_match_the_rounded_product(&mut cpu);
        for (c, h) in on_cpu.iter().zip(&on_host) {
            assert!(close(c, h, 1e-4), "CPU ({threads} threads) vs host kernels");
        }
    }
}

#[test]
fn gpu_bf16_gemms_match_the_rounded_product() {
    if let Some(mut d) = gpu() {
        bf16_gemms_match_the_rounded_product(&mut d);
    }
}

/// Every kernel against a plain reference on random inputs (exactly where the device sums
/// in the reference's order).
fn ops_match_the_reference<D: Device>(dev: &D, exact: bool) {
    let (batch, fields, dim, ndense, keys) = (37, 5, 4, 3, 29);
    let width = fields * dim + ndense;
    let mut s = 7u64;
    let inverse: Vec<u32> = (0..batch * fields).map(|_| (splitmix64_next(&mut s) % keys as u64) as u32).collect();
    let emb = random(keys * dim, 1);
    let dense = random(batch * ndense, 2);

    // Gather + copy == the input row fill.
    let mut want = vec![0f32; batch * width];
    for (s, row) in want.chunks_mut(width).enumerate() {
        fill_row(row, &emb, &inverse[s * fields..(s + 1) * fields], &dense[s * ndense..(s + 1) * ndense], dim);
    }
    let (emb_d, inv_d, dense_d) = (dev.buffer_from(&emb).unwrap(), dev.buffer_from(&inverse).unwrap(), dev.buffer_from(&dense).unwrap());
    let mut x = dev.alloc(batch * width).unwrap();
    dev.exec(Op::GatherRows { table: &emb_d, index: &inv_d, out: &mut x, rows: batch, per_row: fields, dim, stride: width }).unwrap();
    dev.exec(Op::CopyColumns { src: &dense_d, out: &mut x, rows: batch, cols: ndense, stride: width, col: fields * dim }).unwrap();
    assert_eq!(dev.to_vec(&x, batch * width).unwrap(), want, "gather_rows + copy_columns");

    // Segmented sum over the CSR lists == the sequential scatter, bit for bit (same order).
    let dx = random(batch * width, 3);
    let mut want = vec![0f32; keys * dim];
    scatter_key_grads(&dx, &inverse, batch, fields, dim, width, &mut want);
    let (mut offsets, mut slots, mut next) = (vec![0u32; keys + 1], vec![0u32; inverse.len()], Vec::new());
    build_csr(&inverse, keys, &mut offsets, &mut slots, &mut next).unwrap();
    let mut out = dev.alloc(keys * dim).unwrap();
    dev.exec(Op::SegmentSum { src: &dev.buffer_from(&dx).unwrap(), offsets: &dev.buffer_from(&offsets).unwrap(), slots: &dev.buffer_from(&slots).unwrap(), out: &mut out, segments: keys, rows: batch, per_row: fields, dim, stride: width }).unwrap();
    assert_eq!(dev.to_vec(&out, keys * dim).unwrap(), want, "segment_sum");

    // Bias + activation, ReLU backward, column sums.
    let (rows, cols) = (9, 7);
    let z0 = random(rows * cols, 4);
    let bias = random(cols + 3, 5); // used at offset 3
    for act in [Activation::Relu, Activation::Identity] {
        let mut z = dev.buffer_from(&z0).unwrap();
        dev.exec(Op::BiasAct { z: &mut z, bias: &dev.buffer_from(&bias).unwrap(), at: 3, rows, cols, act }).unwrap();
        let want: Vec<f32> = z0.iter().enumerate().map(|(i, v)| v + bias[3 + i % cols]).map(|v| if act == Activation::Relu { v.max(0.0) } else { v }).collect();
        assert_eq!(dev.to_vec(&z, rows * cols).unwrap(), want, "bias_act {act:?}");
    }
    let act = random(rows * cols, 6);
    let mut delta = dev.buffer_from(&z0).unwrap();
    dev.exec(Op::ReluGrad { delta: &mut delta, act: &dev.buffer_from(&act).unwrap(), n: rows * cols }).unwrap();
    let want: Vec<f32> = z0.iter().zip(&act).map(|(d, a)| if *a <= 0.0 { 0.0 } else { *d }).collect();
    assert_eq!(dev.to_vec(&delta, rows * cols).unwrap(), want, "relu_grad");
    let mut db = dev.alloc(cols + 2).unwrap();
    dev.exec(Op::ColumnSum { x: &dev.buffer_from(&z0).unwrap(), rows, cols, out: &mut db, at: 2 }).unwrap();
    let mut want = vec![0f32; cols + 2];
    for row in z0.chunks(cols) {
        for (c, v) in row.iter().enumerate() {
            want[2 + c] += v;
        }
    }
    same(&dev.to_vec(&db, cols + 2).unwrap(), &want, exact, "column_sum");

    // Binary cross-entropy, its gradient, the sum.
    let n = 53;
    let logits: Vec<f32> = random(n, 7).iter().map(|v| v * 30.0).collect();
    let labels: Vec<f32> = (0..n).map(|i| (i % 3 == 0) as u8 as f32).collect();
    let (mut loss, mut d) = (dev.alloc(n).unwrap(), dev.alloc(n).unwrap());
    dev.exec(Op::BceWithLogits { z: &dev.buffer_from(&logits).unwrap(), y: &dev.buffer_from(&labels).unwrap(), loss: &mut loss, delta: &mut d, n, scale: 0.25 }).unwrap();
    let want_loss: Vec<f32> = logits.iter().zip(&labels).map(|(z, y)| z.max(0.0) - z * y + (-z.abs()).exp().ln_1p()).collect();
    let want_d: Vec<f32> = logits.iter().zip(&labels).map(|(z, y)| (1.0 / (1.0 + (-z).exp()) - y) * 0.25).collect();
    assert!(close(&dev.to_vec(&loss, n).unwrap(), &want_loss, 1e-6), "bce loss");
    assert!(close(&dev.to_vec(&d, n).unwrap(), &want_d, 1e-6), "bce delta");
    // Weighted: each sample's loss and delta times its weight (0 drops it).
    let w: Vec<f32> = (0..n).map(|i| [0.0, 0.5, 1.0, 3.25][i % 4]).collect();
    let (mut wl, mut wd) = (dev.alloc(n).unwrap(), dev.alloc(n).unwrap());
    dev.exec(Op::WeightedBce { z: &dev.buffer_from(&logits).unwrap(), y: &dev.buffer_from(&labels).unwrap(), w: &dev.buffer_from(&w).unwrap(), loss: &mut wl, delta: &mut wd, n, scale: 0.25 }).unwrap();
    let want_wl: Vec<f32> = want_loss.iter().zip(&w).map(|(l, w)| l * w).collect();
    let want_wd: Vec<f32> = want_d.iter().zip(&w).map(|(d, w)| d * w).collect();
    assert!(close(&dev.to_vec(&wl, n).unwrap(), &want_wl, 1e-6), "weighted bce loss");
    assert!(close(&dev.to_vec(&wd, n).unwrap(), &want_wd, 1e-6), "weighted bce delta");
    assert_eq!(dev.to_vec(&wl, n).unwrap()[0], 0.0, "a zero weight drops the sample");
    let mut sum = dev.alloc(4).unwrap();
    dev.exec(Op::Sum { x: &loss, n, out: &mut sum, at: 3 }).unwrap();
    let want_sum = want_loss.iter().map(|v| *v as f64).sum::<f64>() as f32;
    let got = dev.to_vec(&sum, 4).unwrap();
    assert_eq!(&got[..3], &[0.0; 3]);
    assert!((got[3] - want_sum).abs() <= 1e-5 * want_sum.abs(), "sum {} vs {want_sum}", got[3]);

    // SGD and three Adam steps, parameters (and moments) at an offset.
    let (np, at) = (41, 5);
    let p0 = random(at + np, 8);
    for kind in [DenseOptimizer::Sgd, DenseOptimizer::Adam] {
        let (mut want, mut wm, mut wv) = (p0[at..].to_vec(), vec![0f32; np], vec![0f32; np]);
        let (mut p, mut m, mut v) = (dev.buffer_from(&p0).unwrap(), dev.alloc(at + np).unwrap(), dev.alloc(at + np).unwrap());
        for t in 1..=3u64 {
            let g = random(np, 100 + t);
            let gd = dev.buffer_from(&g).unwrap();
            match kind {
                DenseOptimizer::Sgd => {
                    want.iter_mut().zip(&g).for_each(|(p, g)| *p -= 0.01 * g);
                    dev.exec(Op::Sgd { p: &mut p, at, g: &gd, lr: 0.01, n: np }).unwrap();
                }
                DenseOptimizer::Adam => {
                    let (alpha, eps_hat) = adam_factors(0.01, t);
                    for i in 0..np {
                        wm[i] = BETA1 * wm[i] + (1.0 - BETA1) * g[i];
                        wv[i] = BETA2 * wv[i] + (1.0 - BETA2) * g[i] * g[i];
                        want[i] -= alpha * wm[i] / (wv[i].sqrt() + eps_hat);
                    }
                    dev.exec(Op::Adam { p: &mut p, at, g: &gd, m: &mut m, v: &mut v, alpha, beta1: BETA1, beta2: BETA2, eps_hat, n: np }).unwrap();
                }
            }
        }
        let got = dev.to_vec(&p, at + np).unwrap();
        assert_eq!(&got[..at], &p0[..at], "{kind:?}: parameters before the offset untouched");
        assert!(close(&got[at..], &want, 1e-6), "{kind:?}: {:?} vs {want:?}", &got[at..]);
    }
    casts_match_the_half_crate::<D, f16>(dev);
    casts_match_the_half_crate::<D, bf16>(dev);
    onebit_matches_the_host_compression(dev);
}

/// 1-bit encoding with error feedback (three rounds, both forms, sizes around a word and
/// past the norm's parts) == `engine::compression`, the host reference: the same signs and
/// residuals, scales within float rounding (the norm is summed in another order); and the
/// decoded sum over three ranks' encodings (at offsets in a gathered buffer) == the host's
/// decode in rank order, bit for bit.
fn onebit_matches_the_host_compression<D: Device>(dev: &D) {
    use ringrec::device::ops::onebit_words;
    use ringrec::engine::compression::{onebit_decode_add, onebit_len, OneBit, OneBitForm};
    for n in [1usize, 31, 32, 33, 1000, 9000] {
        for (l1, lambda, block) in [(true, 0.0f32, 0usize), (false, 1.0, 0), (false, 0.4, 0), (true, 0.0, 256), (false, 0.7, 7)] {
            let form = if l1 { OneBitForm::L1 } else { OneBitForm::L2 { lambda } };
            let what = format!("n {n} {form:?} block {block}");
            let mut host = OneBit::default();
            host.block = block;
            let mut residual = dev.alloc::<f32>(n).unwrap();
            let mut partial = dev.alloc::<u32>(2 * 4096.max(n)).unwrap();
            let (at, words) = (3, onebit_words(n, block));
            let scales = words - n.div_ceil(32);
            let mut enc = dev.alloc::<u32>(at + words).unwrap();
            let mut encs = Vec::new();
            for round in 0..4u64 {
                // Round 3 sends zeros: what it sends is the residual of the rounds before.
                let x = if round == 3 { vec![0f32; n] } else { random(n, 200 + round) };
                let mut want = Vec::new();
                host.encode_form("t", &x, form, &mut want);
                dev.exec(Op::OneBitEncode { x: &dev.buffer_from(&x).unwrap(), residual: &mut residual, n, l1, lambda, block, partial: &mut partial, enc: &mut enc, at }).unwrap();
                let got = dev.to_vec(&enc, at + words).unwrap();
                for s in 0..scales {
                    let (gs, ws) = (f32::from_bits(got[at + s]), f32::from_le_bytes(want[4 * s..4 * s + 4].try_into().unwrap()));
                    assert!((gs - ws).abs() <= 1e-5 * ws.abs().max(1e-12), "{what} round {round}: scale {s}: {gs} vs {ws}");
                }
                let got_bits: Vec<u8> = bytemuck::cast_slice::<u32, u8>(&got[at + scales..]).to_vec();
                assert_eq!(&got_bits[..n.div_ceil(8)], &want[4 * scales..], "{what} round {round}: signs");
                encs.push(got[at..].to_vec());
            }
            assert_eq!(onebit_len(n, block), 4 * scales + n.div_ceil(8));
            // Decode: three "ranks" (the first three rounds' encodings) at a stride, offset 2,
            // == the host's decode in rank order, bit for bit.
            let off = 2;
            let stride = off + words + 1;
            let mut gathered = vec![0u32; 3 * stride];
            for (r, e) in encs[..3].iter().enumerate() {
                gathered[r * stride + off..r * stride + off + words].copy_from_slice(e);
            }
            for average in [false, true] {
                let mut want = vec![0f32; n];
                for e in &encs[..3] {
                    let bytes: Vec<u8> = bytemuck::cast_slice::<u32, u8>(e).to_vec();
                    let mut wire = bytes[..4 * scales].to_vec();
                    wire.extend_from_slice(&bytes[4 * scales..4 * scales + n.div_ceil(8)]);
                    onebit_decode_add(&wire, &mut want, block).unwrap();
                }
                if average {
                    want.iter_mut().for_each(|v| *v /= 3.0);
                }
                let mut x = dev.buffer_from(&vec![7f32; n]).unwrap();
                dev.exec(Op::OneBitDecodeSum { gathered: &dev.buffer_from(&gathered).unwrap(), stride, at: off, ranks: 3, x: &mut x, n, block, average }).unwrap();
                assert_eq!(dev.to_vec(&x, n).unwrap(), want, "{what} average {average}: decoded sum");
            }
        }
    }
}

/// f32 -> half -> f32 at offsets == the `half` crate (round to nearest even), specials too.
fn casts_match_the_half_crate<D: Device, H: Half>(dev: &D) {
    let mut vals = random(200, 9).iter().map(|v| v * 70000.0).collect::<Vec<f32>>();
    vals.extend([0.0, -0.0, 1e-8, -6.1e-5, 65504.0, 65520.0, 1e30, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 3.0e-39]);
    let n = vals.len();
    let src = dev.buffer_from(&vals).unwrap();
    let mut h = dev.alloc::<H>(n + 1).unwrap();
    dev.exec(Op::ToHalf { src: &src, src_at: 0, dst: H::as_mut::<D>(&mut h), dst_at: 1, n }).unwrap();
    let bits = dev.to_vec(&h, n + 1).unwrap();
    for (i, v) in vals.iter().enumerate() {
        let want = H::from_f32(*v);
        let got = bits[i + 1];
        assert!(bytemuck::bytes_of(&got) == bytemuck::bytes_of(&want) || (got.to_f32().is_nan() && want.to_f32().is_nan()), "{}: {v}: {got:?} vs {want:?}", H::DTYPE);
    }
    let mut back = dev.alloc::<f32>(n).unwrap();
    dev.exec(Op::FromHalf { src: H::as_ref::<D>(&h), src_at: 1, dst: &mut back, dst_at: 0, n }).unwrap();
    for (g, w) in dev.to_vec(&back, n).unwrap().iter().zip(&bits[1..]) {
        let w = w.to_f32();
        assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()), "{} widen: {g} vs {w}", H::DTYPE);
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

fn batch(seed: u64, batch: usize, layout: InputLayout) -> Batch {
    let mut s = seed;
    let keys = 1 + (splitmix64_next(&mut s) % (batch * layout.fields) as u64) as usize;
    rest_of_batch(seed, &mut s, batch, keys, layout)
}

/// A batch of `batch` samples over exactly `keys` unique keys.
fn batch_of(seed: u64, batch: usize, keys: usize, layout: InputLayout) -> Batch {
    let mut s = seed;
    rest_of_batch(seed, &mut s, batch, keys, layout)
}

fn rest_of_batch(seed: u64, s: &mut u64, batch: usize, keys: usize, layout: InputLayout) -> Batch {
    let inverse: Vec<u32> = (0..batch * layout.fields).map(|i| if i < keys { i as u32 } else { (splitmix64_next(s) % keys as u64) as u32 }).collect();
    Batch { inverse, emb: random(keys * layout.dim, seed ^ 1), dense: random(batch * layout.ndense, seed ^ 2), labels: (0..batch).map(|_| (splitmix64_next(s) % 4 == 0) as u8 as f32).collect(), keys }
}

/// Stages `b` in `m`'s next staging slot (host only).
fn fill<D: Device>(m: &mut DenseModel<D>, b: &Batch) {
    let st = m.stage(b.labels.len(), b.keys).unwrap();
    st.emb.copy_from_slice(&b.emb);
    st.inverse.copy_from_slice(&b.inverse);
    st.dense.copy_from_slice(&b.dense);
    st.labels.copy_from_slice(&b.labels);
}

/// Stages `b` and loads it on the device.
fn stage<D: Device>(m: &mut DenseModel<D>, b: &Batch) {
    fill(m, b);
    m.load().unwrap();
}

/// A step of `m` whose gradients, summed over one rank, come straight back.
fn step_alone<D: Device>(m: &mut DenseModel<D>, scale: f32) -> Vec<Part> {
    let mut out: Vec<(Part, Tensor)> = Vec::new();
    m.step(scale, &mut |p, t| out.push((p, t))).unwrap();
    let parts = out.iter().map(|(p, _)| *p).collect();
    for (p, t) in out {
        m.give_back(p, t).unwrap();
    }
    parts
}

const LAYOUT: InputLayout = InputLayout { fields: 4, dim: 3, ndense: 2 };

fn model<D: Device>(dev: D, opt: DenseOptimizer, hidden: Vec<usize>, seed: u64) -> DenseModel<D> {
    let spec = spec_of(LAYOUT, hidden);
    let params = spec.init_params(seed);
    let n = params.len();
    DenseModel::new(dev, spec, &params, &DenseOptimState::new(opt, 0.01, n)).unwrap()
}

/// The MLP over `layout`.
fn spec_of(layout: InputLayout, hidden: Vec<usize>) -> ModelSpec {
    ModelSpec::mlp(layout.fields, layout.dim, layout.ndense, hidden)
}

/// The engine's device executor in miniature: on its own queue (`engine`, a fork of the
/// model's device), each tensor of a step is copied into a fusion buffer, summed with
/// itself there (the allreduce of two identical replicas: exact doubling) and copied back,
/// then given back, without waiting for that queue: the buffers' events alone must order
/// the copies after backward wrote the gradients and the optimizer after the copies back.
/// Returns the parts in the order the model handed them out.
fn step_through_a_queue<D: Device>(m: &mut DenseModel<D>, engine: &D, fused: &mut D::Buf<f32>, scale: f32) -> Vec<Part> {
    let mut out: Vec<(Part, Tensor)> = Vec::new();
    m.step(scale, &mut |p, t| out.push((p, t))).unwrap();
    let parts = out.iter().map(|(p, _)| *p).collect();
    let mut bufs: Vec<(Part, D::Buf<f32>)> = out.into_iter().map(|(p, t)| (p, engine.take_back::<f32>(t).unwrap())).collect();
    let total: usize = bufs.iter().map(|(_, b)| engine.len(b)).sum();
    if engine.len(fused) < total {
        *fused = engine.alloc(total).unwrap();
    }
    let mut at = 0;
    for (_, b) in &bufs {
        let n = engine.len(b);
        engine.copy((b, 0), (&mut *fused, at), n).unwrap();
        // fused[at..] += b: the other replica's identical contribution.
        engine.exec(Op::Sgd { p: &mut *fused, at, g: b, lr: -1.0, n }).unwrap();
        at += n;
    }
    let mut at = 0;
    for (_, b) in &mut bufs {
        let n = engine.len(b);
        engine.copy((&*fused, at), (b, 0), n).unwrap();
        at += n;
    }
    for (p, b) in bufs {
        m.give_back(p, engine.lend(b)).unwrap();
    }
    parts
}

/// Samples in step `t`'s batch: growing over the first steps, then varying, so the model's
/// buffers are reallocated while work on the old ones may still be queued.
fn batch_size(t: usize) -> usize {
    match t {
        0..=3 => [4, 9, 12, 16][t],
        _ => 8 + (t * 5) % 9,
    }
}

fn rel_diff(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-12)
}

/// 50 training steps of the model on `dev` against the model on the CPU device (the same
/// parameters, batches and optimizer): losses within 1e-3 relative, key gradients and final
/// parameters close; the next batch is staged before the current step's loss is read, and
/// the gradients go through a second queue of the device ([`step_through_a_queue`]).
/// Returns the worst relative loss difference, or what differed.
fn model_matches_the_cpu_device<D: Device>(dev: D) -> Result<f64, String> {
    let mut gpu = model(dev, DenseOptimizer::Adam, vec![8, 5], 11);
    let mut cpu = model(CpuDevice::new(1), DenseOptimizer::Adam, vec![8, 5], 11);
    let (engine, cpu_engine) = (gpu.device().fork().unwrap(), cpu.device().fork().unwrap());
    let (mut fused, mut cpu_fused) = (engine.alloc(0).unwrap(), cpu_engine.alloc(0).unwrap());
    let batches: Vec<Batch> = (0..51).map(|t| batch(1000 + t as u64, batch_size(t), LAYOUT)).collect();
    let mut worst = 0f64;
    fill(&mut gpu, &batches[0]);
    for (t, b) in batches[..50].iter().enumerate() {
        let scale = 1.0 / b.labels.len() as f32;
        gpu.load().unwrap();
        stage(&mut cpu, b);
        assert_eq!(step_through_a_queue(&mut gpu, &engine, &mut fused, scale), vec![Part::Layer(2), Part::Layer(1), Part::Layer(0), Part::Loss], "layers handed out last first, then the loss");
        step_through_a_queue(&mut cpu, &cpu_engine, &mut cpu_fused, scale);
        // Double buffering: the next batch is staged while this step's results are pending.
        fill(&mut gpu, &batches[t + 1]);
        if !close(gpu.key_grads().unwrap(), cpu.key_grads().unwrap(), 1e-4) {
            return Err(format!("step {t}: key gradients differ"));
        }
        let (lg, lc) = (gpu.loss_sum().unwrap(), cpu.loss_sum().unwrap());
        worst = worst.max(rel_diff(lg, lc));
        if rel_diff(lg, lc) > 1e-3 {
            return Err(format!("step {t}: loss {lg} vs cpu {lc}"));
        }
        gpu.apply().unwrap();
        cpu.apply().unwrap();
    }
    eprintln!("{}: 50 steps, worst relative loss difference {worst:.2e}", gpu.device().describe());
    if !close(&gpu.params().unwrap(), &cpu.params().unwrap(), 1e-3) {
        return Err("parameters after 50 steps differ".into());
    }
    let (sg, sc) = (gpu.optim_state().unwrap(), cpu.optim_state().unwrap());
    assert_eq!(sg.step, 50);
    if !(close(&sg.m, &sc.m, 1e-3) && close(&sg.v, &sc.v, 1e-3)) {
        return Err("Adam moments differ".into());
    }
    // Inference on the staged batch equals the CPU device's.
    let (mut want, mut got) = (Vec::new(), Vec::new());
    stage(&mut cpu, &batches[50]);
    cpu.predict(&mut want).unwrap();
    gpu.load().unwrap();
    gpu.predict(&mut got).unwrap();
    assert_eq!(got.len(), batches[50].labels.len());
    if !close(&got, &want, 1e-3) {
        return Err("predictions differ".into());
    }
    Ok(worst)
}

/// The host runs ahead of the device: `steps` batches staged, loaded, stepped (gradients
/// through a second queue) and applied with nothing read back in between, so the host
/// waits only where [`DenseModel::stage`] waits for the uploads out of a staging slot two
/// batches ago, and buffers are regrown (`grow`: batch sizes and key counts vary) while
/// the work of earlier steps on them is still queued. Then the parameters and the last
/// loss against the CPU device's. `grow` false: every batch has 12 samples over 20 keys.
fn staging_runs_ahead<D: Device>(dev: D, steps: usize, grow: bool) -> Result<(), String> {
    let mut gpu = model(dev, DenseOptimizer::Adam, vec![8, 5], 13);
    let mut cpu = model(CpuDevice::new(1), DenseOptimizer::Adam, vec![8, 5], 13);
    let (engine, cpu_engine) = (gpu.device().fork().unwrap(), cpu.device().fork().unwrap());
    let (mut fused, mut cpu_fused) = (engine.alloc(0).unwrap(), cpu_engine.alloc(0).unwrap());
    for t in 0..steps {
        let b = if grow { batch(2000 + t as u64, batch_size(t), LAYOUT) } else { batch_of(2000 + t as u64, 12, 20, LAYOUT) };
        let scale = 1.0 / b.labels.len() as f32;
        stage(&mut gpu, &b);
        step_through_a_queue(&mut gpu, &engine, &mut fused, scale);
        gpu.apply().unwrap();
        stage(&mut cpu, &b);
        step_through_a_queue(&mut cpu, &cpu_engine, &mut cpu_fused, scale);
        cpu.apply().unwrap();
    }
    let (lg, lc) = (gpu.loss_sum().unwrap(), cpu.loss_sum().unwrap());
    if rel_diff(lg, lc) > 1e-3 {
        return Err(format!("last loss {lg} vs cpu {lc}"));
    }
    if !close(&gpu.params().unwrap(), &cpu.params().unwrap(), 1e-3) {
        return Err(format!("parameters after {steps} steps differ"));
    }
    Ok(())
}

/// Two "ranks" with half a batch each, their gradients and loss sums summed as an allreduce
/// would, give the one-rank model's losses and parameters.
fn halves_summed_equal_the_whole<D: Device>(make: impl Fn() -> D) {
    let n = 10;
    let layout = InputLayout { fields: 3, dim: 2, ndense: 1 };
    let spec = spec_of(layout, vec![6]);
    let params = spec.init_params(5);
    let opt = DenseOptimState::new(DenseOptimizer::Sgd, 0.1, params.len());
    let mk = || DenseModel::new(make(), spec.clone(), &params, &opt).unwrap();
    let (mut whole, mut a, mut b) = (mk(), mk(), mk());
    for t in 0..5 {
        let full = batch(77 + t, n, layout);
        // Rank 0 takes samples 0..4, rank 1 samples 4..10, with their own key numbering.
        let split = |lo: usize, hi: usize| {
            let inv = &full.inverse[lo * layout.fields..hi * layout.fields];
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
            let emb = uniq.iter().flat_map(|u| full.emb[*u as usize * layout.dim..(*u as usize + 1) * layout.dim].to_vec()).collect();
            Batch { inverse, emb, dense: full.dense[lo * layout.ndense..hi * layout.ndense].to_vec(), labels: full.labels[lo..hi].to_vec(), keys: uniq.len() }
        };
        let scale = 1.0 / n as f32;
        stage(&mut whole, &full);
        step_alone(&mut whole, scale);
        let mut halves = Vec::new();
        for (m, (lo, hi)) in [(&mut a, (0, 4)), (&mut b, (4, n))] {
            stage(m, &split(lo, hi));
            let mut out = Vec::new();
            m.step(scale, &mut |p, t| out.push((p, t))).unwrap();
            halves.push(out);
        }
        let (ha, hb) = (halves.remove(0), halves.remove(0));
        for ((pa, ta), (pb, tb)) in ha.into_iter().zip(hb) {
            assert_eq!(pa, pb);
            let (va, vb) = (a.device().take_back::<f32>(ta).unwrap(), b.device().take_back::<f32>(tb).unwrap());
            let sum: Vec<f32> = a.device().to_vec(&va, a.device().len(&va)).unwrap().iter().zip(b.device().to_vec(&vb, b.device().len(&vb)).unwrap()).map(|(x, y)| x + y).collect();
            for m in [&mut a, &mut b] {
                let t = m.device().lend(m.device().buffer_from(&sum).unwrap());
                m.give_back(pa, t).unwrap();
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

/// Buffers too small for an operation, and a staged inverse naming a missing row, are errors.
fn bad_launches_are_refused<D: Device>(make: impl Fn() -> D) {
    let dev = make();
    let mut z = dev.alloc(10).unwrap();
    let bias = dev.alloc(4).unwrap();
    let e = dev.exec(Op::BiasAct { z: &mut z, bias: &bias, at: 1, rows: 3, cols: 4, act: Activation::Relu }).unwrap_err().to_string();
    assert!(e.contains("bias_act: z") && e.contains("buffer of 10 elements, the launch needs 12"), "{e}");
    let e = dev.exec(Op::BiasAct { z: &mut dev.alloc(12).unwrap(), bias: &bias, at: 1, rows: 3, cols: 4, act: Activation::Relu }).unwrap_err().to_string();
    assert!(e.contains("bias_act: bias") && e.contains("needs 5"), "{e}");
    let e = dev.gemm(&Gemm { m: 2, n: 3, k: 4, a_t: false, b_t: false }, (&dev.alloc(8).unwrap(), 1), (&dev.alloc(12).unwrap(), 0), (&mut dev.alloc(6).unwrap(), 0), Epilogue::None).unwrap_err().to_string();
    assert!(e.contains("gemm: a") && e.contains("needs 9"), "{e}");
    let mut m = model(make(), DenseOptimizer::Sgd, vec![4], 1);
    let st = m.stage(2, 3).unwrap();
    st.inverse.copy_from_slice(&[0, 1, 2, 0, 3, 1, 2, 2]);
    let e = m.load().unwrap_err().to_string();
    assert!(e.contains("inverse names row 3 of 3 unique keys"), "{e}");
    assert!(m.load().unwrap_err().to_string().contains("no batch was staged"));
    let spec = spec_of(LAYOUT, vec![4]);
    let opt = DenseOptimState::new(DenseOptimizer::Sgd, 0.1, spec.num_params());
    let e = DenseModel::new(make(), spec.clone(), &spec.init_params(1)[1..], &opt).err().unwrap().to_string();
    assert!(e.contains("parameters given"), "{e}");
}

/// Random bags for the pooling tests: `rows x bags` bags of 0 to 6 ids among `keys` keys
/// (some empty), as (index, offsets).
fn random_bags(rows: usize, bags: usize, keys: usize, seed: u64) -> (Vec<u32>, Vec<u32>) {
    let (mut s, mut index, mut offsets) = (seed, Vec::new(), vec![0u32]);
    for _ in 0..rows * bags {
        for _ in 0..splitmix64_next(&mut s) % 7 {
            index.push((splitmix64_next(&mut s) % keys as u64) as u32);
        }
        offsets.push(index.len() as u32);
    }
    (index, offsets)
}

/// Multi-hot pooling (also through the hot-row cache's sources) and its backward against a
/// plain loop (bit for bit: the same order), sum and mean fields side by side, into rows
/// with other columns around the bags; the backward adds to what the key gradients hold.
fn pooling_matches_a_plain_loop<D: Device>(dev: &D) {
    let (rows, bags, dim, keys, col, stride) = (23, 3, 4, 17, 5, 5 + 3 * 4 + 2);
    let mean = 0b010;
    let (index, offsets) = random_bags(rows, bags, keys, 11);
    let table = random(keys * dim, 12);
    let mut want = random(rows * stride, 13);
    let mut out = dev.buffer_from(&want).unwrap();
    for b in 0..rows * bags {
        let (lo, hi) = (offsets[b] as usize, offsets[b + 1] as usize);
        for d in 0..dim {
            let mut acc = 0f32;
            for u in &index[lo..hi] {
                acc += table[*u as usize * dim + d];
            }
            if (mean >> (b % bags)) & 1 == 1 && hi > lo {
                acc /= (hi - lo) as f32;
            }
            want[(b / bags) * stride + col + (b % bags) * dim + d] = acc;
        }
    }
    let (table_d, index_d, offsets_d) = (dev.buffer_from(&table).unwrap(), dev.buffer_from(&index).unwrap(), dev.buffer_from(&offsets).unwrap());
    dev.exec(Op::PoolBags { table: &table_d, index: &index_d, offsets: &offsets_d, out: &mut out, rows, bags, dim, stride, col, mean }).unwrap();
    assert_eq!(dev.to_vec(&out, rows * stride).unwrap(), want, "pool_bags");
    // Through the GPU hot-row cache: the same rows split between cache slots (every other
    // key, in reverse order) and staged misses pool to the same bits.
    let (mut cache, mut misses, mut source) = (vec![0f32; keys * dim], Vec::new(), Vec::new());
    for u in 0..keys {
        let row = &table[u * dim..(u + 1) * dim];
        if u % 2 == 0 {
            let slot = keys - 1 - u;
            cache[slot * dim..(slot + 1) * dim].copy_from_slice(row);
            source.push(slot as u32);
        } else {
            source.push(CACHE_MISS | (misses.len() / dim) as u32);
            misses.extend_from_slice(row);
        }
    }
    let (cache, misses, source) = (dev.buffer_from(&cache).unwrap(), dev.buffer_from(&misses).unwrap(), dev.buffer_from(&source).unwrap());
    let mut sourced = dev.buffer_from(&random(rows * stride, 13)).unwrap();
    dev.exec(Op::PoolBagsSourced { cache: &cache, misses: &misses, source: &source, index: &index_d, offsets: &offsets_d, out: &mut sourced, rows, bags, dim, stride, col, mean }).unwrap();
    assert_eq!(dev.to_vec(&sourced, rows * stride).unwrap(), want, "pool_bags_sourced");
    let empty = (0..rows * bags).find(|b| offsets[*b] == offsets[b + 1]).expect("an empty bag");
    let at = (empty / bags) * stride + col + (empty % bags) * dim;
    assert_eq!(&want[at..at + dim], &[0.0; 4], "an empty bag pools to zeros");

    // Backward: every id of a bag gets the bag's gradient (over its length for a mean
    // field), summed per key in bag order onto what the key's row held.
    let dx = random(rows * stride, 14);
    let held = random(keys * dim, 15);
    let mut want = held.clone();
    for b in 0..rows * bags {
        let (lo, hi) = (offsets[b] as usize, offsets[b + 1] as usize);
        for u in &index[lo..hi] {
            for d in 0..dim {
                let mut g = dx[(b / bags) * stride + col + (b % bags) * dim + d];
                if (mean >> (b % bags)) & 1 == 1 {
                    g /= (hi - lo) as f32;
                }
                want[*u as usize * dim + d] += g;
            }
        }
    }
    let (mut key_offsets, mut slots, mut next) = (vec![0u32; keys + 1], vec![0u32; index.len()], Vec::new());
    build_bag_csr(&index, &offsets, keys, &mut key_offsets, &mut slots, &mut next).unwrap();
    let mut grads = dev.buffer_from(&held).unwrap();
    let (ko, sl) = (dev.buffer_from(&key_offsets).unwrap(), dev.buffer_from(&slots).unwrap());
    dev.exec(Op::PoolBagsGrad { src: &dev.buffer_from(&dx).unwrap(), offsets: &offsets_d, key_offsets: &ko, slots: &sl, out: &mut grads, segments: keys, rows, bags, dim, stride, col, mean }).unwrap();
    assert_eq!(dev.to_vec(&grads, keys * dim).unwrap(), want, "pool_bags_grad");

    // Bags that do not fit the row, or too many fields for the mask, are refused.
    let e = dev.exec(Op::PoolBags { table: &table_d, index: &index_d, offsets: &offsets_d, out: &mut out, rows, bags, dim, stride: col + bags * dim - 1, col, mean }).unwrap_err().to_string();
    assert!(e.contains("do not fit"), "{e}");
    let e = dev.exec(Op::PoolBags { table: &table_d, index: &index_d, offsets: &offsets_d, out: &mut out, rows: 0, bags: 33, dim: 0, stride, col, mean }).unwrap_err().to_string();
    assert!(e.contains("at most 32"), "{e}");
}

#[test]
fn cpu_pooling_matches_a_plain_loop() {
    for threads in [1, 3] {
        pooling_matches_a_plain_loop(&CpuDevice::new(threads));
    }
}

#[test]
fn host_kernels_pooling_matches_a_plain_loop() {
    pooling_matches_a_plain_loop(&HostKernels::new().unwrap());
}

#[test]
fn gpu_pooling_matches_a_plain_loop() {
    if let Some(d) = gpu() {
        pooling_matches_a_plain_loop(&d);
    }
}

/// The per-key lists built on the device ([`Op::BuildCsr`]) against the host's
/// [`build_csr`], slot for slot: key counts that take one to five radix passes, slot counts
/// around the sort's chunk, keys no slot names, a key in every slot, no slots at all.
fn device_csr_matches_the_host<D: Device>(dev: &D) {
    let mut scratch = CsrScratch::new(dev).unwrap();
    let (mut offsets, mut slots) = (dev.alloc(1).unwrap(), dev.alloc(1).unwrap());
    let mut s = 41u64;
    for (n, keys) in [(0usize, 0usize), (0, 3), (1, 1), (255, 1), (256, 16), (257, 17), (700, 300), (1000, 5000), (3000, 70_000), (2049, 1 << 20)] {
        // Half the slots name a few hot keys, the rest any key (many keys named by none).
        let inverse: Vec<u32> = (0..n)
            .map(|_| {
                let r = splitmix64_next(&mut s);
                let k = if r % 2 == 0 { r % 5 } else { r % keys.max(1) as u64 };
                k.min(keys.saturating_sub(1) as u64) as u32
            })
            .collect();
        let (mut want_offsets, mut want_slots, mut next) = (vec![0u32; keys + 1], vec![0u32; n], Vec::new());
        build_csr(&inverse, keys, &mut want_offsets, &mut want_slots, &mut next).unwrap();
        let inverse_d = dev.buffer_from(&inverse).unwrap();
        if dev.len(&offsets) < keys + 1 {
            offsets = dev.alloc(keys + 1).unwrap();
        }
        if dev.len(&slots) < n {
            slots = dev.alloc(n).unwrap();
        }
        scratch.fit(dev, n).unwrap();
        dev.exec(Op::BuildCsr { inverse: &inverse_d, n, keys, offsets: &mut offsets, slots: &mut slots, scratch: &mut scratch }).unwrap();
        assert_eq!(dev.to_vec(&offsets, keys + 1).unwrap(), want_offsets, "offsets of {n} slots over {keys} keys");
        assert_eq!(dev.to_vec(&slots, n).unwrap(), want_slots, "slots of {n} slots over {keys} keys");
    }
    // Buffers too small for the slots are refused before anything runs.
    let mut small = CsrScratch::new(dev).unwrap();
    let inverse_d = dev.buffer_from(&[0u32; 300]).unwrap();
    let e = dev.exec(Op::BuildCsr { inverse: &inverse_d, n: 300, keys: 1, offsets: &mut offsets, slots: &mut slots, scratch: &mut small }).unwrap_err().to_string();
    assert!(e.contains("scratch"), "{e}");
    let e = dev.exec(Op::BuildCsr { inverse: &inverse_d, n: 301, keys: 1, offsets: &mut offsets, slots: &mut slots, scratch: &mut scratch }).unwrap_err().to_string();
    assert!(e.contains("inverse"), "{e}");
}

#[test]
fn cpu_device_csr_matches_the_host() {
    device_csr_matches_the_host(&CpuDevice::new(2));
}

#[test]
fn host_kernels_device_csr_matches_the_host() {
    device_csr_matches_the_host(&HostKernels::new().unwrap());
    // Queued and run later at random speeds: the passes' reads and writes stay ordered.
    for seed in &DELAY_SEEDS[..3] {
        device_csr_matches_the_host(&delayed(*seed, None));
    }
}

#[test]
fn gpu_device_csr_matches_the_host() {
    if let Some(d) = gpu() {
        device_csr_matches_the_host(&d);
    }
}

/// New keys' rows made on the device ([`Op::InitRows`]) against the host's initial rows, bit
/// for bit: keys with high bits set, at a row offset, other rows left alone.
fn device_init_rows_match_the_host<D: Device>(dev: &D) {
    let (dim, at, seed, scale) = (13, 3, 0x1234_5678_9abc_def0u64, 0.25f32);
    let mut s = 5u64;
    let keys: Vec<u64> = (0..37).map(|i| if i == 0 { u64::MAX } else { splitmix64_next(&mut s) >> (i % 40) }).collect();
    let halves: Vec<u32> = keys.iter().flat_map(|k| [*k as u32, (*k >> 32) as u32]).collect();
    let before = random((at + keys.len() + 2) * dim, 9);
    let mut want = before.clone();
    for (e, k) in keys.iter().enumerate() {
        ringrec::hash::init_row_f32(*k, seed, scale, &mut want[(at + e) * dim..(at + e + 1) * dim]);
    }
    let mut out = dev.buffer_from(&before).unwrap();
    dev.exec(Op::InitRows { keys: &dev.buffer_from(&halves).unwrap(), out: &mut out, at, n: keys.len(), dim, seed, scale }).unwrap();
    let got = dev.to_vec(&out, before.len()).unwrap();
    assert!(got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits()), "init_rows: {got:?} vs {want:?}");
    let e = dev.exec(Op::InitRows { keys: &dev.buffer_from(&halves).unwrap(), out: &mut out, at: at + 3, n: keys.len(), dim, seed, scale }).unwrap_err().to_string();
    assert!(e.contains("out"), "{e}");
}

#[test]
fn cpu_device_init_rows_match_the_host() {
    device_init_rows_match_the_host(&CpuDevice::new(2));
}

#[test]
fn host_kernels_device_init_rows_match_the_host() {
    device_init_rows_match_the_host(&HostKernels::new().unwrap());
    device_init_rows_match_the_host(&delayed(2, None));
}

#[test]
fn gpu_device_init_rows_match_the_host() {
    if let Some(d) = gpu() {
        device_init_rows_match_the_host(&d);
    }
}

#[test]
fn pooling_gradient_matches_finite_differences() {
    // loss = sum of w * pooled over the bags; its gradient in a table entry by central
    // differences against what pool_bags_grad spreads to the entry's key.
    let dev = CpuDevice::new(2);
    let (rows, bags, dim, keys) = (9, 2, 3, 7);
    let stride = bags * dim;
    for mean in [0b00, 0b01, 0b11] {
        let (index, offsets) = random_bags(rows, bags, keys, 21 + mean as u64);
        let table = random(keys * dim, 22);
        let w = random(rows * stride, 23);
        let offsets_d = dev.buffer_from(&offsets).unwrap();
        let loss = |t: &[f32]| -> f64 {
            let mut out = dev.alloc(rows * stride).unwrap();
            dev.exec(Op::PoolBags { table: &dev.buffer_from(t).unwrap(), index: &dev.buffer_from(&index).unwrap(), offsets: &offsets_d, out: &mut out, rows, bags, dim, stride, col: 0, mean }).unwrap();
            dev.to_vec(&out, rows * stride).unwrap().iter().zip(&w).map(|(p, w)| (*p as f64) * (*w as f64)).sum()
        };
        let (mut key_offsets, mut slots, mut next) = (vec![0u32; keys + 1], vec![0u32; index.len()], Vec::new());
        build_bag_csr(&index, &offsets, keys, &mut key_offsets, &mut slots, &mut next).unwrap();
        let mut grads = dev.alloc(keys * dim).unwrap();
        let (ko, sl) = (dev.buffer_from(&key_offsets).unwrap(), dev.buffer_from(&slots).unwrap());
        dev.exec(Op::PoolBagsGrad { src: &dev.buffer_from(&w).unwrap(), offsets: &offsets_d, key_offsets: &ko, slots: &sl, out: &mut grads, segments: keys, rows, bags, dim, stride, col: 0, mean }).unwrap();
        let grads = dev.to_vec(&grads, keys * dim).unwrap();
        let eps = 1e-2f32;
        for i in 0..keys * dim {
            let (mut up, mut down) = (table.clone(), table.clone());
            up[i] += eps;
            down[i] -= eps;
            let fd = (loss(&up) - loss(&down)) / (2.0 * eps as f64);
            assert!((fd - grads[i] as f64).abs() <= 1e-3 * (1.0 + fd.abs()), "mean mask {mean:#b}, entry {i}: finite difference {fd} vs {}", grads[i]);
        }
    }
}

/// Fields of several widths (`--table`): `GatherFields` and `GatherFieldsGrad` against a
/// plain loop, bit for bit (the same order). Three tables of rows of 3, 5 and 2 values, keys
/// grouped by table; single-hot fields of widths 3, 5, 3 and multi-hot fields of widths 2
/// and 5 (bags of 0 to 6 ids, some empty), summed and averaged; other columns around them
/// are left as they were.
fn fields_match_a_plain_loop<D: Device>(dev: &D) {
    use ringrec::model::fields::FieldWidths;
    let (table_width, table_keys) = ([3usize, 5, 2], [7usize, 6, 4]);
    let field_table = [0usize, 1, 0, 2, 1];
    let fw = FieldWidths { widths: field_table.iter().map(|t| table_width[*t]).collect(), single: 3 };
    let (fields, single, bags, rows) = (5, 3, 2, 19);
    let (cols, stride) = (fw.cols(), fw.cols() + 2);
    // Keys grouped by table: table t's l-th key is key first[t] + l, its row at key_at.
    let first: Vec<usize> = (0..3).map(|t| table_keys[..t].iter().sum()).collect();
    let keys: usize = table_keys.iter().sum();
    let mut key_at = vec![0u32];
    for t in 0..3 {
        for _ in 0..table_keys[t] {
            key_at.push(key_at.last().unwrap() + table_width[t] as u32);
        }
    }
    let floats = *key_at.last().unwrap() as usize;
    let emb = random(floats, 31);
    let mut s = 32u64;
    let mut key_of = |t: usize| (first[t] + (splitmix64_next(&mut s) % table_keys[t] as u64) as usize) as u32;
    let inverse: Vec<u32> = (0..rows * single).map(|p| key_of(field_table[p % single])).collect();
    let (mut index, mut offsets) = (Vec::new(), vec![0u32]);
    for b in 0..rows * bags {
        for _ in 0..(b * 7919 + 3) % 7 {
            index.push(key_of(field_table[single + b % bags]));
        }
        offsets.push(index.len() as u32);
    }
    assert!(offsets.windows(2).any(|w| w[0] == w[1]), "an empty bag");
    let (field_col, col_field) = (fw.field_col(), fw.col_field());
    let row = |u: u32| &emb[key_at[u as usize] as usize..key_at[u as usize + 1] as usize];
    let put = |d: &D, v: &[u32]| d.buffer_from(v).unwrap();
    let (emb_d, key_at_d, inverse_d, index_d, offsets_d) = (dev.buffer_from(&emb).unwrap(), put(dev, &key_at), put(dev, &inverse), put(dev, &index), put(dev, &offsets));
    let (field_col_d, col_field_d) = (put(dev, &field_col), put(dev, &col_field));
    for mean in [0b01u32, 0b10] {
        let cols_of = || ringrec::device::FieldCols { field_col: &field_col_d, col_field: &col_field_d, cols, fields, single, mean };
        let mut want = random(rows * stride, 33);
        let mut out = dev.buffer_from(&want).unwrap();
        for r in 0..rows {
            for f in 0..fields {
                let (lo, w) = (field_col[f] as usize, fw.widths[f]);
                for d in 0..w {
                    want[r * stride + lo + d] = if f < single {
                        row(inverse[r * single + f])[d]
                    } else {
                        let (g, b) = (f - single, r * bags + f - single);
                        let ids = &index[offsets[b] as usize..offsets[b + 1] as usize];
                        let mut acc = 0f32;
                        for u in ids {
                            acc += row(*u)[d];
                        }
                        if (mean >> g) & 1 == 1 && !ids.is_empty() {
                            acc /= ids.len() as f32;
                        }
                        acc
                    };
                }
            }
        }
        dev.exec(Op::GatherFields { emb: &emb_d, key_at: &key_at_d, inverse: &inverse_d, index: &index_d, offsets: &offsets_d, cols: cols_of(), out: &mut out, rows, stride }).unwrap();
        assert_eq!(dev.to_vec(&out, rows * stride).unwrap(), want, "gather_fields, mean mask {mean:#b}");

        // Backward: per key, from zero, its single-hot slots in slot order, then its bags in
        // bag order (over the bag's length for a mean field).
        let dx = random(rows * stride, 34 + mean as u64);
        let mut want = vec![0f32; floats];
        for u in 0..keys {
            let (at, w) = (key_at[u] as usize, (key_at[u + 1] - key_at[u]) as usize);
            for d in 0..w {
                let mut acc = 0f32;
                for p in (0..rows * single).filter(|p| inverse[*p] as usize == u) {
                    acc += dx[(p / single) * stride + field_col[p % single] as usize + d];
                }
                for b in 0..rows * bags {
                    let (lo, hi) = (offsets[b] as usize, offsets[b + 1] as usize);
                    for _ in index[lo..hi].iter().filter(|v| **v as usize == u) {
                        let mut g = dx[(b / bags) * stride + field_col[single + b % bags] as usize + d];
                        if (mean >> (b % bags)) & 1 == 1 {
                            g /= (hi - lo) as f32;
                        }
                        acc += g;
                    }
                }
                want[at + d] = acc;
            }
        }
        let (mut key_offsets, mut slots, mut next) = (vec![0u32; keys + 1], vec![0u32; rows * single], Vec::new());
        build_csr(&inverse, keys, &mut key_offsets, &mut slots, &mut next).unwrap();
        let (mut bag_key_offsets, mut bag_slots) = (vec![0u32; keys + 1], vec![0u32; index.len()]);
        build_bag_csr(&index, &offsets, keys, &mut bag_key_offsets, &mut bag_slots, &mut next).unwrap();
        let mut grads = dev.buffer_from(&random(floats, 35)).unwrap();
        let (ko, sl, bko, bsl) = (put(dev, &key_offsets), put(dev, &slots), put(dev, &bag_key_offsets), put(dev, &bag_slots));
        let op = Op::GatherFieldsGrad { src: &dev.buffer_from(&dx).unwrap(), key_at: &key_at_d, offsets: &ko, slots: &sl, bag_offsets: &offsets_d, key_offsets: &bko, bag_slots: &bsl, cols: cols_of(), out: &mut grads, keys, widest: 5, floats, rows, stride };
        dev.exec(op).unwrap();
        assert_eq!(dev.to_vec(&grads, floats).unwrap(), want, "gather_fields_grad, mean mask {mean:#b}");
    }
    // Columns wider than the row are refused.
    let cols_of = || ringrec::device::FieldCols { field_col: &field_col_d, col_field: &col_field_d, cols, fields, single, mean: 0 };
    let mut out = dev.alloc(rows * stride).unwrap();
    let e = dev.exec(Op::GatherFields { emb: &emb_d, key_at: &key_at_d, inverse: &inverse_d, index: &index_d, offsets: &offsets_d, cols: cols_of(), out: &mut out, rows, stride: cols - 1 }).unwrap_err().to_string();
    assert!(e.contains("do not fit"), "{e}");
}

#[test]
fn cpu_fields_match_a_plain_loop() {
    for threads in [1, 3] {
        fields_match_a_plain_loop(&CpuDevice::new(threads));
    }
}

#[test]
fn host_kernels_fields_match_a_plain_loop_under_random_delays() {
    fields_match_a_plain_loop(&HostKernels::new().unwrap());
    for seed in DELAY_SEEDS {
        fields_match_a_plain_loop(&delayed(seed, None));
    }
}

#[test]
fn gpu_fields_match_a_plain_loop() {
    if let Some(d) = gpu() {
        fields_match_a_plain_loop(&d);
    }
}

/// Stages `b` in `m` with its last `bags` fields as bags of one id each (the ids `inverse`
/// names for them), and loads it.
fn stage_as_bags<D: Device>(m: &mut DenseModel<D>, b: &Batch, bags: usize) {
    let (batch, fields) = (b.labels.len(), m.spec().layout().fields);
    let index: Vec<u32> = (0..batch).flat_map(|s| b.inverse[s * fields + fields - bags..(s + 1) * fields].to_vec()).collect();
    let offsets: Vec<u32> = (0..=batch * bags).map(|i| i as u32).collect();
    stage_with_bags(m, b, bags, &index, &offsets);
}

/// Every model (the MLP, DLRM, DCN, DeepFM, Wide & Deep) whose last two fields are
/// multi-hot bags of one id each trains bit for bit as the same model with those ids
/// single-hot (a bag of one pools to its row, sum or mean, and spreads the whole gradient
/// back to it), every key distinct so the per-key sums have one term.
fn bags_of_one_equal_single_hot_fields<D: Device>(make: impl Fn() -> D) {
    let specs = std::iter::once(spec_of(LAYOUT, vec![8, 4])).chain(model_specs());
    for (spec, modes) in specs.zip([[Pooling::Sum, Pooling::Sum], [Pooling::Mean, Pooling::Sum]].into_iter().cycle()) {
        let (what, layout) = (spec.describe(), spec.layout());
        let params = spec.init_params(5);
        let opt = DenseOptimState::new(DenseOptimizer::Adam, 0.01, params.len());
        let (mut single, mut multi) = (DenseModel::new(make(), spec.clone(), &params, &opt).unwrap(), DenseModel::new(make(), spec.clone(), &params, &opt).unwrap());
        multi.set_multi_hot(&modes).unwrap();
        for t in 0..4u64 {
            let n = 6 + t as usize;
            let b = batch_of(40 + t, n, n * layout.fields, layout);
            stage(&mut single, &b);
            stage_as_bags(&mut multi, &b, modes.len());
            step_alone(&mut single, 0.1);
            step_alone(&mut multi, 0.1);
            assert_eq!(single.key_grads().unwrap().to_vec(), multi.key_grads().unwrap().to_vec(), "{what}, {modes:?}, step {t}: key gradients");
            single.apply().unwrap();
            multi.apply().unwrap();
        }
        assert_eq!(single.params().unwrap(), multi.params().unwrap(), "{what}, {modes:?}: parameters after 4 steps");
    }
    // A model with bags refuses a batch staged without them.
    let mut m = model(make(), DenseOptimizer::Sgd, vec![4], 1);
    m.set_multi_hot(&[Pooling::Sum]).unwrap();
    let b = batch_of(3, 5, 5 * LAYOUT.fields, LAYOUT);
    let st = m.stage(5, b.keys).unwrap();
    st.inverse.fill(0);
    let e = m.load().unwrap_err().to_string();
    assert!(e.contains("stage_bags"), "{e}");
    assert!(m.set_multi_hot(&[Pooling::Sum; 5]).is_err(), "more multi-hot fields than fields");
}

#[test]
fn cpu_bags_of_one_equal_single_hot_fields() {
    bags_of_one_equal_single_hot_fields(|| CpuDevice::new(2));
}

#[test]
fn host_kernels_bags_of_one_equal_single_hot_fields() {
    bags_of_one_equal_single_hot_fields(|| HostKernels::new().unwrap());
}

#[test]
fn gpu_bags_of_one_equal_single_hot_fields() {
    if gpu().is_some() {
        bags_of_one_equal_single_hot_fields(|| CudaDevice::new(0).unwrap());
    }
}

/// Stages `b`'s first `fields - bags` fields as single-hot and the bags `(index, offsets)`
/// (rows among `b`'s keys) in `m`, and loads it.
fn stage_with_bags<D: Device>(m: &mut DenseModel<D>, b: &Batch, bags: usize, index: &[u32], offsets: &[u32]) {
    let (batch, fields) = (b.labels.len(), m.spec().layout().fields);
    let single = fields - bags;
    let st = m.stage(batch, b.keys).unwrap();
    st.emb.copy_from_slice(&b.emb);
    for s in 0..batch {
        st.inverse[s * single..(s + 1) * single].copy_from_slice(&b.inverse[s * fields..s * fields + single]);
    }
    st.dense.copy_from_slice(&b.dense);
    st.labels.copy_from_slice(&b.labels);
    let (o, i) = m.stage_bags(batch, index.len()).unwrap();
    o.copy_from_slice(offsets);
    i.copy_from_slice(index);
    m.load().unwrap();
}

/// A model with two multi-hot fields (bags of 0 to 6 ids, summed and averaged) trained 5
/// steps on `dev` and on the CPU device: the same key gradients and parameters (within
/// 1e-5: the GEMMs may sum in another order).
fn multi_hot_model_matches_the_cpu_device<D: Device>(dev: D) {
    let modes = [Pooling::Sum, Pooling::Mean];
    let (mut cpu, mut other) = (model(CpuDevice::new(2), DenseOptimizer::Adam, vec![8, 4], 9), model(dev, DenseOptimizer::Adam, vec![8, 4], 9));
    cpu.set_multi_hot(&modes).unwrap();
    other.set_multi_hot(&modes).unwrap();
    for t in 0..5u64 {
        let n = 7 + t as usize;
        let b = batch(60 + t, n, LAYOUT);
        let (index, offsets) = random_bags(n, modes.len(), b.keys, 70 + t);
        stage_with_bags(&mut cpu, &b, modes.len(), &index, &offsets);
        stage_with_bags(&mut other, &b, modes.len(), &index, &offsets);
        step_alone(&mut cpu, 0.1);
        step_alone(&mut other, 0.1);
        let (kc, ko) = (cpu.key_grads().unwrap().to_vec(), other.key_grads().unwrap().to_vec());
        assert!(kc.iter().any(|g| *g != 0.0), "step {t}: some gradient");
        assert!(close(&ko, &kc, 1e-5), "step {t}: key gradients");
        cpu.apply().unwrap();
        other.apply().unwrap();
    }
    assert!(close(&other.params().unwrap(), &cpu.params().unwrap(), 1e-5), "parameters after 5 steps");
}

#[test]
fn host_kernels_multi_hot_model_matches_the_cpu_device() {
    multi_hot_model_matches_the_cpu_device(HostKernels::new().unwrap());
}

#[test]
fn gpu_multi_hot_model_matches_the_cpu_device() {
    if let Some(d) = gpu() {
        multi_hot_model_matches_the_cpu_device(d);
    }
}

#[test]
fn cpu_gemms_and_ops_match_the_references() {
    for threads in [1, 3] {
        let dev = CpuDevice::new(threads);
        gemms_match_a_plain_loop(&dev);
        ops_match_the_reference(&dev, threads == 1);
    }
}

#[test]
fn cpu_halves_summed_equal_the_whole_batch() {
    halves_summed_equal_the_whole(|| CpuDevice::new(1));
}

#[test]
fn cpu_bad_launches_are_refused() {
    bad_launches_are_refused(|| CpuDevice::new(2));
}

#[test]
fn host_kernels_match_the_references() {
    let dev = HostKernels::new().unwrap();
    gemms_match_a_plain_loop(&dev);
    ops_match_the_reference(&dev, true);
}

#[test]
fn host_kernels_model_matches_the_cpu_device_for_50_steps() {
    model_matches_the_cpu_device(HostKernels::new().unwrap()).unwrap();
    staging_runs_ahead(HostKernels::new().unwrap(), 30, true).unwrap();
}

/// Ten delay seeds: each makes the queues run at other random speeds.
const DELAY_SEEDS: [u64; 10] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10];

/// The host-kernels device with random delays of up to 200 us before each operation.
fn delayed(seed: u64, fault: Option<HostFault>) -> HostKernels {
    HostKernels::with_options(HostOptions { delay: Some(HostDelay { seed, max_us: 200 }), fault }).unwrap()
}

#[test]
fn host_kernels_with_random_delays_match_the_cpu_device_for_50_steps() {
    // Every operation queued and run later, at random speeds, on two queues: a missing wait,
    // a staging slot reused too early or a buffer freed while in use would show here.
    for seed in DELAY_SEEDS {
        let worst = model_matches_the_cpu_device(delayed(seed, None)).unwrap_or_else(|e| panic!("delay seed {seed}: {e}"));
        assert!(worst <= 1e-3);
        staging_runs_ahead(delayed(seed, None), 30, true).unwrap_or_else(|e| panic!("delay seed {seed}, the host running ahead: {e}"));
    }
}

#[test]
fn a_removed_stream_wait_is_caught() {
    // Without the waits between queues the stand-in engine copies gradients before backward
    // wrote them, and the optimizer reads them before the copies back: the comparison fails.
    for seed in &DELAY_SEEDS[..3] {
        let r = model_matches_the_cpu_device(delayed(*seed, Some(HostFault::NoStreamWaits)));
        assert!(r.is_err(), "delay seed {seed}: no-stream-waits went unnoticed ({r:?})");
    }
}

#[test]
fn a_removed_staging_wait_is_caught() {
    // Without the wait for a staging slot's uploads, the uploads of batch t still queued
    // when the host stages batch t + 2 into the same slot read batch t + 2: the device
    // trains on the wrong batches. (Batches of one shape, so the wrong data stays in bounds.)
    for seed in &DELAY_SEEDS[..3] {
        let r = staging_runs_ahead(delayed(*seed, Some(HostFault::NoStagingWait)), 30, false);
        assert!(r.is_err(), "delay seed {seed}: no-staging-wait went unnoticed");
    }
    // The same flow with the wait passes.
    staging_runs_ahead(delayed(DELAY_SEEDS[0], None), 30, false).unwrap();
}

#[test]
fn host_kernels_halves_summed_equal_the_whole_batch() {
    halves_summed_equal_the_whole(|| HostKernels::new().unwrap());
}

#[test]
fn host_kernels_bad_launches_are_refused() {
    bad_launches_are_refused(|| HostKernels::new().unwrap());
}

// The models of issue 31: each kernel of kernels/models.cu against a plain loop, each
// model's steps against the CPU device.

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
fn model_specs() -> Vec<ModelSpec> {
    let base = ModelSpec { bottom: vec![5], cross_layers: 2, ..ModelSpec::mlp(4, 3, 2, vec![8, 5]) };
    let mut v = vec![ModelSpec { kind: ModelKind::Dlrm, ..base.clone() }, ModelSpec { kind: ModelKind::Dlrm, interaction_self: true, ..base.clone() }];
    for (rank, structure) in [(0, CrossStructure::Stacked), (2, CrossStructure::Parallel)] {
        v.push(ModelSpec { kind: ModelKind::Dcn, cross_rank: rank, cross_structure: structure, ..base.clone() });
    }
    v.push(ModelSpec { kind: ModelKind::DeepFm, ..base.clone() });
    v.push(ModelSpec { kind: ModelKind::WideDeep, ..base });
    v
}

/// 20 Adam steps of each model on `make()` against the CPU device: the groups handed out
/// last first, losses within 1e-3 relative, key gradients and parameters close, the
/// gradient check clean, predictions close.
fn models_match_the_cpu_device<D: Device>(make: impl Fn() -> D) -> Result<(), String> {
    for spec in model_specs() {
        let what = spec.describe();
        let params = spec.init_params(5);
        let opt = DenseOptimState::new(DenseOptimizer::Adam, 0.01, params.len());
        let mut dev = DenseModel::new(make(), spec.clone(), &params, &opt).unwrap();
        let mut cpu = DenseModel::new(CpuDevice::new(2), spec.clone(), &params, &opt).unwrap();
        let groups = spec.groups().len();
        let order: Vec<Part> = (0..groups).rev().map(Part::Layer).chain([Part::Loss]).collect();
        for t in 0..20u64 {
            let b = batch(100 + t, 7 + (t as usize * 5) % 23, spec.layout());
            let scale = 1.0 / b.labels.len() as f32;
            stage(&mut dev, &b);
            stage(&mut cpu, &b);
            assert_eq!(step_alone(&mut dev, scale), order, "{what}");
            step_alone(&mut cpu, scale);
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
        let b = batch(7, 9, spec.layout());
        let (mut got, mut want) = (Vec::new(), Vec::new());
        stage(&mut dev, &b);
        dev.predict(&mut got).unwrap();
        stage(&mut cpu, &b);
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
        // A GPU whose kernels do not compile or load is a failure, not a machine without one.
        Err(e @ (ringrec::device::DeviceError::Kernel { .. } | ringrec::device::DeviceError::KernelLoad(_))) => panic!("the GPU is there but its kernels failed: {e}"),
        Err(e) => {
            eprintln!("skipped: no GPU here ({e})");
            None
        }
    }
}

#[test]
fn gpu_ops_match_the_references() {
    if let Some(d) = gpu() {
        gemms_match_a_plain_loop(&d);
        ops_match_the_reference(&d, true);
    }
}

#[test]
fn gpu_model_matches_the_cpu_device_for_50_steps() {
    if let Some(d) = gpu() {
        model_matches_the_cpu_device(d).unwrap();
    }
}

#[test]
fn gpu_staging_runs_ahead_of_the_device() {
    if let Some(d) = gpu() {
        staging_runs_ahead(d, 30, true).unwrap();
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

#[test]
fn gpu_model_ops_match_the_references() {
    if let Some(d) = gpu() {
        // The same order of operations; within 1e-6 should a compiler contract a * b + c.
        model_ops_match_the_reference(&d, false);
    }
}

#[test]
fn gpu_every_model_matches_the_cpu_device() {
    if gpu().is_some() {
        models_match_the_cpu_device(|| CudaDevice::new(0).unwrap()).unwrap();
    }
}

#[cfg(feature = "cuda")]
#[test]
fn a_kernel_that_does_not_compile_reports_nvrtcs_log() {
    // NVRTC alone, no GPU.
    if let Err(e) = ringrec::device::probe_nvrtc() {
        eprintln!("skipped: no NVRTC here ({e})");
        return;
    }
    use ringrec::device::kernels::{Arch, Target};
    let e = ringrec::device::kernels::compile_source("broken", "extern \"C\" __global__ void f(float* x) { x[0] = undefined_name; }", Target::Sass(Arch(80))).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("NVRTC could not compile kernels/broken.cu") && msg.contains("undefined_name"), "{msg}");
}

/// Reference implementations of the input and its backward on plain slices (tests).
mod reference {
    /// Fills one sample's input row from the unique keys' rows `emb`, the sample's
    /// `inverse` entries (one per field) and its dense features.
    pub fn fill_row(row: &mut [f32], emb: &[f32], inverse: &[u32], dense: &[f32], dim: usize) {
        let fields = inverse.len();
        for (f, u) in inverse.iter().enumerate() {
            let u = *u as usize;
            row[f * dim..(f + 1) * dim].copy_from_slice(&emb[u * dim..(u + 1) * dim]);
        }
        row[fields * dim..].copy_from_slice(dense);
    }

    /// Sums the input gradient `dx` (batch x width) of each (sample, field) slot into its
    /// key's row of `key_grads` (keys x dim, overwritten), in sample order then field order.
    pub fn scatter_key_grads(dx: &[f32], inverse: &[u32], batch: usize, fields: usize, dim: usize, width: usize, key_grads: &mut [f32]) {
        key_grads.fill(0.0);
        for s in 0..batch {
            let row = &dx[s * width..(s + 1) * width];
            for f in 0..fields {
                let u = inverse[s * fields + f] as usize;
                for (g, d) in key_grads[u * dim..(u + 1) * dim].iter_mut().zip(&row[f * dim..(f + 1) * dim]) {
                    *g += d;
                }
            }
        }
    }
}

mod input {
    use super::reference::*;
    use super::build_csr;

    #[test]
    fn rows_and_key_gradients_by_hand() {
        // 2 samples, 2 fields, dim 2, 1 dense; keys: sample 0 = (k0, k1), sample 1 = (k1, k1).
        let emb = [1.0, 2.0, 3.0, 4.0];
        let inverse = [0u32, 1, 1, 1];
        let mut row = [0f32; 5];
        fill_row(&mut row, &emb, &inverse[2..], &[9.0], 2);
        assert_eq!(row, [3.0, 4.0, 3.0, 4.0, 9.0]);
        let dx = [1.0, 1.0, 2.0, 2.0, 0.5, /* sample 1 */ 10.0, 10.0, 20.0, 20.0, 0.5];
        let mut g = [7f32; 4];
        scatter_key_grads(&dx, &inverse, 2, 2, 2, 5, &mut g);
        assert_eq!(g, [1.0, 1.0, 32.0, 32.0]);
    }

    #[test]
    fn csr_lists_each_keys_slots_in_order_and_refuses_a_missing_key() {
        let inverse = [2u32, 0, 2, 1, 0, 2];
        let (mut offsets, mut slots, mut next) = ([9u32; 4], [9u32; 6], Vec::new());
        build_csr(&inverse, 3, &mut offsets, &mut slots, &mut next).unwrap();
        assert_eq!(offsets, [0, 2, 3, 6]);
        assert_eq!(slots, [1, 4, 3, 0, 2, 5]);
        let e = build_csr(&[0, 3], 3, &mut offsets, &mut slots, &mut next).unwrap_err();
        assert_eq!(e, "inverse names row 3 of 3 unique keys");
    }
}

/// Scoring mode (`Device::set_row_tile`, what `DenseModel::predict` sets): each row of a
/// GEMM's product has the bits that row gets when multiplied alone, whatever rows share the
/// batch, wherever it sits in it, and whatever the thread count. Without it the `gemm`
/// crate's kernels follow the row count (a one-row product is a GEMV; small products a
/// dot-product kernel; k blocked by whether m and n pass 64).
#[test]
fn cpu_row_tiles_make_a_rows_product_its_own() {
    let mut seed = 7u64;
    let mut next = move || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    };
    let rows = 70;
    let mut untiled_differ = 0;
    for (k, n) in [(429, 256), (256, 128), (128, 1), (700, 40)] {
        let a: Vec<f32> = (0..rows * k).map(|_| next()).collect();
        let b: Vec<f32> = (0..k * n).map(|_| next()).collect();
        let product = |dev: &CpuDevice, start: usize, m: usize| -> Vec<u32> {
            let part = a[start * k..(start + m) * k].to_vec();
            let mut c = vec![0f32; m * n];
            dev.gemm(&Gemm { m, n, k, a_t: false, b_t: false }, (&part, 0), (&b, 0), (&mut c, 0), Epilogue::None).unwrap();
            c.iter().map(|x| x.to_bits()).collect()
        };
        let one = CpuDevice::new(1);
        one.set_row_tile(Some(16));
        let alone: Vec<Vec<u32>> = (0..rows).map(|r| product(&one, r, 1)).collect();
        for threads in [1, 2, 3] {
            let dev = CpuDevice::new(threads);
            for m in [1, 2, 5, 16, 17, 33, 70] {
                for start in [0, (rows - m) / 2, rows - m] {
                    dev.set_row_tile(Some(16));
                    let tiled = product(&dev, start, m);
                    dev.set_row_tile(None);
                    let plain = product(&dev, start, m);
                    for j in 0..m {
                        assert_eq!(tiled[j * n..(j + 1) * n], alone[start + j][..], "k {k}, n {n}, {threads} threads: row {} of a {m}-row product differs from the row alone", start + j);
                        untiled_differ += usize::from(plain[j * n..(j + 1) * n] != alone[start + j][..]);
                    }
                }
            }
        }
    }
    eprintln!("without row tiles, {untiled_differ} rows' products differed from the row alone");
}
