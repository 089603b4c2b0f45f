//! Coalescing concurrent requests into model batches: one scoring thread takes the first
//! request waiting, then more, until the batch would pass `--max-batch` rows or
//! `--max-wait-us` has passed, and scores them as one batch with the current model
//! ([`super::live::Live::current`], taken once per batch). A request of more than
//! `--max-batch` rows is scored alone, cut into batches of `--max-batch` from its first row.
//! Either way each row gets `ringrec predict`'s bits: scoring computes every row apart from
//! the others ([`ringrec::device::Device::set_row_tile`]), so which requests share a batch
//! changes no answer. The queue in front holds at most `--max-queue` requests (the
//! handler refuses more with 503).

use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringrec::train::scorer::Rows;
use tokio::sync::oneshot;

use super::live::Live;
use super::metrics::Metrics;

/// What a request gets back.
pub struct Scored {
    /// One probability per row, in order.
    pub probabilities: Vec<f32>,
    /// The version of the model that scored them.
    pub version: u64,
    /// The step it was trained to.
    pub step: Option<u64>,
}

/// A request waiting to be scored.
pub struct Job {
    /// Its rows (with their bags for a model with multi-hot fields).
    pub rows: Rows,
    /// Where the answer goes.
    pub reply: oneshot::Sender<Result<Scored, String>>,
}

/// Batch limits.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Most rows in one model batch.
    pub max_batch: usize,
    /// How long the first request of a batch waits for company.
    pub max_wait: Duration,
}

/// The scoring thread's loop; returns when every sender is gone.
pub fn run(rx: Receiver<Job>, live: Arc<Live>, limits: Limits, metrics: Arc<Metrics>) {
    let mut carry: Option<Job> = None;
    let mut all = Rows::default();
    let mut out: Vec<f32> = Vec::new();
    loop {
        let first = match carry.take() {
            Some(j) => j,
            None => match rx.recv() {
                Ok(j) => j,
                Err(_) => return,
            },
        };
        let mut rows = first.rows.len();
        let mut group = vec![first];
        let deadline = Instant::now() + limits.max_wait;
        while rows < limits.max_batch {
            let next = match rx.try_recv() {
                Ok(j) => j,
                Err(TryRecvError::Disconnected) => break,
                Err(TryRecvError::Empty) => match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                    Ok(j) => j,
                    Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
                },
            };
            if rows + next.rows.len() > limits.max_batch {
                carry = Some(next);
                break;
            }
            rows += next.rows.len();
            group.push(next);
        }
        let model = live.current();
        out.clear();
        let scored = {
            let mut scorer = model.scorer.lock().unwrap_or_else(|e| e.into_inner());
            if group.len() == 1 || group.iter().any(|j| (j.rows.columns.fields, j.rows.bags) != (group[0].rows.columns.fields, group[0].rows.bags)) {
                // One request, or requests parsed for models of other shapes (a swap between
                // them): each scored alone, a shape the model does not take refused.
                group.iter().try_for_each(|j| scorer.score_rows(&j.rows, limits.max_batch, &mut out))
            } else {
                all.clear(group[0].rows.columns.fields, group[0].rows.bags);
                group.iter().for_each(|j| all.extend(&j.rows));
                scorer.score_rows(&all, limits.max_batch, &mut out)
            }
        };
        metrics.batch_rows.observe(rows as f64);
        let mut at = 0;
        for j in group {
            let n = j.rows.len();
            let answer = match &scored {
                Ok(()) => Ok(Scored { probabilities: out[at..at + n].to_vec(), version: model.version, step: model.step }),
                Err(e) => Err(format!("scoring failed: {e}")),
            };
            at += n;
            // A client that went away no longer waits for its answer.
            let _ = j.reply.send(answer);
        }
    }
}
