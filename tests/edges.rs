//! Issue 36's rough edges, each pinned by the case that showed it: a growing table on a
//! small shared-memory directory evicts instead of stopping the job (2 and 4 ranks on a
//! tmpfs).

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::TempDir;

/// Where Open MPI's shared-memory transport puts its own segments (default /dev/shm): in the
/// test's data directory, so that they do not take the test's tmpfs.
const VADER_DIR: &str = "OMPI_MCA_btl_vader_backing_directory";

fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_ringrec")
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A tmpfs mounted on a fresh directory, unmounted when dropped (before the directory is
/// removed).
struct Tmpfs(TempDir);

impl Tmpfs {
    /// A tmpfs of `size` (`20m`), or `None` (saying why) when it cannot be mounted.
    fn mount(name: &str, size: &str) -> Option<Tmpfs> {
        if !is_root() {
            eprintln!("skipped: mounting a tmpfs needs root");
            return None;
        }
        let dir = TempDir::new(name);
        let mounted = Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"]).arg(&dir.0).status();
        if !mounted.is_ok_and(|s| s.success()) {
            eprintln!("skipped: cannot mount a tmpfs of {size} on {}", dir.0.display());
            return None;
        }
        Some(Tmpfs(dir))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0 .0).status();
    }
}

/// A field of a JSON summary line.
fn field(stdout: &str, name: &str) -> u64 {
    let v: serde_json::Value = stdout.lines().rev().find_map(|l| serde_json::from_str(l).ok()).unwrap_or_else(|| panic!("no JSON summary in:\n{stdout}"));
    v[name].as_u64().unwrap_or_else(|| panic!("no {name} in {v}"))
}

/// `np` ranks on one host with a tmpfs of `size` as the shared-memory directory and a
/// 16384-slot table that the data outgrows: the default --table-max-bytes leaves room for a
/// growth's peak beside every segment, so the table grows, then evicts, and the job ends
/// well (before issue 36, a growth failed for want of space and stopped the job).
fn grows_then_evicts(np: usize, size: &str) {
    let Some(shm) = Tmpfs::mount(&format!("edges-tmpfs-{np}"), size) else { return };
    let data = TempDir::new(&format!("edges-tmpfs-data-{np}"));
    let (s, d) = (shm.0 .0.display().to_string(), data.0.display().to_string());
    let env = [("RINGREC_SHM_DIR", s.as_str()), ("RINGREC_DATA_DIR", d.as_str()), ("RINGREC_COMM_TIMEOUT_SECONDS", "60"), (VADER_DIR, d.as_str())];
    let args = ["train", "--no-progress", "--json", "--no-eval", "--table-capacity", "16384", "--synth-rows", "100000", "--batch", "256", "--max-steps", "300"];
    let job = common::mpirun_exe(Path::new(exe()), np, &env, &args, Duration::from_secs(600));
    job.assert_ok();
    let (growths, evictions, capacity, max_bytes) = (field(&job.stdout, "table_growths"), field(&job.stdout, "table_evictions"), field(&job.stdout, "table_capacity"), field(&job.stdout, "table_max_bytes"));
    eprintln!("{np} ranks on {size}: {growths} growth(s) to {capacity} slots, {evictions} rows evicted, limit {max_bytes} bytes");
    assert!(growths >= 1 && capacity > 16384, "the table grew while there was room: {growths} growths, {capacity} slots");
    assert!(evictions > 0, "at its largest size the table evicted");
    let left: Vec<_> = std::fs::read_dir(&shm.0 .0).expect("tmpfs").flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "left in the tmpfs: {left:?}");
}

#[test]
fn a_table_on_a_small_shared_memory_directory_evicts_instead_of_failing_with_2_ranks() {
    grows_then_evicts(2, "20m");
}

#[test]
fn a_table_on_a_small_shared_memory_directory_evicts_instead_of_failing_with_4_ranks() {
    // 4 ranks' collective segments alone take about 17 MB: 40 MB leave the table as little
    // room as 20 MB leave 2 ranks.
    grows_then_evicts(4, "40m");
}

/// A FIFO named `name` in `dir`, with no writer.
fn fifo(dir: &TempDir, name: &str) -> std::path::PathBuf {
    let p = dir.path(name);
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: mkfifo with a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", p.display());
    p
}

/// `ringrec ARGS` alone (a world of one rank), killed after `secs` seconds.
fn ringrec(args: &[&str], env: &[(&str, &str)], secs: u64) -> common::Job {
    let mut cmd = Command::new(exe());
    cmd.args(args).envs(env.iter().copied());
    common::run_with_timeout(cmd, Duration::from_secs(secs))
}

/// Every command that opens an input refuses a FIFO at once, saying what it is, as `train`
/// does (before issue 36, `data prepare` on a FIFO without a writer waited for ever).
#[test]
fn every_command_that_opens_an_input_refuses_a_fifo_at_once() {
    let dir = TempDir::new("edges-fifo");
    let f = fifo(&dir, "f.tsv");
    let (fs, out, data) = (f.display().to_string(), dir.path("o.rrdata").display().to_string(), dir.path("data").display().to_string());
    let cases: [Vec<&str>; 6] = [
        vec!["data", "prepare", &fs, &out],
        vec!["data", "inspect", &fs],
        vec!["table", "import", &fs, &out],
        vec!["table", "inspect", &fs],
        vec!["train", "--no-progress", "--data", &fs, "--max-steps", "1"],
        vec!["export", "--model", &fs, "--out", &out],
    ];
    for args in cases {
        let job = ringrec(&args, &[("RINGREC_DATA_DIR", &data)], 60);
        assert!(!job.timed_out, "`ringrec {}` waited on the FIFO", args.join(" "));
        assert!(job.code.is_some_and(|c| c != 0), "`ringrec {}` must fail:\n{}", args.join(" "), job.all());
        assert!(job.stderr.contains(&fs) && job.stderr.contains("it is a FIFO, not a"), "`ringrec {}` must name the FIFO and say what it is:\n{}", args.join(" "), job.stderr);
    }
    assert!(!dir.path("o.rrdata").exists());
}

/// `data prepare` and the cache preparation under `train` say what an input that is not a
/// TSV is, and an input without rows (empty, or only empty lines) is the same error
/// naming it for both (before issue 36: "every one of its 1 line(s) is malformed (utf8 1)"
/// for a cache, "not valid UTF-8" for a gzipped TSV, and an empty file gave a 0-row cache).
/// Since issue 33 a gzip or zstd TSV is read (tests/formats.rs); a damaged one is named so,
/// and bzip2 is still refused saying how to decompress it.
#[test]
fn inputs_that_are_not_tsv_or_hold_no_rows_are_named_for_what_they_are() {
    let dir = TempDir::new("edges-not-tsv");
    let data = dir.path("data").display().to_string();
    let tsv = dir.path("s.tsv");
    ringrec::data::synth(&tsv, 300, 1).expect("synth");
    let cache = dir.path("s.rrdata");
    ringrec::data::prepare(&tsv, &cache, 0).expect("prepare");
    let bytes = std::fs::read(&tsv).unwrap();
    let gz = dir.path("s.tsv.gz");
    let mut gzip = Command::new("gzip");
    gzip.args(["-k", "-f"]).arg(&tsv);
    let have_gzip = gzip.status().is_ok_and(|s| s.success());
    let zst = dir.path("s.tsv.zst");
    std::fs::write(&zst, [&[0x28, 0xb5, 0x2f, 0xfd][..], &bytes[..64]].concat()).unwrap();
    let bz2 = dir.path("s.tsv.bz2");
    std::fs::write(&bz2, [&b"BZh9"[..], &bytes[..64]].concat()).unwrap();
    let (empty, blank) = (dir.path("empty.tsv"), dir.path("blank.tsv"));
    std::fs::write(&empty, b"").unwrap();
    std::fs::write(&blank, b"\n").unwrap();
    let cases = vec![
        (cache.clone(), "it is already a prepared dataset cache".to_string()),
        (zst.clone(), "its zstd stream is damaged at byte".to_string()),
        (bz2.clone(), "it is bzip2-compressed, and ringrec reads plain, gzip- or zstd-compressed TSV: decompress it first (bunzip2 -k".to_string()),
        (empty.clone(), "holds no rows (the file is empty)".to_string()),
        (blank.clone(), "holds no rows (its 1 line(s) are all empty)".to_string()),
    ];
    if have_gzip {
        let out = dir.path("gz.rrdata").display().to_string();
        let job = ringrec(&["data", "prepare", gz.to_str().unwrap(), &out], &[], 60);
        job.assert_ok();
        assert!(job.stdout.contains(": 300 rows, "), "a gzipped TSV is read:\n{}", job.all());
    }
    for (input, want) in &cases {
        let p = input.display().to_string();
        let out = dir.path("o.rrdata").display().to_string();
        let job = ringrec(&["data", "prepare", &p, &out], &[], 60);
        assert_eq!(job.code, Some(1), "data prepare {p}:\n{}", job.all());
        assert!(job.stderr.contains(&format!("{p}: {want}")), "data prepare {p}: expected `{p}: {want}` in:\n{}", job.stderr);
        if input == &cache {
            continue; // train takes a cache as it is
        }
        let job = ringrec(&["train", "--no-progress", "--data", &p, "--max-steps", "1"], &[("RINGREC_DATA_DIR", &data)], 60);
        assert_ne!(job.code, Some(0), "train --data {p}:\n{}", job.all());
        assert!(job.stderr.contains(&format!("{p}: {want}")), "train --data {p}: expected `{p}: {want}` in:\n{}", job.stderr);
    }
    // A cache under another name is opened as the cache it is, not parsed as a TSV.
    let renamed = dir.path("prepared.bin");
    std::fs::copy(&cache, &renamed).unwrap();
    let job = ringrec(&["train", "--no-progress", "--data", renamed.to_str().unwrap(), "--max-steps", "1", "--batch", "64"], &[("RINGREC_DATA_DIR", &data)], 120);
    job.assert_ok();
}

/// The permission bits of `p`.
fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).permissions().mode() & 0o777
}

/// The files under `dir` (recursively) whose names end in `suffix`.
fn files_ending(dir: &Path, suffix: &str) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_ending(&p, suffix));
        } else if p.to_string_lossy().ends_with(suffix) {
            out.push(p);
        }
    }
    out
}

/// No lock file outlives its preparation, a failed one included; `ringrec clean` removes
/// one a killed process left and leaves one that is held; every file ringrec writes is
/// private, 0600: the synthetic data, the caches, the metrics and progress files (before
/// issue 36 every input left an empty `.lock`, and these outputs were 0644).
#[test]
fn lock_files_go_with_their_use_and_every_file_written_is_private() {
    let dir = TempDir::new("edges-locks");
    let data = dir.path("data");
    let d = data.display().to_string();
    let env = [("RINGREC_DATA_DIR", d.as_str())];
    let tsv = dir.path("day.tsv");
    let job = ringrec(&["data", "synth", "--rows", "2000", "--out", tsv.to_str().unwrap()], &[], 60);
    job.assert_ok();
    assert_eq!(mode(&tsv), 0o600, "data synth's TSV");
    let (metrics, progress) = (dir.path("metrics.jsonl"), dir.path("progress"));
    let args = ["train", "--no-progress", "--data", tsv.to_str().unwrap(), "--batch", "128", "--max-steps", "4", "--eval-every", "2", "--metrics-out", metrics.to_str().unwrap(), "--progress-dir", progress.to_str().unwrap()];
    ringrec(&args, &env, 120).assert_ok();
    // The default data set is generated under a lock too.
    ringrec(&["train", "--no-progress", "--synth-rows", "1000", "--batch", "128", "--max-steps", "2"], &env, 120).assert_ok();
    // A preparation that fails.
    let empty = dir.path("empty.tsv");
    std::fs::write(&empty, b"").unwrap();
    assert_ne!(ringrec(&["train", "--no-progress", "--data", empty.to_str().unwrap()], &env, 60).code, Some(0));
    assert_eq!(files_ending(&data, ".lock"), Vec::<std::path::PathBuf>::new(), "lock files left");
    let caches = files_ending(&data, ".rrdata");
    assert!(!caches.is_empty());
    let progress_files = files_ending(&progress, "");
    assert!(!progress_files.is_empty(), "--progress-dir wrote nothing");
    for p in caches.iter().chain(&progress_files).chain([&metrics, &data.join("synth-1000-s1.tsv")]) {
        assert_eq!(mode(p), 0o600, "{} must be private", p.display());
    }
    // A lock file a killed preparation left is removed by `ringrec clean`; a held one stays.
    let cache = data.join("cache");
    let (stale, held) = (cache.join("day.0123456789abcdef.lock"), cache.join("other.0123456789abcdef.lock"));
    std::fs::write(&stale, b"").unwrap();
    let lock = ringrec::fileio::FileLock::exclusive(&held).expect("lock");
    let shm = dir.path("shm");
    std::fs::create_dir_all(&shm).unwrap();
    let job = ringrec(&["clean", "--shm-dir", shm.to_str().unwrap(), &d], &[], 60);
    job.assert_ok();
    assert!(job.stdout.contains(&format!("removed {}", stale.display())), "{}", job.stdout);
    assert!(!stale.exists() && held.exists(), "the stale lock file goes, the held one stays:\n{}", job.stdout);
    drop(lock);
    assert!(!held.exists());
}

/// The JSON object printed last on stdout.
fn json(job: &common::Job) -> serde_json::Value {
    job.stdout.lines().rev().find_map(|l| serde_json::from_str(l).ok()).unwrap_or_else(|| panic!("no JSON in:\n{}", job.all()))
}

/// A checkpoint directory whose newest checkpoint is damaged: `export` refuses it unless
/// told `--allow-older`; `predict` and `train --init-from` refuse it with
/// `--require-newest`; each records the step and checkpoint it used and what it skipped
/// (JSON, the bundle's model.json, the train summary); `--resume` keeps its fallback and
/// names the damaged table once (before issue 36 all four fell back with a warning on
/// stderr only, and the resume warning named the table twice).
#[test]
fn an_older_checkpoint_is_used_only_when_allowed_and_always_recorded() {
    let dir = TempDir::new("edges-older");
    let data = dir.path("data").display().to_string();
    let env = [("RINGREC_DATA_DIR", data.as_str())];
    let tsv = dir.path("day.tsv");
    ringrec::data::synth(&tsv, 3000, 5).expect("synth");
    let (t, ck) = (tsv.display().to_string(), dir.path("ck"));
    let c = ck.display().to_string();
    let base = ["train", "--no-progress", "--data", &t, "--batch", "128", "--hidden", "32"];
    ringrec(&[&base[..], &["--max-steps", "6", "--checkpoint-every", "3", "--checkpoint-dir", &c]].concat(), &env, 180).assert_ok();
    let (older, newest) = (ringrec::train::checkpoint::step_dir(&ck, 3), ringrec::train::checkpoint::step_dir(&ck, 6));
    let table = newest.join("table.rrt");
    let mut b = std::fs::read(&table).unwrap();
    let at = b.len() / 2;
    b[at] ^= 0x10;
    std::fs::write(&table, &b).unwrap();
    let newest_name = newest.file_name().unwrap().to_string_lossy().into_owned();
    let refused = |job: &common::Job, allow: &str| {
        assert_eq!(job.code, Some(1), "{}", job.all());
        let want = format!("{c}: its newest checkpoint is damaged (skipping {}", newest.display());
        assert!(job.stderr.contains(&want) && job.stderr.contains("refusing to use the older checkpoint of step 3 instead") && job.stderr.contains(allow), "expected `{want}` and `{allow}` in:\n{}", job.stderr);
    };
    let skipped_newest = |v: &serde_json::Value| {
        let s = v.as_array().unwrap_or_else(|| panic!("skipped: {v}"));
        assert!(s.len() == 1 && s[0].as_str().unwrap().contains(&newest_name), "skipped: {v}");
    };
    // export: refuses by default; --allow-older exports step 3 and says so.
    let bundle = dir.path("bundle").display().to_string();
    refused(&ringrec(&["export", "--model", &c, "--out", &bundle, "--json"], &[], 60), "pass --allow-older");
    assert!(!Path::new(&bundle).exists());
    let job = ringrec(&["export", "--model", &c, "--out", &bundle, "--json", "--allow-older"], &[], 60);
    job.assert_ok();
    let s = json(&job);
    assert_eq!((s["step"].as_u64(), s["source"].as_str()), (Some(3), Some(older.to_str().unwrap())), "{s}");
    skipped_newest(&s["skipped"]);
    let model: serde_json::Value = serde_json::from_slice(&std::fs::read(Path::new(&bundle).join("model.json")).unwrap()).unwrap();
    assert_eq!((model["step"].as_u64(), model["source"].as_str()), (Some(3), Some(older.to_str().unwrap())));
    skipped_newest(&model["skipped"]);
    // predict: refuses with --require-newest; otherwise scores with step 3 and says so.
    let scores = dir.path("scores.tsv");
    refused(&ringrec(&["predict", "--model", &c, "--data", &t, "--require-newest"], &env, 120), "leave out --require-newest");
    let job = ringrec(&["predict", "--model", &c, "--data", &t, "--json", "--out", scores.to_str().unwrap()], &env, 120);
    job.assert_ok();
    let s = json(&job);
    assert_eq!((s["step"].as_u64(), s["model_path"].as_str()), (Some(3), Some(older.to_str().unwrap())), "{s}");
    skipped_newest(&s["skipped"]);
    assert_eq!(mode(&scores), 0o600, "predict --out is private like every file ringrec writes");
    // train --init-from: the same.
    let warm = [&base[..], &["--max-steps", "2", "--init-from", &c, "--json"]].concat();
    refused(&ringrec(&[&warm[..], &["--require-newest"]].concat(), &env, 120), "leave out --require-newest");
    let job = ringrec(&warm, &env, 120);
    job.assert_ok();
    let s = json(&job);
    assert_eq!((s["init_from"]["step"].as_u64(), s["init_from"]["path"].as_str()), (Some(3), Some(older.to_str().unwrap())), "{s}");
    skipped_newest(&s["init_from"]["skipped"]);
    // --resume falls back as before, naming the damaged table once.
    let job = ringrec(&[&base[..], &["--max-steps", "6", "--checkpoint-every", "3", "--checkpoint-dir", &c, "--resume"]].concat(), &env, 180);
    job.assert_ok();
    let line = job.stderr.lines().find(|l| l.contains("warning: skipping")).unwrap_or_else(|| panic!("no warning:\n{}", job.stderr));
    assert_eq!(line.matches(&table.display().to_string()).count(), 1, "the table's path once: {line}");
    assert!(job.stderr.contains("step-000000000003 (step 3)"), "{}", job.stderr);
}
