//! `ringrec train --progress-dir DIR`: every rank keeps `DIR/rank-<rank>.json` up to date
//! (at most twice a second, and once at the end; written atomically), for `ringrec serve`'s
//! per-rank view: the rank's step, the steps of the run, its epoch, the samples it trained
//! on (steps x its share of the global batch), its samples/s and the last global loss.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ringrec::train::Progress;

/// One rank's progress file.
pub struct RankProgress {
    path: PathBuf,
    rank: usize,
    ranks: usize,
    /// Rows of the global batch this rank trains on.
    share: usize,
    batch: usize,
    written: Option<Instant>,
    last: Option<Progress>,
    warned: bool,
}

impl RankProgress {
    /// The file of `rank` (of `ranks`) in `dir`, for a global batch of `batch`.
    pub fn new(dir: &Path, rank: usize, ranks: usize, batch: usize) -> RankProgress {
        let share = ringrec::data::shard::rank_slice(0..batch, rank, ranks.max(1)).len();
        RankProgress { path: dir.join(format!("rank-{rank}.json")), rank, ranks, share, batch: batch.max(1), written: None, last: None, warned: false }
    }

    /// Notes `p`; writes it when the last write is half a second old.
    pub fn update(&mut self, p: &Progress) {
        self.last = Some(*p);
        if self.written.is_some_and(|t| t.elapsed() < Duration::from_millis(500)) {
            return;
        }
        self.write();
    }

    /// Writes the last progress seen (the end of the run).
    pub fn finish(&mut self) {
        if self.last.is_some() {
            self.write();
        }
    }

    fn write(&mut self) {
        let Some(p) = self.last else { return };
        self.written = Some(Instant::now());
        let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        let v = serde_json::json!({
            "rank": self.rank,
            "ranks": self.ranks,
            "step": p.step,
            "total_steps": p.total_steps,
            "epoch": p.epoch,
            "samples": p.step * self.share as u64,
            "samples_per_sec": p.samples_per_sec * self.share as f64 / self.batch as f64,
            "loss": p.loss,
            "at": at,
        });
        let dir_ok = self.path.parent().is_none_or(|d| std::fs::create_dir_all(d).is_ok());
        let written = dir_ok && ringrec::fileio::write_atomic(&self.path, 0o644, |w| std::io::Write::write_all(w, v.to_string().as_bytes())).is_ok();
        if !written && !self.warned {
            self.warned = true;
            ringrec::eprint_line(&format!("ringrec rank {}: warning: cannot write the progress file {}; training goes on without it", self.rank, self.path.display()));
        }
    }
}
