//! The GPU hot-row cache's comparison runs on the generated multi-hot set, shared by
//! tests/cache_multihot.rs and tests/cache_tables.rs: `ringrec train` without a cache and
//! with it in each asked mode (and under random queue delays), every run compared with the
//! uncached one (`params_fnv` and every checkpoint's table files).
#![allow(dead_code)]

use std::path::PathBuf;

use crate::common::CheckpointedRun as Run;
use ringrec::data::multihot::synth_multi_hot_cut;

/// Every column of the multi-hot set read as categorical (as tests/multihot.rs reads it).
pub const SPARSE: &str = "c0,c1,c2,c3,c4,c5,c6,c7,c8,c9,l0,l1,l2,l3,l4,l5";

/// A cache of 0.1 MiB, its keys chosen every 3 steps: far fewer slots than the ids a step
/// sees (about 12,000), so keys enter and leave at every refresh.
pub const CACHE: [&str; 4] = ["--gpu-cache-mib", "0.1", "--gpu-cache-refresh", "3"];

/// One test file's runs: its scratch prefix, the flags every run takes (ending with
/// `--device`, whose value each run adds) and the ways a run can go (the first: no cache).
pub struct CacheRuns {
    pub prefix: &'static str,
    pub flags: &'static [&'static str],
    pub modes: Vec<(&'static str, Vec<&'static str>)>,
}

impl CacheRuns {
    /// The multi-hot set (3000 rows), written once per test binary (which holds one
    /// `CacheRuns`), and the directory of its prepared cache.
    pub fn data(&self) -> &'static (PathBuf, PathBuf) {
        static DATA: std::sync::OnceLock<(PathBuf, PathBuf)> = std::sync::OnceLock::new();
        DATA.get_or_init(|| {
            let d = crate::common::shared_scratch(&format!("{}-data", self.prefix));
            let whole = d.join("whole.parquet");
            synth_multi_hot_cut(&whole, 3000, 7, None).unwrap();
            (whole, d.join("prepared"))
        })
    }

    /// The arguments of `ringrec train` on the set with `extra`, checkpoints in `dir`.
    pub fn args(&self, dir: &std::path::Path, device: &str, extra: &[&str]) -> Vec<String> {
        let (whole, prepared) = self.data();
        let (w, p, d) = (whole.to_str().unwrap(), prepared.to_str().unwrap(), dir.to_str().unwrap());
        let args = [&["train", "--data", w, "--sparse-columns", SPARSE, "--data-dir", p, "--checkpoint-dir", d][..], self.flags, &[device][..], extra].concat();
        crate::common::small_table(&args).into_iter().map(String::from).collect()
    }

    /// `ringrec train` on the set at `np` ranks on `device` with `extra` flags.
    pub fn run(&self, what: &str, np: usize, env: &[(&str, &str)], device: &str, extra: &[&str]) -> Run {
        let dir = crate::common::scratch(&format!("{}-{what}", self.prefix));
        let args = self.args(&dir, device, extra);
        Run::of(&crate::common::mpirun(np, env, &args.iter().map(String::as_str).collect::<Vec<_>>()), &dir)
    }

    /// Runs `extra` without a cache and with it in each of `modes` (indices into
    /// `self.modes`; the last of them also under each of `seeds`' random delays) on
    /// `device`; asserts they all end as the run without a cache did. Returns the last
    /// cached run.
    #[allow(clippy::too_many_arguments)] // run()'s own five, the modes and the seeds
    pub fn compare(&self, what: &str, np: usize, env: &[(&str, &str)], device: &str, extra: &[&str], modes: &[usize], seeds: &[&str]) -> Run {
        let all = &self.modes;
        let off = self.run(&format!("{what}-off"), np, env, device, &[extra, &all[0].1[..]].concat());
        assert_eq!(off.summary["gpu_cache"]["slots"], 0, "{what}");
        let mut last = None;
        for m in modes {
            let (tag, cache) = &all[*m];
            let on = self.run(&format!("{what}-{tag}"), np, env, device, &[extra, &cache[..]].concat());
            let g = &on.summary["gpu_cache"];
            assert!(g["hit_rate"].as_f64().unwrap() > 0.05, "{what} {tag}: the cache found nothing: {g}");
            assert!(g["rows_refreshed"].as_u64().unwrap() > g["slots"].as_u64().unwrap(), "{what} {tag}: keys did not enter and leave: {g}");
            assert!(on.stderr.contains("GPU hot-row cache:"), "{what} {tag}: the run does not state its cache:\n{}", on.stderr);
            off.assert_same(&format!("{what}: {tag}"), &on);
            last = Some((tag, cache.clone(), on));
        }
        let (tag, cache, on) = last.expect("a cached mode");
        for seed in seeds {
            let delayed_env = [env, &[("RINGREC_HOST_DELAY_SEED", *seed)]].concat();
            let delayed = self.run(&format!("{what}-{tag}-seed{seed}"), np, &delayed_env, device, &[extra, &cache[..]].concat());
            assert!(delayed.summary["device"].as_str().unwrap().contains("random delays"), "{}", delayed.summary);
            off.assert_same(&format!("{what}: {tag}, delay seed {seed}"), &delayed);
            assert_eq!(delayed.summary["table_rows_crc_per_host"], on.summary["table_rows_crc_per_host"], "{what}: {tag}, delay seed {seed}: the table rows");
        }
        on
    }
}
