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
    /// `hier`: the host lists received from the other hosts, 8-byte aligned pieces.
    recv: Vec<u64>,
    /// `hier`: each piece's bytes in `recv`.
    spans: Vec<std::ops::Range<usize>>,
}

/// `hier`: the ranks of every host with this rank's local rank, and the host's board.
struct Hier {
    /// Key ranges: the smallest number of ranks of a host. Local rank `l < ranges` merges
    /// key range `l` ([`KeyRange::part`]) of the whole step.
    ranges: usize,
    /// This rank's local rank on every host (one rank per host when `local_rank < ranges`).
    cross: Group,
    /// Rank in `cross` of each host's rank.
    cross_of_host: Vec<usize>,
    /// Shared areas of this host's ranks (`None` with one rank per host).
    board: Option<HostBoard>,
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
    /// Shared memory among this host's ranks: barriers of the board, status broadcast.
    host: ShmCollectives,
    /// `flat`: MPI over the world.
    net: Option<MpiCollectives>,
    /// `hier`: how the key ranges travel.
    hier: Option<Hier>,
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
            hier,
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
        let (has, mut st) = self.step(keys, grads, Some((&mut *table, lr)))?;
        let t = Instant::now();
        table.sync()?;
        let dt = t.elapsed().as_secs_f64();
        st.apply_s += dt;
        st.total_s += dt;
        self.totals.apply_s += dt;
        self.totals.total_s += dt;
        Ok((has.then(|| self.result()), st))
    }

    /// The result of the last step (on a rank that holds one): in `b.result`, or, on a `hier`
    /// leader, the host's list on the board, which the step checked (and which stays as it
    /// is until the next step), so reading it again cannot fail.
    fn result(&self) -> AggregatedGrads<'_> {
        let on_board = self.hier.as_ref().and_then(|h| h.board.as_ref()).filter(|_| self.b.result_on_board);
        match on_board.and_then(|board| list::view_checked(board.piece(0, Area::Range), self.dim)) {
            Some(l) => l,
            None => self.b.result.view(),
        }
    }

    /// Runs one step; `Ok(true)` when this rank holds the result ([`SparseExchanger::result`]).
    fn step(&mut self, keys: &[u64], grads: &[f32], table: Option<(&mut HostTable, f32)>) -> SparseResult<(bool, SparseStats)> {
        let t0 = Instant::now();
        let mut st = SparseStats { keys_in: keys.len() as u64, ..SparseStats::default() };
        self.b.result.clear(self.dim);
        self.b.result_on_board = false;
        let own = match &table {
            Some((t, _)) if t.table().dim() != self.dim => Err(SparseError::Invalid(format!(
                "the host table has rows of dim {} but the exchanger was built for dim {}; build both from the same embedding dim",
                t.table().dim(),
                self.dim
            ))),
            _ => self.deduper.index(keys, grads, self.dim).map(|_| ()),
        };
        // The list goes into `b.own` now, or, in `hier` with a host board, straight onto the
        // board once its place there is ready.
        let on_board = self.hier.as_ref().is_some_and(|h| h.board.is_some());
        let own = if on_board { own } else { own.and_then(|()| self.deduper.write_list(grads, &mut self.b.own)) };
        if own.is_ok() {
            st.keys_unique = self.deduper.len() as u64;
        }
        st.dedupe_s = t0.elapsed().as_secs_f64();
        let out = match self.mode {
            SparseExchange::Hierarchical => self.hierarchical(own, grads, table, &mut st),
            SparseExchange::Flat => self.flat(own, table, &mut st),
        };
        st.total_s = t0.elapsed().as_secs_f64();
        self.steps += 1;
        self.totals.add(&st);
        out.map(|has| (has, st))
    }

    /// Normalises `self.b.result` (the whole list, or this rank's key range of it).
    fn normalise(&mut self, st: &mut SparseStats) {
        let t = Instant::now();
        list::normalise(&mut self.b.result, self.normalize, self.world);
        st.merge_s += t.elapsed().as_secs_f64();
    }

    /// On a leader given a table, applies the (normalised) `self.b.result`.
    fn finish(&self, global: SparseResult<()>, table: Option<(&mut HostTable, f32)>, st: &mut SparseStats) -> SparseResult<()> {
        global?;
        let result = self.result();
        st.keys_global = result.len() as u64;
        if let Some((table, lr)) = table {
            if self.local_rank == 0 {
                let t = Instant::now();
                table.apply_updates(result.keys, result.grads, lr)?;
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
            let mut piece = Vec::new();
            error_piece(self.rank, self.dim, e, STATUS_LEN - 4, &mut piece);
            status[..4].copy_from_slice(&(piece.len() as u32).to_le_bytes());
            status[4..4 + piece.len()].copy_from_slice(&piece);
        }
        match self.hier.as_mut().and_then(|h| h.board.as_mut()) {
            Some(board) => board.broadcast_status(&mut status)?,
            None => self.host.broadcast_raw(&mut status, 0)?,
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
        Ok(Some(match decode(piece, self.dim, 1) {
            Ok(Piece::Error { rank, message }) => SparseError::Peer { rank, message },
            Ok(Piece::List(_)) => SparseError::Corrupt { rank: leader, reason: "status holds a list instead of an error report".into() },
            Err(e) => e.from_rank(leader),
        }))
    }

    fn hierarchical(&mut self, own: SparseResult<()>, grads: &[f32], table: Option<(&mut HostTable, f32)>, st: &mut SparseStats) -> SparseResult<bool> {
        let Some(hier) = self.hier.as_mut() else {
            return Err(SparseError::Invalid("the hierarchical exchange has no cross-host communicator".into()));
        };
        let (l, dim) = (self.local_rank, self.dim);
        let owns_range = l < hier.ranges;
        let ranks = &self.host_ranks[self.host_id];
        let b = &mut self.b;
        // 1. Host stage: every local rank writes its list onto the board (the dedupe's second
        //    pass); rank l merges key range l of all of them (local-rank order), serialized
        //    with counts, into `b.wire`.
        let mut host_ok = own;
        if let Some(board) = &mut hier.board {
            let t = Instant::now();
            let mut written = (Ok(()), 0.0);
            host_ok = match host_ok {
                Ok(()) => {
                    let deduper = &mut self.deduper;
                    board
                        .publish(Area::Own, deduper.encoded_len(), |dst| {
                            let t = Instant::now();
                            written = (deduper.encode_to(grads, dst), t.elapsed().as_secs_f64());
                        })
                        .and(written.0)
                }
                Err(e) => publish_error(board, self.rank, dim, e, Area::Own),
            };
            st.dedupe_s += written.1;
            st.host_s += t.elapsed().as_secs_f64() - written.1;
        }
        if owns_range {
            let t = Instant::now();
            host_ok = host_ok.and_then(|()| merge_local(hier.board.as_ref(), ranks, l, KeyRange::part(l, hier.ranges), dim, b, st));
            st.merge_s += t.elapsed().as_secs_f64();
        }
        // 2. Cross stage: the ranks of key range l (one per host) allgather their host lists;
        //    `views` are range l of every host's list, in host order.
        let views = if !owns_range {
            host_ok.map(|()| Vec::new())
        } else {
            let gathered = match &host_ok {
                _ if self.num_hosts == 1 => host_ok,
                Ok(()) => {
                    let t = Instant::now();
                    let sent = &bytemuck::cast_slice::<u64, u8>(&b.wire)[..b.wire_len];
                    let g = allgather_aligned(&hier.cross.comm, sent, &mut b.recv, &mut b.spans);
                    st.cross_s = t.elapsed().as_secs_f64();
                    st.cross_bytes_sent = (sent.len() * (self.num_hosts - 1)) as u64;
                    st.cross_bytes_received = b.spans.iter().map(|s| s.len()).sum::<usize>() as u64;
                    g
                }
                Err(e) => {
                    error_piece(self.rank, dim, e, STATUS_LEN, &mut b.send);
                    let t = Instant::now();
                    let g = allgather_aligned(&hier.cross.comm, &b.send, &mut b.recv, &mut b.spans);
                    st.cross_s = t.elapsed().as_secs_f64();
                    host_ok.and(g)
                }
            };
            let wire = &bytemuck::cast_slice::<u64, u8>(&b.wire)[..b.wire_len];
            let received: &[u8] = bytemuck::cast_slice(&b.recv);
            let (spans, cross_of_host, host_id) = (&b.spans, &hier.cross_of_host, self.host_id);
            let piece_of = |h: usize| match spans.get(cross_of_host[h]) {
                _ if h == host_id => Ok(wire),
                Some(span) => Ok(&received[span.clone()]),
                None => Err(SparseError::Invalid(format!("the cross-host allgather returned {} pieces for {} hosts", spans.len(), cross_of_host.len()))),
            };
            let t = Instant::now();
            let views = gathered.and_then(|()| host_views(&self.host_ranks, l, dim, piece_of, &mut b.pieces));
            st.merge_s += t.elapsed().as_secs_f64();
            views
        };
        // 3. Each rank merges them in host order, normalising each row as it is finished: with
        //    one rank per host into `b.result`, else straight into its part of the host's
        //    result list on the board, where the leader reads it.
        let finish = Finish::normalise(self.normalize, self.world);
        let global = match &mut hier.board {
            None => {
                let t = Instant::now();
                let merged = views.map(|v| merge_views_into(&v, dim, finish, &mut b.result));
                st.merge_s += t.elapsed().as_secs_f64();
                merged
            }
            Some(board) => {
                let t = Instant::now();
                let mut piece = Vec::new();
                let part = match &views {
                    Ok(v) => Part::Rows(merged_len(v)),
                    Err(e) => {
                        error_piece(self.rank, dim, e, STATUS_LEN, &mut piece);
                        Part::Error(&piece)
                    }
                };
                let mut merge_s = t.elapsed().as_secs_f64();
                let published = board.publish_list(part, dim, |sections| {
                    let t = Instant::now();
                    if let Ok(v) = &views {
                        merge_to_sections(v, dim, finish, sections);
                    }
                    merge_s += t.elapsed().as_secs_f64();
                });
                st.merge_s += merge_s;
                st.host_s += t.elapsed().as_secs_f64() - merge_s;
                let own_rows = match part {
                    Part::Rows(n) => n,
                    Part::Error(_) => 0,
                };
                if l != 0 {
                    st.host_bytes_sent += (own_rows * (12 + 4 * dim)) as u64;
                }
                match (views, published) {
                    (Err(e), _) | (Ok(_), Err(e)) => Err(e),
                    (Ok(_), Ok(_)) if l != 0 => Ok(()),
                    (Ok(_), Ok(true)) => {
                        let t = Instant::now();
                        let r = read_host_list(board, ranks, dim, self.world, own_rows, b, st);
                        st.merge_s += t.elapsed().as_secs_f64();
                        r
                    }
                    (Ok(_), Ok(false)) => Err(host_error(board, ranks, dim, self.world, &mut b.result)),
                }
            }
        };
        self.end_hier(global, table, st)
    }

    /// The end of a `hier` step: the leader applies the result and tells its local ranks
    /// how the step went; they return what it said.
    fn end_hier(&mut self, global: SparseResult<()>, table: Option<(&mut HostTable, f32)>, st: &mut SparseStats) -> SparseResult<bool> {
        if self.local_size == 1 {
            self.finish(global, table, st)?;
            return Ok(true);
        }
        if self.local_rank != 0 {
            let told = self.host_status(None);
            global?;
            return match told? {
                Some(e) => Err(e),
                None => Ok(false),
            };
        }
        let result = self.finish(global, table, st);
        let told = self.host_status(result.as_ref().err());
        result?;
        told?;
        Ok(true)
    }

    fn flat(&mut self, own: SparseResult<()>, table: Option<(&mut HostTable, f32)>, st: &mut SparseStats) -> SparseResult<bool> {
        let mine = encode_piece(self.rank, self.dim, own, &self.b.own, false, &mut self.b.send);
        let t = Instant::now();
        let gathered = match &mut self.net {
            Some(net) => net.allgatherv_raw(&self.b.send).map_err(SparseError::from),
            None => Err(SparseError::Invalid("the flat exchange has no world communicator".into())),
        };
        st.cross_s = t.elapsed().as_secs_f64();
        let global = match (mine, gathered) {
            (Err(e), _) => Err(e),
            (Ok(()), Err(e)) => Err(e),
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
        if global.is_ok() {
            self.normalise(st);
        }
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

/// Reads the piece world rank `from` sent where it lies (or, if it cannot, decodes it into
/// `scratch`); an error piece becomes its error.
fn view_piece<'a>(bytes: &'a [u8], dim: usize, from: usize, max_count: u32, scratch: &'a mut SparseList) -> SparseResult<ListRef<'a>> {
    match view(bytes, dim, max_count, scratch).map_err(|e| e.from_rank(from))? {
        Viewed::List(l) => Ok(l),
        Viewed::Error { rank, message } => Err(SparseError::Peer { rank, message }),
    }
}

/// Publishes the error piece that replaces this rank's piece in `area` of the host board;
/// returns `e` (or the failure to publish).
fn publish_error(board: &mut HostBoard, me: usize, dim: usize, e: SparseError, area: Area) -> SparseResult<()> {
    let mut piece = Vec::new();
    error_piece(me, dim, &e, STATUS_LEN, &mut piece);
    board.publish(area, piece.len(), |dst| dst.copy_from_slice(&piece))?;
    Err(e)
}

/// Rank `l` of the host: merges key range `range` of the host's lists (`ranks`, in
/// local-rank order, read in place from the board; without one, this rank's own in `b.own`)
/// into `b.wire`, serialized with counts.
fn merge_local(board: Option<&HostBoard>, ranks: &[usize], l: usize, range: KeyRange, dim: usize, b: &mut Buffers, st: &mut SparseStats) -> SparseResult<()> {
    at_least(&mut b.pieces, ranks.len());
    let mut views = Vec::with_capacity(ranks.len());
    let mut own_rows = 0;
    for ((q, r), scratch) in ranks.iter().enumerate().zip(b.pieces.iter_mut()) {
        let v = match board {
            Some(board) => view_piece(board.piece(q, Area::Own), dim, *r, 1, scratch)?,
            None => b.own.view(),
        };
        if q == l {
            own_rows = v.len();
        }
        views.push(v.within(range));
    }
    let row_bytes = (8 + 4 * dim) as u64;
    let mine = views[l].len() as u64;
    st.host_bytes_received = views.iter().map(|v| v.len() as u64).sum::<u64>().saturating_sub(mine) * row_bytes;
    st.host_bytes_sent = (own_rows as u64).saturating_sub(mine) * row_bytes;
    let n = merged_len(&views);
    st.keys_host = n as u64;
    b.wire_len = list::encoded_len(n, dim, true);
    let words = b.wire_len.div_ceil(8);
    if b.wire.len() < words {
        b.wire.resize(words, 0);
    }
    let out = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut b.wire)[..b.wire_len];
    merge_to_wire(&views, dim, Finish::Sum, n, out, &mut b.result)
}

/// Key range `l` of every host's list in host order, read in place from `piece_of(h)`
/// (host `h`'s serialized list).
fn host_views<'a>(host_ranks: &[Vec<usize>], l: usize, dim: usize, piece_of: impl Fn(usize) -> SparseResult<&'a [u8]>, pieces: &'a mut Vec<SparseList>) -> SparseResult<Vec<ListRef<'a>>> {
    at_least(pieces, host_ranks.len());
    let mut views = Vec::with_capacity(host_ranks.len());
    for ((h, ranks), scratch) in host_ranks.iter().enumerate().zip(pieces.iter_mut()) {
        views.push(view_piece(piece_of(h)?, dim, ranks[l], ranks.len() as u32, scratch)?);
    }
    Ok(views)
}

/// Leader: checks the host's result list on the board (every range owner's rows, in
/// local-rank order: the key ranges in key order; `own_rows` of them its own) and keeps it
/// there as the step's result.
fn read_host_list(board: &HostBoard, ranks: &[usize], dim: usize, world: usize, own_rows: usize, b: &mut Buffers, st: &mut SparseStats) -> SparseResult<()> {
    let bytes = board.piece(0, Area::Range);
    let rows = view_piece(bytes, dim, ranks[0], world as u32, &mut b.result)?.len();
    b.result_on_board = list::view_checked(bytes, dim).is_some();
    st.host_bytes_received += rows.saturating_sub(own_rows) as u64 * (12 + 4 * dim) as u64;
    Ok(())
}

/// Leader: the error of the first local rank that sent one instead of its part of the host's
/// list (`scratch` for reading).
fn host_error(board: &HostBoard, ranks: &[usize], dim: usize, world: usize, scratch: &mut SparseList) -> SparseError {
    for (q, r) in ranks.iter().enumerate() {
        let bytes = board.piece(q, Area::Range);
        if !bytes.is_empty() {
            if let Err(e) = view_piece(bytes, dim, *r, world as u32, scratch) {
                return e;
            }
        }
    }
    SparseError::Invalid("the host's result list was not written, yet no local rank sent an error".into())
}

/// Allgatherv of `send` over `comm` into `recv`, reusing its memory, every piece starting
/// 8-byte aligned so lists can be read in place; `spans` gets each rank's bytes (empty for
/// this rank: its piece stays in `send`). After the lengths, each piece goes straight from
/// its sender to every other rank (non-blocking sends and receives): the same bytes an MPI
/// allgatherv moves, without its copy of this rank's own piece into the receive buffer.
fn allgather_aligned(comm: &SimpleCommunicator, send: &[u8], recv: &mut Vec<u64>, spans: &mut Vec<std::ops::Range<usize>>) -> SparseResult<()> {
    let me = comm.rank() as usize;
    let mut lens = vec![0u64; comm.size() as usize];
    let mine = send.len() as u64;
    mpi::request::scope(|scope| crate::comm::wait_sleeping(comm.immediate_all_gather_into(scope, &mine, &mut lens[..])));
    spans.clear();
    let mut at = 0usize;
    for (r, len) in lens.iter().enumerate() {
        let len = if r == me { 0 } else { *len as usize };
        spans.push(at..at.saturating_add(len));
        at = at.saturating_add(len.div_ceil(8) * 8);
    }
    if at > i32::MAX as usize || send.len() > i32::MAX as usize {
        return Err(SparseError::Invalid(format!("{at} bytes of host lists in one cross-host allgather; MPI takes at most {} (use more hosts or smaller batches)", i32::MAX)));
    }
    let words = at / 8;
    if recv.len() < words {
        recv.resize(words, 0);
    }
    let mut rest = bytemuck::cast_slice_mut::<u64, u8>(&mut recv[..words]);
    let mut slots = Vec::with_capacity(spans.len());
    let mut end = 0;
    for span in spans.iter() {
        let (slot, tail) = std::mem::take(&mut rest)[span.start - end..].split_at_mut(span.len());
        slots.push(slot);
        rest = tail;
        end = span.end;
    }
    mpi::request::scope(|scope| {
        let mut pending = Vec::with_capacity(2 * slots.len());
        for (r, slot) in slots.into_iter().enumerate().filter(|(r, _)| *r != me) {
            pending.push(comm.process_at_rank(r as i32).immediate_receive_into(scope, slot));
        }
        for r in (0..lens.len()).filter(|r| *r != me) {
            pending.push(comm.process_at_rank(r as i32).immediate_send(scope, send));
        }
        pending.into_iter().for_each(crate::comm::wait_sleeping);
    });
    Ok(())
}

impl Hier {
    /// Collective over the world (it duplicates the cross-host communicators and, with
    /// several ranks per host, the host's one).
    fn new(topo: &Topology, host_ranks: &[Vec<usize>]) -> SparseResult<Hier> {
        let ranges = host_ranks.iter().map(Vec::len).min().unwrap_or(1).max(1);
        let cross = topo.cross.duplicate();
        let mut hosts = vec![0u64; cross.size()];
        cross.comm.all_gather_into(&(topo.host_id as u64), &mut hosts[..]);
        let mut cross_of_host = vec![usize::MAX; topo.num_hosts];
        for (c, h) in hosts.iter().enumerate() {
            if let Some(slot) = cross_of_host.get_mut(*h as usize) {
                *slot = c;
            }
        }
        if topo.local_rank < ranges && cross_of_host.contains(&usize::MAX) {
            return Err(SparseError::Invalid(format!("local rank {} is not on every host: its cross-host group holds hosts {hosts:?} of {}", topo.local_rank, topo.num_hosts)));
        }
        let board = if topo.local_size > 1 { Some(HostBoard::new(topo)?) } else { None };
        Ok(Hier { ranges, cross, cross_of_host, board })
    }
}
