//! The trainer's side of checkpoints ([`super::checkpoint`] is the format): a resumed run's
//! start (rank 0 finds the newest usable checkpoint, every rank gets its position, dense
//! parameters and optimizer state), and a step's checkpoint written by rank 0, gated by
//! `--checkpoint-min-change`, with every rank learning the outcome.
//!
//! **In the background.** A checkpoint's state is taken between steps, after the step's
//! update (every rank is past it: the ranks wait for rank 0's decision): the dense
//! parameters and optimizer state copied from the model, the host table copied into an
//! anonymous mapping on the rayon pool ([`crate::embedding::TableSnapshot`], at memory
//! speed). A background thread ([`InFlight`], its own one-thread rayon pool so it never
//! waits for the trainer's) then writes and fsyncs it through the one writer
//! ([`checkpoint::write_image`]: the same files, CRCs, `AtomicDir` publication and atomic
//! `LATEST`) while training goes on. Rank 0 writes every part of a checkpoint, so the
//! directory is published by that thread once its parts are durable; the other ranks
//! learn the outcome without a collective of their own: at the next checkpoint due, at
//! the end of the run (before the summary) and at a graceful stop (before the job ends),
//! rank 0 waits for the write in flight and every rank agrees on its outcome (a failure
//! ends the job there, the previous checkpoint kept, as a synchronous write's failure
//! does at its step). A checkpoint due while the previous one is still being written
//! **waits** for it (saying so): every due checkpoint is written, so a resume point is
//! never older than `--checkpoint-every` says, and at most one snapshot (the table's
//! memory once more) exists. A run that ends any other way (an error) still finishes the
//! write in flight before the process exits ([`InFlight`]'s drop). The snapshot needs the
//! table's size in memory; where `MemAvailable` lacks it (plus 64 MiB), or with
//! `RINGREC_CHECKPOINT_BACKGROUND=0`, the checkpoint is written synchronously as before.

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Instant;

use super::checkpoint::{self, CheckpointResult, DenseState, Loaded};
use super::trainer::Position;
use super::{Trainer, TrainError, TrainResult};
use crate::comm::{Collectives, CollectivesExt};
use crate::device::Device;
use crate::embedding::TableSnapshot;
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
pub(super) fn resume(topo: &Topology, coll: &mut dyn Collectives, dir: &Path, settings: &[(&'static str, String)], spec: &crate::model::ModelSpec, params: &mut Vec<f32>, opt: &mut DenseOptimState) -> TrainResult<Resumed> {
    let n = params.len();
    let (kind, lr) = (opt.kind, opt.lr);
    let found = if topo.rank == 0 {
        checkpoint::find(dir, |ck| checkpoint::check_settings(ck, settings)).map_err(|e| e.to_string()).and_then(|(ck, warnings): (Loaded, Vec<String>)| {
            for w in &warnings {
                crate::eprint_line(&format!("ringrec: warning: {w}"));
            }
            if let Some(theirs) = ck.dense.spec.as_ref().filter(|s| !s.differences(spec).is_empty()) {
                let what: Vec<String> = theirs.differences(spec).iter().map(|(f, there, here)| format!("{f} {there} there, {here} here")).collect();
                return Err(format!(
                    "{}: the checkpoint's model is not this run's: {} (its {} over {} dense and {} categorical fields, this run's {} over {} and {}); resume on the data it was trained on",
                    ck.dir.display(),
                    what.join("; "),
                    theirs.describe(),
                    theirs.ndense,
                    theirs.fields,
                    spec.describe(),
                    spec.ndense,
                    spec.fields
                ));
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

/// A checkpoint being written by a background thread (rank 0): its step, and the thread,
/// which returns the published directory. Dropped unjoined (a run ending on an error), it
/// still waits for the write and reports a failure.
pub(super) struct InFlight {
    step: u64,
    since: Instant,
    thread: Option<JoinHandle<CheckpointResult<PathBuf>>>,
}

/// The memory a snapshot leaves free beside it.
const SNAPSHOT_HEADROOM: u64 = 64 << 20;

impl InFlight {
    /// Starts writing the checkpoint of `dense` with the table's `snapshot` into `dir` (see
    /// [`checkpoint::write_image`]), after `delay` (a test's fault).
    fn start(dir: &Path, dense: DenseState, snapshot: TableSnapshot, settings: Vec<(&'static str, String)>, keep: usize, delay: Option<std::time::Duration>) -> Result<InFlight, String> {
        let (step, dir) = (dense.step, dir.to_path_buf());
        // Its own pool: the writer's rayon work (the block sums, the finite check) must not
        // queue behind the trainer's, whose worker runs the whole step loop.
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).thread_name(|_| "ringrec-checkpoint".into()).build().map_err(|e| format!("starting the checkpoint writer: {e}"))?;
        let thread = std::thread::Builder::new()
            .name("ringrec-checkpoint".into())
            .spawn(move || {
                if let Some(d) = delay {
                    std::thread::sleep(d);
                }
                pool.install(|| checkpoint::write_image(&dir, &dense, &snapshot.image(), &settings, keep))
            })
            .map_err(|e| format!("starting the checkpoint writer: {e}"))?;
        Ok(InFlight { step, since: Instant::now(), thread: Some(thread) })
    }

    /// Whether the write has ended (either way).
    fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Waits for the write; the error names the step.
    fn wait(mut self) -> Result<PathBuf, String> {
        let step = self.step;
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(Ok(p))) => Ok(p),
            Some(Ok(Err(e))) => Err(format!("the checkpoint of step {step}: {e}")),
            Some(Err(_)) => Err(format!("the checkpoint of step {step}: its writer panicked; the previous checkpoint is kept")),
            None => Err(format!("internal: the checkpoint of step {step} was waited for twice")),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.thread.is_some() {
            let step = self.step;
            let this = InFlight { step, since: self.since, thread: self.thread.take() };
            if let Err(e) = this.wait() {
                crate::eprint_line(&format!("ringrec: {e}"));
            }
        }
    }
}

impl<D: Device> Trainer<'_, D> {
    /// Rank 0 takes the checkpoint of this step (the table and the dense half, see
    /// [`checkpoint`]): written in the background from a snapshot (see the module docs),
    /// or synchronously; every rank learns the outcome of taking it, and of the previous
    /// one, which it waits for first. With `gated` and `--checkpoint-min-change`, rank 0
    /// first measures how far the dense parameters moved since the last checkpoint and
    /// skips it (saying so) when that is less. Returns whether a checkpoint was taken.
    pub(super) fn save_checkpoint(&mut self, dir: &Path, gated: bool) -> TrainResult<bool> {
        // A checkpoint holds a synchronised state (`--sync-every`) and the rows a write-back
        // GPU cache changed.
        self.sync()?;
        self.write_back_cache()?;
        let mine = if self.topo.rank == 0 {
            (|| -> Result<bool, String> {
                let p = self.position;
                // One checkpoint at a time: a due one waits for the one still being written.
                self.finish_writing(Some(p.step))?;
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
                let kept = self.last_saved.is_some().then(|| params.clone());
                let dense = DenseState { step: p.step, epoch: p.epoch, step_in_epoch: p.in_epoch, opt, spec: Some(self.model.spec().clone()), params };
                match &self.tables {
                    // The `--table` tables are written synchronously, with the default one.
                    Some(t) => {
                        self.write_tables(dir, &dense, t)?;
                        self.counters.checkpoints_written += 1;
                    }
                    None => self.write_default(dir, dense)?,
                }
                if kept.is_some() {
                    self.last_saved = kept;
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

    /// Rank 0 writes the checkpoint of `dense` with the default table: in the background
    /// from a snapshot when there is memory for one, else synchronously.
    fn write_default(&mut self, dir: &Path, dense: DenseState) -> Result<(), String> {
        let p = self.position;
        let room = self.snapshot_room(self.embedding.table().table().as_bytes().len() as u64);
        let table = self.embedding.table().table();
        match room {
            Ok(()) => {
                let snapshot = table.snapshot().map_err(|e| e.to_string())?;
                let c = &self.topo.config;
                self.writing = Some(InFlight::start(dir, dense, snapshot, self.resume_settings.clone(), self.cfg.keep_checkpoints, c.fault_slow_checkpoint)?);
            }
            Err(why) => {
                if let Some(why) = why {
                    crate::eprint_line(&format!("ringrec: step {}: {why}: this checkpoint is written synchronously", p.step));
                }
                checkpoint::write(dir, &dense, table, &self.resume_settings, self.cfg.keep_checkpoints).map_err(|e| e.to_string())?;
                self.counters.checkpoints_written += 1;
            }
        }
        Ok(())
    }

    /// Rank 0 writes the checkpoint of `dense` with the default table and every `--table`
    /// table (`table.NAME.rrt`), synchronously.
    fn write_tables(&self, dir: &Path, dense: &DenseState, tables: &super::tables::Tables) -> Result<(), String> {
        let image = self.embedding.table().table().image().map_err(|e| e.to_string())?;
        let mut extra = Vec::new();
        for (name, stage) in tables.named() {
            extra.push((super::tables::table_file(name), stage.table().table().image().map_err(|e| format!("table {name}: {e}"))?));
        }
        checkpoint::write_images(dir, dense, &image, &extra, &self.resume_settings, self.cfg.keep_checkpoints).map_err(|e| e.to_string())?;
        Ok(())
    }

    /// Waits for the checkpoint being written, if any (rank 0), and has every rank learn
    /// its outcome (collective; a failure is the error): at the end of the run and at a
    /// graceful stop.
    pub(super) fn finish_checkpoint(&mut self) -> TrainResult<()> {
        if self.cfg.checkpoint_dir.is_none() {
            return Ok(());
        }
        let mine = if self.topo.rank == 0 { self.finish_writing(None) } else { Ok(()) };
        self.topo.agree(mine).map_err(|e| TrainError::Checkpoint(e.to_string()))
    }

    /// Rank 0: waits for the checkpoint being written, if any, saying so when the
    /// checkpoint of step `due` must wait for it; counts it once it is published.
    fn finish_writing(&mut self, due: Option<u64>) -> Result<(), String> {
        let Some(w) = self.writing.take() else { return Ok(()) };
        if let (Some(step), false) = (due, w.is_finished()) {
            crate::eprint_line(&format!(
                "ringrec: step {step}: the checkpoint of step {} is still being written ({:.1} s so far): this one waits for it",
                w.step,
                w.since.elapsed().as_secs_f64()
            ));
        }
        w.wait()?;
        self.counters.checkpoints_written += 1;
        Ok(())
    }

    /// Whether a snapshot of `bytes` (the table) may be taken: `Ok`, or `Err` with why not
    /// (`None`: background checkpoints are off, said by nobody; said once per run
    /// otherwise).
    fn snapshot_room(&mut self, bytes: u64) -> Result<(), Option<String>> {
        if !self.topo.config.checkpoint_background {
            return Err(None);
        }
        match crate::embedding::snapshot::available_memory() {
            // The last snapshot's memory, kept for this one, needs nothing more.
            _ if crate::embedding::snapshot::spare_bytes() == bytes => Ok(()),
            Some(free) if free < bytes + SNAPSHOT_HEADROOM => {
                let first = !std::mem::replace(&mut self.snapshot_refused, true);
                Err(first.then(|| format!("a background checkpoint copies the table ({bytes} bytes) and {free} bytes of memory are available (MemAvailable)")))
            }
            _ => Ok(()),
        }
    }
}
