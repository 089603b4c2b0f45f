//! [`SparseExchanger`]: the collective part of the sparse exchange (see the module docs of
//! [`crate::sparse`] for the data flow and the summation order).
//!
//! Every rank makes the same sequence of collective calls in every step, whatever fails:
//! an error (bad input, a malformed list, a failed table update) travels in place of the
//! data as an error piece, so every rank returns an error from the same step.

use std::time::Instant;

use mpi::collective::CommunicatorCollectives;
use serde::Serialize;

use super::error::{SparseError, SparseResult};
use super::list::{self, decode, decode_into, encode_error, merge_into, Decoded, Deduper, Piece, SparseList};
use super::{SparseExchange, SparseNormalize};
use crate::comm::mpi_backend::MpiCollectives;
use crate::comm::shm::ShmCollectives;
use crate::comm::{self, Collectives, Gathered};
use crate::embedding::HostTable;
use crate::topology::Topology;

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
    /// Distinct keys of this host (leaders in `hier`; 0 elsewhere).
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
    /// Seconds in the host gather (`hier`).
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
/// row each, and in `counts` the number of ranks whose batch held each key.
pub type AggregatedGrads = SparseList;

/// Every list the exchange works on, kept from step to step (see [`SparseList::clear`]).
#[derive(Default)]
struct Buffers {
    /// This rank's deduped list.
    own: SparseList,
    /// Decoded pieces of other ranks or hosts.
    pieces: Vec<SparseList>,
    /// Flat mode: every host's list.
    hosts: Vec<SparseList>,
    /// This host's list (leader).
    host: SparseList,
    /// The final, normalised list.
    result: SparseList,
    /// What this rank sends.
    send: Vec<u8>,
}

/// Exchanges per-rank sparse gradients every step (see [`crate::sparse`]). Build one per
/// training job on every rank, with the same arguments everywhere.
pub struct SparseExchanger {
    mode: SparseExchange,
    normalize: SparseNormalize,
    dim: usize,
    rank: usize,
    world: usize,
    local_rank: usize,
    local_size: usize,
    host_id: usize,
    num_hosts: usize,
    /// World ranks of every host, in local-rank order.
    host_ranks: Vec<Vec<usize>>,
    /// Shared memory among this host's ranks: gather to the leader, status broadcast.
    host: ShmCollectives,
    /// MPI over the leaders of all hosts (`hier`) or over the world (`flat`).
    net: MpiCollectives,
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
    let mode = match c[1] {
        1 => "hier",
        2 => "flat",
        _ => "?",
    };
    let norm = match c[2] {
        1 => "frequency",
        2 => "world",
        3 => "none",
        _ => "?",
    };
    format!("dim {}, exchange {mode}, normalize {norm}", c[0])
}

/// Serializes `list` into `buf`, or, when `r` is an error (or the list is too large to
/// serialize), the error piece that replaces it. Returns `r` (or the serialization error).
fn encode_piece(me: usize, dim: usize, r: SparseResult<()>, list: &SparseList, with_counts: bool, buf: &mut Vec<u8>) -> SparseResult<()> {
    buf.clear();
    let r = r.and_then(|()| list.encode_into(with_counts, buf));
    if let Err(e) = &r {
        buf.clear();
        let (origin, message) = e.origin(me);
        encode_error(origin, dim, &message, STATUS_LEN, buf);
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
        let mine = [dim as u64, mode.code(), normalize.code()];
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
        let host = comm::host_collectives(topo, "sparse")?;
        let group = match mode {
            SparseExchange::Hierarchical => topo.cross.duplicate(),
            SparseExchange::Flat => topo.world.duplicate(),
        };
        let net = MpiCollectives::new(group, comm::verify_from_env());
        let mut host_ranks = vec![Vec::new(); topo.num_hosts];
        for r in 0..topo.size {
            host_ranks[topo.host_of_rank[r]].push(r);
        }
        for ranks in &mut host_ranks {
            ranks.sort_by_key(|r| topo.local_rank_of_rank[*r]);
        }
        Ok(SparseExchanger {
            mode,
            normalize,
            dim,
            rank: topo.rank,
            world: topo.size,
            local_rank: topo.local_rank,
            local_size: topo.local_size,
            host_id: topo.host_id,
            num_hosts: topo.num_hosts,
            host_ranks,
            host,
            net,
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
    /// The normalisation.
    pub fn normalize(&self) -> SparseNormalize {
        self.normalize
    }
    /// Values per row.
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

    /// One step: this rank's `keys` (repeats allowed) with one row of `dim` values each in
    /// `grads`. Collective over all ranks. Returns the final gradients (sorted by key,
    /// normalised) on host leaders — in `flat` mode on every rank, as each computes them —
    /// and `None` on the other ranks, plus this step's counters. The gradients live in the
    /// exchanger until the next step (its buffers are reused).
    pub fn exchange(&mut self, keys: &[u64], grads: &[f32]) -> SparseResult<(Option<&AggregatedGrads>, SparseStats)> {
        let (has, st) = self.step(keys, grads, None)?;
        Ok((has.then_some(&self.b.result), st))
    }

    /// [`SparseExchanger::exchange`], then the leader applies the result to its host's
    /// table (optimizer step with `lr`) and every local rank passes the host barrier
    /// ([`HostTable::sync`]), so the next lookup sees the update. Every host applies the same
    /// list in the same order: the tables stay byte-identical.
    pub fn exchange_and_apply(&mut self, topo: &Topology, table: &mut HostTable, keys: &[u64], grads: &[f32], lr: f32) -> SparseResult<(Option<&AggregatedGrads>, SparseStats)> {
        let (has, mut st) = self.step(keys, grads, Some((&mut *table, lr)))?;
        let t = Instant::now();
        table.sync(topo)?;
        let dt = t.elapsed().as_secs_f64();
        st.apply_s += dt;
        st.total_s += dt;
        self.totals.apply_s += dt;
        self.totals.total_s += dt;
        Ok((has.then_some(&self.b.result), st))
    }

    /// Runs one step; `Ok(true)` when this rank holds the result in `self.b.result`.
    fn step(&mut self, keys: &[u64], grads: &[f32], table: Option<(&mut HostTable, f32)>) -> SparseResult<(bool, SparseStats)> {
        let t0 = Instant::now();
        let mut st = SparseStats { keys_in: keys.len() as u64, ..SparseStats::default() };
        self.b.result.clear(self.dim);
        let own = match &table {
            Some((t, _)) if t.table().dim() != self.dim => Err(SparseError::Invalid(format!(
                "the host table has rows of dim {} but the exchanger was built for dim {}; build both from the same embedding dim",
                t.table().dim(),
                self.dim
            ))),
            _ => self.deduper.run_into(keys, grads, self.dim, &mut self.b.own),
        };
        if own.is_ok() {
            st.keys_unique = self.b.own.len() as u64;
        }
        st.dedupe_s = t0.elapsed().as_secs_f64();
        let out = match self.mode {
            SparseExchange::Hierarchical => self.hierarchical(own, table, &mut st),
            SparseExchange::Flat => self.flat(own, table, &mut st),
        };
        st.total_s = t0.elapsed().as_secs_f64();
        self.steps += 1;
        self.totals.add(&st);
        out.map(|has| (has, st))
    }

    /// Normalises `self.b.result` and, on a leader given a table, applies it.
    fn finish(&mut self, global: SparseResult<()>, table: Option<(&mut HostTable, f32)>, st: &mut SparseStats) -> SparseResult<()> {
        global?;
        let t = Instant::now();
        list::normalise(&mut self.b.result, self.normalize, self.world);
        st.keys_global = self.b.result.len() as u64;
        st.merge_s += t.elapsed().as_secs_f64();
        if let Some((table, lr)) = table {
            if self.local_rank == 0 {
                let t = Instant::now();
                table.apply_updates(&self.b.result.keys, &self.b.result.grads, lr)?;
                st.apply_s += t.elapsed().as_secs_f64();
            }
        }
        Ok(())
    }

    /// The leader tells its local ranks whether the step failed (`Some` error) or not.
    /// Returns what the leader said (on the leader: `None`), or the broadcast's own failure.
    fn host_status(&mut self, leader_err: Option<&SparseError>) -> SparseResult<Option<SparseError>> {
        let mut status = [0u8; STATUS_LEN];
        if let Some(e) = leader_err {
            let (origin, message) = e.origin(self.rank);
            let mut piece = Vec::new();
            encode_error(origin, self.dim, &message, STATUS_LEN - 4, &mut piece);
            status[..4].copy_from_slice(&(piece.len() as u32).to_le_bytes());
            status[4..4 + piece.len()].copy_from_slice(&piece);
        }
        self.host.broadcast_raw(&mut status, 0)?;
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
        Ok(Some(match decode(piece, self.dim, 1) {
            Ok(Piece::Error { rank, message }) => SparseError::Peer { rank, message },
            Ok(Piece::List(_)) => SparseError::Corrupt { rank: leader, reason: "status holds a list instead of an error report".into() },
            Err(e) => e.from_rank(leader),
        }))
    }

    fn hierarchical(&mut self, own: SparseResult<()>, table: Option<(&mut HostTable, f32)>, st: &mut SparseStats) -> SparseResult<bool> {
        // 1. Gather to the leader through shared memory (the leader keeps its own list).
        let host_ok = if self.local_size == 1 {
            std::mem::swap(&mut self.b.host, &mut self.b.own);
            own
        } else if self.local_rank == 0 {
            let t = Instant::now();
            let gathered = self.host.gatherv_raw(&[], 0);
            st.host_s = t.elapsed().as_secs_f64();
            match (own, gathered) {
                (Err(e), _) => Err(e),
                (Ok(()), Err(e)) => Err(e.into()),
                (Ok(()), Ok(None)) => Err(SparseError::Invalid("the host leader received nothing from the host gather".into())),
                (Ok(()), Ok(Some(g))) => {
                    st.host_bytes_received = g.data.len() as u64;
                    self.merge_host(&g, st)
                }
            }
        } else {
            let own = encode_piece(self.rank, self.dim, own, &self.b.own, false, &mut self.b.send);
            st.host_bytes_sent = self.b.send.len() as u64;
            let t = Instant::now();
            let gathered = self.host.gatherv_raw(&self.b.send, 0);
            st.host_s = t.elapsed().as_secs_f64();
            // Wait for the leader's verdict even after a failure here, so the step ends
            // together on every rank (a broken segment fails the broadcast at once).
            let status = self.host_status(None);
            own?;
            gathered?;
            return match status? {
                Some(e) => Err(e),
                None => Ok(false),
            };
        };
        if host_ok.is_ok() {
            st.keys_host = self.b.host.len() as u64;
        }
        // 2. Leaders allgather the host lists.
        let global = if self.num_hosts > 1 {
            let mine = encode_piece(self.rank, self.dim, host_ok, &self.b.host, true, &mut self.b.send);
            let t = Instant::now();
            let gathered = self.net.allgatherv_raw(&self.b.send);
            st.cross_s = t.elapsed().as_secs_f64();
            match (mine, gathered) {
                (Err(e), _) => Err(e),
                (Ok(()), Err(e)) => Err(e.into()),
                (Ok(()), Ok(g)) => {
                    let sent = self.b.send.len();
                    st.cross_bytes_sent = (sent * (self.num_hosts - 1)) as u64;
                    st.cross_bytes_received = g.data.len().saturating_sub(sent) as u64;
                    self.merge_hosts(&g, st)
                }
            }
        } else {
            std::mem::swap(&mut self.b.result, &mut self.b.host);
            host_ok
        };
        // 3. Normalise, apply, tell the host.
        let result = self.finish(global, table, st);
        if self.local_size > 1 {
            let told = self.host_status(result.as_ref().err());
            result?;
            told?;
        } else {
            result?;
        }
        Ok(true)
    }

    /// Leader: merges the host's lists in local-rank order (its own first) into `b.host`.
    fn merge_host(&mut self, g: &Gathered, st: &mut SparseStats) -> SparseResult<()> {
        let t = Instant::now();
        let ranks = &self.host_ranks[self.host_id];
        if g.counts.len() != ranks.len() {
            return Err(SparseError::Invalid(format!("host gather returned {} pieces for {} local ranks", g.counts.len(), ranks.len())));
        }
        let b = &mut self.b;
        at_least(&mut b.pieces, ranks.len());
        for (l, r) in ranks.iter().enumerate().skip(1) {
            decode_piece(g.piece(l), self.dim, *r, 1, &mut b.pieces[l])?;
        }
        let mut refs: Vec<&SparseList> = Vec::with_capacity(ranks.len());
        refs.push(&b.own);
        refs.extend(&b.pieces[1..ranks.len()]);
        merge_into(&refs, self.dim, &mut b.host);
        st.merge_s += t.elapsed().as_secs_f64();
        Ok(())
    }

    /// Leader: merges the host lists in host order (its own at its host's place) into
    /// `b.result`.
    fn merge_hosts(&mut self, g: &Gathered, st: &mut SparseStats) -> SparseResult<()> {
        let t = Instant::now();
        if g.counts.len() != self.num_hosts || self.net.rank() != self.host_id {
            return Err(SparseError::Invalid(format!(
                "the leaders' communicator has {} ranks and puts this leader at {}, expected {} hosts with this one at {}",
                g.counts.len(),
                self.net.rank(),
                self.num_hosts,
                self.host_id
            )));
        }
        let b = &mut self.b;
        at_least(&mut b.pieces, self.num_hosts);
        for h in (0..self.num_hosts).filter(|h| *h != self.host_id) {
            let ranks = &self.host_ranks[h];
            decode_piece(g.piece(h), self.dim, ranks[0], ranks.len() as u32, &mut b.pieces[h])?;
        }
        let refs: Vec<&SparseList> = (0..self.num_hosts).map(|h| if h == self.host_id { &b.host } else { &b.pieces[h] }).collect();
        merge_into(&refs, self.dim, &mut b.result);
        st.merge_s += t.elapsed().as_secs_f64();
        Ok(())
    }

    fn flat(&mut self, own: SparseResult<()>, table: Option<(&mut HostTable, f32)>, st: &mut SparseStats) -> SparseResult<bool> {
        let mine = encode_piece(self.rank, self.dim, own, &self.b.own, false, &mut self.b.send);
        let t = Instant::now();
        let gathered = self.net.allgatherv_raw(&self.b.send);
        st.cross_s = t.elapsed().as_secs_f64();
        let global = match (mine, gathered) {
            (Err(e), _) => Err(e),
            (Ok(()), Err(e)) => Err(e.into()),
            (Ok(()), Ok(g)) => {
                let sent = self.b.send.len() as u64;
                for r in (0..self.world).filter(|r| *r != self.rank) {
                    let received = g.counts.get(r).copied().unwrap_or(0) as u64;
                    if self.host_ranks[self.host_id].contains(&r) {
                        st.host_bytes_sent += sent;
                        st.host_bytes_received += received;
                    } else {
                        st.cross_bytes_sent += sent;
                        st.cross_bytes_received += received;
                    }
                }
                self.merge_world(&g, st)
            }
        };
        let applying = table.is_some();
        let result = self.finish(global, table, st);
        if applying && self.local_size > 1 {
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

    /// Every rank's list, grouped like `hier` does: per host in local-rank order, then the
    /// hosts in host order, into `b.result`.
    fn merge_world(&mut self, g: &Gathered, st: &mut SparseStats) -> SparseResult<()> {
        let t = Instant::now();
        if g.counts.len() != self.world {
            return Err(SparseError::Invalid(format!("world allgather returned {} pieces for {} ranks", g.counts.len(), self.world)));
        }
        let b = &mut self.b;
        at_least(&mut b.pieces, self.world);
        at_least(&mut b.hosts, self.num_hosts);
        for r in (0..self.world).filter(|r| *r != self.rank) {
            decode_piece(g.piece(r), self.dim, r, 1, &mut b.pieces[r])?;
        }
        for (h, ranks) in self.host_ranks.iter().enumerate() {
            let refs: Vec<&SparseList> = ranks.iter().map(|r| if *r == self.rank { &b.own } else { &b.pieces[*r] }).collect();
            merge_into(&refs, self.dim, &mut b.hosts[h]);
        }
        let refs: Vec<&SparseList> = b.hosts[..self.num_hosts].iter().collect();
        merge_into(&refs, self.dim, &mut b.result);
        if self.local_rank == 0 {
            st.keys_host = b.hosts[self.host_id].len() as u64;
        }
        st.merge_s += t.elapsed().as_secs_f64();
        Ok(())
    }
}
