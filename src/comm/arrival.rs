//! [`Arrivals`]: which ranks reached a point of the program, known without blocking — for
//! waits that have no deadline of their own. NCCL's `ncclCommInitRank`, for one, waits
//! for every rank to join and never gives up; a rank that died or hangs before it leaves
//! the others there forever. Each rank announces its arrival to every other rank with
//! non-blocking sends just before such a call, and polls for the others' announcements
//! while it waits, so that past the deadline it can stop and say which ranks never came.

use std::time::{Duration, Instant};

use mpi::point_to_point::{Destination, Source};
use mpi::request::{Request, StaticScope};
use mpi::topology::Communicator;

use crate::topology::Group;

/// A pending announcement (to or from another rank).
type Pending = Request<'static, [u8], StaticScope>;

/// Arrival announcements of one point, sent to and expected from every other rank of a
/// group (see the module docs).
pub struct Arrivals {
    group: Group,
    sends: Vec<Pending>,
    /// Per other rank: its announcement, until it arrived.
    recvs: Vec<(usize, Option<Pending>)>,
}

impl Arrivals {
    /// Announces this rank's arrival to every other rank of `group` (a private duplicate,
    /// used for nothing else) and starts listening for theirs. Returns at once.
    pub fn announce(group: Group) -> Arrivals {
        let me = group.rank();
        let peers: Vec<usize> = (0..group.size()).filter(|r| *r != me).collect();
        // 'static buffers: a request abandoned on the failure path may outlive this value.
        let token: &'static [u8] = Box::leak(Box::new([1u8]));
        let inbox: &'static mut [u8] = Box::leak(vec![0u8; peers.len()].into_boxed_slice());
        let sends = peers.iter().map(|p| group.comm.process_at_rank(*p as i32).immediate_send(StaticScope, token)).collect();
        let recvs = peers.iter().zip(inbox.chunks_mut(1)).map(|(p, b)| (*p, Some(group.comm.process_at_rank(*p as i32).immediate_receive_into(StaticScope, b)))).collect();
        Arrivals { group, sends, recvs }
    }

    /// The ranks whose announcement has not arrived yet (progresses MPI).
    pub fn missing(&mut self) -> Vec<usize> {
        for (_, slot) in self.recvs.iter_mut() {
            if let Some(req) = slot.take() {
                if let Err(pending) = req.test() {
                    *slot = Some(pending);
                }
            }
        }
        self.recvs.iter().filter(|(_, r)| r.is_some()).map(|(p, _)| *p).collect()
    }

    /// Waits until `done` holds, polling every millisecond; past `timeout`, the ranks
    /// that never announced their arrival (empty when all came and `done` still did not
    /// happen).
    pub fn wait_until(&mut self, timeout: Duration, mut done: impl FnMut() -> bool) -> Result<(), Vec<usize>> {
        let start = Instant::now();
        loop {
            if done() {
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(self.missing());
            }
            let _ = self.missing();
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Waits until every rank has announced its arrival (a barrier with a deadline); past
    /// `timeout`, the ranks that never did.
    pub fn wait_all(&mut self, timeout: Duration) -> Result<(), Vec<usize>> {
        let start = Instant::now();
        loop {
            let missing = self.missing();
            if missing.is_empty() {
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(missing);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Completes every announcement (every rank arrived: the point was passed everywhere).
    pub fn finish(mut self) {
        for req in self.sends.drain(..) {
            req.wait();
        }
        for (_, slot) in self.recvs.iter_mut() {
            if let Some(req) = slot.take() {
                req.wait();
            }
        }
    }

    /// The group the announcements travel in.
    pub fn group(&self) -> &Group {
        &self.group
    }
}

impl Drop for Arrivals {
    fn drop(&mut self) {
        // Requests still pending here belong to a failure (a peer never came): they are
        // abandoned, not waited for — their buffers are 'static, and the process is about
        // to report the failure and exit.
        for req in self.sends.drain(..) {
            // SAFETY: the send buffer is 'static, so MPI may still read it after this.
            let _ = unsafe { req.into_raw() };
        }
        for (_, slot) in self.recvs.iter_mut() {
            if let Some(req) = slot.take() {
                // SAFETY: the receive buffer is 'static, so MPI may still write it.
                let _ = unsafe { req.into_raw() };
            }
        }
    }
}
