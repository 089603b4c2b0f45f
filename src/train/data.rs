//! The training data of a run: the configured file or the synthetic default set (generated
//! once per machine under a lock), its memory-mapped cache, and the train/held-out split.
//! Temporaries that a killed run left in the data and cache directories are removed first
//! ([`crate::stale::sweep_temporaries`]).

use std::ops::Range;
use std::path::{Path, PathBuf};

use super::{TrainConfig, TrainError, TrainResult};
use crate::data::cache::{Dataset, FileLock, CACHE_EXT};
use crate::data::{shard, synth, DataError};
use crate::topology::Topology;

/// A run's data set and its split.
pub struct TrainData {
    /// The mapped data set.
    pub ds: Dataset,
    /// The file it was read from (TSV or cache).
    pub source: PathBuf,
    /// Training rows.
    pub train: Range<usize>,
    /// Held-out rows (the last `test_fraction` of the set).
    pub test: Range<usize>,
}

/// The synthetic default set under `dir`, generated on first use (under a lock, so the
/// ranks of a machine generate it once).
fn default_set(dir: &Path, rows: u64) -> Result<PathBuf, DataError> {
    let p = dir.join(format!("synth-{rows}-s1.tsv"));
    let _lock = FileLock::exclusive(&dir.join("synth.lock"))?;
    if !p.exists() {
        synth(&p, rows, 1)?; // written atomically
    }
    Ok(p)
}

/// Opens the data set of `cfg` on every rank (leaders prepare the cache first, under a
/// file lock: one parse per host) and splits it. Every rank learns whether all succeeded.
pub fn open(topo: &Topology, cfg: &TrainConfig) -> TrainResult<TrainData> {
    let dir = &cfg.data_dir;
    // Temporaries of a killed run's data generation or cache preparation, once per machine.
    if topo.machine_local_rank == 0 {
        for d in [dir.clone(), dir.join("cache")] {
            crate::stale::report(&d, &crate::stale::sweep_temporaries(&d));
        }
    }
    let attempt = (|| -> Result<(Dataset, PathBuf), DataError> {
        std::fs::create_dir_all(dir).map_err(|e| DataError::io(dir, "create the data directory", e))?;
        let source = match &cfg.data {
            Some(p) => p.clone(),
            None => default_set(dir, cfg.synth_rows)?,
        };
        let is_cache = source.extension().and_then(|e| e.to_str()) == Some(CACHE_EXT);
        let ds = if is_cache { Dataset::open(&source)? } else { Dataset::from_tsv_cached(&source, &dir.join("cache"), cfg.max_bad_lines)? };
        Ok((ds, source))
    })();
    let (ds, source) = topo.agree(attempt.map_err(|e| e.to_string()))?;
    topo.agree_settings(&[("rows of --data (after skipping malformed lines)", ds.len().to_string())])?;
    let (train, test) = shard::split(ds.len(), cfg.test_fraction)?;
    if train.is_empty() {
        return Err(TrainError::Config(format!("{}: no training rows (the data set has {} rows, --test-fraction {})", source.display(), ds.len(), cfg.test_fraction)));
    }
    if topo.rank == 0 && ds.header().bad_lines > 0 {
        crate::eprint_line(&format!(
            "ringrec: {}: {} malformed line(s) were skipped when the cache was prepared (run `ringrec data prepare {} OUT` to list them; --max-bad-lines {} stops beyond that)",
            source.display(),
            ds.header().bad_lines,
            source.display(),
            cfg.max_bad_lines
        ));
    }
    Ok(TrainData { ds, source, train, test })
}
