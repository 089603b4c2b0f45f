//! The trainer's side of checkpoints ([`super::checkpoint`] is the format): a resumed run's
//! start (rank 0 finds the newest usable checkpoint, every rank gets its position, dense
//! parameters and optimizer state), and a step's checkpoint written by rank 0, gated by
//! `--checkpoint-min-change`, with every rank learning the outcome.

use std::path::{Path, PathBuf};

use super::checkpoint::{self, DenseState, Loaded};
use super::trainer::Position;
use super::{Trainer, TrainError, TrainResult};
use crate::comm::{Collectives, CollectivesExt};
use crate::device::Device;
use crate::model::DenseOptimState;
use crate::topology::Topology;

/// The checkpoint a run resumes from, as every rank gets it.
pub(super) struct Resumed {
    pub(super) position: Position,
    pub(super) params: Vec<f32>,
    pub(super) opt: DenseOptimState,
    /// The checkpoint's table file.
    pub(super) table: PathBuf,
}

/// Rank 0 finds the checkpoint to resume from in `dir` (the newest that passes every
/// check and matches this run's `settings`; it says which, and why it skipped newer
/// ones); every rank gets its position, parameters and optimizer state (collective).
pub(super) fn resume(topo: &Topology, coll: &mut dyn Collectives, dir: &Path, settings: &[(&'static str, String)], params: &mut Vec<f32>, opt: &mut DenseOptimState) -> TrainResult<Resumed> {
    let n = params.len();
    let (kind, lr) = (opt.kind, opt.lr);
    let found = if topo.rank == 0 {
        checkpoint::find(dir, |ck| checkpoint::check_settings(ck, settings)).map_err(|e| e.to_string()).and_then(|(ck, warnings): (Loaded, Vec<String>)| {
            for w in &warnings {
                crate::eprint_line(&format!("ringrec: warning: {w}"));
            }
            if ck.dense.params.len() != n || ck.dense.opt.kind != kind {
                return Err(format!("{}: {} dense parameters ({}), the model has {n} ({kind})", ck.dir.display(), ck.dense.params.len(), ck.dense.opt.kind));
            }
            if ck.dense.opt.lr != lr {
                return Err(format!("{}: --lr: the checkpoint's optimizer state has {}, this run has {lr}; resume with the same flags", ck.dir.display(), ck.dense.opt.lr));
            }
            crate::eprint_line(&format!("ringrec: resuming from {} (step {})", ck.dir.display(), ck.dense.step));
            Ok(ck.dense)
        })
    } else {
        Ok(DenseState { step: 0, epoch: 0, step_in_epoch: 0, opt: opt.clone(), spec: None, params: Vec::new() })
    };
    let ck = topo.agree(found)?;
    let [step, epoch, in_epoch, opt_step] = topo.control().broadcast("rank 0's checkpoint position", [ck.step, ck.epoch, ck.step_in_epoch, ck.opt.step]);
    let position = Position { step, epoch, in_epoch };
    if topo.rank == 0 {
        params.copy_from_slice(&ck.params);
        *opt = ck.opt;
    }
    opt.step = opt_step;
    coll.broadcast(params.as_mut_slice(), 0)?;
    if !opt.m.is_empty() {
        coll.broadcast(&mut opt.m, 0)?;
        coll.broadcast(&mut opt.v, 0)?;
    }
    Ok(Resumed { position, params: std::mem::take(params), opt: opt.clone(), table: checkpoint::step_dir(dir, position.step).join(checkpoint::TABLE) })
}

impl<D: Device> Trainer<'_, D> {
    /// Rank 0 writes the checkpoint of this step (the table and the dense half, see
    /// [`checkpoint`]); every rank learns the outcome. With `gated` and
    /// `--checkpoint-min-change`, rank 0 first measures how far the dense parameters moved
    /// since the last checkpoint and skips it (saying so) when that is less. Returns
    /// whether a checkpoint was written.
    pub(super) fn save_checkpoint(&mut self, dir: &Path, gated: bool) -> TrainResult<bool> {
        // A checkpoint holds a synchronised state (`--sync-every`).
        self.sync()?;
        let mine = if self.topo.rank == 0 {
            (|| -> Result<bool, String> {
                let p = self.position;
                let params = self.model.params().map_err(|e| e.to_string())?;
                let min = self.cfg.checkpoint_min_change;
                if let (true, Some(last)) = (gated && min > 0.0, &self.last_saved) {
                    let change = checkpoint::relative_change(&params, last);
                    if change < min {
                        crate::eprint_line(&format!("ringrec: step {}: the parameters moved {:.3}% since the last checkpoint, less than --checkpoint-min-change {:.3}%: not written", p.step, 100.0 * change, 100.0 * min));
                        self.counters.checkpoints_skipped += 1;
                        return Ok(false);
                    }
                    crate::eprint_line(&format!("ringrec: step {}: the parameters moved {:.3}% since the last checkpoint: written", p.step, 100.0 * change));
                }
                let opt = self.model.optim_state().map_err(|e| e.to_string())?;
                let dense = DenseState { step: p.step, epoch: p.epoch, step_in_epoch: p.in_epoch, opt, spec: Some(self.model.spec().clone()), params };
                checkpoint::write(dir, &dense, self.embedding.table().table(), &self.resume_settings, self.cfg.keep_checkpoints).map_err(|e| e.to_string())?;
                self.counters.checkpoints_written += 1;
                if self.last_saved.is_some() {
                    self.last_saved = Some(dense.params);
                }
                Ok(true)
            })()
        } else {
            Ok(true)
        };
        let written = self.topo.agree(mine).map_err(|e| TrainError::Checkpoint(e.to_string()))?;
        // Rank 0 decided: every rank must know (the stop-signal check depends on it).
        let [w] = self.topo.control().broadcast("rank 0's checkpoint decision", [u8::from(written)]);
        Ok(w == 1)
    }
}
