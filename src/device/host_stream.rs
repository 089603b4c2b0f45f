//! The asynchronous machinery of the host-kernels device ([`super::HostKernels`]): queues
//! that behave like CUDA streams, events that order them, and reference-counted memory that
//! queued work keeps alive.
//!
//! - **Queues.** A [`Queue`] is a worker thread running its jobs one at a time, in the order
//!   they were submitted (a stream). Submitting returns at once; [`Queue::synchronize`]
//!   waits for everything submitted so far. With [`HostDelay`] each job first sleeps a
//!   random time drawn from a seeded generator, so the host runs ahead of its queues and the
//!   queues run at random speeds relative to each other.
//! - **Events.** An [`Event`] is a point in a queue (its job number); it is complete once
//!   that job has run. Each memory records, as cudarc does in multi-stream mode, the last job
//!   that read it and the last job that wrote it: a job that reads a memory waits for the
//!   last write queued on another queue, a job that writes it waits for the last read and
//!   write queued on another queue (the `cuStreamWaitEvent`s cudarc issues in
//!   `device_ptr`/`device_ptr_mut`). It also records the last use on each queue, so the host
//!   can wait for every queued use of a memory ([`Mem::wait_idle`]) before it touches it.
//! - **Memory.** A [`Mem`] is a fixed-length allocation behind an `Arc`: every queued job
//!   holds the memories it uses, so a buffer replaced or dropped by the host (a reallocation
//!   in `Mlp::ensure`, a staging slot grown) is freed only after the last job that uses it
//!   has run, as cudarc frees device memory in stream order. A job holds a lock on each of
//!   its memories while it runs (shared to read, exclusive to write), so even work that is
//!   ordered wrongly (a missing wait, a [`HostFault`]) never races at the level of memory: it
//!   reads stale or early values, as on a GPU, and the result is wrong, not undefined.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use super::{DeviceError, DeviceResult, Scalar};
use crate::hash::splitmix64_next;

/// Random delays before each queued operation (tests): every queue draws its delays from
/// its own generator, seeded from `seed` (and the queue's number and the rank).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostDelay {
    /// The generator's seed.
    pub seed: u64,
    /// The longest delay, in microseconds (each delay is uniform in `0..=max_us`).
    pub max_us: u64,
}

/// A deliberately removed wait (test-only switches that prove the delayed device catches
/// ordering bugs: each must make a GPU-path-vs-CPU comparison fail).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostFault {
    /// Queues do not wait for each other's pending work on a buffer (as if cudarc's event
    /// tracking were off): the engine's queue may copy a gradient before backward wrote it,
    /// the optimizer may read a gradient before the engine's queue wrote the reduced one.
    NoStreamWaits,
    /// [`crate::device::Device::host`] does not wait for the queued uploads out of a staging
    /// buffer (the wait that lets `DenseModel::stage` reuse a staging slot): those uploads
    /// read what the host writes next, as they would on a GPU.
    NoStagingWait,
    /// The trainer's readers of the host table (checkpoints, evaluation, a refresh's
    /// lookups) do not wait for the GPU hot-row cache's write-back (`--gpu-cache-mode
    /// write-back`): it is skipped, so they read rows the device changed since.
    NoWriteBackWait,
}
crate::config::named_enum!(HostFault { NoStreamWaits => "no-stream-waits", NoStagingWait => "no-staging-wait", NoWriteBackWait => "no-write-back-wait" });

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How far one queue has got.
struct Progress {
    state: Mutex<ProgressState>,
    cv: Condvar,
}

struct ProgressState {
    /// Jobs 1..=done have run.
    done: u64,
    /// The worker thread has exited: nothing more will run.
    stopped: bool,
    /// The first job that panicked (sticky, like a CUDA error).
    failure: Option<String>,
}

impl Progress {
    fn wait_for(&self, seq: u64) {
        let mut s = lock(&self.state);
        while s.done < seq && !s.stopped {
            s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }
    fn is_done(&self, seq: u64) -> bool {
        let s = lock(&self.state);
        s.done >= seq || s.stopped
    }
}

/// A point in a queue: complete once the queue's job `seq` has run.
#[derive(Clone)]
pub struct Event {
    q: Arc<Progress>,
    seq: u64,
}

/// A timed point of a queue ([`Queue::stamp`]): the moment its worker reached it.
pub struct Stamp {
    event: Event,
    at: Arc<Mutex<Option<std::time::Instant>>>,
}

impl Stamp {
    /// Waits for the queue to reach the point; its moment (`None` when the queue stopped
    /// before it).
    pub fn wait(&self) -> Option<std::time::Instant> {
        self.event.wait();
        *lock(&self.at)
    }
}

impl Event {
    /// Blocks until the job has run (or its queue stopped).
    pub fn wait(&self) {
        self.q.wait_for(self.seq)
    }
    fn done(&self) -> bool {
        self.q.is_done(self.seq)
    }
    fn on(&self, q: &Arc<Progress>) -> bool {
        Arc::ptr_eq(&self.q, q)
    }
}

/// The jobs queued on a memory (see the module docs).
#[derive(Default)]
pub struct Uses {
    /// The last job queued to read it (cudarc's read event: one per buffer, so a write
    /// waits only for the last read queued, as on a GPU — reads on both queues followed by
    /// a write on one would not wait for the other's read there either).
    read: Option<Event>,
    /// The last job queued to write it (cudarc's write event).
    write: Option<Event>,
    /// The last job of each queue that uses it, for the host's waits.
    last: Vec<Event>,
}

/// A memory as a queued job sees it, whatever its element type.
pub trait Region: Send + Sync {
    /// Held by a job while it runs: shared to read, exclusive to write.
    fn lock(&self) -> &RwLock<()>;
    /// Its queued jobs.
    fn uses(&self) -> &Mutex<Uses>;
    /// Identity, and the order locks are taken in (no deadlock between two jobs).
    fn key(&self) -> usize;
}

/// A fixed-length allocation shared by a buffer handle and the jobs queued on it.
pub struct Mem<T> {
    ptr: NonNull<T>,
    len: usize,
    /// False for memory a caller lends ([`Mem::borrowed`]): not freed here.
    owned: bool,
    lock: RwLock<()>,
    uses: Mutex<Uses>,
}

// SAFETY: `Mem` owns its allocation (a boxed slice of `T: Send`), or holds memory lent to it
// alone for its lifetime ([`Mem::borrowed`]'s contract). Its elements are only
// touched (1) by a job holding `lock` (shared to read, exclusive to write), (2) by the host
// under `lock` (copies), or (3) by the host through the one handle (`HostBuf`/`HostStaging`,
// not `Clone`) after `wait_idle` and while it holds that handle exclusively, so that no job
// uses the memory and none can be queued until the host's borrow ends. Hence no data race.
unsafe impl<T: Send> Send for Mem<T> {}
// SAFETY: as above; `&Mem` exposes no element access without one of those disciplines.
unsafe impl<T: Send + Sync> Sync for Mem<T> {}

impl<T> Drop for Mem<T> {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // SAFETY: ptr/len come from `Box::into_raw` of a boxed slice in `Mem::zeroed`, and the
        // last owner drops it once (no job holds the memory any more).
        unsafe { drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len))) }
    }
}

impl<T: Scalar> Mem<T> {
    /// `n` zeroed elements.
    pub fn zeroed(n: usize) -> Arc<Mem<T>> {
        let b: Box<[T]> = vec![T::zeroed(); n].into_boxed_slice();
        let ptr = NonNull::new(Box::into_raw(b) as *mut T).unwrap_or(NonNull::dangling());
        Arc::new(Mem { ptr, len: n, owned: true, lock: RwLock::new(()), uses: Mutex::new(Uses::default()) })
    }

    /// `n` elements at `ptr` that a caller lends (a framework's tensor, the "device memory"
    /// of the host-kernels device): used like the device's own memory, never freed here.
    ///
    /// # Safety
    /// `ptr` points to `n` valid, aligned elements that stay valid, and that nothing else
    /// reads or writes, until every job queued on the memory has run ([`Mem::wait_idle`])
    /// and its handle is dropped (no job is queued on it after that).
    pub unsafe fn borrowed(ptr: NonNull<T>, n: usize) -> Arc<Mem<T>> {
        Arc::new(Mem { ptr, len: n, owned: false, lock: RwLock::new(()), uses: Mutex::new(Uses::default()) })
    }

    /// Its number of elements.
    pub fn elements(&self) -> usize {
        self.len
    }

    /// The address of element `at` (a kernel argument; `at <= len` was checked).
    pub fn addr(&self, at: usize) -> usize {
        self.ptr.as_ptr().wrapping_add(at) as usize
    }

    /// The first element.
    pub fn ptr(&self) -> *mut T {
        self.ptr.as_ptr()
    }

    /// Waits for every queued job that uses the memory, on every queue.
    pub fn wait_idle(&self) {
        let last = lock(&self.uses).last.clone();
        last.iter().for_each(Event::wait);
    }

    /// Waits for the last queued write (a download into a staging buffer).
    pub fn wait_writes(&self) {
        let w = lock(&self.uses).write.clone();
        if let Some(e) = w {
            e.wait();
        }
    }

    /// Whether every queued job that uses it has run.
    pub fn idle(&self) -> bool {
        lock(&self.uses).last.iter().all(Event::done)
    }

    /// A new memory holding a copy of this one's elements (copied under its lock).
    pub fn duplicate(&self) -> Arc<Mem<T>> {
        let copy = Mem::zeroed(self.len);
        let _shared = self.lock.read().unwrap_or_else(|p| p.into_inner());
        // SAFETY: `copy` is new and unshared; `self` is read under its shared lock (no job
        // writes it meanwhile); both hold `len` elements and are distinct allocations.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr(), copy.ptr(), self.len) };
        copy
    }

    /// Overwrites this memory with `src`'s elements, under this memory's exclusive lock.
    /// `src` must be used by no job (an unshared memory).
    pub fn overwrite_from(&self, src: &Mem<T>) {
        let _exclusive = self.lock.write().unwrap_or_else(|p| p.into_inner());
        // SAFETY: no job runs on `self` while we hold its exclusive lock; `src` is used by no
        // job (the caller's contract) and only read here; equal lengths, distinct allocations.
        unsafe { std::ptr::copy_nonoverlapping(src.ptr(), self.ptr(), self.len.min(src.len)) };
    }
}

impl<T: Scalar> Region for Mem<T> {
    fn lock(&self) -> &RwLock<()> {
        &self.lock
    }
    fn uses(&self) -> &Mutex<Uses> {
        &self.uses
    }
    fn key(&self) -> usize {
        self as *const Mem<T> as usize
    }
}

/// One memory a job uses, and how.
pub struct Access {
    region: Arc<dyn Region>,
    write: bool,
}

impl Access {
    /// The job reads `m`.
    pub fn read<T: Scalar>(m: &Arc<Mem<T>>) -> Access {
        Access { region: m.clone(), write: false }
    }
    /// The job writes `m` (and may read it).
    pub fn write<T: Scalar>(m: &Arc<Mem<T>>) -> Access {
        Access { region: m.clone(), write: true }
    }
}

struct Job {
    seq: u64,
    /// Events of other queues to wait for first (the stream waits).
    deps: Vec<Event>,
    delay: Duration,
    accesses: Vec<Access>,
    run: Box<dyn FnOnce() + Send>,
}

struct Submitter {
    tx: Option<mpsc::Sender<Job>>,
    /// The last job submitted.
    next: u64,
    /// The delay generator's state and the longest delay (µs).
    delays: Option<(u64, u64)>,
}

/// A stream: a worker thread running its jobs in submission order (see the module docs).
pub struct Queue {
    progress: Arc<Progress>,
    submit: Mutex<Submitter>,
    worker: Option<JoinHandle<()>>,
    /// [`HostFault::NoStreamWaits`].
    no_stream_waits: bool,
}

enum Guard<'a> {
    Shared(#[allow(dead_code)] RwLockReadGuard<'a, ()>),
    Exclusive(#[allow(dead_code)] RwLockWriteGuard<'a, ()>),
}

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_else(|| "a queued operation panicked".into())
}

fn work(rx: mpsc::Receiver<Job>, progress: Arc<Progress>) {
    /// Marks the queue stopped however the thread ends, so no waiter hangs.
    struct Stop(Arc<Progress>);
    impl Drop for Stop {
        fn drop(&mut self) {
            lock(&self.0.state).stopped = true;
            self.0.cv.notify_all();
        }
    }
    let _stop = Stop(progress.clone());
    for job in rx {
        let Job { seq, deps, delay, accesses, run } = job;
        deps.iter().for_each(Event::wait);
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        let mut regions: Vec<(&dyn Region, bool)> = accesses.iter().map(|a| (&*a.region, a.write)).collect();
        regions.sort_by_key(|r| r.0.key());
        regions.dedup_by(|later, kept| {
            let same = later.0.key() == kept.0.key();
            kept.1 |= same && later.1;
            same
        });
        let failure = {
            // Locks in address order: two jobs never wait for each other's locks in a cycle.
            let _guards: Vec<Guard<'_>> = regions
                .iter()
                .map(|(r, write)| if *write { Guard::Exclusive(r.lock().write().unwrap_or_else(|p| p.into_inner())) } else { Guard::Shared(r.lock().read().unwrap_or_else(|p| p.into_inner())) })
                .collect();
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).err().map(panic_message)
        };
        drop(regions);
        drop(accesses);
        let mut s = lock(&progress.state);
        s.done = seq;
        if s.failure.is_none() {
            s.failure = failure;
        }
        drop(s);
        progress.cv.notify_all();
    }
}

static QUEUES: AtomicU64 = AtomicU64::new(0);

impl Queue {
    /// A queue and its worker thread; `delays`: (seed, longest delay in µs).
    pub fn new(delays: Option<(u64, u64)>, no_stream_waits: bool) -> DeviceResult<Queue> {
        let progress = Arc::new(Progress { state: Mutex::new(ProgressState { done: 0, stopped: false, failure: None }), cv: Condvar::new() });
        let (tx, rx) = mpsc::channel();
        let p = progress.clone();
        let n = QUEUES.fetch_add(1, Ordering::Relaxed);
        let worker = std::thread::Builder::new().name(format!("host-queue-{n}")).spawn(move || work(rx, p)).map_err(|e| DeviceError::call("starting a host-kernels queue", e))?;
        Ok(Queue { progress, submit: Mutex::new(Submitter { tx: Some(tx), next: 0, delays }), worker: Some(worker), no_stream_waits })
    }

    /// Queues a job that notes the moment the worker runs it (after every job queued before
    /// it): a timed point of the queue, as a CUDA event with timing is.
    pub fn stamp(&self) -> DeviceResult<Stamp> {
        let at: Arc<Mutex<Option<std::time::Instant>>> = Arc::default();
        let set = at.clone();
        let event = self.submit(Vec::new(), move || *lock(&set) = Some(std::time::Instant::now()))?;
        Ok(Stamp { event, at })
    }

    /// Queues `run`, which uses `accesses` (see the module docs for the waits it gets), and
    /// returns its event. `run` may touch exactly those memories, as declared (read or write).
    pub fn submit(&self, accesses: Vec<Access>, run: impl FnOnce() + Send + 'static) -> DeviceResult<Event> {
        let mut s = lock(&self.submit);
        let seq = s.next + 1;
        let me = Event { q: self.progress.clone(), seq };
        let mut deps: Vec<Event> = Vec::new();
        for a in &accesses {
            let mut u = lock(a.region.uses());
            let pending = [Some(&u.write), a.write.then_some(&u.read)];
            for e in pending.into_iter().flatten().flatten() {
                if !self.no_stream_waits && !e.on(&self.progress) && !e.done() {
                    deps.push(e.clone());
                }
            }
            if a.write {
                u.write = Some(me.clone());
            } else {
                u.read = Some(me.clone());
            }
            u.last.retain(|e| e.on(&self.progress) || !e.done());
            match u.last.iter_mut().find(|e| e.on(&self.progress)) {
                Some(e) => *e = me.clone(),
                None => u.last.push(me.clone()),
            }
        }
        let delay = match &mut s.delays {
            Some((state, max)) => Duration::from_micros(splitmix64_next(state) % (*max + 1)),
            None => Duration::ZERO,
        };
        let job = Job { seq, deps, delay, accesses, run: Box::new(run) };
        let sent = s.tx.as_ref().map(|tx| tx.send(job).is_ok()).unwrap_or(false);
        if !sent {
            return Err(DeviceError::refused("queueing work on the host-kernels device", "its worker thread has stopped"));
        }
        s.next = seq;
        Ok(me)
    }

    /// Waits for every job submitted so far; the first failure of a job, if any.
    pub fn synchronize(&self) -> DeviceResult<()> {
        let seq = lock(&self.submit).next;
        self.progress.wait_for(seq);
        self.check()
    }

    /// The first failure of a job run so far, if any (sticky, like a CUDA error).
    pub fn check(&self) -> DeviceResult<()> {
        match &lock(&self.progress.state).failure {
            Some(f) => Err(DeviceError::call("an operation queued on the host-kernels device", f)),
            None => Ok(()),
        }
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        // Closing the channel ends the worker once it ran what is queued.
        drop(lock(&self.submit).tx.take());
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(m: &Arc<Mem<f32>>) -> Vec<f32> {
        m.wait_idle();
        // SAFETY: idle, and no job is queued on it by this test meanwhile.
        unsafe { std::slice::from_raw_parts(m.ptr(), m.elements()).to_vec() }
    }

    fn fill(q: &Queue, m: &Arc<Mem<f32>>, v: f32) {
        let p = m.addr(0);
        let n = m.elements();
        // SAFETY (inside): the job holds m exclusively while it runs.
        q.submit(vec![Access::write(m)], move || unsafe { std::slice::from_raw_parts_mut(p as *mut f32, n).fill(v) }).unwrap();
    }

    fn copy(q: &Queue, src: &Arc<Mem<f32>>, dst: &Arc<Mem<f32>>) {
        let (s, d, n) = (src.addr(0), dst.addr(0), src.elements());
        // SAFETY (inside): src shared, dst exclusive while the job runs; distinct memories.
        q.submit(vec![Access::read(src), Access::write(dst)], move || unsafe { std::ptr::copy_nonoverlapping(s as *const f32, d as *mut f32, n) }).unwrap();
    }

    #[test]
    fn a_queue_runs_in_order_and_a_second_queue_waits_for_the_first_ones_writes() {
        for seed in 0..8 {
            let (a, b) = (Queue::new(Some((seed, 300)), false).unwrap(), Queue::new(Some((seed + 100, 300)), false).unwrap());
            let (x, y) = (Mem::<f32>::zeroed(64), Mem::<f32>::zeroed(64));
            for v in 1..=5 {
                fill(&a, &x, v as f32);
                // b's copy waits for a's write of x; a's next fill waits for b's read.
                copy(&b, &x, &y);
                assert_eq!(read_all(&y), vec![v as f32; 64], "seed {seed}");
            }
            a.synchronize().unwrap();
            b.synchronize().unwrap();
        }
    }

    #[test]
    fn without_stream_waits_a_second_queue_reads_too_early() {
        // The same program with the waits removed: b's copy runs before a's slow write.
        let a = Queue::new(Some((1, 0)), true).unwrap();
        let b = Queue::new(None, true).unwrap();
        let (x, y) = (Mem::<f32>::zeroed(8), Mem::<f32>::zeroed(8));
        let gate = Arc::new(Mutex::new(()));
        let held = lock(&gate);
        let g = gate.clone();
        a.submit(vec![], move || drop(lock(&g))).unwrap();
        fill(&a, &x, 7.0);
        copy(&b, &x, &y);
        b.synchronize().unwrap();
        drop(held);
        a.synchronize().unwrap();
        assert_eq!(read_all(&y), vec![0.0; 8], "the copy ran before the write it should wait for");
        assert_eq!(read_all(&x), vec![7.0; 8]);
    }

    #[test]
    fn a_stamp_times_when_the_queue_reaches_it_so_two_time_the_queue_idle_between() {
        let q = Queue::new(None, false).unwrap();
        let ms = |a: &Stamp, b: &Stamp| b.wait().unwrap().duration_since(a.wait().unwrap()).as_secs_f64() * 1e3;
        q.submit(vec![], || std::thread::sleep(Duration::from_millis(40))).unwrap();
        let a = q.stamp().unwrap();
        // Busy: the host comes back before the queue is done, so the queue never waits.
        std::thread::sleep(Duration::from_millis(10));
        let b = q.stamp().unwrap();
        // (Waits for b: the queue is idle from here.)
        assert!(ms(&a, &b) < 20.0, "{}", ms(&a, &b));
        // Idle: the queue waits for the host's next work.
        std::thread::sleep(Duration::from_millis(30));
        let c = q.stamp().unwrap();
        assert!((29.0..300.0).contains(&ms(&b, &c)), "{}", ms(&b, &c));
    }

    #[test]
    fn memory_outlives_its_handle_while_jobs_use_it_and_panics_are_reported() {
        let q = Queue::new(Some((3, 200)), false).unwrap();
        let out = Mem::<f32>::zeroed(1000);
        for i in 0..20 {
            let src = Mem::<f32>::zeroed(1000);
            fill(&q, &src, i as f32);
            copy(&q, &src, &out);
            // `src` dropped here, jobs still queued on it.
        }
        assert_eq!(read_all(&out), vec![19.0; 1000]);
        q.submit(vec![], || panic!("kernel fault")).unwrap();
        let e = q.synchronize().unwrap_err().to_string();
        assert!(e.contains("kernel fault"), "{e}");
        assert!(q.synchronize().is_err(), "errors are sticky");
    }
}
