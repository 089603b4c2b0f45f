//! The `hier` mode of the exchange: host stage on the board, cross-host allgather per key
//! range, merge into the host's result list (see [`crate::sparse`]).

use super::*;
use crate::sparse::compress::{self, RowCompressor};

/// `hier`: the ranks of every host with this rank's local rank, and the host's board.
pub(super) struct Hier {
    /// Key ranges: the smallest number of ranks of a host. Local rank `l < ranges` merges
    /// key range `l` ([`KeyRange::part`]) of the whole step.
    pub(super) ranges: usize,
    /// This rank's local rank on every host (one rank per host when `local_rank < ranges`).
    pub(super) cross: Group,
    /// Rank in `cross` of each host's rank.
    pub(super) cross_of_host: Vec<usize>,
    /// Shared areas of this host's ranks (`None` with one rank per host).
    pub(super) board: Option<HostBoard>,
    /// `--sparse-compression`: the cross-host rows' form (and 1-bit residuals).
    pub(super) compressor: Option<RowCompressor>,
}

impl SparseExchanger {
    pub(super) fn hierarchical(&mut self, own: SparseResult<()>, grads: &[f32], st: &mut SparseStats) -> SparseResult<()> {
        let finish = self.finish_rule();
        let Some(hier) = self.hier.as_mut() else {
            return Err(SparseError::Invalid("the hierarchical exchange has no cross-host communicator".into()));
        };
        let (l, dim) = (self.local_rank, self.wire_dim);
        let owns_range = l < hier.ranges;
        let ranks = &self.host_ranks[self.host_id];
        // Host-only steps (`--sync-every`): this host is the whole world of the step.
        let (num_hosts, world, host_id) = if self.host_only { (1, self.local_size, 0) } else { (self.num_hosts, self.world, self.host_id) };
        let host_ranks = if self.host_only { std::slice::from_ref(ranks) } else { &self.host_ranks[..] };
        let b = &mut self.b;
        // One host in the step (and its list not sent compressed): rank l merges key range l
        // of the ranks' own lists on the board straight into its part of the host's result
        // list there (stage 3), with no host list of its own in between (`b.wire`).
        let direct = hier.board.is_some() && num_hosts == 1 && (self.num_hosts == 1 || hier.compressor.is_none());
        let range = KeyRange::part(l, hier.ranges);
        // 1. Host stage: every local rank writes its list onto the board (the dedupe's second
        //    pass); rank l merges key range l of all of them (local-rank order), serialized
        //    with counts, into `b.wire` (unless `direct`).
        let mut host_ok = match &mut hier.board {
            Some(board) => publish_own(board, &mut self.deduper, own, grads, self.rank, dim, st),
            None => own,
        };
        let mut merged = 0;
        if owns_range {
            let t = Instant::now();
            host_ok = host_ok.and_then(|()| merge_local(hier.board.as_ref(), ranks, l, range, dim, !direct, b, st).map(|n| merged = n));
            st.merge_s += t.elapsed().as_secs_f64();
        } else if hier.board.is_some() && host_ok.is_ok() {
            // No key range here (hosts of unequal sizes): the range owners read every row of
            // this rank's list off the board (what they count as received).
            st.host_bytes_sent = st.keys_unique * (8 + 4 * dim) as u64;
        }
        // A host-only step normalises over this host's ranks (`--sync-every` refuses the
        // weighted form, whose weights are the world's).
        let finish = if num_hosts == 1 && self.host_only { Finish::normalise(self.normalize, world) } else { finish };
        if let (true, Some(board)) = (direct, hier.board.as_mut()) {
            // Stage 3 at once: the own lists as stage 1 read them (in place, or decoded into
            // `b.pieces`).
            let scratch = &b.pieces;
            let merge = |own: &[&[u8]], sections: list::Sections<'_>| {
                let lists: Vec<ListRef<'_>> =
                    own.iter().zip(scratch).map(|(bytes, decoded)| list::view_checked(bytes, dim).unwrap_or_else(|| decoded.view()).within(range)).collect();
                merge_to_sections(&lists, dim, finish, sections);
            };
            let rows = host_ok.map(|()| merged);
            return merge_onto_board(board, rows, merge, ranks, l, dim, self.rank, world, &mut b.result, &mut b.result_on_board, st);
        }
        if let (true, true, Ok(()), Some(c)) = (owns_range, self.num_hosts > 1, &host_ok, hier.compressor.as_mut()) {
            // `--sparse-compression`: the host list goes across hosts compressed.
            let t = Instant::now();
            at_least(&mut b.pieces, 1);
            let wire = &bytemuck::cast_slice::<u64, u8>(&b.wire)[..b.wire_len];
            host_ok = view_piece(wire, dim, self.rank, self.world as u32, &mut b.pieces[0]).map(|host_list| c.encode(host_list, &mut b.packed));
            st.merge_s += t.elapsed().as_secs_f64();
        }
        // 2. Cross stage: the ranks of key range l (one per host) allgather their host lists;
        //    `views` are range l of every host's list, in host order.
        let views = if !owns_range {
            host_ok.map(|()| Vec::new())
        } else {
            let at = CrossAt { l, dim, me: self.rank, world_hosts: self.num_hosts, step_hosts: num_hosts, host_id, host_ranks };
            let bufs = CrossBufs { packed: &b.packed, wire: &bytemuck::cast_slice::<u64, u8>(&b.wire)[..b.wire_len], send: &mut b.send, recv: &mut b.recv, spans: &mut b.spans, pieces: &mut b.pieces };
            cross_stage(hier, bufs, host_ok, at, st)
        };
        // 3. Each rank merges them in host order, normalising each row as it is finished: with
        //    one rank per host into `b.result`, else straight into its part of the host's
        //    result list on the board, where the leader reads it.
        match &mut hier.board {
            None => {
                let t = Instant::now();
                let merged = views.map(|v| merge_views_into(&v, dim, finish, &mut b.result));
                st.merge_s += t.elapsed().as_secs_f64();
                merged
            }
            Some(board) => {
                let (rows, lists) = match views {
                    Ok(v) => (Ok(merged_len(&v)), v),
                    Err(e) => (Err(e), Vec::new()),
                };
                let merge = |_: &[&[u8]], sections: list::Sections<'_>| merge_to_sections(&lists, dim, finish, sections);
                merge_onto_board(board, rows, merge, ranks, l, dim, self.rank, world, &mut b.result, &mut b.result_on_board, st)
            }
        }
    }
}


/// Where [`cross_stage`] runs: this rank's key range `l`, the rows' width, its world rank,
/// the world's hosts and the step's (one in a host-only step), its host in the step and the
/// step's hosts' ranks.
struct CrossAt<'r> {
    l: usize,
    dim: usize,
    me: usize,
    world_hosts: usize,
    step_hosts: usize,
    host_id: usize,
    host_ranks: &'r [Vec<usize>],
}

/// The buffers [`cross_stage`] uses, of [`Buffers`]: the host list sent (`packed` when
/// compressed, else `wire`), the error piece sent instead, what is received and where each
/// piece is in it, the decoded pieces.
struct CrossBufs<'b> {
    packed: &'b [u8],
    wire: &'b [u8],
    send: &'b mut Vec<u8>,
    recv: &'b mut Vec<u64>,
    spans: &'b mut Vec<std::ops::Range<usize>>,
    pieces: &'b mut Vec<SparseList>,
}

/// Stage 2 of [`SparseExchanger::hierarchical`] on the rank of key range `at.l`: the ranks
/// of that range (one per host) allgather their host lists (`b.wire`, or `b.packed` when
/// compressed); the result is range `at.l` of every host's list, in host order.
fn cross_stage<'b>(hier: &Hier, b: CrossBufs<'b>, host_ok: SparseResult<()>, at: CrossAt<'_>, st: &mut SparseStats) -> SparseResult<Vec<ListRef<'b>>> {
    let CrossAt { l, dim, me, world_hosts, step_hosts, host_id, host_ranks } = at;
    let gathered = match &host_ok {
        _ if step_hosts == 1 => host_ok,
        Ok(()) => {
            let t = Instant::now();
            let sent = match hier.compressor {
                Some(_) => b.packed,
                None => b.wire,
            };
            let g = allgather_aligned(&hier.cross.comm, sent, b.recv, b.spans);
            st.cross_s = t.elapsed().as_secs_f64();
            st.cross_bytes_sent = (sent.len() * (world_hosts - 1)) as u64;
            st.cross_bytes_received = b.spans.iter().map(|s| s.len()).sum::<usize>() as u64;
            g
        }
        Err(e) => {
            error_piece(me, dim, e, STATUS_LEN, b.send);
            let t = Instant::now();
            let g = allgather_aligned(&hier.cross.comm, b.send, b.recv, b.spans);
            st.cross_s = t.elapsed().as_secs_f64();
            host_ok.and(g)
        }
    };
    let wire = match hier.compressor {
        // Every host merges the decoded lists, its own included.
        Some(_) if world_hosts > 1 => b.packed,
        _ => b.wire,
    };
    let (recv, spans): (&'b Vec<u64>, &'b Vec<std::ops::Range<usize>>) = (b.recv, b.spans);
    let received: &[u8] = bytemuck::cast_slice(recv);
    let cross_of_host = &hier.cross_of_host;
    let piece_of = |h: usize| match spans.get(cross_of_host[h]) {
        _ if h == host_id => Ok(wire),
        Some(span) => Ok(&received[span.clone()]),
        None => Err(SparseError::Invalid(format!("the cross-host allgather returned {} pieces for {} hosts", spans.len(), cross_of_host.len()))),
    };
    let t = Instant::now();
    let views = gathered.and_then(|()| host_views(host_ranks, l, dim, piece_of, b.pieces));
    st.merge_s += t.elapsed().as_secs_f64();
    views
}

/// Stage 1 on a board: this rank's deduplicated list (the dedupe's second pass) written
/// straight into its area, or its error piece.
fn publish_own(board: &mut HostBoard, deduper: &mut Deduper, own: SparseResult<()>, grads: &[f32], me: usize, dim: usize, st: &mut SparseStats) -> SparseResult<()> {
    let t = Instant::now();
    let mut written = (Ok(()), 0.0);
    let published = match own {
        Ok(()) => board
            .publish(Area::Own, deduper.encoded_len(), |dst| {
                let t = Instant::now();
                written = (deduper.encode_to(grads, dst), t.elapsed().as_secs_f64());
            })
            .and(written.0),
        Err(e) => publish_error(board, me, dim, e, Area::Own),
    };
    st.dedupe_s += written.1;
    st.host_s += t.elapsed().as_secs_f64() - written.1;
    published
}

/// Stage 3 on a board: this rank's `rows` of its key range (or the error that replaces
/// them) go into its part of the host's result list, where `merge` writes them (given the
/// ranks' own lists on the board, and the sections of exactly `rows` rows); the leader then
/// reads the whole list in place.
#[allow(clippy::too_many_arguments)]
fn merge_onto_board(
    board: &mut HostBoard,
    rows: SparseResult<usize>,
    merge: impl FnOnce(&[&[u8]], list::Sections<'_>),
    ranks: &[usize],
    l: usize,
    dim: usize,
    me: usize,
    world: usize,
    result: &mut SparseList,
    on_board: &mut bool,
    st: &mut SparseStats,
) -> SparseResult<()> {
    let t = Instant::now();
    let mut piece = Vec::new();
    let part = match &rows {
        Ok(n) => Part::Rows(*n),
        Err(e) => {
            error_piece(me, dim, e, STATUS_LEN, &mut piece);
            Part::Error(&piece)
        }
    };
    let mut merge_s = t.elapsed().as_secs_f64();
    let published = board.publish_list_from_own(part, dim, |own, sections| {
        let t = Instant::now();
        merge(own, sections);
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
    match (rows, published) {
        (Err(e), _) | (Ok(_), Err(e)) => Err(e),
        (Ok(_), Ok(_)) if l != 0 => Ok(()),
        (Ok(_), Ok(true)) => {
            let t = Instant::now();
            let r = read_host_list(board, ranks, dim, world, own_rows, result, on_board, st);
            st.merge_s += t.elapsed().as_secs_f64();
            r
        }
        (Ok(_), Ok(false)) => Err(host_error(board, ranks, dim, world, result)),
    }
}

/// Reads the piece world rank `from` sent where it lies (or, if it cannot, decodes it into
/// `scratch`); an error piece becomes its error.
fn view_piece<'a>(bytes: &'a [u8], dim: usize, from: usize, max_count: u32, scratch: &'a mut SparseList) -> SparseResult<ListRef<'a>> {
    if compress::is_compressed(bytes) {
        compress::decode_into(bytes, dim, max_count, scratch).map_err(|e| e.from_rank(from))?;
        return Ok(scratch.view());
    }
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
/// into `b.wire`, serialized with counts, or, without `wire`, only counts what the merge
/// holds (stage 3 merges the lists onto the board). Returns the merge's rows.
#[allow(clippy::too_many_arguments)]
fn merge_local(board: Option<&HostBoard>, ranks: &[usize], l: usize, range: KeyRange, dim: usize, wire: bool, b: &mut Buffers, st: &mut SparseStats) -> SparseResult<usize> {
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
    if !wire {
        b.wire_len = 0;
        return Ok(n);
    }
    b.wire_len = list::encoded_len(n, dim, true);
    let words = b.wire_len.div_ceil(8);
    if b.wire.len() < words {
        b.wire.resize(words, 0);
    }
    let out = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut b.wire)[..b.wire_len];
    merge_to_wire(&views, dim, Finish::Sum, n, out, &mut b.result).map(|()| n)
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
#[allow(clippy::too_many_arguments)]
fn read_host_list(board: &HostBoard, ranks: &[usize], dim: usize, world: usize, own_rows: usize, result: &mut SparseList, on_board: &mut bool, st: &mut SparseStats) -> SparseResult<()> {
    let bytes = board.piece(0, Area::Range);
    let rows = view_piece(bytes, dim, ranks[0], world as u32, result)?.len();
    *on_board = list::view_checked(bytes, dim).is_some();
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
    pub(super) fn new(topo: &Topology, host_ranks: &[Vec<usize>]) -> SparseResult<Hier> {
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
        Ok(Hier { ranges, cross, cross_of_host, board, compressor: None })
    }
}
