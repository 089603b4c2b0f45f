//! A table that never stops the job (issue 16), under real mpirun: the host table grows
//! (every local rank remaps it), admits, expires and evicts identically on every host, and
//! `ringrec train` with a table that starts tiny gives the same run as one that starts big,
//! resumes bit-identically across a growth, and finishes under a byte limit.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use mpi::collective::CommunicatorCollectives;

use ringrec::embedding::{EmbeddingTable, Evict, HostTable, StorageDtype, TableConfig, TablePolicy, TableSource};
use ringrec::hash::fnv1a64;
use ringrec::topology::Topology;

// ---- The host table under a policy: growth, admission, expiry, eviction on every host ----

/// Worker: every host's leader applies the same 40 batches of a key stream (600 new keys
/// and 200 seen before per batch) to a host table of 64 slots under a policy set by
/// `RINGREC_GROW_*`, each followed by the host barrier; after each, every rank looks keys
/// of the stream up (50 more per batch). Prints per rank:
/// `rank R host H capacity C live N growths G evicted E expired X refused F file F lookups L`
/// (`file`: digest of the leader's table file, `-` elsewhere; `lookups`: digest of every
/// rank's lookups over all batches).
#[test]
#[ignore]
fn worker_grow() {
    if std::env::var_os("RINGREC_TEST_WORKER").is_none() {
        return;
    }
    if let Err(e) = grow() {
        eprintln!("grow worker failed: {e:#}");
        std::process::exit(1);
    }
}

fn grow() -> anyhow::Result<()> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let topo = Topology::init()?;
    let mut cfg = TableConfig::new(4, 64);
    cfg.seed = 5;
    cfg.track_usage = true;
    cfg.admit_after = var("RINGREC_GROW_ADMIT").map_or(Ok(1), |v| v.parse())?;
    cfg.sketch_bytes = 1 << 20;
    cfg.dtype = var("RINGREC_GROW_DTYPE").map_or(Ok(StorageDtype::F32), |v| v.parse().map_err(anyhow::Error::msg))?;
    let max_capacity = var("RINGREC_GROW_MAX_CAPACITY").map_or(Ok(1 << 20), |v| v.parse())?;
    let evict: Evict = var("RINGREC_GROW_EVICT").map_or(Ok(Evict::Lru), |v| v.parse().map_err(anyhow::Error::msg))?;
    let expire_after = var("RINGREC_GROW_EXPIRE").map(|v| v.parse()).transpose()?;
    let mut ht = HostTable::open_from(&topo, TableSource::New(&cfg))?;
    ht.set_policy(TablePolicy { max_capacity, evict, expire_after });
    let d = 4usize;
    let mut lookups = Vec::new();
    let mut all_keys: Vec<u64> = Vec::new();
    for b in 0..40u64 {
        let mut keys: Vec<u64> = (0..600).map(|i| (b * 600 + i) * 2654435761 % 1_000_000_007).collect();
        keys.extend((0..200).map(|i| ((b * 37 + i * 11) % (b * 600 + 1)) * 2654435761 % 1_000_000_007));
        keys.sort_unstable();
        keys.dedup();
        let grads: Vec<f32> = keys.iter().flat_map(|k| (0..d).map(move |j| ((k % 97) as f32 + j as f32) / 97.0 - 0.5)).collect();
        if ht.is_leader() {
            ht.apply_updates(&keys, &grads, 0.25)?;
        }
        ht.sync()?;
        all_keys.extend_from_slice(&keys[..50]);
        let mut out = vec![0f32; all_keys.len() * d];
        ht.lookup(&all_keys, &mut out)?;
        lookups.extend(out.iter().map(|x| x.to_bits()));
        // Every rank is done with this batch (its sync and lookups) before the leader's
        // next update, as in training, where the next step's exchange waits for every rank.
        topo.world.comm.barrier();
    }
    let t = ht.table();
    let c = t.counts();
    let file = if ht.is_leader() { format!("{:016x}", fnv1a64(t.as_bytes())) } else { "-".into() };
    println!(
        "rank {} host {} capacity {} live {} growths {} evicted {} expired {} refused {} file {file} lookups {:016x}",
        topo.rank,
        topo.host_id,
        t.capacity(),
        t.live_rows(),
        c.growths,
        c.evicted,
        c.expired,
        c.refused,
        fnv1a64(bytemuck::cast_slice(&lookups))
    );
    let _ = std::io::stdout().flush();
    drop(ht);
    topo.world.comm.barrier();
    Ok(())
}

/// `key value` pairs of every report line (from its `rank`: the ranks' outputs interleave
/// with the test harness' lines).
fn reports(out: &str) -> Vec<BTreeMap<String, String>> {
    out.lines()
        .filter_map(|l| l.find("rank ").map(|i| &l[i..]))
        .filter(|l| l.contains(" lookups "))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.chunks(2).filter(|c| c.len() == 2).map(|c| (c[0].to_string(), c[1].to_string())).collect()
        })
        .collect()
}

fn distinct<'a>(rs: &'a [BTreeMap<String, String>], field: &str) -> BTreeSet<&'a str> {
    rs.iter().map(|r| r[field].as_str()).collect()
}

/// Runs the worker on 4 ranks as 2 simulated hosts with `env`; checks that every rank
/// reports the same table, every leader the same file and every rank the same lookups, and
/// that nothing is left in /dev/shm. Returns rank 0's report.
fn grow_on_two_hosts(name: &str, env: &[(&str, &str)]) -> BTreeMap<String, String> {
    let job = format!("grow{name}{}", std::process::id());
    let mut e = vec![("RINGREC_RANKS_PER_HOST", "2"), ("RINGREC_JOB_ID", job.as_str())];
    e.extend_from_slice(env);
    let run = common::run_worker("worker_grow", 4, &e, Duration::from_secs(240));
    run.assert_ok();
    let rs = reports(&run.stdout);
    assert_eq!(rs.len(), 4, "{}", run.all());
    assert_eq!(distinct(&rs, "host"), BTreeSet::from(["0", "1"]));
    for field in ["capacity", "live", "growths", "evicted", "expired", "refused", "lookups"] {
        assert_eq!(distinct(&rs, field).len(), 1, "{name}: {field} differs between ranks:\n{}", run.stdout);
    }
    let files: BTreeSet<&str> = distinct(&rs, "file").into_iter().filter(|f| *f != "-").collect();
    assert_eq!(files.len(), 1, "{name}: the hosts' table files differ:\n{}", run.stdout);
    assert!(common::shm_leftovers(&job).is_empty(), "{name}: left in /dev/shm: {:?}", common::shm_leftovers(&job));
    rs.into_iter().find(|r| r["rank"] == "0").expect("rank 0")
}

fn num(r: &BTreeMap<String, String>, field: &str) -> u64 {
    r[field].parse().unwrap_or_else(|_| panic!("{field}: {}", r[field]))
}

#[test]
fn hosts_grow_their_tables_identically_and_every_rank_remaps() {
    // 40 batches of 600 new keys: 24000 rows through a 64-slot table, which grows whenever
    // a batch would pass 70% load, to the smallest power of two that holds it: 1024 (batch
    // 0: 600 rows), 2048 (1200 > 716), 4096 (1800 > 1433), 8192 (3000 > 2867), 16384
    // (6000 > 5734), 32768 (12000 > 11468), 65536 (23400 > 22937): 7 growths, every local
    // rank following each.
    let r = grow_on_two_hosts("plain", &[]);
    assert_eq!((num(&r, "capacity"), num(&r, "live"), num(&r, "growths")), (65536, 24000, 7));
    assert_eq!((num(&r, "evicted"), num(&r, "expired"), num(&r, "refused")), (0, 0, 0));
    // Half-precision rows grow the same way.
    let r = grow_on_two_hosts("bf16", &[("RINGREC_GROW_DTYPE", "bf16")]);
    assert_eq!((num(&r, "capacity"), num(&r, "growths")), (65536, 7));
}

#[test]
fn hosts_admit_expire_and_evict_identically() {
    // Admission after 2 batches: the 600 new keys of a batch are dropped, the 200 seen
    // before (in an earlier batch) get rows when not admitted yet.
    // A 1 MiB sketch (4 x 256 Ki counters) holds 24000 keys with few collisions.
    let r = grow_on_two_hosts("admit", &[("RINGREC_GROW_ADMIT", "2")]);
    assert!(num(&r, "live") <= 8000 && num(&r, "refused") > 23_900, "{r:?}");
    // At most 4096 slots (2867 rows, after 3 growths): from batch 4 on every batch evicts,
    // LRU and LFU.
    for evict in ["lru", "lfu"] {
        let r = grow_on_two_hosts(evict, &[("RINGREC_GROW_MAX_CAPACITY", "4096"), ("RINGREC_GROW_EVICT", evict)]);
        assert_eq!((num(&r, "capacity"), num(&r, "growths")), (4096, 3));
        assert!(num(&r, "evicted") > 20000 && num(&r, "live") <= 2867, "{evict}: {r:?}");
    }
    // Expiry after 3 updates: about 3 batches' keys live.
    let r = grow_on_two_hosts("expire", &[("RINGREC_GROW_EXPIRE", "3")]);
    assert!(num(&r, "expired") > 15000 && num(&r, "live") < 3000, "{r:?}");
}

// ---- `ringrec train` with a managed table ----

/// Shared small data set (generated by the first run, reused after).
fn data_dir() -> PathBuf {
    common::shared_scratch("data")
}

fn tmpdir(name: &str) -> PathBuf {
    common::scratch(name)
}

/// `ringrec train` on 6000 synthetic rows, batches of 240, under mpirun.
fn train(np: usize, env: &[(&str, &str)], args: &[&str]) -> common::Job {
    let dd = data_dir();
    let dd = dd.to_str().expect("utf8");
    let mut e = vec![("RINGREC_DATA_DIR", dd)];
    e.extend_from_slice(env);
    let mut a = vec!["train", "--synth-rows", "6000", "--batch", "240", "--no-progress", "--json", "--record-losses"];
    a.extend_from_slice(args);
    let job = common::mpirun(np, &e, &a);
    job.assert_ok();
    job
}

fn summary(job: &common::Job) -> serde_json::Value {
    let line = job.stdout.lines().rev().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no JSON summary:\n{}", job.all()));
    serde_json::from_str(line).expect("summary JSON")
}

/// The table of the newest checkpoint in `dir`.
fn checkpoint_table(dir: &Path) -> PathBuf {
    let step = ringrec::train::checkpoint::latest_step(dir).unwrap_or_else(|| panic!("no checkpoint in {}", dir.display()));
    ringrec::train::checkpoint::step_dir(dir, step).join("table.rrt")
}

/// The bits of a row, its accumulator's bits and its usage.
type RowBits = (Vec<u32>, Option<u32>, Option<(u32, u32)>);

/// Every row of a table file by key: its values, accumulator and usage (bits).
fn rows_by_key(path: &Path) -> BTreeMap<u64, RowBits> {
    let t = EmbeddingTable::open_readonly(path).expect("a table");
    let mut row = vec![0f32; t.dim()];
    t.live_keys()
        .into_iter()
        .map(|(k, _)| {
            t.lookup(&[k], &mut row).expect("lookup");
            (k, (row.iter().map(|x| x.to_bits()).collect(), t.accumulator(k).map(f32::to_bits), t.usage(k)))
        })
        .collect()
}

fn u(s: &serde_json::Value, field: &str) -> u64 {
    s[field].as_u64().unwrap_or_else(|| panic!("{field}: {}", s[field]))
}

#[test]
fn a_table_that_starts_tiny_grows_and_gives_the_same_run_as_a_big_one() {
    // 16 steps from 1024 slots (716 rows): the table grows at steps 1, 2, 4 and 10, to
    // 32768 slots, and the run — losses, dense parameters, AUC, every row of the table —
    // is the one that starts at 65536 slots. On one host and on two simulated hosts.
    for (np, hosts) in [(2, None), (4, Some("2"))] {
        let env: Vec<(&str, &str)> = hosts.map(|k| ("RINGREC_RANKS_PER_HOST", k)).into_iter().collect();
        let mut runs = Vec::new();
        for cap in ["1024", "65536"] {
            let dir = tmpdir(&format!("same-{np}-{cap}"));
            let job = train(np, &env, &["--max-steps", "16", "--table-capacity", cap, "--sparse-optimizer", "adagrad", "--checkpoint-dir", dir.to_str().unwrap()]);
            runs.push((summary(&job), rows_by_key(&checkpoint_table(&dir)), job.stderr.clone()));
        }
        let ((small, small_rows, log), (big, big_rows, _)) = (&runs[0], &runs[1]);
        assert_eq!((u(small, "table_growths"), u(small, "table_capacity")), (4, 32768), "{np} ranks: {small}");
        assert_eq!((u(big, "table_growths"), u(big, "table_capacity")), (0, 65536));
        for line in ["step 1: the embedding table grew from 1024 to 4096 slots", "step 10: the embedding table grew from 16384 to 32768 slots"] {
            assert!(log.contains(line), "{np} ranks: rank 0 reports every growth: {log}");
        }
        for field in ["params_fnv", "losses", "test_auc", "test_logloss", "table_rows", "table_inserted"] {
            assert_eq!(small[field], big[field], "{np} ranks: {field}");
        }
        assert_eq!(small_rows.len() as u64, u(small, "table_rows"));
        assert!(small_rows == big_rows, "{np} ranks: the tables hold different rows");
    }
}

#[test]
fn resume_across_a_growth_is_bit_identical_with_admission_expiry_and_half_rows() {
    // 12 steps, or 6 then 6 more from the checkpoint of step 6: growths on both sides of
    // it, and the same dense parameters and the same table file, byte for byte — with the
    // admission counts and the rows' last updates carried in the table (f32, Adagrad,
    // --admit-after 2, --expire-after-steps 3), and with f16 and bf16 rows.
    let f32_admit = ["--table-dtype", "f32", "--sparse-optimizer", "adagrad", "--admit-after", "2", "--admit-sketch-mib", "4", "--expire-after-steps", "3"];
    let configs: [&[&str]; 3] = [&f32_admit, &["--table-dtype", "f16"], &["--table-dtype", "bf16"]];
    for extra in configs {
        let name = extra[1];
        let (whole, parts) = (tmpdir(&format!("whole-{name}")), tmpdir(&format!("parts-{name}")));
        let with = |dir: &Path, more: &[&'static str]| -> Vec<String> {
            let mut a: Vec<String> = ["--table-capacity", "1024", "--checkpoint-every", "6", "--checkpoint-dir"].iter().map(|s| s.to_string()).collect();
            a.push(dir.to_str().unwrap().to_string());
            a.extend(extra.iter().chain(more).map(|s| s.to_string()));
            a
        };
        let run = |args: Vec<String>| summary(&train(2, &[], &args.iter().map(String::as_str).collect::<Vec<_>>()));
        let full = run(with(&whole, &["--max-steps", "12"]));
        let first = run(with(&parts, &["--max-steps", "6"]));
        let second = run(with(&parts, &["--max-steps", "12", "--resume"]));
        assert!(u(&first, "table_growths") >= 1 && u(&second, "table_growths") >= 1, "{name}: growths {} and {}", first["table_growths"], second["table_growths"]);
        assert_eq!(u(&full, "table_growths"), u(&first, "table_growths") + u(&second, "table_growths"));
        assert_eq!(second["params_fnv"], full["params_fnv"], "{name}");
        assert_eq!(second["table_dtype"], name);
        let (a, b) = (std::fs::read(checkpoint_table(&whole)).unwrap(), std::fs::read(checkpoint_table(&parts)).unwrap());
        assert!(a == b, "{name}: the resumed run's table differs from the uninterrupted run's");
        let t = EmbeddingTable::open_readonly(&checkpoint_table(&whole)).unwrap();
        assert_eq!(t.header().dtype.name(), name);
        if name == "f32" {
            // Every key is refused once, in its first step (a removed key that comes back
            // is admitted at once: its count stays in the sketch).
            let c = t.counts();
            assert_eq!((c.refused, u(&full, "admission_sketch_bytes")), (u(&first, "table_refused") + u(&second, "table_refused"), 4 << 20));
            assert!(c.expired > 0 && c.refused > c.inserted, "{c:?}");
        }
    }
}

#[test]
fn admission_drops_the_first_sight_of_every_key() {
    // --admit-after 2: every distinct key of the run is refused exactly once (its first
    // step); the table holds only the keys seen in two steps.
    let plain = summary(&train(2, &[], &["--max-steps", "16"]));
    let admit = summary(&train(2, &[], &["--max-steps", "16", "--admit-after", "2", "--admit-sketch-mib", "4"]));
    assert_eq!(u(&admit, "table_refused"), u(&plain, "table_inserted"));
    assert_eq!(u(&admit, "table_rows"), u(&admit, "table_inserted"));
    assert!(u(&admit, "table_rows") * 2 < u(&plain, "table_rows"), "{} vs {}", admit["table_rows"], plain["table_rows"]);
    assert_eq!((u(&plain, "admission_sketch_bytes"), u(&admit, "admission_sketch_bytes")), (0, 4 << 20));
}

#[test]
fn a_byte_limit_evicts_and_never_stops_the_job() {
    // At most the bytes of a 4096-slot table: from 1024 slots the table grows once (to
    // 4096 at step 1, whose 2000-odd keys need it), then evicts (LRU, LFU) for the rest of
    // the 16 steps, on two simulated hosts, and finishes.
    let shape = ringrec::embedding::Extras { usage: true, sketch_depth: 0, sketch_width: 0 };
    let max = ringrec::embedding::Layout::compute(16, StorageDtype::F32, 4096, ringrec::embedding::OptimizerKind::Sgd, shape).unwrap().file_len.to_string();
    for evict in ["lru", "lfu"] {
        let s = summary(&train(4, &[("RINGREC_RANKS_PER_HOST", "2")], &["--max-steps", "16", "--table-capacity", "1024", "--table-max-bytes", &max, "--evict", evict]));
        assert_eq!((u(&s, "table_capacity"), u(&s, "table_growths")), (4096, 1), "{evict}: {s}");
        assert!(u(&s, "table_rows") <= 2867 && u(&s, "table_evictions") > 5000, "{evict}: {s}");
        assert_eq!(u(&s, "table_inserted") - u(&s, "table_evictions"), u(&s, "table_rows"));
    }
    // A limit below the first table is refused up front, naming the flag.
    let dd = data_dir();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ringrec"))
        .args(["train", "--synth-rows", "6000", "--no-progress", "--table-capacity", "65536", "--table-max-bytes", "1M"])
        .env("RINGREC_DATA_DIR", &dd)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--table-max-bytes 1048576 is smaller than the initial table"), "{err}");
}
