//! The engine (named async collectives) under real `mpirun`: random interleavings of
//! submissions on 1-4 ranks and 4 ranks as 2 simulated hosts, against a reference; fusion
//! on and off bit-identical; the response cache; compression; mismatched submissions;
//! stall warning and shutdown; the timeline; the autotuner. Checks run in ignored
//! `worker_*` tests that the outer tests launch under mpirun.

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::time::Duration;

use half::{bf16, f16};
use ringrec::dtype::{DType, ReduceOp};
use ringrec::engine::{Compression, EngineError, Handle, Tensor};
use ringrec::hash::splitmix64_next;

/// One splitmix64 output for seed `z`.
fn mix(mut z: u64) -> u64 {
    splitmix64_next(&mut z)
}

fn seed_of(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

/// Small integers (exact in every dtype and every summation order) or, when `noisy`,
/// arbitrary floats (whose sums depend on the order).
fn values(name: &str, rank: usize, step: usize, n: usize, noisy: bool) -> Vec<f64> {
    let s = seed_of(name) ^ ((rank as u64) << 40) ^ ((step as u64) << 20);
    (0..n)
        .map(|i| {
            let r = mix(s.wrapping_add(i as u64));
            if noisy {
                (r >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
            } else {
                (r % 17) as f64 - 8.0
            }
        })
        .collect()
}

fn tensor(dtype: DType, v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_bytes(dtype, shape, &common::to_bytes(dtype, v)).expect("shape")
}

fn as_f64(t: &Tensor) -> Vec<f64> {
    match t.dtype() {
        DType::F32 => t.as_slice::<f32>().unwrap().iter().map(|x| *x as f64).collect(),
        DType::F64 => t.as_slice::<f64>().unwrap().to_vec(),
        DType::F16 => t.as_slice::<f16>().unwrap().iter().map(|x| x.to_f64()).collect(),
        DType::BF16 => t.as_slice::<bf16>().unwrap().iter().map(|x| x.to_f64()).collect(),
        DType::I32 => t.as_slice::<i32>().unwrap().iter().map(|x| *x as f64).collect(),
        DType::I64 => t.as_slice::<i64>().unwrap().iter().map(|x| *x as f64).collect(),
        DType::U8 => t.as_slice::<u8>().unwrap().iter().map(|x| *x as f64).collect(),
    }
}

#[derive(Clone)]
enum What {
    Allreduce(ReduceOp, Compression),
    Allgather,
    Broadcast(usize),
    Grouped,
}

#[derive(Clone)]
struct Spec {
    name: String,
    what: What,
    dtype: DType,
    n: usize,
    noisy: bool,
}

/// About 30 tensors of every kind, dtype, op and size (up to ~1 MB).
fn specs(size: usize, step: usize) -> Vec<Spec> {
    let mut v = Vec::new();
    let dtypes = [DType::F32, DType::F64, DType::I32, DType::I64, DType::F16, DType::BF16];
    let ops = [ReduceOp::Sum, ReduceOp::Average, ReduceOp::Min, ReduceOp::Max];
    let sizes = [1usize, 7, 100, 1000, 4099, 70_000];
    for (i, dt) in dtypes.iter().enumerate() {
        for (j, op) in ops.iter().enumerate() {
            let n = sizes[(i + j) % sizes.len()];
            v.push(Spec { name: format!("ar.{}.{}", dt.name(), op.name()), what: What::Allreduce(*op, Compression::None), dtype: *dt, n, noisy: false });
        }
    }
    for k in 0..4 {
        v.push(Spec { name: format!("noisy.{k}"), what: What::Allreduce(ReduceOp::Sum, Compression::None), dtype: DType::F32, n: [3, 5000, 250_000, 33][k], noisy: true });
    }
    v.push(Spec { name: "noisy.avg".into(), what: What::Allreduce(ReduceOp::Average, Compression::None), dtype: DType::F64, n: 3000, noisy: true });
    v.push(Spec { name: "c.fp16".into(), what: What::Allreduce(ReduceOp::Sum, Compression::Fp16), dtype: DType::F32, n: 5000, noisy: false });
    v.push(Spec { name: "c.bf16".into(), what: What::Allreduce(ReduceOp::Sum, Compression::Bf16), dtype: DType::F32, n: 77, noisy: false });
    v.push(Spec { name: "c.1bit".into(), what: What::Allreduce(ReduceOp::Sum, Compression::OneBit), dtype: DType::F32, n: 1001, noisy: false });
    v.push(Spec { name: "gather.f32".into(), what: What::Allgather, dtype: DType::F32, n: 3, noisy: false });
    v.push(Spec { name: "gather.i64".into(), what: What::Allgather, dtype: DType::I64, n: 1, noisy: false });
    v.push(Spec { name: "bcast.f64".into(), what: What::Broadcast(step % size), dtype: DType::F64, n: 999, noisy: true });
    v.push(Spec { name: "bcast.i32".into(), what: What::Broadcast((step + 1) % size), dtype: DType::I32, n: 5, noisy: false });
    for g in 0..3 {
        v.push(Spec { name: format!("group.{g}"), what: What::Grouped, dtype: DType::F32, n: 10 + g, noisy: false });
    }
    v
}

/// Rank `r`'s input for `s` at `step`.
fn input(s: &Spec, r: usize, step: usize) -> (Vec<f64>, Vec<usize>) {
    match s.what {
        // Allgather: rank r contributes r+1 rows of s.n columns.
        What::Allgather => (values(&s.name, r, step, (r + 1) * s.n, false), vec![r + 1, s.n]),
        What::Allreduce(_, Compression::OneBit) => {
            // c_r * sign pattern shared by all ranks: 1-bit encodes it exactly.
            let signs = values(&s.name, 0, step, s.n, false);
            (signs.iter().map(|x| if *x >= 0.0 { (r + 1) as f64 } else { -((r + 1) as f64) }).collect(), vec![s.n])
        }
        _ => (values(&s.name, r, step, s.n, s.noisy), vec![s.n]),
    }
}

fn reference(s: &Spec, size: usize, step: usize) -> Vec<f64> {
    let all: Vec<Vec<f64>> = (0..size).map(|r| input(s, r, step).0).collect();
    let round = |x: f64| match s.dtype {
        DType::F32 => x as f32 as f64,
        _ => x,
    };
    let all: Vec<Vec<f64>> = all.into_iter().map(|v| v.into_iter().map(round).collect()).collect();
    match &s.what {
        What::Allgather => all.concat(),
        What::Broadcast(root) => all[*root].clone(),
        What::Grouped => (0..s.n).map(|i| all.iter().map(|v| v[i]).sum()).collect(),
        What::Allreduce(op, _) => (0..s.n)
            .map(|i| {
                let xs = all.iter().map(|v| v[i]);
                match op {
                    ReduceOp::Sum => xs.sum(),
                    ReduceOp::Min => xs.fold(f64::INFINITY, f64::min),
                    ReduceOp::Max => xs.fold(f64::NEG_INFINITY, f64::max),
                    ReduceOp::Average => {
                        let sum: f64 = xs.sum();
                        match s.dtype {
                            DType::I32 | DType::I64 => ((sum as i64) / size as i64) as f64,
                            _ => sum / size as f64,
                        }
                    }
                }
            })
            .collect(),
    }
}

fn close(a: f64, b: f64, dtype: DType) -> bool {
    let tol = match dtype {
        DType::F32 => 1e-5,
        DType::F16 => 1e-3,
        DType::BF16 => 1e-2,
        DType::F64 => 1e-12,
        _ => 0.0,
    };
    (a - b).abs() <= tol * (1.0 + b.abs())
}

/// A permutation of 0..n from `seed`.
fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (mix(seed ^ i as u64) % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
    v
}

#[test]
#[ignore = "runs under mpirun, launched by the tests below"]
fn worker_interleavings() {
    let rt = ringrec::init().unwrap_or_else(|e| {
        eprintln!("ringrec: {e}");
        std::process::exit(2)
    });
    let (me, size) = (rt.rank(), rt.size());
    let steps: usize = std::env::var("ENGINE_TEST_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(5);
    let mut dump = std::env::var("ENGINE_TEST_OUT").ok().map(|p| std::fs::File::create(format!("{p}.rank{me}")).expect("dump file"));
    let mut checked = 0;
    for step in 0..steps {
        let specs = specs(size, step);
        // Submit in a different random order on every rank, sometimes pausing so that
        // submissions spread over several cycles.
        let order = shuffled(specs.len(), (me as u64) << 32 | step as u64);
        let mut handles: HashMap<String, Handle> = HashMap::new();
        let mut group = Vec::new();
        for (k, i) in order.iter().enumerate() {
            let s = &specs[*i];
            let (v, shape) = input(s, me, step);
            let t = tensor(s.dtype, &v, &shape);
            let h = match s.what {
                What::Allreduce(op, c) => rt.allreduce_async_with(&s.name, t, op, c),
                What::Allgather => rt.allgather_async(&s.name, t),
                What::Broadcast(root) => rt.broadcast_async(&s.name, t, root),
                What::Grouped => {
                    group.push((s.name.clone(), t));
                    continue;
                }
            };
            handles.insert(s.name.clone(), h);
            if mix((me * 1000 + step * 100 + k) as u64) % 5 == 0 {
                std::thread::sleep(Duration::from_micros(mix(k as u64) % 2500));
            }
        }
        group.sort_by(|a, b| a.0.cmp(&b.0));
        for h in rt.grouped_allreduce_async(group, ReduceOp::Sum) {
            handles.insert(h.name().to_string(), h);
        }
        // Wait in another random order.
        let wait_order = shuffled(specs.len(), (me as u64) << 32 | step as u64 | 1 << 60);
        let mut noisy: Vec<(usize, Tensor)> = Vec::new();
        for i in wait_order {
            let s = &specs[i];
            let h = handles.remove(&s.name).expect("handle");
            let t = h.wait().unwrap_or_else(|e| panic!("rank {me} step {step} {}: {e}", s.name));
            assert_eq!(t.dtype(), s.dtype, "{}", s.name);
            let got = as_f64(&t);
            let want = reference(s, size, step);
            assert_eq!(got.len(), want.len(), "{} length", s.name);
            if let What::Allgather = s.what {
                assert_eq!(t.shape(), &[size * (size + 1) / 2, s.n], "{} shape", s.name);
            }
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(close(*g, *w, s.dtype), "rank {me} step {step} {}[{i}]: got {g}, want {w}", s.name);
            }
            if s.noisy {
                noisy.push((i, t));
            }
            checked += 1;
        }
        noisy.sort_by_key(|(i, _)| *i);
        if let Some(f) = dump.as_mut() {
            for (_, t) in &noisy {
                f.write_all(t.host_bytes().expect("host tensor")).expect("dump");
            }
        }
    }
    let st = rt.stats();
    println!("ENGINE OK rank={me} size={size} checked={checked} stats={st:?} backend={}", rt.backend_name());
    if steps >= 3 {
        // After the first step the allreduces and broadcasts come from the response cache.
        assert!(st.cached > 0, "no tensor ran from the response cache: {st:?}");
    }
}

fn interleavings(np: usize, env: &[(&str, &str)]) -> String {
    let job = common::run_worker("worker_interleavings", np, env, Duration::from_secs(300));
    job.assert_ok();
    let out = job.all();
    assert_eq!(out.matches("ENGINE OK").count(), np, "{out}");
    out
}

#[test]
fn random_interleavings_complete_correctly_on_1_to_4_ranks() {
    for np in [1, 2, 3, 4] {
        let out = interleavings(np, &[]);
        assert!(out.contains(&format!("size={np}")), "{out}");
    }
}

#[test]
fn random_interleavings_on_two_simulated_hosts() {
    let out = interleavings(4, &[("RINGREC_RANKS_PER_HOST", "2")]);
    assert!(out.contains("backend=hier"), "{out}");
}

#[test]
fn mpi_and_ring_backends_fuse_through_a_buffer() {
    for b in ["mpi", "ring"] {
        let out = interleavings(2, &[("RINGREC_ENGINE_BACKEND", b), ("ENGINE_TEST_STEPS", "3")]);
        assert!(out.contains(&format!("backend={b}")), "{out}");
    }
}

fn dumps(prefix: &str, np: usize) -> Vec<Vec<u8>> {
    (0..np).map(|r| std::fs::read(format!("{prefix}.rank{r}")).expect("dump")).collect()
}

#[test]
fn fusion_on_and_off_give_identical_results() {
    let dir = common::scratch_root().join("fusion");
    std::fs::create_dir_all(&dir).unwrap();
    for (np, hosts) in [(3, ""), (4, "2")] {
        let on = dir.join(format!("on{np}")).display().to_string();
        let off = dir.join(format!("off{np}")).display().to_string();
        let on_out = interleavings(np, &[("ENGINE_TEST_OUT", &on), ("RINGREC_RANKS_PER_HOST", hosts)]);
        let off_out = interleavings(np, &[("ENGINE_TEST_OUT", &off), ("RINGREC_FUSION_THRESHOLD", "0"), ("RINGREC_RANKS_PER_HOST", hosts)]);
        // Fusion packs many tensors per collective when on, never when off.
        let collectives = |out: &str| -> u64 { out.split("collectives: ").nth(1).and_then(|s| s.split(',').next()).and_then(|s| s.parse().ok()).expect("stats") };
        let checked: u64 = off_out.split("checked=").nth(1).and_then(|s| s.split(' ').next()).and_then(|s| s.parse().ok()).expect("checked");
        assert_eq!(collectives(&off_out), checked, "fusion off runs every tensor alone: {off_out}");
        assert!(collectives(&on_out) < collectives(&off_out), "fusion on: {on_out}\nfusion off: {off_out}");
        let (a, b) = (dumps(&on, np), dumps(&off, np));
        assert!(!a[0].is_empty());
        assert_eq!(a, b, "{np} ranks: fused and unfused results differ");
        // And every rank got the same bytes.
        assert!(a.iter().all(|d| *d == a[0]));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[ignore = "runs under mpirun, launched by the tests below"]
fn worker_mismatch() {
    let rt = ringrec::init().expect("engine");
    let me = rt.rank();
    let n = if me == 1 { 5 } else { 4 };
    let shape = rt.allreduce_async("w.shape", Tensor::from_vec(vec![1.0f32; n]), ReduceOp::Sum);
    let dtype = if me == 0 { rt.allreduce_async("w.dtype", Tensor::from_vec(vec![1i32; 4]), ReduceOp::Sum) } else { rt.allreduce_async("w.dtype", Tensor::from_vec(vec![1i64; 4]), ReduceOp::Sum) };
    let op = rt.allreduce_async("w.op", Tensor::from_vec(vec![1.0f64; 4]), if me == 0 { ReduceOp::Max } else { ReduceOp::Sum });
    for (h, what) in [(shape, "[5]"), (dtype, "int64"), (op, "max")] {
        match h.wait() {
            Err(EngineError::Mismatch { name, detail }) => {
                assert!(detail.contains("rank 0: allreduce") && detail.contains(what), "{name}: {detail}");
                println!("MISMATCH rank={me} {name}: {detail}");
            }
            other => panic!("expected a mismatch, got {other:?}"),
        }
    }
    // A name still in flight cannot be submitted again. "In flight" for certain: the last
    // rank submits "twice" only after a "gate" allreduce that the others join once their
    // second submission was refused (if every rank submitted at once, "twice" could finish
    // on a rank before its second submission arrived, which is then a new tensor).
    let last = rt.size() - 1;
    let sum = [(0..rt.size()).sum::<usize>() as f32];
    if me != last {
        let a = rt.allreduce_async("twice", Tensor::from_vec(vec![me as f32]), ReduceOp::Sum);
        let b = rt.allreduce_async("twice", Tensor::from_vec(vec![me as f32]), ReduceOp::Sum);
        assert!(matches!(b.wait(), Err(EngineError::Duplicate(_))));
        rt.allreduce("gate", Tensor::from_vec(vec![1i32]), ReduceOp::Sum).expect("gate");
        assert_eq!(a.wait().unwrap().as_slice::<f32>().unwrap(), &sum);
    } else {
        rt.allreduce("gate", Tensor::from_vec(vec![1i32]), ReduceOp::Sum).expect("gate");
        let a = rt.allreduce_async("twice", Tensor::from_vec(vec![me as f32]), ReduceOp::Sum);
        assert_eq!(a.wait().unwrap().as_slice::<f32>().unwrap(), &sum);
    }
    // The engine still works afterwards.
    let ok = rt.allreduce("after", Tensor::from_vec(vec![2i64; 3]), ReduceOp::Sum).expect("allreduce after mismatches");
    assert_eq!(ok.as_slice::<i64>().unwrap(), &[2 * rt.size() as i64; 3]);
    println!("MISMATCH DONE rank={me}");
}

#[test]
fn mismatched_submissions_are_reported_on_every_rank() {
    let job = common::run_worker("worker_mismatch", 3, &[], Duration::from_secs(120));
    job.assert_ok();
    let out = job.all();
    assert_eq!(out.matches("MISMATCH DONE").count(), 3, "{out}");
    assert!(out.contains("w.shape: rank 0: allreduce float [4] sum; rank 1: allreduce float [5] sum"), "{out}");
    assert!(out.contains("rank 1: allreduce int64 [4] sum; rank 2: allreduce int64 [4] sum"), "{out}");
}

#[test]
#[ignore = "runs under mpirun, launched by the tests below"]
fn worker_stall() {
    let rt = ringrec::init().expect("engine");
    let me = rt.rank();
    let last = rt.size() - 1;
    // Warm the cache so the stall also goes through the cached path.
    for _ in 0..3 {
        rt.allreduce("late", Tensor::from_vec(vec![1.0f32; 8]), ReduceOp::Sum).expect("warm-up");
    }
    // The last rank never submits "late" again; it submits "only.me", which nobody else does.
    let h = if me == last { rt.allreduce_async("only.me", Tensor::from_vec(vec![1.0f32]), ReduceOp::Sum) } else { rt.allreduce_async("late", Tensor::from_vec(vec![1.0f32; 8]), ReduceOp::Sum) };
    match h.wait() {
        Err(EngineError::Stalled(msg)) => println!("STALL SHUTDOWN rank={me}: {msg}"),
        other => panic!("expected the stall shutdown, got {other:?}"),
    }
    // The engine is stopped for good.
    let after = rt.allreduce_async("after", Tensor::from_vec(vec![1.0f32]), ReduceOp::Sum).wait();
    match after {
        Err(EngineError::ShutDown(why)) => assert!(why.contains("stalled for more than 3 s"), "{why}"),
        other => panic!("expected the engine to refuse work after stopping, got {other:?}"),
    }
}

#[test]
fn a_rank_that_never_submits_triggers_the_stall_warning_then_shutdown_everywhere() {
    let env = [("RINGREC_STALL_CHECK_TIME_SECONDS", "1"), ("RINGREC_STALL_SHUTDOWN_TIME_SECONDS", "3")];
    let job = common::run_worker("worker_stall", 3, &env, Duration::from_secs(120));
    job.assert_ok();
    let out = job.all();
    for r in 0..3 {
        let warn = format!("ringrec rank {r}: stall: tensor(s) waiting for more than 1 s:");
        assert!(out.contains(&warn), "rank {r} did not warn:\n{out}");
        let line = out.lines().find(|l| l.contains(&format!("STALL SHUTDOWN rank={r}:"))).unwrap_or_else(|| panic!("rank {r} did not stop:\n{out}"));
        assert!(line.contains("'late' (waiting") && line.contains("for rank(s) [2])"), "{line}");
        assert!(line.contains("'only.me' (waiting") && line.contains("for rank(s) [0, 1])"), "{line}");
        assert!(line.contains("stalled for more than 3 s"), "{line}");
    }
    assert!(job.elapsed < Duration::from_secs(60), "took {:?}", job.elapsed);
}

#[test]
#[ignore = "runs under mpirun, launched by the tests below"]
fn worker_timeline() {
    let rt = ringrec::init().expect("engine");
    for step in 0..3 {
        let hs: Vec<Handle> = (0..4).map(|i| rt.allreduce_async(&format!("layer{i}.grad"), Tensor::from_vec(vec![step as f32; 1000 * (i + 1)]), ReduceOp::Average)).collect();
        for h in hs {
            h.wait().expect("allreduce");
        }
        rt.allreduce_async("known.tensor", Tensor::from_vec(vec![1.0f32; 10]), ReduceOp::Sum).wait().expect("known");
    }
    println!("TIMELINE DONE rank={}", rt.rank());
}

fn timeline_events(backend: &str) -> Vec<serde_json::Value> {
    let path = common::scratch_root().join(format!("timeline-{backend}.json"));
    let p = path.display().to_string();
    let job = common::run_worker("worker_timeline", 2, &[("RINGREC_TIMELINE", &p), ("RINGREC_ENGINE_BACKEND", backend)], Duration::from_secs(120));
    job.assert_ok();
    let text = std::fs::read_to_string(&path).expect("timeline written");
    let _ = std::fs::remove_file(&path);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}):\n{text}"));
    v.as_array().expect("a JSON array of events").clone()
}

fn phases(ev: &[serde_json::Value], tensor: &str) -> Vec<String> {
    ev.iter().filter(|e| e["ph"] == "X" && e["cat"] == tensor).map(|e| e["name"].as_str().unwrap().to_string()).collect()
}

#[test]
fn timeline_is_a_chrome_trace_with_every_phase() {
    let ev = timeline_events("shm");
    for e in ev.iter().filter(|e| e["ph"] == "X") {
        assert!(e["ts"].is_number() && e["dur"].as_f64().unwrap() >= 0.0 && e["pid"] == 0 && e["tid"].is_number(), "{e}");
    }
    let names: Vec<&str> = ev.iter().filter(|e| e["ph"] == "M" && e["name"] == "thread_name").map(|e| e["args"]["name"].as_str().unwrap()).collect();
    assert!(names.contains(&"known.tensor"), "{names:?}");
    let p = phases(&ev, "known.tensor");
    assert_eq!(p.iter().filter(|x| *x == "NEGOTIATE").count(), 3, "{p:?}");
    assert_eq!(p.iter().filter(|x| *x == "QUEUE").count(), 3, "{p:?}");
    assert_eq!(p.iter().filter(|x| *x == "ALLREDUCE").count(), 3, "{p:?}");
    // shm fuses in place: no copies for the fused layers.
    assert!(!phases(&ev, "layer0.grad").iter().any(|x| x.starts_with("MEMCPY")));
    // The ring backend goes through a fusion buffer: copy in, reduce, copy out.
    let ev = timeline_events("ring");
    let p = phases(&ev, "layer0.grad");
    for phase in ["NEGOTIATE", "QUEUE", "MEMCPY_IN_FUSION_BUFFER", "ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"] {
        assert!(p.iter().any(|x| x == phase), "missing {phase}: {p:?}");
    }
    let fused = ev.iter().find(|e| e["cat"] == "layer0.grad" && e["name"] == "ALLREDUCE").unwrap();
    assert!(fused["args"]["fused"].as_u64().unwrap() >= 2, "{fused}");
}

#[test]
fn autotune_tries_candidates_and_logs_them() {
    let log = common::scratch_root().join("autotune.csv");
    let l = log.display().to_string();
    let env = [("RINGREC_AUTOTUNE", "1"), ("RINGREC_AUTOTUNE_LOG", l.as_str()), ("RINGREC_AUTOTUNE_SAMPLE_SECONDS", "0.02"), ("ENGINE_TEST_STEPS", "40")];
    interleavings(2, &env);
    let text = std::fs::read_to_string(&log).expect("autotune log");
    let _ = std::fs::remove_file(&log);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "fusion_threshold_bytes,cycle_time_ms,score_bytes_per_second,kept");
    assert_eq!(lines.len(), 1 + 9 + 1, "{text}");
    assert!(lines[10].ends_with(",kept"), "{text}");
}

#[test]
fn bad_settings_are_refused_with_the_fix() {
    let job = common::run_worker("worker_interleavings", 1, &[("RINGREC_FUSION_THRESHOLD", "lots")], Duration::from_secs(60));
    assert_ne!(job.code, Some(0));
    assert!(job.all().contains("RINGREC_FUSION_THRESHOLD=\"lots\" is not valid: expected bytes, e.g. 67108864 or 64M"), "{}", job.all());
}

#[test]
fn the_example_trains_identical_replicas() {
    // cargo test builds the examples next to the test binaries: target/<profile>/examples.
    let exe = std::env::current_exe().expect("test exe");
    let example = exe.parent().and_then(|d| d.parent()).expect("target dir").join("examples").join("engine_mlp");
    if !example.exists() {
        eprintln!("skipping: {} was not built (run through `cargo test`, which builds examples)", example.display());
        return;
    }
    let job = common::mpirun_exe(&example, 3, &[("ENGINE_MLP_STEPS", "80")], &[], Duration::from_secs(300));
    job.assert_ok();
    let out = job.all();
    assert!(out.contains("engine_mlp: 3 rank(s), 12 parameter tensors, 80 steps") && out.contains("replicas identical: true"), "{out}");
}

/// The engine started with a device executor on the host-kernels device (the GPU code path
/// on the CPU: device buffers, a fusion buffer on the device, the cast kernels, CPU
/// collectives in place of NCCL), delayed as `RINGREC_HOST_DELAY_SEED` says.
fn device_engine() -> (ringrec::topology::Topology, ringrec::device::HostKernels, ringrec::engine::Engine) {
    use ringrec::comm::{self, HostCollectives};
    use ringrec::device::{Device, HostKernels, HostOptions};
    use ringrec::engine::{DeviceExecutor, Engine, EngineConfig};
    let topo = ringrec::topology::Topology::init().expect("MPI");
    let dev = HostKernels::with_options(HostOptions::from_env(topo.rank).expect("settings")).expect("host kernels");
    let config = EngineConfig::from_env().expect("settings");
    let coll = HostCollectives::new(comm::build_tagged(comm::Backend::auto(&topo), &topo, "device").expect("backend"));
    let engine = Engine::start_with_device(&topo, &config, Some(Box::new(DeviceExecutor::new(dev.fork().expect("fork"), coll)))).expect("engine");
    (topo, dev, engine)
}

#[test]
#[ignore = "runs under mpirun, launched by the tests below"]
fn worker_device_tensors() {
    use ringrec::device::Device;
    let (topo, dev, engine) = device_engine();
    let (me, n) = (topo.rank, topo.size);
    let sizes = [1000usize, 7, 333, 1, 4096];
    for step in 0..4 {
        // Device tensors (small integers: every summation order is exact), submitted in an
        // order that differs per rank, beside host tensors; waited for all at once, so the
        // engine fuses them.
        let mut order: Vec<usize> = (0..sizes.len()).collect();
        order.rotate_left((me + step) % sizes.len());
        let mut hs = Vec::new();
        for i in order {
            let v: Vec<f32> = values(&format!("d{i}"), me, step, sizes[i], false).iter().map(|x| *x as f32).collect();
            hs.push((i, engine.allreduce_async(&format!("dev.{i}"), dev.lend(dev.buffer_from(&v).unwrap()), ReduceOp::Sum)));
        }
        let host = engine.allreduce_async("host.0", Tensor::from_vec(vec![me as i64; 5]), ReduceOp::Sum);
        for (i, h) in hs {
            let t = h.wait().expect("device allreduce");
            assert!(t.host_bytes().is_none(), "a device tensor comes back on the device");
            let got = dev.to_vec(&dev.take_back::<f32>(t).unwrap(), sizes[i]).unwrap();
            let want: Vec<f32> = (0..sizes[i]).map(|j| (0..n).map(|r| values(&format!("d{i}"), r, step, sizes[i], false)[j]).sum::<f64>() as f32).collect();
            assert_eq!(got, want, "dev.{i} step {step}");
        }
        assert_eq!(host.wait().unwrap().as_slice::<i64>().unwrap(), &[(0..n as i64).sum::<i64>(); 5]);
    }
    // fp16 on the wire: the cast kernels round like the half crate; small integers are exact.
    let v: Vec<f32> = (0..300).map(|i| (i % 9) as f32 - 4.0).collect();
    let t = engine.allreduce_async_with("dev.fp16", dev.lend(dev.buffer_from(&v).unwrap()), ReduceOp::Average, Compression::Fp16).wait().expect("fp16");
    assert_eq!(dev.to_vec(&dev.take_back::<f32>(t).unwrap(), 300).unwrap(), v, "the average of equal values");
    // Broadcast from rank 1 on the device.
    let v = vec![me as f32 + 0.5; 17];
    let t = engine.broadcast_async("dev.bcast", dev.lend(dev.buffer_from(&v).unwrap()), 1).wait().expect("broadcast");
    assert_eq!(dev.to_vec(&dev.take_back::<f32>(t).unwrap(), 17).unwrap(), vec![1.5f32; 17]);
    // A name on a device on one rank and in host memory on another: a mismatch everywhere.
    let t = if me == 0 { Tensor::from_vec(vec![1.0f32; 4]) } else { dev.lend(dev.buffer_from(&[1.0f32; 4]).unwrap()) };
    match engine.allreduce_async("dev.where", t, ReduceOp::Sum).wait() {
        Err(EngineError::Mismatch { detail, .. }) => assert!(detail.contains("on a device"), "{detail}"),
        other => panic!("expected a mismatch, got {other:?}"),
    }
    // 1-bit on device tensors (kernels/compress.cu, allgathered encodings) == 1-bit on host
    // tensors (engine::compression) bit for bit, both forms, over steps (error feedback per
    // name), two tensors fused, sum and average.
    for step in 0..3 {
        for (c, op) in [(Compression::OneBit, ReduceOp::Sum), (Compression::OneBitL1, ReduceOp::Average)] {
            let mut hs = Vec::new();
            for (i, len) in [(0usize, 1001usize), (1, 64)] {
                let v: Vec<f32> = values(&format!("ob{i}"), me, step, len, true).iter().map(|x| *x as f32).collect();
                let d = engine.allreduce_async_with(&format!("dev.{}.{i}", c.name()), dev.lend(dev.buffer_from(&v).unwrap()), op, c);
                let h = engine.allreduce_async_with(&format!("host.{}.{i}", c.name()), Tensor::from_vec(v), op, c);
                hs.push((i, len, d, h));
            }
            for (i, len, d, h) in hs {
                let got = dev.to_vec(&dev.take_back::<f32>(d.wait().expect("device 1-bit")).unwrap(), len).unwrap();
                let want = h.wait().expect("host 1-bit").into_vec::<f32>().unwrap();
                assert_eq!(got, want, "{} tensor {i} step {step}", c.name());
            }
        }
    }
    // Allgather of device tensors (a different count per rank): every rank's values, in
    // rank order, on the device.
    let mine: Vec<f32> = (0..me + 1).map(|j| (10 * me + j) as f32).collect();
    let t = engine.allgather_async("dev.gather", dev.lend(dev.buffer_from(&mine).unwrap())).wait().expect("device allgather");
    assert!(t.host_bytes().is_none(), "a device allgather comes back on the device");
    let len = n * (n + 1) / 2;
    assert_eq!(t.shape(), &[len]);
    let got = dev.to_vec(&dev.take_back::<f32>(t).unwrap(), len).unwrap();
    let want: Vec<f32> = (0..n).flat_map(|r| (0..r + 1).map(move |j| (10 * r + j) as f32)).collect();
    assert_eq!(got, want, "device allgather");
    println!("DEVICE DONE rank={me} device={}", engine.device().unwrap_or("none"));
}

#[test]
fn device_tensors_go_through_negotiation_fusion_and_the_timeline() {
    let path = common::scratch_root().join("timeline-device.json");
    let p = path.display().to_string();
    // The second run with random delays on the device's queues.
    for (np, hosts, delays, lambda, block) in [(3, "3", "", "1", "0"), (4, "2", "5", "0.5", "100")] {
        let env = [("RINGREC_TIMELINE", p.as_str()), ("RINGREC_RANKS_PER_HOST", hosts), ("RINGREC_CYCLE_TIME", "1000"), ("RINGREC_HOST_DELAY_SEED", delays), ("RINGREC_ONEBIT_LAMBDA", lambda), ("RINGREC_ONEBIT_BLOCK", block)];
        let job = common::run_worker("worker_device_tensors", np, &env, Duration::from_secs(180));
        job.assert_ok();
        assert_eq!(job.all().matches("DEVICE DONE").count(), np, "{}", job.all());
        assert!(job.all().contains("device=shm on host-kernels") || job.all().contains("device=hier on host-kernels"), "{}", job.all());
        assert_eq!(job.all().matches("random delays").count(), if delays.is_empty() { 0 } else { np }, "{}", job.all());
        let ev: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("timeline")).expect("JSON");
        let ev = ev.as_array().unwrap();
        // Negotiated, then fused through the device fusion buffer: copy in, reduce, copy out.
        let p = phases(ev, "dev.0");
        for phase in ["NEGOTIATE", "QUEUE", "MEMCPY_IN_FUSION_BUFFER", "ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"] {
            assert!(p.iter().any(|x| x == phase), "{np} ranks: missing {phase}: {p:?}");
        }
        let fused = ev.iter().filter(|e| e["cat"] == "dev.0" && e["name"] == "ALLREDUCE").map(|e| e["args"]["fused"].as_u64().unwrap()).max().unwrap();
        assert!(fused >= 5, "{np} ranks: the five device tensors of a step are reduced as one: {fused}");
        let p = phases(ev, "dev.fp16");
        assert!(p.iter().any(|x| x == "COMPRESS") && p.iter().any(|x| x == "DECOMPRESS"), "{p:?}");
        let p = phases(ev, "dev.1bit.0");
        assert!(["COMPRESS", "ALLGATHER", "DECOMPRESS"].iter().all(|w| p.iter().any(|x| x == w)), "{p:?}");
    }
    let _ = std::fs::remove_file(&path);
}
