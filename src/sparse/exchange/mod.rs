//! [`SparseExchanger`]: the collective part of the sparse exchange (see the module docs of
//! [`crate::sparse`] for the data flow and the summation order).
//!
//! Every rank makes the same sequence of collective calls in every step, whatever fails:
//! an error (bad input, a malformed list, a failed table update) travels in place of the
//! data as an error piece, so every rank returns an error from the same step.

use std::time::Instant;

use mpi::collective::CommunicatorCollectives;
use mpi::point_to_point::{Destination, Source};
use mpi::topology::{Communicator, SimpleCommunicator};
use serde::Serialize;

use super::board::{Area, HostBoard, Part};
use super::error::{SparseError, SparseResult};
use super::dedupe::Deduper;
use super::list::{self, decode, decode_into, encode_error, view, Decoded, KeyRange, ListRef, Piece, SparseList, Viewed};
use super::merge::{merge_into, merge_to_sections, merge_to_wire, merge_views_into, merged_len, Finish};
use super::{SparseExchange, SparseNormalize};
use crate::comm::mpi_backend::MpiCollectives;
use crate::comm::shm::ShmCollectives;
use crate::comm::{self, Collectives, Gathered};
use crate::embedding::HostTable;
use crate::topology::{Group, Topology};

mod flat;
mod hier;
pub mod weighted;

use hier::Hier;

/// Bytes of the status a host leader broadcasts to its local ranks after each step; also
/// the longest error piece.
pub const STATUS_LEN: usize = 1024;

/// What one step of the exchange did on this rank. Bytes are payload bytes of the
/// exchange's algorithm (what each rank must send and receive), not counting the
/// collectives' own headers and the 1 KiB status broadcast; `host` bytes move between ranks
/// of one host (shared memory in `hier`, MPI in `flat`), `cross` bytes between hosts.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SparseStats {
    /// Keys in this rank's batch (repeats included).
    pub keys_in: u64,
    /// Distinct keys of this rank's batch.
    pub keys_unique: u64,
    /// Distinct keys of this host: in `hier` those of this rank's key range (0 on ranks
    /// without one), in `flat` all of them on leaders (0 elsewhere).
    pub keys_host: u64,
    /// Distinct keys of the whole step (ranks that hold the result).
    pub keys_global: u64,
    /// Bytes this rank sent to ranks of its own host.
    pub host_bytes_sent: u64,
    /// Bytes this rank received from ranks of its own host.
    pub host_bytes_received: u64,
    /// Bytes this rank sent to ranks of other hosts.
    pub cross_bytes_sent: u64,
    /// Bytes this rank received from ranks of other hosts.
    pub cross_bytes_received: u64,
    /// Seconds in the per-rank dedupe.
    pub dedupe_s: f64,
    /// Seconds publishing lists to the host's other ranks and waiting for theirs (`hier`).
    pub host_s: f64,
    /// Seconds in the cross-host allgatherv (`hier`) or the world allgatherv (`flat`).
    pub cross_s: f64,
    /// Seconds decoding and merging lists, and normalising.
    pub merge_s: f64,
    /// Seconds applying the update to the table and in the host barrier after it.
    pub apply_s: f64,
    /// Seconds of the whole step on this rank.
    pub total_s: f64,
}

impl SparseStats {
    /// Adds `other` field by field (cumulative totals).
    pub fn add(&mut self, other: &SparseStats) {
        self.keys_in += other.keys_in;
        self.keys_unique += other.keys_unique;
        self.keys_host += other.keys_host;
        self.keys_global += other.keys_global;
        self.host_bytes_sent += other.host_bytes_sent;
        self.host_bytes_received += other.host_bytes_received;
        self.cross_bytes_sent += other.cross_bytes_sent;
        self.cross_bytes_received += other.cross_bytes_received;
        self.dedupe_s += other.dedupe_s;
        self.host_s += other.host_s;
        self.cross_s += other.cross_s;
        self.merge_s += other.merge_s;
        self.apply_s += other.apply_s;
        self.total_s += other.total_s;
    }
}

fn mb(b: u64) -> f64 {
    b as f64 / 1e6
}

impl std::fmt::Display for SparseStats {
    /// One log line: `keys 106496 in, 33012 unique, ... | host sent 2.38 MB ... | 4.1 ms`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "keys {} in, {} unique, {} host, {} global | host sent {:.2} MB recv {:.2} MB | cross sent {:.2} MB recv {:.2} MB | dedupe {:.2} host {:.2} cross {:.2} merge {:.2} apply {:.2} total {:.2} ms",
            self.keys_in,
            self.keys_unique,
            self.keys_host,
            self.keys_global,
            mb(self.host_bytes_sent),
            mb(self.host_bytes_received),
            mb(self.cross_bytes_sent),
            mb(self.cross_bytes_received),
            self.dedupe_s * 1e3,
            self.host_s * 1e3,
            self.cross_s * 1e3,
            self.merge_s * 1e3,
            self.apply_s * 1e3,
            self.total_s * 1e3
        )
    }
}

/// The final sparse gradient of a step: distinct keys in increasing order, one normalised
/// row each, and in `counts` the number of ranks whose batch held each key (always
/// present). Borrowed from the exchanger (in `hier` it lies in the host's shared segment).
pub type AggregatedGrads<'a> = ListRef<'a>;

/// Every list the exchange works on, kept from step to step (see [`SparseList::clear`]).
#[derive(Default)]
struct Buffers {
    /// This rank's deduped list (`flat`, and `hier` with one rank per host; else it is
    /// written onto the host board).
    own: SparseList,
    /// Decoded pieces of other ranks or hosts (in `hier` only where a piece cannot be read
    /// in place).
    pieces: Vec<SparseList>,
    /// Flat mode: every host's list.
    hosts: Vec<SparseList>,
    /// The final, normalised list (`flat`; `hier` with one rank per host, or where the
    /// host's result list on the board cannot be read in place).
    result: SparseList,
    /// `hier`: the leader's result is the host's result list on the board.
    result_on_board: bool,
    /// What this rank sends.
    send: Vec<u8>,
    /// `hier`: this rank's key range of its host's list, serialized with counts (8-byte
    /// aligned, so it is read in place), `wire_len` bytes.
    wire: Vec<u64>,
    wire_len: usize,
    /// `hier` with `--sparse-compression`: this rank's key range of its host's list,
    /// compressed ([`crate::sparse::compress`]).
    packed: Vec<u8>,
    /// `hier`: the host lists received from the other hosts, 8-byte aligned pieces.
    recv: Vec<u64>,
    /// `hier`: each piece's bytes in `recv`.
    spans: Vec<std::ops::Range<usize>>,
    /// `weighted`: this rank's list with its weight ending each row, before the dedupe.
    ext: SparseList,
    /// `weighted`: this rank's rows summed per key (rows of the table's dim).
    summed: SparseList,
    /// `weighted`: the result's rows without their weight value.
    stripped: Vec<f32>,
}

/// What a step does with its result on the leader: the host table's update (its rows' dim,
/// and the update itself).
struct Apply<'a> {
    dim: usize,
    f: &'a mut dyn FnMut(AggregatedGrads<'_>) -> SparseResult<()>,
}

/// Exchanges per-rank sparse gradients every step (see [`crate::sparse`]). Build one per
/// training job on every rank, with the same arguments everywhere.
pub struct SparseExchanger {
    mode: SparseExchange,
    normalize: SparseNormalize,
    /// Values per row on the wire: the table's dim, plus one (the weight) in `weighted`.
    wire_dim: usize,
    /// Values per row of the table (of the caller's gradients and of the result).
    dim: usize,
    /// `weighted`: this rank's weight and the sum of all ranks' ([`weighted`]).
    weights: (f32, f32),
    /// `weighted`: the dedupe of this rank's input before its weight is appended.
    pre: Deduper,
    rank: usize,
    world: usize,
    local_rank: usize,
    local_size: usize,
    host_id: usize,
    num_hosts: usize,
    /// World ranks of every host, in local-rank order.
    host_ranks: Vec<Vec<usize>>,
    /// Shared memory among this host's ranks for the leader's status broadcast, where no
    /// host board carries it (`flat`, or one rank per host): the board's own control block
    /// does in `hier`, so it maps none (its slots are allocated in full in the
    /// shared-memory directory).
    host: Option<ShmCollectives>,
    /// `flat`: MPI over the world.
    net: Option<MpiCollectives>,
    /// `hier`: how the key ranges travel.
    hier: Option<Hier>,
    /// The next steps stay inside this host: no cross-host stage, normalised over the
    /// host's ranks ([`SparseExchanger::set_host_only`]; `--sync-every`'s local steps).
    host_only: bool,
    deduper: Deduper,
    b: Buffers,
    steps: u64,
    totals: SparseStats,
}

impl std::fmt::Debug for SparseExchanger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SparseExchanger")
            .field("mode", &self.mode)
            .field("normalize", &self.normalize)
            .field("dim", &self.dim)
            .field("rank", &self.rank)
            .field("host_id", &self.host_id)
            .field("steps", &self.steps)
            .finish()
    }
}

fn describe_config(c: &[u64]) -> String {
    let mode = SparseExchange::ALL.get(c[1] as usize).map_or("?", |m| m.name());
    let norm = SparseNormalize::ALL.get(c[2] as usize).map_or("?", |n| n.name());
    format!("dim {}, exchange {mode}, normalize {norm}", c[0])
}

/// `v`'s position in `all` (the same on every rank).
fn code_of<T: PartialEq>(all: &[T], v: &T) -> u64 {
    all.iter().position(|x| x == v).unwrap_or(usize::MAX) as u64
}

/// Replaces `buf` with the error piece of `e` (which happened here, on world rank `me`, or
/// came from the rank it names), at most `max_len` bytes.
fn error_piece(me: usize, dim: usize, e: &SparseError, max_len: usize, buf: &mut Vec<u8>) {
    buf.clear();
    let (origin, message) = e.origin(me);
    encode_error(origin, dim, &message, max_len, buf);
}

/// Serializes `list` into `buf`, or, when `r` is an error (or the list is too large to
/// serialize), the error piece that replaces it. Returns `r` (or the serialization error).
fn encode_piece(me: usize, dim: usize, r: SparseResult<()>, list: &SparseList, with_counts: bool, buf: &mut Vec<u8>) -> SparseResult<()> {
    buf.clear();
    let r = r.and_then(|()| list.encode_into(with_counts, buf));
    if let Err(e) = &r {
        error_piece(me, dim, e, STATUS_LEN, buf);
    }
    r
}

/// Decodes the piece world rank `from` sent into `out`; an error piece becomes its error.
fn decode_piece(bytes: &[u8], dim: usize, from: usize, max_count: u32, out: &mut SparseList) -> SparseResult<()> {
    match decode_into(bytes, dim, max_count, out).map_err(|e| e.from_rank(from))? {
        Decoded::List => Ok(()),
        Decoded::Error { rank, message } => Err(SparseError::Peer { rank, message }),
    }
}

/// `v` with at least `n` (empty) lists.
fn at_least(v: &mut Vec<SparseList>, n: usize) {
    if v.len() < n {
        v.resize_with(n, SparseList::default);
    }
}

impl SparseExchanger {
    /// Sets up the exchange; collective over all ranks (every rank must call it with the
    /// same `mode`, `normalize` and `dim`, else every rank gets [`SparseError::Mismatch`]).
    /// Maps a shared-memory segment per host and duplicates an MPI communicator.
    pub fn new(topo: &Topology, mode: SparseExchange, normalize: SparseNormalize, dim: usize) -> SparseResult<SparseExchanger> {
        SparseExchanger::new_tagged(topo, mode, normalize, dim, "sparse")
    }

    /// [`SparseExchanger::new`] whose host segments are named by `tag`: several exchangers
    /// of one job need different tags (the sparse deltas of `--sync-every` have their own).
    pub fn new_tagged(topo: &Topology, mode: SparseExchange, normalize: SparseNormalize, dim: usize, tag: &str) -> SparseResult<SparseExchanger> {
        let mine = [dim as u64, code_of(SparseExchange::ALL, &mode), code_of(SparseNormalize::ALL, &normalize)];
        let mut all = vec![0u64; 3 * topo.size];
        topo.world.comm.all_gather_into(&mine[..], &mut all[..]);
        let reference = &all[..3];
        let differ: Vec<String> =
            all.chunks_exact(3).enumerate().filter(|(_, c)| *c != reference).take(8).map(|(r, c)| format!("rank {r} has {}", describe_config(c))).collect();
        if !differ.is_empty() {
            return Err(SparseError::Mismatch { detail: format!("rank 0 has {}, {}", describe_config(reference), differ.join(", ")) });
        }
        if dim == 0 || dim > u32::MAX as usize {
            return Err(SparseError::Invalid(format!("dim {dim} is out of range; rows need 1..={} values", u32::MAX)));
        }
        let mut host_ranks = vec![Vec::new(); topo.num_hosts];
        for r in 0..topo.size {
            host_ranks[topo.host_of_rank[r]].push(r);
        }
        for ranks in &mut host_ranks {
            ranks.sort_by_key(|r| topo.local_rank_of_rank[*r]);
        }
        let (net, hier) = match mode {
            SparseExchange::Flat => (Some(MpiCollectives::new(topo.world.duplicate(), topo.config.verify)), None),
            SparseExchange::Hierarchical => (None, Some(Hier::new(topo, &host_ranks)?)),
        };
        let on_board = hier.as_ref().is_some_and(|h| h.board.is_some());
        let host = if on_board { None } else { Some(comm::host_collectives(topo, tag)?) };
        Ok(SparseExchanger {
            mode,
            normalize,
            wire_dim: if normalize == SparseNormalize::Weighted { dim + 1 } else { dim },
            dim,
            weights: (1.0, topo.size as f32),
            pre: Deduper::new(),
            rank: topo.rank,
            world: topo.size,
            local_rank: topo.local_rank,
            local_size: topo.local_size,
            host_id: topo.host_id,
            num_hosts: topo.num_hosts,
            host_ranks,
            host,
            net,
            hier,
            host_only: false,
            deduper: Deduper::new(),
            b: Buffers::default(),
            steps: 0,
            totals: SparseStats::default(),
        })
    }

    /// The exchange mode.
    pub fn mode(&self) -> SparseExchange {
        self.mode
    }
    /// Sends the rows of the cross-host leg compressed in `form` (1-bit with error
    /// feedback per key, or half precision), or as they are (`None`, the default). Only
    /// the hierarchical exchange has that leg: `flat` refuses it.
    pub fn set_row_compression(&mut self, form: Option<crate::sparse::compress::RowForm>) -> SparseResult<()> {
        match (self.hier.as_mut(), form) {
            (Some(h), f) => {
                h.compressor = f.map(crate::sparse::compress::RowCompressor::new);
                Ok(())
            }
            (None, None) => Ok(()),
            (None, Some(_)) => Err(SparseError::Invalid("sparse row compression applies to the hierarchical exchange's cross-host leg: use --sparse-exchange hier".into())),
        }
    }
    /// Keys whose 1-bit residual this rank keeps (0 without row compression).
    pub fn compression_residual_rows(&self) -> usize {
        self.hier.as_ref().and_then(|h| h.compressor.as_ref()).map_or(0, |c| c.residual_rows())
    }
    /// The normalisation.
    pub fn normalize(&self) -> SparseNormalize {
        self.normalize
    }
    /// Values per row (of the table, the input gradients and the result).
    pub fn dim(&self) -> usize {
        self.dim
    }
    /// Steps run so far (failed ones included).
    pub fn steps(&self) -> u64 {
        self.steps
    }
    /// Sums of the per-step [`SparseStats`] of this rank over all steps.
    pub fn totals(&self) -> &SparseStats {
        &self.totals
    }

    /// With `on`, the next steps stay inside each host (every rank must set the same): the
    /// host stage as always, then no cross-host stage; each host's result is its own
    /// ranks' merged list, normalised as if the host were the world (`world` = its ranks).
    /// `hier` only: a `flat` step refuses it.
    pub fn set_host_only(&mut self, on: bool) {
        self.host_only = on;
    }

    /// One step: this rank's `keys` (repeats allowed) with one row of `dim` values each in
    /// `grads`. Collective over all ranks. Returns the final gradients (sorted by key,
    /// normalised) on host leaders — in `flat` mode on every rank, as each computes them —
    /// and `None` on the other ranks, plus this step's counters. The gradients live in the
    /// exchanger (in `hier`, in the host's shared segment) until the next step.
    pub fn exchange(&mut self, keys: &[u64], grads: &[f32]) -> SparseResult<(Option<AggregatedGrads<'_>>, SparseStats)> {
        let (has, st) = self.step(keys, grads, None)?;
        Ok((has.then(|| self.result()), st))
    }

    /// [`SparseExchanger::exchange`], then the leader applies the result to its host's
    /// table (optimizer step with `lr`) and every local rank passes the host barrier
    /// ([`HostTable::sync`]), so the next lookup sees the update. Every host applies the same
    /// list in the same order: the tables stay byte-identical.
    pub fn exchange_and_apply(&mut self, table: &mut HostTable, keys: &[u64], grads: &[f32], lr: f32) -> SparseResult<(Option<AggregatedGrads<'_>>, SparseStats)> {
        self.exchange_and_apply_checked(table, keys, grads, lr, &mut |_| Ok(true))
    }

    /// [`SparseExchanger::exchange_and_apply`], where the leader first shows the merged,
    /// normalised list to `check`: `Ok(true)` applies it, `Ok(false)` skips this step's
    /// update, an error fails the step on every rank (as any failed update does). Every
    /// host merges the same list, so every leader decides the same.
    pub fn exchange_and_apply_checked(
        &mut self,
        table: &mut HostTable,
        keys: &[u64],
        grads: &[f32],
        lr: f32,
        check: &mut dyn FnMut(&AggregatedGrads<'_>) -> SparseResult<bool>,
    ) -> SparseResult<(Option<AggregatedGrads<'_>>, SparseStats)> {
        let mut update = |table: &mut HostTable, g: AggregatedGrads<'_>| {
            if check(&g)? {
                table.apply_updates(g.keys, g.grads, lr).map_err(SparseError::from)?;
            }
            Ok(())
        };
        self.exchange_and_update(table, keys, grads, &mut update)
    }

    /// [`SparseExchanger::exchange`], then the leader hands the result and its host's table
    /// to `update` (which writes the table as it sees fit; its error fails the step on
    /// every rank), and every local rank passes the host barrier ([`HostTable::sync`]).
    pub fn exchange_and_update(
        &mut self,
        table: &mut HostTable,
        keys: &[u64],
        grads: &[f32],
        update: &mut dyn FnMut(&mut HostTable, AggregatedGrads<'_>) -> SparseResult<()>,
    ) -> SparseResult<(Option<AggregatedGrads<'_>>, SparseStats)> {
        let _w = crate::watchdog::waiting("the sparse exchange");
        let dim = table.table().dim();
        let mut update = |g: AggregatedGrads<'_>| update(&mut *table, g);
        let (has, mut st) = self.step(keys, grads, Some(Apply { dim, f: &mut update }))?;
        let t = Instant::now();
        table.sync()?;
        let dt = t.elapsed().as_secs_f64();
        st.apply_s += dt;
        st.total_s += dt;
        self.totals.apply_s += dt;
        self.totals.total_s += dt;
        Ok((has.then(|| self.result()), st))
    }

    /// The last step's final list, readable on every rank once the step returned (the GPU
    /// hot-row caches apply what their host's leader applied): the result where this rank
    /// holds it (`flat`: every rank; `hier`: the leader), else, on another local rank of a
    /// `hier` host, the host's result list on the board (the host's shared memory), read in
    /// place where it can be. It stays there until the next step. An error only if the
    /// board holds no list (the step failed).
    pub fn host_result(&mut self) -> SparseResult<AggregatedGrads<'_>> {
        if self.mode == SparseExchange::Hierarchical && self.local_rank != 0 && !self.b.result_on_board {
            let leader = self.host_ranks[self.host_id][0];
            let Some(board) = self.hier.as_ref().and_then(|h| h.board.as_ref()) else {
                return Err(SparseError::Invalid("the host's result list is on no board".into()));
            };
            let bytes = board.piece(0, Area::Range);
            if list::view_checked(bytes, self.wire_dim).is_some() {
                self.b.result_on_board = true;
            } else {
                decode_piece(bytes, self.wire_dim, leader, self.world as u32, &mut self.b.result)?;
            }
            if self.weighted() {
                self.strip();
            }
        }
        Ok(self.result())
    }

    /// The result of the last step (on a rank that holds one): in `b.result`, or, on a `hier`
    /// leader, the host's list on the board, which the step checked (and which stays as it
    /// is until the next step), so reading it again cannot fail.
    fn result(&self) -> AggregatedGrads<'_> {
        let full = self.full_result();
        match self.weighted() {
            true => ListRef { dim: self.dim, keys: full.keys, counts: full.counts, grads: &self.b.stripped },
            false => full,
        }
    }

    /// The result as the exchange made it (in `weighted`, each row ends in its holders'
    /// weight sum).
    fn full_result(&self) -> AggregatedGrads<'_> {
        let on_board = self.hier.as_ref().and_then(|h| h.board.as_ref()).filter(|_| self.b.result_on_board);
        match on_board.and_then(|board| list::view_checked(board.piece(0, Area::Range), self.wire_dim)) {
            Some(l) => l,
            None => self.b.result.view(),
        }
    }

    /// Runs one step; `Ok(true)` when this rank holds the result ([`SparseExchanger::result`]).
    fn step(&mut self, keys: &[u64], grads: &[f32], apply: Option<Apply<'_>>) -> SparseResult<(bool, SparseStats)> {
        let t0 = Instant::now();
        let mut st = SparseStats { keys_in: keys.len() as u64, ..SparseStats::default() };
        self.b.result.clear(self.wire_dim);
        self.b.result_on_board = false;
        let own = match &apply {
            Some(a) if a.dim != self.dim => Err(SparseError::Invalid(format!(
                "the host table has rows of dim {} but the exchanger was built for dim {}; build both from the same embedding dim",
                a.dim, self.dim
            ))),
            _ => Ok(()),
        };
        // `weighted`: the rows that travel end in this rank's weight (see [`weighted`]).
        let mut ext = std::mem::take(&mut self.b.ext);
        let own = own.and_then(|()| if self.weighted() { self.weigh_rows(keys, grads, &mut ext) } else { Ok(()) });
        let (keys, grads): (&[u64], &[f32]) = if self.weighted() && own.is_ok() { (&ext.keys, &ext.grads) } else { (keys, grads) };
        let own = own.and_then(|()| self.deduper.index(keys, grads, self.wire_dim).map(|_| ()));
        // The list goes into `b.own` now, or, in `hier` with a host board, straight onto the
        // board once its place there is ready.
        let on_board = self.hier.as_ref().is_some_and(|h| h.board.is_some());
        let own = if on_board { own } else { own.and_then(|()| self.deduper.write_list(grads, &mut self.b.own)) };
        if own.is_ok() {
            st.keys_unique = self.deduper.len() as u64;
        }
        st.dedupe_s = t0.elapsed().as_secs_f64();
        let global = match self.mode {
            SparseExchange::Hierarchical => self.hierarchical(own, grads, &mut st),
            SparseExchange::Flat => self.flat(own, &mut st),
        };
        let out = self.conclude(global, apply, &mut st);
        self.b.ext = ext;
        st.total_s = t0.elapsed().as_secs_f64();
        self.steps += 1;
        self.totals.add(&st);
        out.map(|has| (has, st))
    }

    /// Normalises `self.b.result` (the whole list, or this rank's key range of it).
    fn normalise(&mut self, st: &mut SparseStats) {
        let t = Instant::now();
        let finish = self.finish_rule();
        list::normalise_with(&mut self.b.result, finish);
        st.merge_s += t.elapsed().as_secs_f64();
    }

    /// On a leader given an update, applies the (normalised) `self.b.result`.
    fn finish(&self, global: SparseResult<()>, apply: Option<Apply<'_>>, st: &mut SparseStats) -> SparseResult<()> {
        global?;
        let result = self.result();
        st.keys_global = result.len() as u64;
        if let (Some(apply), 0) = (apply, self.local_rank) {
            let t = Instant::now();
            (apply.f)(result)?;
            st.apply_s += t.elapsed().as_secs_f64();
        }
        Ok(())
    }

    /// The end of a step: the leader applies the result (in `flat`, every rank holds it),
    /// and the ranks of a host learn how the step went where they need to (`hier`: only
    /// the leader holds the result; an update: only the leader applies it). `Ok(true)` when
    /// this rank holds the result.
    fn conclude(&mut self, global: SparseResult<()>, apply: Option<Apply<'_>>, st: &mut SparseStats) -> SparseResult<bool> {
        let hier = self.mode == SparseExchange::Hierarchical;
        let tell = self.local_size > 1 && (hier || apply.is_some());
        if tell && hier && self.local_rank != 0 {
            let told = self.host_status(None);
            global?;
            return match told? {
                Some(e) => Err(e),
                None => Ok(false),
            };
        }
        if global.is_ok() && self.weighted() {
            self.strip();
        }
        let result = self.finish(global, apply, st);
        if tell {
            let told = self.host_status(if self.local_rank == 0 { result.as_ref().err() } else { None });
            result?;
            if let Some(e) = told? {
                return Err(e);
            }
        } else {
            result?;
        }
        Ok(true)
    }

    /// The leader tells its local ranks whether the step failed (`Some` error) or not.
    /// Returns what the leader said (on the leader: `None`), or the broadcast's own failure.
    fn host_status(&mut self, leader_err: Option<&SparseError>) -> SparseResult<Option<SparseError>> {
        let mut status = [0u8; STATUS_LEN];
        if let Some(e) = leader_err {
            let mut piece = Vec::new();
            error_piece(self.rank, self.wire_dim, e, STATUS_LEN - 4, &mut piece);
            status[..4].copy_from_slice(&(piece.len() as u32).to_le_bytes());
            status[4..4 + piece.len()].copy_from_slice(&piece);
        }
        match self.hier.as_mut().and_then(|h| h.board.as_mut()) {
            Some(board) => board.broadcast_status(&mut status)?,
            None => match self.host.as_mut() {
                Some(host) => host.broadcast_raw(&mut status, 0)?,
                None => return Err(SparseError::Invalid("the exchange has neither a host board nor host collectives".into())),
            },
        }
        if self.local_rank == 0 {
            return Ok(None);
        }
        let len = u32::from_le_bytes([status[0], status[1], status[2], status[3]]) as usize;
        if len == 0 {
            return Ok(None);
        }
        let leader = self.host_ranks[self.host_id][0];
        let Some(piece) = status.get(4..4 + len) else {
            return Ok(Some(SparseError::Corrupt { rank: leader, reason: format!("status of {len} bytes in a {STATUS_LEN}-byte buffer") }));
        };
        Ok(Some(match decode(piece, self.wire_dim, 1) {
            Ok(Piece::Error { rank, message }) => SparseError::Peer { rank, message },
            Ok(Piece::List(_)) => SparseError::Corrupt { rank: leader, reason: "status holds a list instead of an error report".into() },
            Err(e) => e.from_rank(leader),
        }))
    }
}
