//! Every collective of every backend, under real `mpirun` with 1, 2, 3 and 4 processes and
//! 4 processes as 2 simulated hosts, against a naive reference; mismatched calls; a rank
//! that dies. The checks run in ignored `worker_*` tests that the outer tests launch
//! under mpirun (one process per rank).

mod common;

use std::time::{Duration, Instant};

use ringrec::comm::{self, Backend, Collectives, CollectivesExt};
use ringrec::dtype::{DType, ReduceOp};
use ringrec::topology::Topology;
use ringrec::CommError;

// Small slots and ring chunks so that short test buffers still cross many pipeline chunks.
const SMALL_CHUNKS: [(&str, &str); 3] = [("RINGREC_SHM_CHUNK_BYTES", "4096"), ("RINGREC_RING_CHUNK_BYTES", "1000"), ("RINGREC_COMM_TIMEOUT_SECONDS", "60")];

fn value(i: usize, rank: usize, salt: usize) -> f64 {
    ((i * 31 + rank * 17 + salt) % 23) as f64 - 11.0
}

/// The naive reference: reduce in f64 over ranks 0..n, then Average the way the dtype
/// does it (f32 for half types, truncation for integers).
fn reference(dtype: DType, op: ReduceOp, count: usize, n: usize, salt: usize) -> Vec<u8> {
    let v: Vec<f64> = (0..count)
        .map(|i| {
            let xs = (0..n).map(|r| value(i, r, salt));
            match op {
                ReduceOp::Sum => xs.sum(),
                ReduceOp::Min => xs.fold(f64::INFINITY, f64::min),
                ReduceOp::Max => xs.fold(f64::NEG_INFINITY, f64::max),
                ReduceOp::Average => {
                    let s: f64 = xs.sum();
                    match dtype {
                        DType::I32 | DType::I64 => ((s as i64) / n as i64) as f64,
                        DType::F64 => s / n as f64,
                        _ => (s as f32 / n as f32) as f64,
                    }
                }
            }
        })
        .collect();
    common::to_bytes(dtype, &v)
}

fn aligned(bytes: &[u8]) -> Vec<u64> {
    let mut v = vec![0u64; bytes.len().div_ceil(8)];
    bytemuck::cast_slice_mut::<u64, u8>(&mut v)[..bytes.len()].copy_from_slice(bytes);
    v
}

fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf29ce484222325u64, |h, x| (h ^ *x as u64).wrapping_mul(0x100000001b3))
}

fn backends_for(topo: &Topology) -> Vec<Backend> {
    Backend::ALL.iter().copied().filter(|b| *b != Backend::Shm || topo.num_hosts == 1).collect()
}

/// Checks allreduce of every dtype x op x count; returns the number of cases.
fn check_allreduce(topo: &Topology, c: &mut dyn Collectives, referee: &mut dyn Collectives) -> usize {
    let n = topo.size;
    let mut cases = 0;
    for dtype in DType::REDUCIBLE {
        for op in ReduceOp::ALL {
            for (k, count) in [0usize, 1, 7, 13, 64, 1000, 4099, 30011].into_iter().enumerate() {
                let salt = k * 5 + op as usize;
                let input: Vec<f64> = (0..count).map(|i| value(i, topo.rank, salt)).collect();
                let bytes = common::to_bytes(dtype, &input);
                let mut buf = aligned(&bytes);
                let view = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut buf)[..bytes.len()];
                c.allreduce_raw(view, dtype, op).unwrap_or_else(|e| panic!("{} {dtype} {op} n={count}: {e}", c.name()));
                let want = reference(dtype, op, count, n, salt);
                assert!(view == &want[..], "{} allreduce {dtype} {op} count {count} on rank {}: wrong result", c.name(), topo.rank);
                // Every rank must hold the same bits.
                let (hashes, _) = referee.allgatherv(&[fnv(view) as i64]).expect("allgatherv of hashes");
                assert!(hashes.iter().all(|h| *h == hashes[0]), "{} {dtype} {op}: ranks differ", c.name());
                cases += 1;
            }
        }
    }
    // Non-integer values: results close to the f64 reference and bit-identical on all ranks.
    let count = 10_007;
    let mine: Vec<f32> = (0..count).map(|i| ((i * 7919 + topo.rank * 104729) % 1000) as f32 / 997.0 - 0.4).collect();
    let mut buf = mine.clone();
    c.allreduce(&mut buf, ReduceOp::Average).expect("avg");
    for (i, x) in buf.iter().enumerate() {
        let want: f64 = (0..n).map(|r| ((i * 7919 + r * 104729) % 1000) as f32 as f64 / 997.0 - 0.4).sum::<f64>() / n as f64;
        assert!((*x as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()), "{} avg f32 at {i}: {x} vs {want}", c.name());
    }
    let (hashes, _) = referee.allgatherv(&[fnv(bytemuck::cast_slice(&buf)) as i64]).expect("hashes");
    assert!(hashes.iter().all(|h| *h == hashes[0]), "{}: f32 average differs across ranks", c.name());
    cases + 1
}

fn piece(rank: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 13 + rank * 101) as u8).collect()
}

fn check_gathers(topo: &Topology, c: &mut dyn Collectives) -> usize {
    let n = topo.size;
    let me = topo.rank;
    let mut cases = 0;
    for lens in [
        (0..n).map(|_| 0).collect::<Vec<_>>(),
        (0..n).map(|r| r * 3).collect(),
        (0..n).map(|r| (r * 37) % 11 + 1).collect(),
        (0..n).map(|r| if r % 2 == 0 { 10_000 + r } else { 0 }).collect(),
    ] {
        let g = c.allgatherv_raw(&piece(me, lens[me])).expect("allgatherv");
        assert_eq!(g.counts, lens, "{} allgatherv counts", c.name());
        for (r, len) in lens.iter().enumerate() {
            assert_eq!(g.piece(r), &piece(r, *len)[..], "{} allgatherv piece of rank {r}", c.name());
        }
        for root in [0, n - 1] {
            let g = c.gatherv_raw(&piece(me, lens[me]), root).expect("gatherv");
            if me == root {
                let g = g.expect("root receives");
                assert_eq!(g.counts, lens);
                for (r, len) in lens.iter().enumerate() {
                    assert_eq!(g.piece(r), &piece(r, *len)[..], "{} gatherv piece of rank {r}", c.name());
                }
            } else {
                assert!(g.is_none(), "only the root receives");
            }
        }
        cases += 3;
    }
    for root in 0..n {
        for len in [0usize, 5, 10_001] {
            let mut buf = if me == root { piece(root, len) } else { vec![0xAA; len] };
            c.broadcast_raw(&mut buf, root).expect("broadcast");
            assert_eq!(buf, piece(root, len), "{} broadcast from {root} len {len}", c.name());
            cases += 1;
        }
    }
    // Barrier: nobody leaves before the last rank arrives.
    let t = Instant::now();
    if me == n - 1 {
        std::thread::sleep(Duration::from_millis(300));
    }
    c.barrier().expect("barrier");
    if n > 1 {
        assert!(t.elapsed() >= Duration::from_millis(250), "{} barrier returned before the late rank arrived", c.name());
    }
    cases + 1
}

#[test]
#[ignore = "runs under mpirun, launched by the tests below"]
fn worker_collectives() {
    let topo = Topology::init().expect("MPI");
    let mut referee = comm::build(Backend::Mpi, &topo).expect("mpi");
    let mut total = 0;
    for b in backends_for(&topo) {
        let mut c = comm::build(b, &topo).unwrap_or_else(|e| panic!("build {b}: {e}"));
        assert_eq!((c.rank(), c.size()), (topo.rank, topo.size));
        let cases = check_allreduce(&topo, c.as_mut(), referee.as_mut()) + check_gathers(&topo, c.as_mut());
        total += cases;
        println!("WORKER rank={} backend={} cases={}", topo.rank, b, cases);
    }
    if topo.num_hosts > 1 {
        let e = comm::build(Backend::Shm, &topo).err().expect("shm must refuse several hosts");
        assert!(e.to_string().contains("use --backend hier"), "{e}");
    }
    // Gather to the host leader through shared memory.
    let mut host = comm::host_collectives(&topo, "leader").expect("host collectives");
    let g = host.gatherv_raw(&piece(topo.rank, topo.rank + 1), 0).expect("gather to leader");
    if topo.is_leader() {
        let g = g.expect("leader receives");
        let host_ranks: Vec<usize> = (0..topo.size).filter(|r| topo.host_of_rank[*r] == topo.host_id).collect();
        assert_eq!(g.counts.len(), topo.local_size);
        for (l, r) in host_ranks.iter().enumerate() {
            assert_eq!(g.piece(l), &piece(*r, r + 1)[..]);
        }
    }
    println!("WORKER DONE rank={} local_rank={} host={} total={}", topo.rank, topo.local_rank, topo.host_id, total);
}

fn expect_mismatch(r: Result<(), CommError>, bad: &[usize], what: &str) {
    match r {
        Err(CommError::Mismatch { ranks, detail, .. }) => {
            assert_eq!(ranks, bad, "{what}: {detail}");
            for b in bad {
                assert!(detail.contains(&format!("rank {b} called")), "{what}: {detail}");
            }
        }
        other => panic!("{what}: expected a mismatch error, got {other:?}"),
    }
}

#[test]
#[ignore = "runs under mpirun, launched by the tests below"]
fn worker_mismatch() {
    let topo = Topology::init().expect("MPI");
    let me = topo.rank;
    let last = topo.size - 1;
    for b in backends_for(&topo) {
        let mut c = comm::build(b, &topo).expect("build");
        let name = c.name();
        // Count: the last rank sends one element more.
        let mut v = vec![1.0f32; if me == last { 10_001 } else { 10_000 }];
        expect_mismatch(c.allreduce(&mut v, ReduceOp::Sum), &[last], &format!("{name} count"));
        // Op.
        let mut v = vec![1.0f32; 100];
        let op = if me == last { ReduceOp::Max } else { ReduceOp::Sum };
        expect_mismatch(c.allreduce(&mut v, op), &[last], &format!("{name} op"));
        // Dtype (same byte length).
        let r = if me == last {
            let mut v = vec![1i32; 64];
            c.allreduce(&mut v, ReduceOp::Sum)
        } else {
            let mut v = vec![1.0f32; 64];
            c.allreduce(&mut v, ReduceOp::Sum)
        };
        expect_mismatch(r, &[last], &format!("{name} dtype"));
        // Different collectives.
        let r = if me == last { c.barrier() } else { c.allreduce(&mut [1.0f32; 8], ReduceOp::Sum) };
        expect_mismatch(r, &[last], &format!("{name} collective"));
        // Broadcast roots.
        let mut buf = vec![0u8; 16];
        let r = c.broadcast_raw(&mut buf, if me == last { 0 } else { last });
        expect_mismatch(r, &[last], &format!("{name} root"));
        // Still usable afterwards.
        let mut v = vec![me as f64; 5000];
        c.allreduce(&mut v, ReduceOp::Sum).expect("allreduce after mismatches");
        let want = (0..topo.size).sum::<usize>() as f64;
        assert!(v.iter().all(|x| *x == want), "{name}: wrong result after mismatches");
        println!("MISMATCH rank={me} backend={name} ok");
    }
}

#[test]
#[ignore = "runs under mpirun, launched by the tests below"]
fn worker_rank_dies() {
    let topo = Topology::init().expect("MPI");
    let backend = Backend::parse(&std::env::var("RINGREC_TEST_BACKEND").unwrap_or_default()).expect("backend");
    let mut c = comm::build(backend, &topo).expect("build");
    let mut v = vec![1.0f32; 1000];
    c.allreduce(&mut v, ReduceOp::Sum).expect("first allreduce");
    if topo.rank == 1 {
        println!("rank 1 exits now");
        std::process::exit(3);
    }
    for _ in 0..1000 {
        if let Err(e) = c.allreduce(&mut v, ReduceOp::Sum) {
            eprintln!("rank {} stops: {e}", topo.rank);
            std::process::exit(2);
        }
    }
    panic!("rank {} completed allreduces without rank 1", topo.rank);
}

fn collectives(np: usize, extra: &[(&str, &str)]) {
    let mut env = SMALL_CHUNKS.to_vec();
    env.extend_from_slice(extra);
    let job = common::run_worker("worker_collectives", np, &env, Duration::from_secs(600));
    job.assert_ok();
    for r in 0..np {
        assert!(job.stdout.contains(&format!("WORKER DONE rank={r} ")), "rank {r} did not finish:\n{}", job.all());
    }
    let lines = job.stdout.matches("WORKER rank=").count();
    let backends = if extra.iter().any(|(k, _)| *k == "RINGREC_RANKS_PER_HOST") { 3 } else { 4 };
    assert_eq!(lines, np * backends, "{}", job.stdout);
}

#[test]
fn collectives_1_rank() {
    collectives(1, &[]);
}
#[test]
fn collectives_2_ranks() {
    collectives(2, &[]);
}
#[test]
fn collectives_3_ranks() {
    collectives(3, &[]);
}
#[test]
fn collectives_4_ranks() {
    collectives(4, &[]);
}
#[test]
fn collectives_4_ranks_as_2_simulated_hosts() {
    collectives(4, &[("RINGREC_RANKS_PER_HOST", "2")]);
    // The topology the job saw.
    let job = common::run_worker("worker_collectives", 4, &[("RINGREC_RANKS_PER_HOST", "2")], Duration::from_secs(600));
    job.assert_ok();
    for (r, l, h) in [(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1)] {
        assert!(job.stdout.contains(&format!("WORKER DONE rank={r} local_rank={l} host={h} ")), "{}", job.stdout);
    }
}

fn mismatch(np: usize, extra: &[(&str, &str)]) {
    let mut env = SMALL_CHUNKS.to_vec();
    env.extend_from_slice(extra);
    let job = common::run_worker("worker_mismatch", np, &env, Duration::from_secs(120));
    job.assert_ok();
    assert!(job.elapsed < Duration::from_secs(90), "mismatch detection took {:?}", job.elapsed);
    let backends = if extra.is_empty() { 4 } else { 3 };
    assert_eq!(job.stdout.matches("MISMATCH rank=").count(), np * backends, "{}", job.all());
}

#[test]
fn mismatched_calls_fail_on_every_rank_2_ranks() {
    mismatch(2, &[]);
}
#[test]
fn mismatched_calls_fail_on_every_rank_3_ranks() {
    mismatch(3, &[]);
}
#[test]
fn mismatched_calls_fail_on_every_rank_2_simulated_hosts() {
    mismatch(4, &[("RINGREC_RANKS_PER_HOST", "2")]);
}

fn rank_dies(backend: &str) {
    let job = common::run_worker("worker_rank_dies", 3, &[("RINGREC_TEST_BACKEND", backend), ("RINGREC_COMM_TIMEOUT_SECONDS", "30")], Duration::from_secs(90));
    assert!(!job.timed_out, "job hung after a rank died:\n{}", job.all());
    assert_ne!(job.code, Some(0), "job must fail when a rank dies:\n{}", job.all());
    assert!(job.stdout.contains("rank 1 exits now"), "{}", job.all());
    assert!(!job.all().contains("completed allreduces without rank 1"), "{}", job.all());
    // Either our own detection or mpirun's names the failure.
    let all = job.all();
    assert!(all.contains("exited") || all.contains("exit code") || all.contains("non-zero status"), "no message about the dead rank:\n{all}");
}

#[test]
fn a_dead_rank_stops_the_job_shm() {
    rank_dies("shm");
}
#[test]
fn a_dead_rank_stops_the_job_ring() {
    rank_dies("ring");
}

/// Worker: rank 1 announces its arrival 3 s late; the others, waiting at most 1 s, name
/// it. Then everyone announces at once and the wait ends as soon as all have arrived.
#[test]
#[ignore]
fn worker_arrivals() {
    if std::env::var_os("RINGREC_TEST_WORKER").is_none() {
        return;
    }
    let topo = Topology::init().expect("topology");
    let group = topo.world.duplicate();
    if topo.rank == 1 {
        std::thread::sleep(Duration::from_secs(3));
        ringrec::comm::arrival::Arrivals::announce(group).finish();
    } else {
        let mut a = ringrec::comm::arrival::Arrivals::announce(group);
        let t = Instant::now();
        let r = a.wait_until(Duration::from_secs(1), || false);
        println!("rank {} late {:?} after {:.1}s", topo.rank, r.unwrap_err(), t.elapsed().as_secs_f64());
    }
    let mut all = ringrec::comm::arrival::Arrivals::announce(topo.world.duplicate());
    let t = Instant::now();
    let r = all.wait_all(Duration::from_secs(20));
    println!("rank {} all arrived {:?} in {:.1}s", topo.rank, r, t.elapsed().as_secs_f64());
    all.finish();
}

#[test]
fn a_late_rank_is_named_by_the_others_after_the_deadline() {
    let out = common::run_worker("worker_arrivals", 3, &[], Duration::from_secs(60));
    out.assert_ok();
    for r in [0, 2] {
        let line = out.stdout.lines().find(|l| l.contains(&format!("rank {r} late"))).unwrap_or_else(|| panic!("rank {r} reports:\n{}", out.all()));
        assert!(line.contains("late [1] after 1."), "{line}");
    }
    assert_eq!(out.stdout.matches("all arrived Ok(())").count(), 3, "{}", out.all());
}
