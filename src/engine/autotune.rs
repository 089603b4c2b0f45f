//! `RINGREC_AUTOTUNE=1`: searches the fusion threshold, then the cycle time, during the
//! first steps and keeps the best, as Horovod's autotuner does (with a plain grid instead
//! of Bayesian optimisation: the space is small).
//!
//! Rank 0 runs it; the parameters reach the other ranks in the coordinator's response
//! lists, so every rank fuses identically. Each candidate runs for `warmup` cycles that
//! moved data, then for a window of at least `sample` seconds; its score is the bytes
//! reduced per second of wall time over the window. Every candidate tried is written to
//! `RINGREC_AUTOTUNE_LOG` (CSV) when set.

use std::io::Write;
use std::time::{Duration, Instant};

/// The parameters it tunes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Params {
    /// Fusion threshold in bytes (0: no fusion).
    pub fusion_threshold: usize,
    /// Background cycle time.
    pub cycle_time: Duration,
}

/// The search state.
pub struct Autotuner {
    thresholds: Vec<usize>,
    cycles: Vec<Duration>,
    stage: usize,
    idx: usize,
    best: Params,
    best_score: f64,
    current: Params,
    warm_left: usize,
    warmup: usize,
    sample: Duration,
    window_start: Option<Instant>,
    bytes: u64,
    log: Option<std::fs::File>,
    /// (params, score) of every candidate, in the order tried.
    pub tried: Vec<(Params, f64)>,
    done: bool,
}

impl Autotuner {
    /// A search starting from `initial`; `warmup` data cycles and `sample` seconds per candidate.
    pub fn new(initial: Params, warmup: usize, sample: Duration, log: Option<std::fs::File>) -> Autotuner {
        const MIB: usize = 1 << 20;
        let mut log = log;
        if let Some(f) = log.as_mut() {
            let _ = writeln!(f, "fusion_threshold_bytes,cycle_time_ms,score_bytes_per_second,kept");
        }
        let mut t = Autotuner {
            thresholds: vec![MIB, 4 * MIB, 16 * MIB, 64 * MIB, 128 * MIB],
            cycles: [0.5, 1.0, 2.5, 5.0].iter().map(|ms| Duration::from_secs_f64(ms / 1000.0)).collect(),
            stage: 0,
            idx: 0,
            best: initial,
            best_score: f64::NEG_INFINITY,
            current: initial,
            warm_left: warmup,
            warmup,
            sample,
            window_start: None,
            bytes: 0,
            log,
            tried: Vec::new(),
            done: false,
        };
        t.current = Params { fusion_threshold: t.thresholds[0], cycle_time: initial.cycle_time };
        t
    }

    /// The parameters to use now.
    pub fn current(&self) -> Params {
        self.current
    }

    /// True while candidates remain.
    pub fn active(&self) -> bool {
        !self.done
    }

    /// Accounts one cycle that reduced `bytes` (0 for an idle cycle) and ended at `now`.
    pub fn record(&mut self, bytes: u64, now: Instant) {
        if self.done {
            return;
        }
        if self.warm_left > 0 {
            if bytes > 0 {
                self.warm_left -= 1;
                if self.warm_left == 0 {
                    self.window_start = Some(now);
                    self.bytes = 0;
                }
            }
            return;
        }
        let Some(start) = self.window_start else { return };
        self.bytes += bytes;
        let elapsed = now.duration_since(start);
        if elapsed < self.sample || self.bytes == 0 {
            return;
        }
        let score = self.bytes as f64 / elapsed.as_secs_f64();
        self.tried.push((self.current, score));
        if let Some(f) = self.log.as_mut() {
            let _ = writeln!(f, "{},{:.3},{:.0},", self.current.fusion_threshold, self.current.cycle_time.as_secs_f64() * 1e3, score);
        }
        if score > self.best_score {
            self.best_score = score;
            self.best = self.current;
        }
        self.next_candidate();
    }

    fn next_candidate(&mut self) {
        self.idx += 1;
        self.warm_left = self.warmup.max(1);
        self.window_start = None;
        if self.stage == 0 && self.idx < self.thresholds.len() {
            self.current = Params { fusion_threshold: self.thresholds[self.idx], cycle_time: self.best.cycle_time };
        } else if self.stage == 0 {
            self.stage = 1;
            self.idx = 0;
            self.current = Params { fusion_threshold: self.best.fusion_threshold, cycle_time: self.cycles[0] };
        } else if self.idx < self.cycles.len() {
            self.current = Params { fusion_threshold: self.best.fusion_threshold, cycle_time: self.cycles[self.idx] };
        } else {
            self.done = true;
            self.current = self.best;
            if let Some(f) = self.log.as_mut() {
                let _ = writeln!(f, "{},{:.3},{:.0},kept", self.best.fusion_threshold, self.best.cycle_time.as_secs_f64() * 1e3, self.best_score);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tries_every_candidate_then_keeps_the_best() {
        let initial = Params { fusion_threshold: 128 << 20, cycle_time: Duration::from_millis(1) };
        let mut t = Autotuner::new(initial, 1, Duration::from_millis(10), None);
        let mut now = Instant::now();
        let mut steps = 0;
        while t.active() && steps < 10_000 {
            // Pretend 16 MiB fusion with 2.5 ms cycles moves the most bytes per cycle.
            let p = t.current();
            let bytes = if p.fusion_threshold == 16 << 20 { 2000 } else { 1000 } + if p.cycle_time == Duration::from_micros(2500) { 500 } else { 0 };
            now += Duration::from_millis(1);
            t.record(bytes, now);
            steps += 1;
        }
        assert!(!t.active());
        assert_eq!(t.tried.len(), 9);
        assert_eq!(t.current(), Params { fusion_threshold: 16 << 20, cycle_time: Duration::from_micros(2500) });
    }
}
