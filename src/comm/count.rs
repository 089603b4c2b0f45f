//! Counted traffic: the bytes a backend of ringrec's own actually moves, per peer,
//! classified by the topology as inside this rank's host or across hosts ([`PeerCounter`]).
//!
//! What counts:
//! - **MPI point-to-point** (`ring`, and `hier`'s ring across hosts): the bytes of every
//!   send posted to a peer and of every receive posted from a peer.
//! - **Shared memory** (`shm`, and `hier` inside a host): *sent* = the bytes this rank
//!   wrote into its slots of the segment that another rank then reads, counted once per
//!   reading rank (a piece every peer reads counts once per peer, as a point-to-point
//!   sender would send it to each); *received* = the bytes this rank read from the other
//!   ranks' slots. Its own piece staged through its own slot counts in neither. Over the
//!   ranks of a host, sent and received therefore balance.
//! - **Not counted**: the 32-byte agreement headers (MPI's allgather on `ring` and `hier`,
//!   the arrival line on `shm`) and the control words of the shared-memory rounds: the
//!   counts are the collectives' payload.
//! - **Opaque**: a collective that runs MPI's own algorithm (`ring`'s allgatherv,
//!   broadcast and gatherv; `hier`'s across hosts and its gatherv) moves bytes this rank
//!   cannot see; once one ran, the counter is void ([`PeerCounter::traffic`] is `None`)
//!   and a caller falls back to the model ([`super::traffic::dense_model`]).
//!
//! Counting is a table look-up and two adds per message; it changes no data.

use super::traffic::Traffic;
use crate::topology::Topology;

/// Bytes sent to and received from the peers of one group, inside and across hosts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerCounter {
    /// Per group rank: true when it is on another host than this rank.
    elsewhere: Vec<bool>,
    intra_sent: u64,
    intra_received: u64,
    cross_sent: u64,
    cross_received: u64,
    /// Collectives run by an algorithm this rank cannot see.
    opaque: u64,
}

impl PeerCounter {
    /// A counter over a group whose rank `q` is on another host when `elsewhere[q]`.
    pub fn new(elsewhere: Vec<bool>) -> PeerCounter {
        PeerCounter { elsewhere, ..PeerCounter::default() }
    }

    /// A counter over the world of `topo` (group rank = world rank).
    pub fn world(topo: &Topology) -> PeerCounter {
        PeerCounter::new((0..topo.size).map(|r| topo.host_of_rank.get(r).is_some_and(|h| *h != topo.host_id)).collect())
    }

    /// A counter over `size` ranks of one host.
    pub fn one_host(size: usize) -> PeerCounter {
        PeerCounter::new(vec![false; size])
    }

    /// A counter over a group of one rank per host (every peer is elsewhere); `me` is
    /// this rank's place in it.
    pub fn one_per_host(size: usize, me: usize) -> PeerCounter {
        PeerCounter::new((0..size).map(|q| q != me).collect())
    }

    fn is_elsewhere(&self, peer: usize) -> bool {
        self.elsewhere.get(peer).copied().unwrap_or(false)
    }

    /// `bytes` sent to group rank `peer`.
    pub fn sent(&mut self, peer: usize, bytes: usize) {
        if self.is_elsewhere(peer) {
            self.cross_sent += bytes as u64;
        } else {
            self.intra_sent += bytes as u64;
        }
    }

    /// `bytes` received from group rank `peer`.
    pub fn received(&mut self, peer: usize, bytes: usize) {
        if self.is_elsewhere(peer) {
            self.cross_received += bytes as u64;
        } else {
            self.intra_received += bytes as u64;
        }
    }

    /// A collective whose algorithm this rank cannot see ran: the counts are void.
    pub fn opaque(&mut self) {
        self.opaque += 1;
    }

    /// The counts, or `None` once an opaque collective ran.
    pub fn traffic(&self) -> Option<Traffic> {
        (self.opaque == 0).then_some(Traffic {
            intra_sent: self.intra_sent as f64,
            intra_received: self.intra_received as f64,
            cross_sent: self.cross_sent as f64,
            cross_received: self.cross_received as f64,
        })
    }
}

/// The sum of two counts; `None` when either is.
pub fn sum(a: Option<Traffic>, b: Option<Traffic>) -> Option<Traffic> {
    let (mut a, b) = (a?, b?);
    a.add(b);
    Some(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_are_classified_by_host_and_opaque_voids() {
        // Ranks 0 1 | 2 3, seen from rank 1.
        let mut c = PeerCounter::new(vec![false, false, true, true]);
        c.sent(0, 10);
        c.sent(2, 7);
        c.received(3, 5);
        c.received(0, 1);
        c.received(9, 2); // outside the table: counted as the own host's
        assert_eq!(c.traffic(), Some(Traffic { intra_sent: 10.0, intra_received: 3.0, cross_sent: 7.0, cross_received: 5.0 }));
        let cross = PeerCounter::one_per_host(3, 1);
        assert_eq!(cross.elsewhere, [true, false, true]);
        assert_eq!(sum(c.traffic(), cross.traffic()), c.traffic());
        c.opaque();
        assert_eq!(c.traffic(), None);
        assert_eq!(sum(c.traffic(), cross.traffic()), None);
    }
}
