//! Multi-process tests of the host-shared embedding table: real `mpirun`, one host and two
//! simulated hosts. Each test runs the binary's hidden `ringrec table selftest` on every
//! rank and asserts on the lines the ranks print: `rank R local_rank L host H rows_ok B rows_digest X unseen_ok B unseen_digest X
//! write W live_rows N generation G segment PATH`.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;


/// Runs `ringrec table selftest ARGS` (the per-rank checks) on `np` ranks under mpirun.
fn selftest(np: usize, env: &[(&str, &str)], args: &[&str]) -> common::Job {
    let mut a = vec!["table", "selftest"];
    a.extend_from_slice(args);
    common::mpirun_exe(std::path::Path::new(env!("CARGO_BIN_EXE_ringrec")), np, env, &a, Duration::from_secs(120))
}

/// Worker: local rank 1 never reaches the table's host barrier; the others must get an
/// error naming it after the comm timeout, not hang.
#[test]
#[ignore]
fn worker_sync_with_a_stuck_peer() {
    if std::env::var_os("RINGREC_TEST_WORKER").is_none() {
        return;
    }
    let topo = ringrec::topology::Topology::init().expect("topology");
    let mut ht = ringrec::embedding::HostTable::open(&topo, &ringrec::embedding::TableConfig::new(4, 1024), None).expect("open");
    if topo.local_rank == 1 {
        std::thread::sleep(Duration::from_secs(60));
    }
    let started = std::time::Instant::now();
    match ht.sync() {
        Ok(()) => println!("rank {} sync returned", topo.rank),
        Err(e) => println!("rank {} sync error after {:.1}s: {e}", topo.rank, started.elapsed().as_secs_f64()),
    }
    std::process::exit(1);
}

#[test]
fn a_stuck_rank_fails_the_table_sync_after_the_timeout() {
    let job = job_id("stuck");
    let env = [("RINGREC_JOB_ID", job.as_str()), ("RINGREC_COMM_TIMEOUT_SECONDS", "1")];
    let out = common::run_worker("worker_sync_with_a_stuck_peer", 3, &env, Duration::from_secs(60));
    assert!(!out.timed_out, "a stuck rank must not hang the others:\n{}", out.all());
    let errors: Vec<&str> = out.stdout.lines().filter(|l| l.contains(" sync error after ")).collect();
    assert_eq!(errors.len(), 2, "ranks 0 and 2 report it:\n{}", out.all());
    assert!(errors.iter().all(|l| l.contains("host table sync: timed out after 1s waiting for rank(s) [1]")), "{errors:#?}");
    assert_eq!(common::shm_leftovers(&job), Vec::<String>::new());
}

/// One rank's report line, as field -> value.
fn reports(out: &str) -> Vec<BTreeMap<String, String>> {
    out.lines()
        .filter(|l| l.contains(" rows_ok "))
        .filter_map(|l| l.find("rank ").map(|i| &l[i..]))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.chunks(2).filter(|c| c.len() == 2).map(|c| (c[0].to_string(), c[1].to_string())).collect()
        })
        .collect()
}

fn job_id(name: &str) -> String {
    format!("embtest-{name}-{}", std::process::id())
}

fn distinct<'a>(rs: &'a [BTreeMap<String, String>], field: &str) -> BTreeSet<&'a str> {
    rs.iter().map(|r| r[field].as_str()).collect()
}

#[test]
fn one_host_four_ranks_share_one_table() {
    let job = job_id("one");
    let out = selftest(4, &[("RINGREC_JOB_ID", &job)], &[]);
    out.assert_ok();
    let rs = reports(&out.stdout);
    assert_eq!(rs.len(), 4, "{}", out.all());
    // Rows the leader wrote read back identically (and exactly as computed) on every rank.
    assert!(rs.iter().all(|r| r["rows_ok"] == "true" && r["unseen_ok"] == "true"), "{}", out.stdout);
    assert_eq!(distinct(&rs, "rows_digest").len(), 1, "{}", out.stdout);
    assert_eq!(distinct(&rs, "unseen_digest").len(), 1, "{}", out.stdout);
    // One writer; the three others are refused.
    assert_eq!(rs.iter().filter(|r| r["write"] == "leader_wrote").count(), 1);
    assert_eq!(rs.iter().filter(|r| r["write"] == "write_refused").count(), 3);
    assert!(rs.iter().all(|r| r["live_rows"] == "1000" && r["generation"] == "1"));
    assert_eq!(distinct(&rs, "segment").len(), 1, "one table per host");
    assert!(out.stdout.contains("selftest ok: 4 ranks on 1 hosts"), "{}", out.stdout);
    assert_eq!(common::shm_leftovers(&job), Vec::<String>::new());
}

#[test]
fn two_simulated_hosts_have_one_table_each() {
    let job = job_id("two");
    let env = [("RINGREC_JOB_ID", job.as_str()), ("RINGREC_RANKS_PER_HOST", "2")];
    let out = selftest(4, &env, &["--dtype", "bf16", "--optimizer", "adagrad"]);
    out.assert_ok();
    let rs = reports(&out.stdout);
    assert_eq!(rs.len(), 4, "{}", out.all());
    assert_eq!(distinct(&rs, "host"), BTreeSet::from(["0", "1"]));
    assert_eq!(distinct(&rs, "segment").len(), 2, "one table per simulated host");
    assert_eq!(rs.iter().filter(|r| r["write"] == "leader_wrote").count(), 2, "one leader per host");
    assert_eq!(rs.iter().filter(|r| r["write"] == "write_refused").count(), 2);
    // Both hosts applied the same updates: identical rows everywhere; unseen keys agree too.
    assert_eq!(distinct(&rs, "rows_digest").len(), 1, "{}", out.stdout);
    assert_eq!(distinct(&rs, "unseen_digest").len(), 1, "{}", out.stdout);
    assert!(rs.iter().all(|r| r["rows_ok"] == "true" && r["unseen_ok"] == "true"));
    assert_eq!(common::shm_leftovers(&job), Vec::<String>::new());
}

#[test]
fn leader_failure_reaches_every_rank_without_a_hang() {
    let job = job_id("fail");
    let bad = std::env::temp_dir().join(format!("{job}-corrupt.params"));
    std::fs::write(&bad, b"RRSPARAM\x01\0\0\0\x08\0\0\0\xff\xff\xff\xff\0\0\0\0truncated").unwrap();
    let env = [("RINGREC_JOB_ID", job.as_str()), ("RINGREC_RANKS_PER_HOST", "2")];
    let out = selftest(4, &env, &["--import", bad.to_str().unwrap()]);
    let _ = std::fs::remove_file(&bad);
    assert!(!out.timed_out, "a leader failure must not hang the job:\n{}", out.all());
    assert_ne!(out.code, Some(0), "{}", out.all());
    let errors: Vec<&str> = out.stdout.lines().filter(|l| l.contains(" error: ")).collect();
    assert_eq!(errors.len(), 4, "every rank reports the failure:\n{}", out.all());
    assert!(errors.iter().all(|l| l.contains("not a valid sparse-parameter file")), "{errors:#?}");
    assert_eq!(errors.iter().filter(|l| l.contains("host leader could not set up")).count(), 2, "{errors:#?}");
    assert_eq!(common::shm_leftovers(&job), Vec::<String>::new());
}

#[test]
fn a_rank_crashing_leaves_no_segment() {
    let job = job_id("crash");
    let env = [("RINGREC_JOB_ID", job.as_str())];
    let out = selftest(4, &env, &["--fail-rank", "0"]);
    assert!(!out.timed_out, "{}", out.all());
    assert_ne!(out.code, Some(0), "{}", out.all());
    assert!(out.all().contains("exiting on purpose"), "{}", out.all());
    assert_eq!(common::shm_leftovers(&job), Vec::<String>::new());
}
