//! The job's watchdog: no rank waits forever for another.
//!
//! MPI's blocking calls have no deadline, and a rank that is stopped (SIGSTOP, swapped
//! out, a hung GPU) or dead under a launcher that does not kill the others would leave
//! them waiting forever. Every wait on other ranks is registered here while it lasts
//! ([`waiting`], a guard: one uncontended lock), and a background thread per process
//! (`liveness.rs`, started by [`crate::topology::Topology::init`]):
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
//!   other ranks can print theirs, and ends the job with `MPI_Abort` ([`end_job`]). A wait
//!   registered with [`waiting_on_work`] (a peer that may legitimately be busy, e.g.
//!   preparing a data cache) is only ended that way when some rank does not answer.
//!
//! Time this process itself spent stopped does not count against its peers: a gap in the
//! watchdog's own ticks is added to every wait that spans it ([`own_stall_since`]).
//!
//! This module is the registry every layer calls (it uses no other module, so the shared
//! segments and the host barrier can register their waits); the thread, which maps a
//! shared segment itself, sits above them in `liveness.rs`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use mpi::topology::SimpleCommunicator;

/// What the heartbeats of this and other hosts found wrong so far, newest last (for
/// error messages: [`known_trouble`]).
static TROUBLE: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// What the watchdogs found wrong with other ranks so far (a stopped or exited rank,
/// as this host's heartbeat or another host's notice said), for error messages: a rank
/// that timed out waiting for one peer may be stuck behind another.
pub fn known_trouble() -> Vec<String> {
    TROUBLE.lock().map(|t| t.clone()).unwrap_or_default()
}

/// Adds `msg` to what [`known_trouble`] returns (once).
pub(crate) fn remember(msg: &str) {
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

/// Records that this process was stopped for `stalled` (a gap in the watchdog's ticks
/// ending at `now`): added to the stall total and to every wait that spans it.
pub(crate) fn note_stall(stalled: Duration, now: Instant) {
    STALLED_NS.fetch_add(stalled.as_nanos() as u64, Ordering::Relaxed);
    if let Ok(mut a) = ACTIVE.lock() {
        for w in a.iter_mut() {
            w.since += stalled.min(now.duration_since(w.since));
        }
    }
}

/// The oldest registered wait older than `timeout`: what it waits for, for how long, and
/// whether it is strict ([`waiting`]) rather than on work ([`waiting_on_work`]).
pub(crate) fn overdue(timeout: Duration) -> Option<(&'static str, Duration, bool)> {
    ACTIVE.lock().ok().and_then(|a| a.iter().filter(|w| w.since.elapsed() > timeout).min_by_key(|w| w.since).map(|w| (w.what, w.since.elapsed(), w.strict)))
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

/// Ends this process with `code`, asking MPI to end the whole job too (`MPI_Abort` on a
/// helper thread: with a stopped peer Open MPI may not return from it, so the process
/// exits on its own two seconds later whatever MPI does).
pub fn end_job(comm: &SimpleCommunicator, code: i32) -> ! {
    use mpi::raw::AsRaw;
    use std::io::Write;
    let _ = std::io::stderr().flush();
    let _ = std::io::stdout().flush();
    // A segment whose set-up waited for the rank that failed still has its name: remove it
    // now, before MPI_Abort can end this process (nothing is left in /dev/shm).
    crate::signals::unlink_tracked();
    let raw = AbortHandle(comm.as_raw());
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

/// The raw handle of the communicator `MPI_Abort` is called on, for the helper thread of
/// [`end_job`].
struct AbortHandle(mpi::ffi::MPI_Comm);

// SAFETY: an MPI handle is a value that names the same communicator in every thread of the
// process (Open MPI's is a pointer, hence not `Send` by default); MPI runs at
// MPI_THREAD_MULTIPLE, and the only call made with it, `MPI_Abort`, may come from any thread.
unsafe impl Send for AbortHandle {}
