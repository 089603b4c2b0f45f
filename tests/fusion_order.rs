//! Fusion never changes a sum's bits: tensors of awkward lengths whose sums depend on the
//! order of addition (1e8 beside small values), reduced alone and fused in several
//! groupings, by every ringrec backend (ring, shm, hier) at 3 and 4 ranks on one host and
//! on simulated hosts, through the fused allreduce of the comm layer and through the
//! engine's executor (plain and fp16-compressed). Every fused result must be
//! bit-identical to the tensor reduced alone. The checks run in the ignored
//! `worker_fusion_order` test that the outer tests launch under mpirun.

mod common;

use std::time::Duration;

use ringrec::comm::{self, Backend, Collectives, Scattered};
use ringrec::dtype::{DType, ReduceOp};
use ringrec::engine::fusion::Executor;
use ringrec::engine::message::{Entry, OpKind, Response};
use ringrec::engine::{Compression, Location, Tensor};
use ringrec::hash::splitmix64_next;
use ringrec::topology::Topology;

// Small slots and ring chunks so that the tensors cross several pipeline chunks.
const SMALL_CHUNKS: [(&str, &str); 3] = [("RINGREC_SHM_CHUNK_BYTES", "4096"), ("RINGREC_RING_CHUNK_BYTES", "1000"), ("RINGREC_COMM_TIMEOUT_SECONDS", "120")];

/// The tensors' lengths (elements).
const LENS: [usize; 4] = [1, 7, 1000, 4097];

/// The fused groupings tried (indices into [`LENS`], in fusion order).
const GROUPINGS: [&[usize]; 6] = [&[0, 1, 2, 3], &[3, 2, 1, 0], &[1, 3], &[2, 0], &[0, 2, 3], &[3, 1, 2]];

/// Rank `rank`'s value of element `i` of tensor `t`: about a quarter are +-`big`, the
/// rest small values with full mantissas, so that a sum's bits depend on its order.
fn value(t: usize, rank: usize, i: usize, big: f64) -> f64 {
    let mut z = ((t as u64) << 48) ^ ((rank as u64) << 32) ^ i as u64;
    let r = splitmix64_next(&mut z);
    let small = (r >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
    match r % 8 {
        0 => big,
        1 => -big,
        _ => small * 3.7,
    }
}

/// The big values: 1e8, or 3e4 for tensors sent as fp16 (whose largest value is 65504).
fn big(compression: Compression) -> f64 {
    if compression == Compression::None {
        1e8
    } else {
        3e4
    }
}

fn input(dtype: DType, t: usize, rank: usize, big: f64) -> Vec<u8> {
    let v: Vec<f64> = (0..LENS[t]).map(|i| value(t, rank, i, big)).collect();
    common::to_bytes(dtype, &v)
}

/// `bytes` in an 8-byte-aligned buffer (any element's alignment).
fn aligned(bytes: &[u8]) -> Vec<u64> {
    let mut v = vec![0u64; bytes.len().div_ceil(8)];
    bytemuck::cast_slice_mut::<u64, u8>(&mut v)[..bytes.len()].copy_from_slice(bytes);
    v
}

fn bytes_of(v: &[u64], len: usize) -> &[u8] {
    &bytemuck::cast_slice::<u64, u8>(v)[..len]
}

fn tensor(dtype: DType, bytes: &[u8]) -> Tensor {
    Tensor::from_bytes(dtype, &[bytes.len() / dtype.size()], bytes).expect("tensor")
}

fn response(dtype: DType, op: ReduceOp, compression: Compression, group: &[usize]) -> Response {
    Response {
        kind: OpKind::Allreduce,
        dtype,
        location: Location::Host,
        op,
        root: 0,
        compression,
        entries: group.iter().map(|t| Entry { name: format!("t{t}"), count: LENS[*t] as u64 }).collect(),
        error: None,
    }
}

/// Fuses `group` through [`Collectives::allreduce_scattered`]; each tensor's result.
fn fused_scattered(c: &mut dyn Collectives, dtype: DType, op: ReduceOp, rank: usize, group: &[usize]) -> Vec<Vec<u8>> {
    let mut bufs: Vec<Vec<u64>> = group.iter().map(|t| aligned(&input(dtype, *t, rank, 1e8))).collect();
    let lens: Vec<usize> = group.iter().map(|t| LENS[*t] * dtype.size()).collect();
    {
        let parts: Vec<&mut [u8]> = bufs.iter_mut().zip(&lens).map(|(b, len)| &mut bytemuck::cast_slice_mut::<u64, u8>(b)[..*len]).collect();
        let mut view = Scattered::new(parts);
        c.allreduce_scattered(&mut view, dtype, op).unwrap_or_else(|e| panic!("{} fused allreduce: {e}", c.name()));
    }
    bufs.iter().zip(&lens).map(|(b, len)| bytes_of(b, *len).to_vec()).collect()
}

/// Runs `group` as one response of the engine's executor; each tensor's result.
fn executed(exec: &mut Executor, dtype: DType, op: ReduceOp, compression: Compression, rank: usize, group: &[usize]) -> Vec<Vec<u8>> {
    let mut tensors: Vec<Tensor> = group.iter().map(|t| tensor(dtype, &input(dtype, *t, rank, big(compression)))).collect();
    exec.execute(&response(dtype, op, compression, group), &mut tensors).unwrap_or_else(|e| panic!("{} executor: {e}", exec.backend.name()));
    tensors.iter().map(|t| t.host_bytes().expect("host tensor").to_vec()).collect()
}

/// Compares each tensor of `group` with its reduction alone; returns the differences.
fn compare(what: &str, group: &[usize], got: &[Vec<u8>], alone: &[Vec<u8>]) -> Vec<String> {
    group
        .iter()
        .zip(got)
        .filter(|(t, g)| **g != alone[**t])
        .map(|(t, g)| {
            let first = g.iter().zip(&alone[*t]).position(|(a, b)| a != b).unwrap_or(0);
            format!("{what}: tensor {t} ({} elements) fused as {group:?} differs from alone from byte {first}", LENS[*t])
        })
        .collect()
}

#[test]
#[ignore = "runs under mpirun, launched by the tests below"]
fn worker_fusion_order() {
    let topo = Topology::init().expect("MPI");
    let rank = topo.rank;
    let backends: Vec<Backend> = [Backend::Ring, Backend::Shm, Backend::Hier].into_iter().filter(|b| *b != Backend::Shm || topo.num_hosts == 1).collect();
    let mut bad = Vec::new();
    let mut cases = 0;
    for b in backends {
        let mut c = comm::build(b, &topo).unwrap_or_else(|e| panic!("build {b}: {e}"));
        let mut exec = Executor::new(comm::build_tagged(b, &topo, "executor").unwrap_or_else(|e| panic!("build {b}: {e}")));
        for dtype in [DType::F32, DType::F64] {
            for op in [ReduceOp::Sum, ReduceOp::Average] {
                let what = format!("{b} {dtype} {}", op.name());
                let alone: Vec<Vec<u8>> = (0..LENS.len())
                    .map(|t| {
                        let mut buf = aligned(&input(dtype, t, rank, 1e8));
                        let len = LENS[t] * dtype.size();
                        c.allreduce_raw(&mut bytemuck::cast_slice_mut::<u64, u8>(&mut buf)[..len], dtype, op).unwrap_or_else(|e| panic!("{what} allreduce: {e}"));
                        bytes_of(&buf, len).to_vec()
                    })
                    .collect();
                for group in GROUPINGS {
                    bad.extend(compare(&format!("{what} scattered"), group, &fused_scattered(c.as_mut(), dtype, op, rank, group), &alone));
                    bad.extend(compare(&format!("{what} executor"), group, &executed(&mut exec, dtype, op, Compression::None, rank, group), &alone));
                    cases += 2;
                }
                if dtype == DType::F32 {
                    // fp16 on the wire: fused against alone, both through the executor.
                    let alone: Vec<Vec<u8>> = (0..LENS.len()).map(|t| executed(&mut exec, dtype, op, Compression::Fp16, rank, &[t]).remove(0)).collect();
                    for group in GROUPINGS {
                        bad.extend(compare(&format!("{what} executor fp16"), group, &executed(&mut exec, dtype, op, Compression::Fp16, rank, group), &alone));
                        cases += 1;
                    }
                }
            }
        }
    }
    for line in &bad {
        println!("DIFF rank={rank} {line}");
    }
    assert!(bad.is_empty(), "rank {rank}: {} of {cases} fused reductions differ from the tensors reduced alone", bad.len());
    println!("WORKER DONE rank={rank} hosts={} cases={cases}", topo.num_hosts);
}

fn fusion_order(np: usize, extra: &[(&str, &str)], hosts: usize) {
    let mut env = SMALL_CHUNKS.to_vec();
    env.extend_from_slice(extra);
    let job = common::run_worker("worker_fusion_order", np, &env, Duration::from_secs(600));
    job.assert_ok();
    for r in 0..np {
        assert!(job.stdout.contains(&format!("WORKER DONE rank={r} hosts={hosts} ")), "rank {r} did not finish:\n{}", job.all());
    }
}

#[test]
fn fused_sums_match_alone_at_3_ranks() {
    fusion_order(3, &[], 1);
}

#[test]
fn fused_sums_match_alone_at_3_ranks_on_3_hosts() {
    fusion_order(3, &[("RINGREC_RANKS_PER_HOST", "1")], 3);
}

#[test]
fn fused_sums_match_alone_at_4_ranks() {
    fusion_order(4, &[], 1);
}

#[test]
fn fused_sums_match_alone_at_4_ranks_on_4_hosts() {
    fusion_order(4, &[("RINGREC_RANKS_PER_HOST", "1")], 4);
}

#[test]
fn fused_sums_match_alone_at_4_ranks_on_2_hosts_of_2() {
    fusion_order(4, &[("RINGREC_RANKS_PER_HOST", "2")], 2);
}

/// One `ringrec train` at 4 ranks on 4 simulated hosts (the ring across hosts adds in an
/// order of 4 ranks) with `env`; its summary.
fn train_4_hosts(what: &str, env: &[(&str, &str)]) -> serde_json::Value {
    let dd = common::shared_scratch("fusion-order-data");
    let mut e = vec![("RINGREC_DATA_DIR", dd.to_str().expect("utf8")), ("RINGREC_RANKS_PER_HOST", "1")];
    e.extend_from_slice(env);
    let job = common::mpirun(4, &e, &common::small_table(&["train", "--synth-rows", "4000", "--batch", "200", "--max-steps", "12", "--no-progress", "--json"]));
    assert!(job.code == Some(0) && !job.timed_out, "{what}:\n{}", job.all());
    job.summary()
}

#[test]
fn training_ends_with_one_params_fnv_however_the_engine_fuses() {
    // Without fusion every layer's gradient is reduced alone; with it the engine's cycle
    // fuses them — all of a step's, or split over two collectives by a short cycle — and
    // the parameters must end with the same bits all the same.
    let alone = train_4_hosts("no fusion", &[("RINGREC_FUSION_THRESHOLD", "0")]);
    let fused = train_4_hosts("fusion", &[]);
    let short = train_4_hosts("fusion, a short cycle", &[("RINGREC_CYCLE_TIME", "0.05")]);
    let collectives = |s: &serde_json::Value| s["dense_collectives"].as_u64().expect("dense_collectives");
    assert!(collectives(&fused) < collectives(&alone), "nothing was fused: {} collectives fused, {} alone", collectives(&fused), collectives(&alone));
    for (what, s) in [("fusion", &fused), ("fusion, a short cycle", &short)] {
        assert_eq!(s["params_fnv"], alone["params_fnv"], "{what} ({} collectives) changed the parameters of the run without fusion ({} collectives)", collectives(s), collectives(&alone));
    }
}
