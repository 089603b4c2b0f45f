//! Counted dense traffic (`dense_traffic_per_rank` with `dense_traffic_source: counted`):
//! ringrec's own backends count the bytes they move per peer, inside and across hosts;
//! the stated model (`dense_traffic_model_per_rank`) agrees with the counts up to parts
//! rounded to whole elements, and `mpi` (or a collective left to MPI's own algorithm)
//! falls back to the model.

mod common;

use serde_json::Value;

const DIRS: [&str; 4] = ["intra_host_sent", "intra_host_received", "cross_host_sent", "cross_host_received"];

/// A short training run's summary on `np` ranks (`per_host` ranks per simulated host).
fn train(np: usize, per_host: Option<&str>, args: &[&str]) -> Value {
    let env: Vec<(&str, &str)> = per_host.map(|k| ("RINGREC_RANKS_PER_HOST", k)).into_iter().collect();
    let mut a = vec!["train", "--synth-rows", "6000", "--batch", "240", "--no-progress", "--json", "--max-steps", "10"];
    a.extend_from_slice(args);
    let job = common::mpirun(np, &env, &a);
    job.assert_ok();
    let line = job.stdout.lines().rev().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no JSON summary in {}", job.all()));
    serde_json::from_str(line).expect("summary JSON")
}

/// Every rank's `[intra sent, intra received, cross sent, cross received]` of `key`.
fn per_rank(s: &Value, key: &str) -> Vec<[u64; 4]> {
    s[key].as_array().unwrap_or_else(|| panic!("{key} in {s}")).iter().map(|t| DIRS.map(|d| t[d].as_u64().unwrap_or_else(|| panic!("{d} in {t}")))).collect()
}

fn sums(t: &[[u64; 4]]) -> [u64; 4] {
    t.iter().fold([0; 4], |a, r| [a[0] + r[0], a[1] + r[1], a[2] + r[2], a[3] + r[3]])
}

/// The counts: by direction, balanced over the ranks, and equal to the model up to the
/// rounding of parts (< 16 bytes per collective, rank and direction; scope host's
/// allreduces over 2 ranks per host do not round; the sums over the ranks to the model's
/// rounding to whole bytes per rank). Returns the counts.
fn counted_as_modelled(s: &Value, what: &str) -> Vec<[u64; 4]> {
    assert_eq!(s["dense_traffic_source"], "counted", "{what}");
    let counted = per_rank(s, "dense_traffic_per_rank");
    let model = per_rank(s, "dense_traffic_model_per_rank");
    let collectives = s["dense_collectives"].as_u64().unwrap();
    assert!(collectives > 0, "{what}: the engine ran collectives");
    for (r, (c, m)) in counted.iter().zip(&model).enumerate() {
        for d in 0..4 {
            assert!(c[d].abs_diff(m[d]) < 16 * collectives, "{what}: rank {r} {}: counted {} model {} ({collectives} collectives)", DIRS[d], c[d], m[d]);
        }
    }
    let (cs, ms) = (sums(&counted), sums(&model));
    assert_eq!((cs[0], cs[2]), (cs[1], cs[3]), "{what}: sent == received over the ranks, inside hosts and across");
    for d in 0..4 {
        assert!(cs[d].abs_diff(ms[d]) <= counted.len() as u64, "{what}: {} summed: counted {} model {}", DIRS[d], cs[d], ms[d]);
    }
    assert!(cs[0] + cs[2] > 0, "{what}: the dense allreduce moved bytes");
    counted
}

#[test]
fn ring_and_hier_count_as_modelled_on_two_hosts() {
    for (backend, extra) in [("ring", vec![]), ("hier", vec![]), ("ring", vec!["--compression", "fp16"])] {
        let mut args = vec!["--backend", backend];
        args.extend_from_slice(&extra);
        let what = format!("{backend} {extra:?}");
        let s = train(4, Some("2"), &args);
        assert_eq!(s["dense_traffic_model"], backend, "{what}");
        let c = counted_as_modelled(&s, &what);
        let sent_across: Vec<bool> = c.iter().map(|t| t[2] > 0).collect();
        if backend == "ring" {
            // Hosts 0 1 | 2 3: ranks 1 and 3 send to the next host, 0 and 2 receive from
            // the previous one; nothing else crosses.
            assert_eq!(sent_across, [false, true, false, true], "{what}: {c:?}");
            assert_eq!(c.iter().map(|t| t[3] > 0).collect::<Vec<_>>(), [true, false, true, false], "{what}: {c:?}");
            assert!(c.iter().all(|t| (t[0] > 0) != (t[2] > 0)), "{what}: one neighbour each way: {c:?}");
        } else {
            // Every local rank rings its part across hosts; about half of a flat ring's
            // cross-host bytes per rank (1/L of the buffer, twice (h-1)/h).
            assert_eq!(sent_across, [true; 4], "{what}: {c:?}");
        }
        if !extra.is_empty() {
            // ring widens halves to f32 before reducing: on the wire as many bytes as f32
            // (the counts above match the model at that width).
            let raw = s["dense_bytes_per_step"].as_f64().unwrap();
            assert_eq!(s["dense_wire_bytes_per_step"].as_f64().unwrap(), raw, "{what}: ring widens halves to f32 on the wire");
        }
    }
}

#[test]
fn shm_ring_and_hier_count_as_modelled_on_one_host() {
    let fp16 = vec!["--backend", "shm", "--compression", "fp16"];
    // shm runs 1-bit's allgather of the encodings itself: counted too.
    let onebit = vec!["--backend", "shm", "--compression", "1bit"];
    for args in [vec!["--backend", "auto"], vec!["--backend", "ring"], vec!["--backend", "hier"], fp16, onebit] {
        let what = format!("{args:?}");
        let s = train(3, None, &args);
        let c = counted_as_modelled(&s, &what);
        assert!(c.iter().all(|t| t[2] == 0 && t[3] == 0 && t[0] > 0), "{what}: one host, nothing crosses: {c:?}");
        if args[1] != "ring" && args[1] != "hier" {
            assert_eq!(s["dense_traffic_model"], "shm");
        }
        if args.contains(&"fp16") {
            // shm reduces halves as they are: half the bytes of f32 on the wire.
            let raw = s["dense_bytes_per_step"].as_f64().unwrap();
            assert_eq!(s["dense_wire_bytes_per_step"].as_f64().unwrap(), raw / 2.0, "{what}");
        }
    }
}

#[test]
fn sync_scope_host_counts_its_host_allreduces_inside_the_host() {
    let base = ["--backend", "hier", "--sync-every", "4"];
    let rank = train(4, Some("2"), &[&base[..], &["--sync-scope", "rank"]].concat());
    let host = train(4, Some("2"), &[&base[..], &["--sync-scope", "host"]].concat());
    let (r, h) = (counted_as_modelled(&rank, "scope rank"), counted_as_modelled(&host, "scope host"));
    for (i, (r, h)) in r.iter().zip(&h).enumerate() {
        // The same syncs cross hosts; scope host adds a host allreduce of every layer's
        // gradient every step, inside the host.
        assert_eq!((r[2], r[3]), (h[2], h[3]), "rank {i}: the syncs' cross-host bytes");
        let params = host["dense_param_bytes"].as_u64().unwrap();
        assert!(h[0] >= r[0] + 10 * params / 2, "rank {i}: scope host's intra-host bytes {} vs scope rank's {} (params {params} bytes)", h[0], r[0]);
    }
}

#[test]
fn mpi_and_a_collective_left_to_mpi_fall_back_to_the_model() {
    for args in [vec!["--backend", "mpi"], vec!["--backend", "ring", "--compression", "1bit"], vec!["--backend", "mpi", "--compression", "fp16"]] {
        let s = train(4, Some("2"), &args);
        assert_eq!(s["dense_traffic_source"], "model", "{args:?}");
        if args.contains(&"fp16") {
            // MPI has no half type: ringrec widens halves to f32 for it.
            let raw = s["dense_bytes_per_step"].as_f64().unwrap();
            assert_eq!(s["dense_wire_bytes_per_step"].as_f64().unwrap(), raw, "{args:?}");
        }
        let t = per_rank(&s, "dense_traffic_per_rank");
        assert_eq!(t, per_rank(&s, "dense_traffic_model_per_rank"), "{args:?}");
        assert!(sums(&t)[2] > 0, "{args:?}: 2 hosts, the model crosses them: {t:?}");
    }
}

#[test]
fn default_runs_keep_their_params_fnv() {
    // The reference figures are `scripts/mpirun.sh -np N` on 2 cores: N = 1 runs 2
    // threads, N = 2 one each (the thread count decides the gemm's summation order; a
    // plain mpirun binds a lone rank to one core).
    for (np, threads, fnv) in [(1, "2", "fbc72b2369a89c04"), (2, "1", "94b54096f9364f62")] {
        let job = common::mpirun(np, &[], &["train", "--json", "--no-progress", "--threads", threads]);
        job.assert_ok();
        let line = job.stdout.lines().rev().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no JSON summary in {}", job.all()));
        let s: Value = serde_json::from_str(line).expect("summary JSON");
        assert_eq!(s["params_fnv"], fnv, "{np} ranks");
        assert_eq!(s["dense_traffic_source"], "counted", "{np} ranks: shm counts");
    }
}
