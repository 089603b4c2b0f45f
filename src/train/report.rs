//! The interval reports of `--eval-every`: every k steps the loss since the last report,
//! the held-out evaluation, throughput, the table's counts and the traffic, written by rank
//! 0 as one JSON line to `--metrics-out`; and the `--stop-at-loss` / `--stop-at-auc`
//! decision taken there (rank 0 decides, every rank stops after the same step).

use std::time::Instant;

use super::metrics::Evaluation;
use super::{StopTarget, Trainer, TrainError, TrainResult};
use crate::device::Device;

/// Where the last interval report left the counters (`--eval-every`).
#[derive(Default, Clone, Copy)]
pub(super) struct Mark {
    step: u64,
    samples: u64,
    train_seconds: f64,
    intra_bytes: f64,
    cross_bytes: f64,
    /// Allreduces of the dense model over the world ([`Trainer::dense_allreduces`]).
    dense_allreduces: u64,
}

impl Mark {
    /// The counters at the start of a run that begins after `step` steps.
    pub(super) fn at(step: u64) -> Mark {
        Mark { step, ..Mark::default() }
    }
}

impl<D: Device> Trainer<'_, D> {
    /// The interval report of `--eval-every` (collective): the loss of the steps since the
    /// last report, the held-out evaluation, throughput and traffic; rank 0 writes it as
    /// one JSON line to `--metrics-out` and shows it in the progress.
    pub(super) fn report_interval(&mut self) -> TrainResult<()> {
        // The evaluation sees a synchronised state (`--sync-every`).
        self.sync()?;
        if let Some(u) = self.unread.take() {
            self.record(self.model.loss_sum()?, u)?;
        }
        let t = Instant::now();
        let eval = if self.cfg.eval && self.data.has_held_out() { Some(self.evaluate()?) } else { None };
        self.eval_seconds += t.elapsed().as_secs_f64();
        if let Some(e) = &eval {
            self.last_eval = Some((self.position.step, *e));
        }
        let eval = eval.flatten();
        self.check_targets(eval)?;
        let now = Mark {
            step: self.position.step,
            samples: self.counters.global_samples,
            train_seconds: self.train_seconds(),
            intra_bytes: self.counters.intra_bytes,
            cross_bytes: self.counters.cross_bytes,
            dense_allreduces: self.dense_allreduces(),
        };
        let (m, l) = (self.mark, &mut self.losses);
        let train_loss = (l.interval_steps > 0).then(|| l.interval_sum / l.interval_steps as f64);
        (l.interval_sum, l.interval_steps) = (0.0, 0);
        self.mark = now;
        self.progress.eval_auc = eval.map(|e| e.auc);
        if self.metrics.is_none() {
            return Ok(());
        }
        let phases = self.phase_seconds()?;
        // Rank 0's GPU hot-row cache and device copies since the run started.
        let g = self.gpu_cache_counters();
        // The tables' counts since the run started (admissions are rows inserted), summed
        // over the tables, and with `--table` each table's.
        let parts = self.table_parts();
        let all = super::TableSummary::sum(parts.iter().map(|(_, p)| p));
        let tables = super::table_summary::breakdown(parts);
        let Some(w) = self.metrics.as_mut() else { return Ok(()) };
        let seconds = (now.train_seconds - m.train_seconds).max(1e-9);
        let rate = (now.samples - m.samples) as f64 / seconds;
        let reduced = (now.dense_allreduces - m.dense_allreduces) as f64;
        let line = serde_json::json!({
            "step": now.step,
            "epoch": self.position.epoch,
            "samples": now.samples,
            "train_loss": train_loss,
            "samples_per_sec": rate,
            "samples_per_sec_per_rank": rate / self.topo.size as f64,
            "eval_auc": eval.map(|e| e.auc),
            "eval_logloss": eval.map(|e| e.logloss),
            "eval_ne": eval.and_then(|e| e.ne),
            "eval_calibration": eval.and_then(|e| e.calibration),
            "eval_rows": self.data.held_out_rows(),
            "table_rows": all.rows,
            "table_capacity": all.capacity,
            "table_bytes": all.bytes,
            "table_growths": all.growths,
            "table_growth_seconds": all.growth_seconds,
            "table_admissions": all.inserted,
            "table_evictions": all.evictions,
            "table_expirations": all.expirations,
            "table_refused": all.refused,
            "table_nan_skips": all.nan_skips,
            "admission_sketch_bytes": all.admission_sketch_bytes,
            "dense_bytes_reduced": reduced * 4.0 * (self.model.num_params() + 1) as f64,
            "sparse_bytes_intra_host": now.intra_bytes - m.intra_bytes,
            "sparse_bytes_cross_host": now.cross_bytes - m.cross_bytes,
            "train_seconds": now.train_seconds,
            "eval_seconds": self.eval_seconds,
            "checkpoints_written": self.counters.checkpoints_written,
            "checkpoints_skipped": self.counters.checkpoints_skipped,
            "phase_seconds": phases,
            "gpu_cache_hit_rate": g.hit_rate(),
            "gpu_cache_rows_refreshed": g.rows_refreshed,
            "device_bytes_uploaded_per_sample": g.uploaded_per_sample(),
            "device_bytes_downloaded_per_sample": g.downloaded_per_sample(),
        });
        let mut line = line;
        if !tables.is_empty() {
            line["tables"] = serde_json::json!(tables);
        }
        use std::io::Write;
        let written = writeln!(w, "{line}").and_then(|_| w.flush());
        written.map_err(|e| TrainError::Config(format!("--metrics-out: cannot write it: {e}")))
    }

    /// Whether a `--stop-at-loss` / `--stop-at-auc` target is reached by `eval` (rank 0's;
    /// collective: rank 0 decides and tells every rank, so all stop after the same step).
    fn check_targets(&mut self, eval: Option<Evaluation>) -> TrainResult<()> {
        let cfg = self.cfg;
        if cfg.stop_at_loss.is_none() && cfg.stop_at_auc.is_none() {
            return Ok(());
        }
        // [reached (0/1), which (0 loss, 1 auc), value]
        let mut decision = [0f64; 3];
        if let Some(e) = eval {
            if cfg.stop_at_loss.is_some_and(|x| e.logloss <= x) {
                decision = [1.0, 0.0, e.logloss];
            } else if cfg.stop_at_auc.is_some_and(|y| e.auc >= y) {
                decision = [1.0, 1.0, e.auc];
            }
        }
        let decision = self.topo.control().broadcast("rank 0's stop-at decision", decision);
        if decision[0] == 1.0 {
            let (flag, target, what) = if decision[1] == 0.0 { ("--stop-at-loss", cfg.stop_at_loss.unwrap_or_default(), "log loss") } else { ("--stop-at-auc", cfg.stop_at_auc.unwrap_or_default(), "AUC") };
            let step = self.position.step;
            if self.topo.rank == 0 {
                crate::eprint_line(&format!("ringrec: step {step}: held-out {what} {:.6} reached {flag} {target}: every rank stops after this step", decision[2]));
            }
            self.stopped = Some(StopTarget { step, target: format!("{flag} {target}"), value: decision[2] });
        }
        Ok(())
    }
}
