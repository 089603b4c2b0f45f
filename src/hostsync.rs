//! Waiting on the other ranks of a host without hanging: [`PeerWatch`] (a dead peer process
//! or a wait past `RINGREC_COMM_TIMEOUT_SECONDS` becomes an error, and the waiter is unusable
//! from then on) and [`HostBarrier`], the host barrier built on it.
//!
//! The barrier lives in a shared segment: an arrival counter and a generation word. The
//! last rank to arrive bumps the generation and wakes the others, who spin briefly and
//! then sleep on a futex on it, so a waiting rank gives its core to the ranks that still
//! work (more ranks than cores, a busy host). Every 100 ms a sleeper checks its peers.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::shm::SharedSegment;
use crate::stale::pid_alive;
use crate::topology::Topology;
use crate::{CommError, CommResult};

/// When a wait started, and how long this process had been stopped by then (see
/// [`crate::watchdog::stalled_total`]): time this process itself spends stopped is not
/// counted against the peers it waits for.
#[derive(Clone, Copy, Debug)]
pub struct WaitStart {
    at: Instant,
    stalled: Duration,
}

impl WaitStart {
    /// Now.
    pub fn now() -> WaitStart {
        WaitStart { at: Instant::now(), stalled: crate::watchdog::stalled_total() }
    }
    /// Time waited, less the time this process was stopped meanwhile.
    pub fn waited(&self) -> Duration {
        self.at.elapsed().saturating_sub(crate::watchdog::own_stall_since(self.stalled))
    }
    /// Wall time since the start.
    pub fn elapsed(&self) -> Duration {
        self.at.elapsed()
    }
}

/// Watches the peers a rank waits for: their processes and the deadline.
#[derive(Debug)]
pub struct PeerWatch {
    /// Process ids by local rank (0: not known yet).
    pub pids: Vec<i32>,
    /// World rank of each local rank (what errors name).
    world: Vec<usize>,
    timeout: Duration,
    poisoned: Option<String>,
}

impl PeerWatch {
    /// A watch of the local ranks of `topo` with deadline `RINGREC_COMM_TIMEOUT_SECONDS`.
    pub fn new(topo: &Topology) -> PeerWatch {
        let mut world: Vec<usize> = (0..topo.size).filter(|r| topo.host_of_rank[*r] == topo.host_id).collect();
        world.sort_by_key(|r| topo.local_rank_of_rank[*r]);
        PeerWatch { pids: vec![0; topo.local_size], world, timeout: topo.config.comm_timeout, poisoned: None }
    }

    /// An error once a wait failed: the waiter's state is unknown from then on.
    pub fn usable(&self) -> CommResult<()> {
        self.poisoned.as_ref().map_or(Ok(()), |p| Err(CommError::Poisoned(p.clone())))
    }

    /// Records `e` as the reason the waiter is unusable, and returns it.
    pub fn poison(&mut self, e: CommError) -> CommError {
        self.poisoned = Some(e.to_string());
        e
    }

    /// The error of a wait in `what` that started at `start` for the local ranks `late`:
    /// one of them died, or the deadline passed. Errors name world ranks.
    pub fn check(&mut self, what: &'static str, start: &WaitStart, late: &[usize]) -> CommResult<()> {
        let world = |q: usize| self.world.get(q).copied().unwrap_or(q);
        if let Some(q) = late.iter().copied().find(|q| self.pids[*q] > 0 && !pid_alive(self.pids[*q])) {
            return Err(self.poison(CommError::PeerDied { collective: what, rank: world(q), pid: self.pids[q] }));
        }
        if start.waited() > self.timeout {
            let ranks = late.iter().map(|q| world(*q)).collect();
            return Err(self.poison(CommError::Timeout { collective: what, seconds: self.timeout.as_secs_f64(), ranks }));
        }
        Ok(())
    }
}

/// A value on a cache line of its own.
#[repr(C, align(64))]
struct Padded<T>(T);

/// The start of the barrier's segment (all zero at creation); per local rank, its pid and
/// the last barrier it entered follow.
#[repr(C)]
struct Block {
    /// Arrivals, ever (wrapping).
    arrived: Padded<AtomicU32>,
    /// Barriers completed, ever (wrapping): the futex word.
    generation: Padded<AtomicU32>,
}

/// Spins before sleeping on the futex.
const SPINS: u32 = 256;

/// A barrier of the ranks of one host, with a deadline and dead-peer checks.
pub struct HostBarrier {
    seg: SharedSegment,
    round: u32,
    local_rank: usize,
    local_size: usize,
    what: &'static str,
    watch: PeerWatch,
}

impl HostBarrier {
    /// Maps the barrier `tag` of this host (collective over the host); its errors name
    /// `what`.
    pub fn new(topo: &Topology, tag: &str, what: &'static str) -> CommResult<HostBarrier> {
        let len = std::mem::size_of::<Block>() + 16 * topo.local_size;
        let seg = SharedSegment::on_host(&topo.local, &topo.segment_path(tag), len.div_ceil(4096) * 4096)?;
        let mut b = HostBarrier { seg, round: 0, local_rank: topo.local_rank, local_size: topo.local_size, what, watch: PeerWatch::new(topo) };
        b.word(b.local_rank, 0).store(u64::from(std::process::id()), Ordering::Release);
        b.wait()?;
        for q in 0..b.local_size {
            b.watch.pids[q] = b.word(q, 0).load(Ordering::Acquire) as i32;
        }
        Ok(b)
    }

    fn block(&self) -> &Block {
        // SAFETY: the segment starts with a zero-initialised `Block` (page aligned, so
        // 64-byte aligned); all-zero bytes are valid atomics.
        unsafe { &*(self.seg.as_ptr() as *const Block) }
    }

    /// Word `w` of local rank `q` (0: pid, 1: the last barrier it entered).
    fn word(&self, q: usize, w: usize) -> &AtomicU64 {
        debug_assert!(q < self.local_size && w < 2);
        // SAFETY: after the block, inside the segment (sized for `local_size` pairs),
        // 8-byte aligned, zero-initialised: a valid atomic.
        unsafe { &*(self.seg.as_ptr().add(std::mem::size_of::<Block>() + 16 * q + 8 * w) as *const AtomicU64) }
    }

    /// Returns once every local rank has entered it (the `n`-th call on every rank).
    pub fn wait(&mut self) -> CommResult<()> {
        self.watch.usable()?;
        let target = self.round.wrapping_add(1);
        self.word(self.local_rank, 1).store(u64::from(target), Ordering::Release);
        // The last of the `local_size` arrivals of this barrier completes it (an earlier one
        // of them cannot match: it is short of a multiple of `local_size`).
        let arrived = self.block().arrived.0.fetch_add(1, Ordering::AcqRel).wrapping_add(1);
        if arrived == target.wrapping_mul(self.local_size as u32) {
            let word = &self.block().generation.0;
            word.store(target, Ordering::Release);
            futex_wake(word);
        } else {
            self.wait_for(target)?;
        }
        self.round = target;
        Ok(())
    }

    /// Sleeps until the generation reaches `target`.
    fn wait_for(&mut self, target: u32) -> CommResult<()> {
        let start = WaitStart::now();
        let mut spins = 0u32;
        loop {
            let now = self.block().generation.0.load(Ordering::Acquire);
            if now == target {
                return Ok(());
            }
            if spins < SPINS {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            futex_wait(&self.block().generation.0, now, Duration::from_millis(100));
            if start.elapsed() > Duration::from_millis(100) {
                // Late: the ranks that have not entered this barrier (rounds wrap).
                let late: Vec<usize> = (0..self.local_size).filter(|q| ((self.word(*q, 1).load(Ordering::Acquire) as u32).wrapping_sub(target) as i32) < 0).collect();
                self.watch.check(self.what, &start, &late)?;
            }
        }
    }
}

/// Sleeps while `word` holds `expected`, at most `timeout` (or until woken).
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as libc::c_long };
    // SAFETY: `word` is a live, aligned u32 (in memory shared between processes, hence no
    // FUTEX_PRIVATE_FLAG); FUTEX_WAIT only reads it and `ts` outlives the call.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, &ts as *const libc::timespec) };
}

/// Wakes every process sleeping on `word`.
fn futex_wake(word: &AtomicU32) {
    // SAFETY: `word` is a live, aligned u32; FUTEX_WAKE does not touch memory.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX) };
}
