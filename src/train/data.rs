//! The data of a run: the training files (the `--data` inputs in order, or the synthetic
//! default set, generated once per machine under a lock), their mapped caches, and the
//! held-out rows (the last `--test-fraction` of a single file, or the `--eval-data` files).
//!
//! **One epoch is a pass over the training files in order**, as if they were one file:
//! global batch t holds positions `[t B, (t + 1) B)` of the concatenation of their rows, so
//! a batch may end in one file and go on in the next (three day files train exactly like
//! their concatenation). `--shuffle` permutes the rows *within* each file
//! ([`shard::epoch_order`], seeded by the seed and the file's position; the first file
//! keeps the seed itself, so a single file shuffles as it always did), never across files:
//! day order is kept.
//!
//! **Files are opened as training reaches them.** The first before the first step (every
//! rank; the cache prepared once per host under the file lock); file k + 1 when the batch
//! about to be trained (and one row more: whether a row follows it) reaches it, every rank
//! then agreeing that it opened it and on its row count. Meanwhile each host leader's
//! background thread prepares the next file's cache (and the `--eval-data` files'), so a file is usually ready when it is reached; a rank that reaches it
//! first waits on the cache's lock. The number of steps of an epoch is known once the
//! last file is open (the progress shows an estimate until then).
//!
//! **Memory does not grow with the number of files**: caches are mapped (file-backed
//! pages), opening one verifies it window by window and hands the pages back, and a file's
//! pages are handed back once the batches have moved past it ([`Dataset::release_pages`]).
//!
//! Temporaries that a killed run left in the data and cache directories are removed first
//! ([`crate::stale::sweep_temporaries`]).

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::batch::Batch;
use super::weights::{BatchWeights, Weighting};
use super::{TrainConfig, TrainError, TrainResult};
use crate::data::cache::{lock_preparation, Dataset, CACHE_EXT};
use crate::data::weights::FileWeights;
use crate::data::{inputs, shard, synth, ColumnSpec, DataError, EvalSet, PrepareOptions};
use crate::hash::splitmix64;
use crate::topology::Topology;

/// One training file.
struct TrainFile {
    /// The file given (a TSV or a cache).
    path: PathBuf,
    /// Its mapped cache, once opened.
    ds: Option<Arc<Dataset>>,
    /// Its training rows (`0..rows` of the cache), once opened.
    rows: usize,
    /// The order of its rows in one epoch: `(epoch, order)`.
    order: Option<(u64, Vec<u32>)>,
    /// Whether batches read its pages since they were last handed back.
    touched: bool,
    /// Its kept rows and their weights, in a weighted run ([`super::weights`]): positions
    /// `0..rows` then name `kept[p]`.
    weights: Option<FileWeights>,
}

/// The held-out rows.
enum HeldOut {
    /// Opened: the last rows of the single training file, or the `--eval-data` files.
    Open(EvalSet),
    /// `--eval-data` files, opened at the first evaluation.
    Files(Vec<PathBuf>),
}

/// A run's data (see the module docs).
pub struct TrainData {
    files: Vec<TrainFile>,
    held_out: HeldOut,
    /// Where TSVs' caches are prepared.
    cache_dir: PathBuf,
    /// How a file reached before its cache is ready is prepared (every core).
    prepare: PrepareOptions,
    /// The host leader's background preparation.
    preparer: Option<Preparer>,
    /// Rank 0 says when training reaches each later file.
    report: bool,
    /// The files' weighting (`None`: every row weighs 1 and trains).
    weighting: Option<Weighting>,
    /// Whether the first file is split into training and held-out rows (then weighed
    /// after the split).
    split_first: bool,
    /// The nulls of each column of the Parquet inputs.
    column_nulls: Vec<ColumnNulls>,
}

/// A run's inputs resolved: the training files, the held-out files, how they are prepared
/// and the nulls of their Parquet columns.
type Resolved = (Vec<PathBuf>, Vec<PathBuf>, PrepareOptions, Vec<ColumnNulls>);

/// The nulls of one column of a run's Parquet inputs (the summary's `column_nulls`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ColumnNulls {
    /// The column.
    pub column: String,
    /// Its nulls over every Parquet input (`None`: a file's statistics do not count them).
    pub nulls: Option<u64>,
}

/// The nulls of each column the Parquet files among `files` read, summed over them, from
/// their footers' statistics (see [`crate::data::parquet_file::null_counts`]).
fn column_nulls(files: &[PathBuf], spec: &ColumnSpec) -> Result<Vec<ColumnNulls>, DataError> {
    let mut all: Vec<ColumnNulls> = Vec::new();
    for path in files.iter().filter(|p| crate::data::parquet_file::is_parquet(p)) {
        for (column, n) in crate::data::parquet_file::null_counts(path, spec)? {
            match all.iter_mut().find(|c| c.column == column) {
                Some(c) => c.nulls = c.nulls.zip(n).map(|(a, b)| a + b),
                None => all.push(ColumnNulls { column, nulls: n }),
            }
        }
    }
    Ok(all)
}

/// The synthetic default set under `dir`, generated on first use (under a lock, so the
/// ranks of a machine generate it once).
fn default_set(dir: &Path, rows: u64) -> Result<PathBuf, DataError> {
    let p = dir.join(format!("synth-{rows}-s1.tsv"));
    let _lock = lock_preparation(&dir.join("synth.lock"))?;
    if !p.exists() {
        synth(&p, rows, 1)?; // written atomically
    }
    Ok(p)
}

/// Whether `path` is a prepared cache (opened as it is) rather than a TSV: named `.rrdata`,
/// or starting with a cache's magic.
fn is_cache(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 8];
    path.extension().and_then(|e| e.to_str()) == Some(CACHE_EXT)
        || crate::fileio::open_input(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok_and(|_| magic == crate::data::cache::FORMAT.magic)
}

/// Opens the cache of `path`: the file itself when it is a cache, else the TSV's cache
/// under `cache_dir`, prepared first when needed (under its lock: once per host). A cache
/// given as it is must have been prepared with the run's `--weight-column` (or without,
/// both): its weights would otherwise be ignored, or missing.
pub(crate) fn open_one(path: &Path, cache_dir: &Path, opts: &PrepareOptions) -> Result<Dataset, DataError> {
    if !is_cache(path) {
        return Dataset::from_tsv_cached_with(path, cache_dir, opts);
    }
    let ds = Dataset::open(path)?;
    let (have, want) = (ds.header().weight_column, opts.weights_field());
    if have != want {
        let column = |c: Option<u32>| match c {
            None => "no weight column".to_string(),
            Some(crate::data::prepare::NAMED_WEIGHT_COLUMN) => "a Parquet file's weight column".to_string(),
            Some(c) => format!("--weight-column {c}"),
        };
        return Err(DataError::InvalidArgument(format!(
            "{} was prepared with {} and this run reads its data with {}: give the same --weight-column as `ringrec data prepare` had, or prepare the TSV again",
            path.display(),
            column(have),
            column(want)
        )));
    }
    Ok(ds)
}

/// The `--data` (or `--eval-data`) setting the ranks compare: each file the inputs stand
/// for with its identity ([`crate::data::identity`]), or why they stand for none.
pub fn describe_inputs(flag: &'static str, specs: &[PathBuf]) -> String {
    match inputs::resolve(flag, specs) {
        Ok(files) => files.iter().map(|p| format!("{} ({})", p.display(), crate::data::identity(p))).collect::<Vec<_>>().join("; "),
        Err(e) => format!("({e})"),
    }
}

/// Opens the data of `cfg` on every rank (collective): resolves the inputs, opens the
/// first training file (leaders prepare its cache first, under a file lock: one parse per
/// host), splits it when it is the only one, and starts the host leader's background
/// preparation of the others. Every rank learns whether all succeeded.
pub fn open(topo: &Topology, cfg: &TrainConfig) -> TrainResult<TrainData> {
    let dir = &cfg.data_dir;
    // Temporaries of a killed run's data generation or cache preparation, once per machine.
    if topo.machine_local_rank == 0 {
        for d in [dir.clone(), dir.join("cache")] {
            crate::stale::report(&d, &crate::stale::sweep_temporaries(&d));
        }
    }
    let resolved = (|| -> Result<Resolved, DataError> {
        std::fs::create_dir_all(dir).map_err(|e| DataError::io(dir, "create the data directory", e))?;
        let files = if cfg.data.is_empty() { vec![default_set(dir, cfg.synth_rows)?] } else { inputs::resolve("--data", &cfg.data)? };
        let eval = inputs::resolve("--eval-data", &cfg.eval_data)?;
        let all: Vec<PathBuf> = files.iter().chain(&eval).cloned().collect();
        let prepare = prepare_options(cfg)?;
        crate::data::parquet_file::check_same_schema(&all, &prepare.columns)?;
        let nulls = column_nulls(&all, &prepare.columns)?;
        if files.len() > 1 && cfg.test_fraction.is_some() {
            return Err(DataError::InvalidArgument(format!(
                "--test-fraction holds out the last rows of a single --data file, and --data names {} files; hold a file out with --eval-data instead",
                files.len()
            )));
        }
        Ok((files, eval, prepare, nulls))
    })();
    let (files, eval, prepare, column_nulls) = topo.agree(resolved.map_err(|e| e.to_string()))?;
    let weighting = topo.agree(Weighting::new(&cfg.weight_config(), &files).map_err(|e| e.to_string()))?;
    let split_first = files.len() == 1 && eval.is_empty();
    let threads = cfg.threads_per_rank(topo);
    let mut data = TrainData {
        files: files.into_iter().map(|path| TrainFile { path, ds: None, rows: 0, order: None, touched: false, weights: None }).collect(),
        held_out: HeldOut::Files(eval),
        cache_dir: dir.join("cache"),
        prepare,
        preparer: None,
        report: topo.rank == 0,
        weighting,
        split_first,
        column_nulls,
    };
    let later: Vec<PathBuf> = data.files[1..].iter().map(|f| f.path.clone()).chain(data.eval_files().iter().cloned()).filter(|p| !is_cache(p)).collect();
    if topo.local_rank == 0 && !later.is_empty() {
        // The leader's background preparation: one rank's share of the cores.
        data.preparer = Some(Preparer::start(data.cache_dir.clone(), data.prepare.clone().threads(threads)));
    }
    data.open_file(topo, 0, 0)?;
    if data.files.len() == 1 && data.eval_files().is_empty() {
        let f = &mut data.files[0];
        let ds = f.ds.clone().ok_or_else(|| TrainError::Config("the data file is not open".into()))?;
        let (train, test) = shard::split(ds.len(), cfg.test_fraction())?;
        if train.is_empty() {
            return Err(TrainError::Config(format!("{}: no training rows (the data set has {} rows, --test-fraction {})", f.path.display(), ds.len(), cfg.test_fraction())));
        }
        f.rows = train.len();
        let mut set = EvalSet::new();
        set.push(ds, test)?;
        data.held_out = HeldOut::Open(set);
        data.weigh(0);
    }
    // Then the held-out files, ready for the first evaluation.
    for p in data.eval_files().to_vec() {
        data.request(&p);
    }
    Ok(data)
}

impl TrainData {
    /// The `--eval-data` files not opened yet.
    fn eval_files(&self) -> &[PathBuf] {
        match &self.held_out {
            HeldOut::Files(f) => f,
            HeldOut::Open(_) => &[],
        }
    }

    /// Asks the background preparation for the cache of `path` (a TSV; leaders only).
    fn request(&mut self, path: &Path) {
        if let (Some(p), false) = (&mut self.preparer, is_cache(path)) {
            p.request(path);
        }
    }

    /// Opens training file `i` on every rank (collective), reached at global step `step`.
    fn open_file(&mut self, topo: &Topology, i: usize, step: u64) -> TrainResult<()> {
        let n = self.files.len();
        let path = self.files[i].path.clone();
        let ahead = self.preparer.as_ref().and_then(|p| p.prepared(&path));
        let t = Instant::now();
        let ds = topo.agree(open_one(&path, &self.cache_dir, &self.prepare).map_err(|e| e.to_string()))?;
        let waited = t.elapsed().as_secs_f64();
        // By position, not path: the default set's path follows --data-dir, which may differ.
        let key = format!("rows of --data file {} of {n} (after skipping malformed lines)", i + 1);
        topo.agree_settings(&[(key.as_str(), ds.len().to_string())])?;
        if self.report && ds.header().bad_lines > 0 {
            crate::eprint_line(&format!(
                "ringrec: {}: {} malformed line(s) were skipped when the cache was prepared (run `ringrec data prepare {} OUT` to list them; --max-bad-lines {} stops beyond that)",
                path.display(),
                ds.header().bad_lines,
                path.display(),
                self.prepare.max_bad_lines
            ));
        }
        if self.report && i > 0 {
            let how = match ahead {
                Some(s) => format!("its cache was prepared in the background ({s:.2}s) before it was needed; opened in {waited:.2}s"),
                None if is_cache(&path) => format!("opened in {waited:.2}s"),
                None => format!("waited {waited:.2}s for its cache"),
            };
            crate::eprint_line(&format!("ringrec: step {step}: training reaches {} (file {} of {n}, {} rows); {how}", path.display(), i + 1, ds.len()));
        }
        let f = &mut self.files[i];
        f.rows = ds.len();
        f.ds = Some(Arc::new(ds));
        if !(self.split_first && i == 0) {
            self.weigh(i);
        }
        // The next file is prepared while this one trains.
        if let Some(next) = self.files.get(i + 1).map(|f| f.path.clone()) {
            self.request(&next);
        }
        Ok(())
    }

    /// Weighs training file `i` (open, its training rows final): keeps its merged,
    /// heavy-enough rows. Nothing in an unweighted run.
    fn weigh(&mut self, i: usize) {
        let (Some(w), f) = (self.weighting.as_mut(), &mut self.files[i]) else { return };
        if let Some(ds) = &f.ds {
            let fw = w.weigh(i, ds, f.rows);
            f.rows = fw.kept.len();
            f.weights = Some(fw);
        }
    }

    /// Whether the rows carry weights ([`TrainData::load`] then returns them).
    pub fn weighted(&self) -> bool {
        self.weighting.is_some()
    }

    /// The nulls of each column of the Parquet inputs (empty without any).
    pub fn column_nulls(&self) -> &[ColumnNulls] {
        &self.column_nulls
    }

    /// Rows merged and rows dropped by weight over the files opened so far (0, 0 in an
    /// unweighted run).
    pub fn weight_counts(&self) -> (u64, u64) {
        self.weighting.as_ref().map_or((0, 0), |w| (w.merged, w.dropped))
    }

    /// Files opened so far (a prefix of the list).
    fn opened(&self) -> usize {
        self.files.iter().take_while(|f| f.ds.is_some()).count()
    }

    /// Opens files in order (collective) until their training rows number at least `rows`
    /// or every file is open; `step` is the global step that needs them. After that,
    /// positions `0..rows` of the epoch are known, or all of them are.
    pub fn reach(&mut self, topo: &Topology, rows: usize, step: u64) -> TrainResult<()> {
        while self.train_rows() < rows {
            let i = self.opened();
            if i == self.files.len() {
                break;
            }
            self.open_file(topo, i, step)?;
        }
        if self.opened() == self.files.len() && self.train_rows() == 0 {
            let dropped = self.weight_counts().1;
            let why = if dropped > 0 { format!(" ({dropped} rows weigh less than --min-sample-weight: lower it, or use a larger --decay-base)") } else { String::new() };
            return Err(TrainError::Config(format!("no training rows: the {} --data file(s) hold none{why}", self.files.len())));
        }
        Ok(())
    }

    /// Training rows of the files opened so far (all of them once every file is open).
    pub fn train_rows(&self) -> usize {
        self.files.iter().map(|f| f.rows).sum()
    }

    /// Global batches of `batch` rows in an epoch, once every file is open.
    pub fn steps_per_epoch(&self, batch: usize) -> Option<u64> {
        (self.opened() == self.files.len()).then(|| shard::steps_per_epoch(self.train_rows(), batch) as u64)
    }

    /// Training rows of an epoch: exact once every file is open, else estimated from the
    /// sizes of the files not opened yet at the rows per byte of those that are.
    pub fn estimated_rows(&self) -> usize {
        let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len()) as f64;
        let (mut rows, mut bytes, mut unknown) = (0f64, 0f64, 0f64);
        for f in &self.files {
            match f.ds {
                Some(_) => {
                    rows += f.rows as f64;
                    bytes += size(&f.path);
                }
                None => unknown += size(&f.path),
            }
        }
        (rows + unknown * rows / bytes.max(1.0)) as usize
    }

    /// The training files, in order.
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(|f| f.path.as_path())
    }

    /// The most list ids `rows` rows of one training file hold ([`Dataset::most_ids`]), over
    /// every `--data` file whose cache is there: the open ones', and the others' read
    /// cheaply ([`Dataset::prepared_most_ids`]); a file whose cache is not prepared yet is
    /// not counted (its lists are known only once it is parsed). On this rank: the ranks
    /// take the largest ([`super::embedding::host_step_keys`]).
    pub fn most_ids(&self, rows: usize) -> u64 {
        let of = |f: &TrainFile| match &f.ds {
            Some(ds) => Some(ds.most_ids(rows)),
            None => Dataset::prepared_most_ids(&f.path, is_cache(&f.path), &self.cache_dir, &self.prepare, rows),
        };
        self.files.iter().filter_map(of).max().unwrap_or(0)
    }

    /// The first training file's cache and training rows (`bench step` reads it alone).
    pub fn first(&self) -> TrainResult<(&Dataset, usize)> {
        let f = &self.files[0];
        f.ds.as_deref().map(|ds| (ds, f.rows)).ok_or_else(|| TrainError::Config("the first data file is not open".into()))
    }

    /// What pins the training data for a resume: each file's identity, in order (for one
    /// file, its identity alone, as checkpoints have always recorded it).
    pub fn identity(&self) -> String {
        self.files.iter().map(|f| crate::data::identity(&f.path)).collect::<Vec<_>>().join("; ")
    }

    /// Loads into `batch` this rank's `mine` of the global batch `global` (positions in
    /// epoch `epoch`'s concatenation of the training files, already [`TrainData::reach`]ed):
    /// [`TrainData::plan`], then [`BatchPlan::read`]. A weighted run gets the batch's
    /// weights: this rank's samples' and the global batch's sum.
    pub fn load(&mut self, batch: &mut Batch, epoch: u64, global: Range<usize>, mine: Range<usize>, shuffle_seed: Option<u64>) -> TrainResult<Option<BatchWeights>> {
        let mut plan = self.plan(epoch, global, mine, shuffle_seed)?;
        plan.read(batch)?;
        Ok(plan.weights.take())
    }

    /// What loading this rank's `mine` of the global batch `global` reads (see
    /// [`TrainData::load`]), planned without reading it: each position is a row of a file
    /// through that file's order for the epoch (shuffled with `shuffle_seed`), and in a
    /// weighted run through the file's kept rows. Files the global batch does not touch
    /// hand their pages back. The plan owns what it reads, so another thread may read it
    /// ([`super::prefetch`]).
    pub fn plan(&mut self, epoch: u64, global: Range<usize>, mine: Range<usize>, shuffle_seed: Option<u64>) -> TrainResult<BatchPlan> {
        let mut start = 0;
        let mut pieces: Vec<(usize, Range<usize>)> = Vec::with_capacity(2);
        let mut globals: Vec<(usize, Range<usize>)> = Vec::with_capacity(2);
        for (i, f) in self.files.iter_mut().enumerate() {
            let end = start + f.rows;
            let in_global = global.start < end && start < global.end;
            if !in_global && f.touched {
                if let Some(ds) = &f.ds {
                    ds.release_pages();
                }
                f.touched = false;
                f.order = None;
            }
            if in_global {
                f.touched = true;
                if f.order.as_ref().map(|o| o.0) != Some(epoch) {
                    f.order = Some((epoch, shard::epoch_order(f.rows, epoch, shuffle_seed.map(|s| file_seed(s, i)))?));
                }
                globals.push((i, global.start.max(start) - start..global.end.min(end) - start));
            }
            let (a, b) = (mine.start.max(start), mine.end.min(end));
            if a < b {
                pieces.push((i, a - start..b - start));
            }
            start = end;
        }
        let files = &self.files;
        let missing = || TrainError::Config("a batch reaches a data file that is not open".into());
        let mut plan = BatchPlan { pieces: Vec::with_capacity(pieces.len()), weights: self.weighting.as_ref().map(|_| BatchWeights::default()) };
        for (i, r) in pieces {
            let f = &files[i];
            let (ds, order) = (f.ds.as_ref().ok_or_else(missing)?, f.order.as_ref().ok_or_else(missing)?);
            let positions = &order.1[r];
            let rows = match (&f.weights, plan.weights.as_mut()) {
                (Some(fw), Some(bw)) => {
                    bw.mine.extend(positions.iter().map(|&p| fw.weights[p as usize]));
                    positions.iter().map(|&p| fw.kept[p as usize]).collect()
                }
                _ => positions.to_vec(),
            };
            plan.pieces.push((ds.clone(), rows));
        }
        if let Some(bw) = plan.weights.as_mut() {
            for (i, r) in globals {
                let (f, order) = (&files[i], files[i].order.as_ref().ok_or_else(missing)?);
                let fw = f.weights.as_ref().ok_or_else(missing)?;
                bw.global_sum += order.1[r].iter().map(|&p| fw.weights[p as usize] as f64).sum::<f64>();
            }
        }
        Ok(plan)
    }

    /// Whether the run has held-out rows (or `--eval-data` files, not opened yet).
    pub fn has_held_out(&self) -> bool {
        match &self.held_out {
            HeldOut::Open(set) => !set.is_empty(),
            HeldOut::Files(f) => !f.is_empty(),
        }
    }

    /// Held-out rows known so far (the `--eval-data` files' once they are open).
    pub fn held_out_rows(&self) -> usize {
        match &self.held_out {
            HeldOut::Open(set) => set.len(),
            HeldOut::Files(_) => 0,
        }
    }

    /// The held-out rows, opening the `--eval-data` files the first time (collective:
    /// every rank opens them and they agree on their row counts).
    pub fn held_out(&mut self, topo: &Topology) -> TrainResult<&EvalSet> {
        if let HeldOut::Files(paths) = &self.held_out {
            let mut set = EvalSet::new();
            for (i, path) in paths.iter().enumerate() {
                let ds = topo.agree(open_one(path, &self.cache_dir, &self.prepare).map_err(|e| e.to_string()))?;
                let key = format!("rows of --eval-data file {} of {} (after skipping malformed lines)", i + 1, paths.len());
                topo.agree_settings(&[(key.as_str(), ds.len().to_string())])?;
                let rows = 0..ds.len();
                set.push(Arc::new(ds), rows)?;
            }
            self.held_out = HeldOut::Open(set);
        }
        match &self.held_out {
            HeldOut::Open(set) => Ok(set),
            HeldOut::Files(_) => Err(TrainError::Config("the held-out files are not open".into())),
        }
    }
}

/// This rank's slice of a global batch, planned ([`TrainData::plan`]) and not read yet:
/// the rows of each file it reads, and in a weighted run its weights.
pub struct BatchPlan {
    /// Each file the slice reads (mapped), with its rows in batch order.
    pieces: Vec<(Arc<Dataset>, Vec<u32>)>,
    /// This rank's samples' weights and the global batch's sum (a weighted run).
    pub weights: Option<BatchWeights>,
}

impl BatchPlan {
    /// Reads the planned rows into `batch` and deduplicates their keys (no rayon: a
    /// prefetching thread may run it while the training thread waits).
    pub fn read(&self, batch: &mut Batch) -> TrainResult<()> {
        batch.load_pieces(self.pieces.iter().map(|(ds, rows)| (&**ds, rows.iter().copied())))?;
        Ok(())
    }
}

/// The shuffle seed of training file `i`: the seed itself for the first file (a single
/// file shuffles as it always did), a mix of the seed and the position for the others.
fn file_seed(seed: u64, i: usize) -> u64 {
    if i == 0 {
        seed
    } else {
        splitmix64(seed ^ splitmix64(0x4649_4c45 ^ i as u64))
    }
}

/// A host leader's background preparation of caches: one thread that prepares the TSVs
/// it is asked for, in the order asked, with its share of the cores; it stops (and
/// removes its temporary file) when dropped.
struct Preparer {
    requests: Option<Sender<PathBuf>>,
    requested: HashSet<PathBuf>,
    /// Files whose cache the thread made sure of, with the seconds it took.
    prepared: Arc<Mutex<HashMap<PathBuf, f64>>>,
    cancel: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Preparer {
    fn start(cache_dir: PathBuf, opts: PrepareOptions) -> Preparer {
        let (tx, rx) = channel::<PathBuf>();
        let cancel = Arc::new(AtomicBool::new(false));
        let prepared = Arc::new(Mutex::new(HashMap::new()));
        let opts = PrepareOptions { cancel: Some(cancel.clone()), ..opts };
        let done = prepared.clone();
        let thread = std::thread::Builder::new().name("ringrec-prepare".into()).spawn(move || {
            // Its own pool for what runs on rayon (verifying a cache found there): the
            // training thread runs on a worker of the global pool and may be waiting for
            // this thread's file lock, so a job queued there might never run.
            let pool = rayon::ThreadPoolBuilder::new().num_threads(opts.threads).thread_name(|i| format!("ringrec-prepare-{i}")).build();
            for path in rx {
                if opts.cancel.as_ref().is_some_and(|c| c.load(Ordering::Relaxed)) {
                    return;
                }
                let t = Instant::now();
                let prepared = match &pool {
                    Ok(pool) => pool.install(|| Dataset::prepare_cached(&path, &cache_dir, &opts)),
                    Err(e) => Err(DataError::InvalidArgument(format!("no threads to prepare with: {e}"))),
                };
                match prepared {
                    Ok(_) => {
                        if let Ok(mut d) = done.lock() {
                            d.insert(path, t.elapsed().as_secs_f64());
                        }
                    }
                    Err(DataError::Cancelled { .. }) => return,
                    // Every rank meets it again when training reaches the file.
                    Err(e) => crate::eprint_line(&format!("ringrec: warning: preparing the cache of {} in the background: {e}; the run stops there when it reaches it", path.display())),
                }
            }
        });
        match thread {
            Ok(t) => Preparer { requests: Some(tx), requested: HashSet::new(), prepared, cancel, thread: Some(t) },
            // No thread: every file is prepared when it is reached.
            Err(_) => Preparer { requests: None, requested: HashSet::new(), prepared, cancel, thread: None },
        }
    }

    /// Queues `path` (once).
    fn request(&mut self, path: &Path) {
        if let (Some(tx), true) = (&self.requests, self.requested.insert(path.to_path_buf())) {
            let _ = tx.send(path.to_path_buf());
        }
    }

    /// Seconds the thread took to make sure of `path`'s cache, once it has.
    fn prepared(&self, path: &Path) -> Option<f64> {
        self.prepared.lock().ok()?.get(path).copied()
    }
}

impl Drop for Preparer {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
        self.requests = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How the run's inputs are prepared: `--max-bad-lines`, `--weight-column` and a Parquet
/// input's `--label-column`, `--dense-columns` and `--sparse-columns`.
fn prepare_options(cfg: &TrainConfig) -> Result<PrepareOptions, DataError> {
    let field = cfg.weights.weight_column.as_ref().and_then(|c| c.field());
    Ok(PrepareOptions::new(cfg.max_bad_lines).weight_column(field).columns(cfg.columns()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_shuffle_apart_and_the_first_as_before() {
        assert_eq!(file_seed(7, 0), 7);
        let seeds: HashSet<u64> = (0..100).map(|i| file_seed(7, i)).collect();
        assert_eq!(seeds.len(), 100);
        assert_ne!(file_seed(7, 1), file_seed(8, 1));
    }
}
