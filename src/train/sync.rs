//! Lazy synchronisation, local SGD (designs 000 and 002): `ringrec train --sync-every k`
//! with `k > 1` ([`LocalSgd`]). `k = 1` (the default) is the fully synchronous training of
//! design 003 and never reaches this module.
//!
//! **Local steps.** Between two syncs every rank trains from the last synchronised state
//! without the world allreduce:
//! - `--sync-scope rank`: each rank's dense model takes its own optimizer steps on its own
//!   slice's gradient (loss scale 1 / its slice length: it trains on its own);
//! - `--sync-scope host`: the ranks of one host sum their dense gradients every step over
//!   the host's shared memory (a host-local collective; loss scale 1 / the host's samples),
//!   so the host's ranks stay identical and only hosts differ.
//!
//! The sparse table is held once per host, so its updates are host-wide in both scopes:
//! every step the host's ranks pre-aggregate their rows on the host board and the leader
//! applies them, as in a synchronous step, but nothing crosses hosts (the exchange is
//! host-only, normalised over the host's ranks as if the host were the world), and the
//! rows carry the gradient of the host's mean loss. Between syncs each host's table holds
//! its own updates: hosts differ.
//!
//! **A sync** (every `k` local steps, and before every evaluation, checkpoint and the end
//! of the run, so those always see a synchronised state): first the sparse deltas
//! ([`crate::sparse::delta`]: zero-filtered `(key, row now - row at the last sync)` of the
//! rows the host changed, through the same per-host pre-aggregation and leaders-only
//! exchange, combined per key as the sum of the hosts' deltas / the number of hosts that
//! changed the key, the analogue of `--sparse-normalize frequency`; every host then sets
//! `row = row at the last sync + combined delta`, so right after a sync the hosts' rows are
//! bit-identical); then the dense *statistical gradient*: the accumulated delta `params -
//! params at the last sync` goes through the engine's allreduce (`sync.dense`: the
//! engine's collectives, fusion and compression apply), is divided by the world size
//! (the mean over the ranks; under scope host every rank of a host holds its host's delta,
//! so hosts weigh by their rank count), and every rank sets `params = params at the last
//! sync + mean delta`. Seed 000's option of dividing the delta by the number of local
//! steps is not offered: the mean delta is already an average model, and dividing by `k`
//! would only shrink the learning rate.
//!
//! **Optimizer state.** The dense optimizer's state (Adam's moments and step count) stays
//! each rank's own across syncs (it is neither averaged nor reset: each rank's optimizer
//! is that of its local training); a checkpoint holds rank 0's, and a resumed run gives
//! every rank rank 0's. The table's optimizer must be SGD (row-wise Adagrad accumulators
//! would differ between hosts), and admission (`--admit-after`) and expiry are refused:
//! both depend on each step's global list.
//!
//! **Non-finite values.** A local step's decisions are each rank's (or host's) own: a
//! non-finite local gradient or table update is skipped there. Under `--nan-policy stop`
//! each skip is also counted, and the count travels with the dense delta, so every rank
//! stops at the same sync; under `skip-step` a sync whose mean delta is not finite is
//! dropped (every rank returns to the last synchronised parameters). The summary's
//! `nan_skips` are then rank 0's own counts (its dense skips, its host's table skips).
//! `RINGREC_FAULT_NAN` injects a NaN into a local step as into a synchronous one.
//!
//! **Traffic.** Scope host's per-step host allreduces run outside the engine, over their
//! own shared memory: their bytes are counted there and modelled like the engine's
//! ([`LocalSgd::host_traffic`]), and the summary adds them to the dense traffic (all of
//! them inside the host).

use super::{NanPolicy, TrainError, TrainResult};
use crate::comm::shm::ShmCollectives;
use crate::comm::traffic::{dense_model, Place, Traffic};
use crate::comm::{self, Collectives, CollectivesExt};
use crate::data::shard;
use crate::device::Device;
use crate::dtype::ReduceOp;
use crate::engine::{Compression, Engine};
use crate::model::DenseModel;
use crate::tensor::Tensor;
use crate::topology::Topology;

/// `--sync-scope`: who trains together between syncs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SyncScope {
    /// Every rank trains on its own between syncs.
    #[default]
    Rank,
    /// The ranks of a host sum their dense gradients every step; hosts sync every k steps.
    Host,
}

crate::config::named_enum!(SyncScope { Rank => "rank", Host => "host" });

/// What the syncs of a run did on this rank.
#[derive(Clone, Debug, Default)]
pub struct SyncCounts {
    /// Syncs taken.
    pub syncs: u64,
    /// Syncs whose mean dense delta was not finite and was dropped (`skip-step`).
    pub dropped: u64,
}

/// The lazy synchronisation of one rank's run (see the module docs).
pub struct LocalSgd {
    every: u64,
    scope: SyncScope,
    /// Local steps since the last sync.
    since: u64,
    /// The dense parameters at the last sync.
    synced: Vec<f32>,
    /// Scope host: the host's shared-memory collectives.
    host: Option<ShmCollectives>,
    /// This rank's place in its host (a world of the host's ranks), for the model.
    host_place: Place,
    /// The direct-path limit of the host's shared memory.
    shm_direct_max: usize,
    /// The host allreduces' modelled traffic.
    host_model: Traffic,
    /// World ranks of this host.
    host_ranks: Vec<usize>,
    world: usize,
    rank: usize,
    /// Local updates skipped as not finite since the last sync (this rank's dense half).
    non_finite: u64,
    /// Scope rank: the key gradients rescaled to the host's loss scale.
    key_grads: Vec<f32>,
    counts: SyncCounts,
}

impl LocalSgd {
    /// The lazy synchronisation of a run every `every` steps in `scope`, from the dense
    /// parameters `params` (the run's start or its resumed checkpoint: a sync).
    /// Collective over the host with scope host (its shared-memory collectives).
    pub fn new(topo: &Topology, every: u64, scope: SyncScope, params: Vec<f32>) -> TrainResult<LocalSgd> {
        let host = match scope {
            SyncScope::Host => Some(comm::host_collectives(topo, "sync")?),
            SyncScope::Rank => None,
        };
        let host_ranks = (0..topo.size).filter(|r| topo.host_of_rank[*r] == topo.host_id).collect();
        let host_place = Place::one_host(topo.local_rank, topo.local_size);
        let shm_direct_max = comm::shm::direct_max(topo.config.shm_chunk_bytes);
        Ok(LocalSgd { every, scope, since: 0, synced: params, host, host_place, shm_direct_max, host_model: Traffic::default(), host_ranks, world: topo.size, rank: topo.rank, non_finite: 0, key_grads: Vec::new(), counts: SyncCounts::default() })
    }

    /// `--sync-every`.
    pub fn every(&self) -> u64 {
        self.every
    }

    /// `--sync-scope`.
    pub fn scope(&self) -> SyncScope {
        self.scope
    }

    /// What the syncs did so far.
    pub fn counts(&self) -> &SyncCounts {
        &self.counts
    }

    /// Samples of the global batch `global` that this host trains on.
    pub fn host_samples(&self, global: std::ops::Range<usize>) -> usize {
        self.host_ranks.iter().map(|r| shard::rank_slice(global.clone(), *r, self.world).len()).sum()
    }

    /// The loss scale of a local step on global batch `global`: 1 / this rank's slice
    /// (scope rank) or 1 / the host's samples (scope host); and the samples its loss sum
    /// covers.
    pub fn loss_scale(&self, global: std::ops::Range<usize>) -> (f32, usize) {
        let n = match self.scope {
            SyncScope::Rank => shard::rank_slice(global, self.rank, self.world).len(),
            SyncScope::Host => self.host_samples(global),
        };
        (1.0 / n.max(1) as f32, n)
    }

    /// The key gradients of a local step at the host's loss scale (what the host's table
    /// update needs): scope host's as they are; scope rank's, taken at 1 / slice, times
    /// slice / host samples.
    pub fn host_key_grads<'g>(&'g mut self, grads: &'g [f32], global: std::ops::Range<usize>) -> &'g [f32] {
        let Some(factor) = self.host_grad_factor(global) else { return grads };
        self.key_grads.clear();
        self.key_grads.extend(grads.iter().map(|g| g * factor));
        &self.key_grads
    }

    /// What a local step's key gradients are multiplied by to reach the host's loss scale
    /// ([`LocalSgd::host_key_grads`]): scope rank's slice / host samples; `None` with scope
    /// host (they are at it already). `--table`'s per-key sums, grouped by table, go
    /// through [`LocalSgd::host_key_grads`] as one list, so a key's gradient is the
    /// one-table run's bits.
    fn host_grad_factor(&self, global: std::ops::Range<usize>) -> Option<f32> {
        if self.scope == SyncScope::Host {
            return None;
        }
        let slice = shard::rank_slice(global.clone(), self.rank, self.world).len();
        Some(slice as f32 / self.host_samples(global).max(1) as f32)
    }

    /// Scope host: sums a local step's dense tensor (a layer's gradient or the loss sum)
    /// over the host's ranks; scope rank: leaves it. The tensor must be in host memory.
    pub fn reduce_over_host(&mut self, t: &mut Tensor) -> TrainResult<()> {
        let Some(host) = self.host.as_mut() else { return Ok(()) };
        let Some(values) = t.as_mut_slice::<f32>() else {
            return Err(TrainError::Config("--sync-scope host sums the dense gradients over the host's shared memory, which needs them in host memory: use --device cpu, or --sync-scope rank".into()));
        };
        host.allreduce(values, ReduceOp::Sum)?;
        self.host_model.add(dense_model("shm", &self.host_place, (4 * values.len()) as f64, 0.0, self.shm_direct_max));
        Ok(())
    }

    /// The traffic of scope host's host allreduces on this rank: counted by the host's
    /// shared memory, and modelled; zero with scope rank.
    pub fn host_traffic(&self) -> (Option<Traffic>, Traffic) {
        (self.host.as_ref().map_or(Some(Traffic::default()), |h| h.traffic()), self.host_model)
    }

    /// Counts a local update skipped as not finite on this rank (see the module docs).
    pub fn skipped_non_finite(&mut self) {
        self.non_finite += 1;
    }

    /// Counts a local step taken; true when a sync is due after it.
    pub fn stepped(&mut self) -> bool {
        self.since += 1;
        self.since >= self.every
    }

    /// Whether local steps were taken since the last sync.
    pub fn pending(&self) -> bool {
        self.since > 0
    }

    /// The dense half of a sync (collective over the world through `engine`): the mean of
    /// the ranks' deltas since the last sync, applied to the parameters at the last sync on
    /// every rank. `sparse_skips` are the table updates this rank's host skipped as not
    /// finite since the last sync (counted on its leader). `step` names the step in errors;
    /// `compression` is the delta's (the run's, or none during `--compression-warmup`).
    pub fn sync_dense<D: Device>(&mut self, model: &mut DenseModel<D>, engine: &Engine, compression: Compression, sparse_skips: u64, step: u64, policy: NanPolicy) -> TrainResult<()> {
        let params = model.params()?;
        let mut delta: Vec<f32> = params.iter().zip(&self.synced).map(|(p, s)| p - s).collect();
        delta.push((self.non_finite + sparse_skips) as f32);
        let summed = engine.allreduce_async_with("sync.dense", Tensor::from_vec(delta), ReduceOp::Sum, compression).wait()?;
        let mut summed = summed.into_vec::<f32>().map_err(|_| TrainError::Config("internal: the dense sync came back in device memory".into()))?;
        let skips = summed.pop().unwrap_or(0.0);
        self.since = 0;
        self.non_finite = 0;
        self.counts.syncs += 1;
        if skips != 0.0 && policy == NanPolicy::Stop {
            return Err(TrainError::NonFinite { step, what: format!("a local update since the last sync ({skips} skipped over the ranks)") });
        }
        let n = self.world as f32;
        let next: Vec<f32> = self.synced.iter().zip(&summed).map(|(s, d)| s + d / n).collect();
        if next.iter().any(|v| !v.is_finite()) {
            if policy == NanPolicy::Stop {
                return Err(TrainError::NonFinite { step, what: "the mean dense delta of a sync".into() });
            }
            self.counts.dropped += 1;
            if self.rank == 0 {
                crate::eprint_line(&format!("ringrec: warning: step {step}: the mean dense delta of this sync is not finite: dropped, every rank returns to the last synchronised parameters (--nan-policy skip-step)"));
            }
            model.set_params(&self.synced)?;
            return Ok(());
        }
        model.set_params(&next)?;
        self.synced = next;
        Ok(())
    }
}
