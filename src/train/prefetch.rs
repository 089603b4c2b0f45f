//! The pipelined step's prefetch (`--pipeline`): while step i runs (its dense step on the
//! device, the key-gradient download, the sparse exchange and the leader's update, the
//! allreduce wait, the optimizer), a [`Prefetcher`] thread reads step i+1's batch: this
//! rank's slice from the mapped caches and its keys deduplicated, into a second [`Batch`]
//! (the two are swapped at the next step).
//!
//! What stays on the training thread, and why the results are exactly the unpipelined
//! run's:
//! - **The plan** ([`TrainData::plan`](super::data::TrainData::plan): which rows, the
//!   epoch's order, a weighted run's weights) is made after step i's batch is read, and
//!   only where the next step's global range is known without a collective: every file it
//!   reaches is open (opening one, `reach`, is collective and stays in its step). The rows
//!   read are the same as the next step would read itself.
//! - **The table lookup** of step i+1's rows stays after step i's update and the host
//!   barrier (`Trainer::step` stages the prefetched batch at the start of step i+1): every
//!   row read is the updated one. This is the wait that remains: step i+1's gather needs
//!   step i's table update.
//! - **A prefetched batch the run does not take** (the run ends or stops, a `--stop-at-*`
//!   target, a signal, `--max-steps`) is dropped with the [`Prefetcher`], whose thread is
//!   joined: nothing is lost (the batch was never trained on), no thread is left.
//!
//! The thread runs no rayon job (reading rows and [`crate::sparse::Deduper`] are
//! sequential): the training thread may be a worker of the global pool, blocked in
//! [`Prefetcher::take`], and a job queued there could wait for it.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::JoinHandle;

use super::batch::Batch;
use super::data::BatchPlan;
use super::weights::BatchWeights;
use super::{TrainError, TrainResult};

/// `--pipeline`: whether the next step's batch is read while a step runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Pipeline {
    /// On for a device that queues its work (cuda, host), off for the CPU device, whose
    /// dense step uses every core itself.
    #[default]
    Auto,
    /// Always prefetch.
    On,
    /// Never: every step reads its batch itself.
    Off,
}

crate::config::named_enum!(Pipeline { Auto => "auto", On => "on", Off => "off" });

impl Pipeline {
    /// Whether a run whose dense model is on a device of kind `device_kind`
    /// ([`crate::device::Device::kind`]) prefetches.
    pub fn enabled(self, device_kind: &str) -> bool {
        match self {
            Pipeline::On => true,
            Pipeline::Off => false,
            Pipeline::Auto => device_kind != "cpu",
        }
    }
}

/// The step a batch belongs to: the global steps completed before it, its epoch and its
/// step within the epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ahead {
    /// Global steps completed when the step starts.
    pub step: u64,
    /// The step's epoch.
    pub epoch: u64,
    /// The step within its epoch.
    pub in_epoch: u64,
}

/// A batch to read on the thread, into a buffer of its own.
struct Job {
    plan: BatchPlan,
    batch: Batch,
}

/// The batch read, and whether reading it succeeded.
type Done = (Batch, TrainResult<()>);

/// The prefetching thread of one rank's run (see the module docs).
pub struct Prefetcher {
    jobs: Option<Sender<Job>>,
    done: Receiver<Done>,
    /// The batch being read: its step and its weights (a weighted run).
    in_flight: Option<(Ahead, Option<BatchWeights>)>,
    /// The second buffer, when the thread does not hold it.
    spare: Option<Batch>,
    thread: Option<JoinHandle<()>>,
}

impl Prefetcher {
    /// Starts the thread.
    pub fn start() -> TrainResult<Prefetcher> {
        let (jobs, rx) = channel::<Job>();
        let (tx, done) = channel::<Done>();
        let thread = std::thread::Builder::new()
            .name("ringrec-prefetch".into())
            .spawn(move || {
                for Job { plan, mut batch } in rx {
                    let read = plan.read(&mut batch);
                    if tx.send((batch, read)).is_err() {
                        return;
                    }
                }
            })
            .map_err(|e| TrainError::Config(format!("--pipeline: cannot start the prefetching thread: {e}; run with --pipeline off")))?;
        Ok(Prefetcher { jobs: Some(jobs), done, in_flight: None, spare: Some(Batch::default()), thread: Some(thread) })
    }

    /// Starts reading `plan`, the batch of step `ahead` (a batch still in flight is
    /// dropped first).
    pub fn begin(&mut self, ahead: Ahead, mut plan: BatchPlan) -> TrainResult<()> {
        self.discard()?;
        let batch = self.spare.take().unwrap_or_default();
        let weights = plan.weights.take();
        let sent = self.jobs.as_ref().is_some_and(|j| j.send(Job { plan, batch }).is_ok());
        if !sent {
            return Err(stopped());
        }
        self.in_flight = Some((ahead, weights));
        Ok(())
    }

    /// The batch of step `ahead`, when it was prefetched: waits for it and swaps it into
    /// `batch` (whose old contents become the spare buffer), with its weights in a weighted
    /// run (`Some(None)` in an unweighted one). `None`: nothing was prefetched for that step
    /// (a batch in flight for another is dropped); the caller reads it itself.
    pub fn take(&mut self, ahead: Ahead, batch: &mut Batch) -> TrainResult<Option<Option<BatchWeights>>> {
        match self.in_flight {
            Some((a, _)) if a == ahead => {}
            _ => {
                self.discard()?;
                return Ok(None);
            }
        }
        let weights = self.in_flight.take().and_then(|(_, w)| w);
        let (mut read, result) = self.done.recv().map_err(|_| stopped())?;
        std::mem::swap(batch, &mut read);
        self.spare = Some(read);
        result?;
        Ok(Some(weights))
    }

    /// Waits for the batch in flight, if any, and keeps its buffer as the spare.
    fn discard(&mut self) -> TrainResult<()> {
        if self.in_flight.take().is_some() {
            let (batch, _) = self.done.recv().map_err(|_| stopped())?;
            self.spare = Some(batch);
        }
        Ok(())
    }
}

/// The error of a prefetching thread that is gone.
fn stopped() -> TrainError {
    TrainError::Config("the prefetching thread stopped (--pipeline): run again with --pipeline off, and report it".into())
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        // Closing the channel ends the thread once it read what it was given.
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
