//! The background thread: one cycle every `cycle_time`, identical on every rank.
//!
//! 1. Take the tensors submitted since the last cycle.
//! 2. One allreduce (bitwise AND) of a small bit vector: for every cached tensor, "I have
//!    it ready"; plus "someone has uncached requests", "someone shuts down" and "this
//!    cache entry is stale" (ORs, sent inverted).
//! 3. Cached tensors whose bit survived are ready everywhere: no negotiation.
//! 4. When any rank has uncached requests, the full negotiation: requests gathered to the
//!    coordinator (rank 0), which answers with the ready tensors, errors, stall reports and
//!    the fusion threshold and cycle time every rank must use.
//! 5. Ready tensors are fused and executed in the same order on every rank.

use std::collections::HashMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mpi::collective::{CommunicatorCollectives, SystemOperation};

use super::autotune::{Autotuner, Params};
use super::cache::{Bits, Lookup, ResponseCache};
use super::coordinator::Coordinator;
use super::error::{EngineError, EngineResult};
use super::fusion::{fuse, Executor};
use super::device::ExecuteDevice;
use super::message::{Reader, Request, Response, ResponseList, Writer};
use super::timeline::Timeline;
use crate::tensor::{Location, Tensor};
use crate::comm::mpi_backend::MpiCollectives;
use crate::comm::traffic::{dense_model, Place, Traffic};
use crate::comm::{Collectives, CollectivesExt};
use crate::topology::Group;

/// An idle engine's pause between cycles grows to at most 2^IDLE_BACKOFF cycle times.
const IDLE_BACKOFF: u32 = 4;

/// A submitted tensor on its way to the background thread.
pub struct Submission {
    /// The request.
    pub req: Request,
    /// The tensor (moved in; handed back through `reply`).
    pub tensor: Tensor,
    /// Where the result goes.
    pub reply: Sender<EngineResult<Tensor>>,
    /// When it was submitted.
    pub submitted: Instant,
}

/// Messages to the background thread.
pub enum Msg {
    /// A new tensor.
    Submit(Box<Submission>),
    /// This rank leaves; every rank's engine stops in the same cycle.
    Shutdown,
    /// Start the next cycle now instead of at the end of the cycle time (sent when a
    /// handle is waited on: the program has submitted what it can for now).
    Flush,
    /// How to make the device executor, made when the first device response runs (every
    /// rank runs it at the same point: [`MakeDevice`]).
    Device(MakeDevice),
}

/// Makes a device executor on the engine's thread (collective: its device collectives are
/// built there). The engine runs it at the first response on device tensors, which every
/// rank reaches in the same place of the same response list, so every rank builds its
/// executor together, and only once every rank submitted a device tensor (a rank that
/// gave a host tensor under that name made the response an error instead).
pub type MakeDevice = Box<dyn FnOnce() -> EngineResult<Box<dyn ExecuteDevice>> + Send>;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    /// Not classified yet.
    New,
    /// Waiting on its cache bit.
    Cached(usize),
    /// To be sent to the coordinator.
    Queued,
    /// Sent; waiting for the coordinator's answer.
    Sent,
}

struct Pending {
    sub: Submission,
    route: Route,
}

/// Why the engine stopped, readable by the handles' side.
pub type StopReason = Arc<Mutex<Option<String>>>;

/// Counters of the background thread (read with [`Stats::snapshot`]).
#[derive(Default, Debug)]
pub struct Stats {
    cycles: AtomicU64,
    negotiations: AtomicU64,
    cached: AtomicU64,
    negotiated: AtomicU64,
    collectives: AtomicU64,
    bytes: AtomicU64,
    allreduce_wire: AtomicU64,
    allgather_wire: AtomicU64,
    /// The data backend's counted bytes: intra sent, intra received, cross sent, cross
    /// received ([`crate::comm::Collectives::traffic`]).
    counted: [AtomicU64; 4],
    /// Nonzero once the counts are void: the backend does not count, or a collective ran
    /// where it cannot (a device tensor's).
    counted_void: AtomicU64,
    /// The modelled bytes, in the order of `counted`, as f64 bits (one writer: the thread).
    modelled: [AtomicU64; 4],
    fusion_threshold: AtomicU64,
    cycle_time_us: AtomicU64,
    tuning: AtomicU64,
}

/// A copy of the counters.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StatsSnapshot {
    /// Background cycles run.
    pub cycles: u64,
    /// Cycles that needed the coordinator.
    pub negotiations: u64,
    /// Tensors that ran straight from the response cache.
    pub cached: u64,
    /// Tensors that ran after a negotiation.
    pub negotiated: u64,
    /// Collectives executed (a fused one counts once).
    pub collectives: u64,
    /// Bytes of tensors allreduced or broadcast.
    pub bytes: u64,
    /// Bytes this rank contributed to allreduces as they travel (after fp16/bf16
    /// compression; f32 where the backend widens halves).
    pub allreduce_wire_bytes: u64,
    /// Bytes this rank contributed to allgathers (1-bit encodings and allgathered tensors).
    pub allgather_wire_bytes: u64,
    /// The bytes the data backend counted moving for the engine's collectives (intra-host
    /// sent, received, cross-host sent, received), where it counts them all; `None` where
    /// it does not (`mpi`, a collective left to MPI's own algorithm, device tensors).
    pub counted_traffic: Option<[u64; 4]>,
    /// The same bytes as modelled from each collective's wire bytes and the backend's
    /// algorithm ([`dense_model`]).
    pub modelled_traffic: [f64; 4],
    /// The fusion threshold in use (bytes).
    pub fusion_threshold: u64,
    /// The cycle time in use (microseconds).
    pub cycle_time_us: u64,
    /// True while the autotuner searches.
    pub tuning: bool,
}

impl Stats {
    /// Records the parameters in use.
    pub fn publish_params(&self, p: Params, tuning: bool) {
        self.fusion_threshold.store(p.fusion_threshold as u64, Ordering::Relaxed);
        self.cycle_time_us.store(p.cycle_time.as_micros() as u64, Ordering::Relaxed);
        self.tuning.store(tuning as u64, Ordering::Relaxed);
    }

    /// Adds one collective's modelled traffic (called by the background thread only).
    fn add_modelled(&self, t: Traffic) {
        for (a, v) in self.modelled.iter().zip(t.to_array()) {
            a.store((f64::from_bits(a.load(Ordering::Relaxed)) + v).to_bits(), Ordering::Relaxed);
        }
    }

    /// Records the data backend's counts after a collective (`None`: void from now on).
    pub fn record_traffic(&self, t: Option<Traffic>) {
        match t {
            Some(t) => {
                for (a, v) in self.counted.iter().zip(t.to_array()) {
                    a.store(v as u64, Ordering::Relaxed);
                }
            }
            None => self.counted_void.store(1, Ordering::Relaxed),
        }
    }

    /// The counters now.
    pub fn snapshot(&self) -> StatsSnapshot {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StatsSnapshot {
            cycles: g(&self.cycles),
            negotiations: g(&self.negotiations),
            cached: g(&self.cached),
            negotiated: g(&self.negotiated),
            collectives: g(&self.collectives),
            bytes: g(&self.bytes),
            allreduce_wire_bytes: g(&self.allreduce_wire),
            allgather_wire_bytes: g(&self.allgather_wire),
            counted_traffic: (g(&self.counted_void) == 0).then(|| self.counted.each_ref().map(g)),
            modelled_traffic: self.modelled.each_ref().map(|a| f64::from_bits(g(a))),
            fusion_threshold: g(&self.fusion_threshold),
            cycle_time_us: g(&self.cycle_time_us),
            tuning: g(&self.tuning) != 0,
        }
    }
}

/// Knobs the background thread reads once.
pub struct LoopConfig {
    /// Start values (rank 0's are broadcast to all).
    pub params: Params,
    /// Cache bits.
    pub cache_capacity: usize,
    /// Stall warning after this wait.
    pub stall_check: Option<Duration>,
    /// Stop after this wait.
    pub stall_shutdown: Option<Duration>,
    /// Trace file (rank 0 only).
    pub timeline: Option<Timeline>,
    /// True when the parameters are searched first (on every rank: negotiation runs every
    /// cycle until rank 0 says the search ended).
    pub autotune: bool,
    /// The search itself (rank 0 only).
    pub autotuner: Option<Autotuner>,
    /// The executor of tensors in a device's memory (none: host tensors only).
    pub device: Option<Box<dyn ExecuteDevice>>,
    /// The L2 form's lambda of 1-bit compression.
    pub onebit_lambda: f32,
    /// Values per scale of 1-bit compression (0: per tensor).
    pub onebit_block: usize,
    /// This rank's place, for the modelled traffic.
    pub place: Place,
    /// The largest buffer `shm` reduces by its direct path ([`crate::comm::shm::direct_max`]).
    pub shm_direct_max: usize,
}

/// The background thread's state.
pub struct Controller {
    rank: usize,
    size: usize,
    control: Group,
    ctl: MpiCollectives,
    exec: Executor,
    device: Option<Box<dyn ExecuteDevice>>,
    /// Makes `device` at the first device response, when it was not given at the start.
    make_device: Option<MakeDevice>,
    /// 1-bit compression's (lambda, block), for a device executor made later.
    onebit: (f32, usize),
    rx: Receiver<Msg>,
    pending: HashMap<String, Pending>,
    order: Vec<String>,
    cache: ResponseCache,
    coordinator: Option<Coordinator>,
    params: Params,
    autotuner: Option<Autotuner>,
    tuning: bool,
    synced: bool,
    timeline: Option<Timeline>,
    stall_check: Option<Duration>,
    leaving: bool,
    stop: StopReason,
    stats: Arc<Stats>,
    /// The model's name of the device executor's collectives (`nccl`, or a host backend).
    device_backend: String,
    place: Place,
    shm_direct_max: usize,
}

// SAFETY: a `Controller` is built on the caller's thread and moved, whole, into the engine's
// background thread, which alone uses it from then on. What keeps it from being `Send` by
// itself is MPI handles (its communicators) and shared mappings (the shm backends' segments,
// a device's queue): MPI runs at MPI_THREAD_MULTIPLE (checked before the engine starts), so
// calling it from that thread is allowed while other threads use other communicators, and a
// mapping or a device handle is valid in every thread of the process.
unsafe impl Send for Controller {}

enum Flow {
    Go,
    Stop(EngineError),
}

const FLAG_UNCACHED: u64 = 1;
const FLAG_SHUTDOWN: u64 = 2;

impl Controller {
    /// A controller over `control` (bit vector), `ctl` (negotiation) and `backend` (data).
    pub fn new(control: Group, ctl: MpiCollectives, backend: Box<dyn Collectives>, rx: Receiver<Msg>, cfg: LoopConfig, stop: StopReason, stats: Arc<Stats>) -> Controller {
        let rank = control.rank();
        let size = control.size();
        stats.record_traffic(backend.traffic());
        let device_backend = cfg.device.as_ref().and_then(|d| crate::comm::traffic::model_name(&d.describe()).map(str::to_string)).unwrap_or_default();
        Controller {
            rank,
            size,
            control,
            ctl,
            exec: Executor::with_onebit(backend, cfg.onebit_lambda, cfg.onebit_block),
            device: cfg.device.map(|mut d| {
                d.set_onebit(cfg.onebit_lambda, cfg.onebit_block);
                d
            }),
            make_device: None,
            onebit: (cfg.onebit_lambda, cfg.onebit_block),
            rx,
            pending: HashMap::new(),
            order: Vec::new(),
            cache: ResponseCache::new(cfg.cache_capacity),
            coordinator: (rank == 0).then(|| Coordinator::new(size, cfg.stall_check, cfg.stall_shutdown)),
            params: cfg.params,
            tuning: cfg.autotune,
            autotuner: cfg.autotuner,
            synced: false,
            timeline: cfg.timeline,
            stall_check: cfg.stall_check,
            leaving: false,
            stop,
            stats,
            device_backend,
            place: cfg.place,
            shm_direct_max: cfg.shm_direct_max,
        }
    }

    /// Runs cycles until every rank's engine stops. While this rank has nothing pending,
    /// the pause between cycles doubles each idle cycle, up to 2^[`IDLE_BACKOFF`] cycle
    /// times: an idle engine (a forward pass, batch assembly) then costs its peers' cores
    /// little. A submission ends the idle pause at once (the cadence is the cycle time
    /// again); a peer that submitted meanwhile waits in its cycle's allreduce, without
    /// burning a core, until this one joins.
    pub fn run(mut self) {
        crate::comm::precise_sleeps();
        let mut last = Instant::now();
        let mut idle = 0u32;
        let reason = loop {
            let active = last + self.params.cycle_time;
            self.wait_for_cycle(active, last + self.params.cycle_time * (1 << idle.min(IDLE_BACKOFF)));
            last = Instant::now();
            self.drain();
            match self.cycle() {
                Ok(Flow::Go) => {}
                Ok(Flow::Stop(e)) => break e,
                Err(e) => break e,
            }
            idle = if self.pending.is_empty() { idle + 1 } else { 0 };
        };
        if let Ok(mut s) = self.stop.lock() {
            *s = Some(reason.to_string());
        }
        for (_, p) in self.pending.drain() {
            let _ = p.sub.reply.send(Err(reason.clone()));
        }
        // Submissions still queued find the engine stopped.
        while let Ok(m) = self.rx.try_recv() {
            if let Msg::Submit(s) = m {
                let _ = s.reply.send(Err(EngineError::ShutDown(reason.to_string())));
            }
        }
        if let Some(t) = self.timeline.as_mut() {
            let _ = t.close();
        }
    }

    /// Takes one message; false when the cycle should start now.
    fn take(&mut self, m: Msg) -> bool {
        match m {
            Msg::Submit(s) => {
                let s = *s;
                if self.pending.contains_key(&s.req.name) {
                    let _ = s.reply.send(Err(EngineError::Duplicate(s.req.name.clone())));
                } else {
                    self.order.push(s.req.name.clone());
                    self.pending.insert(s.req.name.clone(), Pending { sub: s, route: Route::New });
                }
                true
            }
            Msg::Flush => self.pending.is_empty(), // nothing of ours to run: keep the cadence
            Msg::Device(make) => {
                self.make_device = Some(make);
                true
            }
            Msg::Shutdown => {
                self.leaving = true;
                false
            }
        }
    }

    /// Sleeps until `active` (or `idle`, while nothing is pending here), taking
    /// submissions as they come; a flush (or a shutdown) ends the wait early.
    fn wait_for_cycle(&mut self, active: Instant, idle: Instant) {
        loop {
            let now = Instant::now();
            let until = if self.pending.is_empty() { idle } else { active };
            if now >= until || self.leaving {
                return;
            }
            match self.rx.recv_timeout(until - now) {
                Ok(m) => {
                    if !self.take(m) {
                        return;
                    }
                }
                Err(RecvTimeoutError::Timeout) => return,
                Err(RecvTimeoutError::Disconnected) => {
                    self.leaving = true;
                    return;
                }
            }
        }
    }

    fn drain(&mut self) {
        while !self.leaving {
            match self.rx.try_recv() {
                Ok(m) => {
                    self.take(m);
                }
                Err(TryRecvError::Disconnected) => self.leaving = true,
                Err(TryRecvError::Empty) => return,
            }
        }
    }

    /// Bitwise AND over all ranks, waiting without burning a core.
    fn band(&self, words: &mut [u64]) {
        let send = words.to_vec();
        mpi::request::scope(|scope| crate::comm::wait_sleeping(self.control.comm.immediate_all_reduce_into(scope, &send[..], &mut words[..], SystemOperation::bitwise_and())));
    }

    /// Routes the pending tensors (cache hit, stale entry, or to the coordinator): this
    /// rank's cache hits, stale bits, and whether it has uncached requests.
    fn classify(&mut self, now: Instant) -> (Bits, Bits, bool) {
        let cap = self.cache.capacity();
        let mut hits = Bits::zeros(cap);
        let mut stale = Bits::zeros(cap);
        let mut uncached = false;
        // A cached tensor waiting this long goes to the coordinator, so stalls are reported.
        let cached_patience = self.stall_check.map(|c| c / 2);
        for name in &self.order {
            let Some(p) = self.pending.get_mut(name) else { continue };
            if p.route == Route::New {
                p.route = match self.cache.lookup(&p.sub.req) {
                    Lookup::Hit(bit) => Route::Cached(bit),
                    Lookup::Stale(bit) => {
                        stale.set(bit);
                        Route::Queued
                    }
                    Lookup::Miss => Route::Queued,
                };
            }
            if let Route::Cached(bit) = p.route {
                if cached_patience.is_some_and(|l| now.duration_since(p.sub.submitted) > l) {
                    stale.set(bit);
                    p.route = Route::Queued;
                } else {
                    hits.set(bit);
                }
            }
            uncached |= p.route == Route::Queued;
        }
        if let Some(c) = &self.coordinator {
            uncached |= c.has_pending() || self.tuning || !self.synced;
        }
        (hits, stale, uncached)
    }

    /// One bit-vector allreduce: the flags ORed, cache hits ANDed, stale bits ORed over the
    /// ranks. Returns (flags, bits every rank has ready, stale bits).
    fn agree_bits(&self, hits: Bits, stale: Bits, uncached: bool) -> (u64, Bits, Bits) {
        let mut flags = 0;
        if uncached {
            flags |= FLAG_UNCACHED;
        }
        if self.leaving {
            flags |= FLAG_SHUTDOWN;
        }
        let nw = hits.0.len();
        let mut words = Vec::with_capacity(1 + 2 * nw);
        words.push(!flags);
        words.extend_from_slice(&hits.0);
        words.extend(stale.0.iter().map(|w| !w));
        self.band(&mut words);
        let stale = Bits(words[1 + nw..].iter().map(|w| !w).collect());
        let ready = Bits(words[1..1 + nw].iter().zip(&stale.0).map(|(h, s)| h & !s).collect());
        (!words[0], ready, stale)
    }

    fn cycle(&mut self) -> EngineResult<Flow> {
        // Every rank takes part in every cycle: past the deadline the watchdog ends the job.
        let _w = crate::watchdog::waiting("the engine's cycle (negotiation and collectives)");
        let (hits, stale, uncached) = self.classify(Instant::now());
        let (flags, ready, stale) = self.agree_bits(hits, stale, uncached);
        if flags & FLAG_SHUTDOWN != 0 {
            return Ok(Flow::Stop(EngineError::ShutDown("a rank shut its engine down (its Runtime was dropped or shutdown() called)".into())));
        }
        let stale_bits = stale.ones();
        for bit in &stale_bits {
            self.cache.remove(*bit);
        }
        for p in self.pending.values_mut() {
            if let Route::Cached(bit) = p.route {
                if stale.get(bit) {
                    p.route = Route::Queued;
                }
            }
        }
        // Cached responses, in bit order.
        let mut responses: Vec<Response> = Vec::new();
        for bit in ready.ones() {
            if let Some(r) = self.cache.get(bit) {
                responses.push(Response::for_request(r));
            }
        }
        let add = |a: &AtomicU64, n: usize| {
            a.fetch_add(n as u64, Ordering::Relaxed);
        };
        add(&self.stats.cycles, 1);
        add(&self.stats.cached, responses.len());
        let mut negotiated = Vec::new();
        if flags & FLAG_UNCACHED != 0 || !stale_bits.is_empty() {
            add(&self.stats.negotiations, 1);
            let list = self.negotiate()?;
            if !list.stall_warning.is_empty() {
                // One write of the whole line: every rank warns at about the same moment, and
                // eprintln! writes a line in pieces that interleave with the other ranks'.
                let line = format!("ringrec rank {}: {}\n", self.rank, list.stall_warning);
                let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
            }
            if !list.shutdown.is_empty() {
                return Ok(Flow::Stop(EngineError::Stalled(list.shutdown)));
            }
            negotiated = list.responses;
            add(&self.stats.negotiated, negotiated.iter().map(|r| r.entries.len()).sum());
        }
        responses.extend(negotiated.iter().cloned());
        let negotiated_at = Instant::now();
        let (bytes, ran) = self.execute(responses, negotiated_at)?;
        // Cache what was negotiated, in the same order on every rank.
        for r in negotiated.iter().filter(|r| r.error.is_none()) {
            for e in &r.entries {
                if let Some(req) = ran.get(&e.name) {
                    self.cache.insert(req);
                }
            }
        }
        if let Some(t) = self.autotuner.as_mut() {
            t.record(bytes as u64, Instant::now());
        }
        if let Some(t) = self.timeline.as_mut() {
            let _ = t.flush();
        }
        Ok(Flow::Go)
    }

    /// Full negotiation: requests to the coordinator, its response list to everyone.
    fn negotiate(&mut self) -> EngineResult<ResponseList> {
        let now = Instant::now();
        let mut w = Writer::default();
        for name in &self.order {
            if let Some(p) = self.pending.get_mut(name) {
                if p.route == Route::Queued {
                    let mut r = p.sub.req.clone();
                    r.age_us = now.duration_since(p.sub.submitted).as_micros() as u64;
                    w.request(&r);
                    p.route = Route::Sent;
                }
            }
        }
        let gathered = self.ctl.gatherv_raw(&w.0, 0)?;
        let mut out = Vec::new();
        if let (Some(c), Some(g)) = (self.coordinator.as_mut(), gathered) {
            for r in 0..self.size {
                let mut rd = Reader::new(g.piece(r));
                let mut reqs = Vec::new();
                while !rd.at_end() {
                    reqs.push(rd.request().ok_or_else(|| EngineError::Comm(format!("rank {r} sent a malformed request list")))?);
                }
                c.ingest(r, reqs, now);
            }
            let responses = c.ready();
            let (stall_warning, shutdown) = c.stall_report(now);
            if let Some(t) = self.autotuner.as_ref() {
                self.params = t.current();
                self.tuning = t.active();
            }
            let list = ResponseList {
                responses,
                fusion_threshold: self.params.fusion_threshold as u64,
                cycle_time_us: self.params.cycle_time.as_micros() as u64,
                tuning: self.tuning,
                stall_warning,
                shutdown,
            };
            let mut w = Writer::default();
            w.response_list(&list);
            out = w.0;
        }
        let mut len = [out.len() as i64];
        self.ctl.broadcast(&mut len[..], 0)?;
        out.resize(len[0] as usize, 0);
        self.ctl.broadcast_raw(&mut out, 0)?;
        let list = Reader::new(&out).response_list().ok_or_else(|| EngineError::Comm("rank 0 sent a malformed response list".into()))?;
        self.params = Params { fusion_threshold: list.fusion_threshold as usize, cycle_time: Duration::from_micros(list.cycle_time_us) };
        self.tuning = list.tuning;
        self.synced = true;
        self.stats.publish_params(self.params, self.tuning);
        Ok(list)
    }

    /// Adds an executed response's bytes to the stats: on the wire, modelled by direction
    /// ([`dense_model`]), and the data backend's counts.
    fn account(&self, resp: &Response) {
        let host = resp.location == Location::Host;
        let widens = host && self.exec.backend.widens_halves();
        let (allreduce, allgather) = resp.wire_bytes(widens, self.exec.onebit.block);
        self.stats.allreduce_wire.fetch_add(allreduce as u64, Ordering::Relaxed);
        self.stats.allgather_wire.fetch_add(allgather as u64, Ordering::Relaxed);
        let backend = if host { self.exec.backend.name() } else { self.device_backend.as_str() };
        self.stats.add_modelled(dense_model(backend, &self.place, allreduce as f64, allgather as f64, self.shm_direct_max));
        self.stats.record_traffic(if host { self.exec.backend.traffic() } else { None });
    }

    /// The device executor, made now when this is the first device response ([`MakeDevice`]).
    fn device_executor(&mut self) -> EngineResult<&mut Box<dyn ExecuteDevice>> {
        if self.device.is_none() {
            let make = self.make_device.take().ok_or_else(|| EngineError::Comm("device tensors reached an engine without a device executor (engine bug)".into()))?;
            let mut d = make()?;
            d.set_onebit(self.onebit.0, self.onebit.1);
            self.device_backend = crate::comm::traffic::model_name(&d.describe()).map(str::to_string).unwrap_or_default();
            self.device = Some(d);
        }
        self.device.as_mut().ok_or_else(|| EngineError::Comm("no device executor (engine bug)".into()))
    }

    /// Fuses and runs `responses`, answering the handles; returns the bytes reduced and the
    /// requests that ran.
    fn execute(&mut self, responses: Vec<Response>, agreed: Instant) -> EngineResult<(usize, HashMap<String, Request>)> {
        let mut bytes = 0;
        let mut ran = HashMap::new();
        for resp in fuse(responses, self.params.fusion_threshold) {
            let mut subs = Vec::with_capacity(resp.entries.len());
            for e in &resp.entries {
                match self.pending.remove(&e.name) {
                    Some(p) => subs.push(p.sub),
                    None => return Err(EngineError::Comm(format!("rank {} was told to run '{}', which it never submitted (engine bug)", self.rank, e.name))),
                }
            }
            if let Some(detail) = &resp.error {
                for s in subs {
                    let _ = s.reply.send(Err(EngineError::Mismatch { name: s.req.name.clone(), detail: detail.clone() }));
                }
                continue;
            }
            let start = Instant::now();
            let mut tensors: Vec<Tensor> = subs.iter_mut().map(|s| std::mem::replace(&mut s.tensor, Tensor::from_vec(Vec::<u8>::new()))).collect();
            let result = match resp.location {
                Location::Host => self.exec.execute(&resp, &mut tensors),
                Location::Device => self.device_executor().and_then(|d| d.execute(&resp, &mut tensors)),
            };
            let steps = match result {
                Ok(steps) => steps,
                Err(e) => {
                    for s in subs {
                        let _ = s.reply.send(Err(e.clone()));
                    }
                    return Err(e);
                }
            };
            bytes += resp.bytes();
            self.stats.collectives.fetch_add(1, Ordering::Relaxed);
            self.stats.bytes.fetch_add(resp.bytes() as u64, Ordering::Relaxed);
            self.account(&resp);
            if let Some(tl) = self.timeline.as_mut() {
                let args = format!("{{\"fused\": {}, \"bytes\": {}}}", resp.entries.len(), resp.bytes());
                for s in &subs {
                    let name = &s.req.name;
                    let _ = tl.span(name, "NEGOTIATE", s.submitted, agreed, "");
                    let _ = tl.span(name, "QUEUE", agreed, start, "");
                    for (phase, a, b) in &steps {
                        let _ = tl.span(name, phase, *a, *b, &args);
                    }
                }
            }
            for (s, t) in subs.into_iter().zip(tensors) {
                ran.insert(s.req.name.clone(), s.req.clone());
                let _ = s.reply.send(Ok(t));
            }
        }
        let pending = &self.pending;
        self.order.retain(|n| pending.contains_key(n));
        Ok((bytes, ran))
    }
}
