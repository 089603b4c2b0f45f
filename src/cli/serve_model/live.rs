//! The model being served and its replacement (`--watch`).
//!
//! [`Live`] holds the current model as an `Arc`. A scoring batch takes a clone of it when
//! it starts and scores every row with that model, so a swap never changes an answer in
//! flight; the old model is dropped (its table unmapped) when its last batch ends.
//! [`watch`] polls the model's path every few seconds; when what it would resolve to may
//! have changed (a new `LATEST` in a checkpoint directory, a bundle replaced) it loads the
//! new model fully, checksums included, on its own thread, and swaps it in only when that
//! succeeded: a failed load keeps the old model and is logged and counted.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use ringrec::data::Transform;
use ringrec::train::scorer::Scorer;
use ringrec::train::source::Fallback;

use super::metrics::Metrics;

/// A loaded model and what the answers and metrics say of it.
pub struct Loaded {
    /// The model (one batch scores at a time).
    pub scorer: Mutex<Scorer>,
    /// 1 for the model loaded at start, +1 per swap.
    pub version: u64,
    /// The step it was trained to.
    pub step: Option<u64>,
    /// What was loaded (the checkpoint `D/step-N`, the bundle).
    pub path: PathBuf,
    /// When it was loaded.
    pub loaded_at: SystemTime,
    /// What it is, in words (`checkpoint of step 40 (...)`).
    pub describe: String,
    /// Rows of its table.
    pub table_rows: u64,
    /// The rows it takes (what a request is parsed into).
    pub fields: ringrec::data::Fields,
    /// Its multi-hot fields by name, in order (a request's `lists`).
    pub lists: Vec<String>,
    /// Its dense features' transforms where its schema chose them, by slot.
    pub dense_transforms: Vec<Option<Transform>>,
}

/// How to load a model.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// `--model`.
    pub model: PathBuf,
    /// `--require-newest`.
    pub fallback: Fallback,
    /// Where a bundle's table is imported (`RINGREC_SHM_DIR`).
    pub shm_dir: PathBuf,
    /// Scoring threads.
    pub threads: usize,
}

impl LoadOptions {
    /// Loads the model, numbered `version`.
    pub fn load(&self, version: u64) -> anyhow::Result<Loaded> {
        let scorer = Scorer::open(&self.model, self.fallback, &self.shm_dir, self.threads)?;
        scorer.source.warn_skipped();
        let lists = scorer.multi_hot_fields().into_iter().map(|(name, _)| name).collect();
        Ok(Loaded { lists, dense_transforms: scorer.dense_transforms(), describe: scorer.source.describe(), table_rows: scorer.table_rows(), fields: scorer.fields(), step: scorer.source.step, path: scorer.source.path.clone(), version, loaded_at: SystemTime::now(), scorer: Mutex::new(scorer) })
    }
}

/// The current model.
pub struct Live {
    current: RwLock<Arc<Loaded>>,
}

impl Live {
    /// Serves `first`.
    pub fn new(first: Loaded) -> Live {
        Live { current: RwLock::new(Arc::new(first)) }
    }
    /// The model a batch starting now scores with.
    pub fn current(&self) -> Arc<Loaded> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
    fn swap(&self, next: Loaded) -> Arc<Loaded> {
        std::mem::replace(&mut *self.current.write().unwrap_or_else(|e| e.into_inner()), Arc::new(next))
    }
}

/// What tells one state of a model path from another: the identity and modification time
/// of the path, of its `LATEST` (a checkpoint directory) and of its `model.json` (a
/// bundle).
pub fn stamp(path: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let one = |p: &Path| std::fs::metadata(p).map(|m| format!("{}:{}.{}:{}", m.ino(), m.mtime(), m.mtime_nsec(), m.len())).unwrap_or_default();
    let latest = std::fs::read_to_string(path.join(ringrec::train::checkpoint::LATEST)).unwrap_or_default();
    format!("{} {} {} {}", one(path), one(&path.join(ringrec::train::checkpoint::LATEST)), latest.trim(), one(&path.join(ringrec::train::bundle::MODEL_JSON)))
}

/// Polls `opts.model` every `every` and swaps in a newer model (see the module docs); runs
/// until the process ends.
pub fn watch(live: Arc<Live>, opts: LoadOptions, every: Duration, metrics: Arc<Metrics>) {
    let mut seen = stamp(&opts.model);
    loop {
        std::thread::sleep(every);
        let now = stamp(&opts.model);
        if now == seen {
            continue;
        }
        seen = now;
        let cur = live.current();
        match opts.load(cur.version + 1) {
            Ok(next) if next.path == cur.path && next.step == cur.step => {}
            Ok(next) => {
                let msg = format!("ringrec serve-model: swapped to model version {} (step {}, {}); version {} finishes its requests in flight", next.version, next.step.map_or("-".into(), |s| s.to_string()), next.path.display(), cur.version);
                metrics.model_loaded(&next);
                drop(live.swap(next));
                metrics.swaps.inc();
                ringrec::eprint_line(&msg);
            }
            Err(e) => {
                metrics.swap_failures.inc();
                ringrec::eprint_line(&format!("ringrec serve-model: warning: loading the new model in {} failed, still serving version {}: {e:#}", opts.model.display(), cur.version));
            }
        }
    }
}
