//! `ringrec bench gemm`: the SGEMMs of one MLP training step (forward, weight gradient,
//! input gradient of every layer) with the `gemm` crate, the candidate OpenBLAS (loaded at
//! run time with dlopen when `libopenblas.so` is installed) measured in the same run, and
//! the whole MLP forward+backward against that plain SGEMM throughput. Where the CPU has
//! AVX-512 BF16, the same shapes and the MLP at `--dense-precision bf16` too
//! ([`ringrec::device::bgemm`], its rows cut over the threads as the CPU device cuts them).

use std::time::Instant;

use ringrec::device::sgemm::sgemm;
use ringrec::device::{bgemm, CpuDevice, Device, GemmPrecision, Op};
use ringrec::model::{Mlp, MlpShape};

/// Flags of `ringrec bench gemm`.
#[derive(clap::Args, Debug, Clone)]
pub struct GemmBenchArgs {
    /// Rows per SGEMM (the per-rank batch).
    #[arg(long, default_value_t = 1024)]
    pub batch: usize,
    /// MLP input width (26 fields x dim 16 + 13 dense = 429).
    #[arg(long, default_value_t = 429)]
    pub input: usize,
    /// Hidden layers.
    #[arg(long, default_value = "256,128", value_delimiter = ',')]
    pub hidden: Vec<usize>,
    /// Threads (rayon) for both libraries.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Repetitions.
    #[arg(long, default_value_t = 50)]
    pub reps: usize,
}

type CblasSgemm = unsafe extern "C" fn(i32, i32, i32, i32, i32, i32, f32, *const f32, i32, *const f32, i32, f32, *mut f32, i32);
type SetThreads = unsafe extern "C" fn(i32);

/// OpenBLAS, if the shared library can be loaded.
struct OpenBlas {
    sgemm: CblasSgemm,
}

impl OpenBlas {
    fn load(threads: usize) -> Option<OpenBlas> {
        for name in ["libopenblas.so.0", "libopenblas.so"] {
            let c = std::ffi::CString::new(name).ok()?;
            // SAFETY: dlopen/dlsym with valid C strings; the handle is never closed, so the
            // function pointers stay valid for the process lifetime.
            unsafe {
                let h = libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
                if h.is_null() {
                    continue;
                }
                let f = libc::dlsym(h, c"cblas_sgemm".as_ptr());
                let t = libc::dlsym(h, c"openblas_set_num_threads".as_ptr());
                if f.is_null() {
                    continue;
                }
                if !t.is_null() {
                    let set: SetThreads = std::mem::transmute::<*mut libc::c_void, SetThreads>(t);
                    set(threads as i32);
                }
                return Some(OpenBlas { sgemm: std::mem::transmute::<*mut libc::c_void, CblasSgemm>(f) });
            }
        }
        None
    }

    /// Row-major c = op(a) * op(b).
    #[allow(clippy::too_many_arguments)]
    fn run(&self, m: usize, n: usize, k: usize, a: &[f32], a_t: bool, b: &[f32], b_t: bool, c: &mut [f32]) {
        assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n);
        let lda = if a_t { m } else { k };
        let ldb = if b_t { k } else { n };
        // SAFETY: sizes checked above; CblasRowMajor = 101, NoTrans = 111, Trans = 112.
        unsafe {
            (self.sgemm)(101, if a_t { 112 } else { 111 }, if b_t { 112 } else { 111 }, m as i32, n as i32, k as i32, 1.0, a.as_ptr(), lda as i32, b.as_ptr(), ldb as i32, 0.0, c.as_mut_ptr(), n as i32)
        }
    }
}

/// (m, n, k, a_t, b_t) of every SGEMM of one training step.
fn step_shapes(batch: usize, widths: &[usize]) -> Vec<(usize, usize, usize, bool, bool)> {
    let mut v = Vec::new();
    for p in widths.windows(2) {
        v.push((batch, p[1], p[0], false, false)); // forward
        v.push((p[0], p[1], batch, true, false)); // weight gradient
        v.push((batch, p[0], p[1], false, true)); // input gradient
    }
    v
}

/// Runs the benchmark and prints the table.
pub fn run(args: &GemmBenchArgs) -> anyhow::Result<()> {
    if args.threads > 1 {
        let _ = rayon::ThreadPoolBuilder::new().num_threads(args.threads).build_global();
    }
    let shape = MlpShape { input: args.input, hidden: args.hidden.clone() };
    let widths = shape.widths();
    let shapes = step_shapes(args.batch, &widths);
    let openblas = OpenBlas::load(args.threads);
    println!("# ringrec bench gemm: batch {}, MLP {:?}, {} thread(s); GFLOP/s", args.batch, widths, args.threads);
    let bf16 = bgemm::available();
    println!("# {:>5} {:>5} {:>5} {:>3} {:>3} | {:>10} {:>10} {:>7} | {:>10}", "m", "n", "k", "aT", "bT", "gemm", "openblas", "ratio", "bf16");
    let mut total_flops = 0f64;
    let (mut t_gemm, mut t_blas, mut t_bf16) = (0f64, 0f64, 0f64);
    for (m, n, k, a_t, b_t) in shapes {
        let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.1).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.1).collect();
        let mut c = vec![0f32; m * n];
        let flops = 2.0 * (m * n * k) as f64 * args.reps as f64;
        total_flops += flops;
        sgemm(m, n, k, &a, a_t, &b, b_t, &mut c, false, args.threads);
        let t = Instant::now();
        for _ in 0..args.reps {
            sgemm(m, n, k, &a, a_t, &b, b_t, &mut c, false, args.threads);
        }
        let tg = t.elapsed().as_secs_f64();
        t_gemm += tg;
        let blas = openblas.as_ref().map(|o| {
            let mut c2 = vec![0f32; m * n];
            o.run(m, n, k, &a, a_t, &b, b_t, &mut c2);
            let t = Instant::now();
            for _ in 0..args.reps {
                o.run(m, n, k, &a, a_t, &b, b_t, &mut c2);
            }
            let s = t.elapsed().as_secs_f64();
            let agree = c.iter().zip(&c2).all(|(x, y)| (x - y).abs() <= 1e-3 * (1.0 + x.abs()));
            (s, agree)
        });
        let (blas_s, ratio) = match blas {
            Some((s, agree)) => {
                anyhow::ensure!(agree, "gemm and OpenBLAS disagree on {m}x{n}x{k}");
                t_blas += s;
                (format!("{:>10.1}", flops / s / 1e9), format!("{:>6.2}x", s / tg))
            }
            None => ("       n/a".into(), "    n/a".into()),
        };
        let bf16_s = if bf16 {
            let mut c3 = vec![0f32; m * n];
            bgemm::gemm(m, n, k, &a, a_t, &b, b_t, &mut c3, args.threads, |_, _| {});
            let t = Instant::now();
            for _ in 0..args.reps {
                bgemm::gemm(m, n, k, &a, a_t, &b, b_t, &mut c3, args.threads, |_, _| {});
            }
            let s = t.elapsed().as_secs_f64();
            t_bf16 += s;
            format!("{:>10.1}", flops / s / 1e9)
        } else {
            "       n/a".into()
        };
        println!("  {m:>5} {n:>5} {k:>5} {:>3} {:>3} | {:>10.1} {blas_s} {ratio} | {bf16_s}", a_t as u8, b_t as u8, flops / tg / 1e9);
    }
    let gemm_rate = total_flops / t_gemm / 1e9;
    println!("# all step SGEMMs: gemm crate {gemm_rate:.1} GFLOP/s{}", if t_blas > 0.0 { format!(", OpenBLAS {:.1} GFLOP/s ({:.2}x)", total_flops / t_blas / 1e9, t_blas / t_gemm) } else { ", OpenBLAS not installed (apt-get install libopenblas0)".to_string() });
    if bf16 {
        println!("# all step GEMMs at bf16 (AVX-512 BF16): {:.1} GFLOP/s ({:.2}x the gemm crate's f32)", total_flops / t_bf16 / 1e9, t_gemm / t_bf16);
    }
    for precision in [GemmPrecision::F32, GemmPrecision::Bf16] {
        if precision == GemmPrecision::Bf16 && !bf16 {
            println!("# MLP at bf16: n/a (this CPU lacks AVX-512 BF16)");
            continue;
        }
        mlp_step(args, &shape, precision, gemm_rate)?;
    }
    Ok(())
}

/// The MLP itself at `precision`: forward + backward incl. bias, ReLU, loss.
fn mlp_step(args: &GemmBenchArgs, shape: &MlpShape, precision: GemmPrecision, gemm_rate: f64) -> anyhow::Result<()> {
    let mut dev = CpuDevice::new(args.threads);
    dev.set_gemm_precision(precision)?;
    let mut mlp = Mlp::new(&dev, shape.clone(), &shape.init_params(1))?;
    let x: Vec<f32> = (0..args.batch * args.input).map(|i| ((i % 13) as f32 - 6.0) * 0.05).collect();
    let y: Vec<f32> = (0..args.batch).map(|i| (i % 3 == 0) as u8 as f32).collect();
    let (mut loss, mut dx) = (vec![0f32; args.batch], vec![0f32; x.len()]);
    let mut step = |mlp: &mut Mlp<CpuDevice>| -> anyhow::Result<()> {
        mlp.forward(&dev, &x, args.batch)?;
        let (z, delta) = mlp.output_and_delta();
        dev.exec(Op::BceWithLogits { z, y: &y, loss: &mut loss, delta, n: args.batch, scale: 1.0 })?;
        let mut grads = Vec::new();
        mlp.backward(&dev, &x, &mut dx, args.batch, &mut |l, g| {
            grads.push((l, g));
            Ok(())
        })?;
        for (l, g) in grads {
            mlp.put_grad(l, g);
        }
        Ok(())
    };
    step(&mut mlp)?;
    let t = Instant::now();
    for _ in 0..args.reps {
        step(&mut mlp)?;
    }
    let s = t.elapsed().as_secs_f64();
    let mlp_rate = shape.flops_per_sample() * args.batch as f64 * args.reps as f64 / s / 1e9;
    println!("# MLP forward+backward at {precision}: {mlp_rate:.1} GFLOP/s = {:.2}x the plain f32 SGEMM rate; {:.0} samples/s", mlp_rate / gemm_rate, args.batch as f64 * args.reps as f64 / s);
    Ok(())
}
