//! Sparse gradient exchange with frequency normalisation (design 003, steps 4-6).
//!
//! Every step each rank has a sparse gradient: keys (feature ids) with one row of `dim`
//! values each. The final gradient of a key is the sum of its rows over all ranks divided
//! by the number of ranks whose batch held the key (its *frequency*), and only the host
//! leader writes it into the host-shared table.
//!
//! # Data flow ([`SparseExchange::Hierarchical`], the default)
//! 1. **Dedupe** on every rank ([`Deduper`]): repeated keys of one batch are summed in
//!    the order they appear (so a key counts once per rank), sorted by key.
//! 2. **Host stage**: every local rank writes its list, serialized ([`list`] describes the
//!    wire format), straight onto the host's [`board::HostBoard`] (the dedupe's second pass
//!    writes it there), a shared segment the other local ranks read in place. The key space is cut into R equal ranges ([`list::KeyRange`],
//!    R = the smallest number of ranks of a host); local rank l < R merges range l of all
//!    the host's lists into its host list with a per-key count of contributing ranks, so
//!    every rank of the host merges, not only the leader. With one host in the step (one
//!    host, or `--sync-every`'s host-only steps, without row compression) there is no step
//!    3: rank l merges range l of the lists straight into its part of the result list on
//!    the board (step 4), normalising as it goes, with no host list of its own.
//! 3. **Cross-host allgatherv** per key range: the ranks of range l (one per host, over
//!    `topo.cross`) allgather their host lists, so each host's rows cross the network once
//!    instead of once per rank, then merge them in host order into range l of the result,
//!    normalising each row as it is finished ([`SparseNormalize`], fused into the merge;
//!    `weighted` carries each rank's weight as one more value of its rows:
//!    [`exchange::weighted`]).
//! 4. **Collect and apply** ([`SparseExchanger::exchange_and_apply`]): the merge in step 3
//!    writes each range's rows straight into one list on the board
//!    ([`board::HostBoard::publish_list`]: range l after ranges 0..l, so the list is in key
//!    order and nobody copies it); the leader reads it in place, returns it and applies it;
//!    every leader applies the same list in the same order, then the host barrier
//!    ([`crate::embedding::HostTable::sync`]) publishes the rows to the local ranks.
//! 5. **Status**: the leader tells its local ranks (through the board) whether the step
//!    succeeded, so an error anywhere reaches every rank instead of a hang.
//!
//! [`SparseExchange::Flat`] is the seed's literal scheme: every rank allgathers every rank's
//! deduped list over the world and computes the result itself.
//!
//! # One summation order
//! Per key: the rows of the ranks of one host are summed in local-rank order, then the host
//! sums are summed in host order (the first contribution is copied, the next ones added),
//! then divided once. Both modes compute exactly this ([`merge()`] at both levels), so
//! they are bit-identical, and every host holds a byte-identical table.

pub mod board;
mod dedupe;
pub mod delta;
pub mod error;
pub mod exchange;
pub mod list;
pub mod merge;
pub mod compress;
mod radix;
pub mod workload;

pub use error::{DecodeError, SparseError, SparseResult};
pub use exchange::{AggregatedGrads, SparseExchanger, SparseStats};
pub use dedupe::{dedupe, Deduper};
pub use list::{normalise, KeyRange, ListRef, SparseList};
pub use merge::{merge, merge_into, merge_views_into, Finish};

/// How sparse gradients travel between ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum SparseExchange {
    /// Pre-aggregate per host through shared memory; only host leaders exchange across hosts.
    #[default]
    Hierarchical,
    /// Every rank allgathers every rank's list over the world (the seed's literal scheme).
    Flat,
}
crate::config::named_enum!(SparseExchange { Hierarchical => "hier", Flat => "flat" });

/// What a key's summed gradient is divided by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum SparseNormalize {
    /// By the number of ranks whose batch held the key (design 003).
    #[default]
    Frequency,
    /// By the world size (Horovod's averaging of sparse gradients).
    World,
    /// Not at all: the plain sum.
    None,
    /// By the sum of the weights of the ranks whose batch held the key, scaled by
    /// `world / sum of all ranks' weights`, so that equal weights give `frequency`
    /// (weighted aggregation: see [`exchange::weighted`]).
    Weighted,
}
crate::config::named_enum!(SparseNormalize { Frequency => "frequency", World => "world", None => "none", Weighted => "weighted" });
