//! Multi-process tests of the sparse gradient exchange (design 003): real `mpirun`, one
//! host and simulated hosts (`RINGREC_RANKS_PER_HOST`). The ignored `worker_*` tests run on
//! every rank and print marker lines; the outer tests launch them and count the markers.

mod common;

use std::collections::BTreeMap;

use mpi::collective::{CommunicatorCollectives, SystemOperation};
use std::time::Duration;

use ringrec::sparse::workload::{key_of, zipf_ids};
use ringrec::embedding::format::capacity_for_rows;
use ringrec::hash::fnv1a64;
use ringrec::hash::splitmix64;
use ringrec::embedding::{HostTable, TableConfig};
use ringrec::sparse::board::{Area, HostBoard, Part};
use ringrec::sparse::list::{encode_error, view, Viewed};
use ringrec::sparse::{AggregatedGrads, SparseError, SparseExchange, SparseExchanger, SparseList, SparseNormalize};
use ringrec::topology::Topology;

const MODES: [SparseExchange; 2] = [SparseExchange::Hierarchical, SparseExchange::Flat];
/// Small shared-memory slots, so host gathers run over many rounds.
const SMALL_SLOTS: (&str, &str) = ("RINGREC_SHM_CHUNK_BYTES", "4096");
const TIMEOUT: (&str, &str) = ("RINGREC_COMM_TIMEOUT_SECONDS", "60");

/// A worker's topology under `mpirun`; `None` when the test runs on its own (it then does
/// nothing).
fn worker_topology() -> Option<Topology> {
    std::env::var_os("RINGREC_TEST_WORKER").map(|_| Topology::init().expect("MPI"))
}

/// World ranks of every host, in local-rank order.
fn host_ranks(topo: &Topology) -> Vec<Vec<usize>> {
    let mut h = vec![Vec::new(); topo.num_hosts];
    for r in 0..topo.size {
        h[topo.host_of_rank[r]].push(r);
    }
    for ranks in &mut h {
        ranks.sort_by_key(|r| topo.local_rank_of_rank[*r]);
    }
    h
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn same(a: AggregatedGrads<'_>, b: AggregatedGrads<'_>) -> bool {
    a.keys == b.keys && a.counts == b.counts && bits(a.grads) == bits(b.grads)
}

// ---------------------------------------------------------------------------------------
// The seed's worked example.

const E: u64 = 101;
const F: u64 = 102;
const G: u64 = 103;
const H: u64 = 104;
const I: u64 = 105;

/// Rank r's row for key k (dim 2): small integers, so every sum is exact.
fn example_row(r: usize, k: u64) -> [f32; 2] {
    [(k - 100) as f32 * 3.0 * (r + 1) as f32, -((r + 1) as f32)]
}

/// rank0 {e,g,i}, rank1 {f,h,i}, rank2 {e,g,i}.
fn example_keys(r: usize) -> Vec<u64> {
    match r {
        1 => vec![F, H, I],
        _ => vec![E, G, I],
    }
}

#[test]
#[ignore = "runs under mpirun, launched by the tests below"]
fn worker_worked_example() {
    let Some(topo) = worker_topology() else { return };
    assert_eq!(topo.size, 3, "the worked example needs 3 ranks");
    let keys = example_keys(topo.rank);
    let grads: Vec<f32> = keys.iter().flat_map(|k| example_row(topo.rank, *k)).collect();
    for mode in MODES {
        for norm in [SparseNormalize::Frequency, SparseNormalize::World, SparseNormalize::None] {
            let mut ex = SparseExchanger::new(&topo, mode, norm, 2).expect("exchanger");
            let (agg, st) = ex.exchange(&keys, &grads).expect("exchange");
            let Some(agg) = agg else {
                assert!(!topo.is_leader() && mode == SparseExchange::Hierarchical, "rank {} got no result", topo.rank);
                continue;
            };
            assert_eq!(agg.keys, vec![E, F, G, H, I]);
            assert_eq!(agg.counts, Some(&[2, 1, 2, 1, 3][..]), "frequencies e2 f1 g2 h1 i3");
            let sum = |k: u64, ranks: &[usize]| -> [f32; 2] {
                let mut s = [0f32; 2];
                for r in ranks {
                    let row = example_row(*r, k);
                    s[0] += row[0];
                    s[1] += row[1];
                }
                s
            };
            let div = |s: [f32; 2], c: f32| [s[0] / c, s[1] / c];
            let (e, f, g, h, i) = (sum(E, &[0, 2]), sum(F, &[1]), sum(G, &[0, 2]), sum(H, &[1]), sum(I, &[0, 1, 2]));
            let want: Vec<[f32; 2]> = match norm {
                SparseNormalize::Frequency => vec![div(e, 2.0), f, div(g, 2.0), h, div(i, 3.0)],
                SparseNormalize::World => [e, f, g, h, i].into_iter().map(|s| div(s, 3.0)).collect(),
                SparseNormalize::None => vec![e, f, g, h, i],
                SparseNormalize::Weighted => unreachable!("not run here: tests/weights.rs"),
            };
            let want: Vec<f32> = want.concat();
            assert_eq!(agg.grads, want, "{mode} {norm}");
            if norm == SparseNormalize::Frequency {
                // grad(i) = (i0 + i1 + i2) / 3 and grad(f) = rank 1's row alone.
                assert_eq!(agg.row(4), &[(3.0 * 5.0 + 6.0 * 5.0 + 9.0 * 5.0) / 3.0, (-1.0 - 2.0 - 3.0) / 3.0]);
                assert_eq!(agg.row(1), &example_row(1, F));
            }
            println!("EXAMPLE rank={} mode={mode} normalize={norm} leader={} ok keys_global={}", topo.rank, topo.is_leader(), st.keys_global);
        }
    }
    println!("EXAMPLE DONE rank={}", topo.rank);
}

fn worked_example(extra: &[(&str, &str)], leaders: usize) {
    let mut env = vec![TIMEOUT];
    env.extend_from_slice(extra);
    let job = common::run_worker("worker_worked_example", 3, &env, Duration::from_secs(120));
    job.assert_ok();
    for r in 0..3 {
        assert!(job.stdout.contains(&format!("EXAMPLE DONE rank={r}")), "{}", job.all());
    }
    for norm in ["frequency", "world", "none"] {
        // hier: only leaders hold the result; flat: every rank computes it.
        let hier = job.stdout.matches(&format!("mode=hier normalize={norm} leader=true ok")).count();
        assert_eq!(hier, leaders, "{}", job.stdout);
        let flat = job.stdout.matches(&format!("mode=flat normalize={norm} ")).count();
        assert_eq!(flat, 3, "{}", job.stdout);
    }
}

#[test]
fn worked_example_3_ranks_one_host() {
    worked_example(&[], 1);
}

#[test]
fn worked_example_3_ranks_as_hosts_of_2_and_1() {
    worked_example(&[("RINGREC_RANKS_PER_HOST", "2")], 2);
}

// ---------------------------------------------------------------------------------------
// Property test against a single-process reference.

const DIM: usize = 3;

/// Rank r's batch at `step`: Zipf keys over a small vocabulary (many repeats inside a rank
/// and across ranks), some ranks empty, every rank empty at step 7; values of mixed
/// magnitudes so that a different summation order would show in the bits.
fn random_batch(step: usize, r: usize) -> (Vec<u64>, Vec<f32>) {
    let seed = splitmix64((step as u64) << 16 | r as u64);
    let len = if step == 7 || (step + r) % 5 == 0 { 0 } else { (seed % 1500) as usize };
    let keys: Vec<u64> = zipf_ids(300, len, 1.1, seed).into_iter().map(key_of).collect();
    let grads = (0..len * DIM)
        .map(|i| {
            let h = splitmix64(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let scale = 10f32.powi(((h >> 32) % 7) as i32 - 3);
            ((h % 2001) as f32 - 1000.0) * scale
        })
        .collect();
    (keys, grads)
}

/// The reference, written independently of the library: per key, each rank's occurrences
/// summed in input order, then the ranks of a host in local-rank order, then the hosts in
/// host order (first contribution copied, the next ones added), then normalised.
fn reference(batches: &[(Vec<u64>, Vec<f32>)], hosts: &[Vec<usize>], norm: SparseNormalize, world: usize) -> SparseList {
    fn add(into: &mut BTreeMap<u64, (Vec<f32>, u32)>, k: u64, row: &[f32], count: u32) {
        match into.get_mut(&k) {
            Some((acc, c)) => {
                acc.iter_mut().zip(row).for_each(|(a, g)| *a += *g);
                *c += count;
            }
            None => {
                into.insert(k, (row.to_vec(), count));
            }
        }
    }
    let mut global = BTreeMap::new();
    for ranks in hosts {
        let mut host = BTreeMap::new();
        for r in ranks {
            let (keys, grads) = &batches[*r];
            let mut mine: BTreeMap<u64, (Vec<f32>, u32)> = BTreeMap::new();
            for (i, k) in keys.iter().enumerate() {
                add(&mut mine, *k, &grads[i * DIM..(i + 1) * DIM], 0);
            }
            for (k, (row, _)) in mine {
                add(&mut host, k, &row, 1);
            }
        }
        for (k, (row, c)) in host {
            add(&mut global, k, &row, c);
        }
    }
    let mut out = SparseList::empty(DIM);
    for (k, (row, c)) in global {
        let d = match norm {
            SparseNormalize::Frequency => c as f32,
            SparseNormalize::World => world as f32,
            SparseNormalize::None => 1.0,
            // Every rank weighing 1 (the exchanger's default): frequency.
            SparseNormalize::Weighted => c as f32,
        };
        out.keys.push(k);
        out.counts.push(c);
        out.grads.extend(row.iter().map(|g| if norm == SparseNormalize::None { *g } else { *g / d }));
    }
    out
}

#[test]
#[ignore = "runs under mpirun, launched by the tests below"]
fn worker_property() {
    let Some(topo) = worker_topology() else { return };
    let hosts = host_ranks(&topo);
    let ranges = hosts.iter().map(Vec::len).min().unwrap_or(1);
    let mut checked = 0;
    for norm in [SparseNormalize::Frequency, SparseNormalize::World, SparseNormalize::None] {
        let mut hier = SparseExchanger::new(&topo, SparseExchange::Hierarchical, norm, DIM).expect("hier");
        let mut flat = SparseExchanger::new(&topo, SparseExchange::Flat, norm, DIM).expect("flat");
        for step in 0..12 {
            let batches: Vec<(Vec<u64>, Vec<f32>)> = (0..topo.size).map(|r| random_batch(step, r)).collect();
            let (keys, grads) = &batches[topo.rank];
            let (h, hs) = hier.exchange(keys, grads).expect("hier exchange");
            let (f, fs) = flat.exchange(keys, grads).expect("flat exchange");
            let f = f.expect("flat: every rank holds the result");
            let want = reference(&batches, &hosts, norm, topo.size);
            assert!(same(f, want.view()), "flat differs from the reference at step {step} ({norm}) on rank {}", topo.rank);
            match h {
                Some(h) => {
                    assert!(topo.is_leader(), "hier: only leaders hold the result");
                    assert!(same(h, f), "hier and flat differ at step {step} ({norm})");
                    assert_eq!(hs.keys_global as usize, want.keys.len());
                }
                None => assert!(!topo.is_leader(), "hier: a leader got no result"),
            }
            // Cross-host traffic: in hier only from ranks that own a key range (local ranks
            // below the smallest host's rank count); none at all on one host.
            if topo.num_hosts == 1 {
                assert_eq!(hs.cross_bytes_sent + fs.cross_bytes_sent, 0);
            } else if topo.local_rank >= ranges {
                assert_eq!(hs.cross_bytes_sent + hs.cross_bytes_received, 0);
            }
            assert_eq!(hs.keys_in as usize, keys.len());
            checked += 1;
        }
        assert_eq!(hier.steps(), 12);
        // Summed over the world, hier moves fewer bytes between hosts than flat.
        let mine = [hier.totals().cross_bytes_sent, flat.totals().cross_bytes_sent];
        let mut all = [0u64; 2];
        topo.world.comm.all_reduce_into(&mine[..], &mut all[..], SystemOperation::sum());
        if topo.num_hosts > 1 {
            assert!(all[0] < all[1], "hier sent {} bytes across hosts, flat {}", all[0], all[1]);
        }
        println!("PROPERTY rank={} normalize={norm} cross_bytes hier={} flat={}", topo.rank, hier.totals().cross_bytes_sent, flat.totals().cross_bytes_sent);
    }
    println!("PROPERTY DONE rank={} hosts={} checked={checked}", topo.rank, topo.num_hosts);
}

fn property(np: usize, extra: &[(&str, &str)]) {
    let mut env = vec![SMALL_SLOTS, TIMEOUT];
    env.extend_from_slice(extra);
    let job = common::run_worker("worker_property", np, &env, Duration::from_secs(300));
    job.assert_ok();
    for r in 0..np {
        assert!(job.stdout.contains(&format!("PROPERTY DONE rank={r} ")), "rank {r} did not finish:\n{}", job.all());
    }
    assert_eq!(job.stdout.matches(" checked=36").count(), np, "{}", job.stdout);
}

#[test]
fn property_1_rank() {
    property(1, &[]);
}
#[test]
fn property_2_ranks() {
    property(2, &[]);
}
#[test]
fn property_3_ranks() {
    property(3, &[]);
}
#[test]
fn property_4_ranks() {
    property(4, &[]);
}
#[test]
fn property_4_ranks_as_2_simulated_hosts() {
    property(4, &[("RINGREC_RANKS_PER_HOST", "2")]);
}
#[test]
fn property_3_ranks_as_uneven_hosts() {
    property(3, &[("RINGREC_RANKS_PER_HOST", "2")]);
}

// ---------------------------------------------------------------------------------------
// Host tables stay byte-identical.

#[test]
#[ignore = "runs under mpirun, launched by the tests below"]
fn worker_tables() {
    let Some(topo) = worker_topology() else { return };
    let dim = 8;
    let lr = 0.05;
    for mode in MODES {
        let mut cfg = TableConfig::new(dim as u32, capacity_for_rows(20_000));
        cfg.seed = 7;
        let mut table = HostTable::open(&topo, &cfg, None).expect("host table");
        let mut ex = SparseExchanger::new(&topo, mode, SparseNormalize::Frequency, dim).expect("exchanger");
        for step in 0..50 {
            let seed = splitmix64((step as u64) << 8 | topo.rank as u64);
            let len = 200 + (seed % 800) as usize;
            let keys: Vec<u64> = zipf_ids(5000, len, 1.05, seed).into_iter().map(key_of).collect();
            let grads: Vec<f32> = (0..len * dim).map(|i| ((splitmix64(seed + i as u64) % 1000) as f32 - 500.0) * 1e-3).collect();
            let (agg, _) = ex.exchange_and_apply(&mut table, &keys, &grads, lr).expect("exchange and apply");
            if step == 0 && topo.is_leader() {
                if let Some(agg) = agg {
                    // The first update is one SGD step from the initial row: w - lr * g.
                    let mut row = vec![0f32; dim];
                    for (i, k) in agg.keys.iter().enumerate() {
                        table.lookup(&[*k], &mut row).expect("lookup");
                        let mut init = vec![0f32; dim];
                        table.table().init_row(*k, &mut init);
                        let want: Vec<f32> = init.iter().zip(agg.row(i)).map(|(w, g)| w - lr * g).collect();
                        assert_eq!(bits(&row), bits(&want), "key {k}");
                    }
                }
            }
        }
        let digest = fnv1a64(table.table().as_bytes());
        println!(
            "TABLE rank={} host={} leader={} mode={mode} live_rows={} generation={} digest={digest:016x}",
            topo.rank,
            topo.host_id,
            topo.is_leader(),
            table.table().live_rows(),
            table.table().generation()
        );
    }
}

#[test]
fn tables_of_two_simulated_hosts_stay_byte_identical_over_50_steps() {
    let job_id = format!("sparsetest-tables-{}", std::process::id());
    let env = [("RINGREC_RANKS_PER_HOST", "2"), ("RINGREC_JOB_ID", job_id.as_str()), SMALL_SLOTS, TIMEOUT];
    let job = common::run_worker("worker_tables", 4, &env, Duration::from_secs(300));
    job.assert_ok();
    let lines: Vec<&str> = job.stdout.lines().filter_map(|l| l.find("TABLE rank=").map(|i| &l[i..])).collect();
    assert_eq!(lines.len(), 8, "{}", job.all());
    let field = |l: &str, f: &str| l.split_whitespace().find_map(|w| w.strip_prefix(&format!("{f}="))).unwrap_or("").to_string();
    // Both hosts, both modes, every rank (non-leaders map the same memory): one digest.
    let digests: std::collections::BTreeSet<String> = lines.iter().map(|l| field(l, "digest")).collect();
    assert_eq!(digests.len(), 1, "{}", job.stdout);
    let hosts: std::collections::BTreeSet<String> = lines.iter().map(|l| field(l, "host")).collect();
    assert_eq!(hosts.len(), 2);
    assert!(lines.iter().all(|l| field(l, "generation") == "50"), "{}", job.stdout);
    assert_eq!(common::shm_leftovers(&job_id), Vec::<String>::new());
}

// ---------------------------------------------------------------------------------------
// The host board's shared list: every local rank writes its rows where they lie.

#[test]
#[ignore = "runs under mpirun, launched by the tests below"]
fn worker_board_list() {
    let Some(topo) = worker_topology() else { return };
    let (q, dim) = (topo.local_rank, 3);
    let mut board = HostBoard::new(&topo).expect("board");
    // Local rank q's part: `rows(q)` rows, key 1,000,000 q + i, count q + 1, values q + i / 4.
    let part = |q: usize, round: usize| if q == 1 && round == 0 { 0 } else { (q + 1) * (1 + 400 * round) };
    let expected = |round: usize| {
        let mut l = SparseList::empty(dim);
        for p in 0..topo.local_size {
            for i in 0..part(p, round) {
                l.keys.push(1_000_000 * p as u64 + i as u64);
                l.counts.push(p as u32 + 1);
                l.grads.extend([p as f32 + i as f32 / 4.0; 3]);
            }
        }
        l
    };
    let mut scratch = SparseList::default();
    // Round 0 (a rank with no rows), round 1 (the segment grows), round 2 (an error), round 3.
    for round in 0..4 {
        let mut piece = Vec::new();
        let failing = round == 2 && q == topo.local_size - 1;
        let r = round.min(2) - usize::from(round == 2);
        let mine = if failing {
            encode_error(topo.rank, dim, "no rows this time", 1024, &mut piece);
            Part::Error(&piece)
        } else {
            Part::Rows(part(q, r))
        };
        let written = board
            .publish_list(mine, dim, |(keys, counts, values)| {
                for (i, ((k, c), row)) in keys.iter_mut().zip(counts.iter_mut()).zip(values.chunks_exact_mut(dim)).enumerate() {
                    *k = 1_000_000 * q as u64 + i as u64;
                    *c = q as u32 + 1;
                    row.fill(q as f32 + i as f32 / 4.0);
                }
            })
            .expect("publish_list");
        assert_eq!(written, round != 2, "round {round}");
        if written {
            // Every local rank reads the whole list in place.
            let want = expected(r);
            let Viewed::List(got) = view(board.piece(0, Area::Range), dim, topo.local_size as u32, &mut scratch).expect("a valid list") else {
                panic!("round {round}: an error piece instead of the list")
            };
            assert!(same(got, want.view()), "round {round}: {:?} vs {:?}", got.keys, want.keys);
        } else {
            for p in 0..topo.local_size {
                let bytes = board.piece(p, Area::Range);
                match view(bytes, dim, 1, &mut scratch) {
                    Ok(Viewed::Error { rank, message }) if p == topo.local_size - 1 => assert_eq!((rank, message.as_str()), (host_ranks(&topo)[topo.host_id][p], "no rows this time")),
                    _ if p != topo.local_size - 1 => assert!(bytes.is_empty(), "round {round}: rank {p} sent no error"),
                    other => panic!("round {round}: {other:?}"),
                }
            }
        }
        println!("BOARDLIST rank={} round={round} ok", topo.rank);
    }
}

#[test]
fn the_host_list_on_the_board_holds_every_ranks_rows_in_order() {
    let job = common::run_worker("worker_board_list", 3, &[TIMEOUT], Duration::from_secs(120));
    job.assert_ok();
    assert_eq!(job.stdout.matches("BOARDLIST ").count(), 12, "{}", job.all());
}

// ---------------------------------------------------------------------------------------
// Errors reach every rank; no hang.

#[test]
#[ignore = "runs under mpirun, launched by the tests below"]
fn worker_errors() {
    let Some(topo) = worker_topology() else { return };
    let bad: usize = std::env::var("RINGREC_TEST_BAD_RANK").ok().and_then(|v| v.parse().ok()).expect("RINGREC_TEST_BAD_RANK");
    let dim = 4;
    let keys = vec![1u64, 2, 2, 3];
    let grads = vec![0.5f32; keys.len() * dim];
    for mode in MODES {
        let mut ex = SparseExchanger::new(&topo, mode, SparseNormalize::Frequency, dim).expect("exchanger");
        // One rank passes one value too few.
        let mine = if topo.rank == bad { &grads[1..] } else { &grads[..] };
        match ex.exchange(&keys, mine) {
            Err(SparseError::Shape { .. }) if topo.rank == bad => println!("ERRCASE shape rank={} mode={mode} own", topo.rank),
            Err(SparseError::Peer { rank, message }) if topo.rank != bad => {
                assert_eq!(rank, bad, "{message}");
                assert!(message.contains("keys.len() * dim"), "{message}");
                println!("ERRCASE shape rank={} mode={mode} peer", topo.rank);
            }
            other => panic!("rank {} {mode}: unexpected {other:?}", topo.rank),
        }
        // The reserved key, on the same rank.
        let k = if topo.rank == bad { vec![1u64, 2, 2, u64::MAX] } else { keys.clone() };
        match ex.exchange(&k, &grads) {
            Err(SparseError::ReservedKey { .. }) if topo.rank == bad => println!("ERRCASE reserved rank={} mode={mode} own", topo.rank),
            Err(SparseError::Peer { rank, .. }) if topo.rank != bad && rank == bad => println!("ERRCASE reserved rank={} mode={mode} peer", topo.rank),
            other => panic!("rank {} {mode}: unexpected {other:?}", topo.rank),
        }
        // The exchanger still works afterwards.
        let (agg, _) = ex.exchange(&keys, &grads).expect("exchange after errors");
        if let Some(agg) = agg {
            assert_eq!(agg.keys, vec![1, 2, 3]);
            assert_eq!(agg.counts, Some(&[topo.size as u32; 3][..]));
            assert_eq!(agg.row(1), &[1.0; 4], "key 2 was twice in every batch: 0.5 + 0.5");
        }
        println!("ERRCASE recovered rank={} mode={mode}", topo.rank);
    }
    // A failed table update on the leaders (a NaN learning rate) reaches every local rank,
    // and the next step works.
    let mut table = HostTable::open(&topo, &TableConfig::new(dim as u32, 1024), None).expect("host table");
    for mode in MODES {
        let mut ex = SparseExchanger::new(&topo, mode, SparseNormalize::Frequency, dim).expect("exchanger");
        match ex.exchange_and_apply(&mut table, &keys, &grads, f32::NAN) {
            Err(SparseError::Table(e)) if topo.is_leader() => assert!(e.to_string().contains("learning rate"), "{e}"),
            Err(SparseError::Peer { rank, message }) if !topo.is_leader() => {
                assert_eq!(topo.host_of_rank[rank], topo.host_id, "the error comes from this host's leader");
                assert!(message.contains("learning rate"), "{message}");
            }
            other => panic!("rank {} {mode}: unexpected {other:?}", topo.rank),
        }
        ex.exchange_and_apply(&mut table, &keys, &grads, 0.1).expect("apply after a failed apply");
        println!("ERRCASE apply rank={} mode={mode}", topo.rank);
    }
    // A rank configured with another dim: every rank fails at construction.
    let d = if topo.rank == bad { dim + 1 } else { dim };
    match SparseExchanger::new(&topo, SparseExchange::Hierarchical, SparseNormalize::Frequency, d) {
        Err(e @ SparseError::Mismatch { .. }) => {
            assert!(e.to_string().contains(&format!("rank {bad} has dim {}", dim + 1)), "{e}");
            println!("ERRCASE dim rank={}", topo.rank);
        }
        other => panic!("rank {}: unexpected {other:?}", topo.rank),
    }
}

fn errors(np: usize, bad: usize, extra: &[(&str, &str)]) {
    let bad_s = bad.to_string();
    let mut env = vec![("RINGREC_TEST_BAD_RANK", bad_s.as_str()), TIMEOUT];
    env.extend_from_slice(extra);
    let job = common::run_worker("worker_errors", np, &env, Duration::from_secs(120));
    job.assert_ok();
    assert!(job.elapsed < Duration::from_secs(60), "errors must not wait for a timeout: {:?}", job.elapsed);
    for case in ["shape", "reserved"] {
        assert_eq!(job.stdout.matches(&format!("ERRCASE {case} rank={bad} ")).count(), 2, "{}", job.stdout);
        assert_eq!(job.stdout.matches(&format!("ERRCASE {case} ")).count(), 2 * np, "{}", job.stdout);
        assert_eq!(job.stdout.matches(&format!("ERRCASE {case} rank={bad} mode=hier own")).count(), 1, "{}", job.stdout);
    }
    assert_eq!(job.stdout.matches("ERRCASE recovered ").count(), 2 * np, "{}", job.stdout);
    assert_eq!(job.stdout.matches("ERRCASE apply ").count(), 2 * np, "{}", job.stdout);
    assert_eq!(job.stdout.matches("ERRCASE dim ").count(), np, "{}", job.stdout);
}

#[test]
fn a_bad_non_leader_fails_every_rank_2_simulated_hosts() {
    errors(4, 3, &[("RINGREC_RANKS_PER_HOST", "2")]);
}
#[test]
fn a_bad_leader_fails_every_rank_2_simulated_hosts() {
    errors(4, 2, &[("RINGREC_RANKS_PER_HOST", "2")]);
}
#[test]
fn a_bad_rank_fails_every_rank_one_host() {
    errors(3, 1, &[]);
}
