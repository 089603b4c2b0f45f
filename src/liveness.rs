//! The watchdog's thread (see [`crate::watchdog`] for what it does and the registry of
//! waits it reads): one per process, started by [`crate::topology::Topology::init`]. Each
//! tick it beats this rank's heartbeat in the host's shared segment and reads the others',
//! answers liveness pings, passes on notices, and ends the job when a registered wait
//! outlasts `RINGREC_COMM_TIMEOUT_SECONDS`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mpi::datatype::Equivalence;
use mpi::point_to_point::{Destination, Source, Status};
use mpi::request::{Request, StaticScope};
use mpi::topology::{Communicator, SimpleCommunicator};

use crate::group::Group;
use crate::shm::SharedSegment;
use crate::stale::pid_alive;
use crate::watchdog::{end_job, known_trouble, note_stall, overdue, remember};

/// Tick of the watchdog thread.
const TICK: Duration = Duration::from_millis(100);
/// A local peer whose heartbeat is older than this (or half the comm timeout, if less) is
/// reported as not running.
const STALE: Duration = Duration::from_secs(3);
/// How long a liveness probe waits for the answers.
const PROBE_WAIT: Duration = Duration::from_secs(3);
/// Tags of the liveness protocol.
const PING: i32 = 0x5049;
const PONG: i32 = 0x504f;
/// Tag of a notice: one byte of level (1 stopped, 2 exited), then UTF-8 text.
const NOTICE: i32 = 0x4e4f;
/// Largest notice in bytes.
const NOTICE_BYTES: usize = 512;

/// Seconds of CLOCK_MONOTONIC (the same clock for every process of a machine).
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Per local rank in the heartbeat segment: its pid and its last tick.
#[repr(C, align(64))]
struct Beat {
    pid: AtomicU64,
    tick_ns: AtomicU64,
}

/// Where a rank is, for the watchdog thread.
struct Setup {
    rank: usize,
    local_rank: usize,
    /// World rank of every local rank.
    local_world: Vec<usize>,
    timeout: Duration,
    live: SimpleCommunicator,
    beats: Option<SharedSegment>,
}

// SAFETY: a `Setup` is moved, whole, into the watchdog thread, which alone uses it from
// then on: its communicator (a duplicate of the world's, the watchdog's own) is an MPI
// handle, usable from any thread at MPI_THREAD_MULTIPLE (which `Topology::init` asks for),
// and its heartbeat segment is a mapping of shared memory read and written with atomics.
unsafe impl Send for Setup {}

/// The watchdog of this process (see the module docs); stops when dropped.
pub struct Watchdog {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    /// Starts the watchdog (collective over the world: it duplicates the world
    /// communicator for its pings and maps its host's heartbeat segment).
    pub fn start(topo_world: &SimpleCommunicator, local: &Group, heartbeat: &std::path::Path, local_world: Vec<usize>, timeout: Duration) -> Watchdog {
        let live = topo_world.duplicate();
        let beats = SharedSegment::on_host(local, heartbeat, local_world.len() * std::mem::size_of::<Beat>()).ok();
        let setup = Setup { rank: topo_world.rank() as usize, local_rank: local.rank(), local_world, timeout, live, beats };
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("ringrec-watchdog".into())
            .spawn(move || run(setup, flag))
            .ok();
        Watchdog { stop, thread }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A request of the liveness protocol.
type Pending = Request<'static, [u8], StaticScope>;

/// The liveness protocol's requests (their buffers are 'static: a request may be
/// abandoned when the process ends the job).
struct Live {
    comm: SimpleCommunicator,
    /// The standing receive of pings (from any rank).
    ping: Option<Pending>,
    ping_buf: &'static mut [u8],
    /// The standing receive of notices (from any rank).
    notice: Option<Pending>,
    notice_buf: &'static mut [u8],
    /// Answers and probes in flight.
    sends: Vec<Pending>,
    probe: u64,
}

fn leak(v: u64) -> &'static [u8] {
    Box::leak(Box::new(v.to_le_bytes()))
}

impl Live {
    fn new(comm: SimpleCommunicator) -> Live {
        let ping_buf: &'static mut [u8] = Box::leak(Box::new([0u8; 8]));
        let notice_buf: &'static mut [u8] = Box::leak(Box::new([0u8; NOTICE_BYTES]));
        Live { comm, ping: None, ping_buf, notice: None, notice_buf, sends: Vec::new(), probe: 0 }
    }

    /// Sends a notice (level, text) to every other rank.
    fn tell_all(&mut self, level: u8, text: &str) {
        let (me, size) = (self.comm.rank(), self.comm.size());
        let mut msg = vec![level];
        msg.extend(text.bytes().take(NOTICE_BYTES - 1));
        let msg: &'static [u8] = Box::leak(msg.into_boxed_slice());
        for r in (0..size).filter(|r| *r != me) {
            self.sends.push(self.comm.process_at_rank(r).immediate_send_with_tag(StaticScope, msg, NOTICE));
        }
    }

    /// Notices that arrived: (sender, level, text).
    fn notices(&mut self) -> Vec<(usize, u8, String)> {
        let mut out = Vec::new();
        loop {
            let req = match self.notice.take() {
                Some(r) => r,
                None => {
                    // SAFETY of the aliasing: as for the ping buffer.
                    let buf: &'static mut [u8] = unsafe { std::slice::from_raw_parts_mut(self.notice_buf.as_mut_ptr(), NOTICE_BYTES) };
                    self.comm.any_process().immediate_receive_into_with_tag(StaticScope, buf, NOTICE)
                }
            };
            match req.test() {
                Ok(status) => {
                    let n = (status.count(u8::equivalent_datatype()).max(1) as usize).min(NOTICE_BYTES);
                    out.push((status.source_rank() as usize, self.notice_buf[0], String::from_utf8_lossy(&self.notice_buf[1..n]).into_owned()));
                }
                Err(pending) => {
                    self.notice = Some(pending);
                    break;
                }
            }
        }
        out
    }

    /// Answers pings that arrived; retires finished sends.
    fn serve(&mut self) {
        loop {
            let req = match self.ping.take() {
                Some(r) => r,
                None => {
                    // SAFETY of the aliasing: the buffer is only read after the receive
                    // that writes it completed, and re-armed after that.
                    let buf: &'static mut [u8] = unsafe { std::slice::from_raw_parts_mut(self.ping_buf.as_mut_ptr(), 8) };
                    self.comm.any_process().immediate_receive_into_with_tag(StaticScope, buf, PING)
                }
            };
            match req.test() {
                Ok(status) => self.pong(status, u64::from_le_bytes(self.ping_buf[..8].try_into().unwrap_or([0; 8]))),
                Err(pending) => {
                    self.ping = Some(pending);
                    break;
                }
            }
        }
        let mut keep = Vec::with_capacity(self.sends.len());
        for s in self.sends.drain(..) {
            if let Err(pending) = s.test() {
                keep.push(pending);
            }
        }
        self.sends = keep;
    }

    fn pong(&mut self, status: Status, probe: u64) {
        let to = status.source_rank();
        let req = self.comm.process_at_rank(to).immediate_send_with_tag(StaticScope, leak(probe), PONG);
        self.sends.push(req);
    }

    /// Pings every other rank and waits up to [`PROBE_WAIT`] (answering pings meanwhile):
    /// the ranks that did not answer.
    fn probe(&mut self) -> Vec<usize> {
        self.probe += 1;
        let (me, size) = (self.comm.rank() as usize, self.comm.size() as usize);
        let mut waiting: Vec<(usize, Option<Pending>)> = Vec::new();
        for r in (0..size).filter(|r| *r != me) {
            self.sends.push(self.comm.process_at_rank(r as i32).immediate_send_with_tag(StaticScope, leak(self.probe), PING));
            let buf: &'static mut [u8] = Box::leak(Box::new([0u8; 8]));
            let req = self.comm.process_at_rank(r as i32).immediate_receive_into_with_tag(StaticScope, buf, PONG);
            waiting.push((r, Some(req)));
        }
        let start = Instant::now();
        while start.elapsed() < PROBE_WAIT && waiting.iter().any(|w| w.1.is_some()) {
            self.serve();
            for (_, slot) in waiting.iter_mut() {
                if let Some(req) = slot.take() {
                    if let Err(pending) = req.test() {
                        *slot = Some(pending);
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let missing: Vec<usize> = waiting.iter().filter(|w| w.1.is_some()).map(|w| w.0).collect();
        for (_, slot) in waiting.iter_mut() {
            if let Some(req) = slot.take() {
                // SAFETY: the receive buffer is 'static (leaked); the request is abandoned.
                let _ = unsafe { req.into_raw() };
            }
        }
        missing
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        // Requests still in flight are abandoned: their buffers are 'static.
        for r in [self.ping.take(), self.notice.take()].into_iter().flatten() {
            r.cancel();
            // SAFETY: cancelled; the buffer is 'static.
            let _ = unsafe { r.into_raw() };
        }
        for s in self.sends.drain(..) {
            // SAFETY: the buffer is 'static; the send completes or not on its own.
            let _ = unsafe { s.into_raw() };
        }
    }
}

/// What a notice says: level (1 stopped, 2 exited) and text.
type Notice = (u8, String);

/// The heartbeat view of the host: local ranks not running or gone (world rank, what),
/// and what is newly worse since the last look (level, what), for the notices.
fn local_trouble(s: &Setup, reported: &mut [u8]) -> (Vec<(usize, String)>, Vec<Notice>) {
    let Some(seg) = &s.beats else { return (Vec::new(), Vec::new()) };
    let mut new = Vec::new();
    let beats = seg.as_ptr() as *const Beat;
    let now = monotonic_ns();
    let mut out = Vec::new();
    for (l, &world) in s.local_world.iter().enumerate() {
        // SAFETY: the segment holds one zero-initialised Beat per local rank (its length
        // was computed from `local_world`); all-zero bytes are valid atomics.
        let b = unsafe { &*beats.add(l) };
        if l == s.local_rank {
            b.pid.store(std::process::id() as u64, Ordering::Relaxed);
            b.tick_ns.store(now, Ordering::Relaxed);
            continue;
        }
        let (pid, tick) = (b.pid.load(Ordering::Relaxed), b.tick_ns.load(Ordering::Relaxed));
        if pid == 0 {
            continue;
        }
        let state = if !pid_alive(pid as i32) {
            Some((2u8, format!("rank {world} (pid {pid}) on this host has exited")))
        } else if tick > 0 && now.saturating_sub(tick) > STALE.min(s.timeout / 2).max(TICK * 5).as_nanos() as u64 {
            Some((1u8, format!("rank {world} (pid {pid}) on this host has not run for {:.0}s (stopped, e.g. SIGSTOP, or swapped out)", now.saturating_sub(tick) as f64 / 1e9)))
        } else {
            None
        };
        match state {
            Some((level, msg)) => {
                if reported[l] < level {
                    reported[l] = level;
                    crate::eprint_line(&format!("ringrec rank {}: warning: {msg}", s.rank));
                    remember(&msg);
                    new.push((level, msg.replace("on this host", &format!("on the host of rank {}", s.rank))));
                }
                out.push((world, msg));
            }
            None => {
                if reported[l] == 1 {
                    crate::eprint_line(&format!("ringrec rank {}: rank {world} on this host runs again", s.rank));
                }
                reported[l] = 0;
            }
        }
    }
    (out, new)
}

fn run(mut s: Setup, stop: Arc<AtomicBool>) {
    let comm = std::mem::replace(&mut s.live, SimpleCommunicator::self_comm());
    let mut live = Live::new(comm);
    let mut reported = vec![0u8; s.local_world.len()];
    let mut last = Instant::now();
    let mut cleared_until: Option<Instant> = None;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(TICK);
        let now = Instant::now();
        let gap = now.duration_since(last);
        last = now;
        if gap > TICK * 20 {
            // This process was stopped: that time does not count against the peers.
            let stalled = gap - TICK;
            note_stall(stalled, now);
        }
        live.serve();
        let (trouble, new) = local_trouble(&s, &mut reported);
        for (level, msg) in &new {
            live.tell_all(*level, msg);
        }
        for (from, level, msg) in live.notices() {
            if msg.starts_with(&format!("rank {} ", s.rank)) {
                // About this very rank, which was stopped and runs again.
                continue;
            }
            remember(&msg);
            if level >= 2 {
                // A rank is gone: the job cannot go on; say so here too, naming it.
                crate::eprint_line(&format!("ringrec rank {}: error: {msg} (reported by rank {from}); the job cannot continue, look at that rank's output for the cause; ending the job", s.rank));
                end_job(&live.comm, 1);
            }
            crate::eprint_line(&format!("ringrec rank {}: warning: {msg} (reported by rank {from})", s.rank));
        }
        let Some((what, age, strict)) = overdue(s.timeout) else { continue };
        if cleared_until.is_some_and(|t| now < t) {
            continue;
        }
        let mut silent = live.probe();
        for (world, _) in &trouble {
            if !silent.contains(world) {
                silent.push(*world);
            }
        }
        silent.sort_unstable();
        if silent.is_empty() && !strict {
            // Everybody answers: the peer is working; look again after another timeout.
            cleared_until = Some(now + s.timeout);
            continue;
        }
        let why = if silent.is_empty() {
            let known = known_trouble();
            let seen = if known.is_empty() { String::new() } else { format!(" (earlier: {})", known.join("; ")) };
            format!("every rank answers, so they wait for different things: check that every rank runs the same command with the same settings{seen}")
        } else {
            let mut details: Vec<String> = trouble.iter().map(|t| t.1.clone()).collect();
            for k in known_trouble() {
                if !details.contains(&k) {
                    details.push(k);
                }
            }
            let extra = if details.is_empty() { String::new() } else { format!(" ({})", details.join("; ")) };
            format!("rank(s) {silent:?} do not answer (stopped, dead or unreachable){extra}")
        };
        crate::eprint_line(&format!(
            "ringrec rank {}: error: {what} has waited {:.0}s (RINGREC_COMM_TIMEOUT_SECONDS={}): {why}; ending the job",
            s.rank,
            age.as_secs_f64(),
            s.timeout.as_secs()
        ));
        use std::io::Write;
        let _ = std::io::stderr().flush();
        let _ = std::io::stdout().flush();
        // The other waiting ranks reach the same verdict within a tick or two: give them
        // the time to print theirs before the abort ends every process.
        std::thread::sleep(Duration::from_secs(1));
        end_job(&live.comm, 1);
    }
}
