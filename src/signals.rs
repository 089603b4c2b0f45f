//! Graceful stop on SIGTERM and SIGINT (Slurm preemption, Kubernetes eviction, Ctrl-C),
//! and on SIGUSR1: Open MPI's mpirun does not pass SIGTERM on to the ranks, but it does
//! forward SIGUSR1 (`ringrec launch` turns a SIGTERM/SIGINT it receives into one; with a
//! bare mpirun, `kill -USR1 <mpirun>`; Slurm: `sbatch --signal=USR1@120`).
//!
//! [`install`] sets a handler that only records the first signal ([`requested`]): the
//! trainer checks it every `SIGNAL_CHECK_EVERY` steps, the ranks agree to stop after the same step,
//! write a checkpoint when asked to and end with status 128 + signal. A second signal
//! ends the process at once (`_exit`), after unlinking the shared segments whose names
//! still exist ([`track`]: only during their short set-up), so /dev/shm stays clean.
//! Everything the handler does is async-signal-safe: atomics, `unlink`, `write`, `_exit`.

use std::ffi::CString;
use std::sync::atomic::{AtomicI32, AtomicPtr, Ordering};

/// The first signal received (0: none).
static FIRST: AtomicI32 = AtomicI32::new(0);
/// Signals received, when installed in counting mode ([`install_counting`]).
static COUNT: AtomicI32 = AtomicI32::new(0);
/// The last signal received in counting mode.
static LAST: AtomicI32 = AtomicI32::new(0);
/// Names of segments that exist on disk right now (NUL-terminated, leaked), for the
/// handler to unlink on a second signal.
const SLOTS: usize = 64;
static TRACKED: [AtomicPtr<libc::c_char>; SLOTS] = [const { AtomicPtr::new(std::ptr::null_mut()) }; SLOTS];

extern "C" fn on_signal(sig: libc::c_int) {
    if FIRST.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
        let msg = b"ringrec: signal received: stopping after the current step (again to stop at once)\n";
        // SAFETY: write(2) on stderr with a valid buffer is async-signal-safe.
        unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
        return;
    }
    unlink_tracked();
    // SAFETY: _exit is async-signal-safe and ends the process at once.
    unsafe { libc::_exit(128 + sig) };
}

/// Unlinks every segment name still tracked ([`track`]), for a process about to end at once
/// without running destructors: the second signal's handler, and a rank that gives up on
/// its peers ([`crate::watchdog::end_job`]) while a segment's set-up waits for a local rank
/// that stopped or died. Async-signal-safe (atomics and `unlink`).
pub fn unlink_tracked() {
    for slot in TRACKED.iter() {
        let p = slot.swap(std::ptr::null_mut(), Ordering::SeqCst);
        if !p.is_null() {
            // SAFETY: `p` is a leaked NUL-terminated path (see `track`); unlink is
            // async-signal-safe.
            unsafe { libc::unlink(p) };
        }
    }
}

extern "C" fn count_signal(sig: libc::c_int) {
    LAST.store(sig, Ordering::SeqCst);
    COUNT.fetch_add(1, Ordering::SeqCst);
}

fn set_handler(sigs: &[i32], handler: extern "C" fn(libc::c_int)) {
    for &sig in sigs {
        // SAFETY: a zeroed sigaction with a plain handler, an empty mask and SA_RESTART
        // is valid; the handlers only do async-signal-safe things.
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = handler as *const () as usize;
            act.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(sig, &act, std::ptr::null_mut());
        }
    }
}

/// For a process that supervises others (`ringrec launch`): SIGTERM and SIGINT are only
/// counted ([`received`]), the supervisor decides what to do.
pub fn install_counting() {
    set_handler(&[libc::SIGTERM, libc::SIGINT], count_signal);
}

/// (signals received, the last one) since [`install_counting`].
pub fn received() -> (i32, i32) {
    (COUNT.load(Ordering::SeqCst), LAST.load(Ordering::SeqCst))
}

/// Installs the handler for SIGTERM, SIGINT and SIGUSR1 (once per process, after MPI
/// started; the binary does it).
pub fn install() {
    set_handler(&[libc::SIGTERM, libc::SIGINT, libc::SIGUSR1], on_signal);
}

/// The first SIGTERM/SIGINT received since [`install`], if any.
pub fn requested() -> Option<i32> {
    match FIRST.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// The signal's name.
pub fn name(sig: i32) -> &'static str {
    match sig {
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGUSR1 => "SIGUSR1",
        _ => "a signal",
    }
}

/// A segment name the handler unlinks on a second signal while this guard lives (from
/// its creation until it is unlinked by the normal path).
#[derive(Debug)]
pub struct Tracked(usize);

/// Tracks `path` (see [`Tracked`]); `None` when every slot is taken.
pub fn track(path: &std::path::Path) -> Option<Tracked> {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    let p = c.into_raw();
    for (i, slot) in TRACKED.iter().enumerate() {
        if slot.compare_exchange(std::ptr::null_mut(), p, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            return Some(Tracked(i));
        }
    }
    // SAFETY: `p` came from CString::into_raw just above and was not stored.
    drop(unsafe { CString::from_raw(p) });
    None
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let p = TRACKED[self.0].swap(std::ptr::null_mut(), Ordering::SeqCst);
        // The handler may have taken (and unlinked) it: the process is ending then. The
        // name is leaked rather than freed, so a handler running right now never reads
        // freed memory.
        let _ = p;
    }
}
