//! `ringrec train --progress-dir DIR`: every rank keeps `DIR/rank-<rank>.json` up to date
//! (at most twice a second, and once at the end; written atomically), for `ringrec serve`'s
//! per-rank view: the rank's step, the steps of the run, its epoch, the samples it trained
//! on in this run, its samples/s since the previous write (wall time, evaluations
//! included) and the last global loss.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ringrec::train::Progress;

/// One rank's progress file.
pub struct RankProgress {
    path: PathBuf,
    rank: usize,
    ranks: usize,
    /// When and at how many samples the last write was.
    written: Option<(Instant, u64)>,
    rate: f64,
    last: Option<Progress>,
    warned: bool,
}

impl RankProgress {
    /// The file of `rank` (of `ranks`) in `dir`.
    pub fn new(dir: &Path, rank: usize, ranks: usize) -> RankProgress {
        RankProgress { path: dir.join(format!("rank-{rank}.json")), rank, ranks, written: None, rate: 0.0, last: None, warned: false }
    }

    /// Notes `p`; writes it when the last write is half a second old.
    pub fn update(&mut self, p: &Progress) {
        self.last = Some(*p);
        if self.written.is_some_and(|(t, _)| t.elapsed() < Duration::from_millis(500)) {
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
        let now = Instant::now();
        if let Some((t, n)) = self.written {
            let dt = now.duration_since(t).as_secs_f64();
            if dt > 0.0 && p.samples >= n {
                self.rate = (p.samples - n) as f64 / dt;
            }
        }
        self.written = Some((now, p.samples));
        let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        let v = serde_json::json!({
            "rank": self.rank,
            "ranks": self.ranks,
            "step": p.step,
            "total_steps": p.total_steps,
            "epoch": p.epoch,
            "samples": p.samples,
            "samples_per_sec": self.rate,
            "loss": p.loss,
            "at": at,
        });
        let dir_ok = self.path.parent().is_none_or(|d| std::fs::create_dir_all(d).is_ok());
        let written = dir_ok && ringrec::fileio::write_atomic(&self.path, ringrec::fileio::PRIVATE, |w| std::io::Write::write_all(w, v.to_string().as_bytes())).is_ok();
        if !written && !self.warned {
            self.warned = true;
            ringrec::eprint_line(&format!("ringrec rank {}: warning: cannot write the progress file {}; training goes on without it", self.rank, self.path.display()));
        }
    }
}
