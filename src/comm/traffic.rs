//! Dense traffic by direction: what each rank's collectives send and receive inside its
//! host and across hosts, modelled from the bytes the engine put on the wire and the
//! algorithm of the backend that moved them ([`dense_model`], one collective at a time).
//!
//! ringrec's own backends (`ring`, `shm`, `hier`) count the bytes they move
//! ([`super::count`], [`super::Collectives::traffic`]) and the run's summary reports those
//! counts; this **stated model** is what it reports where the algorithm is not visible
//! (`mpi`, `nccl`, a collective left to MPI's own algorithm), modelled as a ring. For
//! ringrec's own backends it is checked against the counts (`tests/traffic.rs`): equal
//! up to the rounding of parts to whole elements (a few bytes per collective and rank;
//! the sums over the ranks are equal).
//!
//! - **allreduce of B bytes per rank** over n ranks: a ring (reduce-scatter, then
//!   allgather) sends and receives `2 (n-1)/n B` per rank, to its successor and from its
//!   predecessor in rank order: across hosts when that neighbour is on another host.
//!   `ring` is exactly this; `mpi` and `nccl` are modelled as it (their large-message
//!   algorithm). `shm` (one host) keeps everything inside the host, the same bytes for a
//!   buffer past its direct-path limit; a smaller one takes the direct path, where every
//!   rank reads every peer's whole buffer: `(n-1) B` each way. `hier` reduces inside
//!   the host (`2 (L-1)/L B`, L ranks per host), then rings part `B / L` among the h ranks
//!   of equal local rank, one per host (`2 (h-1)/h B / L` across hosts), then shares the
//!   result inside the host. Half-precision payloads travel as f32 on `hier`, `ring` and
//!   `mpi` (they widen before reducing: [`super::Collectives::widens_halves`]), which the
//!   caller's byte count must already reflect.
//! - **allgather of E bytes per rank** (1-bit compression's encodings): a ring sends and
//!   receives `(n-1) E` per rank. On `hier`, the ranks of a host gather inside it
//!   (`(L-1) E`), the leaders exchange their hosts' blobs (`(h-1) L E` each way across
//!   hosts) and each leader hands the whole result (`n E`) to its `L-1` local ranks.

use crate::topology::Topology;

/// One rank's bytes by direction: inside its host and across hosts.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Traffic {
    /// Sent to ranks of its own host.
    pub intra_sent: f64,
    /// Received from ranks of its own host.
    pub intra_received: f64,
    /// Sent to ranks of other hosts.
    pub cross_sent: f64,
    /// Received from ranks of other hosts.
    pub cross_received: f64,
}

impl Traffic {
    /// The bytes as `[intra sent, intra received, cross sent, cross received]`.
    pub fn to_array(self) -> [f64; 4] {
        [self.intra_sent, self.intra_received, self.cross_sent, self.cross_received]
    }

    /// The bytes of `[intra sent, intra received, cross sent, cross received]`.
    pub fn from_array([intra_sent, intra_received, cross_sent, cross_received]: [f64; 4]) -> Traffic {
        Traffic { intra_sent, intra_received, cross_sent, cross_received }
    }

    /// Adds `o`'s bytes, direction by direction.
    pub fn add(&mut self, o: Traffic) {
        self.intra_sent += o.intra_sent;
        self.intra_received += o.intra_received;
        self.cross_sent += o.cross_sent;
        self.cross_received += o.cross_received;
    }
}

/// The positions that decide where a rank's bytes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    /// World rank and size.
    pub rank: usize,
    /// World size.
    pub size: usize,
    /// Ranks on this rank's host (L).
    pub local_size: usize,
    /// This rank's local rank (0 = leader).
    pub local_rank: usize,
    /// Hosts (h).
    pub hosts: usize,
    /// Whether the successor (rank + 1 mod n) is on another host.
    pub successor_elsewhere: bool,
    /// Whether the predecessor (rank - 1 mod n) is on another host.
    pub predecessor_elsewhere: bool,
}

impl Place {
    /// This rank's place in `topo`.
    pub fn of(topo: &Topology) -> Place {
        let n = topo.size;
        let host = |r: usize| topo.host_of_rank.get(r).copied().unwrap_or(0);
        Place {
            rank: topo.rank,
            size: n,
            local_size: topo.local_size,
            local_rank: topo.local_rank,
            hosts: topo.num_hosts,
            successor_elsewhere: host((topo.rank + 1) % n) != topo.host_id,
            predecessor_elsewhere: host((topo.rank + n - 1) % n) != topo.host_id,
        }
    }

    /// Rank `rank` of `size` ranks that all share one host (a host's own collectives).
    pub fn one_host(rank: usize, size: usize) -> Place {
        Place { rank, size, local_size: size, local_rank: rank, hosts: 1, successor_elsewhere: false, predecessor_elsewhere: false }
    }
}

/// The backend name [`dense_model`] takes for a device executor described as `describe`
/// (`nccl on <GPU>`: `nccl`; `None` for an empty description).
pub fn model_name(describe: &str) -> Option<&str> {
    describe.split_whitespace().next()
}

/// A ring's `sent` bytes to the successor and as many from the predecessor.
fn ring(p: &Place, bytes: f64) -> Traffic {
    let mut t = Traffic::default();
    if p.successor_elsewhere {
        t.cross_sent = bytes;
    } else {
        t.intra_sent = bytes;
    }
    if p.predecessor_elsewhere {
        t.cross_received = bytes;
    } else {
        t.intra_received = bytes;
    }
    t
}

/// This rank's traffic for one collective: `allreduce` bytes reduced and `allgather` bytes
/// gathered per rank on `backend` (see the module docs); `shm_direct_max` is the largest
/// buffer `shm` reduces by its direct path ([`super::shm::direct_max`]).
pub fn dense_model(backend: &str, p: &Place, allreduce: f64, allgather: f64, shm_direct_max: usize) -> Traffic {
    let (n, l, h) = (p.size.max(1) as f64, p.local_size.max(1) as f64, p.hosts.max(1) as f64);
    let mut t = Traffic::default();
    if p.size <= 1 {
        return t;
    }
    match backend {
        "shm" => {
            let reduce = if allreduce <= shm_direct_max as f64 { n - 1.0 } else { 2.0 * (n - 1.0) / n };
            let a = reduce * allreduce + (n - 1.0) * allgather;
            t.add(Traffic { intra_sent: a, intra_received: a, ..Traffic::default() });
        }
        "hier" => {
            let intra = 2.0 * (l - 1.0) / l * allreduce + (l - 1.0) * allgather;
            let cross = 2.0 * (h - 1.0) / h * allreduce / l;
            t.add(Traffic { intra_sent: intra, intra_received: intra, cross_sent: cross, cross_received: cross });
            if p.local_rank == 0 {
                let blobs = (h - 1.0) * l * allgather;
                t.add(Traffic { cross_sent: blobs, cross_received: blobs, intra_sent: (l - 1.0) * n * allgather, ..Traffic::default() });
            } else {
                t.add(Traffic { intra_received: n * allgather, ..Traffic::default() });
            }
        }
        _ => t.add(ring(p, 2.0 * (n - 1.0) / n * allreduce + (n - 1.0) * allgather)),
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(rank: usize, size: usize, per_host: usize) -> Place {
        let host = |r: usize| r / per_host;
        Place { rank, size, local_size: per_host, local_rank: rank % per_host, hosts: size / per_host, successor_elsewhere: host((rank + 1) % size) != host(rank), predecessor_elsewhere: host((rank + size - 1) % size) != host(rank) }
    }

    #[test]
    fn sent_equals_received_over_the_ranks_and_hosts_split_the_ring() {
        for backend in ["ring", "mpi", "hier", "shm"] {
            let (size, per_host) = if backend == "shm" { (4, 4) } else { (4, 2) };
            let all: Vec<Traffic> = (0..size).map(|r| dense_model(backend, &place(r, size, per_host), 100_000.0, 10.0, 16384)).collect();
            let sum = |f: fn(&Traffic) -> f64| all.iter().map(f).sum::<f64>();
            assert!((sum(|t| t.cross_sent) - sum(|t| t.cross_received)).abs() < 1e-9, "{backend}");
            assert!((sum(|t| t.intra_sent) - sum(|t| t.intra_received)).abs() < 1e-9, "{backend}");
            // Every byte of a ring allreduce is counted once per rank: 2 (n-1)/n B.
            let total = sum(|t| t.cross_sent + t.intra_sent);
            if backend == "ring" || backend == "mpi" {
                assert!((total - 4.0 * (1.5 * 100_000.0 + 3.0 * 10.0)).abs() < 1e-9, "{backend}: {total}");
                // Ranks 1 and 3 send across hosts (0 1 | 2 3), ranks 0 and 2 inside.
                assert_eq!(all.iter().map(|t| t.cross_sent > 0.0).collect::<Vec<_>>(), [false, true, false, true]);
            }
        }
        // hier: the cross-host share of an allreduce is 1/L of a flat ring's.
        let hier = dense_model("hier", &place(1, 4, 2), 1000.0, 0.0, 16384);
        assert!((hier.cross_sent - 2.0 * 0.5 * 1000.0 / 2.0).abs() < 1e-9, "{hier:?}");
        assert_eq!(dense_model("ring", &place(0, 1, 1), 1000.0, 10.0, 16384), Traffic::default());
        // shm: a small buffer is read whole by every peer, a large one in parts.
        assert_eq!(dense_model("shm", &place(0, 3, 3), 1000.0, 0.0, 1000).intra_sent, 2000.0);
        assert_eq!(dense_model("shm", &place(0, 3, 3), 1200.0, 0.0, 1000).intra_sent, 1600.0);
    }
}
