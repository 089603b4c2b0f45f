//! Reduction kernel throughput against a plain memcpy of the same bytes, in one run:
//! `cargo bench --bench reduce`. The kernels are what every backend's inner loop calls.

use std::time::Instant;

use ringrec::dtype::{reduce_into, DType, ReduceOp};

fn gbps(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

fn main() {
    let bytes = 4 << 20; // fits L3: measures the kernel, not DRAM
    let a = vec![1u8; bytes];
    let b = vec![2u8; bytes];
    let mut dst = vec![0u8; bytes];
    let reps = 200;
    let t = Instant::now();
    for _ in 0..reps {
        dst.copy_from_slice(std::hint::black_box(&a));
    }
    let memcpy = gbps(bytes * reps, t.elapsed().as_secs_f64());
    println!("{:<10} {:>6} {:>10.2} GB/s (output bytes)", "memcpy", "", memcpy);
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64] {
        for op in [ReduceOp::Sum, ReduceOp::Max] {
            let t = Instant::now();
            for _ in 0..reps {
                reduce_into(&mut dst, &[std::hint::black_box(&a), &b], dtype, op, None).expect("reduce");
            }
            let r = gbps(bytes * reps, t.elapsed().as_secs_f64());
            println!("{:<10} {:>6} {:>10.2} GB/s  {:.2}x memcpy", dtype.name(), op.name(), r, r / memcpy);
        }
    }
}
