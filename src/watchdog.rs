//! The job's watchdog: no rank waits forever for another.
//!
//! MPI's blocking calls have no deadline, and a rank that is stopped (SIGSTOP, swapped
//! out, a hung GPU) or dead under a launcher that does not kill the others would leave
//! them waiting forever. Every wait on other ranks is registered while it lasts
//! ([`waiting`], a guard: one uncontended lock), and a background thread per process
//! ([`Watchdog::start`], from [`crate::topology::Topology::init`]):
//! - beats a heartbeat in a segment shared by the ranks of its host every 100 ms and
//!   reads the others': a local rank that stopped running or exited is reported within
//!   seconds, even when no collective is in flight;
//! - answers liveness pings from other ranks (on a communicator of its own);
//! - tells every other rank at once what its heartbeat found (a *notice*): a rank that
//!   exited ends the job on every rank with a message naming it; a stopped one is named
//!   in every rank's message should a wait then time out ([`known_trouble`]);
//! - when a registered wait outlasts `RINGREC_COMM_TIMEOUT_SECONDS`, pings every rank and
//!   waits a few seconds for the answers: the ranks that do not answer are stopped, dead
//!   or unreachable. It prints one line naming them (or, when every rank answers, that the
//!   ranks wait for different things: they made different calls), waits a second so the
//!   other ranks can print theirs, and ends the job with `MPI_Abort`. A wait registered
//!   with [`waiting_on_work`] (a peer that may legitimately be busy, e.g. preparing a data
//!   cache) is only ended that way when some rank does not answer.
//!
//! Time this process itself spent stopped does not count against its peers: a gap in the
//! watchdog's own ticks is added to every wait that spans it ([`own_stall_since`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mpi::datatype::Equivalence;
use mpi::point_to_point::{Destination, Source, Status};
use mpi::request::{Request, StaticScope};
use mpi::topology::{Communicator, SimpleCommunicator};

use crate::engine::controller::AssertSend;
use crate::hostsync::pid_alive;
use crate::shm::SharedSegment;

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

/// What the heartbeats of this and other hosts found wrong so far, newest last (for
/// error messages: [`known_trouble`]).
static TROUBLE: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// What the watchdogs found wrong with other ranks so far (a stopped or exited rank,
/// as this host's heartbeat or another host's notice said), for error messages: a rank
/// that timed out waiting for one peer may be stuck behind another.
pub fn known_trouble() -> Vec<String> {
    TROUBLE.lock().map(|t| t.clone()).unwrap_or_default()
}

fn remember(msg: &str) {
    if let Ok(mut t) = TROUBLE.lock() {
        if !t.iter().any(|m| m == msg) {
            t.push(msg.to_string());
        }
    }
}

/// A registered wait.
struct Wait {
    id: u64,
    what: &'static str,
    since: Instant,
    strict: bool,
}

static ACTIVE: Mutex<Vec<Wait>> = Mutex::new(Vec::new());
static NEXT: AtomicU64 = AtomicU64::new(1);
/// Nanoseconds this process spent stopped (gaps in the watchdog's ticks), ever.
static STALLED_NS: AtomicU64 = AtomicU64::new(0);

/// A wait on other ranks, registered while it lives (see the module docs).
#[must_use = "the wait is registered only while the guard lives"]
pub struct WaitGuard {
    id: u64,
}

fn register(what: &'static str, strict: bool) -> WaitGuard {
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    if let Ok(mut a) = ACTIVE.lock() {
        a.push(Wait { id, what, since: Instant::now(), strict });
    }
    WaitGuard { id }
}

/// Registers a wait on other ranks (a collective, a barrier, a handshake): past the
/// deadline the job is ended with a message (see the module docs).
pub fn waiting(what: &'static str) -> WaitGuard {
    register(what, true)
}

/// Registers a wait for a peer that may be busy for long (preparing a data cache, say):
/// past the deadline the job is ended only when some rank no longer answers.
pub fn waiting_on_work(what: &'static str) -> WaitGuard {
    register(what, false)
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        if let Ok(mut a) = ACTIVE.lock() {
            if let Some(i) = a.iter().position(|w| w.id == self.id) {
                a.swap_remove(i);
            }
        }
    }
}

/// Total time this process was stopped (not scheduled for whole seconds), ever; the
/// difference of two readings is the stall between them.
pub fn stalled_total() -> Duration {
    Duration::from_nanos(STALLED_NS.load(Ordering::Relaxed))
}

/// How long this process was stopped since `before` (a [`stalled_total`] reading).
pub fn own_stall_since(before: Duration) -> Duration {
    stalled_total().saturating_sub(before)
}

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

/// The watchdog of this process (see the module docs); stops when dropped.
pub struct Watchdog {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    /// Starts the watchdog (collective over the world: it duplicates the world
    /// communicator for its pings and maps its host's heartbeat segment).
    pub fn start(topo_world: &SimpleCommunicator, local: &crate::topology::Group, heartbeat: &std::path::Path, local_world: Vec<usize>, timeout: Duration) -> Watchdog {
        let live = topo_world.duplicate();
        let beats = SharedSegment::on_host(local, heartbeat, local_world.len() * std::mem::size_of::<Beat>()).ok();
        let setup = AssertSend(Setup { rank: topo_world.rank() as usize, local_rank: local.rank(), local_world, timeout, live, beats });
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("ringrec-watchdog".into())
            .spawn(move || {
                let setup = setup;
                run(setup.0, flag)
            })
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
            STALLED_NS.fetch_add(stalled.as_nanos() as u64, Ordering::Relaxed);
            if let Ok(mut a) = ACTIVE.lock() {
                for w in a.iter_mut() {
                    w.since += stalled.min(now.duration_since(w.since));
                }
            }
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
        let overdue = ACTIVE.lock().ok().and_then(|a| a.iter().filter(|w| w.since.elapsed() > s.timeout).min_by_key(|w| w.since).map(|w| (w.what, w.since.elapsed(), w.strict)));
        let Some((what, age, strict)) = overdue else { continue };
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

/// Ends this process with `code`, asking MPI to end the whole job too (`MPI_Abort` on a
/// helper thread: with a stopped peer Open MPI may not return from it, so the process
/// exits on its own two seconds later whatever MPI does).
pub fn end_job(comm: &SimpleCommunicator, code: i32) -> ! {
    use mpi::raw::AsRaw;
    use std::io::Write;
    let _ = std::io::stderr().flush();
    let _ = std::io::stdout().flush();
    let raw = AssertSend(comm.as_raw());
    let _ = std::thread::Builder::new().name("ringrec-abort".into()).spawn(move || {
        let raw = raw;
        // SAFETY: the communicator handle stays valid: MPI is not finalised on this path
        // (the process ends by _exit below).
        unsafe { mpi::ffi::MPI_Abort(raw.0, code) };
    });
    std::thread::sleep(Duration::from_secs(2));
    // SAFETY: _exit ends the process at once (no destructors, no MPI_Finalize): what a rank
    // that gives up on its peers must do.
    unsafe { libc::_exit(code) }
}
